/* A backend that fills the required slots alone (tests/minimal-module.c:
 * device, memory, streams, transfers and GEMM) runs every other op on the
 * host backend (lib/ops_fallback.c). Its module, chorus-minimal.so, is a
 * name the core does not know: the registry finds it by scanning the
 * backend path. The reference mlp trains on it to the host's losses, with
 * one line on stderr per op and device and the same pairs listed by
 * ch_fallback_get. Its events have no time for a trace (event_seconds is
 * optional and left NULL). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>

#include "tap.h"
#include "../lib/trace.h"

enum {
    BATCH = 16,
    STEPS = 8,
    PIXELS = 28 * 28,
    CLASSES = 10
};

/* The losses of STEPS SGD steps of the mlp preset on `dev` over one batch
 * (which it learns by heart), from the same initial weights and data on
 * every device. */
static int train(ch_device *dev, float *losses)
{
    const char *id = ch_device_id(dev);
    static float xv[BATCH * PIXELS];
    int32_t lab[BATCH];
    tap_rng rng = {42};
    for (int i = 0; i < BATCH; i++) {
        lab[i] = (int32_t)(tap_rng_next(&rng) % CLASSES);
        for (int p = 0; p < PIXELS; p++)
            xv[i * PIXELS + p] = tap_rng_uniform(&rng, 0.0f, 1.0f);
    }
    ch_module *mlp = NULL;
    ch_loss *loss = NULL;
    ch_optimizer *opt = NULL;
    ch_tensor *x = NULL, *labels = NULL;
    int64_t xs[4] = {BATCH, 1, 28, 28}, ls[1] = {BATCH};
    float lr = 0.05f;
    ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_SGD, lr);
    o.momentum = 0.9f;
    ch_status st = ch_nn_preset(&mlp, "mlp");
    if (st == CH_OK)
        st = ch_module_init(mlp, 7);
    if (st == CH_OK)
        st = ch_module_to(mlp, dev);
    if (st == CH_OK)
        st = ch_tensor_new(&x, dev, CH_F32, 4, xs);
    if (st == CH_OK)
        st = ch_tensor_new(&labels, dev, CH_I32, 1, ls);
    if (st == CH_OK)
        st = ch_tensor_upload(x, xv, sizeof xv);
    if (st == CH_OK)
        st = ch_tensor_upload(labels, lab, sizeof lab);
    if (st == CH_OK)
        st = ch_loss_new(&loss, CH_LOSS_CROSS_ENTROPY);
    if (st == CH_OK)
        st = ch_optimizer_new(&opt, mlp, &o);
    for (int s = 0; st == CH_OK && s < STEPS; s++) {
        ch_tensor *y, *value, *dy;
        st = ch_module_zero_grad(mlp);
        if (st == CH_OK)
            st = ch_module_forward(mlp, &y, x);
        if (st == CH_OK)
            st = ch_loss_forward(loss, &value, y, labels);
        if (st == CH_OK)
            st = ch_loss_backward(loss, &dy, 1.0f);
        if (st == CH_OK)
            st = ch_module_backward(mlp, NULL, dy);
        if (st == CH_OK)
            st = ch_optimizer_step(opt, lr);
        if (st == CH_OK)
            st = ch_tensor_download(value, &losses[s], sizeof losses[s]);
    }
    int ok = tap_status_ok(st, "%d SGD steps of the mlp on %s", STEPS, id);
    ch_optimizer_free(opt);
    ch_loss_free(loss);
    ch_tensor_free(x);
    ch_tensor_free(labels);
    ch_module_free(mlp);
    return ok;
}

/* ---- ops whose outputs are read, or alias an input ---------------------- */

enum {
    R = 6,
    D = 5,
    V = 4,
    MAX_OUT = 64
};

/* A tensor of `n` floats on dev, filled from a fixed sequence. */
static ch_tensor *filled(ch_device *dev, int ndim, const int64_t *shape, float seed)
{
    ch_tensor *t = NULL;
    float v[MAX_OUT];
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    for (int64_t i = 0; i < n; i++)
        v[i] = seed + 0.37f * (float)((i * 7) % 11) - 1.1f;
    if (ch_tensor_new(&t, dev, CH_F32, ndim, shape) != CH_OK ||
        ch_tensor_upload(t, v, (size_t)n * sizeof(float)) != CH_OK) {
        ch_tensor_free(t);
        return NULL;
    }
    return t;
}

/* Appends t's values to out (at *n); a failed download is a status. */
static ch_status take(const ch_tensor *t, float *out, int *n)
{
    int64_t k = ch_tensor_numel(t);
    if (*n + k > 4 * MAX_OUT)
        return CH_ERR_LIMIT;
    ch_status st = ch_tensor_download(t, out + *n, (size_t)k * sizeof(float));
    *n += (int)k;
    return st;
}

