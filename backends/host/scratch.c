/* The host streams' scratch memory (host.h): kept between an op's calls,
 * handed to one op at a time. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"

/* `bytes` of zeroed memory, 64-byte aligned. */
static ch_status scratch_alloc(size_t bytes, void **out)
{
    size_t size = (bytes + 63) / 64 * 64;
    void *mem = NULL;
    int err = size < bytes ? ENOMEM : posix_memalign(&mem, 64, size ? size : 64);
    if (err)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "host: %zu bytes of scratch: %s", bytes,
                         strerror(err));
    memset(mem, 0, size);
    *out = mem;
    return CH_OK;
}

ch_status chi_host_scratch_take(void *stream, size_t bytes, chi_host_scratch *out)
{
    chi_host_stream *s = stream;
    out->stream = NULL;
    if (!s || atomic_exchange(&s->scratch_busy, 1))
        return scratch_alloc(bytes, &out->mem); /* in use (another thread's op) */
    if (bytes > s->scratch_bytes) {
        void *mem;
        ch_status st = scratch_alloc(bytes, &mem);
        if (st != CH_OK) {
            atomic_store(&s->scratch_busy, 0);
            return st;
        }
        free(s->scratch);
        s->scratch = mem;
        s->scratch_bytes = (bytes + 63) / 64 * 64;
    }
    out->mem = s->scratch;
    out->stream = s;
    return CH_OK;
}

void chi_host_scratch_give(chi_host_scratch *sc)
{
    chi_host_stream *s = sc->stream;
    if (s)
        atomic_store(&s->scratch_busy, 0);
    else
        free(sc->mem);
    sc->mem = NULL;
}
