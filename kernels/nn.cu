// Neural-network layers. conv_im2col_f32 and conv_bias_relu_f32: the two ends of a 2-D
// convolution whose middle is linalg.cu's matmul_f32 (src/ops/nn/conv2d.rs). attention_f32: fused scaled dot-product attention with an online
// softmax (src/ops/nn/attention.rs states the maths and the mask). One block owns
// ATT_QUERIES query rows of one (batch, head) and walks the visible keys in tiles of
// `tile` keys: the tile's logits, each row's running max and sum, the partial output
// rescaled and the tile's weighted values added. Nothing of size S × S_kv is ever held.
// All of it in dynamic shared memory (the launcher sizes `tile` to fit 48 KiB):
//   queries [ATT_QUERIES][d], keys [tile][d + 1] then values [tile][dv] in one region,
//   logits then weights [ATT_QUERIES][tile], output [ATT_QUERIES][dv],
//   max, sum and rescale [ATT_QUERIES] each, the softmax's pieces [ATT_QUERIES][ATT_SOFTMAX_PARTS].
// Blocks stride over (batch, head, query block). Inputs f32 (already rounded to the
// request's dtype), arithmetic f32; the launcher rounds the output.
#include "attention.cuh"
#include "common.cuh"

#define ATT_QUERIES 16
// attention_f32's block (THREADS in src/ops/nn/gpu.rs): any count of at least ATT_QUERIES
// works, since every loop strides by blockDim.x; the bound lets NVRTC budget registers
// for it. The other kernels are grid-stride loops over DeviceLease::launch_config's blocks.
#define ATT_THREADS 128
// Query rows one thread takes per key (logits) or per value column (output): each key
// or value word it reads from shared memory then serves that many rows' sums, whose
// query or weight words every thread of the warp reads at once (one broadcast). Fewer
// where a small tile or value width would leave threads idle (rows_per_thread).
#define ATT_ROWS_PER_THREAD 4
// Threads per query row in the softmax step (threads / ATT_QUERIES of them, up to this):
// each takes every parts-th logit of the tile for the row's max, then for the weights and
// their sum, so the exponentials of a tile are spread over the block rather than made by
// ATT_QUERIES threads while the others wait.
#define ATT_SOFTMAX_PARTS 8

// −∞ without <math.h> (NVRTC has none): the bit pattern, or the host's.
#ifdef GPU_OPS_DEVICE
#define ATT_NEG_INF __int_as_float(0xff800000)
#else
#define ATT_NEG_INF (-INFINITY)
#endif

