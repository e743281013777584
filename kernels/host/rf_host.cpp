/* Host build of kernels/rf.cuh: every sample of every receiver, in the kernel's
 * arithmetic, for the parity test against the CPU twin (src/ops/rf/gpu_host_parity.rs). */
#include <stddef.h>
#include <cmath>
#include <cstring>
#include "../rf.cuh"

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
