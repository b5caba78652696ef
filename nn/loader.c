/* The data loader. Worker threads fill batches into a ring of `prefetch`
 * slots, batch b in slot b % prefetch; several batches may be filled at once,
 * in any order, but ch_loader_next hands them out in batch order. A slot goes
 * FREE -> FILLING (a worker) -> READY -> HANDED (ch_loader_next) -> FREE
 * (ch_loader_release).
 *
 * The shuffle is Fisher-Yates driven by Philox-4x32-10 (ch_philox4x32) keyed
 * by the seed, with the counter (position, epoch): the order depends on the
 * seed and the epoch alone, not on the workers or the machine.
 *
 * Filling a batch cannot fail (its buffers are allocated up front and the
 * data set is in memory), so workers have no errors to pass on. Mutex and
 * condition calls on the default objects initialised here fail only on
 * misuse (EINVAL, EPERM), which the structure below excludes: their results
 * are not checked.
 *
 * Nothing here touches a device: the buffers are uploaded by the consumer
 * (ch_dp, asynchronously), which must have drained those uploads before it
 * releases the batch to be refilled (docs/DESIGN.md, Streams). */
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <chorus.h>
#include "error.h"
#include "dataset.h"
#include "trace.h"

typedef enum slot_state { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HANDED } slot_state;

typedef struct slot {
    ch_batch batch;
    int64_t *indices;
    slot_state state;
} slot;

struct ch_loader {
    const ch_dataset *ds;
    ch_loader_options opt;
    int64_t share;   /* samples of this rank per epoch */
    int64_t batches; /* batches of this rank per epoch */
    int64_t *order;  /* the data set's indices in this epoch's order */
    slot *slots;     /* opt.prefetch of them */
    pthread_t *threads;
    int nthreads;    /* running */

    pthread_mutex_t lock;
    pthread_cond_t work;  /* workers wait here for a slot to fill */
    pthread_cond_t ready; /* ch_loader_next and ch_loader_start wait here */
    int started;          /* an epoch is on; 0 stops workers from claiming */
    int quit;
    int64_t epoch;
    int64_t next_fill;    /* the next batch a worker claims */
    int64_t next_hand;    /* the next batch ch_loader_next returns */
    int filling;          /* slots being filled now */
    int workers_named;    /* workers that took their number (their trace tracks) */
};

static slot *slot_of(const ch_loader *l, int64_t batch)
{
    return &l->slots[batch % l->opt.prefetch];
}

