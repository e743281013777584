// Synthetic RF recordings for a batch of receivers (any mix of samples), the waveforms
// they receive, and the sums their features are derived from. The arithmetic is
// kernels/rf.cuh, rf_waveform.cuh and rf_features.cuh, checked on the host against the
// CPU twins.
#include "rf.cuh"
#include "rf_features.cuh"
#include "rf_waveform.cuh"

// Each sample's transmitted waveform from its spec, padded: one block of at most
// RF_WAVE_THREADS threads per waveform (phases in rf_waveform.cuh).
extern "C" __global__ void __launch_bounds__(RF_WAVE_THREADS)
    rf_waveform(const rf_wave *waves, const double *params, float *wave_re, float *wave_im) {
    __shared__ double table[RF_VOICE_TABLE];
    __shared__ double parts[RF_WAVE_THREADS];
    const rf_wave w = waves[blockIdx.x];
    u32 tid = threadIdx.x, threads = blockDim.x;
    double peak = 1.0;
    // The kind is the block's, so every thread takes the same branch to the barriers.
    if (rf_wave_is_voice(&w)) {
        parts[tid] = rf_wave_table(&w, params, table, tid, threads);
        __syncthreads();
        peak = rf_wave_peak(parts, threads);
        __syncthreads();
    }
    parts[tid] = rf_wave_stretch_sum(&w, params, table, peak, tid, threads);
    __syncthreads();
    rf_wave_write(&w, params, table, peak, parts, tid, threads, wave_re, wave_im);
    // The padding copies samples other threads wrote.
    __syncthreads();
    rf_wave_pad(&w, tid, threads, wave_re, wave_im);
}

// One thread per output sample, receivers along grid y; DeviceLease::launch_config's
// blocks.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    rf_receive(const rf_receiver *receivers, const float *wave_re, const float *wave_im,
               const long long *coeff_offset, const float *coeff_re, const float *coeff_im,
               const double *gains, float *out) {
    const rf_receiver r = receivers[blockIdx.y];
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < r.len;
         i += (u64)gridDim.x * blockDim.x)
        rf_receive_sample(&r, i, wave_re, wave_im, coeff_offset, coeff_re, coeff_im, gains, out);
}

// The Welch and envelope sums of a batch of chunks (of the recordings rf_receive wrote,
// still on the device): one block of RF_REDUCE_THREADS threads per chunk, 8·seg bytes of
// dynamic shared memory. Out: one record of seg + 4 doubles per chunk, its seg bin sums
// then its 4 envelope numbers (Σ|x|², Σ|x|, max |x|², sign changes): one buffer, so a
// chunk of chunks' answers comes back in one copy.
extern "C" __global__ void __launch_bounds__(RF_REDUCE_THREADS)
    rf_chunk_reduce(const float *rec, const rf_chunk *chunks, const float *window,
                    const float *tw, u32 seg, u32 bits, double *out) {
    extern __shared__ float rf_segment[];
    __shared__ double power[RF_REDUCE_THREADS], magnitude[RF_REDUCE_THREADS];
    __shared__ float peak[RF_REDUCE_THREADS];
    __shared__ u64 crossings[RF_REDUCE_THREADS];
    const rf_chunk c = chunks[blockIdx.x];
    u32 tid = threadIdx.x;
    rf_chunk_bins(rec, c, window, tw, seg, bits, rf_segment, rf_segment + seg,
                  out + (u64)blockIdx.x * (seg + 4), tid, blockDim.x);
    rf_envelope e = rf_envelope_part(rec, c, tid, blockDim.x);
    power[tid] = e.power_sum;
    magnitude[tid] = e.magnitude_sum;
    peak[tid] = e.power_max;
    crossings[tid] = e.crossings;
    __syncthreads();
    for (u32 w = blockDim.x / 2; w > 0; w >>= 1) {
        if (tid < w) {
            power[tid] = DADD(power[tid], power[tid + w]);
            magnitude[tid] = DADD(magnitude[tid], magnitude[tid + w]);
            if (peak[tid + w] > peak[tid]) peak[tid] = peak[tid + w];
            crossings[tid] += crossings[tid + w];
        }
        __syncthreads();
    }
    if (tid == 0) {
        double *env = out + (u64)blockIdx.x * (seg + 4) + seg;
        env[0] = power[0];
        env[1] = magnitude[0];
        env[2] = (double)peak[0];
        env[3] = (double)crossings[0];
    }
}