// The rows per thread for `items` keys or value columns per row: ATT_ROWS_PER_THREAD
// halved while the block's threads would not each have an item (it divides ATT_QUERIES).
static __device__ __forceinline__ u32 att_rows_per_thread(u64 items, u32 threads) {
    u32 rows = ATT_ROWS_PER_THREAD;
    while (rows > 1 && (ATT_QUERIES / rows) * items < threads) rows /= 2;
    return rows;
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_f32(const float *q, const float *k, const float *v, const u32 *key_len,
                  float *out, float *lse, u64 batch, u64 heads, u64 kv_heads, u64 queries,
                  u64 keys, u64 d, u64 dv, u32 causal, float scale, u32 tile) {
    extern __shared__ float att_shared[];
    // A key's row is padded by one word: the threads of a warp read one word of
    // consecutive keys at once, and rows d words apart (a multiple of 32 for the usual
    // head dimensions) would all be in one bank, 32 reads in turn instead of one.
    u64 key_stride = d + 1;
    u64 width = key_stride > dv ? key_stride : dv;
    float *qs = att_shared;
    float *kv = qs + ATT_QUERIES * d;
    float *p = kv + tile * width;
    float *o = p + ATT_QUERIES * tile;
    float *row_max = o + ATT_QUERIES * dv;
    float *row_sum = row_max + ATT_QUERIES;
    float *rescale = row_sum + ATT_QUERIES;
    float *part = rescale + ATT_QUERIES;
    u32 tid = threadIdx.x, threads = blockDim.x;
    u32 parts = threads / ATT_QUERIES < ATT_SOFTMAX_PARTS ? threads / ATT_QUERIES : ATT_SOFTMAX_PARTS;
    u32 key_rows = att_rows_per_thread(tile, threads), value_rows = att_rows_per_thread(dv, threads);
    u64 blocks_per_head = (queries + ATT_QUERIES - 1) / ATT_QUERIES;
    for (u64 task = blockIdx.x; task < batch * heads * blocks_per_head; task += gridDim.x) {
        u64 bh = task / blocks_per_head, first = (task % blocks_per_head) * ATT_QUERIES;
        u64 b = bh / heads, h = bh % heads;
        u64 g = b * kv_heads + h / (heads / kv_heads);
        u64 rows = queries - first < ATT_QUERIES ? queries - first : ATT_QUERIES;
        u64 len = key_len[b];
        const float *qb = q + (bh * queries + first) * d;
        const float *kb = k + g * keys * d, *vb = v + g * keys * dv;
        for (u64 e = tid; e < ATT_QUERIES * d; e += threads)
            qs[e] = e / d < rows ? qb[e] : 0.0f;
        for (u64 e = tid; e < ATT_QUERIES * dv; e += threads) o[e] = 0.0f;
        if (tid < ATT_QUERIES) {
            row_max[tid] = ATT_NEG_INF;
            row_sum[tid] = 0.0f;
        }
        // The block's last row sees the most keys.
        u64 key_end = attention_visible(len, first + rows - 1, queries, causal);
        __syncthreads();
        for (u64 k0 = 0; k0 < key_end; k0 += tile) {
            u64 n = key_end - k0 < tile ? key_end - k0 : tile;
            for (u64 e = tid; e < tile * d; e += threads)
                kv[e / d * key_stride + e % d] = e / d < n ? kb[k0 * d + e] : 0.0f;
            __syncthreads();
            // Logit (r, j) for rows r0 .. r0 + key_rows of key j, each summed over c in
            // order (attention_weights_f32 sums it the same way).
            for (u64 e = tid; e < ATT_QUERIES / key_rows * tile; e += threads) {
                u64 r0 = e / tile * key_rows, j = e % tile;
                const float *kj = kv + j * key_stride;
                float dot[ATT_ROWS_PER_THREAD] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (u64 c = 0; c < d; c++) {
                    float kc = kj[c];
                    for (u32 t = 0; t < ATT_ROWS_PER_THREAD; t++)
                        if (t < key_rows) dot[t] = fmaf(qs[(r0 + t) * d + c], kc, dot[t]);
                }
                for (u32 t = 0; t < ATT_ROWS_PER_THREAD; t++) {
                    u64 r = r0 + t;
                    if (t >= key_rows) continue;
                    bool seen = r < rows && j < n &&
                                k0 + j < attention_visible(len, first + r, queries, causal);
                    p[r * tile + j] = seen ? dot[t] * scale : ATT_NEG_INF;
                }
            }
            __syncthreads();
            // Softmax, each row in `parts` pieces of every parts-th logit: the pieces' max,
            // then the row's new max and the rescale of what it held so far...
            if (tid < ATT_QUERIES * parts) {
                u32 r = tid / parts, s = tid % parts;
                const float *row = p + r * tile;
                float top = ATT_NEG_INF;
                for (u32 j = s; j < tile; j += parts) top = fmaxf(top, row[j]);
                part[r * ATT_SOFTMAX_PARTS + s] = top;
            }
            __syncthreads();
            if (tid < ATT_QUERIES) {
                float top = row_max[tid];
                for (u32 s = 0; s < parts; s++) top = fmaxf(top, part[tid * ATT_SOFTMAX_PARTS + s]);
                // Nothing visible yet: no rescale, and the row's weights and partial output
                // stay zero. expf(-inf) = 0: a row's first visible tile needs no rescale.
                rescale[tid] = top == ATT_NEG_INF ? 1.0f : expf(row_max[tid] - top);
                row_max[tid] = top;
            }
            __syncthreads();
            // ...then the weights, each piece summing its own...
            if (tid < ATT_QUERIES * parts) {
                u32 r = tid / parts, s = tid % parts;
                float *row = p + r * tile;
                float top = row_max[r], added = 0.0f;
                for (u32 j = s; j < tile; j += parts) {
                    row[j] = row[j] == ATT_NEG_INF ? 0.0f : expf(row[j] - top);
                    added += row[j];
                }
                part[r * ATT_SOFTMAX_PARTS + s] = added;
            }
            __syncthreads();
            // ...and the row's sum, in piece order, beside the values' load below.
            if (tid < ATT_QUERIES) {
                float added = 0.0f;
                for (u32 s = 0; s < parts; s++) added += part[tid * ATT_SOFTMAX_PARTS + s];
                row_sum[tid] = row_sum[tid] * rescale[tid] + added;
            }
            // The keys are read: the values take their place.
            for (u64 e = tid; e < tile * dv; e += threads)
                kv[e] = e / dv < n ? vb[k0 * dv + e] : 0.0f;
            __syncthreads();
            // Output column c of rows r0 .. r0 + value_rows: each rescaled, then the
            // tile's weighted values added in key order.
            for (u64 e = tid; e < ATT_QUERIES / value_rows * dv; e += threads) {
                u64 r0 = e / dv * value_rows, c = e % dv;
                float acc[ATT_ROWS_PER_THREAD] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (u32 t = 0; t < ATT_ROWS_PER_THREAD; t++)
                    if (t < value_rows) acc[t] = o[(r0 + t) * dv + c] * rescale[r0 + t];
                for (u64 j = 0; j < n; j++) {
                    float vc = kv[j * dv + c];
                    for (u32 t = 0; t < ATT_ROWS_PER_THREAD; t++)
                        if (t < value_rows) acc[t] = fmaf(p[(r0 + t) * tile + j], vc, acc[t]);
                }
                for (u32 t = 0; t < ATT_ROWS_PER_THREAD; t++)
                    if (t < value_rows) o[(r0 + t) * dv + c] = acc[t];
            }
            // The next tile overwrites keys, logits and rescales.
            __syncthreads();
        }
        float *ob = out + (bh * queries + first) * dv;
        for (u64 e = tid; e < rows * dv; e += threads) {
            float sum = row_sum[e / dv];
            ob[e] = sum > 0.0f ? o[e] / sum : 0.0f;
        }
        if (tid < rows) {
            float sum = row_sum[tid];
            lse[bh * queries + first + tid] = sum > 0.0f ? row_max[tid] + logf(sum) : ATT_NEG_INF;
        }
        // The next task overwrites every shared array.
        __syncthreads();
    }
}

// The weights exp(scale·q·k − lse) of attention_f32's rows (zero where masked), one
// thread per weight. The logit is summed in the fused kernel's order, so the weights of
// a row are those its output was formed from, normalised by its own log-sum-exp.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    attention_weights_f32(const float *q, const float *k, const u32 *key_len, const float *lse,
                          float *weights, u64 batch, u64 heads, u64 kv_heads, u64 queries,
                          u64 keys, u64 d, u32 causal, float scale) {
    u64 total = batch * heads * queries * keys;
    for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < total;
         e += (u64)gridDim.x * blockDim.x) {
        u64 row = e / keys, j = e % keys;
        u64 bh = row / queries, i = row % queries;
        u64 b = bh / heads, h = bh % heads;
        u64 g = b * kv_heads + h / (heads / kv_heads);
        float w = 0.0f;
        if (j < attention_visible(key_len[b], i, queries, causal)) {
            const float *qi = q + row * d, *kj = k + (g * keys + j) * d;
            float dot = 0.0f;
            for (u64 c = 0; c < d; c++) dot = fmaf(qi[c], kj[c], dot);
            w = expf(dot * scale - lse[row]);
        }
        weights[e] = w;
    }
}

