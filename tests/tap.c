#include "tap.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tap_count;
static int tap_failed;
static int tap_planned;

void tap_plan(int n)
{
    printf("1..%d\n", n);
    tap_planned = 1;
}

void tap_skip_all(const char *fmt, ...)
{
    va_list ap;
    printf("1..0 # SKIP ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(0);
}

/* One line; a "not ok" counts as a failure unless it is expected (TODO). */
static void vline(int ok, const char *directive, const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '#')
            *p = (*p == '#') ? '_' : ' ';
    tap_count++;
    printf("%sok %d - %s%s\n", ok ? "" : "not ", tap_count, msg, directive ? directive : "");
    if (!ok && !(directive && strncmp(directive, " # TODO", 7) == 0))
        tap_failed++;
    fflush(stdout);
}

int tap_ok(int cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vline(cond != 0, NULL, fmt, ap);
    va_end(ap);
    return cond != 0;
}

void tap_todo(const char *why, const char *fmt, ...)
{
    char directive[1024];
    snprintf(directive, sizeof directive, " # TODO %s", why);
    for (char *p = directive + 8; *p; p++)
        if (*p == '\n' || *p == '#')
            *p = ' ';
    va_list ap;
    va_start(ap, fmt);
    vline(0, directive, fmt, ap);
    va_end(ap);
}

void tap_skip(const char *fmt, ...)
{
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    tap_count++;
    printf("ok %d # SKIP %s\n", tap_count, why);
    fflush(stdout);
}

