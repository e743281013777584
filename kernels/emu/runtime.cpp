// The emulated device's launch: a grid of blocks run one after another; each block's
// threads are fibers on the launching host thread, run in turn until each
// reaches a barrier or returns, so `__syncthreads` is a real barrier and a missing one
// shows as a wrong answer every time, not now and then. Each host thread runs its own
// launches, with its own block state, fiber stacks and `__shared__` arrays (function
// statics of thread storage, `EMU_SHARED` in cuda_emu.h), so launches of two streams
// (each stream a thread) run at once, as two streams' kernels can on a GPU; under
// AddressSanitizer, which checks the bounds of statics but not of thread-locals, the
// arrays and the launch's state (`EMU_LAUNCH_LOCAL`) are process-wide and launches take
// turns. A barrier that not every live thread
// of the block reaches (one returns, or waits at another barrier, while others wait)
// fails the launch. Warp collectives (cuda_emu.h: mma, shuffles) are barriers of a warp's
// 32 lanes: a warp whose live lanes all wait at one runs on within the round, and a lane
// that returns or waits elsewhere meanwhile fails the launch, as `.aligned` instructions
// require.
#include "cuda_emu.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
// AddressSanitizer must be told when the stack changes under it.
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_START_SWITCH(save, bottom, size) __sanitizer_start_switch_fiber(save, bottom, size)
#define EMU_FINISH_SWITCH(save, bottom, size) __sanitizer_finish_switch_fiber(save, bottom, size)
#else
#define EMU_START_SWITCH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#define EMU_FINISH_SWITCH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#endif
// A reused fiber stack still carries the redzones of the frames its last thread left
// behind; a new thread starts on clean shadow memory.
#ifdef EMU_ASAN
#define EMU_UNPOISON_STACK(stack, size) ASAN_UNPOISON_MEMORY_REGION(stack, size)
#else
#define EMU_UNPOISON_STACK(stack, size) ((void)(stack), (void)(size))
#endif

#if defined(GPU_OPS_EMU_TSAN) || defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_TSAN 1
#endif
#endif
#ifdef EMU_TSAN
// ThreadSanitizer sees each GPU thread as a fiber of its own, switched to without
// synchronising, so ordering comes only from what CUDA orders: a block's start, its
// barriers and its end. Two threads of a block that touch a word between two barriers,
// one of them writing, are a reported race.
#include <sanitizer/tsan_interface.h>
#define EMU_TSAN_SWITCH(fiber) __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync)
#define EMU_TSAN_RELEASE(addr) __tsan_release(addr)
#define EMU_TSAN_ACQUIRE(addr) __tsan_acquire(addr)
// The runtime's entry points for a range read or written (exported, not in its header).
extern "C" void __tsan_read_range(void *addr, unsigned long size);
extern "C" void __tsan_write_range(void *addr, unsigned long size);
#define EMU_TSAN_READ_RANGE(addr, size) __tsan_read_range((void *)(addr), size)
#define EMU_TSAN_WRITE_RANGE(addr, size) __tsan_write_range(addr, size)
#else
#define EMU_TSAN_SWITCH(fiber) ((void)(fiber))
#define EMU_TSAN_RELEASE(addr) ((void)(addr))
#define EMU_TSAN_ACQUIRE(addr) ((void)(addr))
#define EMU_TSAN_READ_RANGE(addr, size) ((void)(addr), (void)(size))
#define EMU_TSAN_WRITE_RANGE(addr, size) ((void)(addr), (void)(size))
#endif

EMU_LAUNCH_LOCAL dim3 threadIdx, blockIdx, blockDim, gridDim;

// build.rs generates this table from the kernels each module defines.
extern const emu_kernel *const emu_modules[];
extern const size_t emu_module_sizes[];
extern const size_t emu_module_count;

