// A sample's transmitted waveform synthesised from its spec (the CPU twin is
// src/ops/rf/waveform.rs, WaveSpec::synthesize), written padded for the channels' delays
// as multipath.rs::Padded lays it out: index p holds sample (p − lead) mod len. The host
// draws a few hundred numbers per sample; the second of baseband never crosses the bus.
//
// One block per waveform, in phases separated by barriers:
//  1. voice only: one period of the harmonics (RF_VOICE_TABLE points) in shared memory,
//     each entry summed over the harmonics in order, and the table's peak magnitude;
//  2. each thread sums what its stretch of consecutive samples contributes: the FM
//     phase increments, or the AM power;
//  3. each thread adds the stretches before its own, in order (the scan is over
//     RF_WAVE_THREADS numbers, so the result does not depend on timing), and writes its
//     stretch: e^{jφ} for FM, x/√p for AM, 1 for the carrier;
//  4. the padding, copied from the written recording.
// Within tolerance of the twin, not bit for bit: the twin steps the tone's and the
// syllable envelope's sines by rotation, takes the voice table's and DTMF's from its own
// vectorised polynomial (sincos.rs) and wraps the FM phase every sample; this file
// evaluates the sines directly with CUDA's sin and sums the phase per stretch (both within
// ~1e-10 rad over a second at 200 kHz).
#ifndef GPU_OPS_RF_WAVEFORM_CUH
#define GPU_OPS_RF_WAVEFORM_CUH

#include "rf.cuh"

// Threads per block, and the stretches a waveform is cut into.
#define RF_WAVE_THREADS 256
#define RF_VOICE_TABLE 2048
// 2.0 * PI as the twin writes it (exact doubling of the f64 π).
#define RF_TWO_PI (2.0 * 3.141592653589793)

// Modulation::ALL's order.
#define RF_FM_VOICE 0
#define RF_FM_TONE 1
#define RF_FM_DTMF 2
#define RF_AM 3
#define RF_CARRIER 4

// One waveform of a batch. Only 8-byte fields, so the host struct (src/ops/rf/gpu.rs,
// RfWave) has the same layout.
struct rf_wave {
    u64 kind;    // RF_FM_VOICE ..= RF_CARRIER
    u64 out;     // the padded waveform's index 0 in wave_re / wave_im
    u64 lead;    // samples before sample 0 (the recording's end, for circular delays)
    u64 len;     // samples in the recording
    u64 total;   // the padded length: lead + len + the FIR's half width
    u64 params;  // its first pair in params: (amplitude, phase) per harmonic, or
                 // (row, column) Hz per DTMF key
    u64 count;   // pairs
    u64 per_key; // samples per DTMF key
    double sample_rate_hz;
    double fm_scale; // 2π·deviation, Hz
    double am_depth;
    double f0;       // the voice's pitch or the FM tone's frequency, Hz
    double syllable_hz;
    double syllable_phase;
};

FIELD_FN bool rf_wave_is_voice(const rf_wave *w) {
    return w->kind == RF_FM_VOICE || w->kind == RF_AM;
}

FIELD_FN bool rf_wave_is_fm(const rf_wave *w) { return w->kind <= RF_FM_DTMF; }

// Phase 1: table entries tid, tid + threads, …; returns their peak magnitude.
FIELD_FN double rf_wave_table(const rf_wave *w, const double *params, double *table, u32 tid,
                              u32 threads) {
    double peak = 0.0;
    for (u32 i = tid; i < RF_VOICE_TABLE; i += threads) {
        double t = 0.0;
        for (u64 k = 0; k < w->count; k++) {
            const double *h = params + 2 * (w->params + k);
            double arg = DMUL(DMUL(RF_TWO_PI, (double)(k + 1)), (double)i) / (double)RF_VOICE_TABLE;
            t = DADD(t, DMUL(h[0], sin(DADD(arg, h[1]))));
        }
        table[i] = t;
        peak = fmax(peak, fabs(t));
    }
    return peak;
}

// The table's peak from every thread's part (a maximum: the same in any order).
FIELD_FN double rf_wave_peak(const double *parts, u32 threads) {
    double peak = 0.0;
    for (u32 t = 0; t < threads; t++) peak = fmax(peak, parts[t]);
    return fmax(peak, 1e-12);
}

