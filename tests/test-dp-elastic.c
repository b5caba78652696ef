/* Elastic data parallelism inside a process (ch_dp_options.elastic): a
 * 20-step run over host, opencl:0 and opencl:1 in which one device is
 * lost at step 7 (in forward, backward, the reduction or the update; each
 * of the three devices in turn) ends with the parameters of a run that had
 * the other two from step 7 on (from step 8 for a loss inside the update,
 * which the replicas left had completed): bit for bit, with host reduction
 * and equal shares. A device that stops answering is dropped after the
 * timeout; a device that answers again rejoins and trains on with
 * identical replicas; the calls' errors. The failures are the test hook
 * chi_dp_lose (nn/nn.h); tests/test-flaky.c loses a device of a backend
 * module of its own. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../nn/nn.h" /* chi_dp_lose */
#include "tap.h"

enum {
    STEPS = 20,
    LOST_AT = 7,
    BATCH = 12
};

static const char *const point[4] = {"forward", "backward", "the reduction", "the update"};

static ch_dp_options options(void)
{
    ch_dp_options o = tap_mnist_dp_options(5);
    o.split = CH_DP_SPLIT_EQUAL;
    o.elastic = 1;
    o.elastic_timeout = 1.0;
    return o;
}

static ch_module *model(void)
{
    ch_module *m = tap_smooth_cnn(0);
    ch_module_init(m, 17);
    return m;
}

/* Steps [from, to) of a dp over devs, starting from `start`'s parameters
 * and `opt`'s state (NULL: fresh); the parameters into `start` and the
 * state into `opt` after. */
static ch_status run(ch_module *start, ch_optimizer *opt, ch_device **devs, int n, int from, int to,
                     const tap_mnist_batches *bs)
{
    ch_dp_options o = options();
    o.elastic = 0;
    ch_dp *dp = NULL;
    float loss;
    ch_status st = ch_dp_new(&dp, start, devs, n, &o);
    if (st == CH_OK && opt && ch_optimizer_steps(opt) > 0)
        st = ch_dp_optimizer_set(dp, opt);
    for (int s = from; st == CH_OK && s < to; s++)
        st = ch_dp_step(dp, &loss, &bs->b[s], 0.05f);
    if (st == CH_OK)
        st = ch_dp_sync_to(dp, start);
    if (st == CH_OK && opt)
        st = ch_dp_optimizer_get(dp, opt);
    ch_dp_free(dp);
    return st;
}

/* The reference: three devices for steps 1 to `switch_at` - 1, the two
 * left from then on. */
static ch_status reference(ch_module *out, ch_device **three, ch_device **two, int switch_at,
                           const tap_mnist_batches *bs)
{
    ch_optimizer *opt = NULL;
    ch_optimizer_options oo = options().optimizer;
    ch_status st = ch_optimizer_new(&opt, out, &oo);
    if (st == CH_OK)
        st = run(out, opt, three, 3, 0, switch_at - 1, bs);
    if (st == CH_OK)
        st = run(out, opt, two, 2, switch_at - 1, STEPS, bs);
    ch_optimizer_free(opt);
    return st;
}

/* Largest difference in bits between a's and b's parameters: 0 when
 * equal, else max |a - b|. */
static double params_diff(ch_module *a, ch_module *b, int *equal)
{
    *equal = 1;
    double worst = 0.0;
    int np = ch_module_param_count(a);
    for (int i = 0; i < np; i++) {
        ch_tensor *pa, *pb;
        if (ch_module_param(a, i, NULL, &pa, NULL) != CH_OK ||
            ch_module_param(b, i, NULL, &pb, NULL) != CH_OK) {
            *equal = 0;
            return INFINITY;
        }
        int64_t n = ch_tensor_numel(pa);
        float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
        if (x && y && ch_tensor_download(pa, x, sizeof(float) * (size_t)n) == CH_OK &&
            ch_tensor_download(pb, y, sizeof(float) * (size_t)n) == CH_OK) {
            for (int64_t k = 0; k < n; k++) {
                if (memcmp(&x[k], &y[k], sizeof(float)) != 0)
                    *equal = 0;
                double d = fabs((double)x[k] - (double)y[k]);
                if (d > worst)
                    worst = d;
            }
        } else {
            *equal = 0;
            worst = INFINITY;
        }
        free(x);
        free(y);
    }
    return worst;
}

