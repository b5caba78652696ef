/* The data loader: every sample exactly once per epoch whatever the batch
 * size, drop_last, workers and prefetch; the order depends on (seed, epoch)
 * only; distributed shares are disjoint and cover the epoch; resuming from a
 * batch gives the tail of the full epoch; batch contents are the data set's
 * samples; bad options are errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idxgen.h"
#include "tap.h"

#define N 1000
#define ROWS 4
#define COLS 5
#define NUMEL (ROWS * COLS)
#define CLASSES 10

static const ch_dataset *ds;

/* What one epoch handed out. */
typedef struct run {
    int64_t idx[N];     /* data set indices in the order received */
    int64_t n;          /* samples */
    int sizes[N + 1];   /* count of each batch */
    int64_t batches;
    int meta_ok;        /* numbers consecutive from first_batch, epoch right */
    int content_ok;     /* images and labels equal ch_dataset_get */
    char why[256];      /* the first problem */
    ch_status st;       /* of start/next */
} run;

static void problem(run *r, int *flag, const char *fmt, long long a, long long b)
{
    if (*flag)
        snprintf(r->why, sizeof r->why, fmt, a, b);
    *flag = 0;
}

static void check_batch(run *r, const ch_batch *b, int64_t epoch, int64_t first)
{
    if (b->number != first + r->batches)
        problem(r, &r->meta_ok, "batch number %lld, want %lld", (long long)b->number,
                (long long)(first + r->batches));
    if (b->epoch != epoch)
        problem(r, &r->meta_ok, "batch epoch %lld, want %lld", (long long)b->epoch,
                (long long)epoch);
    const float *images = ch_host_buffer_data(b->images);
    const int32_t *labels = ch_host_buffer_data(b->labels);
    for (int k = 0; k < b->count && r->n < N; k++) {
        float want[NUMEL];
        int32_t label;
        int64_t index = b->indices[k];
        if (ch_dataset_get(ds, index, want, &label) != CH_OK) {
            problem(r, &r->content_ok, "index %lld (sample %lld) is not in the data set",
                    (long long)index, (long long)r->n);
        } else if (memcmp(want, images + (size_t)k * NUMEL, sizeof want) != 0 ||
                   label != labels[k]) {
            problem(r, &r->content_ok, "sample %lld of batch %lld differs from ch_dataset_get",
                    (long long)k, (long long)b->number);
        }
        r->idx[r->n++] = index;
    }
    r->sizes[r->batches++] = b->count;
}

static ch_status run_epoch(ch_loader *l, int64_t epoch, int64_t first, run *r)
{
    memset(r, 0, sizeof *r);
    r->meta_ok = r->content_ok = 1;
    r->st = ch_loader_start(l, epoch, first);
    while (r->st == CH_OK && r->batches <= N) {
        ch_batch *b = NULL;
        r->st = ch_loader_next(l, &b);
        if (r->st != CH_OK || !b)
            break;
        check_batch(r, b, epoch, first);
        ch_loader_release(l, b);
    }
    if (r->st != CH_OK)
        snprintf(r->why, sizeof r->why, "%s: %s", ch_status_str(r->st), ch_last_error());
    return r->st;
}

/* Every index at most once; returns how many distinct ones, or -1 on a repeat. */
static int64_t distinct(const int64_t *idx, int64_t n, char *seen)
{
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= N || seen[idx[i]])
            return -1;
        seen[idx[i]] = 1;
        count++;
    }
    return count;
}

static ch_loader_options options(int bs, int shuffle, int drop_last, int workers, int prefetch)
{
    ch_loader_options o = {.batch_size = bs, .shuffle = shuffle, .seed = 1234,
                           .drop_last = drop_last, .workers = workers, .prefetch = prefetch,
                           .rank = 0, .world = 1, .pin_for = NULL};
    return o;
}

/* Batch sizes: all batch_size, but the last may be short without drop_last. */
static int sizes_ok(const run *r, int bs, int drop_last)
{
    for (int64_t b = 0; b < r->batches; b++) {
        int last = b == r->batches - 1;
        if (r->sizes[b] != bs && (drop_last || !last || r->sizes[b] > bs || r->sizes[b] < 1))
            return 0;
    }
    return 1;
}

