// Shared by every kernel. The headers are C++ that NVRTC and the host build both accept:
// build.rs -> kernels/host/*.cpp runs the very same arithmetic on the CPU in CI, where no
// GPU exists; NVRTC compiles them as CUDA C++.
#ifndef GPU_OPS_COMMON_CUH
#define GPU_OPS_COMMON_CUH

typedef unsigned int u32;
typedef unsigned long long u64;

// A GPU compiler: NVRTC defines __CUDACC__; hipRTC and clang's HIP mode (AMD, issue "AMD
// GPUs") define __HIP__ instead. Every device branch of every kernel tests this one name,
// so the same source compiles for both vendors; the host build and the emulated device
// define neither. HIP provides the CUDA intrinsics the kernels use (__umul64hi, __brev,
// the _rn arithmetic); no kernel here uses warp intrinsics or assumes a warp of 32. The
// NVIDIA-only modules under kernels/nvidia/ (tensor cores, shuffles) are never built for
// AMD (`KernelModule::nvidia_only`).
#if defined(__CUDACC__) || defined(__HIP__)
#define GPU_OPS_DEVICE 1
#endif

#ifdef GPU_OPS_DEVICE
#define FIELD_FN static __device__ __forceinline__
// Big bodies called from several places (curve doubling and full additions): one copy
// each instead of one per call site keeps NVRTC's time (run in CI) and the register
// footprint down; the hot mixed addition stays inlined.
#define FIELD_FN_OUTLINED static __device__ __noinline__
#define FIELD_CONST static __device__ __constant__ const
// Member functions of the kernels' small structs (FIELD_FN's `static` means something else
// there).
#define METHOD_FN __device__ __forceinline__
#else
#define FIELD_FN static inline
#define FIELD_FN_OUTLINED static
#define FIELD_CONST static const
#define METHOD_FN inline
#endif

// The block of every grid-stride launch (`DeviceLease::launch_config`,
// src/backend/device/mod.rs). Every kernel declares the largest block its launcher gives
// it with __launch_bounds__, so NVRTC budgets registers for that many threads: without a
// bound, a compiler that spends more registers turns a launch of that block into
// LAUNCH_OUT_OF_RESOURCES, which retires the device. CUDA and the emulated device both
// refuse a larger block (src/backend/device/launch.rs).
#define LAUNCH_CONFIG_THREADS 256

// Double arithmetic that is never fused into an FMA, so the GPU rounds exactly as the
// CPU twin does (Rust never contracts; the host build passes -ffp-contract=off).
#ifdef GPU_OPS_DEVICE
#define DMUL(a, b) __dmul_rn((a), (b))
#define DADD(a, b) __dadd_rn((a), (b))
#else
#define DMUL(a, b) ((a) * (b))
#define DADD(a, b) ((a) + (b))
#endif

#endif
