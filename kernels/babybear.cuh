// BabyBear field p = 2^31 - 2^27 + 1 = 2013265921, canonical u32 (< p).
#ifndef GPU_OPS_BABYBEAR_CUH
#define GPU_OPS_BABYBEAR_CUH
#include "common.cuh"

#define BB_P 2013265921u

FIELD_FN u32 bb_add(u32 a, u32 b) {
    u32 s = a + b; /* < 2^32: both are below 2^31 */
    return s >= BB_P ? s - BB_P : s;
}

FIELD_FN u32 bb_sub(u32 a, u32 b) {
    return a >= b ? a - b : a + BB_P - b;
}

FIELD_FN u32 bb_mul(u32 a, u32 b) {
    return (u32)(((u64)a * b) % BB_P);
}

// x^e for a 256-bit exponent (8 little-endian u32 limbs), 0^0 = 1.
FIELD_FN u32 bb_pow(u32 x, const u32 *e) {
    u32 acc = 1;
    for (int i = 255; i >= 0; i--) {
        acc = bb_mul(acc, acc);
        if ((e[i / 32] >> (i % 32)) & 1u) acc = bb_mul(acc, x);
    }
    return acc;
}

// out[i] = in[i]^-1 for n >= 1 nonzero elements; out must not alias in.
FIELD_FN void bb_batch_inv(u32 *out, const u32 *in, u64 n) {
    const u32 p_minus_2[8] = {BB_P - 2, 0, 0, 0, 0, 0, 0, 0};
    out[0] = in[0];
    for (u64 i = 1; i < n; i++) out[i] = bb_mul(out[i - 1], in[i]);
    u32 inv = bb_pow(out[n - 1], p_minus_2);
    for (u64 i = n - 1; i > 0; i--) {
        u32 t = bb_mul(inv, out[i - 1]);
        inv = bb_mul(inv, in[i]);
        out[i] = t;
    }
    out[0] = inv;
}

#endif
