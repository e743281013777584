// msm.cuh's msm_chunk_sum for the bucket kernels: the sorted sequence (level 0: the
// entries; later levels: the previous level's slots) cut into chunks of `chunk` items,
// one thread each, so no thread adds more than `chunk` points whatever the scalars. A
// run of one bucket inside a chunk is that bucket's sum; a run cut by the chunk's edge
// is left in one of the chunk's two slots (2t: the run that began before the chunk,
// 2t + 1: the run that goes on after it), which the next level reduces the same way.
//
// The kernel that includes this defines the sequence (seq_len, seq_key, seq_run_end,
// seq_add) and the bindings `sums`, `next_keys` and `next_vals` (XYZZ points of 4N
// words: x, y, zz, zzz).

fn store_point(i: u32, p: Xyzz, to_sums: bool) {
    var v = p;
    let base = 4u * N * i;
    for (var k = 0u; k < N; k++) {
        if (to_sums) {
            sums[base + k] = v.x[k];
            sums[base + N + k] = v.y[k];
            sums[base + 2u * N + k] = v.zz[k];
            sums[base + 3u * N + k] = v.zzz[k];
        } else {
            next_vals[base + k] = v.x[k];
            next_vals[base + N + k] = v.y[k];
            next_vals[base + 2u * N + k] = v.zz[k];
            next_vals[base + 3u * N + k] = v.zzz[k];
        }
    }
}

// Chunk t: finished runs into sums[key], cut runs into the slots; returns the additions
// made (the serial work).
fn chunk_sum(t: u32, chunk: u32) -> u32 {
    let len = seq_len();
    let lo = t * chunk;
    let hi = min(lo + chunk, len);
    var head_key = MSM_NO_KEY;
    var tail_key = MSM_NO_KEY;
    var adds = 0u;
    var k = lo;
    while (k < hi) {
        let key = seq_key(k);
        let end = seq_run_end(k, key, hi);
        if (key == MSM_NO_KEY) {
            k = end;
            continue;
        }
        let began_before = k == lo && lo > 0u && seq_key(lo - 1u) == key;
        let goes_on = end == hi && hi < len && seq_key(hi) == key;
        var acc = xyzz_identity();
        adds += end - k;
        for (; k < end; k++) {
            acc = seq_add(acc, k);
        }
        if (began_before) {
            head_key = key;
            store_point(2u * t, acc, false);
        } else if (goes_on) {
            tail_key = key;
            store_point(2u * t + 1u, acc, false);
        } else {
            store_point(key, acc, true);
        }
    }
    // An unused slot takes the other slot's key with the identity, so that every key's
    // items stay contiguous in the next level (a run cut on both sides fills the head).
    if (head_key == MSM_NO_KEY) {
        head_key = tail_key;
        store_point(2u * t, xyzz_identity(), false);
    }
    if (tail_key == MSM_NO_KEY) {
        tail_key = head_key;
        store_point(2u * t + 1u, xyzz_identity(), false);
    }
    next_keys[2u * t] = head_key;
    next_keys[2u * t + 1u] = tail_key;
    return adds;
}
