// Dense linear algebra; embedding lookups at the end. matmul_f32: D = alpha·op(A)·op(B) + beta·C, batched, in f32 with
// f32 accumulation, on operands the launcher (src/ops/linalg/gpu.rs) already rounded to
// the compute precision. Each block computes 64 × 64 outputs of one batch entry (256
// threads, 4 × 4 each, rows and columns 16 apart), staging 16-deep slices of A and B
// through shared memory; blocks stride over (batch, row tile, column tile).
#include "common.cuh"

#define MM_TILE 64
#define MM_DEPTH 16
#define MM_THREADS 256

// Exactly MM_THREADS threads a block (the launcher's THREADS, src/ops/linalg/gpu.rs): the
// 16 × 16 layout of 4 × 4 outputs each and the staging stride assume it.
extern "C" __global__ void __launch_bounds__(MM_THREADS)
    matmul_f32(const float *a, const float *b, const float *c, float *d, u64 m, u64 n, u64 k,
               u64 a_batch, u64 a_row, u64 a_col, u64 b_batch, u64 b_row, u64 b_col,
               u64 c_batch, u32 has_c, float alpha, float beta, u64 batches) {
    __shared__ float a_tile[MM_DEPTH][MM_TILE];
    __shared__ float b_tile[MM_DEPTH][MM_TILE];
    u64 tiles_m = (m + MM_TILE - 1) / MM_TILE, tiles_n = (n + MM_TILE - 1) / MM_TILE;
    u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    for (u64 tile = blockIdx.x; tile < batches * tiles_m * tiles_n; tile += gridDim.x) {
        u64 entry = tile / (tiles_m * tiles_n), rest = tile % (tiles_m * tiles_n);
        u64 i0 = (rest / tiles_n) * MM_TILE, j0 = (rest % tiles_n) * MM_TILE;
        const float *ab = a + entry * a_batch, *bb = b + entry * b_batch;
        float acc[4][4];
        for (int r = 0; r < 4; r++)
            for (int s = 0; s < 4; s++) acc[r][s] = 0.0f;
        for (u64 p0 = 0; p0 < k; p0 += MM_DEPTH) {
            for (u32 e = threadIdx.x; e < MM_DEPTH * MM_TILE; e += MM_THREADS) {
                u32 row = e / MM_DEPTH, depth = e % MM_DEPTH;
                u64 i = i0 + row, p = p0 + depth;
                a_tile[depth][row] = i < m && p < k ? ab[i * a_row + p * a_col] : 0.0f;
                u32 col = e % MM_TILE, bdepth = e / MM_TILE;
                u64 j = j0 + col, q = p0 + bdepth;
                b_tile[bdepth][col] = j < n && q < k ? bb[q * b_row + j * b_col] : 0.0f;
            }
            __syncthreads();
            for (int depth = 0; depth < MM_DEPTH; depth++) {
                float av[4], bv[4];
                for (int r = 0; r < 4; r++) av[r] = a_tile[depth][ty + 16 * r];
                for (int s = 0; s < 4; s++) bv[s] = b_tile[depth][tx + 16 * s];
                for (int r = 0; r < 4; r++)
                    for (int s = 0; s < 4; s++) acc[r][s] = fmaf(av[r], bv[s], acc[r][s]);
            }
            // The next slice overwrites the tiles: every thread must be done reading.
            __syncthreads();
        }
        for (int r = 0; r < 4; r++) {
            u64 i = i0 + ty + 16 * r;
            if (i >= m) continue;
            for (int s = 0; s < 4; s++) {
                u64 j = j0 + tx + 16 * s;
                if (j >= n) continue;
                float v = alpha * acc[r][s];
                if (has_c) v = fmaf(beta, c[entry * c_batch + i * n + j], v);
                d[(entry * m + i) * n + j] = v;
            }
        }
    }
}

// Kernels for results kept on a device.
// A product kept on the device (src/ops/linalg/kept.rs) rounded to its output dtype in
// place, as the host's Dtype::round does: `dtype` 1 is f16, 2 bf16 (round to nearest,
// ties to even, kept in f32), 0 leaves each value as it is. Sets *non_finite to 1 when a
// value is left not finite (an overflow of the dtype, or of f32's sums), so the launcher
// learns of one without reading the product back (a flag, not a count: a count could
// wrap). A grid-stride loop.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    round_output_f32(float *v, u64 n, u32 dtype, u32 *non_finite) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        u32 bits = __float_as_uint(v[i]);
        u32 magnitude = bits & 0x7fffffffu;
        if (magnitude < 0x7f800000u && dtype == 1) {
            if (magnitude >= 0x477fe000u + 0x1000u) {
                // 65520, halfway between f16's largest value and 2^16, and above: infinity.
                bits = (bits & 0x80000000u) | 0x7f800000u;
            } else if (magnitude < 0x38800000u) {
                // Below 2^-14, f16's subnormals: a multiple of 2^-24 (exact scalings).
                bits = __float_as_uint(rintf(v[i] * 16777216.0f) * 5.9604644775390625e-8f);
            } else {
                bits = (bits + 0xfffu + ((bits >> 13) & 1u)) & 0xffffe000u;
            }
        } else if (magnitude < 0x7f800000u && dtype == 2) {
            bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
        }
        v[i] = __uint_as_float(bits);
        if ((bits & 0x7f800000u) == 0x7f800000u) atomicMax(non_finite, 1u);
    }
}

