/* The attention slots: fused causal attention (flash.cl), no [T, T]
 * matrix stored. Forward: o and lse. Backward: d = dout.o, then dq by
 * query rows and dk, dv by key rows, apart, so that no sum needs an
 * atomic: the same bits on every run. Each launch takes the kernel's
 * variant for the head size (16, 32, 64, 128 their own, any other up to
 * FLASH_HD_MAX the general one), a work-group from the kernel's limits
 * and preferred multiple, and tiles sized from the device's local memory
 * (where not one row fits, the variant that reads the tiles in global
 * memory). */
#include "config.h"

#include "opencl.h"

/* flash.cl's FLASH_HD_MAX, CUDA's CHF_HD_MAX. */
#define FLASH_HD_MAX 256
/* The rows a work-group owns: this many, or the kernel's preferred
 * multiple where that is more, fewer where the kernel or the device
 * allows fewer. */
#define FLASH_GROUP 64
/* The floats of one tile at most (16 KiB, as CUDA's). */
#define FLASH_TILE_FLOATS 4096

/* The variants of each kernel, in opencl.h's order from the kernel's
 * first (head size 16): the general one and its global-memory twin. */
enum {
    FLASH_ANY = 4,
    FLASH_GLOBAL = 5
};

static int flash_variant(int64_t hd)
{
    switch (hd) {
    case 16: return 0;
    case 32: return 1;
    case 64: return 2;
    case 128: return 3;
    default: return FLASH_ANY;
    }
}

/* One launch's choices: the kernel, its work-group, the rows of its
 * tiles and whether they are in local memory. */
typedef struct flash_plan {
    chcl_kern_id k;
    size_t group;
    cl_int rows;
    int local;
} flash_plan;

/* The geometry every kernel takes (flash.cl's flash_geom); flash_run
 * passes the rows of its tiles after it. */
typedef struct flash_geom {
    cl_int t, heads, hd, ld, ldo;
    cl_float scale;
} flash_geom;
#define FLASH_GEOM_ARGS(g)                                                                         \
    CHCL_ARG((g).t), CHCL_ARG((g).heads), CHCL_ARG((g).hd), CHCL_ARG((g).ld), CHCL_ARG((g).ldo),   \
        CHCL_ARG((g).scale)

/* The most arguments a kernel takes (flash_dkv's). */
#define FLASH_ARGS_MAX 27

static ch_status flash_group(chcl_stream *s, chcl_kern_id k, size_t *group)
{
    ch_status st = chcl_group_size(s, k, FLASH_GROUP, 0, group);
    /* set by chcl_group_size, which created the kernel */
    size_t multiple = s->dev->kernel_multiple[k];
    if (st == CH_OK && multiple > *group)
        st = chcl_group_size(s, k, multiple, 0, group);
    return st;
}

/* The plan of kernel `first` (its variant for head size 16) for head size
 * hd, whose tiles' rows are 2 hd + `scalars` floats: as many rows as the
 * group has, at most FLASH_TILE_FLOATS / hd, fewer where the device's local
 * memory holds fewer; where it holds not one, the global-memory variant,
 * its tiles as many rows as its group. */
static ch_status flash_plan_of(chcl_stream *s, chcl_kern_id first, int64_t hd, int scalars,
                               flash_plan *p)
{
    const chcl_device *d = s->dev;
    p->k = (chcl_kern_id)(first + flash_variant(hd));
    ch_status st = flash_group(s, p->k, &p->group);
    if (st != CH_OK)
        return st;
    cl_ulong fixed = d->kernel_local[p->k];
    cl_ulong room = d->local_mem > fixed ? d->local_mem - fixed : 0;
    int64_t rows = FLASH_TILE_FLOATS / hd;
    int64_t fit = (int64_t)(room / ((cl_ulong)(2 * hd + scalars) * sizeof(cl_float)));
    if ((int64_t)p->group < rows)
        rows = (int64_t)p->group;
    if (fit < rows)
        rows = fit;
    p->local = rows > 0;
    if (!p->local) {
        p->k = (chcl_kern_id)(first + FLASH_GLOBAL);
        st = flash_group(s, p->k, &p->group);
        rows = (int64_t)p->group;
    }
    p->rows = (cl_int)rows;
    return st;
}

/* Plan and launch `first`'s variant over `bh` matrices of t rows: `args`,
 * the rows of the tiles, then the plan's `tiles` local arrays where it
 * has them (the first two [rows][hd], the others [rows]). */
static ch_status flash_run(chcl_stream *s, chcl_kern_id first, const flash_geom *g, int64_t bh,
                           const chcl_arg *given, int ngiven, int tiles)
{
    flash_plan p;
    ch_status st = flash_plan_of(s, first, g->hd, tiles - 2, &p);
    if (st != CH_OK)
        return st;
    chcl_arg args[FLASH_ARGS_MAX];
    int nargs = 0;
    while (nargs < ngiven) {
        args[nargs] = given[nargs];
        nargs++;
    }
    args[nargs++] = CHCL_ARG(p.rows);
    for (int i = 0; p.local && i < tiles; i++)
        args[nargs++] = CHCL_LOCAL((size_t)p.rows * (size_t)(i < 2 ? g->hd : 1) * sizeof(cl_float));
    size_t global[2] = {(size_t)g->t, (size_t)bh}, local[2] = {p.group, 1};
    return chcl_launch(s, p.k, nargs, args, 2, global, local);
}