static void shuffle(int64_t *order, int64_t n, uint64_t seed, int64_t epoch)
{
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t e = (uint64_t)epoch, u = (uint64_t)i;
        uint32_t ctr[4] = {(uint32_t)u, (uint32_t)(u >> 32), (uint32_t)e, (uint32_t)(e >> 32)};
        ch_philox4x32(ctr, seed);
        /* The modulo's bias is below n / 2^64: nothing a data set can show. */
        uint64_t j = ((uint64_t)ctr[0] << 32 | ctr[1]) % (u + 1);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* Sample `index` of epoch `epoch` into `image`, augmented as the options
 * say (include/chorus/data.h gives the draws). */
static void fill_sample(const ch_loader *l, int64_t epoch, int64_t index, float *image,
                        int32_t *label)
{
    const ch_loader_options *o = &l->opt;
    const ch_dataset *ds = l->ds;
    if (!o->augment) {
        chn_dataset_fill(ds, index, image, label);
        return;
    }
    uint64_t e = (uint64_t)epoch, u = (uint64_t)index;
    uint32_t ctr[4] = {(uint32_t)u, (uint32_t)(u >> 32), (uint32_t)e, (uint32_t)(e >> 32)};
    ch_philox4x32(ctr, o->seed ^ CH_AUGMENT_KEY);
    int flip = (o->augment & CH_AUGMENT_FLIP) && (ctr[0] & 1);
    int dy = 0, dx = 0;
    if ((o->augment & CH_AUGMENT_CROP) && o->crop_pad > 0) {
        uint32_t span = 2 * (uint32_t)o->crop_pad + 1;
        dy = (int)(ctr[1] % span) - o->crop_pad;
        dx = (int)(ctr[2] % span) - o->crop_pad;
    }
    int rows = ds->rows, cols = ds->cols;
    const uint8_t *src = ds->pixels + index * (int64_t)rows * cols;
    for (int y = 0; y < rows; y++) {
        int sy = y + dy;
        float *row = image + (int64_t)y * cols;
        for (int x = 0; x < cols; x++) {
            int sx = x + dx;
            float v = ds->lut[0];
            if (sy >= 0 && sy < rows && sx >= 0 && sx < cols)
                v = ds->lut[src[(int64_t)sy * cols + sx]];
            row[flip ? cols - 1 - x : x] = v;
        }
    }
    *label = ds->labels[index];
}

/* Batch `number` of this rank's share: positions rank, rank + world, ... of
 * the epoch's order. */
static void fill(const ch_loader *l, slot *s, int64_t epoch, int64_t number)
{
    const ch_loader_options *o = &l->opt;
    int64_t first = number * o->batch_size;
    int64_t count = l->share - first < o->batch_size ? l->share - first : o->batch_size;
    int64_t numel = ch_dataset_sample_numel(l->ds);
    float *images = ch_host_buffer_data(s->batch.images);
    int32_t *labels = ch_host_buffer_data(s->batch.labels);
    for (int64_t k = 0; k < count; k++) {
        int64_t index = l->order[o->rank + (first + k) * o->world];
        s->indices[k] = index;
        fill_sample(l, epoch, index, images + k * numel, labels + k);
    }
    s->batch.count = (int)count;
    s->batch.epoch = epoch;
    s->batch.number = number;
}

/* The slot of the next batch to fill, when a worker may claim it. */
static slot *claimable(const ch_loader *l)
{
    if (!l->started || l->next_fill >= l->batches)
        return NULL;
    slot *s = slot_of(l, l->next_fill);
    return s->state == SLOT_FREE ? s : NULL;
}

static void *worker_main(void *arg)
{
    ch_loader *l = arg;
    pthread_mutex_lock(&l->lock);
    int me = l->workers_named++;
    char track[32];
    snprintf(track, sizeof track, "loader %d", me);
    for (;;) {
        slot *s = NULL;
        while (!l->quit && !(s = claimable(l)))
            pthread_cond_wait(&l->work, &l->lock);
        if (l->quit)
            break;
        int64_t number = l->next_fill++, epoch = l->epoch;
        s->state = SLOT_FILLING;
        l->filling++;
        pthread_mutex_unlock(&l->lock);
        double t0 = chi_trace_now();
        fill(l, s, epoch, number);
        if (chi_tracing()) {
            char name[48], args[96];
            snprintf(name, sizeof name, "batch %lld", (long long)number);
            snprintf(args, sizeof args, "{\"epoch\":%lld,\"batch\":%lld,\"samples\":%d}",
                     (long long)epoch, (long long)number, s->batch.count);
            chi_trace_slice(chi_trace_track(track, 300 + me), name, "loader", t0,
                            ch_clock_seconds(), args);
        }
        pthread_mutex_lock(&l->lock);
        s->state = SLOT_READY;
        l->filling--;
        pthread_cond_broadcast(&l->ready);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

static ch_status check_options(const ch_loader_options *o)
{
    const char *fn = "ch_loader_new";
    if (o->batch_size < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: options->batch_size is %d, expected >= 1",
                         fn, o->batch_size);
    if (o->workers < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: options->workers is %d, expected >= 1", fn,
                         o->workers);
    if (o->prefetch < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: options->prefetch is %d, expected >= 1",
                         fn, o->prefetch);
    if (o->augment & ~(unsigned)(CH_AUGMENT_FLIP | CH_AUGMENT_CROP))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: options->augment is 0x%x, which has flags other than "
                         "CH_AUGMENT_FLIP and CH_AUGMENT_CROP", fn, o->augment);
    if ((o->augment & CH_AUGMENT_CROP) && (o->crop_pad < 1 || o->crop_pad > 1024))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: options->crop_pad is %d with CH_AUGMENT_CROP, expected 1 to 1024",
                         fn, o->crop_pad);
    if (o->world < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: options->world is %d, expected >= 1", fn,
                         o->world);
    if (o->rank < 0 || o->rank >= o->world)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: options->rank is %d, expected 0 <= rank < world (%d)", fn, o->rank,
                         o->world);
    return CH_OK;
}