namespace {

// Switching between fibers. ucontext's swapcontext makes a system call per switch (it
// saves the signal mask); a block of 256 threads crosses a barrier with 512 switches, so
// on x86-64 the switch is ten instructions of our own: the callee-saved registers, the
// SSE and x87 control words, and the stack pointer.
#if defined(__x86_64__)
extern "C" void emu_switch(void **save_sp, void *load_sp);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

struct Context {
    void *sp = nullptr;
};

// A context that starts `entry` (which never returns) on the stack [stack, stack + size).
void make_context(Context &c, unsigned char *stack, size_t size, void (*entry)()) {
    EMU_UNPOISON_STACK(stack, size);
    auto *top = reinterpret_cast<unsigned long *>(
        (reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t(15)));
    // What emu_switch pops, lowest first: control words, r15..r12, rbx, rbp, then the
    // "return address" `entry`, leaving the stack as a call would (rsp ≡ 8 mod 16).
    unsigned long *sp = top - 9;
    unsigned int mxcsr;
    unsigned short fpucw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    sp[0] = (unsigned long)mxcsr | ((unsigned long)fpucw << 32);
    for (int i = 1; i <= 6; i++) sp[i] = 0;
    sp[7] = reinterpret_cast<unsigned long>(entry);
    sp[8] = 0;
    c.sp = sp;
}

void switch_context(Context &from, Context &to) { emu_switch(&from.sp, to.sp); }
#else
struct Context {
    ucontext_t uc;
};

void make_context(Context &c, unsigned char *stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}

void switch_context(Context &from, Context &to) { swapcontext(&from.uc, &to.uc); }
#endif

// What every device gives a block without the kernel opting in to more.
constexpr size_t DEFAULT_SHARED_LIMIT = 48 * 1024;
constexpr unsigned MAX_THREADS_PER_BLOCK = 1024;
// Each GPU thread's stack (kernels keep field elements and points there; AddressSanitizer's
// redzones double it), with a guard page below so an overflow faults.
constexpr size_t STACK_BYTES = 256 * 1024;

// One GPU thread of the block being run.
struct Fiber {
    Context context;
    unsigned char *stack = nullptr;  // usable part, above the guard page
    dim3 index{0, 0, 0};
    bool done = false;
    const char *barrier = nullptr;   // where it waits, while it waits
    const char *warp_site = nullptr; // the warp collective it waits at, while it waits
    bool ready = false;              // may run in this round (not waiting)
    void *fake_stack = nullptr;      // AddressSanitizer's, across a switch
    void *tsan = nullptr;            // ThreadSanitizer's fiber
};

// What the lanes of one warp hand each other in a collective: up to six words a lane
// (an mma's A and B fragments; a shuffle's one value).
constexpr unsigned WARP = 32;
struct Warp {
    unsigned words[WARP][6];
};

// The block being run: its fibers, the scheduler's context, the kernel and its arguments.
struct Block {
    Context scheduler;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    Fiber *running = nullptr;
    const emu_kernel *kernel = nullptr;
    void **args = nullptr;
    unsigned char *shared = nullptr;
    size_t shared_bytes = 0;
    // A fault a thread met (`emu_fault`): the launch fails with it once the block ends.
    const char *fault = nullptr;
    const void *scheduler_stack = nullptr;  // AddressSanitizer's view of the host stack
    size_t scheduler_stack_size = 0;
    void *scheduler_tsan = nullptr;          // ThreadSanitizer's fiber of the host thread
    unsigned long round = 0;                 // barrier intervals completed in this block
    // ThreadSanitizer's synchronisation points: the block's start and end, and the
    // barriers, alternating by round so an interval's releases never reach a thread of
    // the same interval.
    char start_sync = 0, end_sync = 0, barrier_sync[2] = {0, 0};
};

EMU_LAUNCH_LOCAL Block block;

const emu_kernel *find(const char *name) {
    for (size_t m = 0; m < emu_module_count; m++)
        for (size_t k = 0; k < emu_module_sizes[m]; k++)
            if (std::strcmp(emu_modules[m][k].name, name) == 0) return &emu_modules[m][k];
    return nullptr;
}

#ifdef EMU_ASAN
// The `__shared__` arrays are process-wide under AddressSanitizer (above).
std::mutex launches;
#endif

void set_error(char *err, size_t len, const std::string &message) {
    if (err && len) std::snprintf(err, len, "%s", message.c_str());
}

// A host thread's fiber stacks (and ThreadSanitizer fibers), made once and reused by
// every later block and launch of the thread, unmapped when it ends (a stream's thread
// ends with its stream).
struct Stacks {
    std::vector<unsigned char *> stacks;
    std::vector<void *> tsan_fibers;

