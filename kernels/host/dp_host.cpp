/* Host build of the privacy-noise samplers (kernels/dp_noise.cuh): the code the GPU
 * runs, checked in CI against the Rust twin and RFC 8439 without a GPU. */
#include <stddef.h>
#include "../dp_noise.cuh"

extern "C" void gpu_ops_host_chacha20_block(const u32 *key, u32 counter, u32 n0, u32 n1, u32 n2,
                                 u32 *out) {
    dp_chacha20_block(key, counter, n0, n1, n2, out);
}

/* kind: 0 discrete Gaussian (t, c), 1 discrete Laplace (t). */
extern "C" void gpu_ops_host_dp_noise(int kind, const u32 *key, u32 domain, u64 first, size_t n, u64 t,
                           u64 c, i64 *out) {
    for (size_t i = 0; i < n; i++) {
        dp_bits bits;
        dp_bits_init(&bits, key, domain, first + i);
        out[i] = kind == 0 ? dp_discrete_gaussian(&bits, t, c) : dp_discrete_laplace(&bits, t);
    }
}

/* n / m and n % m (m >= 1) by the kernels' own division, each as (low, high) words. */
extern "C" void gpu_ops_host_dp_divmod_u128(u64 n_lo, u64 n_hi, u64 m_lo, u64 m_hi, u64 *out) {
    u128 rem;
    u128 q = dp_divmod_u128(((u128)n_hi << 64) | n_lo, ((u128)m_hi << 64) | m_lo, &rem);
    out[0] = (u64)q;
    out[1] = (u64)(q >> 64);
    out[2] = (u64)rem;
    out[3] = (u64)(rem >> 64);
}
