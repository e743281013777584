// Fused scaled dot-product attention on tensor cores, for f16 and bf16 inputs (issue 58):
// FlashAttention-2's plan. A block owns MMA_ROWS query rows of one (batch, head), 16 per
// warp, and walks the visible keys in tiles of MMA_KEYS: each warp multiplies its queries
// by the tile's keys with mma.sync (m16n8k16, f32 accumulators), applies the mask and
// the online softmax to the scores in its registers, turns them into the A operand of
// the next product without a trip through shared memory (an accumulator's layout is the
// A operand's, two 8-column tiles to one 16-column step), and adds P·V to the output it
// keeps in registers. Only Q, K and V pass through shared memory.
//
// The maths, the mask and the result are attention_f32's (kernels/nn.cu,
// src/ops/nn/attention.rs); what differs is held to the tolerance docs/TENSORS.md
// states: P is rounded to the input dtype before P·V (the row sums take it unrounded, as
// FlashAttention's do), and tensor cores accumulate in f32 in an order of their own.
//
// NVIDIA only (sm_80 and later: every shipped architecture): mma.sync and warp shuffles,
// so it lives under kernels/nvidia/ and is never compiled for AMD
// (`KernelModule::nvidia_only`). The emulated device runs it with warp collectives of
// its own (kernels/emu/runtime.cpp): fragments in exactly PTX's lane layout, and a
// collective that not every lane of a warp reaches fails the launch.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"), lane = 4·g + t:
//   A (16×16, row-major), four registers of two halves, the lower half the lower column:
//     a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16×8, k × n): b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C, D (16×8, f32): c0, c1 = C[g][2t], C[g][2t+1]; c2, c3 = C[g+8][2t], C[g+8][2t+1]
// Shared memory (dynamic, sized by the launcher): Q [MMA_ROWS][dq], K [MMA_KEYS][dq],
// V [MMA_KEYS][dw] as 16-bit values, rows padded by MMA_PAD values so the eight rows an
// ldmatrix reads start in different banks (and every row on 16 bytes); dq and dw are D
// and D_v rounded up to 16, and the padding columns hold zeros (a zero adds nothing to a
// dot product). Fragments come out of shared memory by ldmatrix, four 8×8 matrices a
// call (V's transposed); rows whose length is a multiple of 8 are staged 16 bytes a load.
#include "attention.cuh"
#include "common.cuh"

typedef unsigned short u16;

#define MMA_WARPS 4
#define MMA_ROWS (16 * MMA_WARPS)
#define MMA_THREADS (32 * MMA_WARPS)
#define MMA_KEYS 32
// The largest D and D_v (the output accumulators live in registers, sized for it).
#define MMA_MAX_DIM 128
#define MMA_PAD 8

#ifdef GPU_OPS_DEVICE
#define MMA_NEG_INF __int_as_float(0xff800000)

