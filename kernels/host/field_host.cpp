/* Host build of the kernels' field arithmetic: the same headers the GPU compiles, run on
 * the CPU so CI checks them bit for bit against the Rust/arkworks twin. `field` follows
 * ops::zk::Field: 0 bn254_fr, 1 bls12_381_fr, 2 goldilocks, 3 babybear; `op` follows
 * FieldOp: 0 add, 1 sub, 2 mul. Element widths: 8 u32 limbs, 8 limbs, 1 u64, 1 u32. */
#include <stddef.h>
#include "../bn254_fr.cuh"
#include "../bls12_381_fr.cuh"
#include "../goldilocks.cuh"
#include "../babybear.cuh"

static const fp_params<8> *fp256_of(int field) { return field == 0 ? &BN254_FR : &BLS12_381_FR; }

extern "C" void gpu_ops_host_field_binary(int field, int op, const void *a, const void *b, void *out, size_t n, size_t b_stride) {
    for (size_t i = 0; i < n; i++) {
        size_t j = i * b_stride;
        if (field <= 1) {
            const fp_params<8> *f = fp256_of(field);
            const u32 *x = (const u32 *)a + 8 * i, *y = (const u32 *)b + 8 * j;
            u32 *r = (u32 *)out + 8 * i;
            if (op == 0) fp_add(f, r, x, y);
            else if (op == 1) fp_sub(f, r, x, y);
            else fp_mul(f, r, x, y);
        } else if (field == 2) {
            u64 x = ((const u64 *)a)[i], y = ((const u64 *)b)[j];
            ((u64 *)out)[i] = op == 0 ? gl_add(x, y) : op == 1 ? gl_sub(x, y) : gl_mul(x, y);
        } else {
            u32 x = ((const u32 *)a)[i], y = ((const u32 *)b)[j];
            ((u32 *)out)[i] = op == 0 ? bb_add(x, y) : op == 1 ? bb_sub(x, y) : bb_mul(x, y);
        }
    }
}

/* Exponents are 256-bit little-endian: 8 u32 limbs (4 u64 words for goldilocks). */
extern "C" void gpu_ops_host_field_pow(int field, const void *base, const void *exp, void *out, size_t n, size_t e_stride) {
    for (size_t i = 0; i < n; i++) {
        size_t j = i * e_stride;
        if (field <= 1) {
            fp_pow(fp256_of(field), (u32 *)out + 8 * i, (const u32 *)base + 8 * i, (const u32 *)exp + 8 * j);
        } else if (field == 2) {
            ((u64 *)out)[i] = gl_pow(((const u64 *)base)[i], (const u64 *)exp + 4 * j);
        } else {
            ((u32 *)out)[i] = bb_pow(((const u32 *)base)[i], (const u32 *)exp + 8 * j);
        }
    }
}

/* The kernels' chunked batch inversion, chunk by chunk. */
extern "C" void gpu_ops_host_field_inv(int field, const void *in, void *out, size_t n, size_t chunk) {
    for (size_t s = 0; s < n; s += chunk) {
        size_t len = n - s < chunk ? n - s : chunk;
        if (field <= 1) fp_batch_inv(fp256_of(field), (u32 *)out + 8 * s, (const u32 *)in + 8 * s, len);
        else if (field == 2) gl_batch_inv((u64 *)out + s, (const u64 *)in + s, len);
        else bb_batch_inv((u32 *)out + s, (const u32 *)in + s, len);
    }
}
