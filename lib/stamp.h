/* What nn/ needs of the core to keep a parameter's half-precision copy
 * from one step to the next (nn/module.c's nn_half_weight and
 * nn/optim.c): a buffer's stamp, and Adam that also rounds the parameter
 * it writes. Private, like error.h and trace.h: the installed library
 * keeps them local; the test build of the library exports them
 * (CHI_TEST_API) for the tests and the copy of nn/ built for them. */
#ifndef CHORUS_LIB_STAMP_H
#define CHORUS_LIB_STAMP_H

#include <stdint.h>
#include <chorus.h>

#include "error.h"

/* The stamp of t's buffer: it takes a new value, one that no buffer had
 * before, whenever an op, a transfer or a reduction reaches the buffer's
 * memory (through t or any view of it, reading or writing), and when the
 * buffer is made. The same value read twice: nothing used the buffer in
 * between. */
CHI_TEST_API uint64_t chi_tensor_stamp(const ch_tensor *t);

/* 1 when chi_adam_step_half runs for p and ph: ph bf16 or f16 with p's
 * element count on p's device, whose backend fuses the two. */
CHI_TEST_API int chi_adam_half_fused(const ch_tensor *p, const ch_tensor *ph);

/* ch_adam_step, and ph = the new p rounded to ph's format as ch_cast
 * rounds it (the same bits), in one pass over p. CH_ERR_UNSUPPORTED
 * where chi_adam_half_fused says no. */
CHI_TEST_API ch_status chi_adam_step_half(ch_tensor *p, ch_tensor *m, ch_tensor *v,
                                          const ch_tensor *g, const ch_adam_params *params,
                                          ch_tensor *ph);

/* One parameter of chi_adam_step_multi: ph NULL, or its rounded copy
 * (written where chi_adam_half_fused(p, ph), as chi_adam_step_half
 * writes it; left alone elsewhere). */
typedef struct chi_adam_tensors {
    ch_tensor *p, *m, *v;
    const ch_tensor *g;
    ch_tensor *ph;
} chi_adam_tensors;

/* One parameter's step: chi_adam_step_half where chi_adam_half_fused(p,
 * ph), ch_adam_step otherwise (ph then left alone). */
CHI_TEST_API ch_status chi_adam_step_one(const chi_adam_tensors *t, const ch_adam_params *params);

/* The Adam step of `count` parameters of one device (each checked as
 * ch_adam_step checks its own), in one launch or a few where the backend
 * has adam_step_multi, else one by one: the same bits either way. No two
 * parameters may share memory but their gradients (CH_ERR_INVALID_ARGUMENT
 * naming both); all on one device (CH_ERR_DEVICE_MISMATCH). */
CHI_TEST_API ch_status chi_adam_step_multi(int count, const chi_adam_tensors *t,
                                           const ch_adam_params *params);

#endif
