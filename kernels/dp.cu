// DP-SGD privatization and noise mechanisms. The [rows, cols] gradients are cut into
// chunks of rows (ops/dp/gpu.rs streams them on two lanes); each chunk is read twice
// while it is on the device: once for its squared norms (partial sums per segment of a
// layer, then folded per (row, layer) with the clip factor), once to add its clipped
// rows to the column sums. When every chunk is in, the sums are snapped, noised and
// scaled once. Every floating operation is in a fixed order with no FMA contraction, so
// the CPU twin (src/ops/dp/privatize.rs) reproduces each result bit for bit however the
// batch was cut.
#include "dp_noise.cuh"

// The partial-norm kernels run with exactly DP_LANES threads per block: lane j sums
// elements j, j + DP_LANES, ... of its segment, then the lanes are added as a tree. Their
// launcher asserts DeviceLease::launch_config's block is DP_LANES; every other kernel here
// is a grid-stride loop over those blocks.
#define DP_LANES 256
// Columns of one segment (SEGMENT in privatize.rs): a wide layer is cut into segments,
// one block each, so a chunk of a few wide rows still gives the device many blocks.
#define DP_SEGMENT 4096
// Opacus' guard against division by a zero norm (NORM_EPS in privatize.rs).
#define DP_NORM_EPS 1e-6

// min(1, C / (sqrt(s) + eps)): each step correctly rounded (the _rn intrinsics, on
// every engine), so the factor is the CPU twin's `clip_factors` to the bit.
static __device__ __forceinline__ double dp_clip_factor(double clip, double sq) {
    return fmin(__ddiv_rn(clip, DADD(__dsqrt_rn(sq), DP_NORM_EPS)), 1.0);
}

// The layer of segment `seg`: the last l with seg_bounds[l] <= seg (a layer of no
// columns has no segments and is passed over).
static __device__ __forceinline__ u32 dp_layer_of(const u64 *seg_bounds, u32 layers, u64 seg) {
    u32 lo = 0, hi = layers;
    while (hi - lo > 1) {
        u32 mid = (lo + hi) / 2;
        if (seg_bounds[mid] <= seg) lo = mid; else hi = mid;
    }
    return lo;
}

// Values of a segment one lane sums (DP_SEGMENT / DP_LANES): a lane loads all of them
// before it adds any, so each thread keeps that many reads in flight rather than one at
// a time. (The one-at-a-time loops ran at 19 % of the copy roofline on the H200; whether
// the reads in flight were the limit is not yet measured.) The sum is still taken in the
// same order, so it is the same to the bit. The loops are unrolled whole, so that the
// values stay in registers.
#define DP_LANE_VALUES (DP_SEGMENT / DP_LANES)
static_assert(DP_SEGMENT % DP_LANES == 0, "a segment is whole lanes");

// A chunk of `rows` rows: partials[row * segs + seg] is the sum of squares of one segment
// of a row, segs = seg_bounds[layers]. Layer l's segments are seg_bounds[l] ..
// seg_bounds[l + 1], each DP_SEGMENT of its columns (the last one shorter).
#define DP_SQ_PARTIALS_KERNEL(NAME, T)                                                    \
    extern "C" __global__ void __launch_bounds__(DP_LANES)                                \
        NAME(const T *g, u64 rows, u64 cols, const u64 *bounds, const u64 *seg_bounds,    \
             u32 layers, double *partials) {                                              \
        __shared__ double lanes[DP_LANES];                                                \
        u64 segs = seg_bounds[layers];                                                    \
        for (u64 item = blockIdx.x; item < rows * segs; item += gridDim.x) {              \
            u64 row = item / segs, seg = item % segs;                                     \
            u32 layer = dp_layer_of(seg_bounds, layers, seg);                             \
            u64 start = bounds[layer] + (seg - seg_bounds[layer]) * DP_SEGMENT;           \
            u64 end = start + DP_SEGMENT < bounds[layer + 1] ? start + DP_SEGMENT         \
                                                             : bounds[layer + 1];         \
            const T *r = g + row * cols;                                                  \
            T v[DP_LANE_VALUES];                                                          \
            _Pragma("unroll") for (u32 j = 0; j < DP_LANE_VALUES; j++) {                  \
                u64 c = start + threadIdx.x + (u64)j * DP_LANES;                          \
                v[j] = c < end ? r[c] : (T)0;                                             \
            }                                                                             \
            double acc = 0.0;                                                             \
            _Pragma("unroll") for (u32 j = 0; j < DP_LANE_VALUES; j++) {                  \
                u64 c = start + threadIdx.x + (u64)j * DP_LANES;                          \
                if (c < end) acc = DADD(acc, DMUL((double)v[j], (double)v[j]));           \
            }                                                                             \
            lanes[threadIdx.x] = acc;                                                     \
            __syncthreads();                                                              \
            for (u32 s = DP_LANES / 2; s > 0; s >>= 1) {                                  \
                if (threadIdx.x < s)                                                      \
                    lanes[threadIdx.x] = DADD(lanes[threadIdx.x], lanes[threadIdx.x + s]); \
                __syncthreads();                                                          \
            }                                                                             \
            if (threadIdx.x == 0) partials[item] = lanes[0];                              \
            __syncthreads();                                                              \
        }                                                                                 \
    }

