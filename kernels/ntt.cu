// Radix-2 NTT over batches of equal power-of-two polynomials, in place:
//   [scale] -> bit-reverse -> tile stages (shared memory) -> wide stages -> [scale]
// The first log2(tile) stages of every tile run in one launch out of shared memory (one
// global read and write for up to 13 stages); the stages wider than a tile run one
// launch each. The launcher (src/ops/zk/gpu.rs) keeps the twiddles ω^k (k < n/2) and the
// scaling table (coset powers, n^-1) on the device per (field, size, direction, shift),
// and permutes for bit-reversed input or output with the same bit-reverse kernel.
#include "ntt.cuh"

// The tile kernel's largest block: a thread per butterfly of the largest tile, which the
// launcher caps at NTT_TILE_THREADS (tile_plan in src/ops/zk/gpu.rs). The other three are
// grid-stride loops over DeviceLease::launch_config's blocks.
#define NTT_TILE_THREADS 512

#define GRID_STRIDE(i, n)                                                                 \
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n);                     \
         i += (u64)gridDim.x * blockDim.x)

// W: words of T per element. BUTTERFLY(a, b, w) on element pointers.
#define NTT_KERNELS(SCALE, BITREV, STAGE, TILE, T, W, MUL_BY, BUTTERFLY)                 \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        SCALE(T *x, const T *s, u64 n, u64 total) {                                       \
        GRID_STRIDE(i, total) { MUL_BY(x + W * i, s + W * (i % n)); }                     \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        BITREV(T *x, u64 n, u32 log_n, u64 total) {                                       \
        GRID_STRIDE(i, total) {                                                           \
            u64 k = i % n, r = ntt_bitrev(k, log_n);                                      \
            if (k < r) {                                                                  \
                T *a = x + W * i, *b = x + W * (i - k + r);                               \
                for (int l = 0; l < W; l++) { T t = a[l]; a[l] = b[l]; b[l] = t; }        \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        STAGE(T *x, const T *tw, u64 n, u64 half, u64 total) {                            \
        GRID_STRIDE(t, total / 2) {                                                       \
            u64 i0, w;                                                                    \
            ntt_stage_pair(t, n, half, &i0, &w);                                          \
            BUTTERFLY(x + W * i0, x + W * (i0 + half), tw + W * w);                       \
        }                                                                                 \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(NTT_TILE_THREADS)                        \
        TILE(T *x, const T *tw, u64 n, u32 log_tile, u64 tiles) {                         \
        extern __shared__ __align__(16) unsigned char ntt_shared[];                       \
        T *sh = (T *)ntt_shared;                                                          \
        u32 tile = 1u << log_tile;                                                        \
        for (u64 b = blockIdx.x; b < tiles; b += gridDim.x) {                             \
            T *g = x + (u64)W * tile * b;                                                 \
            for (u32 i = threadIdx.x; i < W * tile; i += blockDim.x) sh[i] = g[i];        \
            __syncthreads();                                                              \
            for (u32 half = 1; half < tile; half <<= 1) {                                 \
                for (u32 k = threadIdx.x; k < tile / 2; k += blockDim.x) {                \
                    u32 i0;                                                               \
                    u64 w;                                                                \
                    ntt_tile_pair(k, half, n, &i0, &w);                                   \
                    BUTTERFLY(sh + W * i0, sh + W * (i0 + half), tw + W * w);             \
                }                                                                         \
                __syncthreads();                                                          \
            }                                                                             \
            for (u32 i = threadIdx.x; i < W * tile; i += blockDim.x) g[i] = sh[i];        \
            __syncthreads();                                                              \
        }                                                                                 \
    }

#define BN254_MUL_BY(a, s) fp_mont_mul(&BN254_FR, a, a, s)
#define BN254_BUTTERFLY(a, b, w) fp_butterfly(&BN254_FR, a, b, w)
#define BLS_MUL_BY(a, s) fp_mont_mul(&BLS12_381_FR, a, a, s)
#define BLS_BUTTERFLY(a, b, w) fp_butterfly(&BLS12_381_FR, a, b, w)
#define GL_MUL_BY(a, s) (*(a) = gl_mul(*(a), *(s)))
#define BB_MUL_BY(a, s) (*(a) = bb_mul(*(a), *(s)))

NTT_KERNELS(bn254_fr_ntt_scale, bn254_fr_ntt_bitrev, bn254_fr_ntt_stage, bn254_fr_ntt_tile,
            u32, 8, BN254_MUL_BY, BN254_BUTTERFLY)
NTT_KERNELS(bls12_381_fr_ntt_scale, bls12_381_fr_ntt_bitrev, bls12_381_fr_ntt_stage,
            bls12_381_fr_ntt_tile, u32, 8, BLS_MUL_BY, BLS_BUTTERFLY)
NTT_KERNELS(goldilocks_ntt_scale, goldilocks_ntt_bitrev, goldilocks_ntt_stage,
            goldilocks_ntt_tile, u64, 1, GL_MUL_BY, gl_butterfly)
NTT_KERNELS(babybear_ntt_scale, babybear_ntt_bitrev, babybear_ntt_stage, babybear_ntt_tile,
            u32, 1, BB_MUL_BY, bb_butterfly)