/* One cell of the matrix: devs[lose] lost at `at` of step LOST_AT. */
static void test_loss(ch_device **devs, int lose, int at, const tap_mnist_batches *bs,
                      ch_module *want)
{
    const char *name = ch_device_id(devs[lose]);
    ch_module *m = model();
    ch_dp_options o = options();
    ch_dp *dp = NULL;
    float loss = 0.0f;
    ch_status st = ch_dp_new(&dp, m, devs, 3, &o);
    int s = 0, bad = -1;
    chi_dp_lose(devs[lose], at, LOST_AT, 0);
    for (; st == CH_OK && s < STEPS; s++) {
        st = ch_dp_step(dp, &loss, &bs->b[s], 0.05f);
        if (st == CH_OK && !(loss > 0.0f && loss < 10.0f) && bad < 0)
            bad = s;
    }
    chi_dp_found(devs[lose]);
    if (!tap_status_ok(st, "%s lost in %s of step %d: all %d steps succeed", name, point[at],
                       LOST_AT, STEPS)) {
        ch_dp_free(dp);
        ch_module_free(m);
        return;
    }
    tap_ok(bad < 0, "... every step's loss finite and positive");
    ch_dp_change ch[4];
    int nch = ch_dp_changes(dp, ch, 4);
    tap_ok(nch == 1 && ch[0].step == LOST_AT && !ch[0].rejoined && ch[0].replicas == 2 &&
               strcmp(ch[0].device, name) == 0 && strstr(ch[0].cause, "was lost") &&
               ch[0].seconds > 0.0,
           "... one change: %s lost in step %lld, 2 replicas left (%d changes; \"%s\", "
           "%.3f s)",
           nch > 0 ? ch[0].device : "-", nch > 0 ? (long long)ch[0].step : -1LL, nch,
           nch > 0 ? ch[0].cause : "", nch > 0 ? ch[0].seconds : 0.0);
    int left_ok = ch_dp_replica_count(dp) == 2;
    for (int i = 0; i < 2; i++)
        left_ok = left_ok && ch_dp_device(dp, i) != devs[lose];
    tap_ok(left_ok && strstr(ch_dp_note(dp), name),
           "... the replicas are the two others, and the note says so (\"%s\")", ch_dp_note(dp));
    ch_module *got = model();
    int equal = 0;
    double d = ch_dp_sync_to(dp, got) == CH_OK ? params_diff(got, want, &equal) : INFINITY;
    tap_ok(equal,
           "... the parameters are those of a run over the two others from step %d on, "
           "bit for bit (max |diff| %.3g)",
           at == 3 ? LOST_AT + 1 : LOST_AT, d);
    ch_module_free(got);
    ch_dp_free(dp);
    ch_module_free(m);
}

/* A device that stops answering (in backward of step 3) is dropped after
 * the timeout, and the step is made again over the two others. */
static void test_hang(ch_device **devs, const tap_mnist_batches *bs)
{
    ch_module *m = model();
    ch_dp_options o = options();
    o.elastic_timeout = 0.5;
    ch_dp *dp = NULL;
    float loss;
    ch_status st = ch_dp_new(&dp, m, devs, 3, &o);
    chi_dp_lose(devs[2], 1, 3, 1);
    double t0 = ch_clock_seconds(), step3 = 0.0;
    for (int s = 0; st == CH_OK && s < 5; s++) {
        double s0 = ch_clock_seconds();
        st = ch_dp_step(dp, &loss, &bs->b[s], 0.05f);
        if (s == 2)
            step3 = ch_clock_seconds() - s0;
    }
    double secs = ch_clock_seconds() - t0;
    ch_dp_change ch[2];
    int nch = dp ? ch_dp_changes(dp, ch, 2) : 0;
    tap_status_ok(st, "%s stops answering in backward of step 3: 5 steps succeed (%.2f s)",
                  ch_device_id(devs[2]), secs);
    tap_ok(nch == 1 && ch[0].step == 3 && strstr(ch[0].cause, "no answer within 0.5 s") &&
               ch_dp_replica_count(dp) == 2,
           "... dropped after its 0.5 s timeout in step 3, which took %.2f s (\"%s\")", step3,
           nch ? ch[0].cause : "");
    tap_ok(step3 >= 0.5 && step3 < 10.0, "... the step cost the timeout and little more (%.2f s)",
           step3);
    tap_ok(chi_dp_abandoned() == 1, "... its replica's object is left to its silent thread (%d)",
           chi_dp_abandoned());
    ch_dp_free(dp);
    /* The device answers again: the thread returns and frees what was left. */
    chi_dp_found(devs[2]);
    for (int i = 0; i < 500 && chi_dp_abandoned() > 0; i++) {
        struct timespec ms = {0, 10000000};
        nanosleep(&ms, NULL);
    }
    tap_ok(chi_dp_abandoned() == 0, "... and once the device answers, its thread returns and "
                                    "frees it");
    ch_module_free(m);
}

