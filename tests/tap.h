/* A small TAP producer for the tests: one line per claim, numbers in the
 * message when a comparison fails. */
#ifndef CHORUS_TESTS_TAP_H
#define CHORUS_TESTS_TAP_H

#include <stdint.h>
#include <stddef.h>
#include <chorus.h>

#if defined(__GNUC__)
#define TAP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TAP_PRINTF(a, b)
#endif

/* The plan is printed at the end (tap_done) unless tap_plan was called. */
void tap_plan(int n);
/* "1..0 # SKIP reason" and exit(0). */
void tap_skip_all(const char *fmt, ...) TAP_PRINTF(1, 2);
/* Returns cond. */
int tap_ok(int cond, const char *fmt, ...) TAP_PRINTF(2, 3);
void tap_skip(const char *fmt, ...) TAP_PRINTF(1, 2);
/* A check known to fail, for the reason `why`: "not ok N - ... # TODO why",
 * which the harness counts as an expected failure (XFAIL), not a failure.
 * Print a passing check as tap_ok: an "ok" with TODO is an unexpected pass,
 * which fails. */
void tap_todo(const char *why, const char *fmt, ...) TAP_PRINTF(2, 3);
void tap_diag(const char *fmt, ...) TAP_PRINTF(1, 2);
/* A call that must succeed: not ok with the status and ch_last_error(). */
int tap_status_ok(ch_status st, const char *fmt, ...) TAP_PRINTF(2, 3);
/* A call that must fail with `want` and a message containing `needle`
 * (NULL: any message that is not empty). */
int tap_status_is(ch_status got, ch_status want, const char *needle,
                  const char *fmt, ...) TAP_PRINTF(4, 5);
/* Prints the plan if not done, returns the exit code (1 if any failed). */
int tap_done(void);
int tap_failures(void);

/* Deterministic pseudo-random inputs for tests (splitmix64). */
typedef struct tap_rng { uint64_t s; } tap_rng;
uint64_t tap_rng_next(tap_rng *r);
float tap_rng_uniform(tap_rng *r, float lo, float hi);

/* Devices to run op tests on: every visible device (host included),
 * including OpenCL CPU devices. */
int tap_devices(ch_device **out, int capacity);
/* Two devices for tests of what depends on OpenCL's platforms, chosen by
 * what they share rather than by index (which platform comes first is the
 * ICD loader's choice): two devices of one backend that peer both ways
 * (one OpenCL context: peer copies, peer reduction), or two of one backend
 * that cannot peer (OpenCL devices of two platforms, two vendors'
 * drivers). 1 with *a and *b set, 0 when there are no such two. */
int tap_peer_pair(ch_device **a, ch_device **b);
int tap_cross_pair(ch_device **a, ch_device **b);
/* The devices CHORUS_TEST_DEVICES names, a comma-separated list in which a
 * device may repeat ("cuda:0,cuda:0": replicas sharing a GPU, as the GPU
 * check sets it): how many; 0 when it is unset; -1, after a failing TAP
 * line, when it names a device that is not here or too many. */
int tap_env_devices(ch_device **out, int capacity);
/* An op's status as the device reports it: `st` when the call failed,
 * else what waiting for the device says. Errors only a kernel can find
 * (a label or an embedding index out of range) come from the call on the
 * host, and from the stream's next wait on CUDA and OpenCL, which defer
 * the check there (ops.h); this takes them from wherever they come. */
ch_status tap_settled(ch_status st, const ch_tensor *t);
/* t's values as floats into out (bytes: the room there, as
 * ch_tensor_download's): t itself when it is f32, else (a mixed-precision
 * module's half output) t widened on its device first (ch_cast). */
ch_status tap_download_floats(const ch_tensor *t, float *out, size_t bytes);
/* The bits of a float and back. */
uint32_t tap_bits_of(float f);
float tap_float_of(uint32_t u);
/* References for the 16-bit float formats, named by their mantissa bits
 * (bf16 7, f16 10; 15 - mant exponent bits, IEEE's bias), by arithmetic
 * on doubles, not the library's bit steps: the pattern nearest to f, ties
 * to the even one, a NaN quiet with its sign and the top of its payload;
 * and the f32 bits a pattern stands for (exact). */
uint16_t tap_half_narrow(int mant, float f);
uint32_t tap_half_widen(int mant, uint16_t h);
/* Data-parallel options for the MNIST-shaped test models (samples
 * [1, 28, 28], cross-entropy, SGD at 0.05 with momentum 0.9, reduction
 * through the host) with dropout seed `seed`. */
ch_dp_options tap_mnist_dp_options(uint64_t seed);
/* A batch of `count` MNIST-shaped samples ([1, 28, 28], uniform in
 * [-1, 1], row `label` of each brightened by 1.5 so that there is
 * something to learn) and their labels (10 classes), drawn from rng in
 * that order, in pinned buffers made on `host` (*images, *labels: the
 * caller frees them); the batch's index is `index`. */
ch_batch tap_mnist_batch(ch_device *host, tap_rng *rng, int count, int64_t index,
                         ch_host_buffer **images, ch_host_buffer **labels);
/* n such batches of `count` samples, drawn in turn from an rng seeded
 * with `seed`, indexed 0 to n - 1 (b[s]); tap_mnist_batches_free frees
 * them. */
typedef struct tap_mnist_batches {
    int n;
    ch_host_buffer **images, **labels;
    ch_batch *b;
} tap_mnist_batches;
void tap_mnist_batches_make(tap_mnist_batches *bs, ch_device *host, uint64_t seed, int n,
                            int count);
void tap_mnist_batches_free(tap_mnist_batches *bs);
/* Over the parameters of a and b (same shapes), the largest
 * max|a - b| / max|b|; infinite when one cannot be read. */
double tap_params_max_rel(ch_module *a, ch_module *b);
/* A Sequential of the n children (ownership passes to it); NULL when a
 * child is NULL or an add fails, the message in ch_last_error(). */
ch_module *tap_sequential(int n, ch_module *const *children);
/* A small CNN for [1, 28, 28] inputs with nothing discrete in it (strided
 * convolutions, tanh), so that data-parallel training over several
 * backends matches one device's to rounding (tests/tap.c says why); with
 * `dropout`, dropout (p 0.3) before the last layer. */
ch_module *tap_smooth_cnn(int dropout);

#endif
