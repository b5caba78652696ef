/* Chorus: status codes and error messages. */
#ifndef CHORUS_STATUS_H
#define CHORUS_STATUS_H

#include <chorus/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every call returns a status. Codes are grouped in bands so that a caller
 * can tell "my mistake" (100s) from "the machine's problem" (200s, 300s). */
typedef enum ch_status {
    CH_OK = 0,

    /* Bad arguments: the caller can fix these. */
    CH_ERR_INVALID_ARGUMENT = 100, /* NULL pointer, bad value, zero size */
    CH_ERR_SHAPE = 101,            /* shapes do not agree */
    CH_ERR_DTYPE = 102,            /* wrong element type */
    CH_ERR_DEVICE_MISMATCH = 103,  /* tensors live on different devices */
    CH_ERR_NOT_FOUND = 104,        /* unknown device name, missing file */
    CH_ERR_STATE = 105,            /* call made in the wrong state (before ch_init) */

    /* Resources. */
    CH_ERR_OUT_OF_MEMORY = 200,        /* host memory */
    CH_ERR_DEVICE_OUT_OF_MEMORY = 201, /* device memory, after the cache was freed */
    CH_ERR_LIMIT = 202,                /* beyond a device limit (max allocation, launch size) */

    /* Drivers and libraries. */
    CH_ERR_DRIVER = 300,      /* a CUDA/OpenCL/BLAS/hwloc call failed */
    CH_ERR_UNAVAILABLE = 301, /* a backend or device cannot be used here */
    CH_ERR_IO = 302,          /* a file could not be read or written */
    CH_ERR_FORMAT = 303,      /* a file's content is not what it should be */
    CH_ERR_REMOTE = 304,      /* another process of the job failed, or did not
                                 answer within the watchdog's time (chorus/dist.h) */

    /* Everything else. */
    CH_ERR_UNSUPPORTED = 400, /* valid, but not implemented for this case */
    CH_ERR_INTERNAL = 401     /* a bug in Chorus: please report it */
} ch_status;

/* A short, constant name for a status ("invalid argument"). */
CH_API const char *ch_status_str(ch_status status);

/* The message of the last failed call on this thread: it names the function,
 * the argument and what was expected. Never NULL; "" when nothing failed. */
CH_API const char *ch_last_error(void);

/* Forget the last error of this thread. */
CH_API void ch_clear_error(void);

#ifdef __cplusplus
}
#endif

#endif
