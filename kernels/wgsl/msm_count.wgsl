// kernels/msm.cu's msm_count, (digits, u64 total, u64 n, u32 nb, counts):
// counts[w * nb + |d| - 1] += 1 for every nonzero digit.
@group(0) @binding(1) var<storage, read> digits: array<u32>;
@group(0) @binding(2) var<storage, read_write> counts: array<atomic<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    let total = arg(0u);
    let n = arg(2u);
    let nb = arg(4u);
    for (var k = thread_index(block, thread); k < total; k += grid_threads()) {
        let m = digits[k] & ~MSM_NEG;
        if (m != 0u) {
            atomicAdd(&counts[(k / n) * nb + m - 1u], 1u);
        }
    }
}
