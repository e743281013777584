// Synthetic RF recordings for a batch of receivers (any mix of samples): one thread per
// output sample, receivers along grid y. The arithmetic is kernels/rf.cuh, checked on the
// host against the CPU twin.
#include "rf.cuh"

extern "C" __global__ void rf_receive(const rf_receiver *receivers, const float *wave_re,
                                      const float *wave_im, const long long *coeff_offset,
                                      const float *coeff_re, const float *coeff_im,
                                      const double *gains, float *out) {
    const rf_receiver r = receivers[blockIdx.y];
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < r.len;
         i += (u64)gridDim.x * blockDim.x)
        rf_receive_sample(&r, i, wave_re, wave_im, coeff_offset, coeff_re, coeff_im, gains, out);
}
