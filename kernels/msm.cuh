// The bucket method (Pippenger) for Σ sᵢ·Pᵢ, as per-thread bodies the kernels in msm.cu
// and the host twin (kernels/host/msm_host.cpp) both call:
//   1. digits: each scalar in `windows` signed c-bit digits d ∈ [-2^(c-1), 2^(c-1)]
//      (a digit ≥ 2^(c-1) becomes d - 2^c with a carry into the next window), so each
//      window needs 2^(c-1) buckets, not 2^c - 1; -P costs one field negation.
//   2. sort: entries (point index | sign << 31) grouped by (window, |d|).
//   3. buckets: fixed chunks of the sorted entries, one thread each, whatever the
//      buckets' sizes; sums cut by a chunk's edge are finished by further levels.
//   4. reduce: per window segment, Σ_j (start + j + 1)·B[start + j] by a running sum from
//      the top plus start·(Σ B) by double-and-add; out in Jacobian form.
// The host adds the segments of each window and combines the windows (Horner in 2^c).
// Scalars are canonical, 8 little-endian u32 limbs; points affine, Montgomery form.
#ifndef GPU_OPS_MSM_CUH
#define GPU_OPS_MSM_CUH
#include "curve.cuh"

#define MSM_NEG 0x80000000u

// Bits [start, start + c) of a 256-bit scalar, c <= 16.
FIELD_FN u32 msm_window_bits(const u32 *s, u32 start, u32 c) {
    u32 limb = start / 32, shift = start % 32;
    if (limb >= 8) return 0;
    u64 v = s[limb];
    if (limb + 1 < 8) v |= (u64)s[limb + 1] << 32;
    return (u32)(v >> shift) & ((1u << c) - 1);
}

// Scalar i's `windows` digits: |d| (0: no bucket), sign in bit 31. The top window holds
// at most c - 1 bits (see MsmPlan), so with the carry its digit is at most 2^(c-1) and
// stays positive: no carry is lost.
// Over precomputed bases (msm_multiples_of: `blocks` = ceil(windows / block_windows)
// multiples of each point, block j's 2^(c·block_windows·j) times the point) digit w is
// digit w % block_windows of point (w / block_windows)·n + i, so the buckets need only
// block_windows windows: it goes to digits[(w % block_windows)·n·blocks + (w /
// block_windows)·n + i], and the windows past `windows` that fill the last block are 0.
// Without (block_windows = windows) that is digits[w·n + i].
FIELD_FN void msm_digits_of(const u32 *scalar, u64 i, u64 n, u32 c, u32 windows,
                            u32 block_windows, u32 *digits) {
    u32 carry = 0, half = 1u << (c - 1);
    u32 blocks = (windows + block_windows - 1) / block_windows;
    u64 window_stride = n * blocks;
    for (u32 w = 0; w < blocks * block_windows; w++) {
        u32 d = 0;
        if (w < windows) {
            u32 raw = msm_window_bits(scalar, w * c, c) + carry;
            d = raw;
            carry = 0;
            if (raw >= half && w + 1 < windows) {
                u32 mag = (1u << c) - raw;  // raw = 2^c gives 0: nothing here, carry on
                d = mag == 0 ? 0 : (mag | MSM_NEG);
                carry = 1;
            }
        }
        digits[(u64)(w % block_windows) * window_stride + (u64)(w / block_windows) * n + i] = d;
    }
}

// Point i's precomputed multiples: out[j·n + i] = 2^(shift·j)·P_i for j < blocks (affine,
// x then y, Montgomery form; block 0 the point itself). The points are in the prime-order
// subgroup (checked when they arrived), so no multiple is the identity.
template <int N>
FIELD_FN void msm_multiples_of(const fp_params<N> *f, const u32 *points, u64 i, u64 n,
                               u32 blocks, u32 shift, u32 *out) {
    const u32 *p = points + (u64)2 * N * i;
    fp_copy<N>(out + (u64)2 * N * i, p);
    fp_copy<N>(out + (u64)2 * N * i + N, p + N);
    if (blocks < 2 || shift == 0) return;
    // From (x, y, 1, 1). (Not xyzz_double_affine: a caller bound to one block a
    // multiprocessor made ptxas give that shared function more registers, and the bucket
    // sums, which call it with 128, spilled.)
    xyzz<N> acc;
    fp_copy<N>(acc.x, p);
    fp_copy<N>(acc.y, p + N);
    fp_mont_one(f, acc.zz);
    fp_mont_one(f, acc.zzz);
    for (u32 j = 1; j < blocks; j++) {
        for (u32 s = 0; s < shift; s++) xyzz_double(f, &acc);
        xyzz_to_affine(f, &acc, out + (u64)2 * N * ((u64)j * n + i));
    }
}

// Balanced bucket sums. The sorted entries are cut into chunks of `chunk` items, one
// thread each, so no thread adds more than `chunk` points whatever the scalars: all-zero,
// all-one or repeated scalars put ~n entries in one bucket, which a thread per bucket
// would add one by one. A run of one bucket inside a chunk is that bucket's sum. A run cut
// by a chunk's edge is a partial sum, left in one of the chunk's two slots (head: the run
// that began before the chunk; tail: the run that goes on after it); the slots of all
// chunks are the next level's sequence, reduced the same way until one chunk holds all.
#define MSM_NO_KEY 0xFFFFFFFFu