    ~Stacks() {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        for (size_t i = 0; i < stacks.size(); i++) {
            EMU_UNPOISON_STACK(stacks[i], STACK_BYTES);
            munmap(stacks[i] - page, STACK_BYTES + page);
#ifdef EMU_TSAN
            __tsan_destroy_fiber(tsan_fibers[i]);
#endif
        }
    }
};
thread_local Stacks thread_stacks;

bool ensure_stacks(unsigned threads) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    std::vector<unsigned char *> &stacks = thread_stacks.stacks;
    std::vector<void *> &tsan_fibers = thread_stacks.tsan_fibers;
    while (stacks.size() < threads) {
        void *m = mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (m == MAP_FAILED) return false;
        mprotect(m, page, PROT_NONE);
        stacks.push_back(static_cast<unsigned char *>(m) + page);
#ifdef EMU_TSAN
        tsan_fibers.push_back(__tsan_create_fiber(0));
#else
        tsan_fibers.push_back(nullptr);
#endif
    }
    return true;
}

// Back to the scheduler from the running fiber; returns when the scheduler resumes it.
void yield_to_scheduler(Fiber &f) {
    EMU_TSAN_SWITCH(block.scheduler_tsan);
    EMU_START_SWITCH(&f.fake_stack, block.scheduler_stack, block.scheduler_stack_size);
    switch_context(f.context, block.scheduler);
    EMU_FINISH_SWITCH(f.fake_stack, &block.scheduler_stack, &block.scheduler_stack_size);
}

// A fiber's whole life: the kernel for its thread, then back to the scheduler for good.
void fiber_main() {
    Fiber &f = *block.running;
    EMU_FINISH_SWITCH(nullptr, &block.scheduler_stack, &block.scheduler_stack_size);
    EMU_TSAN_ACQUIRE(&block.start_sync);
    block.kernel->call(block.args);
    f.done = true;
    EMU_TSAN_RELEASE(&block.end_sync);
    EMU_TSAN_SWITCH(block.scheduler_tsan);
    EMU_START_SWITCH(nullptr, block.scheduler_stack, block.scheduler_stack_size);
    Context dead;  // never resumed
    switch_context(dead, block.scheduler);
}

// Runs fiber `f` until it waits at a barrier or returns.
void resume(Fiber &f) {
    block.running = &f;
    threadIdx = f.index;
    void *fake = nullptr;
    EMU_TSAN_SWITCH(f.tsan);
    EMU_START_SWITCH(&fake, f.stack, STACK_BYTES);
    switch_context(block.scheduler, f.context);
    EMU_FINISH_SWITCH(fake, nullptr, nullptr);
    block.running = nullptr;
}

// How a block's run ended.
enum BlockEnd { BLOCK_DONE, BLOCK_BARRIER_DIVERGENCE, BLOCK_WARP_DIVERGENCE };

// Releases each warp whose live lanes all wait at one collective (they become ready);
// false if a warp has lanes at a collective and others elsewhere (returned, at a block
// barrier or at another collective). `released` tells whether any warp was.
bool release_warps(bool &released) {
    released = false;
    const size_t threads = block.fibers.size();
    for (size_t first = 0; first < threads; first += WARP) {
        const size_t last = first + WARP < threads ? first + WARP : threads;
        const char *site = nullptr;
        bool waiting = false, elsewhere = false, mixed = false;
        for (size_t i = first; i < last; i++) {
            const Fiber &f = block.fibers[i];
            if (f.warp_site) {
                if (site && site != f.warp_site) mixed = true;
                site = f.warp_site;
                waiting = true;
            } else {
                elsewhere = true;
            }
        }
        if (!waiting) continue;
        if (elsewhere || mixed) return false;
        for (size_t i = first; i < last; i++) {
            block.fibers[i].warp_site = nullptr;
            block.fibers[i].ready = true;
        }
        released = true;
    }
    return true;
}

// Runs one block to the end.
BlockEnd run_block(unsigned threads, dim3 bd) {
    block.fibers.assign(threads, Fiber{});
    block.warps.resize((threads + WARP - 1) / WARP);
    for (unsigned t = 0; t < threads; t++) {
        Fiber &f = block.fibers[t];
        f.stack = thread_stacks.stacks[t];
        f.tsan = thread_stacks.tsan_fibers[t];
        f.index = dim3{t % bd.x, t / bd.x % bd.y, t / bd.x / bd.y};
        make_context(f.context, f.stack, STACK_BYTES, fiber_main);
    }
    block.round = 0;
    EMU_TSAN_RELEASE(&block.start_sync);
    unsigned live = threads;
    while (live > 0) {
        // One round: every live thread runs to its next barrier or to its end, a warp
        // released from a collective running on until then.
        bool returned = false;
        for (Fiber &f : block.fibers) {
            f.ready = !f.done;
            f.barrier = nullptr;
        }
        for (bool released = true; released;) {
            for (Fiber &f : block.fibers) {
                if (!f.ready) continue;
                f.ready = false;
                resume(f);
                if (f.done) {
                    live--;
                    returned = true;
                }
            }
            if (!release_warps(released)) return BLOCK_WARP_DIVERGENCE;
        }
        const char *site = nullptr;
        bool waiting = false, mixed_sites = false;
        for (const Fiber &f : block.fibers) {
            if (f.done) continue;
            waiting = true;
            if (site && site != f.barrier) mixed_sites = true;
            site = f.barrier;
        }
        if (waiting && (returned || mixed_sites)) {
            // Leave the stranded fibers where they are: their stacks are reused, never
            // resumed.
            return BLOCK_BARRIER_DIVERGENCE;
        }
        block.round++;
    }
    EMU_TSAN_ACQUIRE(&block.end_sync);
    return BLOCK_DONE;
}