void tap_diag(const char *fmt, ...)
{
    va_list ap;
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

int tap_status_ok(ch_status st, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (st == CH_OK)
        return tap_ok(1, "%s", msg);
    return tap_ok(0, "%s: got %s (%s)", msg, ch_status_str(st), ch_last_error());
}

int tap_status_is(ch_status got, ch_status want, const char *needle, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *err = ch_last_error();
    int msg_ok = needle ? strstr(err, needle) != NULL : err[0] != '\0';
    if (got == want && msg_ok)
        return tap_ok(1, "%s", msg);
    return tap_ok(0, "%s: got %s \"%s\", want %s with \"%s\"", msg, ch_status_str(got), err,
                  ch_status_str(want), needle ? needle : "a message");
}

int tap_done(void)
{
    if (!tap_planned)
        printf("1..%d\n", tap_count);
    fflush(stdout);
    return tap_failed ? 1 : 0;
}

int tap_failures(void) { return tap_failed; }

uint64_t tap_rng_next(tap_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float tap_rng_uniform(tap_rng *r, float lo, float hi)
{
    double u = (double)(tap_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

int tap_devices(ch_device **out, int capacity)
{
    int n = ch_device_count();
    int k = 0;
    for (int i = 0; i < n && k < capacity; i++)
        if (ch_device_get(&out[k], i) == CH_OK)
            k++;
    return k;
}

/* The first pair (i < j) of non-host devices of one backend for which
 * peering both ways is `peer`. */
static int backend_pair(ch_device **a, ch_device **b, int peer)
{
    ch_device *devs[64];
    int n = tap_devices(devs, 64);
    for (int i = 0; i < n; i++) {
        ch_device_info x, y;
        if (ch_device_get_info(devs[i], &x) != CH_OK || strcmp(x.backend, "host") == 0)
            continue;
        for (int j = i + 1; j < n; j++) {
            if (ch_device_get_info(devs[j], &y) != CH_OK || strcmp(x.backend, y.backend) != 0)
                continue;
            int both = ch_device_can_peer(devs[i], devs[j]) && ch_device_can_peer(devs[j], devs[i]);
            if (both == peer) {
                *a = devs[i];
                *b = devs[j];
                return 1;
            }
        }
    }
    return 0;
}

int tap_peer_pair(ch_device **a, ch_device **b) { return backend_pair(a, b, 1); }

int tap_cross_pair(ch_device **a, ch_device **b) { return backend_pair(a, b, 0); }

ch_status tap_settled(ch_status st, const ch_tensor *t)
{
    return st != CH_OK ? st : ch_device_sync(ch_tensor_device(t));
}

ch_status tap_download_floats(const ch_tensor *t, float *out, size_t bytes)
{
    if (ch_tensor_dtype(t) == CH_F32)
        return ch_tensor_download(t, out, bytes);
    int64_t shape[CH_MAX_DIMS];
    for (int i = 0; i < ch_tensor_ndim(t); i++)
        shape[i] = ch_tensor_dim(t, i);
    ch_tensor *wide = NULL;
    ch_status st = ch_tensor_new(&wide, ch_tensor_device(t), CH_F32, ch_tensor_ndim(t), shape);
    if (st == CH_OK)
        st = ch_cast(wide, t);
    if (st == CH_OK)
        st = ch_tensor_download(wide, out, bytes);
    ch_tensor_free(wide);
    return st;
}

int tap_env_devices(ch_device **out, int capacity)
{
    const char *list = getenv("CHORUS_TEST_DEVICES");
    if (!list || !*list)
        return 0;
    int n = 0;
    if (!tap_status_ok(ch_device_list_parse_replicas(out, capacity, &n, list),
                       "CHORUS_TEST_DEVICES=\"%s\"", list))
        return -1;
    return n;
}

ch_module *tap_sequential(int n, ch_module *const *children)
{
    ch_module *seq = NULL;
    int taken = 0; /* children handed to ch_nn_sequential_add, which frees on failure */
    if (ch_nn_sequential(&seq) == CH_OK)
        while (taken < n && children[taken] &&
               ch_nn_sequential_add(seq, children[taken++]) == CH_OK)
            ;
    int ok = seq && taken == n && ch_module_child_count(seq) == n;
    for (int k = taken; !ok && k < n; k++)
        ch_module_free(children[k]);
    if (!ok) {
        ch_module_free(seq);
        return NULL;
    }
    return seq;
}

ch_batch tap_mnist_batch(ch_device *host, tap_rng *rng, int count, int64_t index,
                         ch_host_buffer **images, ch_host_buffer **labels)
{
    ch_host_buffer_new(images, host, sizeof(float) * (size_t)count * 784);
    ch_host_buffer_new(labels, host, sizeof(int32_t) * (size_t)count);
    float *x = *images ? ch_host_buffer_data(*images) : NULL;
    int32_t *l = *labels ? ch_host_buffer_data(*labels) : NULL;
    if (!x || !l) {
        /* Nothing to test with: TAP's bail-out ends the run. */
        printf("Bail out! tap_mnist_batch: no pinned buffers: %s\n", ch_last_error());
        exit(1);
    }
    for (int i = 0; i < count * 784; i++)
        x[i] = tap_rng_uniform(rng, -1, 1);
    for (int i = 0; i < count; i++) {
        l[i] = (int32_t)(tap_rng_next(rng) % 10);
        for (int j = 0; j < 28; j++)
            x[i * 784 + l[i] * 28 + j] += 1.5f;
    }
    return (ch_batch){*images, *labels, NULL, count, 0, index};
}

void tap_mnist_batches_make(tap_mnist_batches *bs, ch_device *host, uint64_t seed, int n, int count)
{
    tap_rng rng = {seed};
    bs->n = n;
    bs->images = calloc((size_t)n, sizeof *bs->images);
    bs->labels = calloc((size_t)n, sizeof *bs->labels);
    bs->b = calloc((size_t)n, sizeof *bs->b);
    if (!bs->images || !bs->labels || !bs->b) {
        printf("Bail out! tap_mnist_batches_make: out of memory\n");
        exit(1);
    }
    for (int s = 0; s < n; s++)
        bs->b[s] = tap_mnist_batch(host, &rng, count, s, &bs->images[s], &bs->labels[s]);
}

void tap_mnist_batches_free(tap_mnist_batches *bs)
{
    for (int s = 0; s < bs->n; s++) {
        ch_host_buffer_free(bs->images[s]);
        ch_host_buffer_free(bs->labels[s]);
    }
    free(bs->images);
    free(bs->labels);
    free(bs->b);
    *bs = (tap_mnist_batches){0};
}

double tap_params_max_rel(ch_module *a, ch_module *b)
{
    double worst = 0.0;
    for (int i = 0; i < ch_module_param_count(a); i++) {
        ch_tensor *x = NULL, *y = NULL;
        ch_module_param(a, i, NULL, &x, NULL);
        ch_module_param(b, i, NULL, &y, NULL);
        size_t n = x ? (size_t)ch_tensor_numel(x) : 0;
        float *u = malloc(n * sizeof *u + 1), *v = malloc(n * sizeof *v + 1);
        int got = x && y && u && v && ch_tensor_download(x, u, n * sizeof *u) == CH_OK &&
                  ch_tensor_download(y, v, n * sizeof *v) == CH_OK;
        double scale = 1e-30, diff = got ? 0.0 : INFINITY;
        for (size_t k = 0; got && k < n; k++) {
            scale = fmax(scale, fabs(v[k]));
            diff = fmax(diff, fabs((double)u[k] - v[k]));
        }
        worst = fmax(worst, diff / scale);
        free(u);
        free(v);
    }
    return worst;
}

ch_dp_options tap_mnist_dp_options(uint64_t seed)
{
    ch_dp_options o = {0};
    o.reduce = CH_REDUCE_HOST;
    o.loss = CH_LOSS_CROSS_ENTROPY;
    o.optimizer = ch_optimizer_defaults(CH_OPT_SGD, 0.05f);
    o.optimizer.momentum = 0.9f;
    o.sample_ndim = 3;
    o.sample_shape[0] = 1;
    o.sample_shape[1] = 28;
    o.sample_shape[2] = 28;
    o.seed = seed;
    return o;
}

uint32_t tap_bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

float tap_float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The pattern nearest to f, ties to the even one, by arithmetic on doubles;
 * a NaN is quiet with its sign and the top of its payload. */
uint16_t tap_half_narrow(int mant, float f)
{
    uint32_t u = tap_bits_of(f);
    int ebits = 15 - mant, bias = (1 << (ebits - 1)) - 1, emin = 1 - bias;
    uint16_t sign = (uint16_t)((u >> 31) << 15);
    uint16_t inf = (uint16_t)(((1u << ebits) - 1u) << mant);
    if (isnan(f))
        return (uint16_t)(sign | inf | (1u << (mant - 1)) |
                          ((u & 0x7fffffu) >> (23 - mant)));
    if (isinf(f))
        return (uint16_t)(sign | inf);
    double a = fabs((double)f);
    if (a == 0.0)
        return sign;
    int e;
    frexp(a, &e);
    e -= 1; /* a = m 2^e, 1 <= m < 2 */
    if (e < emin)
        e = emin;
    double q = nearbyint(ldexp(a, mant - e)); /* in units of the last place */
    if (q >= ldexp(1.0, mant + 1)) {
        q /= 2;
        e += 1;
    }
    if (e > bias)
        return (uint16_t)(sign | inf);
    if (q < ldexp(1.0, mant))
        return (uint16_t)(sign | (uint16_t)q); /* subnormal, or zero */
    return (uint16_t)(sign | (((e + bias) << mant) | ((uint32_t)q - (1u << mant))));
}

/* The float a pattern stands for (exact: every pattern is a float). */
uint32_t tap_half_widen(int mant, uint16_t h)
{
    int ebits = 15 - mant, bias = (1 << (ebits - 1)) - 1, emin = 1 - bias;
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> mant) & ((1u << ebits) - 1u);
    uint32_t m = h & ((1u << mant) - 1u);
    if (e == (1u << ebits) - 1u)
        return sign | 0x7f800000u | (m << (23 - mant));
    double v = e == 0 ? ldexp((double)m, emin - mant)
                      : ldexp((double)((1u << mant) | m), (int)e - bias - mant);
    return sign | tap_bits_of((float)v);
}

/* The nets trained here have no discrete choice in them: strided
 * convolutions instead of max-pooling, tanh instead of ReLU. A data-parallel
 * step over several backends computes each replica's samples with that
 * backend's rounding, so its parameters differ from one device's in the
 * last bits; where two inputs of a max-pool window are equal or a ReLU's
 * input is zero within those bits, the choice can flip and move a whole
 * gradient element (the cnn's max-pool did so at step 2 with host, opencl
 * and the automatic split: 1.6e-2 after 20 steps). Equivalence up to float
 * rounding is only measurable on a smooth function; max-pool and ReLU are
 * checked against a double reference on every device in test-ops. With
 * `dropout`, dropout (p 0.3) before the last layer. */
ch_module *tap_smooth_cnn(int dropout)
{
    ch_module *m[9] = {NULL};
    int k = 0;
    ch_nn_conv2d(&m[k++], 1, 8, 3, 2, 1);
    ch_nn_activation(&m[k++], CH_ACT_TANH);
    ch_nn_conv2d(&m[k++], 8, 16, 3, 2, 1);
    ch_nn_activation(&m[k++], CH_ACT_TANH);
    ch_nn_flatten(&m[k++]);
    ch_nn_linear(&m[k++], 16 * 7 * 7, 64);
    ch_nn_activation(&m[k++], CH_ACT_TANH);
    if (dropout)
        ch_nn_dropout(&m[k++], 0.3f);
    ch_nn_linear(&m[k++], 64, 10);
    return tap_sequential(k, m);
}
