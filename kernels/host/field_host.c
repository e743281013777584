/* Host build of the kernels' field arithmetic: the same headers the GPU compiles,
 * run on the CPU so CI checks them bit for bit against the Rust/arkworks twin. */
#include <stddef.h>
#include "../bn254_fr.cuh"
#include "../goldilocks.cuh"

/* op: 0 add, 1 sub, 2 mul (the order of ops::zk::FieldOp). */
void gpu_ops_host_bn254_fr(int op, const u32 *a, const u32 *b, u32 *out, size_t n, size_t b_stride) {
    for (size_t i = 0; i < n; i++) {
        const u32 *x = a + 8 * i, *y = b + 8 * i * b_stride;
        u32 *r = out + 8 * i;
        if (op == 0) bn254_add(r, x, y);
        else if (op == 1) bn254_sub(r, x, y);
        else bn254_mul(r, x, y);
    }
}

void gpu_ops_host_goldilocks(int op, const u64 *a, const u64 *b, u64 *out, size_t n, size_t b_stride) {
    for (size_t i = 0; i < n; i++) {
        u64 x = a[i], y = b[i * b_stride];
        out[i] = op == 0 ? gl_add(x, y) : op == 1 ? gl_sub(x, y) : gl_mul(x, y);
    }
}

/* Exponents: 256-bit little-endian (8 u32 limbs for bn254_fr, 4 u64 words for goldilocks). */
void gpu_ops_host_bn254_fr_pow(const u32 *base, const u32 *exp, u32 *out, size_t n, size_t e_stride) {
    for (size_t i = 0; i < n; i++) bn254_pow(out + 8 * i, base + 8 * i, exp + 8 * i * e_stride);
}

void gpu_ops_host_goldilocks_pow(const u64 *base, const u64 *exp, u64 *out, size_t n, size_t e_stride) {
    for (size_t i = 0; i < n; i++) out[i] = gl_pow(base[i], exp + 4 * i * e_stride);
}

/* The kernels' chunked batch inversion, chunk by chunk. */
void gpu_ops_host_bn254_fr_inv(const u32 *in, u32 *out, size_t n, size_t chunk) {
    for (size_t s = 0; s < n; s += chunk) bn254_batch_inv(out + 8 * s, in + 8 * s, n - s < chunk ? n - s : chunk);
}

void gpu_ops_host_goldilocks_inv(const u64 *in, u64 *out, size_t n, size_t chunk) {
    for (size_t s = 0; s < n; s += chunk) gl_batch_inv(out + s, in + s, n - s < chunk ? n - s : chunk);
}
