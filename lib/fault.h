/* Fault injection: a test build (./configure --enable-fault-injection)
 * whose Nth allocation or checkpoint write can be made to fail, so that a
 * test can walk N over every allocation of an operation (tests/test-fault.c,
 * docs/RELIABILITY.md).
 *
 * In that build this header is forced into every source of the library and
 * of the backend modules (-include): malloc, calloc, realloc, strdup,
 * strndup and posix_memalign become counted calls, as do write, fsync and
 * fread; the core counts device and pinned allocations, stream, event and
 * span creation and device opening through CHI_FAULT (core.h). Every
 * counted call is a "point"; arming N makes the Nth point from then on fail
 * once (an allocation returns NULL or its status, a write ENOSPC or a short
 * count). Other builds never include it and count nothing.
 *
 * The control functions are exported from libchorus in that build only
 * (tests/test-exports.sh allows them there) and are not part of the API. */
#ifndef CHORUS_LIB_FAULT_H
#define CHORUS_LIB_FAULT_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>
/* Headers that declare the counted calls again must come before the
 * macros: x86's intrinsics headers declare posix_memalign. */
#if defined(__x86_64__) || defined(__i386__)
#include <mm_malloc.h>
#endif

#include <chorus/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Allocation points (host and device) and I/O points (write, fsync, fread)
 * are counted apart: a walk over one kind leaves the other alone. */
typedef enum chi_fault_kind { CHI_FAULT_ALLOC = 0, CHI_FAULT_IO = 1 } chi_fault_kind;

/* How an armed I/O point fails. */
typedef enum chi_fault_io_mode {
    CHI_FAULT_IO_ENOSPC = 0, /* the call fails with ENOSPC (fread: 0 items) */
    CHI_FAULT_IO_SHORT = 1,  /* write and fread move half (at least one byte less),
                              * and every later write fails with ENOSPC: a disk
                              * that fills up; fsync is not shortened */
    CHI_FAULT_IO_EIO = 2     /* the call fails with EIO */
} chi_fault_io_mode;

/* Reset the count of `kind`'s points to zero and fail the nth point from
 * now on (nth >= 1; 0: none, counting only). */
CH_API void chi_fault_arm(chi_fault_kind kind, long nth, int mode);
/* Points of `kind` passed since it was armed. */
CH_API long chi_fault_count(chi_fault_kind kind);
/* Whether the armed point has failed; where (file:line and the call) in
 * `where` when it has. */
CH_API int chi_fault_fired(chi_fault_kind kind, const char **where);

/* The counted calls (the macros below route the library's calls here). */
CH_API void *chi_fault_malloc(size_t n, const char *file, int line);
CH_API void *chi_fault_calloc(size_t count, size_t n, const char *file, int line);
CH_API void *chi_fault_realloc(void *p, size_t n, const char *file, int line);
CH_API char *chi_fault_strdup(const char *s, const char *file, int line);
CH_API char *chi_fault_strndup(const char *s, size_t n, const char *file, int line);
CH_API int chi_fault_posix_memalign(void **p, size_t align, size_t n, const char *file, int line);
CH_API ssize_t chi_fault_write(int fd, const void *buf, size_t n, const char *file, int line);
CH_API int chi_fault_fsync(int fd, const char *file, int line);
CH_API size_t chi_fault_fread(void *buf, size_t size, size_t count, FILE *f, const char *file,
                              int line);
/* A point that is not a libc call (device allocation, stream, event):
 * nonzero when it must fail. */
CH_API int chi_fault_hit(const char *what, const char *file, int line);

#ifndef CHI_FAULT_IMPL
#undef malloc
#undef calloc
#undef realloc
#undef strdup
#undef strndup
#define malloc(n) chi_fault_malloc((n), __FILE__, __LINE__)
#define calloc(c, n) chi_fault_calloc((c), (n), __FILE__, __LINE__)
#define realloc(p, n) chi_fault_realloc((p), (n), __FILE__, __LINE__)
#define strdup(s) chi_fault_strdup((s), __FILE__, __LINE__)
#define strndup(s, n) chi_fault_strndup((s), (n), __FILE__, __LINE__)
#define posix_memalign(p, a, n) chi_fault_posix_memalign((p), (a), (n), __FILE__, __LINE__)
#define write(fd, b, n) chi_fault_write((fd), (b), (n), __FILE__, __LINE__)
#define fsync(fd) chi_fault_fsync((fd), __FILE__, __LINE__)
#define fread(b, s, c, f) chi_fault_fread((b), (s), (c), (f), __FILE__, __LINE__)
#endif

#ifdef __cplusplus
}
#endif

#endif
