// kernels/msm.cu's <curve>_msm_partials, (keys, vals, u64 len, u32 chunk, sums,
// next_keys, next_vals, most_adds, u32 level): a later level of the bucket sums over
// the previous level's `len` slots; most_adds[level] as level 0's.
@group(0) @binding(1) var<storage, read> keys: array<u32>;
@group(0) @binding(2) var<storage, read> vals: array<u32>;
@group(0) @binding(3) var<storage, read_write> sums: array<u32>;
@group(0) @binding(4) var<storage, read_write> next_keys: array<u32>;
@group(0) @binding(5) var<storage, read_write> next_vals: array<u32>;
@group(0) @binding(6) var<storage, read_write> most_adds: array<atomic<u32>>;

fn seq_len() -> u32 {
    return arg(0u);
}

fn seq_key(k: u32) -> u32 {
    return keys[k];
}

fn seq_run_end(k: u32, key: u32, hi: u32) -> u32 {
    var j = k;
    while (j < hi && keys[j] == key) {
        j++;
    }
    return j;
}

fn seq_add(acc: Xyzz, k: u32) -> Xyzz {
    let base = 4u * N * k;
    var q: Xyzz;
    for (var i = 0u; i < N; i++) {
        q.x[i] = vals[base + i];
        q.y[i] = vals[base + N + i];
        q.zz[i] = vals[base + 2u * N + i];
        q.zzz[i] = vals[base + 3u * N + i];
    }
    return xyzz_add(acc, q);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    let chunk = arg(2u);
    let level = arg(3u);
    let threads = (seq_len() + chunk - 1u) / chunk;
    for (var t = thread_index(block, thread); t < threads; t += grid_threads()) {
        atomicMax(&most_adds[level], chunk_sum(t, chunk));
    }
}