/* The mutex and both conditions, all or none. */
static ch_status sync_init(ch_loader *l)
{
    int rc = pthread_mutex_init(&l->lock, NULL);
    if (rc != 0)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_loader_new: pthread_mutex_init: %s",
                         strerror(rc));
    rc = pthread_cond_init(&l->work, NULL);
    if (rc == 0) {
        rc = pthread_cond_init(&l->ready, NULL);
        if (rc == 0)
            return CH_OK;
        pthread_cond_destroy(&l->work);
    }
    pthread_mutex_destroy(&l->lock);
    return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_loader_new: pthread_cond_init: %s", strerror(rc));
}

static ch_status slots_new(ch_loader *l, ch_device *dev)
{
    size_t bs = (size_t)l->opt.batch_size, numel = (size_t)ch_dataset_sample_numel(l->ds);
    if (numel > SIZE_MAX / sizeof(float) / bs)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_loader_new: options->batch_size %zu times %zu floats per sample overflows",
                         bs, numel);
    l->slots = calloc((size_t)l->opt.prefetch, sizeof *l->slots);
    if (!l->slots)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_loader_new: out of memory for %d slots",
                         l->opt.prefetch);
    for (int i = 0; i < l->opt.prefetch; i++) {
        slot *s = &l->slots[i];
        ch_status st = ch_host_buffer_new(&s->batch.images, dev, bs * numel * sizeof(float));
        if (st == CH_OK)
            st = ch_host_buffer_new(&s->batch.labels, dev, bs * sizeof(int32_t));
        if (st != CH_OK)
            return st;
        s->indices = malloc(bs * sizeof *s->indices);
        if (!s->indices)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_loader_new: out of memory for %zu indices",
                             bs);
        s->batch.indices = s->indices;
    }
    return CH_OK;
}

static ch_status threads_start(ch_loader *l)
{
    l->threads = calloc((size_t)l->opt.workers, sizeof *l->threads);
    if (!l->threads)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_loader_new: out of memory for %d workers",
                         l->opt.workers);
    for (; l->nthreads < l->opt.workers; l->nthreads++) {
        int rc = pthread_create(&l->threads[l->nthreads], NULL, worker_main, l);
        if (rc != 0)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_loader_new: pthread_create (worker %d): %s",
                             l->nthreads, strerror(rc));
    }
    return CH_OK;
}

static void share_size(ch_loader *l)
{
    int64_t n = ch_dataset_size(l->ds), world = l->opt.world, rank = l->opt.rank;
    int64_t bs = l->opt.batch_size;
    l->share = n > rank ? (n - rank + world - 1) / world : 0;
    l->batches = l->opt.drop_last ? l->share / bs : (l->share + bs - 1) / bs;
}

ch_status ch_loader_new(ch_loader **out, const ch_dataset *ds, const ch_loader_options *options)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loader_new: out is NULL");
    *out = NULL;
    if (!ds)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loader_new: ds is NULL");
    if (!options)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loader_new: options is NULL");
    ch_status st = check_options(options);
    if (st != CH_OK)
        return st;
    ch_device *dev = options->pin_for;
    if (!dev) {
        st = ch_device_by_name(&dev, "host");
        if (st != CH_OK)
            return st;
    }
    ch_loader *l = calloc(1, sizeof *l);
    if (!l)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_loader_new: out of memory");
    st = sync_init(l);
    if (st != CH_OK) {
        free(l);
        return st;
    }
    l->ds = ds;
    l->opt = *options;
    share_size(l);
    l->order = malloc((size_t)ch_dataset_size(ds) * sizeof *l->order);
    if (!l->order)
        st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_loader_new: out of memory for %lld indices",
                       (long long)ch_dataset_size(ds));
    if (st == CH_OK)
        st = slots_new(l, dev);
    if (st == CH_OK)
        st = threads_start(l);
    if (st != CH_OK) {
        ch_loader_free(l);
        return st;
    }
    *out = l;
    return CH_OK;
}

