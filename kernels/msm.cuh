// The bucket method (Pippenger) for Σ sᵢ·Pᵢ, as per-thread bodies the kernels in msm.cu
// and the host twin (kernels/host/msm_host.cpp) both call:
//   1. digits: each scalar in `windows` signed c-bit digits d ∈ [-2^(c-1), 2^(c-1)]
//      (a digit ≥ 2^(c-1) becomes d - 2^c with a carry into the next window), so each
//      window needs 2^(c-1) buckets, not 2^c - 1; -P costs one field negation.
//   2. sort: entries (point index | sign << 31) grouped by (window, |d|).
//   3. buckets: one thread per bucket adds its points (mixed XYZZ additions).
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

// Digit w of scalar i at digits[w * n + i]: |d| (0: no bucket), sign in bit 31. The top
// window holds at most c - 1 bits (see MsmPlan), so with the carry its digit is at most
// 2^(c-1) and stays positive: no carry is lost.
FIELD_FN void msm_digits_of(const u32 *scalar, u64 i, u64 n, u32 c, u32 windows, u32 *digits) {
    u32 carry = 0, half = 1u << (c - 1);
    for (u32 w = 0; w < windows; w++) {
        u32 raw = msm_window_bits(scalar, w * c, c) + carry;
        u32 d = raw;
        carry = 0;
        if (raw >= half && w + 1 < windows) {
            u32 mag = (1u << c) - raw;  // raw = 2^c gives 0: nothing here, carry on
            d = mag == 0 ? 0 : (mag | MSM_NEG);
            carry = 1;
        }
        digits[(u64)w * n + i] = d;
    }
}

// Bucket b's sum over its `count` entries from `start` of the sorted entries.
template <int N>
FIELD_FN void msm_bucket_sum(const fp_params<N> *f, const u32 *points, const u32 *entries,
                             u32 start, u32 count, xyzz<N> *out) {
    xyzz<N> acc;
    xyzz_identity(&acc);
    for (u32 k = 0; k < count; k++) {
        u32 e = entries[start + k];
        const u32 *x = points + (u64)2 * N * (e & ~MSM_NEG);
        // One call site: the addition is inlined once.
        u32 y[N];
        if (e & MSM_NEG) fp_neg(f, y, x + N);
        else fp_copy<N>(y, x + N);
        xyzz_add_affine(f, &acc, x, y);
    }
    *out = acc;
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