/* Lost, then found again: ch_dp_rejoin takes it back, and every replica
 * trains on with the same parameters (checked by the dp each step). */
static void test_rejoin(ch_device **devs, const tap_mnist_batches *bs)
{
    ch_module *m = model();
    ch_dp_options o = options();
    o.check_every = 1;
    ch_dp *dp = NULL;
    float loss;
    int rejoined = -1;
    ch_status st = ch_dp_new(&dp, m, devs, 3, &o);
    chi_dp_lose(devs[1], 0, 2, 0);
    for (int s = 0; st == CH_OK && s < 4; s++)
        st = ch_dp_step(dp, &loss, &bs->b[s], 0.05f);
    tap_status_ok(st, "%s lost in step 2: 4 steps succeed", ch_device_id(devs[1]));
    st = ch_dp_rejoin(dp, &rejoined);
    tap_ok(st == CH_OK && rejoined == 0 && ch_dp_replica_count(dp) == 2,
           "... ch_dp_rejoin while it does not answer: none rejoins (%d)", rejoined);
    chi_dp_found(devs[1]);
    st = ch_dp_rejoin(dp, &rejoined);
    tap_ok(st == CH_OK && rejoined == 1 && ch_dp_replica_count(dp) == 3 &&
               ch_dp_device(dp, 1) == devs[1],
           "... answering again, it rejoins in its place: %d replicas (%s)",
           ch_dp_replica_count(dp), st == CH_OK ? "ok" : ch_last_error());
    ch_dp_change ch[3];
    int nch = ch_dp_changes(dp, ch, 3);
    tap_ok(nch == 2 && ch[1].rejoined && ch[1].step == 5 && ch[1].replicas == 3,
           "... the second change is its rejoining before step 5 (%d changes)", nch);
    for (int s = 4; st == CH_OK && s < 10; s++)
        st = ch_dp_step(dp, &loss, &bs->b[s], 0.05f);
    tap_status_ok(st, "... 6 more steps over the three, every replica checked to hold the same "
                      "parameters after each");
    int same = ch_dp_replica_count(dp) == 3, equal = 1;
    for (int i = 1; same && i < 3; i++) {
        ch_module *a = model();
        same = ch_dp_sync_to(dp, a) == CH_OK;
        /* The replica itself on its device, against replica 0's copy. */
        ch_module *r = ch_dp_replica(dp, i);
        double d = r ? params_diff(r, a, &equal) : INFINITY;
        same = same && equal && d == 0.0;
        ch_module_free(a);
    }
    tap_ok(same, "... and the rejoined replica's parameters equal replica 0's bit for bit");
    ch_dp_free(dp);
    ch_module_free(m);
}

