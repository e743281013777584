// kernels/msm.cu's msm_scan, (counts, offsets, u64 len): the exclusive prefix sum of
// `len` counts in one workgroup. Each thread sums a contiguous run, thread 0 scans the
// run totals, then each thread writes its run's offsets. No thread returns early:
// every one reaches both barriers.
@group(0) @binding(1) var<storage, read> counts: array<u32>;
@group(0) @binding(2) var<storage, read_write> offsets: array<u32>;

var<workgroup> totals: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) thread: vec3<u32>) {
    let threads = block_threads();
    let len = arg(0u);
    let run = (len + threads - 1u) / threads;
    let t = thread.x;
    var lo = len;
    if (t < threads) {
        lo = min(t * run, len);
    }
    let hi = min(lo + run, len);
    var sum = 0u;
    for (var k = lo; k < hi; k++) {
        sum += counts[k];
    }
    totals[t] = sum;
    workgroupBarrier();
    if (t == 0u) {
        var acc = 0u;
        for (var i = 0u; i < threads; i++) {
            let v = totals[i];
            totals[i] = acc;
            acc += v;
        }
    }
    workgroupBarrier();
    var acc = totals[t];
    for (var k = lo; k < hi; k++) {
        offsets[k] = acc;
        acc += counts[k];
    }
}
