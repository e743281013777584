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

// One warp's mma.sync m16n8k16 (emu_mma_m16n8k16) from row-major A (16×16) and B (16×8)
// of 16-bit values, each lane gathering its fragments as PTX lays them out (lane 4·g + t);
// `out` gets D = 1 + A·B, row-major, from each lane's accumulators. Launched with one warp.
extern "C" __global__ void __launch_bounds__(1024)
    emu_check_warp_mma(const unsigned short *a, const unsigned short *b, float *out,
                       unsigned bf16) {
    const unsigned lane = threadIdx.x, g = lane / 4, t = lane % 4;
    auto pair = [](unsigned short lo, unsigned short hi) { return lo | ((unsigned)hi << 16); };
    const unsigned fa[4] = {pair(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),
                            pair(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
                            pair(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),
                            pair(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9])};
    const unsigned fb[2] = {pair(b[2 * t * 8 + g], b[(2 * t + 1) * 8 + g]),
                            pair(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g])};
    float d[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    emu_mma_m16n8k16(bf16 != 0, d, fa, fb, EMU_HERE);
    out[g * 8 + 2 * t] = d[0];
    out[g * 8 + 2 * t + 1] = d[1];
    out[(g + 8) * 8 + 2 * t] = d[2];
    out[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// out[i] = i ^ 5 through a shuffle (emu_shfl_xor_f32) of every warp. With `diverge`, the
// odd lanes return while the even ones wait at the shuffle: a reported fault (and no
// thread has written anything, so a race checker has nothing to see).
extern "C" __global__ void __launch_bounds__(1024)
    emu_check_warp_shuffle(float *out, unsigned diverge) {
    if (diverge && threadIdx.x % 2 == 1) return;
    out[threadIdx.x] = emu_shfl_xor_f32((float)threadIdx.x, 5, EMU_HERE);
}

// One warp's ldmatrix.x4 (emu_ldmatrix_x4) of four 8×8 matrices of 16-bit values stored one
// after another (`m`: 256 values, copied into dynamic shared memory of 512 bytes first),
// lane l naming row l % 8 of matrix l / 8; out[4l + i] is lane l's register i. With
// `from_global`, the rows are named in `m` itself: a reported fault. One warp.
extern "C" __global__ void __launch_bounds__(1024)
    emu_check_ldmatrix(const unsigned short *m, unsigned *out, unsigned trans,
                       unsigned from_global) {
    extern __shared__ unsigned short staged[];
    for (unsigned i = threadIdx.x; i < 256; i += blockDim.x) staged[i] = m[i];
    __syncthreads();
    const unsigned short *base = from_global ? m : staged;
    unsigned r[4];
    emu_ldmatrix_x4(trans != 0, r, base + threadIdx.x / 8 * 64 + threadIdx.x % 8 * 8,
                    EMU_HERE);
    for (unsigned i = 0; i < 4; i++) out[4 * threadIdx.x + i] = r[i];
}
