// One stage wider than a tile over every polynomial: (x, tw, u64 n, u64 half, u64 total).
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    let n = arg(0u);
    let half = arg(2u);
    let total = arg(4u);
    for (var t = thread_index(block, thread); t < total / 2u; t += grid_threads()) {
        let poly = t / (n / 2u);
        let k = t % (n / 2u);
        let j = k % half;
        let i0 = poly * n + (k / half) * 2u * half + j;
        let w = j * (n / (2u * half));
        let r = butterfly(load_x(i0), load_x(i0 + half), load_table(w));
        store_x(i0, r.a);
        store_x(i0 + half, r.b);
    }
}
