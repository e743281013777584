// BN254 scalar field r = 0x30644e72e131a029b85045b68181585d2833e84879b97091 43e1f593f0000001,
// elements as 8 little-endian 32-bit limbs in canonical form (< r).
// 32-bit limbs because the GPU's 32-bit multiply-add is native; 64-bit multiply is emulated.
#ifndef GPU_OPS_BN254_FR_CUH
#define GPU_OPS_BN254_FR_CUH
#include "common.cuh"

#define BN254_LIMBS 8

FIELD_CONST u32 BN254_P[BN254_LIMBS] = {0xf0000001u, 0x43e1f593u, 0x79b97091u, 0x2833e848u,
                                        0x8181585du, 0xb85045b6u, 0xe131a029u, 0x30644e72u};
// R^2 mod r, R = 2^256: multiplying a Montgomery product by it restores canonical form.
FIELD_CONST u32 BN254_R2[BN254_LIMBS] = {0xae216da7u, 0x1bb8e645u, 0xe35c59e3u, 0x53fe3ab1u,
                                         0x53bb8085u, 0x8c49833du, 0x7f4e44a5u, 0x0216d0b1u};
// -r^{-1} mod 2^32
#define BN254_INV 0xefffffffu

// r = a - r (limb-wise); returns the final borrow.
FIELD_FN u32 bn254_sub_p(u32 *r, const u32 *a) {
    u64 borrow = 0;
    for (int i = 0; i < BN254_LIMBS; i++) {
        u64 d = (u64)a[i] - BN254_P[i] - borrow;
        r[i] = (u32)d;
        borrow = (d >> 32) & 1;
    }
    return (u32)borrow;
}

// Keeps a if a < r, else a - r. a < 2r is the caller's invariant.
FIELD_FN void bn254_reduce_once(u32 *a) {
    u32 t[BN254_LIMBS];
    if (bn254_sub_p(t, a) == 0) {
        for (int i = 0; i < BN254_LIMBS; i++) a[i] = t[i];
    }
}

FIELD_FN void bn254_add(u32 *r, const u32 *a, const u32 *b) {
    // r < 2^254, so a + b < 2^255 never carries out of 8 limbs.
    u64 carry = 0;
    for (int i = 0; i < BN254_LIMBS; i++) {
        u64 s = (u64)a[i] + b[i] + carry;
        r[i] = (u32)s;
        carry = s >> 32;
    }
    bn254_reduce_once(r);
}

FIELD_FN void bn254_sub(u32 *r, const u32 *a, const u32 *b) {
    u64 borrow = 0;
    for (int i = 0; i < BN254_LIMBS; i++) {
        u64 d = (u64)a[i] - b[i] - borrow;
        r[i] = (u32)d;
        borrow = (d >> 32) & 1;
    }
    if (borrow) {
        u64 carry = 0;
        for (int i = 0; i < BN254_LIMBS; i++) {
            u64 s = (u64)r[i] + BN254_P[i] + carry;
            r[i] = (u32)s;
            carry = s >> 32;
        }
    }
}

// Montgomery product a*b*R^{-1} mod r (CIOS). Each t[j] + a*b + c fits in 64 bits:
// (2^32-1) + (2^32-1)^2 + (2^32-1) = 2^64 - 1.
FIELD_FN void bn254_mont_mul(u32 *r, const u32 *a, const u32 *b) {
    u32 t[BN254_LIMBS + 2];
    for (int i = 0; i < BN254_LIMBS + 2; i++) t[i] = 0;
    for (int i = 0; i < BN254_LIMBS; i++) {
        u64 c = 0;
        for (int j = 0; j < BN254_LIMBS; j++) {
            u64 s = (u64)t[j] + (u64)a[j] * b[i] + c;
            t[j] = (u32)s;
            c = s >> 32;
        }
        u64 s = (u64)t[BN254_LIMBS] + c;
        t[BN254_LIMBS] = (u32)s;
        t[BN254_LIMBS + 1] = (u32)(s >> 32);

        u32 m = t[0] * BN254_INV;
        c = ((u64)t[0] + (u64)m * BN254_P[0]) >> 32;
        for (int j = 1; j < BN254_LIMBS; j++) {
            u64 s2 = (u64)t[j] + (u64)m * BN254_P[j] + c;
            t[j - 1] = (u32)s2;
            c = s2 >> 32;
        }
        s = (u64)t[BN254_LIMBS] + c;
        t[BN254_LIMBS - 1] = (u32)s;
        t[BN254_LIMBS] = t[BN254_LIMBS + 1] + (u32)(s >> 32);
    }
    // 4r < R, so the CIOS result is < 2r and one conditional subtraction suffices.
    for (int i = 0; i < BN254_LIMBS; i++) r[i] = t[i];
    bn254_reduce_once(r);
}

// Canonical in, canonical out: (a*b*R^{-1}) * R^2 * R^{-1} = a*b.
FIELD_FN void bn254_mul(u32 *r, const u32 *a, const u32 *b) {
    u32 t[BN254_LIMBS];
    bn254_mont_mul(t, a, b);
    bn254_mont_mul(r, t, BN254_R2);
}

// x^e for a 256-bit exponent (8 little-endian limbs), canonical in and out, 0^0 = 1.
// Square-and-multiply over all 256 bits in the Montgomery domain (mont_mul writes its
// result only after reading both inputs, so in-place calls are safe).
FIELD_FN void bn254_pow(u32 *r, const u32 *x, const u32 *e) {
    u32 one[BN254_LIMBS] = {1, 0, 0, 0, 0, 0, 0, 0};
    u32 xm[BN254_LIMBS], acc[BN254_LIMBS];
    bn254_mont_mul(xm, x, BN254_R2);
    bn254_mont_mul(acc, one, BN254_R2);
    for (int i = 255; i >= 0; i--) {
        bn254_mont_mul(acc, acc, acc);
        if ((e[i / 32] >> (i % 32)) & 1u) bn254_mont_mul(acc, acc, xm);
    }
    bn254_mont_mul(r, acc, one);
}

// r - 2, the Fermat exponent of an inverse.
FIELD_CONST u32 BN254_P_MINUS_2[BN254_LIMBS] = {0xefffffffu, 0x43e1f593u, 0x79b97091u,
                                                0x2833e848u, 0x8181585du, 0xb85045b6u,
                                                0xe131a029u, 0x30644e72u};

// out[i] = in[i]^-1 for n >= 1 nonzero elements (8 limbs each; out must not alias in):
// Montgomery's trick, prefix products, one Fermat inversion, back substitution.
FIELD_FN void bn254_batch_inv(u32 *out, const u32 *in, u64 n) {
    for (int k = 0; k < BN254_LIMBS; k++) out[k] = in[k];
    for (u64 i = 1; i < n; i++) bn254_mul(out + 8 * i, out + 8 * (i - 1), in + 8 * i);
    u32 inv[BN254_LIMBS], t[BN254_LIMBS];
    bn254_pow(inv, out + 8 * (n - 1), BN254_P_MINUS_2);
    for (u64 i = n - 1; i > 0; i--) {
        bn254_mul(t, inv, out + 8 * (i - 1));
        bn254_mul(inv, inv, in + 8 * i);
        for (int k = 0; k < BN254_LIMBS; k++) out[8 * i + k] = t[k];
    }
    for (int k = 0; k < BN254_LIMBS; k++) out[k] = inv[k];
}

#endif
