// Element-wise field vector ops: out[i] = a[i] (op) b[i * b_stride], b_stride 1 for equal
// lengths and 0 to broadcast a single b; pow with 256-bit exponents; batch inversion.
#include "bn254_fr.cuh"
#include "bls12_381_fr.cuh"
#include "goldilocks.cuh"
#include "babybear.cuh"

#define GRID_STRIDE(i, n)                                                                 \
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n);                     \
         i += (u64)gridDim.x * blockDim.x)

// Every kernel here is a grid-stride loop over DeviceLease::launch_config's blocks
// (src/ops/zk/gpu.rs): LAUNCH_CONFIG_THREADS threads each.

// 256-bit fields: an element is two uint4 (8 limbs).
#define FP256_BINARY(NAME, FN, F)                                                         \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        NAME(const uint4 *a, const uint4 *b, uint4 *out, u64 n, u32 b_stride) {           \
        GRID_STRIDE(i, n) {                                                               \
            u64 j = i * b_stride;                                                         \
            uint4 a0 = a[2 * i], a1 = a[2 * i + 1], b0 = b[2 * j], b1 = b[2 * j + 1];     \
            u32 x[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};                  \
            u32 y[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};                  \
            u32 r[8];                                                                     \
            FN(&F, r, x, y);                                                              \
            out[2 * i] = make_uint4(r[0], r[1], r[2], r[3]);                              \
            out[2 * i + 1] = make_uint4(r[4], r[5], r[6], r[7]);                          \
        }                                                                                 \
    }

#define FP256_POW(NAME, F)                                                                \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        NAME(const u32 *base, const u32 *exp, u32 *out, u64 n, u32 e_stride) {            \
        GRID_STRIDE(i, n) { fp_pow(&F, out + 8 * i, base + 8 * i, exp + 8 * i * e_stride); } \
    }

// Batch inversion: each thread inverts its own chunk of `chunk` consecutive elements
// with Montgomery's trick (one Fermat inversion per chunk). Inputs are nonzero.
#define CHUNKS(c, n, chunk) GRID_STRIDE(c, ((n) + (chunk) - 1) / (chunk))
#define CHUNK_LEN(c, n, chunk) ((n) - (c) * (chunk) < (chunk) ? (n) - (c) * (chunk) : (chunk))

#define FP256_INV(NAME, F)                                                                \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        NAME(const u32 *in, u32 *out, u64 n, u64 chunk) {                                 \
        CHUNKS(c, n, chunk) {                                                             \
            u64 s = c * chunk;                                                            \
            fp_batch_inv(&F, out + 8 * s, in + 8 * s, CHUNK_LEN(c, n, chunk));          \
        }                                                                                 \
    }

FP256_BINARY(bn254_fr_add, fp_add, BN254_FR)
FP256_BINARY(bn254_fr_sub, fp_sub, BN254_FR)
FP256_BINARY(bn254_fr_mul, fp_mul, BN254_FR)
FP256_POW(bn254_fr_pow, BN254_FR)
FP256_INV(bn254_fr_inv, BN254_FR)

FP256_BINARY(bls12_381_fr_add, fp_add, BLS12_381_FR)
FP256_BINARY(bls12_381_fr_sub, fp_sub, BLS12_381_FR)
FP256_BINARY(bls12_381_fr_mul, fp_mul, BLS12_381_FR)
FP256_POW(bls12_381_fr_pow, BLS12_381_FR)
FP256_INV(bls12_381_fr_inv, BLS12_381_FR)

// One-word fields: T is the element type; exponents are 256-bit in EW-wide words.
#define WORD_BINARY(NAME, T, FN)                                                          \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        NAME(const T *a, const T *b, T *out, u64 n, u32 b_stride) {                       \
        GRID_STRIDE(i, n) { out[i] = FN(a[i], b[i * b_stride]); }                         \
    }

#define WORD_POW(NAME, T, EW, FN)                                                         \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        NAME(const T *base, const T *exp, T *out, u64 n, u32 e_stride) {                  \
        GRID_STRIDE(i, n) { out[i] = FN(base[i], exp + (EW) * i * e_stride); }            \
    }

#define WORD_INV(NAME, T, FN)                                                             \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        NAME(const T *in, T *out, u64 n, u64 chunk) {                                     \
        CHUNKS(c, n, chunk) {                                                             \
            u64 s = c * chunk;                                                            \
            FN(out + s, in + s, CHUNK_LEN(c, n, chunk));                                  \
        }                                                                                 \
    }

WORD_BINARY(goldilocks_add, u64, gl_add)
WORD_BINARY(goldilocks_sub, u64, gl_sub)
WORD_BINARY(goldilocks_mul, u64, gl_mul)
WORD_POW(goldilocks_pow, u64, 4, gl_pow)
WORD_INV(goldilocks_inv, u64, gl_batch_inv)

WORD_BINARY(babybear_add, u32, bb_add)
WORD_BINARY(babybear_sub, u32, bb_sub)
WORD_BINARY(babybear_mul, u32, bb_mul)
WORD_POW(babybear_pow, u32, 8, bb_pow)
WORD_INV(babybear_inv, u32, bb_batch_inv)
