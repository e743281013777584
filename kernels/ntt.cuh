// NTT index maps and butterflies, shared by the kernels in ntt.cu and their host twin
// (kernels/host/ntt_host.cpp), so CI runs the exact indexing the GPU runs.
//
// A radix-2 decimation-in-time NTT on bit-reversed input: stage `half` (1, 2, 4, ...)
// pairs i0 and i0 + half inside blocks of 2·half and multiplies the upper element by
// ω_n^(j·n/(2·half)), j = i0 mod half; the twiddle table holds ω_n^k, k < n/2. The 256-bit
// fields' twiddles and scale factors are in Montgomery form (t·R mod p), so one Montgomery
// product gives the canonical x·t: the data stays canonical at half the cost of fp_mul.
#ifndef GPU_OPS_NTT_CUH
#define GPU_OPS_NTT_CUH
#include "bn254_fr.cuh"
#include "bls12_381_fr.cuh"
#include "goldilocks.cuh"
#include "babybear.cuh"

FIELD_FN u64 ntt_bitrev(u64 k, u32 bits) {
    u64 r = 0;
    for (u32 b = 0; b < bits; b++) r |= ((k >> b) & 1ull) << (bits - 1 - b);
    return r;
}

// Butterfly t (< total/2) of a whole-array stage over polynomials of n: its lower index
// and twiddle index.
FIELD_FN void ntt_stage_pair(u64 t, u64 n, u64 half, u64 *i0, u64 *w) {
    u64 poly = t / (n / 2), k = t % (n / 2), j = k % half;
    *i0 = poly * n + (k / half) * 2 * half + j;
    *w = j * (n / (2 * half));
}

// Butterfly k (< tile/2) of stage `half` inside one tile: the same map within the tile.
// Tiles are aligned and no larger than n, so a tile never straddles two polynomials and
// its stages below the tile size never leave it.
FIELD_FN void ntt_tile_pair(u32 k, u32 half, u64 n, u32 *i0, u64 *w) {
    u32 j = k & (half - 1);
    *i0 = ((k - j) << 1) + j;
    *w = (u64)j * (n / (2 * (u64)half));
}

// (a, b) <- (a + w·b, a - w·b), w in Montgomery form.
template <int N>
FIELD_FN void fp_butterfly(const fp_params<N> *f, u32 *a, u32 *b, const u32 *w) {
    u32 u[N], v[N];
    for (int l = 0; l < N; l++) u[l] = a[l];
    fp_mont_mul(f, v, b, w);
    fp_add(f, a, u, v);
    fp_sub(f, b, u, v);
}

FIELD_FN void gl_butterfly(u64 *a, u64 *b, const u64 *w) {
    u64 u = *a, v = gl_mul(*b, *w);
    *a = gl_add(u, v);
    *b = gl_sub(u, v);
}

FIELD_FN void bb_butterfly(u32 *a, u32 *b, const u32 *w) {
    u32 u = *a, v = bb_mul(*b, *w);
    *a = bb_add(u, v);
    *b = bb_sub(u, v);
}

#endif