// The running fiber's warp and lane.
Warp &warp_of(const Fiber &f, unsigned &lane) {
    const size_t t = (size_t)(&f - block.fibers.data());
    lane = (unsigned)(t % WARP);
    return block.warps[t / WARP];
}

// Waits until every live lane of the running fiber's warp is at `site`.
void warp_wait(Fiber &f, const char *site) {
    f.warp_site = site;
    yield_to_scheduler(f);
}

float value_of(bool bf16, unsigned short bits) {
    return bf16 ? emu_bf16_to_f32(bits) : emu_f16_to_f32(bits);
}

}  // namespace

void emu_syncthreads_at(const char *site) {
    Fiber &f = *block.running;
    f.barrier = site;
    EMU_TSAN_RELEASE(&block.barrier_sync[block.round & 1]);
    yield_to_scheduler(f);
    // The scheduler resumes this thread in the next round: every thread has arrived.
    EMU_TSAN_ACQUIRE(&block.barrier_sync[(block.round - 1) & 1]);
}

void *emu_dynamic_shared() { return block.shared; }

bool emu_in_dynamic_shared(const void *p, size_t bytes) {
    const unsigned char *at = static_cast<const unsigned char *>(p);
    return block.shared && at >= block.shared && bytes <= block.shared_bytes &&
           (size_t)(at - block.shared) <= block.shared_bytes - bytes;
}

void emu_fault(const char *what) {
    if (!block.fault) block.fault = what;
}

