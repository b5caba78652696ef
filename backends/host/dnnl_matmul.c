/* The host's half-precision GEMM (the gemm_half slot) through oneDNN's
 * matmul, when the build has oneDNN: bf16 or f16 inputs, outputs in f32
 * or in the inputs' format, one product or a batch of them, with alpha,
 * beta and an optional f32 bias. A matmul is made once per shape and kept
 * in a small cache until the backend shuts down; the engine, the streams
 * and their scratchpads are dnnl.c's (dnnl_impl.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "host.h"

#ifdef HAVE_ONEDNN

#include "dnnl_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A matmul for one shape of the gemm_half slot. */
typedef struct mm_entry {
    int ab, cd, ta, tb, bias; /* bias: f32 [n] added to every row of C */
    int64_t count, m, n, k, lda, ldb, ldc, sa, sb, sc;
    float alpha, beta;
    int ok;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t md[4]; /* a, b, c, bias */
    /* A single product's B in the layout the matmul chose (b_want, b_bytes
     * of it at the start of the scratch memory), reordered from md[1]
     * before each call; NULL: the matmul reads B as stored. */
    dnnl_primitive_t reorder_b;
    dnnl_memory_desc_t b_want;
    size_t b_bytes;
    int b_padded;   /* b_want pads k or n: the padding must read as zeros */
    size_t scratch; /* in all: B reordered, then the scratchpad */
    char why[160];  /* when not ok: what oneDNN refused */
    struct mm_entry *next;
} mm_entry;

/* The shapes met so far (chi_host_dnnl_lock guards it). */
static struct {
    mm_entry *entries;
    int count;
} cache;

void chi_host_dnnl_matmul_clear_locked(void)
{
    while (cache.entries) {
        mm_entry *e = cache.entries;
        cache.entries = e->next;
        if (e->prim)
            dnnl_primitive_destroy(e->prim);
        if (e->reorder_b)
            dnnl_primitive_destroy(e->reorder_b);
        free(e);
    }
    cache.count = 0;
}

