// Goldilocks field p = 2^64 - 2^32 + 1, canonical u64 (< p).
// Reduction uses 2^64 = 2^32 - 1 (mod p) and 2^96 = -1 (mod p).
#ifndef GPU_OPS_GOLDILOCKS_CUH
#define GPU_OPS_GOLDILOCKS_CUH
#include "common.cuh"

#define GL_P 0xffffffff00000001ull
#define GL_EPSILON 0xffffffffull /* 2^64 mod p */

FIELD_FN u64 gl_add(u64 a, u64 b) {
    u64 s = a + b;
    // A carry out means the true sum is s + 2^64 = s + EPSILON (mod p), and that is < p.
    if (s < a) return s + GL_EPSILON;
    return s >= GL_P ? s - GL_P : s;
}

FIELD_FN u64 gl_sub(u64 a, u64 b) {
    u64 d = a - b;
    return a < b ? d + GL_P : d;
}

FIELD_FN u64 gl_reduce128(u64 hi, u64 lo) {
    u64 hi_hi = hi >> 32;
    u64 hi_lo = hi & GL_EPSILON;
    u64 t0 = lo - hi_hi;
    if (lo < hi_hi) t0 -= GL_EPSILON; /* borrowed 2^64 = EPSILON */
    u64 t1 = hi_lo * GL_EPSILON;
    u64 t2 = t0 + t1;
    if (t2 < t1) t2 += GL_EPSILON; /* carried 2^64 = EPSILON; cannot overflow again */
    return t2 >= GL_P ? t2 - GL_P : t2;
}

FIELD_FN u64 gl_mul(u64 a, u64 b) {
#ifdef GPU_OPS_DEVICE
    return gl_reduce128(__umul64hi(a, b), a * b);
#else
    unsigned __int128 p = (unsigned __int128)a * b;
    return gl_reduce128((u64)(p >> 64), (u64)p);
#endif
}

// x^e for a 256-bit exponent (4 little-endian words), 0^0 = 1.
FIELD_FN u64 gl_pow(u64 x, const u64 *e) {
    u64 acc = 1;
    for (int i = 255; i >= 0; i--) {
        acc = gl_mul(acc, acc);
        if ((e[i / 64] >> (i % 64)) & 1ull) acc = gl_mul(acc, x);
    }
    return acc;
}

// out[i] = in[i]^-1 for n >= 1 nonzero elements; out must not alias in.
FIELD_FN void gl_batch_inv(u64 *out, const u64 *in, u64 n) {
    const u64 p_minus_2[4] = {GL_P - 2, 0, 0, 0};
    out[0] = in[0];
    for (u64 i = 1; i < n; i++) out[i] = gl_mul(out[i - 1], in[i]);
    u64 inv = gl_pow(out[n - 1], p_minus_2);
    for (u64 i = n - 1; i > 0; i--) {
        u64 t = gl_mul(inv, out[i - 1]);
        inv = gl_mul(inv, in[i]);
        out[i] = t;
    }
    out[0] = inv;
}

#endif