void emu_mma_m16n8k16(bool bf16, float d[4], const unsigned a[4], const unsigned b[2],
                      const char *site) {
    Fiber &f = *block.running;
    unsigned lane;
    Warp &w = warp_of(f, lane);
    for (int i = 0; i < 4; i++) w.words[lane][i] = a[i];
    w.words[lane][4] = b[0];
    w.words[lane][5] = b[1];
    warp_wait(f, site);
    // The whole A (16×16) and B (16×8) from the lanes' fragments: lane 4·g + t holds
    // A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..] and B[2t..][g], B[2t+8..][g],
    // two values a word, the lower column (or row) in the lower half.
    float A[16][16], B[16][8];
    for (unsigned l = 0; l < WARP; l++) {
        const unsigned g = l / 4, t = l % 4;
        const unsigned *x = w.words[l];
        for (unsigned half = 0; half < 2; half++) {
            const unsigned shift = 16 * half;
            A[g][2 * t + half] = value_of(bf16, (unsigned short)(x[0] >> shift));
            A[g + 8][2 * t + half] = value_of(bf16, (unsigned short)(x[1] >> shift));
            A[g][2 * t + 8 + half] = value_of(bf16, (unsigned short)(x[2] >> shift));
            A[g + 8][2 * t + 8 + half] = value_of(bf16, (unsigned short)(x[3] >> shift));
            B[2 * t + half][g] = value_of(bf16, (unsigned short)(x[4] >> shift));
            B[2 * t + 8 + half][g] = value_of(bf16, (unsigned short)(x[5] >> shift));
        }
    }
    const unsigned g = lane / 4, t = lane % 4;
    for (unsigned e = 0; e < 4; e++) {
        const unsigned row = e < 2 ? g : g + 8, col = 2 * t + (e & 1);
        float sum = 0.0f;
        for (unsigned k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
        d[e] += sum;
    }
    // No lane writes the next collective's words before every lane has read these.
    warp_wait(f, site);
}

void emu_warp_exchange(const unsigned *mine, unsigned words, unsigned *all, const char *site) {
    Fiber &f = *block.running;
    unsigned lane;
    Warp &w = warp_of(f, lane);
    for (unsigned i = 0; i < words; i++) w.words[lane][i] = mine[i];
    warp_wait(f, site);
    for (unsigned l = 0; l < WARP; l++)
        for (unsigned i = 0; i < words; i++) all[l * words + i] = w.words[l][i];
    warp_wait(f, site);
}

unsigned emu_lane() {
    unsigned lane;
    warp_of(*block.running, lane);
    return lane;
}

float emu_shfl_xor_f32(float value, unsigned lane_mask, const char *site) {
    Fiber &f = *block.running;
    unsigned lane;
    Warp &w = warp_of(f, lane);
    std::memcpy(&w.words[lane][0], &value, 4);
    warp_wait(f, site);
    float got;
    std::memcpy(&got, &w.words[(lane ^ lane_mask) % WARP][0], 4);
    warp_wait(f, site);
    return got;
}

// Error codes of emu_launch.
enum {
    EMU_OK = 0,
    EMU_UNKNOWN_KERNEL = 1,
    EMU_BAD_ARGUMENTS = 2,
    EMU_BAD_LAUNCH = 3,
    EMU_BARRIER_DIVERGENCE = 4,
    EMU_ABOVE_LAUNCH_BOUNDS = 5,
    EMU_WARP_DIVERGENCE = 6,
};

extern "C" {

// Which sanitizer the emulated device was built with: "address", "thread" or "none".
const char *emu_sanitizer() {
#if defined(EMU_ASAN)
    return "address";
#elif defined(EMU_TSAN)
    return "thread";
#else
    return "none";
#endif
}

// Ordering made by the Rust side (the streams' queues, `src/backend/emulated/queue.rs`)
// through primitives ThreadSanitizer cannot see (Rust's futex-based Mutex and Condvar),
// announced to it: everything the calling thread did before `emu_sync_release(addr)`
// happens before everything a thread does after a later `emu_sync_acquire(addr)`. Without
// it a stream's copy, made on its own thread, of a buffer a kernel of another stream
// wrote before an event the copy waited for would look like a race. No-ops in the other
// builds.
void emu_sync_release(void *addr) { EMU_TSAN_RELEASE(addr); }
void emu_sync_acquire(void *addr) { EMU_TSAN_ACQUIRE(addr); }

// A stream's copies and memsets, made here rather than in Rust so that the checkers see
// them. ThreadSanitizer runs with ignore_noninstrumented_modules=1 (.ci/run): on Linux
// that ignores the accesses of every intercepted call (memcpy, malloc, free), since no
// module counts as instrumented there, and checks only the instrumented code's own. So
// the copy names its ranges itself, and one that overlaps a kernel of another stream on
// the same bytes is a reported race like two kernels' would be. (The Rust side's memcpy,
// malloc and free, ordered by atomics the checker cannot see, were each a race that the
// suppressions then matched: every one slowed every later check, since each is compared
// with every address already found racy, and the checked run took five minutes.)
void emu_copy(void *to, const void *from, size_t bytes) {
    EMU_TSAN_READ_RANGE(from, bytes);
    EMU_TSAN_WRITE_RANGE(to, bytes);
    std::memcpy(to, from, bytes);
}
void emu_zero(void *at, size_t bytes) {
    EMU_TSAN_WRITE_RANGE(at, bytes);
    std::memset(at, 0, bytes);
}

// The parameter sizes of kernel `name` (up to `cap`), and their count; -1 if no module
// defines it.
long emu_kernel_params(const char *name, size_t *sizes, size_t cap) {
    const emu_kernel *k = find(name);
    if (!k) return -1;
    for (size_t i = 0; i < k->params && i < cap; i++) sizes[i] = k->param_sizes[i];
    return (long)k->params;
}

// The first argument of kernel `name`'s __launch_bounds__: the most threads a block of
// its launches may have; -1 if no module defines it.
long emu_kernel_max_threads(const char *name) {
    const emu_kernel *k = find(name);
    return k ? (long)k->max_threads : -1;
}

// How many kernels the modules define, and the name of the i-th (null past the end).
size_t emu_kernel_count() {
    size_t n = 0;
    for (size_t m = 0; m < emu_module_count; m++) n += emu_module_sizes[m];
    return n;
}

const char *emu_kernel_name(size_t i) {
    for (size_t m = 0; m < emu_module_count; m++) {
        if (i < emu_module_sizes[m]) return emu_modules[m][i].name;
        i -= emu_module_sizes[m];
    }
    return nullptr;
}

// Runs kernel `name` on a grid × block launch with `shared_bytes` of dynamic shared
// memory. `args` holds one pointer per parameter, to the argument's value, as
// cuLaunchKernel takes them. Returns EMU_OK or an error code with a message in `err`.
int emu_launch(const char *name, const unsigned grid[3], const unsigned block_dim[3],
               size_t shared_bytes, void **args, size_t nargs, char *err, size_t err_len) {
    const emu_kernel *k = find(name);
    if (!k) {
        set_error(err, err_len, std::string("no kernel named ") + name);
        return EMU_UNKNOWN_KERNEL;
    }
    if (nargs != k->params) {
        set_error(err, err_len, std::string(name) + " takes " + std::to_string(k->params) +
                                    " arguments, the launch passed " + std::to_string(nargs));
        return EMU_BAD_ARGUMENTS;
    }
    unsigned long long threads = (unsigned long long)block_dim[0] * block_dim[1] * block_dim[2];
    if (threads == 0 || threads > MAX_THREADS_PER_BLOCK || grid[0] == 0 || grid[1] == 0 ||
        grid[2] == 0 || grid[1] > 65535 || grid[2] > 65535) {
        set_error(err, err_len, std::string(name) + ": invalid grid or block dimensions");
        return EMU_BAD_LAUNCH;
    }
    // A block above the kernel's __launch_bounds__ is refused, as the driver refuses one
    // above the loaded kernel's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: a launcher that
    // asks for more than its kernel declares fails here, in CI, not on the first GPU.
    if (threads > k->max_threads) {
        set_error(err, err_len, std::string(name) + ": a block of " + std::to_string(threads) +
                                    " threads, more than its __launch_bounds__(" +
                                    std::to_string(k->max_threads) + ")");
        return EMU_ABOVE_LAUNCH_BOUNDS;
    }
    if (shared_bytes > DEFAULT_SHARED_LIMIT) {
        set_error(err, err_len, std::string(name) + ": " + std::to_string(shared_bytes) +
                                    " bytes of dynamic shared memory, more than the 48 KiB a "
                                    "kernel gets without opting in");
        return EMU_BAD_LAUNCH;
    }
#ifdef EMU_ASAN
    std::lock_guard<std::mutex> serial(launches);
#endif
#ifdef EMU_TSAN
    block.scheduler_tsan = __tsan_get_current_fiber();
#endif
    if (!ensure_stacks((unsigned)threads)) {
        set_error(err, err_len, std::string(name) + ": the host could not map stacks for " +
                                    std::to_string(threads) + " threads");
        return EMU_BAD_LAUNCH;
    }
    // Exactly the launch's bytes, so AddressSanitizer (GPU_OPS_EMU_SANITIZE=address) sees a
    // kernel that reads or writes past them.
    std::vector<unsigned char> shared(shared_bytes);
    block.kernel = k;
    block.args = args;
    block.shared = shared_bytes ? shared.data() : nullptr;
    block.shared_bytes = shared_bytes;
    block.fault = nullptr;
    const dim3 g{grid[0], grid[1], grid[2]}, bd{block_dim[0], block_dim[1], block_dim[2]};
    gridDim = g;
    blockDim = bd;
    unsigned long long blocks = (unsigned long long)g.x * g.y * g.z;
    for (unsigned long long n = 0; n < blocks; n++) {
        blockIdx = dim3{(unsigned)(n % g.x), (unsigned)(n / g.x % g.y), (unsigned)(n / g.x / g.y)};
        BlockEnd end = run_block((unsigned)threads, bd);
        if (block.fault) {
            set_error(err, err_len, std::string(name) + ": " + block.fault);
            return EMU_BAD_LAUNCH;
        }
        switch (end) {
        case BLOCK_DONE:
            break;
        case BLOCK_BARRIER_DIVERGENCE:
            set_error(err, err_len, std::string(name) +
                                        ": a __syncthreads() that not every live thread of the "
                                        "block reached");
            return EMU_BARRIER_DIVERGENCE;
        case BLOCK_WARP_DIVERGENCE:
            set_error(err, err_len, std::string(name) +
                                        ": a warp collective (mma.sync, a shuffle) that not "
                                        "every live lane of the warp reached");
            return EMU_WARP_DIVERGENCE;
        }
    }
    return EMU_OK;
}

}  // extern "C"
