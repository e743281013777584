// One receiver's recording, sample by sample: the multipath FIR, the block fading gain,
// the oscillator offset and drift, and the receiver noise. The CPU twin is
// src/ops/rf/generate.rs::receive; kernels/host/rf_host.cpp compiles this file for the
// host so CI checks it against the twin without a GPU.
//
// Bit for bit with the twin: the FIR (f32, the twin's order of products and sums, never
// fused) and the noise (the same counter-based stream and Box–Muller in f32, tail radii in
// f64). Within ~1e-12: the rotation, which the twin steps by a
// recurrence and this file computes directly per sample.
#ifndef GPU_OPS_RF_CUH
#define GPU_OPS_RF_CUH

#include "common.cuh"

#ifdef GPU_OPS_DEVICE
#define FMUL(a, b) __fmul_rn((a), (b))
#define FADD(a, b) __fadd_rn((a), (b))
#define FSUB(a, b) __fsub_rn((a), (b))
#define DSUB(a, b) __dsub_rn((a), (b))
#define FDIV(a, b) __fdiv_rn((a), (b))
#define FSQRT(x) __fsqrt_rn(x)
#define RF_F2U(x) __float_as_uint(x)
#define RF_U2F(x) __uint_as_float(x)
#define RF_SINCOSPI(x, s, c) sincospi((x), (s), (c))
#define RF_LOG(x) log(x)
#define RF_FLOOR(x) floor(x)
#else
// (the host build includes <cmath> and <cstring> first: kernels/host/rf_host.cpp)
#define FMUL(a, b) ((a) * (b))
#define FADD(a, b) ((a) + (b))
#define FSUB(a, b) ((a) - (b))
#define DSUB(a, b) ((a) - (b))
#define FDIV(a, b) ((a) / (b))
#define FSQRT(x) std::sqrt((float)(x))
#define RF_F2U(x) rf_host_f2u(x)
#define RF_U2F(x) rf_host_u2f(x)
static inline u32 rf_host_f2u(float x) { u32 u; memcpy(&u, &x, 4); return u; }
static inline float rf_host_u2f(u32 u) { float x; memcpy(&x, &u, 4); return x; }
#define RF_SINCOSPI(x, s, c) (*(s) = std::sin(M_PI * (x)), *(c) = std::cos(M_PI * (x)))
#define RF_LOG(x) std::log(x)
#define RF_FLOOR(x) std::floor(x)
#endif

#define RF_GAMMA 0x9e3779b97f4a7c15ull
#define RF_NOISE_TAIL_SALT 0x6e6f697365746169ull

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

// The receiver noise (src/ops/rf/noise.rs): complex sample i is draw i of the noise
// stream by Box–Muller in f32, its low half the radius and its high half the angle.

// ln u for u in [2^-24, 1]: exponent and an atanh series on the mantissa in [√½, √2).
FIELD_FN float rf_ln(float u) {
    u32 ix = RF_F2U(u) + (0x3f800000u - 0x3f3504f3u);
    float e = (float)((int)(ix >> 23) - 127);
    float f = RF_U2F((ix & 0x007fffffu) + 0x3f3504f3u);
    float s = FDIV(FSUB(f, 1.0f), FADD(f, 1.0f));
    float s2 = FMUL(s, s);
    float p = FMUL(s2, FADD(1.0f / 3.0f,
                            FMUL(s2, FADD(1.0f / 5.0f, FMUL(s2, FADD(1.0f / 7.0f, FMUL(s2, 1.0f / 9.0f)))))));
    float half = FADD(s, FMUL(s, p));
    return FADD(FMUL(e, RF_U2F(0x3f317180u)), FADD(FMUL(e, RF_U2F(0x3717f7d1u)), FADD(half, half)));
}

// (cos θ, sin θ), θ = 2π·h/2^32: the rounded top two bits pick the quadrant, the rest a
// turn in [−π/4, π/4) by Cephes' sinf/cosf minimax polynomials.
FIELD_FN void rf_turn(u32 h, float *a_out, float *b_out) {
    u32 q = (h + (1u << 29)) >> 30;
    float t = FMUL((float)(int)(h - (q << 30)), RF_U2F(0x30c90fdbu));
    float t2 = FMUL(t, t);
    float s = FADD(t, FMUL(t, FMUL(t2, FADD(-1.6666655e-1f, FMUL(t2, FADD(8.332161e-3f, FMUL(t2, -1.9515296e-4f)))))));
    float c = FADD(FSUB(1.0f, FMUL(0.5f, t2)),
                   FMUL(FMUL(t2, t2), FADD(4.1666646e-2f, FMUL(t2, FADD(-1.3887316e-3f, FMUL(t2, 2.4433157e-5f))))));
    float a = (q & 1u) ? s : c, b = (q & 1u) ? c : s;
    *a_out = RF_U2F(RF_F2U(a) ^ ((((q + 1u) >> 1) & 1u) << 31));
    *b_out = RF_U2F(RF_F2U(b) ^ ((q >> 1) << 31));
}

// The radius of sample i when its low half is below 2^16: the cell refined by 53 bits
// of the sub-stream of i, in f64.
FIELD_FN_OUTLINED float rf_noise_tail(u64 key, u64 i, u32 m) {
    u64 sub = rf_mix(key ^ rf_mix(i ^ RF_NOISE_TAIL_SALT));
    double w = DSUB(1.0, rf_unit(rf_draw(sub, 0)));
    double u = DMUL(DADD((double)m, w), 1.0 / 16777216.0);
    return (float)sqrt(DMUL(-2.0, RF_LOG(u)));
}

FIELD_FN void rf_noise(u64 key, u64 i, float *re, float *im) {
    u64 d = rf_draw(key, i);
    u32 lo = (u32)d, hi = (u32)(d >> 32);
    float r;
    if (lo < (1u << 16)) {
        r = rf_noise_tail(key, i, lo >> 8);
    } else {
        float u = FMUL((float)(int)((lo >> 8) + 1u), 1.0f / 16777216.0f);
        r = FSQRT(fmaxf(FMUL(-2.0f, rf_ln(u)), 0.0f));
    }
    float c, s;
    rf_turn(hi, &c, &s);
    *re = FMUL(r, c);
    *im = FMUL(r, s);
}

// Complex sample i of receiver r, written to out[2 * (r.out + i)] (re, im).
FIELD_FN void rf_receive_sample(const rf_receiver *r, u64 i, const float *wave_re,
                                const float *wave_im, const long long *coeff_offset,
                                const float *coeff_re, const float *coeff_im,
                                const double *gains, float *out) {
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
    float n0, n1;
    rf_noise(r->noise_key, i, &n0, &n1);
    yr = DADD(yr, DMUL((double)n0, r->noise_sigma));
    yi = DADD(yi, DMUL((double)n1, r->noise_sigma));
    out[2 * (r->out + i)] = (float)yr;
    out[2 * (r->out + i) + 1] = (float)yi;
}

#endif
