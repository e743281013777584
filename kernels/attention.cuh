// What both attention kernels (kernels/nn.cu, kernels/nvidia/attention_mma.cu) share:
// the keys a query sees, as src/ops/nn/attention.rs states the mask.
#ifndef GPU_OPS_ATTENTION_CUH
#define GPU_OPS_ATTENTION_CUH

#include "common.cuh"

// Keys query `i` sees in a sequence of `len` keys and `queries` queries: a prefix.
__device__ __forceinline__ u64 attention_visible(u64 len, u64 i, u64 queries, u32 causal) {
    if (!causal) return len;
    if (i + len + 1 <= queries) return 0;
    u64 end = i + len + 1 - queries;
    return end < len ? end : len;
}

#endif
