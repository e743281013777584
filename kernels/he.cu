// Aggregation of BFV ciphertexts (ops/he/sum.rs is the CPU twin): out[e] = Σ_k w_k ·
// x_k[e] mod q, for every residue e of the 2 × L × n rows of a ciphertext (component c,
// RNS modulus j = row % L, coefficient i), with w_k = 1 when unweighted. The crate's own
// `+` and its product by a constant plaintext are these per-residue operations, in NTT
// form as in memory. One thread per residue, looping over the ciphertexts, so a warp
// reads consecutive residues of one ciphertext. The host passes every weight (1 where the
// request gave none) and, per weight and modulus, Shoup's quotient ⌊w · 2^64 / q_j⌋, so a
// weighted product is two multiplications and a conditional subtraction, no division.
// The sum is accumulated onto `out` (zeroed for the first): the host streams the
// ciphertexts in chunks, `first` the index of the chunk's first among the weights, and
// each of its two lanes keeps a running sum that the last launch folds together.
#include "common.cuh"

// The high word of a 64 × 64-bit product (the emulated device builds this file as C++).
FIELD_FN u64 he_mul_hi(u64 a, u64 b) {
#ifdef GPU_OPS_DEVICE
    return __umul64hi(a, b);
#else
    return (u64)(((unsigned __int128)a * b) >> 64);
#endif
}

// A grid-stride loop over DeviceLease::launch_config's blocks (src/ops/he/gpu.rs).
extern "C" __global__ void __launch_bounds__(LAUNCH_CONFIG_THREADS)
    he_ciphertext_sum(const u64 *rows, const u64 *moduli, const u64 *weights, const u64 *shoup,
                      u64 *out, u64 per_ct, u32 count, u64 first, u32 levels, u64 degree) {
    for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < per_ct;
         e += (u64)gridDim.x * blockDim.x) {
        u32 j = (u32)((e / degree) % levels);
        u64 q = moduli[j];
        u64 acc = out[e];
        for (u32 k = 0; k < count; k++) {
            u64 x = rows[(u64)k * per_ct + e];
            u64 w = weights[first + k];
            if (w != 1) {
                // x, w < q < 2^63: the estimate is low by at most one q.
                u64 estimate = he_mul_hi(x, shoup[(first + k) * levels + j]);
                x = x * w - estimate * q;
                if (x >= q) x -= q;
            }
            acc += x;
            if (acc >= q) acc -= q;
        }
        out[e] = acc;
    }
}