// One image's windows: cols[(c·kh + i)·kw + j][oh·out_w + ow] is the input at row
// oh·stride_h + i·dil_h − pad_top and column ow·stride_w + j·dil_w − pad_left of channel
// c, or 0 in the padding. Channels of one group are consecutive rows, so group g's
// rows start at g·(channels/groups)·kh·kw. The image starts at value `image_at` of its
// buffer: a held batch of images is read in place (src/ops/nn/conv_launch.rs).
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    conv_im2col_f32(const float *images, u64 image_at, float *cols, u64 channels,
                    u64 height, u64 width, u64 kh, u64 kw, u64 out_h, u64 out_w,
                    u64 stride_h, u64 stride_w, u64 pad_top, u64 pad_left, u64 dil_h,
                    u64 dil_w) {
    const float *image = images + image_at;
    u64 positions = out_h * out_w, total = channels * kh * kw * positions;
    for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < total;
         e += (u64)gridDim.x * blockDim.x) {
        u64 row = e / positions, p = e % positions;
        u64 c = row / (kh * kw), r = row % (kh * kw);
        u64 y = (p / out_w) * stride_h + (r / kw) * dil_h;
        u64 x = (p % out_w) * stride_w + (r % kw) * dil_w;
        bool inside = y >= pad_top && y - pad_top < height && x >= pad_left && x - pad_left < width;
        cols[e] = inside ? image[(c * height + y - pad_top) * width + x - pad_left] : 0.0f;
    }
}

// out[o][p] += bias[o] (when has_bias), then max(·, 0) (when relu), in place.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    conv_bias_relu_f32(float *out, const float *bias, u64 channels, u64 positions,
                       u32 has_bias, u32 relu) {
    for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < channels * positions;
         e += (u64)gridDim.x * blockDim.x) {
        float v = out[e];
        if (has_bias) v += bias[e / positions];
        if (relu && v < 0.0f) v = 0.0f;
        out[e] = v;
    }
}
