/* Host build of kernels/rf.cuh, rf_waveform.cuh and rf_features.cuh: every waveform,
 * every sample of every receiver, and every chunk's sums, in the kernels' arithmetic, for the parity tests against the CPU
 * twins (src/ops/rf/gpu_host_parity.rs). */
#include <stddef.h>
#include <cmath>
#include <cstring>
#include <vector>
#include "../rf.cuh"
#include "../rf_features.cuh"
#include "../rf_waveform.cuh"

extern "C" void gpu_ops_host_rf_receive(const rf_receiver *receivers, size_t count,
                                        const float *wave_re, const float *wave_im,
                                        const long long *coeff_offset, const float *coeff_re,
                                        const float *coeff_im, const double *gains,
                                        float *out) {
    for (size_t r = 0; r < count; r++)
        for (u64 i = 0; i < receivers[r].len; i++)
            rf_receive_sample(&receivers[r], i, wave_re, wave_im, coeff_offset, coeff_re,
                              coeff_im, gains, out);
}

// rf_chunk_reduce with one "thread" per chunk: the same bins (the FFT's butterflies within
// a stage are independent, the segments summed in the same order); the envelope sums in
// sample order rather than the device's tree.
extern "C" void gpu_ops_host_rf_chunk_reduce(const float *rec, const rf_chunk *chunks,
                                             size_t count, const float *window,
                                             const float *tw, u32 seg, u32 bits, double *out) {
    std::vector<float> re(seg), im(seg);
    for (size_t i = 0; i < count; i++) {
        rf_chunk_bins(rec, chunks[i], window, tw, seg, bits, re.data(), im.data(),
                      out + i * (seg + 4), 0, 1);
        rf_envelope e = rf_envelope_part(rec, chunks[i], 0, 1);
        double *env = out + i * (seg + 4) + seg;
        env[0] = e.power_sum;
        env[1] = e.magnitude_sum;
        env[2] = (double)e.power_max;
        env[3] = (double)e.crossings;
    }
}

// rf_waveform with its RF_WAVE_THREADS "threads" run one after another per phase: the same
// stretches and the same ordered scan as the device, so only sin/cos differ.
extern "C" void gpu_ops_host_rf_waveform(const rf_wave *waves, size_t count,
                                         const double *params, float *wave_re,
                                         float *wave_im) {
    const u32 threads = RF_WAVE_THREADS;
    std::vector<double> table(RF_VOICE_TABLE), parts(threads);
    for (size_t b = 0; b < count; b++) {
        const rf_wave *w = &waves[b];
        double peak = 1.0;
        if (rf_wave_is_voice(w)) {
            for (u32 t = 0; t < threads; t++)
                parts[t] = rf_wave_table(w, params, table.data(), t, threads);
            peak = rf_wave_peak(parts.data(), threads);
        }
        for (u32 t = 0; t < threads; t++)
            parts[t] = rf_wave_stretch_sum(w, params, table.data(), peak, t, threads);
        for (u32 t = 0; t < threads; t++)
            rf_wave_write(w, params, table.data(), peak, parts.data(), t, threads, wave_re,
                          wave_im);
        for (u32 t = 0; t < threads; t++) rf_wave_pad(w, t, threads, wave_re, wave_im);
    }
}
