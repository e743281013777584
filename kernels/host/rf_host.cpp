/* Host build of kernels/rf.cuh and rf_features.cuh: every sample of every receiver, and
 * every chunk's sums, in the kernels' arithmetic, for the parity tests against the CPU
 * twins (src/ops/rf/gpu_host_parity.rs). */
#include <stddef.h>
#include <cmath>
#include <cstring>
#include <vector>
#include "../rf.cuh"
#include "../rf_features.cuh"

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
                                             const float *tw, u32 seg, u32 bits, double *bins,
                                             double *env) {
    std::vector<float> re(seg), im(seg);
    for (size_t i = 0; i < count; i++) {
        rf_chunk_bins(rec, chunks[i], window, tw, seg, bits, re.data(), im.data(),
                      bins + i * seg, 0, 1);
        rf_envelope e = rf_envelope_part(rec, chunks[i], 0, 1);
        env[4 * i] = e.power_sum;
        env[4 * i + 1] = e.magnitude_sum;
        env[4 * i + 2] = (double)e.power_max;
        env[4 * i + 3] = (double)e.crossings;
    }
}
