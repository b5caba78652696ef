/* The one private service every layer of the library uses: setting this
 * thread's error message (read back with ch_last_error()). Backends get it
 * through backend.h. Also CHI_TEST_API, the mark of the internals that the
 * tests reach. */
#ifndef CHORUS_LIB_ERROR_H
#define CHORUS_LIB_ERROR_H

#include <chorus/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Set this thread's error message (printf style) and return `status`. The
 * arguments may quote ch_last_error() itself. Exported for the backend
 * modules. */
CH_API ch_status chi_error(ch_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* An internal function or variable that the tests call, or that the copy
 * of nn/ built for them links against: visible in the objects, so that the
 * test build of the library (tests/libchorus.la) exports it, and kept
 * local to the installed libchorus by its list of exports
 * (chorus_exports in lib/Makefile.mk). */
#define CHI_TEST_API CH_API

/* Return the status of `expr` unless it is CH_OK. */
#define TRY(expr)                                                                \
    do {                                                                         \
        ch_status try_st_ = (expr);                                              \
        if (try_st_ != CH_OK)                                                    \
            return try_st_;                                                      \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