static void test_coverage_one(int bs, int shuffle, int drop_last, int workers, int prefetch,
                              run *r)
{
    char what[128];
    snprintf(what, sizeof what, "bs %d shuffle %d drop_last %d workers %d prefetch %d", bs,
             shuffle, drop_last, workers, prefetch);
    ch_loader_options o = options(bs, shuffle, drop_last, workers, prefetch);
    ch_loader *l = NULL;
    if (!tap_status_ok(ch_loader_new(&l, ds, &o), "%s: new", what))
        return;
    int64_t want_n = drop_last ? (int64_t)(N / bs) * bs : N;
    int64_t want_b = drop_last ? N / bs : (N + bs - 1) / bs;
    static char seen[N];
    memset(seen, 0, sizeof seen);
    if (run_epoch(l, 3, 0, r) == CH_OK) {
        int64_t got = distinct(r->idx, r->n, seen);
        tap_ok(got == want_n, "%s: every sample once: %lld distinct of %lld received, want %lld",
               what, (long long)got, (long long)r->n, (long long)want_n);
        tap_ok(r->batches == want_b && ch_loader_batches(l) == want_b && sizes_ok(r, bs, drop_last)
                   && r->meta_ok && r->content_ok,
               "%s: %lld batches (loader says %lld), want %lld, sizes %s, %s", what,
               (long long)r->batches, (long long)ch_loader_batches(l), (long long)want_b,
               sizes_ok(r, bs, drop_last) ? "ok" : "wrong", r->why[0] ? r->why : "contents ok");
    } else {
        tap_ok(0, "%s: epoch failed: %s", what, r->why);
    }
    ch_loader_free(l);
}

static void test_coverage(run *r)
{
    static const int sizes[] = {1, 7, 64, 1500};
    for (int s = 0; s < 4; s++)
        for (int shuffle = 0; shuffle < 2; shuffle++)
            for (int drop = 0; drop < 2; drop++)
                for (int w = 1; w <= 3; w += 2)
                    for (int p = 1; p <= 4; p += 3)
                        test_coverage_one(sizes[s], shuffle, drop, w, p, r);
}

/* The order of one epoch of a loader with these options. */
static ch_status order_of(ch_loader_options o, int64_t epoch, run *r)
{
    ch_loader *l = NULL;
    ch_status st = ch_loader_new(&l, ds, &o);
    if (st == CH_OK)
        st = run_epoch(l, epoch, 0, r);
    ch_loader_free(l);
    return st;
}

static int64_t first_difference(const run *a, const run *b)
{
    for (int64_t i = 0; i < a->n && i < b->n; i++)
        if (a->idx[i] != b->idx[i])
            return i;
    return a->n == b->n ? -1 : (a->n < b->n ? a->n : b->n);
}

static void test_order(run *a, run *b)
{
    ch_loader_options o = options(10, 0, 0, 3, 4);
    if (tap_status_ok(order_of(o, 5, a), "unshuffled epoch")) {
        int64_t i = 0;
        while (i < a->n && a->idx[i] == i)
            i++;
        tap_ok(i == N, "without shuffle the order is 0..%d (first difference at %lld)", N - 1,
               (long long)i);
    }
    o = options(10, 1, 0, 1, 1);
    ch_loader_options o2 = options(13, 1, 0, 3, 4);
    if (!tap_status_ok(order_of(o, 2, a), "shuffled epoch 2, 1 worker") ||
        !tap_status_ok(order_of(o2, 2, b), "shuffled epoch 2, 3 workers, other batch size"))
        return;
    tap_ok(first_difference(a, b) == -1,
           "same seed and epoch: the same order whatever the workers, prefetch and batch size "
           "(first difference at %lld)", (long long)first_difference(a, b));
    int64_t fixed = 0;
    for (int64_t i = 0; i < a->n; i++)
        fixed += a->idx[i] == i;
    tap_ok(fixed < N / 10, "the shuffle moves samples: %lld of %d in place", (long long)fixed, N);
    if (tap_status_ok(order_of(o, 3, b), "shuffled epoch 3"))
        tap_ok(first_difference(a, b) >= 0 && first_difference(a, b) < 10,
               "another epoch, another order (first difference at %lld)",
               (long long)first_difference(a, b));
    o.seed = 99;
    if (tap_status_ok(order_of(o, 2, b), "shuffled epoch 2, seed 99"))
        tap_ok(first_difference(a, b) >= 0 && first_difference(a, b) < 10,
               "another seed, another order (first difference at %lld)",
               (long long)first_difference(a, b));
}

