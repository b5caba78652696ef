/* Status names and the thread-local last-error message. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>

#include "core.h"

static _Thread_local char last_error[1024];

const char *ch_status_str(ch_status status)
{
    switch (status) {
    case CH_OK: return "success";
    case CH_ERR_INVALID_ARGUMENT: return "invalid argument";
    case CH_ERR_SHAPE: return "shape mismatch";
    case CH_ERR_DTYPE: return "wrong dtype";
    case CH_ERR_DEVICE_MISMATCH: return "device mismatch";
    case CH_ERR_NOT_FOUND: return "not found";
    case CH_ERR_STATE: return "wrong state";
    case CH_ERR_OUT_OF_MEMORY: return "out of host memory";
    case CH_ERR_DEVICE_OUT_OF_MEMORY: return "out of device memory";
    case CH_ERR_LIMIT: return "beyond a device limit";
    case CH_ERR_DRIVER: return "driver error";
    case CH_ERR_UNAVAILABLE: return "unavailable";
    case CH_ERR_IO: return "input/output error";
    case CH_ERR_FORMAT: return "bad file format";
    case CH_ERR_REMOTE: return "another process failed";
    case CH_ERR_UNSUPPORTED: return "unsupported";
    case CH_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *ch_last_error(void) { return last_error; }

void ch_clear_error(void) { last_error[0] = '\0'; }

/* Formatted aside first: the arguments may include ch_last_error() itself
 * (a caller adding context to the message it got). */
ch_status chi_error(ch_status status, const char *fmt, ...)
{
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(last_error, sizeof last_error, "%s", msg);
    return status;
}