/* In place (y is a), and y read (axpy, beta 1): one host copy for y and a,
 * downloaded first. */
static ch_status run_inplace(ch_device *dev, float *out, int *n)
{
    int64_t s[1] = {D};
    ch_tensor *a = filled(dev, 1, s, 0.5f), *b = filled(dev, 1, s, -0.25f);
    ch_status st = a && b ? ch_add(a, a, b) : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_axpy(a, 0.5f, b);
    if (st == CH_OK)
        st = take(a, out, n);
    ch_tensor_free(a);
    ch_tensor_free(b);
    return st;
}

/* Adam's state, read and written twice. */
static ch_status run_adam(ch_device *dev, float *out, int *n)
{
    int64_t s[1] = {D};
    ch_tensor *p = filled(dev, 1, s, 1.0f), *m = filled(dev, 1, s, 0.1f),
              *v = filled(dev, 1, s, 2.0f), *g = filled(dev, 1, s, -0.3f);
    ch_adam_params ap = {0.01f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1};
    ch_status st = p && m && v && g ? ch_adam_step(p, m, v, g, &ap) : CH_ERR_OUT_OF_MEMORY;
    ap.step = 2;
    if (st == CH_OK)
        st = ch_adam_step(p, m, v, g, &ap);
    if (st == CH_OK)
        st = take(p, out, n);
    if (st == CH_OK)
        st = take(m, out, n);
    if (st == CH_OK)
        st = take(v, out, n);
    ch_tensor_free(p);
    ch_tensor_free(m);
    ch_tensor_free(v);
    ch_tensor_free(g);
    return st;
}

/* LayerNorm forward and backward, dgamma and dbeta added to their values;
 * the embedding's gradient added to a filled table. */
static ch_status run_norm_embedding(ch_device *dev, float *out, int *n)
{
    int64_t rd[2] = {R, D}, d1[1] = {D}, r1[1] = {R}, vd[2] = {V, D};
    ch_tensor *x = filled(dev, 2, rd, 0.2f), *dy = filled(dev, 2, rd, -0.4f),
              *gamma = filled(dev, 1, d1, 1.0f), *beta = filled(dev, 1, d1, 0.0f),
              *dgamma = filled(dev, 1, d1, 3.0f), *dbeta = filled(dev, 1, d1, -3.0f),
              *dtable = filled(dev, 2, vd, 0.7f), *y = NULL, *dx = NULL, *mean = NULL, *rstd = NULL,
              *idx = NULL;
    int32_t iv[R] = {3, 0, 3, 1, 2, 3};
    ch_status st =
        x && dy && gamma && beta && dgamma && dbeta && dtable ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_tensor_new(&y, dev, CH_F32, 2, rd);
    if (st == CH_OK)
        st = ch_tensor_new(&dx, dev, CH_F32, 2, rd);
    if (st == CH_OK)
        st = ch_tensor_new(&mean, dev, CH_F32, 1, r1);
    if (st == CH_OK)
        st = ch_tensor_new(&rstd, dev, CH_F32, 1, r1);
    if (st == CH_OK)
        st = ch_tensor_new(&idx, dev, CH_I32, 1, r1);
    if (st == CH_OK)
        st = ch_tensor_upload(idx, iv, sizeof iv);
    if (st == CH_OK)
        st = ch_layernorm(y, mean, rstd, x, gamma, beta, 1e-5f);
    if (st == CH_OK)
        st = ch_layernorm_backward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma);
    if (st == CH_OK)
        st = ch_embedding_backward(dtable, dy, idx);
    ch_tensor *outs[] = {y, dx, dgamma, dbeta, dtable};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0] && st == CH_OK; i++)
        st = take(outs[i], out, n);
    ch_tensor *all[] = {x, dy, gamma, beta, dgamma, dbeta, dtable, y, dx, mean, rstd, idx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ch_tensor_free(all[i]);
    return st;
}

typedef ch_status (*scenario_fn)(ch_device *dev, float *out, int *n);

/* Each scenario gives the host's bits on minimal:0: every op is the
 * host's there (no GEMM in these). */
static void check_scenarios(ch_device *host, ch_device *minimal)
{
    static const struct {
        const char *what;
        scenario_fn fn;
    } cases[] = {
        {"ch_add in place, then ch_axpy (y read)", run_inplace},
        {"two ch_adam_step (p, m, v read and written)", run_adam},
        {"ch_layernorm, its backward adding to dgamma and dbeta, ch_embedding_backward "
         "adding to dtable",
         run_norm_embedding},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float a[4 * MAX_OUT], b[4 * MAX_OUT];
        int na = 0, nb = 0;
        ch_status sa = cases[c].fn(host, a, &na), sb = cases[c].fn(minimal, b, &nb);
        int first = -1;
        for (int i = 0; i < na && i < nb && first < 0; i++)
            if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
                first = i;
        tap_ok(sa == CH_OK && sb == CH_OK && na == nb && na > 0 && first < 0,
               "%s: minimal:0 gives the host's bits (status %d and %d, %d and %d values, "
               "first difference at %d)",
               cases[c].what, sa, sb, na, nb, first);
    }
}

