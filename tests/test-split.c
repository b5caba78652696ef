/* The data-parallel split policy (nn/split.c, built into this program with
 * its allocator replaced by test_calloc): equal shares, weights, rounding
 * that adds up to the batch, more than 64 replicas, replicas with no
 * sample, the automatic split from measured rates, the rule that keeps a
 * split that would move only a few samples, and the errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "split.h"

/* The allocator nn/split.c calls: calloc, or NULL when told to fail. */
static int fail_alloc;
void *test_calloc(size_t n, size_t size);
void *test_calloc(size_t n, size_t size) { return fail_alloc ? NULL : calloc(n, size); }

/* "a,b,c" of up to 10 counts, for messages. */
static const char *list(const int *v, int n)
{
    static char buf[128];
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && i < 10; i++)
        used += (size_t)snprintf(buf + used, sizeof buf - used, "%s%d", i ? "," : "", v[i]);
    if (n > 10)
        snprintf(buf + used, sizeof buf - used, ",... (%d)", n);
    return buf;
}

/* The split holds `want` (n counts) and starts that follow them. */
static void expect(const nn_split *s, const int *want, const char *what)
{
    int bad = -1, start = 0, bad_start = 0;
    for (int i = 0; i < s->n && bad < 0; i++) {
        if (s->count[i] != want[i] || s->start[i] != start) {
            bad = i;
            bad_start = start;
        }
        start += want[i];
    }
    if (bad < 0)
        tap_ok(1, "%s: %s", what, list(want, s->n));
    else
        tap_ok(0, "%s: replica %d has %d samples from %d, want %d from %d (all: %s)", what, bad,
               s->count[bad], s->start[bad], want[bad], bad_start, list(s->count, s->n));
}

static nn_split make(int n, ch_dp_split mode, const float *weights)
{
    nn_split s;
    ch_status st = nn_split_init(&s, n, mode, weights);
    if (st != CH_OK)
        tap_diag("nn_split_init(%d): %s", n, ch_last_error());
    return s;
}

static void test_equal(void)
{
    nn_split s = make(3, CH_DP_SPLIT_EQUAL, NULL);
    nn_split_batch(&s, 24);
    expect(&s, (const int[]){8, 8, 8}, "equal, 24 over 3");
    nn_split_batch(&s, 26);
    expect(&s, (const int[]){9, 9, 8}, "equal, 26 over 3: the remainder to the first");
    nn_split_free(&s);
}

static void test_weights(void)
{
    const float w[3] = {1, 2, 5};
    nn_split s = make(3, CH_DP_SPLIT_WEIGHTS, w);
    nn_split_batch(&s, 24);
    expect(&s, (const int[]){3, 6, 15}, "1:2:5, 24");
    /* 2.125, 4.25, 10.625: the one left over to the largest fraction. */
    nn_split_batch(&s, 17);
    expect(&s, (const int[]){2, 4, 11}, "1:2:5, 17: the remainder to the largest fraction");
    /* 0.375, 0.75, 1.875: floors 0, 0, 1; two left over to .875 and .75;
     * then the first replica takes one from the largest count. */
    nn_split_batch(&s, 3);
    expect(&s, (const int[]){1, 1, 1}, "1:2:5, 3: every replica gets one");
    nn_split_free(&s);
}

/* Random weights and totals: the counts add up to the total, and none is
 * zero when the total is at least the replica count. In the even cases
 * every exact share is at least one sample (weights 1 to 10, at least 10
 * samples per replica), so no replica is raised to one sample and each
 * count must be within one of its exact share. */
static void test_rounding(void)
{
    tap_rng rng = {2024};
    int bad_sum = 0, bad_share = 0, bad_zero = 0, cases = 0;
    char first[256] = "";
    for (int c = 0; c < 400; c++) {
        int n = 1 + (int)(tap_rng_next(&rng) % 200), even = c % 2 == 0;
        int total = (int)(tap_rng_next(&rng) % 3000) + (even ? 10 * n : 0);
        float *w = malloc((size_t)n * sizeof *w);
        double wsum = 0;
        for (int i = 0; i < n; i++) {
            w[i] = tap_rng_uniform(&rng, even ? 1.0f : 0.001f, 10.0f);
            wsum += w[i];
        }
        nn_split s = make(n, CH_DP_SPLIT_WEIGHTS, w);
        if (!s.n) {
            free(w);
            break;
        }
        nn_split_batch(&s, total);
        int64_t sum = 0;
        for (int i = 0; i < n; i++) {
            double exact = total * (double)w[i] / wsum;
            sum += s.count[i];
            if (even && fabs(s.count[i] - exact) >= 1.0 && !bad_share++)
                snprintf(first, sizeof first, "n %d, total %d: replica %d has %d, exact share "
                         "%.4f", n, total, i, s.count[i], exact);
            bad_zero += total >= n && s.count[i] == 0;
        }
        bad_sum += sum != total;
        cases++;
        nn_split_free(&s);
        free(w);
    }
    tap_ok(cases == 400 && bad_sum == 0, "400 random weighted splits of up to 200 replicas add "
           "up to their total (%d of %d do not)", bad_sum, cases);
    tap_ok(bad_share == 0, "... each count within one sample of its exact share where no "
           "replica needs raising (%d off; first: %s)", bad_share, first[0] ? first : "none");
    tap_ok(bad_zero == 0, "... no replica without a sample when the batch has enough (%d)",
           bad_zero);
}

