/* Random numbers: each element is one call of lib/philox.h, whose source is
 * placed before this file's when the program is created, so the rounds and
 * the word-to-float recipes are the ones the host and CUDA compile.
 * uniform: a + (b - a) u; normal: a + b z; dropout: u >= a ? b : 0 with
 * b = 1 / (1 - a) computed by the host. The CH_RAND_* values come from the
 * build options; ops.c refuses others before launching. */

__kernel void rand(__global float *y, ulong yo, int n, ulong seed, ulong offset,
                   int kind, float a, float b)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    ulong index = offset + (ulong)i;
    float r;
    switch (kind) {
    case CH_RAND_UNIFORM: r = chi_philox_uniform(seed, index, a, b); break;
    case CH_RAND_NORMAL: r = chi_philox_normal(seed, index, a, b); break;
    case CH_RAND_DROPOUT: r = chi_philox_dropout(seed, index, a, b); break;
    default: r = NAN; break;
    }
    y[yo + i] = r;
}
