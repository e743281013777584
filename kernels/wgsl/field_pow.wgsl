// out[i] = base[i] ^ exp[i * e_stride]: kernels/field_ops.cu's pow, (base, exp, out,
// u64 n, u32 e_stride), each exponent 256 bits (eight u32 words) in every field.
@group(0) @binding(1) var<storage, read> base: array<u32>;
@group(0) @binding(2) var<storage, read> exps: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    let n = arg(0u);
    let stride = arg(2u);
    for (var i = thread_index(block, thread); i < n; i += grid_threads()) {
        let j = i * stride;
        var x: Fe;
        var e: Exp;
        for (var k = 0u; k < N; k++) {
            x[k] = base[N * i + k];
        }
        for (var k = 0u; k < 8u; k++) {
            e[k] = exps[8u * j + k];
        }
        let r = fe_pow(x, e);
        for (var k = 0u; k < N; k++) {
            out[N * i + k] = r[k];
        }
    }
}
