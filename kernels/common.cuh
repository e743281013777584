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

#endif