static void test_errors(ch_device **devs, int n, const tap_mnist_batches *bs)
{
    ch_module *m = model();
    ch_dp *dp = NULL;
    ch_dp_options o = options();
    o.shard_optimizer = 1;
    tap_status_is(ch_dp_new(&dp, m, devs, n, &o), CH_ERR_UNSUPPORTED, "shard_optimizer",
                  "elastic with the sharded optimizer is refused");
    o = options();
    o.accumulate = 2;
    tap_status_is(ch_dp_new(&dp, m, devs, n, &o), CH_ERR_UNSUPPORTED, "accumulate",
                  "elastic with accumulation is refused");
    o = options();
    o.elastic_timeout = -1.0;
    tap_status_is(ch_dp_new(&dp, m, devs, n, &o), CH_ERR_INVALID_ARGUMENT, "elastic_timeout",
                  "a negative timeout is refused");
    o.elastic_timeout = NAN;
    tap_status_is(ch_dp_new(&dp, m, devs, n, &o), CH_ERR_INVALID_ARGUMENT, "elastic_timeout",
                  "a NaN timeout is refused");
    tap_status_is(ch_dp_rejoin(NULL, NULL), CH_ERR_INVALID_ARGUMENT, "NULL", "ch_dp_rejoin(NULL)");
    o = options();
    o.elastic = 0;
    int k = -1;
    if (tap_status_ok(ch_dp_new(&dp, m, devs, n, &o), "a dp that is not elastic")) {
        tap_status_is(ch_dp_rejoin(dp, &k), CH_ERR_STATE, "not elastic",
                      "... ch_dp_rejoin on it is refused");
        tap_ok(k == 0 && ch_dp_changes(dp, NULL, 0) == 0 && ch_dp_replica_count(dp) == n &&
                   ch_dp_device(dp, 0) == devs[0] && ch_dp_device(dp, n) == NULL,
               "... no changes, its %d replicas in ch_dp_new's order", n);
        /* Without the option a lost device fails the step, as before. */
        float loss;
        chi_dp_lose(devs[n - 1], 0, 1, 0);
        tap_status_is(ch_dp_step(dp, &loss, &bs->b[0], 0.05f), CH_ERR_DRIVER, "was lost",
                      "... a lost device fails its step, naming it");
        chi_dp_found(devs[n - 1]);
        ch_dp_free(dp);
    }
    tap_ok(ch_dp_replica_count(NULL) == 0 && ch_dp_device(NULL, 0) == NULL &&
               ch_dp_changes(NULL, NULL, 0) == 0,
           "the queries answer a NULL dp");
    /* Every device lost: the step fails, and says so. */
    o = options();
    if (tap_status_ok(ch_dp_new(&dp, m, devs, n, &o), "an elastic dp over %d devices", n)) {
        float loss;
        for (int i = 0; i < n; i++)
            chi_dp_lose(devs[i], 0, 1, 0);
        tap_status_is(ch_dp_step(dp, &loss, &bs->b[0], 0.05f), CH_ERR_DRIVER,
                      "every device of the dp is lost", "... every device lost: the step fails");
        for (int i = 0; i < n; i++)
            chi_dp_found(devs[i]);
        tap_status_ok(ch_dp_step(dp, &loss, &bs->b[1], 0.05f),
                      "... and once they answer, the next step runs on all of them");
        tap_ok(ch_dp_replica_count(dp) == n, "... still %d replicas", ch_dp_replica_count(dp));
        ch_dp_free(dp);
    }
    ch_module_free(m);
}

int main(void)
{
    if (!tap_status_ok(ch_init(), "ch_init"))
        return tap_done();
    ch_device *host = NULL, *ocl0 = NULL, *ocl1 = NULL;
    ch_device_by_name(&host, "host");
    ch_device_by_name(&ocl0, "opencl:0");
    ch_device_by_name(&ocl1, "opencl:1");
    ch_clear_error();
    if (!host || !ocl0 || !ocl1) {
        tap_skip("the failure matrix needs host, opencl:0 and opencl:1 (PoCL with "
                 "POCL_DEVICES=\"pthread pthread\" gives the two)");
        ch_shutdown();
        return tap_done();
    }
    ch_device *devs[3] = {host, ocl0, ocl1};
    tap_mnist_batches bs;
    tap_mnist_batches_make(&bs, host, 23, STEPS, BATCH);
    test_errors(devs, 3, &bs);
    for (int lose = 0; lose < 3; lose++) {
        ch_device *two[2];
        for (int i = 0, k = 0; i < 3; i++)
            if (i != lose)
                two[k++] = devs[i];
        ch_module *want = model(), *want_update = model();
        ch_status st = reference(want, devs, two, LOST_AT, &bs);
        if (st == CH_OK)
            st = reference(want_update, devs, two, LOST_AT + 1, &bs);
        if (!tap_status_ok(st, "the references without %s", ch_device_id(devs[lose]))) {
            ch_module_free(want);
            ch_module_free(want_update);
            continue;
        }
        for (int at = 0; at < 4; at++)
            test_loss(devs, lose, at, &bs, at == 3 ? want_update : want);
        ch_module_free(want);
        ch_module_free(want_update);
    }
    test_hang(devs, &bs);
    test_rejoin(devs, &bs);
    tap_mnist_batches_free(&bs);
    ch_shutdown();
    return tap_done();
}
