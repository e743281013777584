// One receiver's recording, sample by sample: the multipath FIR, the block fading gain,
// the oscillator offset and drift, and the receiver noise. The CPU twin is
// src/ops/rf/generate.rs::receive; kernels/host/rf_host.cpp compiles this file for the
// host so CI checks it against the twin without a GPU.
//
// Bit for bit with the twin: the FIR (f32, the twin's order of products and sums, never
// fused) and the noise (the same counter-based stream and 256-layer ziggurat, f32 fast
// path and f64 slow path, tables passed in from the twin). Within ~1e-12: the rotation, which the twin steps by a
// recurrence and this file computes directly per sample.
#ifndef GPU_OPS_RF_CUH
#define GPU_OPS_RF_CUH

#include "common.cuh"

#ifdef __CUDACC__
#define FMUL(a, b) __fmul_rn((a), (b))
#define FADD(a, b) __fadd_rn((a), (b))
#define FSUB(a, b) __fsub_rn((a), (b))
#define DSUB(a, b) __dsub_rn((a), (b))
#define RF_SINCOSPI(x, s, c) sincospi((x), (s), (c))
#define RF_LOG(x) log(x)
#define RF_EXP(x) exp(x)
#define RF_FLOOR(x) floor(x)
#else
// (the host build includes <cmath> first: kernels/host/rf_host.cpp)
#define FMUL(a, b) ((a) * (b))
#define FADD(a, b) ((a) + (b))
#define FSUB(a, b) ((a) - (b))
#define DSUB(a, b) ((a) - (b))
#define RF_SINCOSPI(x, s, c) (*(s) = std::sin(M_PI * (x)), *(c) = std::cos(M_PI * (x)))
#define RF_LOG(x) std::log(x)
#define RF_EXP(x) std::exp(x)
#define RF_FLOOR(x) std::floor(x)
#endif

#define RF_GAMMA 0x9e3779b97f4a7c15ull
#define RF_TAIL_SALT 0x6e6f726d616c7461ull
#define RF_ZIG_R 3.654152885361009

// One receiver of a batch. Only 8-byte fields, so the host struct (src/ops/rf/gpu.rs)
// has the same layout. Offsets index the batch's flat arrays.
struct rf_receiver {
    u64 wave;        // index of the receiver's waveform sample 0 in wave_re / wave_im
    u64 coeff_start; // its FIR coefficients: [coeff_start, coeff_end)
    u64 coeff_end;
    u64 gains;       // its first block gain in gains (re, im pairs)
    u64 block;       // samples per coherence block
    u64 len;         // samples in the recording
    u64 out;         // its first complex sample in out
    u64 noise_key;   // the noise stream's key
    double carrier_offset_hz;
    double drift_hz_per_s;
    double sample_rate_hz;
    double noise_sigma;
};