// Level 0: the sorted entries, keyed by bucket (found from the scan's offsets).
template <int N> struct msm_entry_seq {
    const u32 *points, *entries, *offsets, *counts;
    u64 buckets, len;

    // The last bucket whose offset is ≤ k: empty buckets share their successor's offset.
    METHOD_FN u32 key(u64 k) const {
        u64 lo = 0, hi = buckets;
        while (hi - lo > 1) {
            u64 mid = lo + (hi - lo) / 2;
            if (offsets[mid] <= k) lo = mid;
            else hi = mid;
        }
        return (u32)lo;
    }
    METHOD_FN u64 run_end(u64, u32 key, u64 hi) const {
        u64 end = (u64)offsets[key] + counts[key];
        return end < hi ? end : hi;
    }
    METHOD_FN void add(const fp_params<N> *f, xyzz<N> *acc, u64 k) const {
        u32 e = entries[k];
        const u32 *x = points + (u64)2 * N * (e & ~MSM_NEG);
        u32 y[N];
        if (e & MSM_NEG) fp_neg(f, y, x + N);
        else fp_copy<N>(y, x + N);
        xyzz_add_affine(f, acc, x, y);
    }
};

// Later levels: the previous level's slots, keyed explicitly (MSM_NO_KEY: nothing).
template <int N> struct msm_partial_seq {
    const u32 *keys;
    const xyzz<N> *vals;
    u64 len;

    METHOD_FN u32 key(u64 k) const { return keys[k]; }
    METHOD_FN u64 run_end(u64 k, u32 key, u64 hi) const {
        while (k < hi && keys[k] == key) k++;
        return k;
    }
    METHOD_FN void add(const fp_params<N> *f, xyzz<N> *acc, u64 k) const {
        xyzz_add(f, acc, &vals[k]);
    }
};

// Chunk t of `seq`: finished runs into sums[key], cut runs into slots 2t (head) and
// 2t + 1 (tail) of the next level. Returns the additions made (the serial work). Only the
// running sum lives in registers: the slots are written as runs end (BLS12-381's sum with
// two more in registers spills on sm_80).
template <int N, class Seq>
FIELD_FN u32 msm_chunk_sum(const fp_params<N> *f, const Seq &seq, u64 t, u32 chunk,
                           xyzz<N> *sums, u32 *next_keys, xyzz<N> *next_vals) {
    u64 lo = t * chunk, hi = lo + chunk < seq.len ? lo + chunk : seq.len;
    u32 head_key = MSM_NO_KEY, tail_key = MSM_NO_KEY, adds = 0;
    for (u64 k = lo; k < hi;) {
        u32 key = seq.key(k);
        u64 end = seq.run_end(k, key, hi);
        if (key == MSM_NO_KEY) {
            k = end;
            continue;
        }
        bool began_before = k == lo && lo > 0 && seq.key(lo - 1) == key;
        bool goes_on = end == hi && hi < seq.len && seq.key(hi) == key;
        xyzz<N> acc;
        xyzz_identity(&acc);
        adds += (u32)(end - k);
        // One call site: the addition is inlined once.
        for (; k < end; k++) seq.add(f, &acc, k);
        if (began_before) {
            head_key = key;
            next_vals[2 * t] = acc;
        } else if (goes_on) {
            tail_key = key;
            next_vals[2 * t + 1] = acc;
        } else {
            sums[key] = acc;
        }
    }
    // An unused slot takes the other slot's key with the identity, so that every key's
    // items stay contiguous in the next level (a run cut on both sides fills the head).
    if (head_key == MSM_NO_KEY) {
        head_key = tail_key;
        xyzz_identity(&next_vals[2 * t]);
    }
    if (tail_key == MSM_NO_KEY) {
        tail_key = head_key;
        xyzz_identity(&next_vals[2 * t + 1]);
    }
    next_keys[2 * t] = head_key;
    next_keys[2 * t + 1] = tail_key;
    return adds;
}

// Segment [start, start + len) of one window's buckets (bucket k holds digit k + 1):
// Σ_k (k + 1)·B[k], written as 3N Jacobian limbs.
template <int N>
FIELD_FN void msm_segment_reduce(const fp_params<N> *f, const xyzz<N> *buckets, u32 start,
                                 u32 len, u32 *out) {
    xyzz<N> running, acc, scaled;
    xyzz_identity(&running);
    xyzz_identity(&acc);
    xyzz_identity(&scaled);
    for (u32 j = len; j-- > 0;) {
        xyzz_add(f, &running, &buckets[start + j]);
        xyzz_add(f, &acc, &running);
    }
    // acc weighs B[start + j] by j + 1; the missing start·Σ B by double-and-add.
    for (int bit = 31; bit >= 0; bit--) {
        xyzz_double(f, &scaled);
        if ((start >> bit) & 1u) xyzz_add(f, &scaled, &running);
    }
    xyzz_add(f, &acc, &scaled);
    xyzz_to_jacobian(f, &acc, out);
}

#endif
