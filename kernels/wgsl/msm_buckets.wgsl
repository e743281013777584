// kernels/msm.cu's <curve>_msm_buckets, (points, entries, offsets, counts, u64 buckets,
// u64 threads, u32 chunk, sums, next_keys, next_vals, most_adds): level 0 of the bucket
// sums over the sorted entries. most_adds[0] gets the most additions one thread made.
@group(0) @binding(1) var<storage, read> points: array<u32>;
@group(0) @binding(2) var<storage, read> entries: array<u32>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;
@group(0) @binding(4) var<storage, read> counts: array<u32>;
@group(0) @binding(5) var<storage, read_write> sums: array<u32>;
@group(0) @binding(6) var<storage, read_write> next_keys: array<u32>;
@group(0) @binding(7) var<storage, read_write> next_vals: array<u32>;
@group(0) @binding(8) var<storage, read_write> most_adds: array<atomic<u32>>;

fn seq_len() -> u32 {
    let last = arg(0u) - 1u;
    return offsets[last] + counts[last];
}

// The last bucket whose offset is <= k: empty buckets share their successor's offset.
fn seq_key(k: u32) -> u32 {
    var lo = 0u;
    var hi = arg(0u);
    while (hi - lo > 1u) {
        let mid = lo + (hi - lo) / 2u;
        if (offsets[mid] <= k) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

fn seq_run_end(k: u32, key: u32, hi: u32) -> u32 {
    return min(offsets[key] + counts[key], hi);
}

// acc + the entry's point (x then y, Montgomery words), negated where its sign says.
fn seq_add(acc: Xyzz, k: u32) -> Xyzz {
    let e = entries[k];
    let base = 2u * N * (e & ~MSM_NEG);
    var x: Fe;
    var y: Fe;
    for (var i = 0u; i < N; i++) {
        x[i] = points[base + i];
        y[i] = points[base + N + i];
    }
    if ((e & MSM_NEG) != 0u) {
        y = fe_neg(y);
    }
    return xyzz_add_affine(acc, x, y);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    let threads = arg(2u);
    let chunk = arg(4u);
    for (var t = thread_index(block, thread); t < threads; t += grid_threads()) {
        atomicMax(&most_adds[0], chunk_sum(t, chunk));
    }
}