static void test_many(void)
{
    enum { N = 1000 };
    int *want = malloc(N * sizeof *want);
    float *w = malloc(N * sizeof *w);
    for (int i = 0; i < N; i++)
        w[i] = (float)(i % 4 + 1);
    /* 1, 2, 3, 4 repeated: 2500 weight in all; 5000 samples give 2 per unit. */
    nn_split s = make(N, CH_DP_SPLIT_WEIGHTS, w);
    if (s.n) {
        nn_split_batch(&s, 5000);
        for (int i = 0; i < N; i++)
            want[i] = 2 * (i % 4 + 1);
        expect(&s, want, "1000 replicas weighted 1:2:3:4 repeated, 5000 samples");
    } else {
        tap_ok(0, "1000 replicas: nn_split_init failed");
    }
    nn_split_free(&s);
    s = make(100, CH_DP_SPLIT_EQUAL, NULL);
    if (s.n) {
        nn_split_batch(&s, 1030);
        for (int i = 0; i < 100; i++)
            want[i] = i < 30 ? 11 : 10;
        expect(&s, want, "100 equal replicas, 1030 samples: 11 to the first 30");
        /* Replica 70 and beyond: the old code filled shares for 64 only. */
        tap_ok(s.count[99] == 10 && s.start[99] == 1020, "replica 99: %d samples from %d "
               "(want 10 from 1020)", s.count[99], s.start[99]);
    } else {
        tap_ok(0, "100 replicas: nn_split_init failed");
        tap_skip("no split");
    }
    nn_split_free(&s);
    free(want);
    free(w);
}

static void test_zero_shares(void)
{
    nn_split s = make(5, CH_DP_SPLIT_EQUAL, NULL);
    nn_split_batch(&s, 3);
    expect(&s, (const int[]){1, 1, 1, 0, 0}, "3 samples over 5 replicas: the last two get none");
    nn_split_batch(&s, 0);
    expect(&s, (const int[]){0, 0, 0, 0, 0}, "0 samples: none for anyone");
    nn_split_free(&s);

    const float w[3] = {1000, 1000, 1};
    s = make(3, CH_DP_SPLIT_WEIGHTS, w);
    /* 11.99, 11.99, 0.012: 12, 12, 0, then the third takes one from the first. */
    nn_split_batch(&s, 24);
    expect(&s, (const int[]){11, 12, 1}, "1000:1000:1 over 24: the tiny weight still gets one");
    nn_split_batch(&s, 2);
    expect(&s, (const int[]){1, 1, 0}, "1000:1000:1 over 2: the tiny weight gets none");
    nn_split_free(&s);
}

/* Sets each replica's time so that it ran at rates[i] samples/s. */
static void run_at(nn_split *s, const double *rates)
{
    for (int i = 0; i < s->n; i++)
        s->seconds[i] = s->count[i] / rates[i];
    nn_split_measure(s);
}

