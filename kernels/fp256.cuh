// Prime fields below 2^256 (BN254 Fr, BLS12-381 Fr): elements as 8 little-endian 32-bit
// limbs in canonical form (< p), Montgomery multiplication (CIOS) inside. 32-bit limbs
// because the GPU's 32-bit multiply-add is native; 64-bit multiply is emulated.
// Every function takes the field's constants; they are compile-time constants at each
// call site, so the inlined code specialises per field.
#ifndef GPU_OPS_FP256_CUH
#define GPU_OPS_FP256_CUH
#include "common.cuh"

#define FP256_LIMBS 8

typedef struct {
    u32 p[FP256_LIMBS];
    // R^2 mod p, R = 2^256: multiplying a Montgomery product by it restores canonical form.
    u32 r2[FP256_LIMBS];
    // p - 2, the Fermat exponent of an inverse.
    u32 p_minus_2[FP256_LIMBS];
    // -p^{-1} mod 2^32
    u32 inv;
} fp256_params;

// r = a - p (limb-wise); returns the final borrow.
FIELD_FN u32 fp256_sub_p(const fp256_params *f, u32 *r, const u32 *a) {
    u64 borrow = 0;
    for (int i = 0; i < FP256_LIMBS; i++) {
        u64 d = (u64)a[i] - f->p[i] - borrow;
        r[i] = (u32)d;
        borrow = (d >> 32) & 1;
    }
    return (u32)borrow;
}

// Keeps a if a < p, else a - p. a < 2p < 2^256 is the caller's invariant.
FIELD_FN void fp256_reduce_once(const fp256_params *f, u32 *a) {
    u32 t[FP256_LIMBS];
    if (fp256_sub_p(f, t, a) == 0) {
        for (int i = 0; i < FP256_LIMBS; i++) a[i] = t[i];
    }
}

FIELD_FN void fp256_add(const fp256_params *f, u32 *r, const u32 *a, const u32 *b) {
    // p < 2^255, so a + b < 2^256 never carries out of 8 limbs.
    u64 carry = 0;
    for (int i = 0; i < FP256_LIMBS; i++) {
        u64 s = (u64)a[i] + b[i] + carry;
        r[i] = (u32)s;
        carry = s >> 32;
    }
    fp256_reduce_once(f, r);
}

FIELD_FN void fp256_sub(const fp256_params *f, u32 *r, const u32 *a, const u32 *b) {
    u64 borrow = 0;
    for (int i = 0; i < FP256_LIMBS; i++) {
        u64 d = (u64)a[i] - b[i] - borrow;
        r[i] = (u32)d;
        borrow = (d >> 32) & 1;
    }
    if (borrow) {
        u64 carry = 0;
        for (int i = 0; i < FP256_LIMBS; i++) {
            u64 s = (u64)r[i] + f->p[i] + carry;
            r[i] = (u32)s;
            carry = s >> 32;
        }
    }
}

// Montgomery product a*b*R^{-1} mod p (CIOS). Each t[j] + a*b + c fits in 64 bits:
// (2^32-1) + (2^32-1)^2 + (2^32-1) = 2^64 - 1. The result is written only after both
// inputs are read, so r may alias a or b.
FIELD_FN void fp256_mont_mul(const fp256_params *f, u32 *r, const u32 *a, const u32 *b) {
    u32 t[FP256_LIMBS + 2];
    for (int i = 0; i < FP256_LIMBS + 2; i++) t[i] = 0;
    for (int i = 0; i < FP256_LIMBS; i++) {
        u64 c = 0;
        for (int j = 0; j < FP256_LIMBS; j++) {
            u64 s = (u64)t[j] + (u64)a[j] * b[i] + c;
            t[j] = (u32)s;
            c = s >> 32;
        }
        u64 s = (u64)t[FP256_LIMBS] + c;
        t[FP256_LIMBS] = (u32)s;
        t[FP256_LIMBS + 1] = (u32)(s >> 32);

        u32 m = t[0] * f->inv;
        c = ((u64)t[0] + (u64)m * f->p[0]) >> 32;
        for (int j = 1; j < FP256_LIMBS; j++) {
            u64 s2 = (u64)t[j] + (u64)m * f->p[j] + c;
            t[j - 1] = (u32)s2;
            c = s2 >> 32;
        }
        s = (u64)t[FP256_LIMBS] + c;
        t[FP256_LIMBS - 1] = (u32)s;
        t[FP256_LIMBS] = t[FP256_LIMBS + 1] + (u32)(s >> 32);
    }
    // a, b < p < R give a CIOS result below 2p (< 2^256 here): one subtraction suffices.
    for (int i = 0; i < FP256_LIMBS; i++) r[i] = t[i];
    fp256_reduce_once(f, r);
}

// Canonical in, canonical out: (a*b*R^{-1}) * R^2 * R^{-1} = a*b.
FIELD_FN void fp256_mul(const fp256_params *f, u32 *r, const u32 *a, const u32 *b) {
    u32 t[FP256_LIMBS];
    fp256_mont_mul(f, t, a, b);
    fp256_mont_mul(f, r, t, f->r2);
}

// x^e for a 256-bit exponent (8 little-endian limbs), canonical in and out, 0^0 = 1.
// Square-and-multiply over all 256 bits in the Montgomery domain.
FIELD_FN void fp256_pow(const fp256_params *f, u32 *r, const u32 *x, const u32 *e) {
    u32 one[FP256_LIMBS] = {1, 0, 0, 0, 0, 0, 0, 0};
    u32 xm[FP256_LIMBS], acc[FP256_LIMBS];
    fp256_mont_mul(f, xm, x, f->r2);
    fp256_mont_mul(f, acc, one, f->r2);
    for (int i = 255; i >= 0; i--) {
        fp256_mont_mul(f, acc, acc, acc);
        if ((e[i / 32] >> (i % 32)) & 1u) fp256_mont_mul(f, acc, acc, xm);
    }
    fp256_mont_mul(f, r, acc, one);
}

// out[i] = in[i]^-1 for n >= 1 nonzero elements (8 limbs each; out must not alias in):
// Montgomery's trick, prefix products, one Fermat inversion, back substitution.
FIELD_FN void fp256_batch_inv(const fp256_params *f, u32 *out, const u32 *in, u64 n) {
    for (int k = 0; k < FP256_LIMBS; k++) out[k] = in[k];
    for (u64 i = 1; i < n; i++) fp256_mul(f, out + 8 * i, out + 8 * (i - 1), in + 8 * i);
    u32 inv[FP256_LIMBS], t[FP256_LIMBS];
    fp256_pow(f, inv, out + 8 * (n - 1), f->p_minus_2);
    for (u64 i = n - 1; i > 0; i--) {
        fp256_mul(f, t, inv, out + 8 * (i - 1));
        fp256_mul(f, inv, inv, in + 8 * i);
        for (int k = 0; k < FP256_LIMBS; k++) out[8 * i + k] = t[k];
    }
    for (int k = 0; k < FP256_LIMBS; k++) out[k] = inv[k];
}

#endif