/* The backend list names minimal, loaded from the test's folder. */
static void check_scanned(const char *dir)
{
    ch_backend_info bi;
    int found = 0;
    for (int i = 0; i < ch_backend_count() && !found; i++)
        found = ch_backend_get_info(i, &bi) == CH_OK && strcmp(bi.name, "minimal") == 0;
    tap_ok(found && bi.available && bi.device_count == 1 && strstr(bi.detail, dir),
           "the scan of the backend path loads chorus-minimal.so from %s (found %d, "
           "available %d, devices %d, detail \"%s\")",
           dir, found, found && bi.available, found ? bi.device_count : 0, found ? bi.detail : "");
}

/* stderr's lines "chorus: <device> has no <op>; running it on the host",
 * each once, and the same pairs from ch_fallback_get, in order. */
static void check_notes(const char *text)
{
    int n = ch_fallback_count(), lines = 0, bad = 0, missing = -1, repeated = 0;
    for (const char *p = text; (p = strstr(p, "chorus: ")) != NULL; p++)
        lines++;
    for (int i = 0; i < n; i++) {
        ch_fallback_info f;
        char line[128];
        if (ch_fallback_get(i, &f) != CH_OK) {
            bad++;
            continue;
        }
        snprintf(line, sizeof line, "chorus: %s has no %s; running it on the host\n", f.device,
                 f.op);
        const char *first = strstr(text, line);
        if (!first && missing < 0)
            missing = i;
        else if (first && strstr(first + 1, line))
            repeated++;
        bad += strcmp(f.device, "minimal:0") != 0;
    }
    tap_ok(n > 0 && lines == n && !bad && missing < 0 && !repeated,
           "one stderr line per (device, op), the same %d pairs as ch_fallback_get, all "
           "minimal:0 (%d lines, %d bad, first missing %d, %d repeated)",
           n, lines, bad, missing, repeated);
    static const char *const needed[] = {
        "fill",         "bias_add",  "act_forward",           "softmax_xent",
        "act_backward", "bias_grad", "softmax_xent_backward", "sgd_step"};
    char absent[256] = "";
    for (size_t k = 0; k < sizeof needed / sizeof needed[0]; k++) {
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) {
            ch_fallback_info f;
            seen = ch_fallback_get(i, &f) == CH_OK && strcmp(f.op, needed[k]) == 0;
        }
        if (!seen)
            snprintf(absent + strlen(absent), sizeof absent - strlen(absent), " %s", needed[k]);
    }
    tap_ok(!absent[0], "the ops the mlp trains with are listed (absent:%s)",
           absent[0] ? absent : " none");
    ch_fallback_info none;
    tap_status_is(ch_fallback_get(n, &none), CH_ERR_NOT_FOUND, "out of range",
                  "ch_fallback_get(%d) of %d is refused", n, n);
}

/* The optional event_seconds left NULL: minimal:0's events have no time
 * for a trace, and chi_trace_* say so. */
static void check_untimed(ch_device *minimal)
{
    char path[] = "/tmp/test-fallback-trace.XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        tap_skip("mkstemp failed: no trace for minimal:0's events");
        return;
    }
    close(fd);
    ch_stream *s = NULL;
    ch_event *e = NULL;
    double t, offset, uncertainty;
    ch_device_default_stream(&s, minimal);
    tap_status_ok(ch_trace_start(path, NULL), "start a trace to %s", path);
    ch_event_new(&e, minimal);
    ch_event_record(e, s);
    ch_event_sync(e);
    tap_status_is(chi_trace_event_seconds(e, &t), CH_ERR_UNSUPPORTED, "cannot time events",
                  "minimal:0 (no event_seconds): an event's time is unsupported");
    tap_status_is(chi_trace_clock(minimal, &offset, &uncertainty), CH_ERR_UNSUPPORTED,
                  "minimal backend", "minimal:0 (no event_seconds): its clock is unsupported");
    tap_status_ok(ch_trace_stop(), "stop the trace");
    ch_event_free(e);
    unlink(path);
}