static void test_auto(void)
{
    nn_split s = make(3, CH_DP_SPLIT_AUTO, NULL);
    nn_split_batch(&s, 24);
    expect(&s, (const int[]){8, 8, 8}, "auto before any measure: equal");
    run_at(&s, (const double[]){100, 200, 500});
    nn_split_batch(&s, 24);
    expect(&s, (const int[]){8, 8, 8}, "auto after its first call: still equal (not a measure)");
    run_at(&s, (const double[]){100, 200, 500});
    nn_split_batch(&s, 80);
    expect(&s, (const int[]){10, 20, 50}, "auto at 100, 200, 500 samples/s: 80 as 10, 20, 50");
    /* Smoothed: 0.7 old + 0.3 new = 130, 200, 410 of 740. */
    run_at(&s, (const double[]){200, 200, 200});
    nn_split_batch(&s, 74);
    expect(&s, (const int[]){13, 20, 41}, "auto: the rates are smoothed (130, 200, 410)");
    nn_split_free(&s);

    /* A replica without samples is not measured: it gets the others' mean. */
    s = make(3, CH_DP_SPLIT_AUTO, NULL);
    nn_split_batch(&s, 2);
    run_at(&s, (const double[]){1, 1, 1});
    run_at(&s, (const double[]){100, 300, 1});
    nn_split_batch(&s, 60);
    expect(&s, (const int[]){10, 30, 20}, "auto: a replica never measured runs at the mean "
           "(100, 300, 200)");
    nn_split_free(&s);

    /* Times that say nothing (zero, negative) leave the rates alone. */
    s = make(2, CH_DP_SPLIT_AUTO, NULL);
    nn_split_batch(&s, 10);
    run_at(&s, (const double[]){1, 1});
    s.seconds[0] = 0.0;
    s.seconds[1] = -1.0;
    nn_split_measure(&s);
    nn_split_batch(&s, 10);
    expect(&s, (const int[]){5, 5}, "auto: zero and negative times are not measures");
    nn_split_free(&s);
}

static void test_keep(void)
{
    nn_split s = make(2, CH_DP_SPLIT_AUTO, NULL);
    nn_split_batch(&s, 100);
    run_at(&s, (const double[]){1, 1});
    run_at(&s, (const double[]){100, 100});
    nn_split_batch(&s, 100);
    expect(&s, (const int[]){50, 50}, "keep rule: rates 100, 100 split 100 as 50, 50");
    /* Replica 1 measured at 132.13/s: smoothed 109.64, a share of 52.3 of
     * 100, so a new split would be 48, 52: 2 samples, within 2% (2). */
    run_at(&s, (const double[]){100, 132.13});
    nn_split_batch(&s, 100);
    expect(&s, (const int[]){50, 50}, "keep rule: a new split moving 2 of 100 samples is not "
           "taken");
    /* Another batch size is always split anew: 90 as 42.9, 47.1 -> 43, 47. */
    nn_split_batch(&s, 90);
    expect(&s, (const int[]){43, 47}, "keep rule: a batch of another size is split anew");
    nn_split_batch(&s, 100);
    expect(&s, (const int[]){48, 52}, "... and the next batch of 100 follows the rates");
    /* Smoothed again: 116.39, a share of 53.8: 46, 54 moves 2 from 48, 52;
     * once more 121.12, 54.8: 45, 55 from 48, 52 would be 3. */
    run_at(&s, (const double[]){100, 132.13});
    nn_split_batch(&s, 100);
    expect(&s, (const int[]){48, 52}, "keep rule: 46, 54 moves 2 samples: kept");
    run_at(&s, (const double[]){100, 132.13});
    nn_split_batch(&s, 100);
    expect(&s, (const int[]){45, 55}, "keep rule: 45, 55 moves 3 samples: taken");
    nn_split_free(&s);
}

static void test_errors(void)
{
    nn_split s;
    tap_status_is(nn_split_init(&s, 0, CH_DP_SPLIT_EQUAL, NULL), CH_ERR_INVALID_ARGUMENT,
                  "0 replicas", "a split of 0 replicas is refused");
    tap_status_is(nn_split_init(&s, 2, (ch_dp_split)7, NULL), CH_ERR_INVALID_ARGUMENT,
                  "mode 7", "an unknown mode is refused");
    tap_status_is(nn_split_init(&s, 2, CH_DP_SPLIT_WEIGHTS, NULL), CH_ERR_INVALID_ARGUMENT,
                  "weights is NULL", "a weighted split without weights is refused");
    fail_alloc = 1;
    ch_status st = nn_split_init(&s, 3, CH_DP_SPLIT_EQUAL, NULL);
    fail_alloc = 0;
    tap_status_is(st, CH_ERR_OUT_OF_MEMORY, "out of memory for 3 replicas",
                  "a split whose allocation fails says so");
    tap_ok(s.n == 0 && s.count == NULL && s.mem == NULL,
           "... and leaves the split empty (n %d)", s.n);
    nn_split_free(&s);
    nn_split_free(NULL);
}

int main(void)
{
    test_equal();
    test_weights();
    test_rounding();
    test_many();
    test_zero_shares();
    test_auto();
    test_keep();
    test_errors();
    return tap_done();
}
