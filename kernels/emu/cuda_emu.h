// The CUDA execution model for kernels compiled for the host (the emulated device). A
// kernel source is included after this header with three textual changes made by build.rs:
// `__shared__` arrays become `EMU_SHARED` (below: a host thread runs one block at a time,
// so a function's statics of thread storage are the block's shared memory), `extern
// __shared__ T name[];` becomes a pointer to the
// launch's dynamic shared memory, and nothing else. Every GPU thread of a block runs on its
// own fiber, run in turn between barriers, so `__syncthreads` is a real barrier. __CUDACC__ stays undefined: the
// headers take their host paths for intrinsics (the same ones the host parity tests check).
#ifndef GPU_OPS_CUDA_EMU_H
#define GPU_OPS_CUDA_EMU_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

// A `__shared__` array: a function static of thread storage, each host thread running its
// own launches (kernels/emu/runtime.cpp). Under AddressSanitizer, which puts redzones
// around statics but not around thread-locals, a process-wide static (launches then take
// turns), so a kernel that indexes past a shared array is still caught.
#if defined(__SANITIZE_ADDRESS__)
#define EMU_SHARED static
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_SHARED static
#endif
#endif
#ifndef EMU_SHARED
#define EMU_SHARED static thread_local
#endif

struct dim3 {
    unsigned x, y, z;
};

extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// build.rs reads each module's kernels and their __launch_bounds__ from the preprocessed
// unit, once with GPU_OPS_EMU_SCAN defined: there both leave a marker it finds (that text
// is only read, never compiled). In the real build the bound is the table's (EMU_KERNEL)
// and the launch's check, not an attribute.
#ifdef GPU_OPS_EMU_SCAN
#define __global__ emu_scan_global
#define __launch_bounds__(...) emu_scan_bounds(__VA_ARGS__)
#else
#define __global__
#define __launch_bounds__(...)
#endif
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__
#define __align__(n) alignas(n)

// A barrier names its source line, so threads waiting at different barriers at once are
// caught as divergence.
void emu_syncthreads_at(const char *site);
void *emu_dynamic_shared();
#define EMU_STR2(x) #x
#define EMU_STR(x) EMU_STR2(x)
#define __syncthreads() emu_syncthreads_at(__FILE__ ":" EMU_STR(__LINE__))

// Round-to-nearest arithmetic: the host's default rounding, never contracted into an FMA
// (-ffp-contract=off), as the device's _rn intrinsics guarantee.
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return std::sqrt(a); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}

static inline unsigned atomicAdd(unsigned *address, unsigned value) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
static inline unsigned long long atomicAdd(unsigned long long *address, unsigned long long value) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
static inline unsigned atomicMax(unsigned *address, unsigned value) {
    unsigned seen = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (seen < value &&
           !__atomic_compare_exchange_n(address, &seen, value, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return seen;
}

// The kernel table build.rs generates for each module: name, a trampoline that unpacks
// arguments as the driver passes them (an array of pointers, one per parameter), the
// parameters' sizes, and the kernel's __launch_bounds__: the most threads a launch's
// block may have.
struct emu_kernel {
    const char *name;
    void (*call)(void **args);
    size_t params;
    const size_t *param_sizes;
    unsigned max_threads;
};

// A kernel's declared bound, checked when the table is compiled: every device takes 1 to
// 1024 threads a block.
template <unsigned long long N> struct emu_bound {
    static_assert(N >= 1 && N <= 1024, "__launch_bounds__ must be 1 to 1024 threads");
    static constexpr unsigned value = (unsigned)N;
};

template <typename F> struct emu_signature;
template <typename... A> struct emu_signature<void (*)(A...)> {
    static constexpr size_t count = sizeof...(A);
    static constexpr size_t sizes[sizeof...(A) + 1] = {sizeof(A)..., 0};
    // Each argument is read from where its pointer points, with the kernel's own type:
    // a launcher that passes a 4-byte value for an 8-byte parameter reads garbage here,
    // as on hardware.
    template <void (*K)(A...), size_t... I> static void call(void **args, std::index_sequence<I...>) {
        K(*static_cast<A *>(args[I])...);
    }
    template <void (*K)(A...)> static void trampoline(void **args) {
        call<K>(args, std::index_sequence_for<A...>{});
    }
};

// One table entry; `name` is an `extern "C"` kernel of the module, `bound` the first
// argument of its __launch_bounds__.
#define EMU_KERNEL(name, bound)                                                           \
    emu_kernel {                                                                          \
        #name, &emu_signature<decltype(&name)>::trampoline<&name>,                        \
            emu_signature<decltype(&name)>::count, emu_signature<decltype(&name)>::sizes, \
            emu_bound<(bound)>::value                                                     \
    }

#endif
