// Prime fields of N 32-bit limbs with p < 2^(32N - 1): BN254 Fr and Fq, BLS12-381 Fr
// (N = 8) and BLS12-381 Fq (N = 12). Elements are little-endian limbs; the vector ops
// take canonical form (< p) and use Montgomery multiplication (CIOS) inside, the curve
// code stays in Montgomery form. 32-bit limbs because the GPU's 32-bit multiply-add is
// native; 64-bit multiply is emulated. Every function takes the field's constants; they
// are compile-time constants at each call site, so the inlined code specialises per
// field. C++ templates (NVRTC, and the host build as C++) give one source for both widths.
#ifndef GPU_OPS_FP_CUH
#define GPU_OPS_FP_CUH
#include "common.cuh"

template <int N> struct fp_params {
    u32 p[N];
    // R^2 mod p, R = 2^(32N): multiplying a Montgomery product by it restores canonical form.
    u32 r2[N];
    // p - 2, the Fermat exponent of an inverse.
    u32 p_minus_2[N];
    // -p^{-1} mod 2^32
    u32 inv;
};

// r = a - p (limb-wise); returns the final borrow.
template <int N> FIELD_FN u32 fp_sub_p(const fp_params<N> *f, u32 *r, const u32 *a) {
    u64 borrow = 0;
    for (int i = 0; i < N; i++) {
        u64 d = (u64)a[i] - f->p[i] - borrow;
        r[i] = (u32)d;
        borrow = (d >> 32) & 1;
    }
    return (u32)borrow;
}

// Keeps a if a < p, else a - p. a < 2p < R is the caller's invariant.
template <int N> FIELD_FN void fp_reduce_once(const fp_params<N> *f, u32 *a) {
    u32 t[N];
    if (fp_sub_p(f, t, a) == 0) {
        for (int i = 0; i < N; i++) a[i] = t[i];
    }
}

template <int N> FIELD_FN void fp_add(const fp_params<N> *f, u32 *r, const u32 *a, const u32 *b) {
    // p < 2^(32N-1), so a + b never carries out of N limbs.
    u64 carry = 0;
    for (int i = 0; i < N; i++) {
        u64 s = (u64)a[i] + b[i] + carry;
        r[i] = (u32)s;
        carry = s >> 32;
    }
    fp_reduce_once(f, r);
}

template <int N> FIELD_FN void fp_sub(const fp_params<N> *f, u32 *r, const u32 *a, const u32 *b) {
    u64 borrow = 0;
    for (int i = 0; i < N; i++) {
        u64 d = (u64)a[i] - b[i] - borrow;
        r[i] = (u32)d;
        borrow = (d >> 32) & 1;
    }
    if (borrow) {
        u64 carry = 0;
        for (int i = 0; i < N; i++) {
            u64 s = (u64)r[i] + f->p[i] + carry;
            r[i] = (u32)s;
            carry = s >> 32;
        }
    }
}

// Montgomery product a*b*R^{-1} mod p (CIOS). Each t[j] + a*b + c fits in 64 bits:
// (2^32-1) + (2^32-1)^2 + (2^32-1) = 2^64 - 1. The result is written only after both
// inputs are read, so r may alias a or b.
template <int N> FIELD_FN void fp_mont_mul(const fp_params<N> *f, u32 *r, const u32 *a, const u32 *b) {
    u32 t[N + 2];
    for (int i = 0; i < N + 2; i++) t[i] = 0;
    for (int i = 0; i < N; i++) {
        u64 c = 0;
        for (int j = 0; j < N; j++) {
            u64 s = (u64)t[j] + (u64)a[j] * b[i] + c;
            t[j] = (u32)s;
            c = s >> 32;
        }
        u64 s = (u64)t[N] + c;
        t[N] = (u32)s;
        t[N + 1] = (u32)(s >> 32);

        u32 m = t[0] * f->inv;
        c = ((u64)t[0] + (u64)m * f->p[0]) >> 32;
        for (int j = 1; j < N; j++) {
            u64 s2 = (u64)t[j] + (u64)m * f->p[j] + c;
            t[j - 1] = (u32)s2;
            c = s2 >> 32;
        }
        s = (u64)t[N] + c;
        t[N - 1] = (u32)s;
        t[N] = t[N + 1] + (u32)(s >> 32);
    }
    // a, b < p < R give a CIOS result below 2p (< R here): one subtraction suffices.
    for (int i = 0; i < N; i++) r[i] = t[i];
    fp_reduce_once(f, r);
}

// Canonical in, canonical out: (a*b*R^{-1}) * R^2 * R^{-1} = a*b.
template <int N> FIELD_FN void fp_mul(const fp_params<N> *f, u32 *r, const u32 *a, const u32 *b) {
    u32 t[N];
    fp_mont_mul(f, t, a, b);
    fp_mont_mul(f, r, t, f->r2);
}

// x^e for an exponent of N little-endian limbs, canonical in and out, 0^0 = 1.
// Square-and-multiply over all 32N bits in the Montgomery domain.
template <int N> FIELD_FN void fp_pow(const fp_params<N> *f, u32 *r, const u32 *x, const u32 *e) {
    u32 one[N] = {1};
    u32 xm[N], acc[N];
    fp_mont_mul(f, xm, x, f->r2);
    fp_mont_mul(f, acc, one, f->r2);
    for (int i = 32 * N - 1; i >= 0; i--) {
        fp_mont_mul(f, acc, acc, acc);
        if ((e[i / 32] >> (i % 32)) & 1u) fp_mont_mul(f, acc, acc, xm);
    }
    fp_mont_mul(f, r, acc, one);
}

// out[i] = in[i]^-1 for n >= 1 nonzero elements (N limbs each; out must not alias in):
// Montgomery's trick, prefix products, one Fermat inversion, back substitution.
template <int N> FIELD_FN void fp_batch_inv(const fp_params<N> *f, u32 *out, const u32 *in, u64 n) {
    for (int k = 0; k < N; k++) out[k] = in[k];
    for (u64 i = 1; i < n; i++) fp_mul(f, out + N * i, out + N * (i - 1), in + N * i);
    u32 inv[N], t[N];
    fp_pow(f, inv, out + N * (n - 1), f->p_minus_2);
    for (u64 i = n - 1; i > 0; i--) {
        fp_mul(f, t, inv, out + N * (i - 1));
        fp_mul(f, inv, inv, in + N * i);
        for (int k = 0; k < N; k++) out[N * i + k] = t[k];
    }
    for (int k = 0; k < N; k++) out[k] = inv[k];
}

#endif  // GPU_OPS_FP_CUH