// d += A·B on the warp's tensor cores.
template <bool BF16>
__device__ __forceinline__ void warp_mma(float d[4], const u32 a[4], const u32 b[2]) {
    if constexpr (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

// Two f32 rounded to the nearest f16 or bf16 (ties to even), `lo` in the lower half.
template <bool BF16> __device__ __forceinline__ u32 pack_pair(float lo, float hi) {
    u32 r;
    if constexpr (BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

// Four 8×8 matrices of 16-bit values from shared memory, lane l naming row l % 8 of
// matrix l / 8; `_trans` gives each lane a column pair instead of a row pair.
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], const u16 *row) {
    u32 at = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], const u16 *row) {
    u32 at = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}
#define LDMATRIX_X4(r, row) ldmatrix_x4(r, row)
#define LDMATRIX_X4_TRANS(r, row) ldmatrix_x4_trans(r, row)

// 16 bytes from `from` to `to`, both 16-byte aligned.
__device__ __forceinline__ void copy16(u16 *to, const u16 *from) {
    *reinterpret_cast<uint4 *>(to) = *reinterpret_cast<const uint4 *>(from);
}

#define WARP_MMA(BF16, d, a, b) warp_mma<BF16>(d, a, b)
#define WARP_XOR_MAX(x, m) fmaxf((x), __shfl_xor_sync(0xffffffffu, (x), (m)))
#define WARP_XOR_SUM(x, m) ((x) + __shfl_xor_sync(0xffffffffu, (x), (m)))
#else
#define MMA_NEG_INF (-INFINITY)
template <bool BF16> inline u32 pack_pair(float lo, float hi) { return emu_pack_pair(BF16, lo, hi); }
#define WARP_MMA(BF16, d, a, b) emu_mma_m16n8k16(BF16, d, a, b, EMU_HERE)
#define LDMATRIX_X4(r, row) emu_ldmatrix_x4(false, r, row, EMU_HERE)
#define LDMATRIX_X4_TRANS(r, row) emu_ldmatrix_x4(true, r, row, EMU_HERE)
inline void copy16(u16 *to, const u16 *from) { std::memcpy(to, from, 16); }
#define WARP_XOR_MAX(x, m) fmaxf((x), emu_shfl_xor_f32((x), (m), EMU_HERE))
#define WARP_XOR_SUM(x, m) ((x) + emu_shfl_xor_f32((x), (m), EMU_HERE))
#endif

// `count` rows of `width` values from `src` (rows `stride` apart) into shared rows of
// `padded` values (plus MMA_PAD), zeros past `count` rows of `rows` and past `width`.
// Rows of a multiple of 8 values (16-byte aligned in every buffer the launcher passes)
// move 16 bytes a load.
__device__ __forceinline__ void stage_rows(u16 *dst, const u16 *src, u64 count, u64 rows,
                                           u64 width, u64 padded) {
    const u64 stride = padded + MMA_PAD;
    if (width % 8 == 0) {
        const u64 chunks = padded / 8;
        for (u64 e = threadIdx.x; e < rows * chunks; e += blockDim.x) {
            u64 r = e / chunks, c = e % chunks * 8;
            u16 *to = dst + r * stride + c;
            if (r < count && c < width) {
                copy16(to, src + r * width + c);
            } else {
                for (int i = 0; i < 8; i++) to[i] = 0;
            }
        }
        return;
    }
    for (u64 e = threadIdx.x; e < rows * padded; e += blockDim.x) {
        u64 r = e / padded, c = e % padded;
        dst[r * stride + c] = r < count && c < width ? src[r * width + c] : 0;
    }
}

template <bool BF16>
__device__ __forceinline__ void attention_mma(const u16 *q, const u16 *k, const u16 *v,
                                              const u32 *key_len, float *out, u64 batch,
                                              u64 heads, u64 kv_heads, u64 queries, u64 keys,
                                              u64 d, u64 dv, u32 causal, float scale) {
    extern __shared__ u16 mma_shared[];
    const u64 dq = (d + 15) / 16 * 16, dw = (dv + 15) / 16 * 16;
    const u64 q_stride = dq + MMA_PAD, v_stride = dw + MMA_PAD;
    u16 *qs = mma_shared;
    u16 *ks = qs + MMA_ROWS * q_stride;
    u16 *vs = ks + MMA_KEYS * q_stride;
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 g = lane / 4, t = lane % 4;
    // The row this lane names to ldmatrix: row lane % 8 of matrix lane / 8.
    const u32 m_row = lane % 8, m = lane / 8;
    const u64 d_steps = dq / 16, v_tiles = dw / 8;
    const u64 blocks_per_head = (queries + MMA_ROWS - 1) / MMA_ROWS;
    for (u64 task = blockIdx.x; task < batch * heads * blocks_per_head; task += gridDim.x) {
        u64 bh = task / blocks_per_head, first = (task % blocks_per_head) * MMA_ROWS;
        u64 b = bh / heads, h = bh % heads;
        u64 kvh = b * kv_heads + h / (heads / kv_heads);
        u64 rows = queries - first < MMA_ROWS ? queries - first : MMA_ROWS;
        u64 len = key_len[b];
        stage_rows(qs, q + (bh * queries + first) * d, rows, MMA_ROWS, d, dq);
        const u16 *kb = k + kvh * keys * d, *vb = v + kvh * keys * dv;
        // This lane's two rows of the block (g and g + 8 of its warp's 16), the keys
        // each sees (none for rows past the sequence's end), and the keys the warp's
        // last row and the block's last row see: a prefix grows with the row.
        u64 row0 = warp * 16 + g, row1 = row0 + 8;
        u64 end0 = row0 < rows ? attention_visible(len, first + row0, queries, causal) : 0;
        u64 end1 = row1 < rows ? attention_visible(len, first + row1, queries, causal) : 0;
        u64 warp_last = warp * 16 + 15 < rows - 1 ? warp * 16 + 15 : rows - 1;
        u64 warp_end =
            warp * 16 < rows ? attention_visible(len, first + warp_last, queries, causal) : 0;
        u64 block_end = attention_visible(len, first + rows - 1, queries, causal);
        float o[MMA_MAX_DIM / 8][4];
#pragma unroll
        for (int n = 0; n < MMA_MAX_DIM / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        float max0 = MMA_NEG_INF, max1 = MMA_NEG_INF, sum0 = 0.0f, sum1 = 0.0f;
        for (u64 k0 = 0; k0 < block_end; k0 += MMA_KEYS) {
            u64 n = block_end - k0 < MMA_KEYS ? block_end - k0 : MMA_KEYS;
            // The previous tile's readers are done (and, on the first, Q is staged).
            __syncthreads();
            stage_rows(ks, kb + k0 * d, n, MMA_KEYS, d, dq);
            stage_rows(vs, vb + k0 * dv, n, MMA_KEYS, dv, dw);
            __syncthreads();
            // Warp-uniform: a warp whose rows see none of this tile skips it whole.
            if (k0 >= warp_end) continue;
            float s[MMA_KEYS / 8][4];
#pragma unroll
            for (int j = 0; j < MMA_KEYS / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int step = 0; step < MMA_MAX_DIM / 16; step++) {
                if ((u64)step >= d_steps) break;
                // A: rows 0–7 then 8–15 of the warp's queries, columns 0–7 then 8–15.
                u32 a[4];
                LDMATRIX_X4(a, qs + (warp * 16 + m_row + 8 * (m & 1)) * q_stride + step * 16 +
                                   8 * (m >> 1));
#pragma unroll
                for (int j = 0; j < MMA_KEYS / 8; j += 2) {
                    // B[c][key] = K[key][c]: keys 8j.. (columns 0–7, 8–15 of the step),
                    // then keys 8j + 8.. likewise; a row of K is a column of B.
                    u32 bk[4];
                    LDMATRIX_X4(bk, ks + (j * 8 + m_row + 8 * (m >> 1)) * q_stride + step * 16 +
                                        8 * (m & 1));
                    WARP_MMA(BF16, s[j], a, bk);
                    WARP_MMA(BF16, s[j + 1], a, bk + 2);
                }
            }
            // Scale and mask; each row's maximum over the tile, across the four lanes
            // that share the row.
            float top0 = max0, top1 = max1;
#pragma unroll
            for (int j = 0; j < MMA_KEYS / 8; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    u64 key = k0 + j * 8 + 2 * t + (e & 1);
                    bool seen = key < (e < 2 ? end0 : end1);
                    s[j][e] = seen ? s[j][e] * scale : MMA_NEG_INF;
                }
                top0 = fmaxf(top0, fmaxf(s[j][0], s[j][1]));
                top1 = fmaxf(top1, fmaxf(s[j][2], s[j][3]));
            }
            top0 = WARP_XOR_MAX(top0, 1);
            top0 = WARP_XOR_MAX(top0, 2);
            top1 = WARP_XOR_MAX(top1, 1);
            top1 = WARP_XOR_MAX(top1, 2);
            // A row that has seen nothing yet keeps a zero output: its factor is 1 and
            // its weights 0 (exp(−∞ − −∞) would be NaN).
            float factor0 = top0 == MMA_NEG_INF ? 1.0f : expf(max0 - top0);
            float factor1 = top1 == MMA_NEG_INF ? 1.0f : expf(max1 - top1);
            max0 = top0;
            max1 = top1;
            float added0 = 0.0f, added1 = 0.0f;
#pragma unroll
            for (int j = 0; j < MMA_KEYS / 8; j++) {
                s[j][0] = s[j][0] == MMA_NEG_INF ? 0.0f : expf(s[j][0] - top0);
                s[j][1] = s[j][1] == MMA_NEG_INF ? 0.0f : expf(s[j][1] - top0);
                s[j][2] = s[j][2] == MMA_NEG_INF ? 0.0f : expf(s[j][2] - top1);
                s[j][3] = s[j][3] == MMA_NEG_INF ? 0.0f : expf(s[j][3] - top1);
                added0 += s[j][0] + s[j][1];
                added1 += s[j][2] + s[j][3];
            }
            // Each lane keeps its own part of the row sums; the parts are added at the
            // end (each is rescaled by the same factors).
            sum0 = sum0 * factor0 + added0;
            sum1 = sum1 * factor1 + added1;
#pragma unroll
            for (int c = 0; c < MMA_MAX_DIM / 8; c++) {
                o[c][0] *= factor0;
                o[c][1] *= factor0;
                o[c][2] *= factor1;
                o[c][3] *= factor1;
            }
            // O += P·V, 16 keys a step: the scores of key tiles 2·step and 2·step + 1 are
            // the A operand's left and right halves.
#pragma unroll
            for (int step = 0; step < MMA_KEYS / 16; step++) {
                const float *l = s[2 * step], *r = s[2 * step + 1];
                u32 a[4] = {pack_pair<BF16>(l[0], l[1]), pack_pair<BF16>(l[2], l[3]),
                            pack_pair<BF16>(r[0], r[1]), pack_pair<BF16>(r[2], r[3])};
#pragma unroll
                for (int c = 0; c < MMA_MAX_DIM / 8; c += 2) {
                    if ((u64)c >= v_tiles) break;
                    // B[key][col] = V[key][col], transposed out of V's rows: keys 0–7
                    // then 8–15 of the step, columns 8c.. then 8c + 8...
                    u32 bv[4];
                    LDMATRIX_X4_TRANS(bv, vs + (step * 16 + m_row + 8 * (m & 1)) * v_stride +
                                              8 * c + 8 * (m >> 1));
                    WARP_MMA(BF16, o[c], a, bv);
                    WARP_MMA(BF16, o[c + 1], a, bv + 2);
                }
            }
        }
        sum0 = WARP_XOR_SUM(sum0, 1);
        sum0 = WARP_XOR_SUM(sum0, 2);
        sum1 = WARP_XOR_SUM(sum1, 1);
        sum1 = WARP_XOR_SUM(sum1, 2);
        float *ob = out + (bh * queries + first) * dv;
#pragma unroll
        for (int c = 0; c < MMA_MAX_DIM / 8; c++) {
            if ((u64)c >= v_tiles) break;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                u64 row = e < 2 ? row0 : row1, col = c * 8 + 2 * t + (e & 1);
                float sum = e < 2 ? sum0 : sum1;
                if (row < rows && col < dv) ob[row * dv + col] = sum > 0.0f ? o[c][e] / sum : 0.0f;
            }
        }
        // The next task restages Q once every warp has read it.
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(MMA_THREADS)
    attention_mma_f16(const u16 *q, const u16 *k, const u16 *v, const u32 *key_len, float *out,
                      u64 batch, u64 heads, u64 kv_heads, u64 queries, u64 keys, u64 d, u64 dv,
                      u32 causal, float scale) {
    attention_mma<false>(q, k, v, key_len, out, batch, heads, kv_heads, queries, keys, d, dv,
                         causal, scale);
}

extern "C" __global__ void __launch_bounds__(MMA_THREADS)
    attention_mma_bf16(const u16 *q, const u16 *k, const u16 *v, const u32 *key_len,
                       float *out, u64 batch, u64 heads, u64 kv_heads, u64 queries, u64 keys,
                       u64 d, u64 dv, u32 causal, float scale) {
    attention_mma<true>(q, k, v, key_len, out, batch, heads, kv_heads, queries, keys, d, dv,
                        causal, scale);
}