// A run of f32 values copied from one device buffer into another, each at its own
// offset (src/ops/linalg/gpu.rs, copy_range): a kept convolution reads its images out of
// the held tensor that is its input and writes each pass's output into the whole output
// it keeps (src/ops/nn/kept.rs). Engines copy whole buffers only. A grid-stride loop.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    copy_range_f32(const float *src, u64 src_at, float *dst, u64 dst_at, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        dst[dst_at + i] = src[src_at + i];
    }
}

// f32 values packed into 16-bit storage for cuBLASLt (src/ops/linalg/gpu.rs, pack_half):
// dtype 1 is f16, 2 bf16. Matmul's operands arrive already rounded to the compute type,
// so the packing is exact; it still rounds to nearest, ties to even (as round_output_f32
// does) so that any f32 but NaN (whose payload is not kept) packs as `half` packs it. The library then reads
// half the bytes, and runs its native 16-bit kernels instead of converting f32 operands
// itself. A grid-stride loop.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    pack_half_f32(const float *v, u64 n, u32 dtype, unsigned short *out) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        u32 bits = __float_as_uint(v[i]);
        u32 sign = (bits >> 16) & 0x8000u;
        u32 magnitude = bits & 0x7fffffffu;
        u32 packed;
        if (dtype == 2) {
            if (magnitude > 0x7f800000u) {
                packed = sign | 0x7fc0u;
            } else if (magnitude == 0x7f800000u) {
                packed = sign | 0x7f80u;
            } else {
                // Rounding up may carry into the exponent, to infinity at the top: as bf16.
                packed = ((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16) & 0xffffu;
            }
        } else if (magnitude > 0x7f800000u) {
            packed = sign | 0x7e00u;
        } else if (magnitude >= 0x477fe000u + 0x1000u) {
            // 65520 and above (infinity included): f16's infinity.
            packed = sign | 0x7c00u;
        } else if (magnitude < 0x38800000u) {
            // Below 2^-14: f16's subnormals, k · 2^-24 for the nearest integer k <= 1024
            // (1024 is 2^-14 itself, f16's smallest normal: the same bits).
            packed = sign | (u32)rintf(__uint_as_float(magnitude) * 16777216.0f);
        } else {
            u32 rounded = (magnitude + 0xfffu + ((magnitude >> 13) & 1u)) >> 13;
            // Rebias the exponent from 127 to 15: 112 << 10 off the shifted bits.
            packed = sign | (rounded - (112u << 10));
        }
        out[i] = (unsigned short)packed;
    }
}

// The reverse of pack_half_f32, exact: 16-bit f16 (dtype 1) or bf16 (2) values widened
// to f32 (src/ops/linalg/on_device.rs, unpack_half), for a product whose operands were
// uploaded packed but that our kernel runs after all (cuBLASLt declined it).
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    unpack_half_f32(const unsigned short *in, u64 n, u32 dtype, float *out) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        u32 h = in[i];
        u32 bits;
        if (dtype == 2) {
            bits = h << 16;
        } else {
            u32 sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
            if (exponent == 0x1fu) {
                bits = sign | 0x7f800000u | (mantissa << 13);
            } else if (exponent == 0) {
                // Subnormal (or zero): mantissa · 2^-24, exact in f32.
                bits = sign | __float_as_uint((float)mantissa * 5.9604644775390625e-8f);
            } else {
                bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
            }
        }
        out[i] = __uint_as_float(bits);
    }
}

// Whether a field vector a device holds has a zero element (src/ops/zk/held/whole.rs: an
// inversion of a kept result checks its operand where it lies, not on the host): `words`
// u32 words an element (the u64 fields' words read as pairs of u32; every field's kernels
// write canonical elements, so zero is all words zero); *zeros set to 1 if one is.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    any_zero_element(const u32 *x, u64 n, u32 words, u32 *zeros) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        u32 any = 0;
        for (u32 w = 0; w < words; w++) any |= x[i * words + w];
        if (!any) atomicMax(zeros, 1u);
    }
}

// Sinusoidal embeddings (src/ops/linalg/sinusoidal.rs): row j, pair i gets sin and cos of
// times[j]·freq[i] in f64, at (2i, 2i + 1) or, split, at (i, half + i). The launcher
// rounds to the output dtype. A grid-stride loop over DeviceLease::launch_config's blocks,
// as is the gather below.
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    sinusoidal_f64(const double *times, u64 rows, const double *freq, u32 half, u32 split,
                   double *out) {
    for (u64 k = blockIdx.x * (u64)blockDim.x + threadIdx.x; k < rows * half;
         k += (u64)gridDim.x * blockDim.x) {
        u64 j = k / half, i = k % half;
        double angle = times[j] * freq[i];
        double *row = out + j * 2 * half;
        row[split ? i : 2 * i] = sin(angle);
        row[split ? half + i : 2 * i + 1] = cos(angle);
    }
}

// Embedding lookups (src/ops/linalg/lookup.rs): row i of out is row ids[i] of the resident
// table (every id below its rows, checked on the host).
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    embedding_gather_f32(const float *table, u64 dim, const u32 *ids, u64 rows, float *out) {
    for (u64 k = blockIdx.x * (u64)blockDim.x + threadIdx.x; k < rows * dim;
         k += (u64)gridDim.x * blockDim.x)
        out[k] = table[(u64)ids[k / dim] * dim + k % dim];
}
