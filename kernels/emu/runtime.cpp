// The emulated device's launch: a grid of blocks run one after another, each block's
// threads on their own host threads, with a real barrier, the launch's dynamic shared
// memory, and a check that every live thread of a block reaches each barrier. Launches
// are serialised process-wide: the blocks' `__shared__` arrays are function statics.
#include "cuda_emu.h"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// build.rs generates this table from the kernels each module defines.
extern const emu_kernel *const emu_modules[];
extern const size_t emu_module_sizes[];
extern const size_t emu_module_count;

namespace {

// What every device gives a block without the kernel opting in to more.
constexpr size_t DEFAULT_SHARED_LIMIT = 48 * 1024;
constexpr unsigned MAX_THREADS_PER_BLOCK = 1024;

// One block being run: its threads' barrier, and who has left the kernel.
struct Block {
    std::mutex m;
    std::condition_variable cv;
    unsigned threads = 0;
    unsigned live = 0;         // threads that have not returned from the kernel
    unsigned arrived = 0;      // threads waiting at the current barrier
    unsigned long generation = 0;
    bool diverged = false;     // a barrier some live threads never reached
    unsigned char *shared = nullptr;
};

thread_local Block *current = nullptr;

const emu_kernel *find(const char *name) {
    for (size_t m = 0; m < emu_module_count; m++)
        for (size_t k = 0; k < emu_module_sizes[m]; k++)
            if (std::strcmp(emu_modules[m][k].name, name) == 0) return &emu_modules[m][k];
    return nullptr;
}

// Releases a barrier whose waiting threads are every live thread (lock held).
void release_if_complete(Block &b) {
    if (b.arrived > 0 && b.arrived == b.live) {
        b.arrived = 0;
        b.generation++;
        b.cv.notify_all();
    }
}

std::mutex launches;

void set_error(char *err, size_t len, const std::string &message) {
    if (err && len) std::snprintf(err, len, "%s", message.c_str());
}

}  // namespace

void emu_syncthreads() {
    Block &b = *current;
    std::unique_lock<std::mutex> lock(b.m);
    unsigned long gen = b.generation;
    b.arrived++;
    release_if_complete(b);
    b.cv.wait(lock, [&] { return b.generation != gen; });
}

void *emu_dynamic_shared() { return current->shared; }

// Error codes of emu_launch.
enum {
    EMU_OK = 0,
    EMU_UNKNOWN_KERNEL = 1,
    EMU_BAD_ARGUMENTS = 2,
    EMU_BAD_LAUNCH = 3,
    EMU_BARRIER_DIVERGENCE = 4,
};

extern "C" {

// The parameter sizes of kernel `name` (up to `cap`), and their count; -1 if no module
// defines it.
long emu_kernel_params(const char *name, size_t *sizes, size_t cap) {
    const emu_kernel *k = find(name);
    if (!k) return -1;
    for (size_t i = 0; i < k->params && i < cap; i++) sizes[i] = k->param_sizes[i];
    return (long)k->params;
}

// Runs kernel `name` on a grid × block launch with `shared_bytes` of dynamic shared
// memory. `args` holds one pointer per parameter, to the argument's value, as
// cuLaunchKernel takes them. Returns EMU_OK or an error code with a message in `err`.
int emu_launch(const char *name, const unsigned grid[3], const unsigned block[3],
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
    unsigned long long threads = (unsigned long long)block[0] * block[1] * block[2];
    if (threads == 0 || threads > MAX_THREADS_PER_BLOCK || grid[0] == 0 || grid[1] == 0 ||
        grid[2] == 0 || grid[1] > 65535 || grid[2] > 65535) {
        set_error(err, err_len, std::string(name) + ": invalid grid or block dimensions");
        return EMU_BAD_LAUNCH;
    }
    if (shared_bytes > DEFAULT_SHARED_LIMIT) {
        set_error(err, err_len, std::string(name) + ": " + std::to_string(shared_bytes) +
                                    " bytes of dynamic shared memory, more than the 48 KiB a "
                                    "kernel gets without opting in");
        return EMU_BAD_LAUNCH;
    }
    std::lock_guard<std::mutex> serial(launches);
    // Exactly the launch's bytes, so AddressSanitizer (GPU_OPS_EMU_SANITIZE=address) sees a
    // kernel that reads or writes past them.
    std::vector<unsigned char> shared(shared_bytes);
    Block b;
    b.threads = (unsigned)threads;
    b.shared = shared_bytes ? shared.data() : nullptr;
    const dim3 g{grid[0], grid[1], grid[2]}, bd{block[0], block[1], block[2]};
    unsigned long long blocks = (unsigned long long)g.x * g.y * g.z;
    bool diverged = false;
    for (unsigned long long n = 0; n < blocks && !diverged; n++) {
        const dim3 bi{(unsigned)(n % g.x), (unsigned)(n / g.x % g.y), (unsigned)(n / g.x / g.y)};
        b.live = b.threads;
        b.arrived = 0;
        // One GPU thread: its indices, the kernel, then leaving the block.
        auto gpu_thread = [&](unsigned t) {
            current = &b;
            gridDim = g;
            blockDim = bd;
            blockIdx = bi;
            threadIdx = dim3{t % bd.x, t / bd.x % bd.y, t / bd.x / bd.y};
            k->call(args);
            std::lock_guard<std::mutex> lock(b.m);
            b.live--;
            // Threads still waiting at a barrier that this thread will never reach.
            if (b.arrived > 0) {
                b.diverged = true;
                b.arrived = 0;
                b.generation++;
                b.cv.notify_all();
            }
        };
        std::vector<std::thread> pool;
        pool.reserve(b.threads);
        bool started = true;
        for (unsigned t = 0; t < b.threads && started; t++) {
            try {
                pool.emplace_back(gpu_thread, t);
            } catch (const std::system_error &) {
                // The host could not start another thread: release the started ones from
                // any barrier (it can never be complete) and fail the launch.
                std::lock_guard<std::mutex> lock(b.m);
                b.live -= b.threads - t;
                b.arrived = 0;
                b.generation++;
                b.cv.notify_all();
                started = false;
            }
        }
        for (auto &th : pool) th.join();
        if (!started) {
            set_error(err, err_len, std::string(name) + ": the host could not start " +
                                        std::to_string(b.threads) + " threads for a block");
            return EMU_BAD_LAUNCH;
        }
        diverged = b.diverged;
    }
    if (diverged) {
        set_error(err, err_len, std::string(name) +
                                    ": a __syncthreads() that not every live thread of the "
                                    "block reached");
        return EMU_BARRIER_DIVERGENCE;
    }
    return EMU_OK;
}

}  // extern "C"