static void test_distributed_one(int drop_last, run *whole, run *r)
{
    const int world = 3, bs = 10;
    static char seen[N];
    memset(seen, 0, sizeof seen);
    ch_loader_options o = options(bs, 1, drop_last, 2, 3);
    if (!tap_status_ok(order_of(o, 4, whole), "world 1 order for drop_last %d", drop_last))
        return;
    int64_t total = 0;
    int disjoint = 1, follows = 1;
    for (int rank = 0; rank < world; rank++) {
        o.rank = rank;
        o.world = world;
        if (!tap_status_ok(order_of(o, 4, r), "rank %d of %d, drop_last %d", rank, world,
                           drop_last))
            return;
        int64_t share = (N - rank + world - 1) / world;
        int64_t want = drop_last ? share / bs * bs : share;
        int64_t got = distinct(r->idx, r->n, seen);
        disjoint &= got >= 0;
        total += got > 0 ? got : 0;
        for (int64_t i = 0; i < r->n; i++)
            follows &= r->idx[i] == whole->idx[rank + i * world];
        tap_ok(r->n == want, "rank %d of %d, drop_last %d: %lld samples, want %lld", rank, world,
               drop_last, (long long)r->n, (long long)want);
    }
    int64_t want_total = drop_last ? 3 * 330 : N;
    tap_ok(disjoint && total == want_total,
           "drop_last %d: the %d shares are %sdisjoint and hold %lld samples, want %lld",
           drop_last, world, disjoint ? "" : "NOT ", (long long)total, (long long)want_total);
    tap_ok(follows, "drop_last %d: rank r takes positions r, r + %d, ... of the shuffled order",
           drop_last, world);
}

static void test_distributed(run *whole, run *r)
{
    test_distributed_one(0, whole, r);
    test_distributed_one(1, whole, r);
}

static void test_resume(run *full, run *tail)
{
    ch_loader_options o = options(7, 1, 0, 3, 2);
    ch_loader *l = NULL;
    if (!tap_status_ok(ch_loader_new(&l, ds, &o), "resume: new"))
        return;
    const int64_t k = 50;
    if (tap_status_ok(run_epoch(l, 6, 0, full), "resume: full epoch 6") &&
        tap_status_ok(run_epoch(l, 6, k, tail), "resume: epoch 6 from batch %lld", (long long)k)) {
        int64_t skip = k * 7, diff = -1;
        for (int64_t i = 0; i < tail->n && diff < 0; i++)
            if (tail->idx[i] != full->idx[skip + i])
                diff = i;
        tap_ok(tail->n == full->n - skip && diff < 0 && tail->meta_ok && tail->content_ok,
               "resume from batch %lld: %lld samples (want %lld), first difference %lld, %s",
               (long long)k, (long long)tail->n, (long long)(full->n - skip), (long long)diff,
               tail->why[0] ? tail->why : "numbers and contents ok");
    }
    if (tap_status_ok(run_epoch(l, 6, ch_loader_batches(l), tail), "resume: at the epoch's end"))
        tap_ok(tail->batches == 0, "starting at the last batch + 1 gives no batch (got %lld)",
               (long long)tail->batches);
    /* Leave epoch 7 half read (batches held and ready in the ring), then start epoch 6 afresh. */
    ch_batch *b = NULL, *held = NULL;
    ch_loader_start(l, 7, 0);
    ch_loader_next(l, &held);
    for (int i = 0; i < 3; i++) {
        ch_loader_next(l, &b);
        ch_loader_release(l, b);
    }
    ch_loader_start(l, 6, 0);
    ch_loader_release(l, held);
    if (tap_status_ok(run_epoch(l, 6, 0, tail), "restart epoch 6 after half of epoch 7"))
        tap_ok(first_difference(full, tail) == -1 && tail->content_ok,
               "an epoch abandoned half way does not leak into the next (first difference %lld)",
               (long long)first_difference(full, tail));
    ch_loader_free(l);
}

