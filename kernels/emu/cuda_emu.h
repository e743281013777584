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
#ifdef EMU_SHARED
// The launch's own state (threadIdx and the rest, the runtime's block) is process-wide
// there too: launches take turns, and each access to a thread-local of this dlopen'ed
// library is a call to __tls_get_addr, which AddressSanitizer intercepts at a cost
// (three quarters of the DP parity case's 50 s, 2026-12-07).
#define EMU_LAUNCH_LOCAL
#else
#define EMU_SHARED static thread_local
#define EMU_LAUNCH_LOCAL thread_local
#endif

struct dim3 {
    unsigned x, y, z;
};

extern EMU_LAUNCH_LOCAL dim3 threadIdx, blockIdx, blockDim, gridDim;

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

// Bit casts, as the device's intrinsics.
static inline unsigned __float_as_uint(float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}

// Warp collectives, for the NVIDIA-only kernels (kernels/nvidia/): a warp is 32
// consecutive threads of the block's linear index, as on NVIDIA GPUs. Every live lane of
// the warp must reach the same call site (`EMU_HERE`) together, as `.aligned` and
// `_sync` instructions require of a full mask, or the launch fails. They order nothing
// in memory: a kernel that passes shared memory between lanes without a barrier is still
// a race under ThreadSanitizer, as it is on hardware.
#define EMU_HERE __FILE__ ":" EMU_STR(__LINE__)
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: d += A·B, the fragments in PTX's
// lane layout (kernels/nvidia/attention_mma.cu spells it out). The products are exact in
// f32; the sum runs over k in order, then adds d.
void emu_mma_m16n8k16(bool bf16, float d[4], const unsigned a[4], const unsigned b[2],
                      const char *site);
// __shfl_xor_sync(0xffffffff, value, lane_mask): the value of lane `lane ^ lane_mask`.
float emu_shfl_xor_f32(float value, unsigned lane_mask, const char *site);
// Each lane hands over `words` (at most 4) 32-bit words; `all` gets lane l's at
// `all[l * words]`. The building block of the collectives below.
void emu_warp_exchange(const unsigned *mine, unsigned words, unsigned *all, const char *site);
// The calling thread's lane: its linear index in the block, modulo 32.
unsigned emu_lane();

// Whether [p, p + bytes) lies in the running launch's dynamic shared memory.
bool emu_in_dynamic_shared(const void *p, size_t bytes);
// Fails the running launch with `what` once its block ends (the first fault is kept).
void emu_fault(const char *what);

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l names row l % 8 of matrix
// l / 8 (`row`: 8 values, 16 bytes); r[i] gets matrix i's row l / 4, columns 2(l % 4)
// and the next, or with `trans` rows 2(l % 4) and the next of column l / 4, the lower
// index in the lower half. Each lane reads its own row here, in the kernel's unit, so
// the checkers see that read and bound it. A row outside the launch's dynamic shared
// memory (where the kernels keep what they load this way) fails the launch, as an
// address outside the shared window faults on a GPU; the lane reads zeros instead.
static inline void emu_ldmatrix_x4(bool trans, unsigned r[4], const unsigned short *row,
                                   const char *site) {
    unsigned mine[4] = {0, 0, 0, 0}, all[32 * 4];
    if (emu_in_dynamic_shared(row, 16)) {
        std::memcpy(mine, row, 16);
    } else {
        emu_fault("ldmatrix of a row outside the launch's dynamic shared memory");
    }
    emu_warp_exchange(mine, 4, all, site);
    unsigned short halves[32 * 8];
    std::memcpy(halves, all, sizeof halves);
    const unsigned lane = emu_lane(), g = lane / 4, t = lane % 4;
    for (unsigned i = 0; i < 4; i++) {
        const unsigned short *m = halves + 64 * i;
        const unsigned lo = trans ? m[2 * t * 8 + g] : m[g * 8 + 2 * t];
        const unsigned hi = trans ? m[(2 * t + 1) * 8 + g] : m[g * 8 + 2 * t + 1];
        r[i] = lo | (hi << 16);
    }
}

// f16 and bf16 as the device's conversions make them: round to nearest, ties to even
// (cvt.rn), and back exactly.
static inline unsigned short emu_f32_to_bf16(float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    if (std::isnan(x)) return (unsigned short)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (unsigned short)(u >> 16);
}
static inline float emu_bf16_to_f32(unsigned short h) {
    unsigned u = (unsigned)h << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
static inline unsigned short emu_f32_to_f16(float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    unsigned short sign = (unsigned short)((u >> 16) & 0x8000);
    float a = std::fabs(x);
    if (std::isnan(x)) return sign | 0x7e00;
    // 65520 is halfway between f16's largest value and the next power of two: it and
    // anything above round to infinity.
    if (a >= 65520.0f) return sign | 0x7c00;
    if (a < 6.103515625e-05f) {
        // Subnormal: a multiple of 2^-24, rounded to nearest even by the host's mode.
        return sign | (unsigned short)std::nearbyint(a * 16777216.0f);
    }
    unsigned bits = u & 0x7fffffff;
    unsigned half = ((((bits >> 23) - 127 + 15) << 10) | ((bits & 0x7fffff) >> 13));
    unsigned rest = bits & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) half++;
    return sign | (unsigned short)half;
}
static inline float emu_f16_to_f32(unsigned short h) {
    unsigned exponent = (h >> 10) & 31, mantissa = h & 1023;
    float v;
    if (exponent == 0) {
        v = std::ldexp((float)mantissa, -24);
    } else if (exponent == 31) {
        v = mantissa ? NAN : INFINITY;
    } else {
        v = std::ldexp((float)(mantissa | 1024), (int)exponent - 25);
    }
    return (h & 0x8000) ? -v : v;
}
// cvt.rn.{f16x2,bf16x2}.f32: `lo` into the lower half.
static inline unsigned emu_pack_pair(bool bf16, float lo, float hi) {
    unsigned l = bf16 ? emu_f32_to_bf16(lo) : emu_f32_to_f16(lo);
    unsigned h = bf16 ? emu_f32_to_bf16(hi) : emu_f32_to_f16(hi);
    return l | (h << 16);
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
