// out[i] = a[i] (op) b[i * b_stride]: the binary field kernels of kernels/field_ops.cu,
// (a, b, out, u64 n, u32 b_stride), a grid-stride loop. `{{OP}}` is fe_add, fe_sub or
// fe_mul of the field's source above.
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    // arg(1), n's high word, is zero: the engine refuses larger counts.
    let n = arg(0u);
    let stride = arg(2u);
    for (var i = thread_index(block, thread); i < n; i += grid_threads()) {
        let j = i * stride;
        var x: Fe;
        var y: Fe;
        for (var k = 0u; k < N; k++) {
            x[k] = a[N * i + k];
            y[k] = b[N * j + k];
        }
        let r = {{OP}}(x, y);
        for (var k = 0u; k < N; k++) {
            out[N * i + k] = r[k];
        }
    }
}
