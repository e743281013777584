// Batch inversion, kernels/field_ops.cu's inv, (in, out, u64 n, u64 chunk): each thread
// inverts its own chunk of `chunk` consecutive nonzero elements with Montgomery's trick
// (prefix products in out, one Fermat inversion, back substitution).
@group(0) @binding(1) var<storage, read> values: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

fn load_in(i: u32) -> Fe {
    var x: Fe;
    for (var k = 0u; k < N; k++) {
        x[k] = values[N * i + k];
    }
    return x;
}

fn load_out(i: u32) -> Fe {
    var x: Fe;
    for (var k = 0u; k < N; k++) {
        x[k] = out[N * i + k];
    }
    return x;
}

fn store(i: u32, v_in: Fe) {
    var v = v_in;
    for (var k = 0u; k < N; k++) {
        out[N * i + k] = v[k];
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    // The high words (arg 1 and 3) are zero: the engine refuses larger values.
    let n = arg(0u);
    let chunk = arg(2u);
    let chunks = (n + chunk - 1u) / chunk;
    for (var c = thread_index(block, thread); c < chunks; c += grid_threads()) {
        let s = c * chunk;
        let len = min(chunk, n - s);
        store(s, load_in(s));
        for (var i = 1u; i < len; i++) {
            store(s + i, fe_mul(load_out(s + i - 1u), load_in(s + i)));
        }
        var inv = fe_pow(load_out(s + len - 1u), P_MINUS_2);
        for (var i = len - 1u; i > 0u; i--) {
            let t = fe_mul(inv, load_out(s + i - 1u));
            inv = fe_mul(inv, load_in(s + i));
            store(s + i, t);
        }
        store(s, inv);
    }
}