/* The geometry, or CH_ERR_UNSUPPORTED for a head size past FLASH_HD_MAX
 * and CH_ERR_LIMIT for arrays beyond what an int indexes (the core
 * checked the rest). */
static ch_status flash_geom_of(const char *slot, int64_t b, int64_t heads, int64_t t, int64_t hd,
                               float scale, int64_t ld, int64_t ldo, flash_geom *g)
{
    if (hd > FLASH_HD_MAX)
        return chi_error(CH_ERR_UNSUPPORTED, "opencl %s: head size %lld, at most %d", slot,
                         (long long)hd, FLASH_HD_MAX);
    ch_status st = chcl_check_count(slot, b * t * ld);
    if (st == CH_OK)
        st = chcl_check_count(slot, b * t * ldo);
    if (st == CH_OK)
        st = chcl_check_count(slot, b * heads * t);
    *g = (flash_geom){(cl_int)t, (cl_int)heads, (cl_int)hd, (cl_int)ld, (cl_int)ldo, scale};
    return st;
}

/* The products stay f32 whatever `half` names: the slot allows it. */
ch_status chcl_attention(void *stream, int64_t b, int64_t heads, int64_t t, int64_t hd, float scale,
                         ch_dtype half, ch_bmem o, int64_t ldo, ch_bmem lse, ch_bmem q, ch_bmem k,
                         ch_bmem v, int64_t ld)
{
    (void)half;
    flash_geom g;
    ch_status st = flash_geom_of("attention", b, heads, t, hd, scale, ld, ldo, &g);
    if (st != CH_OK)
        return st;
    chcl_ref O = chcl_ref_of(o), L = chcl_ref_of(lse), Q = chcl_ref_of(q), K = chcl_ref_of(k),
             V = chcl_ref_of(v);
    chcl_arg args[] = {CHCL_REF(O), CHCL_REF(L), CHCL_REF(Q),
                       CHCL_REF(K), CHCL_REF(V), FLASH_GEOM_ARGS(g)};
    return flash_run(stream, CHCL_K_FLASH_FORWARD_16, &g, b * heads, args, CHCL_COUNT_OF(args), 2);
}

ch_status chcl_attention_backward(void *stream, int64_t b, int64_t heads, int64_t t, int64_t hd,
                                  float scale, ch_dtype half, ch_bmem dq, ch_bmem dk, ch_bmem dv,
                                  ch_bmem q, ch_bmem k, ch_bmem v, int64_t ld, ch_bmem dout,
                                  ch_bmem o, int64_t ldo, ch_bmem lse)
{
    (void)half;
    chcl_stream *s = stream;
    flash_geom g;
    ch_status st = flash_geom_of("attention_backward", b, heads, t, hd, scale, ld, ldo, &g);
    int64_t rows = b * heads * t;
    size_t bytes = (size_t)rows * sizeof(cl_float);
    cl_mem d = NULL;
    if (st == CH_OK)
        st = chcl_scratch_acquire(s, "attention_backward", bytes, &d);
    if (st != CH_OK)
        return st;
    chcl_ref D = {d, 0}, G = chcl_ref_of(dout), O = chcl_ref_of(o), L = chcl_ref_of(lse),
             Q = chcl_ref_of(q), K = chcl_ref_of(k), V = chcl_ref_of(v), DQ = chcl_ref_of(dq),
             DK = chcl_ref_of(dk), DV = chcl_ref_of(dv);
    cl_int n = (cl_int)rows;
    chcl_arg d_args[] = {CHCL_REF(D),       CHCL_REF(G),    CHCL_REF(O),     CHCL_ARG(g.t),
                         CHCL_ARG(g.heads), CHCL_ARG(g.hd), CHCL_ARG(g.ldo), CHCL_ARG(n)};
    st = chcl_launch1(s, CHCL_K_FLASH_D, CHCL_COUNT_OF(d_args), d_args, rows);
    if (st == CH_OK) {
        chcl_arg args[] = {CHCL_REF(DQ), CHCL_REF(Q), CHCL_REF(K), CHCL_REF(V),
                           CHCL_REF(G),  CHCL_REF(L), CHCL_REF(D), FLASH_GEOM_ARGS(g)};
        st = flash_run(s, CHCL_K_FLASH_DQ_16, &g, b * heads, args, CHCL_COUNT_OF(args), 2);
    }
    if (st == CH_OK) {
        chcl_arg args[] = {CHCL_REF(DK), CHCL_REF(DV), CHCL_REF(Q), CHCL_REF(K),       CHCL_REF(V),
                           CHCL_REF(G),  CHCL_REF(L),  CHCL_REF(D), FLASH_GEOM_ARGS(g)};
        st = flash_run(s, CHCL_K_FLASH_DKV_16, &g, b * heads, args, CHCL_COUNT_OF(args), 4);
    }
    chcl_scratch_release(s);
    return st;
}