void ch_loader_free(ch_loader *loader)
{
    if (!loader)
        return;
    pthread_mutex_lock(&loader->lock);
    loader->quit = 1;
    pthread_cond_broadcast(&loader->work);
    pthread_mutex_unlock(&loader->lock);
    for (int i = 0; i < loader->nthreads; i++)
        pthread_join(loader->threads[i], NULL);
    for (int i = 0; loader->slots && i < loader->opt.prefetch; i++) {
        ch_host_buffer_free(loader->slots[i].batch.images);
        ch_host_buffer_free(loader->slots[i].batch.labels);
        free(loader->slots[i].indices);
    }
    pthread_cond_destroy(&loader->ready);
    pthread_cond_destroy(&loader->work);
    pthread_mutex_destroy(&loader->lock);
    free(loader->slots);
    free(loader->threads);
    free(loader->order);
    free(loader);
}

ch_status ch_loader_start(ch_loader *loader, int64_t epoch, int64_t first_batch)
{
    if (!loader)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loader_start: loader is NULL");
    if (epoch < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loader_start: epoch is %lld, expected >= 0",
                         (long long)epoch);
    if (first_batch < 0 || first_batch > loader->batches)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_loader_start: first_batch is %lld, expected 0 to %lld (batches per epoch)",
                         (long long)first_batch, (long long)loader->batches);
    ch_loader *l = loader;
    pthread_mutex_lock(&l->lock);
    /* Workers read the order while they fill: let them finish first. */
    l->started = 0;
    while (l->filling > 0)
        pthread_cond_wait(&l->ready, &l->lock);
    for (int i = 0; i < l->opt.prefetch; i++)
        if (l->slots[i].state == SLOT_READY)
            l->slots[i].state = SLOT_FREE;
    int64_t n = ch_dataset_size(l->ds);
    if (l->opt.shuffle)
        shuffle(l->order, n, l->opt.seed, epoch);
    else
        for (int64_t i = 0; i < n; i++)
            l->order[i] = i;
    l->epoch = epoch;
    l->next_fill = l->next_hand = first_batch;
    l->started = 1;
    pthread_cond_broadcast(&l->work);
    pthread_cond_broadcast(&l->ready);
    pthread_mutex_unlock(&l->lock);
    return CH_OK;
}

/* Under the lock: the next batch when it is ready, NULL at the end of the
 * epoch, or waits. */
static ch_status next_locked(ch_loader *l, ch_batch **batch, int *waited)
{
    for (;;) {
        if (!l->started)
            return chi_error(CH_ERR_STATE, "ch_loader_next: no epoch started: call ch_loader_start first");
        if (l->next_hand >= l->batches)
            return CH_OK;
        slot *s = slot_of(l, l->next_hand);
        if (s->state == SLOT_HANDED)
            return chi_error(CH_ERR_STATE,
                             "ch_loader_next: batch %lld needs the slot of a batch not released yet: "
                             "hold at most prefetch (%d) batches at a time",
                             (long long)l->next_hand, l->opt.prefetch);
        if (s->state == SLOT_READY) {
            s->state = SLOT_HANDED;
            l->next_hand++;
            *batch = &s->batch;
            return CH_OK;
        }
        *waited = 1;
        pthread_cond_wait(&l->ready, &l->lock);
    }
}

ch_status ch_loader_next(ch_loader *loader, ch_batch **batch)
{
    if (!batch)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loader_next: batch is NULL");
    *batch = NULL;
    if (!loader)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loader_next: loader is NULL");
    double t0 = chi_trace_now();
    int waited = 0;
    pthread_mutex_lock(&loader->lock);
    ch_status st = next_locked(loader, batch, &waited);
    pthread_mutex_unlock(&loader->lock);
    /* On the track of the steps: the thread that asks is the one that
     * trains. */
    if (waited && chi_tracing())
        chi_trace_slice(chi_trace_track("steps", 0), "wait for the loader", "wait", t0,
                        ch_clock_seconds(), NULL);
    return st;
}

void ch_loader_release(ch_loader *loader, ch_batch *batch)
{
    if (!loader || !batch)
        return;
    pthread_mutex_lock(&loader->lock);
    for (int i = 0; i < loader->opt.prefetch; i++) {
        slot *s = &loader->slots[i];
        if (&s->batch == batch && s->state == SLOT_HANDED) {
            s->state = SLOT_FREE;
            pthread_cond_broadcast(&loader->work);
        }
    }
    pthread_mutex_unlock(&loader->lock);
}

int64_t ch_loader_batches(const ch_loader *loader) { return loader ? loader->batches : 0; }