static void mm_build(mm_entry *e)
{
    dnnl_data_type_t in = e->ab == CH_BF16 ? dnnl_bf16 : dnnl_f16;
    dnnl_data_type_t out = e->cd == CH_F32 ? dnnl_f32 : in;
    int nd = e->count > 1 ? 3 : 2, o = nd - 2;
    dnnl_dims_t da = {e->count, e->m, e->k}, db = {e->count, e->k, e->n},
                dc = {e->count, e->m, e->n};
    dnnl_dims_t sa = {e->sa, e->ta ? 1 : e->lda, e->ta ? e->lda : 1},
                sb = {e->sb, e->tb ? 1 : e->ldb, e->tb ? e->ldb : 1}, sc = {e->sc, e->ldc, 1};
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_attr_t attr = chi_host_dnnl_user_scratch_attr();
    const char *what = "dnnl_memory_desc_init_by_strides";
    dnnl_status_t s = attr ? dnnl_success : dnnl_out_of_memory;
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&e->md[0], nd, da + (1 - o), in, sa + (1 - o));
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&e->md[1], nd, db + (1 - o), in, sb + (1 - o));
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&e->md[2], nd, dc + (1 - o), out, sc + (1 - o));
    dnnl_dims_t dbias = {1, e->n};
    if (s == dnnl_success && e->bias)
        s = dnnl_memory_desc_init_by_tag(&e->md[3], 2, dbias, dnnl_f32, dnnl_ab);
    if (s == dnnl_success && e->alpha != 1.0f) {
        what = "dnnl_primitive_attr_set_output_scales";
        s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &e->alpha);
    }
    if (s == dnnl_success && e->beta != 0.0f) {
        what = "the sum post-op";
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success)
            s = dnnl_post_ops_append_sum(po, e->beta);
        if (s == dnnl_success)
            s = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    /* Where B is stored transposed (x W^T, a Linear's forward), k is at
     * most 768 and n an odd multiple of 256, the matmul chooses B's layout
     * ("any") and B is reordered into it each call: oneDNN 2.6's AMX
     * matmul reads such a B as stored at about half the rate it reaches
     * from its own layout (GPT-2 small's Linears), while for the other
     * shapes (k 1024 to 4096, n a multiple of 512, n 640 or 1280) the
     * reorder costs more than it saves. A rule of the shape, not a
     * timing: the same layout, and the same bits, on every run. */
    dnnl_memory_desc_t b_any;
    dnnl_dims_t dkn = {e->k, e->n};
    int any = nd == 2 && e->tb && e->k <= 768 && e->n % 512 == 256 && s == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&b_any, 2, dkn, in, dnnl_format_tag_any) == dnnl_success;
    if (s == dnnl_success) {
        what = "dnnl_matmul_desc_init";
        s = dnnl_matmul_desc_init(&d, &e->md[0], any ? &b_any : &e->md[1],
                                  e->bias ? &e->md[3] : NULL, &e->md[2]);
    }
    if (s == dnnl_success) {
        what = "dnnl_primitive_desc_create (matmul)";
        s = dnnl_primitive_desc_create(&pd, &d, attr, chi_host_dnnl_engine, NULL);
    }
    size_t reorder_scratch = 0;
    if (s == dnnl_success && any) {
        const dnnl_memory_desc_t *want = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        what = "the reorder of B (matmul)";
        s = want ? dnnl_success : dnnl_runtime_error;
        if (s == dnnl_success && !dnnl_memory_desc_equal(want, &e->md[1])) {
            dnnl_primitive_desc_t rpd = NULL;
            e->b_want = *want;
            e->b_bytes = dnnl_memory_desc_get_size(want);
            e->b_padded = e->b_bytes > (size_t)(e->k * e->n) * 2; /* bf16, f16 */
            s = dnnl_reorder_primitive_desc_create(&rpd, &e->md[1], chi_host_dnnl_engine, want,
                                                   chi_host_dnnl_engine, attr);
            if (s == dnnl_success) {
                reorder_scratch = chi_host_dnnl_scratch_of(rpd);
                s = dnnl_primitive_create(&e->reorder_b, rpd);
                dnnl_primitive_desc_destroy(rpd);
            }
            if (s != dnnl_success)
                e->reorder_b = NULL;
        }
    }
    if (s == dnnl_success) {
        size_t mm_scratch = chi_host_dnnl_scratch_of(pd);
        e->scratch = (e->reorder_b ? chi_host_dnnl_align_up(e->b_bytes) : 0) +
                     (mm_scratch > reorder_scratch ? mm_scratch : reorder_scratch);
        what = "dnnl_primitive_create (matmul)";
        s = dnnl_primitive_create(&e->prim, pd);
    }
    e->ok = s == dnnl_success;
    if (!e->ok) {
        e->prim = NULL;
        if (e->reorder_b)
            dnnl_primitive_destroy(e->reorder_b);
        e->reorder_b = NULL;
        snprintf(e->why, sizeof e->why, "%s: oneDNN status %d", what, (int)s);
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
}

/* The matmul for this call's shape, made on first use (NULL with *why
 * when oneDNN cannot run it; the cache's failure too). */
static const mm_entry *mm_lookup(const mm_entry *key, const char **why)
{
    const mm_entry *found = NULL;
    *why = "the oneDNN engine could not be made";
    pthread_mutex_lock(&chi_host_dnnl_lock);
    if (!chi_host_dnnl_engine_locked())
        goto out;
    for (mm_entry *e = cache.entries; e; e = e->next)
        if (e->ab == key->ab && e->cd == key->cd && e->ta == key->ta && e->tb == key->tb &&
            e->bias == key->bias && e->count == key->count && e->m == key->m && e->n == key->n &&
            e->k == key->k && e->lda == key->lda && e->ldb == key->ldb && e->ldc == key->ldc &&
            e->sa == key->sa && e->sb == key->sb && e->sc == key->sc && e->alpha == key->alpha &&
            e->beta == key->beta) {
            found = e;
            goto out;
        }
    *why = "more shapes than the cache holds";
    if (cache.count >= CHI_HOST_DNNL_MAX_ENTRIES)
        goto out;
    mm_entry *e = malloc(sizeof *e);
    *why = "out of host memory";
    if (!e)
        goto out;
    *e = *key;
    e->next = NULL;
    mm_build(e);
    e->next = cache.entries;
    cache.entries = e;
    cache.count++;
    found = e;
out:
    pthread_mutex_unlock(&chi_host_dnnl_lock);
    if (found && !found->ok) {
        *why = found->why;
        return NULL;
    }
    return found;
}

