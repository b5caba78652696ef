/* Fault injection's counters and counted calls (lib/fault.h); built only
 * with ./configure --enable-fault-injection. */
#include "config.h"

#define CHI_FAULT_IMPL 1
#include "fault.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <execinfo.h>
#include <jansson.h>
#if defined(__has_include)
#if __has_include(<sanitizer/common_interface_defs.h>) && defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define HAVE_SANITIZER_STACK 1
#endif
#endif

/* The forced include came before CHI_FAULT_IMPL was defined, so the
 * macros are there: the calls below are the real ones. */
#undef malloc
#undef calloc
#undef realloc
#undef strdup
#undef strndup
#undef posix_memalign
#undef write
#undef fsync
#undef fread

typedef struct counter {
    atomic_long count;   /* points passed since armed */
    atomic_long nth;     /* the point that fails (0: none) */
    atomic_int fired;
    atomic_int full;     /* SHORT mode: the disk is full from now on */
    int mode;
    char where[256];
} counter;

static counter counters[2];

void chi_fault_arm(chi_fault_kind kind, long nth, int mode)
{
    counter *c = &counters[kind == CHI_FAULT_IO];
    atomic_store(&c->nth, 0);
    atomic_store(&c->count, 0);
    atomic_store(&c->fired, 0);
    atomic_store(&c->full, 0);
    c->mode = mode;
    c->where[0] = '\0';
    atomic_store(&c->nth, nth < 0 ? 0 : nth);
}

long chi_fault_count(chi_fault_kind kind) { return atomic_load(&counters[kind == CHI_FAULT_IO].count); }

int chi_fault_fired(chi_fault_kind kind, const char **where)
{
    counter *c = &counters[kind == CHI_FAULT_IO];
    int fired = atomic_load(&c->fired);
    if (where)
        *where = fired ? c->where : "";
    return fired;
}

/* Count a point of `c`; nonzero when it is the one that fails. */
static int point(counter *c, const char *what, const char *file, int line)
{
    long n = atomic_fetch_add(&c->count, 1) + 1;
    long nth = atomic_load(&c->nth);
    if (nth == 0 || n != nth)
        return 0;
    snprintf(c->where, sizeof c->where, "%s at %s:%d", what, file, line);
    atomic_store(&c->fired, 1);
    /* CHORUS_FAULT_BACKTRACE=1: where the failing point was called from,
     * on stderr (symbolised under ASan). */
    const char *bt = getenv("CHORUS_FAULT_BACKTRACE");
    if (bt && *bt == '1') {
        fprintf(stderr, "fault injected at point %ld: %s\n", n, c->where);
#ifdef HAVE_SANITIZER_STACK
        __sanitizer_print_stack_trace();
#else
        void *frames[32];
        backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
#endif
    }
    return 1;
}

int chi_fault_hit(const char *what, const char *file, int line)
{
    return point(&counters[CHI_FAULT_ALLOC], what, file, line);
}

void *chi_fault_malloc(size_t n, const char *file, int line)
{
    if (point(&counters[CHI_FAULT_ALLOC], "malloc", file, line)) {
        errno = ENOMEM;
        return NULL;
    }
    return malloc(n);
}

void *chi_fault_calloc(size_t count, size_t n, const char *file, int line)
{
    if (point(&counters[CHI_FAULT_ALLOC], "calloc", file, line)) {
        errno = ENOMEM;
        return NULL;
    }
    return calloc(count, n);
}

void *chi_fault_realloc(void *p, size_t n, const char *file, int line)
{
    if (point(&counters[CHI_FAULT_ALLOC], "realloc", file, line)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, n);
}

char *chi_fault_strdup(const char *s, const char *file, int line)
{
    if (point(&counters[CHI_FAULT_ALLOC], "strdup", file, line)) {
        errno = ENOMEM;
        return NULL;
    }
    return strdup(s);
}

char *chi_fault_strndup(const char *s, size_t n, const char *file, int line)
{
    if (point(&counters[CHI_FAULT_ALLOC], "strndup", file, line)) {
        errno = ENOMEM;
        return NULL;
    }
    return strndup(s, n);
}

int chi_fault_posix_memalign(void **p, size_t align, size_t n, const char *file, int line)
{
    if (point(&counters[CHI_FAULT_ALLOC], "posix_memalign", file, line))
        return ENOMEM;
    return posix_memalign(p, align, n);
}

/* jansson's allocations inside the library's calls (checkpoint headers)
 * are points too. */
static void *json_counted(size_t n) { return chi_fault_malloc(n, "jansson", 0); }

__attribute__((constructor)) static void counted_json(void) { json_set_alloc_funcs(json_counted, free); }

static int io_error(const counter *c) { return c->mode == CHI_FAULT_IO_EIO ? EIO : ENOSPC; }

ssize_t chi_fault_write(int fd, const void *buf, size_t n, const char *file, int line)
{
    counter *c = &counters[CHI_FAULT_IO];
    int hit = point(c, "write", file, line);
    if (atomic_load(&c->full) && !hit) {
        errno = ENOSPC;
        return -1;
    }
    if (!hit)
        return write(fd, buf, n);
    if (c->mode == CHI_FAULT_IO_SHORT && n > 1) {
        atomic_store(&c->full, 1);
        return write(fd, buf, n / 2);
    }
    errno = io_error(c);
    return -1;
}

int chi_fault_fsync(int fd, const char *file, int line)
{
    counter *c = &counters[CHI_FAULT_IO];
    if (point(c, "fsync", file, line) || atomic_load(&c->full)) {
        errno = atomic_load(&c->full) ? ENOSPC : io_error(c);
        return -1;
    }
    return fsync(fd);
}

size_t chi_fault_fread(void *buf, size_t size, size_t count, FILE *f, const char *file, int line)
{
    counter *c = &counters[CHI_FAULT_IO];
    if (!point(c, "fread", file, line))
        return fread(buf, size, count, f);
    if (c->mode == CHI_FAULT_IO_SHORT) {
        if (count > 1)
            return fread(buf, size, count / 2, f);
        if (count == 1 && size > 1) {
            size_t got = fread(buf, 1, size / 2, f);
            (void)got;
            return 0;
        }
    }
    errno = io_error(c);
    return 0;
}