DP_SQ_PARTIALS_KERNEL(dp_sq_partials_f32, float)
DP_SQ_PARTIALS_KERNEL(dp_sq_partials_f64, double)

// One thread per (row, layer) of the chunk: the layer's segment partials added in order
// from 0.0 into sq[item], and its clip factor into factors[item].
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    dp_fold_norms(const double *partials, u64 rows, const u64 *seg_bounds, u32 layers,
                  const double *clip, double *sq, double *factors) {
    u64 segs = seg_bounds[layers];
    for (u64 item = blockIdx.x * (u64)blockDim.x + threadIdx.x; item < rows * layers;
         item += (u64)gridDim.x * blockDim.x) {
        u64 row = item / layers;
        u32 layer = (u32)(item % layers);
        const double *p = partials + row * segs;
        double acc = 0.0;
        for (u64 s = seg_bounds[layer]; s < seg_bounds[layer + 1]; s++) acc = DADD(acc, p[s]);
        sq[item] = acc;
        factors[item] = dp_clip_factor(clip[layer], acc);
    }
}

// Rows a column's thread reads ahead in the sums kernel: as in the norms, all its loads
// go out before the adds that wait for them, and the adds keep row order.
#define DP_ROWS_AHEAD 8

// One thread per column: the chunk's rows, each scaled by its layer's clip factor, added
// to the column's running sum in row order. Chunks must run in row order (their launcher
// orders them across lanes with events).
#define DP_CLIP_SUM_KERNEL(NAME, T)                                                       \
    extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)                   \
        NAME(const T *g, u64 rows, u64 cols, const u64 *bounds, u32 layers,               \
             const double *factors, double *sums) {                                       \
        const double *f = factors;                                                        \
        for (u64 d = blockIdx.x * (u64)blockDim.x + threadIdx.x; d < cols;                 \
             d += (u64)gridDim.x * blockDim.x) {                                          \
            u32 lo = 0, hi = layers;                                                      \
            while (hi - lo > 1) {                                                         \
                u32 mid = (lo + hi) / 2;                                                  \
                if (bounds[mid] <= d) lo = mid; else hi = mid;                            \
            }                                                                             \
            double acc = sums[d];                                                         \
            for (u64 b0 = 0; b0 < rows; b0 += DP_ROWS_AHEAD) {                            \
                T v[DP_ROWS_AHEAD];                                                       \
                _Pragma("unroll") for (u32 j = 0; j < DP_ROWS_AHEAD; j++)                 \
                    v[j] = b0 + j < rows ? g[(b0 + j) * cols + d] : (T)0;                 \
                _Pragma("unroll") for (u32 j = 0; j < DP_ROWS_AHEAD; j++)                 \
                    if (b0 + j < rows)                                                    \
                        acc = DADD(acc, DMUL((double)v[j], f[(b0 + j) * layers + lo]));   \
            }                                                                             \
            sums[d] = acc;                                                                \
        }                                                                                 \
    }

DP_CLIP_SUM_KERNEL(dp_clip_sum_f32, float)
DP_CLIP_SUM_KERNEL(dp_clip_sum_f64, double)

// Each column's sum snapped to the grid, with discrete Gaussian noise from the column's
// own stream, divided for `mean`.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    dp_snap_noise(const double *sums, u64 cols, const u32 *key, double inv_grid,
                  double grid, u64 t, u64 c, double divisor, double *out) {
    u32 k[8];
    for (int i = 0; i < 8; i++) k[i] = key[i];
    for (u64 d = blockIdx.x * (u64)blockDim.x + threadIdx.x; d < cols;
         d += (u64)gridDim.x * blockDim.x) {
        i64 snapped = (i64)rint(DMUL(sums[d], inv_grid));
        dp_bits bits;
        dp_bits_init(&bits, k, DP_DOMAIN_GAUSSIAN, d);
        i64 noise = dp_discrete_gaussian(&bits, t, c);
        out[d] = __ddiv_rn(dp_release(snapped, noise, grid), divisor);
    }
}

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
