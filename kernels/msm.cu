// MSM kernels (bodies in msm.cuh). The launcher (src/ops/zk/msm_gpu.rs) runs, per chunk
// of points and per scalar vector: msm_digits -> msm_count -> msm_scan -> msm_scatter ->
// <curve>_msm_buckets -> <curve>_msm_partials (once per further level) ->
// <curve>_msm_reduce, then combines the segments on the host. A resident point array's
// multiples (<curve>_msm_multiples) are built once, before its first MSM on a device.
#include "bn254_fq.cuh"
#include "bls12_381_fq.cuh"
#include "msm.cuh"

// msm_scan runs as one block of MSM_SCAN_THREADS (its shared array's size); every other
// kernel is a grid-stride loop over DeviceLease::launch_config's blocks.
#define MSM_SCAN_THREADS 1024

#define GRID_STRIDE(i, n)                                                                 \
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n);                     \
         i += (u64)gridDim.x * blockDim.x)

extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    msm_digits(const u32 *scalars, u64 n, u32 c, u32 windows, u32 block_windows,
               u32 *digits) {
    GRID_STRIDE(i, n) {
        msm_digits_of(scalars + 8 * i, i, n, c, windows, block_windows, digits);
    }
}

// counts[w * nb + |d| - 1] += 1 for every nonzero digit.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    msm_count(const u32 *digits, u64 total, u64 n, u32 nb, u32 *counts) {
    GRID_STRIDE(k, total) {
        u32 m = digits[k] & ~MSM_NEG;
        if (m) atomicAdd(&counts[(k / n) * nb + m - 1], 1u);
    }
}

// Exclusive prefix sum of len counts, in one block: each thread sums a contiguous run,
// the block scans the run totals, then each thread writes its run's offsets.
extern "C" __global__ void __launch_bounds__(MSM_SCAN_THREADS)
    msm_scan(const u32 *counts, u32 *offsets, u64 len) {
    __shared__ u32 totals[MSM_SCAN_THREADS];
    u64 run = (len + blockDim.x - 1) / blockDim.x;
    u64 lo = threadIdx.x * run, hi = lo + run < len ? lo + run : len;
    u32 sum = 0;
    for (u64 k = lo; k < hi; k++) sum += counts[k];
    totals[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 acc = 0;
        for (u32 t = 0; t < blockDim.x; t++) {
            u32 v = totals[t];
            totals[t] = acc;
            acc += v;
        }
    }
    __syncthreads();
    u32 acc = totals[threadIdx.x];
    for (u64 k = lo; k < hi; k++) {
        offsets[k] = acc;
        acc += counts[k];
    }
}

// entries[cursor[bucket]++] = i | sign. The order inside a bucket varies from run to run;
// point addition is exact, so the sum does not.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    msm_scatter(const u32 *digits, u64 total, u64 n, u32 nb, u32 *cursor, u32 *entries) {
    GRID_STRIDE(k, total) {
        u32 d = digits[k], m = d & ~MSM_NEG;
        if (m) {
            u32 pos = atomicAdd(&cursor[(k / n) * nb + m - 1], 1u);
            entries[pos] = (u32)(k % n) | (d & MSM_NEG);
        }
    }
}

// Level 0 of the bucket sums over the sorted entries (msm_chunk_sum in msm.cuh): the
// launcher sizes `threads` for every digit being nonzero; the scan's total says how many
// are. most_adds[0] gets the largest number of additions one thread made.
#define MSM_BUCKETS(NAME, N, F)                                                           \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        NAME(const u32 *points, const u32 *entries, const u32 *offsets, const u32 *counts, \
             u64 buckets, u64 threads, u32 chunk, u32 *sums, u32 *next_keys,              \
             u32 *next_vals, u32 *most_adds) {                                            \
        msm_entry_seq<N> seq = {points,  entries, offsets, counts, buckets,               \
                                (u64)offsets[buckets - 1] + counts[buckets - 1]};         \
        GRID_STRIDE(t, threads) {                                                         \
            u32 adds = msm_chunk_sum<N>(&F, seq, t, chunk, (xyzz<N> *)sums, next_keys,    \
                                        (xyzz<N> *)next_vals);                            \
            atomicMax(most_adds, adds);                                                   \
        }                                                                                 \
    }

// A later level over the previous level's `len` slots; most_adds[level] as above. Told
// only its block, ptxas held the BN254 one to 128 registers (two blocks a multiprocessor)
// and spilled 104-116 bytes (NVRTC 12.9 and 13.0, sm_80 and sm_90); one block of
// LAUNCH_CONFIG_THREADS a multiprocessor is all it needs, and it then keeps 166
// registers and spills nothing. (Most kernels keep the one-argument bound: for them the
// second argument only makes ptxas spend registers, matmul_f32's 64 becoming 112.)
#define MSM_PARTIALS(NAME, N, F)                                                          \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS, 1)                \
        NAME(const u32 *keys, const u32 *vals, u64 len, u32 chunk, u32 *sums,             \
             u32 *next_keys, u32 *next_vals, u32 *most_adds, u32 level) {                 \
        msm_partial_seq<N> seq = {keys, (const xyzz<N> *)vals, len};                      \
        GRID_STRIDE(t, (len + chunk - 1) / chunk) {                                       \
            u32 adds = msm_chunk_sum<N>(&F, seq, t, chunk, (xyzz<N> *)sums, next_keys,    \
                                        (xyzz<N> *)next_vals);                            \
            atomicMax(most_adds + level, adds);                                           \
        }                                                                                 \
    }

#define MSM_REDUCE(NAME, N, F)                                                            \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        NAME(const u32 *buckets, u32 nb, u32 windows, u32 seg_len, u32 *out) {            \
        u32 segs = (nb + seg_len - 1) / seg_len;                                          \
        GRID_STRIDE(t, (u64)windows * segs) {                                             \
            u32 w = (u32)(t / segs), s = (u32)(t % segs), start = s * seg_len;             \
            u32 len = nb - start < seg_len ? nb - start : seg_len;                        \
            msm_segment_reduce<N>(&F, (const xyzz<N> *)buckets + (u64)w * nb, start, len,  \
                                  out + 3 * N * t);                                       \
        }                                                                                 \
    }

// A resident point array's precomputed multiples (msm_multiples_of), built once and kept
// in the device's table cache. Bound as the partials are: the doublings and the
// inversion keep many field elements live.
#define MSM_MULTIPLES(NAME, N, F)                                                         \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS, 1)                \
        NAME(const u32 *points, u64 n, u32 blocks, u32 shift, u32 *out) {                 \
        GRID_STRIDE(i, n) { msm_multiples_of<N>(&F, points, i, n, blocks, shift, out); }  \
    }

MSM_MULTIPLES(bn254_g1_msm_multiples, 8, BN254_FQ)
MSM_MULTIPLES(bls12_381_g1_msm_multiples, 12, BLS12_381_FQ)
MSM_BUCKETS(bn254_g1_msm_buckets, 8, BN254_FQ)
MSM_PARTIALS(bn254_g1_msm_partials, 8, BN254_FQ)
MSM_REDUCE(bn254_g1_msm_reduce, 8, BN254_FQ)
MSM_BUCKETS(bls12_381_g1_msm_buckets, 12, BLS12_381_FQ)
MSM_PARTIALS(bls12_381_g1_msm_partials, 12, BLS12_381_FQ)
MSM_REDUCE(bls12_381_g1_msm_reduce, 12, BLS12_381_FQ)
