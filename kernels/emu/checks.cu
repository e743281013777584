// Kernels that break or lean on the execution model on purpose. They are compiled only
// into the emulated device (never shipped), so tests can show its barrier and shared
// memory behave as on hardware and its checker catches a divergent barrier. Each declares
// the most threads any device gives a block (1024; the shared arrays hold as many), so
// the tests may launch whatever block they need.

// Half of every block returns before a barrier the other half waits at.
extern "C" __global__ void __launch_bounds__(1024) emu_check_divergent_barrier(unsigned *out) {
    if (threadIdx.x % 2 == 0) return;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

// Each thread writes its slot of shared memory, then reads its neighbour's after the
// barrier: right only if the barrier holds every thread until all have written, and if
// shared memory is the block's.
extern "C" __global__ void __launch_bounds__(1024) emu_check_shared_exchange(unsigned *out) {
    __shared__ unsigned slot[1024];
    slot[threadIdx.x] = threadIdx.x * 3 + blockIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = slot[(threadIdx.x + 1) % blockDim.x];
}

// Dynamic shared memory of the launch's size: thread t writes word t, reads word n-1-t.
extern "C" __global__ void __launch_bounds__(1024) emu_check_dynamic_shared(unsigned *out) {
    extern __shared__ unsigned words[];
    words[threadIdx.x] = threadIdx.x + 100;
    __syncthreads();
    out[threadIdx.x] = words[blockDim.x - 1 - threadIdx.x];
}

// A race on purpose: each thread writes its slot, then reads its neighbour's with no
// barrier between. Under ThreadSanitizer (GPU_OPS_EMU_SANITIZE=thread) it is reported.
extern "C" __global__ void __launch_bounds__(1024) emu_check_shared_race(unsigned *out) {
    __shared__ unsigned slot[1024];
    slot[threadIdx.x] = threadIdx.x + 1;
    out[threadIdx.x] = slot[(threadIdx.x + 1) % blockDim.x];
}
