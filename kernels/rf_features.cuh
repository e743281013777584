// The heavy half of RF feature extraction, per chunk of a recording: the Welch sums
// (over the chunk's non-overlapping Hann segments, Σ|FFT|² per bin in natural order, in
// f64) and the envelope sums (Σ|x|², Σ|x|, max |x|², sign changes of the real part). The
// CPU twin is src/ops/rf/features.rs::chunk_sums; the features themselves are derived
// from these sums on the CPU (features::extract_from_sums), so a chunk sends back
// seg + 4 numbers instead of its samples.
//
// One block per chunk. Each segment is windowed into shared memory in bit-reversed
// order and transformed by an iterative radix-2 FFT (decimation in time, twiddles
// e^{−2πim/seg} computed in f64 on the host and rounded to f32), every product and sum
// a separate f32 rounding. The segments are summed in order, so a chunk's bins do not
// depend on the launch shape; kernels/host/rf_host.cpp runs the same functions with one
// "thread" for the parity test against rustfft.
#ifndef GPU_OPS_RF_FEATURES_CUH
#define GPU_OPS_RF_FEATURES_CUH

#include "rf.cuh"

// Threads per block (a power of two, for the envelope's tree sum).
#define RF_REDUCE_THREADS 256

// A block's barrier on the device and on the emulated device (kernels/emu/cuda_emu.h);
// nothing in the host build, where one "thread" does a block's work.
#if defined(GPU_OPS_DEVICE) || defined(GPU_OPS_CUDA_EMU_H)
#define RF_SYNC() __syncthreads()
#else
#define RF_SYNC()
#endif

#ifdef GPU_OPS_DEVICE
#define RF_BITREV(j, bits) (__brev(j) >> (32 - (bits)))
#else
#define RF_BITREV(j, bits) rf_host_bitrev((j), (bits))
static inline u32 rf_host_bitrev(u32 j, u32 bits) {
    u32 r = 0;
    for (u32 b = 0; b < bits; b++) r |= ((j >> b) & 1u) << (bits - 1 - b);
    return r;
}
#endif

// One chunk: complex samples [start, start + len) of the interleaved recordings.
struct rf_chunk {
    u64 start;
    u64 len;
};

// Segment x (interleaved, seg samples) windowed into re/im in bit-reversed order.
FIELD_FN void rf_load_segment(float *re, float *im, const float *x, const float *window, u32 seg,
                              u32 bits, u32 tid, u32 threads) {
    for (u32 j = tid; j < seg; j += threads) {
        u32 r = RF_BITREV(j, bits);
        re[r] = FMUL(x[2 * j], window[j]);
        im[r] = FMUL(x[2 * j + 1], window[j]);
    }
}

// Butterfly b of the stage whose pairs are `half` apart: (a, c) → (a + w·c, a − w·c),
// w = e^{−2πi·pos/(2·half)} = tw[pos·step].
FIELD_FN void rf_butterfly(float *re, float *im, const float *tw, u32 b, u32 half, u32 step) {
    u32 pos = b & (half - 1);
    u32 i0 = ((b - pos) << 1) + pos, i1 = i0 + half;
    float wr = tw[2 * pos * step], wi = tw[2 * pos * step + 1];
    float xr = re[i1], xi = im[i1];
    float tr = FSUB(FMUL(wr, xr), FMUL(wi, xi)), ti = FADD(FMUL(wr, xi), FMUL(wi, xr));
    float ar = re[i0], ai = im[i0];
    re[i0] = FADD(ar, tr);
    im[i0] = FADD(ai, ti);
    re[i1] = FSUB(ar, tr);
    im[i1] = FSUB(ai, ti);
}

// The FFT of the loaded segment, in place (natural order out).
FIELD_FN void rf_fft_stages(float *re, float *im, const float *tw, u32 seg, u32 tid, u32 threads) {
    for (u32 half = 1, step = seg / 2; half < seg; half <<= 1, step >>= 1) {
        for (u32 b = tid; b < seg / 2; b += threads) rf_butterfly(re, im, tw, b, half, step);
        RF_SYNC();
    }
}

// A chunk's bins: Σ over its segments, in order, of |X|² (|X|² in f32, as the CPU's
// norm_sqr, summed in f64). Bin j belongs to thread j mod threads throughout, so no two
// threads touch one. re/im hold seg floats each.
FIELD_FN void rf_chunk_bins(const float *rec, rf_chunk c, const float *window, const float *tw,
                            u32 seg, u32 bits, float *re, float *im, double *bins, u32 tid,
                            u32 threads) {
    for (u32 j = tid; j < seg; j += threads) bins[j] = 0.0;
    u64 k = c.len / seg;
    for (u64 s = 0; s < k; s++) {
        rf_load_segment(re, im, rec + 2 * (c.start + s * seg), window, seg, bits, tid, threads);
        RF_SYNC();
        rf_fft_stages(re, im, tw, seg, tid, threads);
        for (u32 j = tid; j < seg; j += threads)
            bins[j] = DADD(bins[j], (double)FADD(FMUL(re[j], re[j]), FMUL(im[j], im[j])));
        RF_SYNC();
    }
}

// This thread's share of a chunk's envelope sums: samples tid, tid + threads, ...; a
// sign change is counted at the later sample of each consecutive pair.
struct rf_envelope {
    double power_sum;
    double magnitude_sum;
    float power_max;
    u64 crossings;
};

FIELD_FN rf_envelope rf_envelope_part(const float *rec, rf_chunk c, u32 tid, u32 threads) {
    rf_envelope e = {0.0, 0.0, 0.0f, 0};
    const float *x = rec + 2 * c.start;
    for (u64 i = tid; i < c.len; i += threads) {
        float xr = x[2 * i], xi = x[2 * i + 1];
        float v = FADD(FMUL(xr, xr), FMUL(xi, xi));
        e.power_sum = DADD(e.power_sum, (double)v);
        e.magnitude_sum = DADD(e.magnitude_sum, (double)FSQRT(v));
        if (v > e.power_max) e.power_max = v;
        if (i > 0 && ((x[2 * (i - 1)] >= 0.0f) != (xr >= 0.0f))) e.crossings++;
    }
    return e;
}

#endif
