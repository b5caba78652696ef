/* Philox-4x32-10 random numbers, the same rounds and the same word-to-float
 * conversions as lib/philox.h and include/chorus/ops.h: element i draws from
 * the counter (offset + i) split into (c0, c1, 0, 0) under the key (seed low,
 * seed high), so every backend gives the same uniform bits. */

#pragma OPENCL FP_CONTRACT OFF

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

#define RAND_UNIFORM 0
#define RAND_NORMAL 1
#define RAND_DROPOUT 2

/* Words 0 and 1 of the Philox block at counter `ctr`. */
uint2 philox_words(ulong ctr, ulong seed)
{
    uint c0 = (uint)ctr, c1 = (uint)(ctr >> 32), c2 = 0u, c3 = 0u;
    uint k0 = (uint)seed, k1 = (uint)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint hi0 = mul_hi(PHILOX_M0, c0), lo0 = PHILOX_M0 * c0;
        uint hi1 = mul_hi(PHILOX_M1, c2), lo1 = PHILOX_M1 * c2;
        uint n0 = hi1 ^ c1 ^ k0;
        uint n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    return (uint2)(c0, c1);
}

float unit(uint w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }

/* uniform: a + (b - a) u; normal: a + b z (Box-Muller);
 * dropout: u >= a ? b : 0 with b = 1 / (1 - a) computed by the host. */
__kernel void rand(__global float *y, ulong yo, int n, ulong seed, ulong offset,
                   int kind, float a, float b)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    uint2 w = philox_words(offset + (ulong)i, seed);
    float r;
    if (kind == RAND_UNIFORM) {
        r = a + (b - a) * unit(w.x);
    } else if (kind == RAND_NORMAL) {
        float u1 = (float)((w.x >> 8) + 1u) * (1.0f / 16777216.0f);
        float u2 = unit(w.y);
        r = a + b * (sqrt(-2.0f * log(u1)) * cos(2.0f * M_PI_F * u2));
    } else {
        r = unit(w.x) >= a ? b : 0.0f;
    }
    y[yo + i] = r;
}