static void test_slots(void)
{
    ch_loader_options o = options(10, 1, 0, 2, 4);
    ch_loader *l = NULL;
    if (!tap_status_ok(ch_loader_new(&l, ds, &o), "slots: new"))
        return;
    ch_batch *b[5] = {0};
    tap_status_is(ch_loader_next(l, &b[0]), CH_ERR_STATE, "ch_loader_start first",
                  "next before any start");
    ch_loader_start(l, 0, 0);
    int held = 0;
    for (int i = 0; i < 4; i++)
        held += ch_loader_next(l, &b[i]) == CH_OK && b[i] && b[i]->number == i;
    tap_ok(held == 4, "4 batches held at once with prefetch 4 (got %d)", held);
    tap_status_is(ch_loader_next(l, &b[4]), CH_ERR_STATE, "hold at most prefetch (4)",
                  "a fifth batch while 4 are held");
    ch_loader_release(l, b[1]);
    tap_status_is(ch_loader_next(l, &b[4]), CH_ERR_STATE, "batch 4",
                  "batch 4 needs batch 0's slot, even with another slot free");
    ch_loader_release(l, b[0]);
    ch_status st = ch_loader_next(l, &b[4]);
    tap_ok(st == CH_OK && b[4] && b[4]->number == 4, "batch 4 once batch 0 is released (got %s, %lld)",
           ch_status_str(st), b[4] ? (long long)b[4]->number : -1LL);
    ch_loader_free(l);
    tap_ok(1, "ch_loader_free with batches still held");
}

static void test_bad_options(void)
{
    ch_loader *l = (ch_loader *)&l;
    ch_loader_options o = options(0, 1, 0, 1, 1);
    tap_status_is(ch_loader_new(&l, ds, &o), CH_ERR_INVALID_ARGUMENT,
                  "ch_loader_new: options->batch_size is 0, expected >= 1", "batch_size 0");
    tap_ok(l == NULL, "*out is NULL after a failed ch_loader_new");
    o = options(8, 1, 0, 0, 1);
    tap_status_is(ch_loader_new(&l, ds, &o), CH_ERR_INVALID_ARGUMENT,
                  "options->workers is 0, expected >= 1", "workers 0");
    o = options(8, 1, 0, 1, -2);
    tap_status_is(ch_loader_new(&l, ds, &o), CH_ERR_INVALID_ARGUMENT,
                  "options->prefetch is -2, expected >= 1", "prefetch -2");
    o = options(8, 1, 0, 1, 1);
    o.world = 0;
    tap_status_is(ch_loader_new(&l, ds, &o), CH_ERR_INVALID_ARGUMENT,
                  "options->world is 0, expected >= 1", "world 0");
    o.world = 3;
    o.rank = 3;
    tap_status_is(ch_loader_new(&l, ds, &o), CH_ERR_INVALID_ARGUMENT,
                  "options->rank is 3, expected 0 <= rank < world (3)", "rank 3 of 3");
    o.rank = -1;
    tap_status_is(ch_loader_new(&l, ds, &o), CH_ERR_INVALID_ARGUMENT, "options->rank is -1",
                  "rank -1");
    o.rank = 0;
    tap_status_is(ch_loader_new(NULL, ds, &o), CH_ERR_INVALID_ARGUMENT, "out is NULL",
                  "out NULL");
    tap_status_is(ch_loader_new(&l, NULL, &o), CH_ERR_INVALID_ARGUMENT, "ds is NULL", "ds NULL");
    tap_status_is(ch_loader_new(&l, ds, NULL), CH_ERR_INVALID_ARGUMENT, "options is NULL",
                  "options NULL");
    ch_batch *b = NULL;
    tap_status_is(ch_loader_next(NULL, &b), CH_ERR_INVALID_ARGUMENT, "loader is NULL",
                  "next: loader NULL");
    tap_status_is(ch_loader_start(NULL, 0, 0), CH_ERR_INVALID_ARGUMENT, "loader is NULL",
                  "start: loader NULL");
    if (tap_status_ok(ch_loader_new(&l, ds, &o), "rank 0 of 3")) {
        tap_status_is(ch_loader_next(l, NULL), CH_ERR_INVALID_ARGUMENT, "batch is NULL",
                      "next: batch NULL");
        tap_status_is(ch_loader_start(l, 0, 43), CH_ERR_INVALID_ARGUMENT,
                      "first_batch is 43, expected 0 to 42", "start: first_batch past the end");
        tap_status_is(ch_loader_start(l, -1, 0), CH_ERR_INVALID_ARGUMENT, "epoch is -1",
                      "start: negative epoch");
        ch_loader_free(l);
    }
    ch_loader_free(NULL);
    ch_loader_release(NULL, NULL);
    tap_ok(ch_loader_batches(NULL) == 0, "ch_loader_free(NULL), release(NULL) and batches(NULL) are harmless");
}

