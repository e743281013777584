/* Host build of the MSM kernels' bodies (kernels/msm.cuh): digits, a serial counting sort
 * in place of the atomics, the chunked bucket sums level by level, and segment reductions,
 * exactly as the GPU computes them, so CI checks the curve arithmetic and the bucket
 * method against arkworks. With block_windows < windows over precomputed multiples of the
 * points (msm_multiples_of, built here first), as a resident array's MSM runs. curve: 0
 * bn254_g1, 1 bls12_381_g1. out: block_windows * segs Jacobian points of 3N limbs. */
#include <stddef.h>
#include <vector>
#include "../bn254_fq.cuh"
#include "../bls12_381_fq.cuh"
#include "../msm.cuh"

template <int N>
static void msm_partials(const fp_params<N> *f, const u32 *scalars, const u32 *base, size_t n,
                         u32 c, u32 windows, u32 block_windows, u32 seg_len, u32 chunk,
                         u32 *out) {
    u32 nb = 1u << (c - 1), blocks = (windows + block_windows - 1) / block_windows;
    std::vector<u32> multiples((size_t)2 * N * n * blocks);
    for (size_t i = 0; i < n; i++)
        msm_multiples_of<N>(f, base, i, n, blocks, c * block_windows, multiples.data());
    const u32 *points = multiples.data();
    // Each bucket window's digits cover every block's points: n·blocks of them.
    size_t all = n * blocks;
    size_t total = (size_t)block_windows * all, buckets = (size_t)block_windows * nb;
    std::vector<u32> digits(total), counts(buckets, 0), offsets(buckets), entries(total);
    for (size_t i = 0; i < n; i++)
        msm_digits_of(scalars + 8 * i, i, n, c, windows, block_windows, digits.data());
    for (size_t k = 0; k < total; k++) {
        u32 m = digits[k] & ~MSM_NEG;
        if (m) counts[(k / all) * nb + m - 1]++;
    }
    u32 acc = 0;
    for (size_t b = 0; b < buckets; b++) {
        offsets[b] = acc;
        acc += counts[b];
    }
    std::vector<u32> cursor(offsets);
    for (size_t k = 0; k < total; k++) {
        u32 d = digits[k], m = d & ~MSM_NEG;
        if (m) entries[cursor[(k / all) * nb + m - 1]++] = (u32)(k % all) | (d & MSM_NEG);
    }
    std::vector<xyzz<N>> sums(buckets);
    for (auto &s : sums) xyzz_identity(&s);
    // Level 0 over the entries, then the slots each level leaves, until one chunk holds all.
    msm_entry_seq<N> entry_seq = {points, entries.data(), offsets.data(), counts.data(),
                                  buckets, acc};
    size_t len = acc, threads = (len + chunk - 1) / chunk;
    std::vector<u32> keys(2 * threads), next_keys;
    std::vector<xyzz<N>> vals(2 * threads), next_vals;
    for (size_t t = 0; t < threads; t++)
        msm_chunk_sum<N>(f, entry_seq, t, chunk, sums.data(), keys.data(), vals.data());
    while (len > chunk) {
        len = 2 * threads;
        msm_partial_seq<N> seq = {keys.data(), vals.data(), len};
        threads = (len + chunk - 1) / chunk;
        next_keys.assign(2 * threads, 0);
        next_vals.resize(2 * threads);
        for (size_t t = 0; t < threads; t++)
            msm_chunk_sum<N>(f, seq, t, chunk, sums.data(), next_keys.data(), next_vals.data());
        keys.swap(next_keys);
        vals.swap(next_vals);
    }
    u32 segs = (nb + seg_len - 1) / seg_len;
    for (size_t t = 0; t < (size_t)block_windows * segs; t++) {
        u32 w = (u32)(t / segs), s = (u32)(t % segs), start = s * seg_len;
        u32 len = nb - start < seg_len ? nb - start : seg_len;
        msm_segment_reduce<N>(f, sums.data() + (size_t)w * nb, start, len, out + 3 * N * t);
    }
}

extern "C" void gpu_ops_host_msm_partials(int curve, const u32 *scalars, const u32 *points,
                                          size_t n, u32 c, u32 windows, u32 block_windows,
                                          u32 seg_len, u32 chunk, u32 *out) {
    if (curve == 0)
        msm_partials<8>(&BN254_FQ, scalars, points, n, c, windows, block_windows, seg_len, chunk,
                        out);
    else
        msm_partials<12>(&BLS12_381_FQ, scalars, points, n, c, windows, block_windows, seg_len,
                         chunk, out);
}
