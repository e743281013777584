// Shared by every kernel. The field headers are plain C so that the host build
// (build.rs -> kernels/host/field_host.c) runs the very same arithmetic on the CPU
// in CI, where no GPU exists; NVRTC compiles them as CUDA C++.
#ifndef GPU_OPS_COMMON_CUH
#define GPU_OPS_COMMON_CUH

typedef unsigned int u32;
typedef unsigned long long u64;

#ifdef __CUDACC__
#define FIELD_FN static __device__ __forceinline__
#define FIELD_CONST static __device__ __constant__ const
#else
#define FIELD_FN static inline
#define FIELD_CONST static const
#endif

// Double arithmetic that is never fused into an FMA, so the GPU rounds exactly as the
// CPU twin does (Rust never contracts; the host build passes -ffp-contract=off).
#ifdef __CUDACC__
#define DMUL(a, b) __dmul_rn((a), (b))
#define DADD(a, b) __dadd_rn((a), (b))
#else
#define DMUL(a, b) ((a) * (b))
#define DADD(a, b) ((a) + (b))
#endif

#endif
