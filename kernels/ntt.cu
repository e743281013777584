// Radix-2 NTT over batches of equal power-of-two polynomials, in place:
//   [scale] -> bit-reverse -> log2(n) Cooley-Tukey stages -> [scale]
// The launcher (src/ops/zk/gpu.rs) uploads the twiddles w^k (k < n/2) and the scaling
// table (coset powers, n^-1) computed by the CPU twin, and permutes for bit-reversed
// input or output with the same bit-reverse kernel.
#include "bn254_fr.cuh"
#include "bls12_381_fr.cuh"
#include "goldilocks.cuh"
#include "babybear.cuh"

#define GRID_STRIDE(i, n)                                                                 \
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n);                     \
         i += (u64)gridDim.x * blockDim.x)

FIELD_FN u64 ntt_bitrev(u64 k, u32 bits) {
    u64 r = 0;
    for (u32 b = 0; b < bits; b++) r |= ((k >> b) & 1ull) << (bits - 1 - b);
    return r;
}

// Index of butterfly t: polynomial, pair (i0, i1 = i0 + half) and twiddle index.
#define BUTTERFLY_INDEX(t, n, half, i0, i1, w)                                            \
    u64 poly = (t) / ((n) / 2), k = (t) % ((n) / 2), j = k % (half);                       \
    u64 i0 = poly * (n) + (k / (half)) * 2 * (half) + j, i1 = i0 + (half);                 \
    u64 w = j * ((n) / (2 * (half)))

// 256-bit fields: 8 u32 limbs per element.
#define FP256_NTT_SCALE(NAME, F)                                                          \
    extern "C" __global__ void NAME(u32 *x, const u32 *s, u64 n, u64 total) {              \
        GRID_STRIDE(i, total) { fp_mul(&F, x + 8 * i, x + 8 * i, s + 8 * (i % n)); }    \
    }
#define FP256_NTT_BITREV(NAME)                                                            \
    extern "C" __global__ void NAME(u32 *x, u64 n, u32 log_n, u64 total) {                 \
        GRID_STRIDE(i, total) {                                                           \
            u64 k = i % n, r = ntt_bitrev(k, log_n);                                      \
            if (k < r) {                                                                  \
                u32 *a = x + 8 * i, *b = x + 8 * (i - k + r);                             \
                for (int l = 0; l < 8; l++) { u32 t = a[l]; a[l] = b[l]; b[l] = t; }      \
            }                                                                             \
        }                                                                                 \
    }
#define FP256_NTT_STAGE(NAME, F)                                                          \
    extern "C" __global__ void NAME(u32 *x, const u32 *tw, u64 n, u64 half, u64 total) {   \
        GRID_STRIDE(t, total) {                                                           \
            BUTTERFLY_INDEX(t, n, half, i0, i1, w);                                       \
            u32 u[8], v[8];                                                               \
            for (int l = 0; l < 8; l++) u[l] = x[8 * i0 + l];                             \
            fp_mul(&F, v, x + 8 * i1, tw + 8 * w);                                     \
            fp_add(&F, x + 8 * i0, u, v);                                              \
            fp_sub(&F, x + 8 * i1, u, v);                                              \
        }                                                                                 \
    }

FP256_NTT_SCALE(bn254_fr_ntt_scale, BN254_FR)
FP256_NTT_BITREV(bn254_fr_ntt_bitrev)
FP256_NTT_STAGE(bn254_fr_ntt_stage, BN254_FR)
FP256_NTT_SCALE(bls12_381_fr_ntt_scale, BLS12_381_FR)
FP256_NTT_BITREV(bls12_381_fr_ntt_bitrev)
FP256_NTT_STAGE(bls12_381_fr_ntt_stage, BLS12_381_FR)

// One-word fields.
#define WORD_NTT_SCALE(NAME, T, MUL)                                                      \
    extern "C" __global__ void NAME(T *x, const T *s, u64 n, u64 total) {                  \
        GRID_STRIDE(i, total) { x[i] = MUL(x[i], s[i % n]); }                             \
    }
#define WORD_NTT_BITREV(NAME, T)                                                          \
    extern "C" __global__ void NAME(T *x, u64 n, u32 log_n, u64 total) {                   \
        GRID_STRIDE(i, total) {                                                           \
            u64 k = i % n, r = ntt_bitrev(k, log_n);                                      \
            if (k < r) { T t = x[i]; x[i] = x[i - k + r]; x[i - k + r] = t; }             \
        }                                                                                 \
    }
#define WORD_NTT_STAGE(NAME, T, ADD, SUB, MUL)                                            \
    extern "C" __global__ void NAME(T *x, const T *tw, u64 n, u64 half, u64 total) {       \
        GRID_STRIDE(t, total) {                                                           \
            BUTTERFLY_INDEX(t, n, half, i0, i1, w);                                       \
            T u = x[i0], v = MUL(x[i1], tw[w]);                                           \
            x[i0] = ADD(u, v);                                                            \
            x[i1] = SUB(u, v);                                                            \
        }                                                                                 \
    }

WORD_NTT_SCALE(goldilocks_ntt_scale, u64, gl_mul)
WORD_NTT_BITREV(goldilocks_ntt_bitrev, u64)
WORD_NTT_STAGE(goldilocks_ntt_stage, u64, gl_add, gl_sub, gl_mul)
WORD_NTT_SCALE(babybear_ntt_scale, u32, bb_mul)
WORD_NTT_BITREV(babybear_ntt_bitrev, u32)
WORD_NTT_STAGE(babybear_ntt_stage, u32, bb_add, bb_sub, bb_mul)
