// kernels/msm.cu's msm_scatter, (digits, u64 total, u64 n, u32 nb, cursor, entries):
// entries[cursor[bucket]++] = i | sign, so that each (window, |d|) bucket's entries are
// contiguous. The order inside a bucket varies from run to run; point addition is
// exact, so the sum does not.
@group(0) @binding(1) var<storage, read> digits: array<u32>;
@group(0) @binding(2) var<storage, read_write> cursor: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> entries: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    let total = arg(0u);
    let n = arg(2u);
    let nb = arg(4u);
    for (var k = thread_index(block, thread); k < total; k += grid_threads()) {
        let d = digits[k];
        let m = d & ~MSM_NEG;
        if (m != 0u) {
            let pos = atomicAdd(&cursor[(k / n) * nb + m - 1u], 1u);
            entries[pos] = (k % n) | (d & MSM_NEG);
        }
    }
}