FIELD_FN u64 rf_mix(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

FIELD_FN u64 rf_draw(u64 key, u64 k) { return rf_mix(key + (k + 1) * RF_GAMMA); }

FIELD_FN double rf_unit(u64 d) { return (double)(d >> 11) * (1.0 / 9007199254740992.0); }

FIELD_FN double rf_signed_unit(u64 d) {
    return DSUB(DMUL((double)(d >> 11), 2.0 / 9007199254740992.0), 1.0);
}

// The wedge test and the tail of normal k (src/ops/rf/rng.rs::normal_slow).
FIELD_FN_OUTLINED double rf_normal_slow(u64 key, u64 k, u32 layer, double u, const double *zx,
                                        const double *zr) {
    u64 sub = rf_mix(key ^ rf_mix(k ^ RF_TAIL_SALT)), next = 0;
    for (;;) {
        if (layer == 0) {
            for (;;) {
                double x = -RF_LOG(DSUB(1.0, rf_unit(rf_draw(sub, next++)))) / RF_ZIG_R;
                double y = -RF_LOG(DSUB(1.0, rf_unit(rf_draw(sub, next++))));
                if (DMUL(2.0, y) >= DMUL(x, x)) return u < 0.0 ? -DADD(RF_ZIG_R, x) : DADD(RF_ZIG_R, x);
            }
        }
        double x = DMUL(u, zx[layer]);
        double f0 = RF_EXP(DMUL(-0.5, DSUB(DMUL(zx[layer], zx[layer]), DMUL(x, x))));
        double f1 = RF_EXP(DMUL(-0.5, DSUB(DMUL(zx[layer + 1], zx[layer + 1]), DMUL(x, x))));
        if (DADD(f1, DMUL(rf_unit(rf_draw(sub, next++)), DSUB(f0, f1))) < 1.0) return x;
        u64 d = rf_draw(sub, next++);
        layer = (u32)(d & 0xff);
        u = rf_signed_unit(d);
        if (fabs(u) < zr[layer]) return DMUL(u, zx[layer]);
    }
}

// The ziggurat tables: f64 for the slow path, f32 for the noise's fast path.
struct rf_zig {
    const double *x;
    const double *ratio;
    const float *x_f32;
    const float *ratio_f32;
};

// One half h of noise draw i, normal 2i + half (src/ops/rf/rng.rs::noise_lanes): a layer
// and a signed 24-bit uniform in f32, exact, then one rounded product.
FIELD_FN float rf_noise_half(u64 key, u64 k, u32 h, rf_zig z) {
    u32 layer = h & 0xff;
    float u = FSUB(FMUL((float)(int)(h >> 8), 1.0f / 8388608.0f), 1.0f);
    if (fabsf(u) < z.ratio_f32[layer]) return FMUL(u, z.x_f32[layer]);
    return (float)rf_normal_slow(key, k, layer, (double)u, z.x, z.ratio);
}

// Complex sample i of receiver r, written to out[2 * (r.out + i)] (re, im).
FIELD_FN void rf_receive_sample(const rf_receiver *r, u64 i, const float *wave_re,
                                const float *wave_im, const long long *coeff_offset,
                                const float *coeff_re, const float *coeff_im,
                                const double *gains, rf_zig z, float *out) {
    // y = Σ c·x[i − m], in the twin's order: each term (cr·xr − ci·xi, cr·xi + ci·xr).
    float ar = 0.0f, ai = 0.0f;
    for (u64 k = r->coeff_start; k < r->coeff_end; k++) {
        u64 at = r->wave + i - coeff_offset[k];
        float xr = wave_re[at], xi = wave_im[at], cr = coeff_re[k], ci = coeff_im[k];
        ar = FADD(ar, FSUB(FMUL(cr, xr), FMUL(ci, xi)));
        ai = FADD(ai, FADD(FMUL(cr, xi), FMUL(ci, xr)));
    }
    double vr = (double)ar, vi = (double)ai;
    u64 b = i / r->block;
    double hr = gains[2 * (r->gains + b)], hi = gains[2 * (r->gains + b) + 1];
    // v·(h·z) (complex products as num_complex forms them).
    double t = (double)i / r->sample_rate_hz;
    double cycles = DADD(DMUL(r->carrier_offset_hz, t), DMUL(DMUL(0.5, r->drift_hz_per_s), DMUL(t, t)));
    double frac = DSUB(cycles, RF_FLOOR(cycles));
    double zs, zc;
    RF_SINCOSPI(DMUL(2.0, frac), &zs, &zc);
    double pr = DSUB(DMUL(hr, zc), DMUL(hi, zs)), pi = DADD(DMUL(hr, zs), DMUL(hi, zc));
    double yr = DSUB(DMUL(vr, pr), DMUL(vi, pi)), yi = DADD(DMUL(vr, pi), DMUL(vi, pr));
    u64 d = rf_draw(r->noise_key, i);
    float n0 = rf_noise_half(r->noise_key, 2 * i, (u32)d, z);
    float n1 = rf_noise_half(r->noise_key, 2 * i + 1, (u32)(d >> 32), z);
    yr = DADD(yr, DMUL((double)n0, r->noise_sigma));
    yi = DADD(yi, DMUL((double)n1, r->noise_sigma));
    out[2 * (r->out + i)] = (float)yr;
    out[2 * (r->out + i) + 1] = (float)yi;
}

#endif
