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
