// Each polynomial of n permuted to bit-reversed order: (x, u64 n, u32 log_n, u64 total).
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
// Unused by this kernel; declared so the field's NTT source compiles with it.
var<private> table: array<u32, 1>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    let n = arg(0u);
    let log_n = arg(2u);
    let total = arg(3u);
    for (var i = thread_index(block, thread); i < total; i += grid_threads()) {
        let k = i % n;
        let r = bitrev(k, log_n);
        if (k < r) {
            let j = i - k + r;
            let a = load_x(i);
            store_x(i, load_x(j));
            store_x(j, a);
        }
    }
}