/* The documented augmentation of sample `index` in epoch `epoch`, from the
 * plain image: include/chorus/data.h's draws, written out again. */
static void augmented(float *out, const float *in, uint64_t seed, int64_t epoch, int64_t index,
                      unsigned aug, int pad, int *flipped, int *dy_out, int *dx_out)
{
    uint32_t ctr[4] = {(uint32_t)index, (uint32_t)((uint64_t)index >> 32), (uint32_t)epoch,
                       (uint32_t)((uint64_t)epoch >> 32)};
    ch_philox4x32(ctr, seed ^ CH_AUGMENT_KEY);
    int flip = (aug & CH_AUGMENT_FLIP) && (ctr[0] & 1);
    int dy = (aug & CH_AUGMENT_CROP) ? (int)(ctr[1] % (uint32_t)(2 * pad + 1)) - pad : 0;
    int dx = (aug & CH_AUGMENT_CROP) ? (int)(ctr[2] % (uint32_t)(2 * pad + 1)) - pad : 0;
    for (int y = 0; y < ROWS; y++)
        for (int x = 0; x < COLS; x++) {
            int sy = y + dy, sx = x + dx;
            float v = sy >= 0 && sy < ROWS && sx >= 0 && sx < COLS ? in[sy * COLS + sx] : 0.0f;
            out[y * COLS + (flip ? COLS - 1 - x : x)] = v;
        }
    *flipped = flip;
    *dy_out = dy;
    *dx_out = dx;
}

/* One epoch of an augmenting loader against the reference; counts of the
 * draws seen. Returns the samples that matched. */
static int64_t augment_epoch(ch_loader_options o, int64_t epoch, int64_t *flips,
                             int64_t shifts[3][3], float (*images)[NUMEL])
{
    ch_loader *l = NULL;
    int64_t good = 0;
    if (ch_loader_new(&l, ds, &o) != CH_OK || ch_loader_start(l, epoch, 0) != CH_OK) {
        ch_loader_free(l);
        return -1;
    }
    for (;;) {
        ch_batch *b = NULL;
        if (ch_loader_next(l, &b) != CH_OK || !b)
            break;
        const float *got = ch_host_buffer_data(b->images);
        const int32_t *labels = ch_host_buffer_data(b->labels);
        for (int k = 0; k < b->count; k++) {
            float plain[NUMEL], want[NUMEL];
            int32_t label;
            int flip, dy, dx;
            int64_t index = b->indices[k];
            if (ch_dataset_get(ds, index, plain, &label) != CH_OK)
                continue;
            augmented(want, plain, o.seed, epoch, index, o.augment, o.crop_pad, &flip, &dy, &dx);
            good += memcmp(want, got + (size_t)k * NUMEL, sizeof want) == 0 && label == labels[k];
            *flips += flip;
            if (o.crop_pad == 1)
                shifts[dy + 1][dx + 1]++;
            if (images)
                memcpy(images[index], got + (size_t)k * NUMEL, sizeof want);
        }
        ch_loader_release(l, b);
    }
    ch_loader_free(l);
    return good;
}

