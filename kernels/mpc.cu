// Shamir secret sharing over every scalar field (ops/mpc/shamir.rs is the CPU twin):
// - `*_shamir_eval`: out[i*m + j] = Σ_k coeffs[k*m + j] · xs[i]^k by Horner, every secret's
//   polynomial at each holder's point (split);
// - `*_shamir_combine`: out[q*m + j] = Σ_i w[q*k + i] · ys[i*m + j], weighted sums of whole
//   share vectors (combine: Lagrange weights at 0 and at the points being checked).
// One thread per secret j, looping over points and weight rows, so a warp's reads and
// writes are consecutive elements. For the 256-bit fields the host passes xs and w in
// Montgomery form (v·2^256 mod p): a CIOS product of a canonical value and a Montgomery
// form is the canonical product, one product per step and no conversions.
#include "bn254_fr.cuh"
#include "bls12_381_fr.cuh"
#include "goldilocks.cuh"
#include "babybear.cuh"

// Every kernel here is a grid-stride loop over DeviceLease::launch_config's blocks
// (src/ops/mpc/gpu.rs).
#define MPC_GRID_STRIDE(i, n)                                                             \
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n);                     \
         i += (u64)gridDim.x * blockDim.x)

#define FP256_SHAMIR(EVAL, COMBINE, F)                                                    \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        EVAL(const u32 *coeffs, const u32 *xs, u32 *out, u64 m, u32 t, u32 n) {           \
        MPC_GRID_STRIDE(j, m) {                                                           \
            for (u32 i = 0; i < n; i++) {                                                 \
                u32 y[8];                                                                 \
                const u32 *top = coeffs + 8 * ((u64)(t - 1) * m + j);                     \
                for (int l = 0; l < 8; l++) y[l] = top[l];                                \
                for (int k = (int)t - 2; k >= 0; k--) {                                   \
                    fp_mont_mul(&F, y, y, xs + 8 * i);                                    \
                    fp_add(&F, y, y, coeffs + 8 * ((u64)k * m + j));                      \
                }                                                                         \
                u32 *o = out + 8 * ((u64)i * m + j);                                      \
                for (int l = 0; l < 8; l++) o[l] = y[l];                                  \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        COMBINE(const u32 *ys, const u32 *w, u32 *out, u64 m, u32 k, u32 rows) {          \
        MPC_GRID_STRIDE(j, m) {                                                           \
            for (u32 q = 0; q < rows; q++) {                                              \
                u32 acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                    \
                u32 term[8];                                                              \
                for (u32 i = 0; i < k; i++) {                                             \
                    fp_mont_mul(&F, term, ys + 8 * ((u64)i * m + j), w + 8 * ((u64)q * k + i)); \
                    fp_add(&F, acc, acc, term);                                           \
                }                                                                         \
                u32 *o = out + 8 * ((u64)q * m + j);                                      \
                for (int l = 0; l < 8; l++) o[l] = acc[l];                                \
            }                                                                             \
        }                                                                                 \
    }

// One-word fields: canonical in and out, xs and w canonical too. Told only its block,
// ptxas spilled 8 bytes of EVAL on sm_80 (NVRTC 12.9 and 13.0) to fit more blocks a
// multiprocessor; with one block as the least it needs it keeps 40-52 registers and spills
// nothing (as msm.cu's MSM_PARTIALS).
#define WORD_SHAMIR(EVAL, COMBINE, T, ADD, MUL)                                           \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS, 1)                \
        EVAL(const T *coeffs, const T *xs, T *out, u64 m, u32 t, u32 n) {                 \
        MPC_GRID_STRIDE(j, m) {                                                           \
            for (u32 i = 0; i < n; i++) {                                                 \
                T y = coeffs[(u64)(t - 1) * m + j];                                       \
                for (int k = (int)t - 2; k >= 0; k--) y = ADD(MUL(y, xs[i]), coeffs[(u64)k * m + j]); \
                out[(u64)i * m + j] = y;                                                  \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        COMBINE(const T *ys, const T *w, T *out, u64 m, u32 k, u32 rows) {                \
        MPC_GRID_STRIDE(j, m) {                                                           \
            for (u32 q = 0; q < rows; q++) {                                              \
                T acc = 0;                                                                \
                for (u32 i = 0; i < k; i++) acc = ADD(acc, MUL(ys[(u64)i * m + j], w[(u64)q * k + i])); \
                out[(u64)q * m + j] = acc;                                                \
            }                                                                             \
        }                                                                                 \
    }

FP256_SHAMIR(bn254_fr_shamir_eval, bn254_fr_shamir_combine, BN254_FR)
FP256_SHAMIR(bls12_381_fr_shamir_eval, bls12_381_fr_shamir_combine, BLS12_381_FR)
WORD_SHAMIR(goldilocks_shamir_eval, goldilocks_shamir_combine, u64, gl_add, gl_mul)
WORD_SHAMIR(babybear_shamir_eval, babybear_shamir_combine, u32, bb_add, bb_mul)

// Secure aggregation's unmasking (ops/mpc/secagg/masks.rs is the CPU twin): out[i] ±=
// word i of each mask's ChaCha20 key stream (RFC 8439 block function, counter = i / 16,
// zero nonce), mod 2^32. One thread per 16-word block: it runs the block function once
// per mask and touches its 16 words of `out` once per launch. The host launches it over
// groups of masks, `out` holding the running result.
#include "dp_noise.cuh"

extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    secagg_unmask(u32 *out, const u32 *keys, const u32 *subtract, u32 terms, u64 len) {
    u64 blocks = (len + 15) / 16;
    MPC_GRID_STRIDE(b, blocks) {
        u64 first = b * 16;
        u32 count = len - first < 16 ? (u32)(len - first) : 16;
        u32 acc[16];
        for (u32 i = 0; i < count; i++) acc[i] = out[first + i];
        u32 words[16];
        for (u32 t = 0; t < terms; t++) {
            dp_chacha20_block(keys + 8 * (u64)t, (u32)b, 0, 0, 0, words);
            if (subtract[t]) {
                for (u32 i = 0; i < count; i++) acc[i] -= words[i];
            } else {
                for (u32 i = 0; i < count; i++) acc[i] += words[i];
            }
        }
        for (u32 i = 0; i < count; i++) out[first + i] = acc[i];
    }
}