// Audio sample i in [−1, 1] (0 for the carrier).
FIELD_FN double rf_wave_audio(const rf_wave *w, const double *params, const double *table,
                              double peak, u64 i) {
    double fs = w->sample_rate_hz;
    double t = (double)i / fs;
    if (rf_wave_is_voice(w)) {
        double x = DMUL(w->f0, t);
        double pos = DMUL(DSUB(x, RF_FLOOR(x)), (double)RF_VOICE_TABLE);
        u64 k = (u64)pos % RF_VOICE_TABLE;
        double frac = DSUB(pos, RF_FLOOR(pos));
        double v = DADD(DMUL(table[k], DSUB(1.0, frac)),
                        DMUL(table[(k + 1) % RF_VOICE_TABLE], frac));
        double syllable =
            sin(DADD(DMUL(DMUL(RF_TWO_PI, w->syllable_hz / fs), (double)i), w->syllable_phase));
        return DMUL(DADD(0.6, DMUL(0.4, syllable)), v) / peak;
    }
    if (w->kind == RF_FM_TONE) return sin(DMUL(DMUL(RF_TWO_PI, w->f0 / fs), (double)i));
    if (w->kind == RF_FM_DTMF) {
        const double *key = params + 2 * (w->params + i / w->per_key);
        return DMUL(0.5, DADD(sin(DMUL(DMUL(RF_TWO_PI, key[0]), t)),
                              sin(DMUL(DMUL(RF_TWO_PI, key[1]), t))));
    }
    return 0.0;
}

// Thread tid's stretch of consecutive samples: [*lo, *hi).
FIELD_FN void rf_wave_stretch(const rf_wave *w, u32 tid, u32 threads, u64 *lo, u64 *hi) {
    u64 per = (w->len + threads - 1) / threads;
    *lo = per * tid < w->len ? per * tid : w->len;
    *hi = *lo + per < w->len ? *lo + per : w->len;
}

// What sample i adds to the running sum: its FM phase step or its AM power; its AM
// value in *x.
FIELD_FN double rf_wave_term(const rf_wave *w, const double *params, const double *table,
                             double peak, u64 i, double *x) {
    double a = rf_wave_audio(w, params, table, peak, i);
    if (rf_wave_is_fm(w)) return DMUL(w->fm_scale, a) / w->sample_rate_hz;
    *x = DADD(1.0, DMUL(w->am_depth, a));
    return DMUL(*x, *x);
}

// Phase 2: thread tid's stretch's sum.
FIELD_FN double rf_wave_stretch_sum(const rf_wave *w, const double *params, const double *table,
                                    double peak, u32 tid, u32 threads) {
    if (w->kind == RF_CARRIER) return 0.0;
    u64 lo, hi;
    rf_wave_stretch(w, tid, threads, &lo, &hi);
    double acc = 0.0, x;
    for (u64 i = lo; i < hi; i++) acc = DADD(acc, rf_wave_term(w, params, table, peak, i, &x));
    return acc;
}

// Phase 3: thread tid's stretch written, given every stretch's sum.
FIELD_FN void rf_wave_write(const rf_wave *w, const double *params, const double *table,
                            double peak, const double *parts, u32 tid, u32 threads,
                            float *wave_re, float *wave_im) {
    u64 lo, hi;
    rf_wave_stretch(w, tid, threads, &lo, &hi);
    float *re = wave_re + w->out + w->lead, *im = wave_im + w->out + w->lead;
    if (w->kind == RF_CARRIER) {
        for (u64 i = lo; i < hi; i++) re[i] = 1.0f, im[i] = 0.0f;
        return;
    }
    double x;
    if (rf_wave_is_fm(w)) {
        double phase = 0.0;
        for (u32 t = 0; t < tid; t++) phase = DADD(phase, parts[t]);
        for (u64 i = lo; i < hi; i++) {
            phase = DADD(phase, rf_wave_term(w, params, table, peak, i, &x));
            re[i] = (float)cos(phase);
            im[i] = (float)sin(phase);
        }
        return;
    }
    double power = 0.0;
    for (u32 t = 0; t < threads; t++) power = DADD(power, parts[t]);
    double norm = sqrt(power / (double)w->len);
    for (u64 i = lo; i < hi; i++) {
        rf_wave_term(w, params, table, peak, i, &x);
        re[i] = (float)(x / norm);
        im[i] = 0.0f;
    }
}

// Phase 4: the padding before and after the recording, copied from it.
FIELD_FN void rf_wave_pad(const rf_wave *w, u32 tid, u32 threads, float *wave_re,
                          float *wave_im) {
    u64 shift = w->len - w->lead % w->len;
    for (u64 p = tid; p < w->total; p += threads) {
        if (p >= w->lead && p < w->lead + w->len) continue;
        u64 from = w->out + w->lead + (p + shift) % w->len;
        wave_re[w->out + p] = wave_re[from];
        wave_im[w->out + p] = wave_im[from];
    }
}

#endif
