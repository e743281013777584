// DP-SGD privatization and noise mechanisms. Two passes over the [rows, cols] gradients:
// per-(row, layer) squared norms, then clip + column sum + snap + noise per column.
// Every floating operation is in a fixed order with no FMA contraction, so the CPU twin
// (src/ops/dp/privatize.rs) reproduces each result bit for bit.
#include "dp_noise.cuh"

// The squared-norm kernels run with exactly DP_LANES threads per block: lane j sums
// elements j, j + DP_LANES, ... of its layer, then the lanes are added as a tree. Their
// launcher asserts DeviceLease::launch_config's block is DP_LANES; every other kernel here
// is a grid-stride loop over those blocks.
#define DP_LANES 256

#define DP_SQ_NORMS_KERNEL(NAME, T)                                                       \
    extern "C" __global__ void __launch_bounds__(DP_LANES)                                \
        NAME(const T *g, u64 rows, u64 cols, const u64 *bounds, u32 layers, double *out) { \
        __shared__ double lanes[DP_LANES];                                                \
        for (u64 item = blockIdx.x; item < rows * layers; item += gridDim.x) {            \
            u64 row = item / layers;                                                      \
            u32 layer = (u32)(item % layers);                                             \
            const T *r = g + row * cols;                                                  \
            double acc = 0.0;                                                             \
            for (u64 c = bounds[layer] + threadIdx.x; c < bounds[layer + 1]; c += DP_LANES) { \
                double v = (double)r[c];                                                  \
                acc = DADD(acc, DMUL(v, v));                                              \
            }                                                                             \
            lanes[threadIdx.x] = acc;                                                     \
            __syncthreads();                                                              \
            for (u32 s = DP_LANES / 2; s > 0; s >>= 1) {                                  \
                if (threadIdx.x < s)                                                      \
                    lanes[threadIdx.x] = DADD(lanes[threadIdx.x], lanes[threadIdx.x + s]); \
                __syncthreads();                                                          \
            }                                                                             \
            if (threadIdx.x == 0) out[item] = lanes[0];                                   \
            __syncthreads();                                                              \
        }                                                                                 \
    }

DP_SQ_NORMS_KERNEL(dp_sq_norms_f32, float)
DP_SQ_NORMS_KERNEL(dp_sq_norms_f64, double)

// One thread per column: sum the clipped rows in row order, snap the sum to the grid,
// add discrete Gaussian noise from the column's own stream, divide for `mean`.
#define DP_CLIP_SUM_NOISE_KERNEL(NAME, T)                                                 \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        NAME(const T *g, u64 rows, u64 cols, const u64 *bounds, u32 layers,               \
             const double *factors, const u32 *key, double inv_grid, double grid, u64 t,  \
             u64 c, double divisor, double *out) {                                        \
        u32 k[8];                                                                         \
        for (int i = 0; i < 8; i++) k[i] = key[i];                                        \
        for (u64 d = blockIdx.x * (u64)blockDim.x + threadIdx.x; d < cols;                 \
             d += (u64)gridDim.x * blockDim.x) {                                          \
            u32 lo = 0, hi = layers;                                                      \
            while (hi - lo > 1) {                                                         \
                u32 mid = (lo + hi) / 2;                                                  \
                if (bounds[mid] <= d) lo = mid; else hi = mid;                            \
            }                                                                             \
            double acc = 0.0;                                                             \
            for (u64 b = 0; b < rows; b++)                                                \
                acc = DADD(acc, DMUL((double)g[b * cols + d], factors[b * layers + lo])); \
            i64 snapped = (i64)rint(DMUL(acc, inv_grid));                                 \
            dp_bits bits;                                                                 \
            dp_bits_init(&bits, k, DP_DOMAIN_GAUSSIAN, d);                                \
            i64 noise = dp_discrete_gaussian(&bits, t, c);                                \
            out[d] = __ddiv_rn(dp_release(snapped, noise, grid), divisor);                \
        }                                                                                 \
    }

DP_CLIP_SUM_NOISE_KERNEL(dp_clip_sum_noise_f32, float)
DP_CLIP_SUM_NOISE_KERNEL(dp_clip_sum_noise_f64, double)

// Mechanisms: out[i] = (round(x[i] / grid) + noise_(first + i)) * grid, for a chunk of n
// values starting at index `first` of the whole release (ops/dp/gpu.rs streams it in
// chunks): each value's noise is drawn from its index in the whole, so the answer does not
// depend on how it was cut.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    dp_gaussian_release(const double *x, u64 n, u64 first, const u32 *key, double inv_grid,
                        double grid, u64 t, u64 c, double *out) {
    u32 k[8];
    for (int i = 0; i < 8; i++) k[i] = key[i];
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        dp_bits bits;
        dp_bits_init(&bits, k, DP_DOMAIN_GAUSSIAN, first + i);
        i64 noise = dp_discrete_gaussian(&bits, t, c);
        out[i] = dp_release((i64)rint(DMUL(x[i], inv_grid)), noise, grid);
    }
}

extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    dp_laplace_release(const double *x, u64 n, u64 first, const u32 *key, double inv_grid,
                       double grid, u64 t, double *out) {
    u32 k[8];
    for (int i = 0; i < 8; i++) k[i] = key[i];
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        dp_bits bits;
        dp_bits_init(&bits, k, DP_DOMAIN_LAPLACE, first + i);
        i64 noise = dp_discrete_laplace(&bits, t);
        out[i] = dp_release((i64)rint(DMUL(x[i], inv_grid)), noise, grid);
    }
}
