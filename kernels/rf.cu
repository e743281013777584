// Synthetic RF recordings for a batch of receivers (any mix of samples): one thread per
// output sample, receivers along grid y. The arithmetic is kernels/rf.cuh, checked on the
// host against the CPU twin.
#include "rf.cuh"

extern "C" __global__ void rf_receive(const rf_receiver *receivers, const float *wave_re,
                                      const float *wave_im, const long long *coeff_offset,
                                      const float *coeff_re, const float *coeff_im,
                                      const double *gains, const double *zig_x,
                                      const double *zig_ratio, const float *zig_x_f32,
                                      const float *zig_ratio_f32, float *out) {
    __shared__ double zx[257], zr[256];
    __shared__ float zxf[257], zrf[256];
    for (u32 j = threadIdx.x; j < 257; j += blockDim.x) {
        zx[j] = zig_x[j];
        zxf[j] = zig_x_f32[j];
        if (j < 256) {
            zr[j] = zig_ratio[j];
            zrf[j] = zig_ratio_f32[j];
        }
    }
    __syncthreads();
    rf_zig z = {zx, zr, zxf, zrf};
    const rf_receiver r = receivers[blockIdx.y];
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < r.len;
         i += (u64)gridDim.x * blockDim.x)
        rf_receive_sample(&r, i, wave_re, wave_im, coeff_offset, coeff_re, coeff_im, gains, z,
                          out);
}