ch_status chi_host_gemm_half(void *stream, int ab, int cd, int trans_a, int trans_b, int64_t count,
                             int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                             int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b, float beta,
                             ch_bmem c, int64_t ldc, int64_t stride_c, ch_bmem bias)
{
    (void)stream;
    if (bias.ptr && (count != 1 || beta != 0.0f || cd != CH_F32))
        return chi_error(CH_ERR_UNSUPPORTED, "host gemm_half: a bias only on one product into f32 "
                                             "with beta 0");
    if (m == 0 || n == 0 || count == 0)
        return CH_OK;
    mm_entry key = {.ab = ab,
                    .cd = cd,
                    .ta = trans_a != 0,
                    .tb = trans_b != 0,
                    .count = count,
                    .m = m,
                    .n = n,
                    .k = k,
                    .lda = lda,
                    .ldb = ldb,
                    .ldc = ldc,
                    .sa = count > 1 ? stride_a : 0,
                    .sb = count > 1 ? stride_b : 0,
                    .sc = count > 1 ? stride_c : 0,
                    .alpha = alpha,
                    .beta = beta,
                    .bias = bias.ptr != NULL};
    const char *why;
    const mm_entry *e = k > 0 ? mm_lookup(&key, &why) : NULL;
    if (!e)
        return chi_error(CH_ERR_UNSUPPORTED, "host gemm_half (oneDNN matmul): %s",
                         k > 0 ? why : "k is 0");
    chi_host_dnnl_ctx *ctx = NULL;
    ch_status r = chi_host_dnnl_ctx_take(&ctx, e->scratch, "gemm_half");
    if (r != CH_OK) {
        chi_host_dnnl_ctx_give(ctx);
        return r;
    }
    void *ptr[3] = {(char *)a.ptr + a.off, (char *)b.ptr + b.off, (char *)c.ptr + c.off};
    /* mem: a, b, c, the scratchpad, b reordered, the bias */
    dnnl_memory_t mem[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    size_t pad_off = e->reorder_b ? chi_host_dnnl_align_up(e->b_bytes) : 0;
    dnnl_status_t s = dnnl_success;
    for (int i = 0; i < 3 && s == dnnl_success; i++)
        s = dnnl_memory_create(&mem[i], &e->md[i], chi_host_dnnl_engine, ptr[i]);
    if (s == dnnl_success && e->bias)
        s = dnnl_memory_create(&mem[5], &e->md[3], chi_host_dnnl_engine,
                               (char *)bias.ptr + bias.off);
    if (s == dnnl_success && e->scratch > pad_off) {
        dnnl_memory_desc_t md;
        dnnl_dims_t d = {(dnnl_dim_t)(e->scratch - pad_off)};
        s = dnnl_memory_desc_init_by_tag(&md, 1, d, dnnl_u8, dnnl_a);
        if (s == dnnl_success)
            s = dnnl_memory_create(&mem[3], &md, chi_host_dnnl_engine,
                                   (char *)ctx->scratch + pad_off);
    }
    if (s == dnnl_success && e->reorder_b) {
        /* A layout that pads k or n: the reorder leaves the padding as it
         * finds it, the matmul reads it as zeros, and the memory held
         * another call's B before. */
        if (e->b_padded)
            memset(ctx->scratch, 0, e->b_bytes);
        s = dnnl_memory_create(&mem[4], &e->b_want, chi_host_dnnl_engine, ctx->scratch);
        dnnl_exec_arg_t rargs[3] = {
            {DNNL_ARG_FROM, mem[1]}, {DNNL_ARG_TO, mem[4]}, {DNNL_ARG_SCRATCHPAD, mem[3]}};
        if (s == dnnl_success)
            s = dnnl_primitive_execute(e->reorder_b, ctx->stream, mem[3] ? 3 : 2, rargs);
    }
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, mem[0]},
                                   {DNNL_ARG_WEIGHTS, e->reorder_b ? mem[4] : mem[1]},
                                   {DNNL_ARG_DST, mem[2]}};
        int nargs = 3;
        if (mem[3])
            args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem[3]};
        if (mem[5])
            args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mem[5]};
        s = dnnl_primitive_execute(e->prim, ctx->stream, nargs, args);
    }
    if (s == dnnl_success)
        s = dnnl_stream_wait(ctx->stream);
    for (int i = 0; i < 6; i++)
        if (mem[i])
            dnnl_memory_destroy(mem[i]);
    chi_host_dnnl_ctx_give(ctx);
    return s == dnnl_success ? CH_OK : chi_host_dnnl_fail(s, "gemm_half", "the matmul");
}

#endif /* HAVE_ONEDNN */