static void test_augment(void)
{
    static float first[N][NUMEL], second[N][NUMEL];
    int64_t flips = 0, shifts[3][3] = {{0}};
    ch_loader_options o = options(64, 1, 0, 3, 3);
    o.augment = CH_AUGMENT_FLIP | CH_AUGMENT_CROP;
    o.crop_pad = 1;
    tap_ok(augment_epoch(o, 2, &flips, shifts, first) == N,
           "flip and crop: every sample as documented (Philox by seed, epoch, index)");
    int all_shifts = 1;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            all_shifts &= shifts[i][j] > N / 9 / 2;
    tap_ok(flips > N * 2 / 5 && flips < N * 3 / 5 && all_shifts,
           "about half the samples flipped (%lld of %d), every shift of -1..1 drawn "
           "(least %lld times)", (long long)flips, N, (long long)shifts[0][0]);
    /* A sample's augmentation does not depend on which rank loads it. */
    o.world = 2;
    o.workers = 1;
    int64_t halves = 0;
    for (o.rank = 0; o.rank < 2; o.rank++)
        halves += augment_epoch(o, 2, &flips, shifts, second);
    tap_ok(halves == N && memcmp(first, second, sizeof first) == 0,
           "two ranks' shares augmented as one loader's epoch (%lld of %d)", (long long)halves, N);
    o.world = 1;
    o.rank = 0;
    augment_epoch(o, 3, &flips, shifts, second);
    int64_t same = 0;
    for (int i = 0; i < N; i++)
        same += memcmp(first[i], second[i], sizeof first[i]) == 0;
    tap_ok(same < N / 2, "another epoch, other draws (%lld of %d samples alike)", (long long)same,
           N);
    o.augment = CH_AUGMENT_FLIP;
    flips = 0;
    tap_ok(augment_epoch(o, 0, &flips, shifts, NULL) == N && flips > 0,
           "flip alone: as documented");
    ch_loader *l = NULL;
    o.augment = 4;
    tap_status_is(ch_loader_new(&l, ds, &o), CH_ERR_INVALID_ARGUMENT,
                  "options->augment is 0x4, which has flags other than", "augment 0x4");
    o.augment = CH_AUGMENT_CROP;
    o.crop_pad = 0;
    tap_status_is(ch_loader_new(&l, ds, &o), CH_ERR_INVALID_ARGUMENT,
                  "options->crop_pad is 0 with CH_AUGMENT_CROP, expected 1 to 1024",
                  "crop_pad 0");
}

/* Batches in buffers pinned for each device. */
static void test_pinned(run *r)
{
    ch_device *devs[16];
    int n = tap_devices(devs, 16);
    for (int d = 0; d < n; d++) {
        ch_loader_options o = options(100, 1, 0, 2, 2);
        o.pin_for = devs[d];
        ch_loader *l = NULL;
        static char seen[N];
        memset(seen, 0, sizeof seen);
        if (tap_status_ok(ch_loader_new(&l, ds, &o), "pinned for %s: new", ch_device_id(devs[d])) &&
            run_epoch(l, 0, 0, r) == CH_OK)
            tap_ok(distinct(r->idx, r->n, seen) == N && r->content_ok,
                   "pinned for %s: every sample once, contents right (%s)", ch_device_id(devs[d]),
                   r->why[0] ? r->why : "ok");
        ch_loader_free(l);
    }
}

static const ch_dataset *open_dataset(const char *dir)
{
    char ip[4096], lp[4096];
    size_t ni, nl;
    snprintf(ip, sizeof ip, "%s/images", dir);
    snprintf(lp, sizeof lp, "%s/labels", dir);
    uint8_t *img = idxgen_images(N, ROWS, COLS, &ni), *lab = idxgen_labels(N, CLASSES, &nl);
    int written = img && lab && idxgen_write(ip, img, ni, 0) == 0 &&
                  idxgen_write(lp, lab, nl, 1) == 0;
    free(img);
    free(lab);
    ch_dataset *out = NULL;
    if (!written || ch_dataset_idx_open(&out, ip, lp, CLASSES, NULL) != CH_OK)
        return NULL;
    return out;
}

int main(void)
{
    if (ch_init() != CH_OK)
        tap_skip_all("ch_init failed: %s", ch_last_error());
    const char *dir = idxgen_tmpdir();
    if (!dir)
        tap_skip_all("cannot create a temporary folder");
    ds = open_dataset(dir);
    idxgen_cleanup(dir);
    if (!ds)
        tap_skip_all("cannot write and open a %d-sample data set: %s", N, ch_last_error());
    run *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    test_coverage(a);
    test_order(a, b);
    test_distributed(a, b);
    test_resume(a, b);
    test_slots();
    test_bad_options();
    test_augment();
    test_pinned(a);
    free(a);
    free(b);
    ch_dataset_free((ch_dataset *)ds);
    ch_shutdown();
    return tap_done();
}
