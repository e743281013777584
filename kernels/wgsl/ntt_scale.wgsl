// x[i] = x[i] · s[i mod n]: (x, s, u64 n, u64 total).
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    let n = arg(0u);
    let total = arg(2u);
    for (var i = thread_index(block, thread); i < total; i += grid_threads()) {
        store_x(i, {{TABLE_MUL}}(load_x(i), load_table(i % n)));
    }
}