/* Reads the file at `path` (stderr's copy) into a string. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

int main(void)
{
    const char *dir = getenv("CHORUS_TEST_MINIMAL_DIR");
    if (!dir || !*dir)
        tap_skip_all("CHORUS_TEST_MINIMAL_DIR is unset (make check sets it)");
    const char *old = getenv("CHORUS_BACKEND_PATH");
    char path[8192];
    snprintf(path, sizeof path, "%s%s%s", dir, old && *old ? ":" : "", old ? old : "");
    setenv("CHORUS_BACKEND_PATH", path, 1);
    /* minimal:0 and host: whatever the caller's list, both are needed. */
    setenv("CHORUS_DEVICES", "host,minimal:0", 1);
    unsetenv("CHORUS_QUIET_FALLBACK");

    /* stderr into a file while the ops run, to count the notes. */
    char errpath[] = "/tmp/test-fallback.XXXXXX";
    int fd = mkstemp(errpath);
    int saved = dup(2);
    if (fd < 0 || saved < 0)
        tap_skip_all("cannot redirect stderr (mkstemp or dup failed)");
    fflush(stderr);
    dup2(fd, 2);

    ch_status st = ch_init();
    ch_device *host = NULL, *minimal = NULL;
    if (st == CH_OK)
        st = ch_device_by_name(&host, "host");
    if (st == CH_OK)
        st = ch_device_by_name(&minimal, "minimal:0");
    float on_host[STEPS] = {0}, on_minimal[STEPS] = {0};
    int trained = st == CH_OK && train(host, on_host);
    int notes_before = ch_fallback_count();
    trained = trained && train(minimal, on_minimal);
    if (st == CH_OK)
        check_scenarios(host, minimal);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    char *text = slurp(errpath);
    unlink(errpath);
    if (!tap_status_ok(st, "ch_init finds host and minimal:0"))
        return tap_done();
    check_scanned(dir);
    tap_ok(notes_before == 0, "the host ran every op itself (%d notes before minimal:0)",
           notes_before);
    if (trained) {
        /* The same host kernels compute every op but GEMM: the minimal
         * GEMM's plain sums, in another order than the host's, make the
         * only difference. */
        double worst = 0;
        for (int s = 0; s < STEPS; s++)
            worst = fmax(worst, fabs((double)on_minimal[s] - on_host[s]) / fabs(on_host[s]));
        tap_diag("losses on host: %.7f ... %.7f; on minimal:0: %.7f ... %.7f; largest "
                 "relative difference %.3g",
                 on_host[0], on_host[STEPS - 1], on_minimal[0], on_minimal[STEPS - 1], worst);
        tap_ok(on_host[STEPS - 1] < on_host[0], "the loss falls on the host (%.4f -> %.4f)",
               on_host[0], on_host[STEPS - 1]);
        tap_ok(worst <= 1e-4,
               "minimal:0's losses are the host's within 1e-4 relative, step for "
               "step (largest %.3g)",
               worst);
    }
    if (tap_ok(text != NULL, "stderr's copy read back"))
        check_notes(text);
    check_untimed(minimal);

    /* CHORUS_QUIET_FALLBACK=1: no line, the pair still listed; ch_shutdown
     * forgets the pairs. With host left out of the device list, the op
     * runs on a host device opened for this alone. */
    ch_shutdown();
    setenv("CHORUS_QUIET_FALLBACK", "1", 1);
    setenv("CHORUS_DEVICES", "minimal:0", 1);
    strcpy(errpath, "/tmp/test-fallback.XXXXXX");
    fd = mkstemp(errpath);
    saved = dup(2);
    if (fd < 0 || saved < 0)
        tap_skip_all("cannot redirect stderr (mkstemp or dup failed)");
    fflush(stderr);
    dup2(fd, 2);
    st = ch_init();
    int after_init = ch_fallback_count();
    ch_tensor *t = NULL;
    if (st == CH_OK)
        st = ch_device_by_name(&minimal, "minimal:0");
    if (st == CH_OK)
        st = ch_tensor_new(&t, minimal, CH_F32, 1, (int64_t[]){5});
    if (st == CH_OK)
        st = ch_fill(t, 2.5);
    float got[5] = {0};
    if (st == CH_OK)
        st = ch_tensor_download(t, got, sizeof got);
    ch_tensor_free(t);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    text = slurp(errpath);
    unlink(errpath);
    tap_status_ok(st, "ch_fill on minimal:0 again, quiet, host not in the device list");
    tap_ok(ch_device_count() == 1, "CHORUS_DEVICES=minimal:0: one device visible (%d)",
           ch_device_count());
    tap_ok(after_init == 0, "ch_shutdown and ch_init forget the pairs (%d after ch_init)",
           after_init);
    tap_ok(got[0] == 2.5f && got[4] == 2.5f, "the host's fill came back (%g, %g)", got[0], got[4]);
    ch_fallback_info f = {{0}, {0}};
    tap_ok(ch_fallback_count() == 1 && ch_fallback_get(0, &f) == CH_OK &&
               strcmp(f.op, "fill") == 0 && text && !strstr(text, "chorus: "),
           "CHORUS_QUIET_FALLBACK=1: fill on minimal:0 listed (%s), nothing on stderr", f.op);
    ch_shutdown();
    return tap_done();
}
