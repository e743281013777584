// Element-wise field vector ops: out[i] = a[i] (op) b[i * b_stride].
// b_stride is 1 for equal lengths and 0 to broadcast a single b.
#include "bn254_fr.cuh"
#include "goldilocks.cuh"

#define BN254_KERNEL(NAME, FN)                                                            \
    extern "C" __global__ void NAME(const uint4 *a, const uint4 *b, uint4 *out, u64 n,     \
                                    u32 b_stride) {                                       \
        for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;                    \
             i += (u64)gridDim.x * blockDim.x) {                                          \
            u64 j = i * b_stride;                                                         \
            uint4 a0 = a[2 * i], a1 = a[2 * i + 1], b0 = b[2 * j], b1 = b[2 * j + 1];     \
            u32 x[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};                  \
            u32 y[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};                  \
            u32 r[8];                                                                     \
            FN(r, x, y);                                                                  \
            out[2 * i] = make_uint4(r[0], r[1], r[2], r[3]);                              \
            out[2 * i + 1] = make_uint4(r[4], r[5], r[6], r[7]);                          \
        }                                                                                 \
    }

BN254_KERNEL(bn254_fr_add, bn254_add)
BN254_KERNEL(bn254_fr_sub, bn254_sub)
BN254_KERNEL(bn254_fr_mul, bn254_mul)

#define GOLDILOCKS_KERNEL(NAME, FN)                                                       \
    extern "C" __global__ void NAME(const u64 *a, const u64 *b, u64 *out, u64 n,           \
                                    u32 b_stride) {                                       \
        for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;                    \
             i += (u64)gridDim.x * blockDim.x) {                                          \
            out[i] = FN(a[i], b[i * b_stride]);                                           \
        }                                                                                 \
    }

GOLDILOCKS_KERNEL(goldilocks_add, gl_add)
GOLDILOCKS_KERNEL(goldilocks_sub, gl_sub)
GOLDILOCKS_KERNEL(goldilocks_mul, gl_mul)

// out[i] = base[i] ^ exp[i * e_stride]; exponents are 256-bit, 8 little-endian u32 limbs.
extern "C" __global__ void bn254_fr_pow(const u32 *base, const u32 *exp, u32 *out, u64 n,
                                        u32 e_stride) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        bn254_pow(out + 8 * i, base + 8 * i, exp + 8 * i * e_stride);
    }
}

extern "C" __global__ void goldilocks_pow(const u64 *base, const u64 *exp, u64 *out, u64 n,
                                         u32 e_stride) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        out[i] = gl_pow(base[i], exp + 4 * i * e_stride);
    }
}

// Batch inversion: each thread inverts its own chunk of `chunk` consecutive elements
// with Montgomery's trick (one Fermat inversion per chunk). Inputs are nonzero.
extern "C" __global__ void bn254_fr_inv(const u32 *in, u32 *out, u64 n, u64 chunk) {
    u64 chunks = (n + chunk - 1) / chunk;
    for (u64 c = blockIdx.x * (u64)blockDim.x + threadIdx.x; c < chunks;
         c += (u64)gridDim.x * blockDim.x) {
        u64 start = c * chunk;
        u64 len = n - start < chunk ? n - start : chunk;
        bn254_batch_inv(out + 8 * start, in + 8 * start, len);
    }
}

extern "C" __global__ void goldilocks_inv(const u64 *in, u64 *out, u64 n, u64 chunk) {
    u64 chunks = (n + chunk - 1) / chunk;
    for (u64 c = blockIdx.x * (u64)blockDim.x + threadIdx.x; c < chunks;
         c += (u64)gridDim.x * blockDim.x) {
        u64 start = c * chunk;
        u64 len = n - start < chunk ? n - start : chunk;
        gl_batch_inv(out + start, in + start, len);
    }
}
