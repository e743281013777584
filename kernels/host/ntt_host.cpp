/* Host build of the NTT kernels' index maps and butterflies (kernels/ntt.cuh), run in the
 * order the kernels run them: bit-reverse, the stages of each tile (shared memory on the
 * GPU), then the wide stages. Butterflies of one stage are independent, so a serial loop
 * computes what the threads compute. field: 0 bn254_fr, 1 bls12_381_fr, 2 goldilocks,
 * 3 babybear; words per element 8 u32, 8 u32, 1 u64 (as two u32), 1 u32. Twiddles as the
 * launcher uploads them (Montgomery form for the 256-bit fields). */
#include <stddef.h>
#include "../ntt.cuh"

template <class T, int W, class B>
static void ntt_run(T *x, const T *tw, u64 n, u64 total, u32 log_tile, B butterfly) {
    u32 log_n = 0;
    while ((1ull << log_n) < n) log_n++;
    for (u64 i = 0; i < total; i++) {
        u64 k = i % n, r = ntt_bitrev(k, log_n);
        if (k < r)
            for (int l = 0; l < W; l++) {
                T t = x[W * i + l];
                x[W * i + l] = x[W * (i - k + r) + l];
                x[W * (i - k + r) + l] = t;
            }
    }
    u32 tile = 1u << log_tile;
    for (u64 b = 0; b < total / tile; b++) {
        T *g = x + (u64)W * tile * b;
        for (u32 half = 1; half < tile; half <<= 1)
            for (u32 k = 0; k < tile / 2; k++) {
                u32 i0;
                u64 w;
                ntt_tile_pair(k, half, n, &i0, &w);
                butterfly(g + W * i0, g + W * (i0 + half), tw + W * w);
            }
    }
    for (u64 half = tile; half < n; half <<= 1)
        for (u64 t = 0; t < total / 2; t++) {
            u64 i0, w;
            ntt_stage_pair(t, n, half, &i0, &w);
            butterfly(x + W * i0, x + W * (i0 + half), tw + W * w);
        }
}

extern "C" int gpu_ops_host_ntt(int field, void *x, const void *tw, u64 n, u64 total,
                                u32 log_tile) {
    switch (field) {
    case 0:
        ntt_run<u32, 8>((u32 *)x, (const u32 *)tw, n, total, log_tile,
                        [](u32 *a, u32 *b, const u32 *w) { fp_butterfly(&BN254_FR, a, b, w); });
        return 0;
    case 1:
        ntt_run<u32, 8>((u32 *)x, (const u32 *)tw, n, total, log_tile,
                        [](u32 *a, u32 *b, const u32 *w) { fp_butterfly(&BLS12_381_FR, a, b, w); });
        return 0;
    case 2:
        ntt_run<u64, 1>((u64 *)x, (const u64 *)tw, n, total, log_tile, gl_butterfly);
        return 0;
    case 3:
        ntt_run<u32, 1>((u32 *)x, (const u32 *)tw, n, total, log_tile, bb_butterfly);
        return 0;
    }
    return -1;
}
