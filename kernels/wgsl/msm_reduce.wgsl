// kernels/msm.cu's <curve>_msm_reduce, (buckets, u32 nb, u32 windows, u32 seg_len, out):
// per window segment [start, start + len), Σ_j (start + j + 1)·B[start + j] by a running
// sum from the top, plus start·Σ B by double-and-add (msm.cuh's msm_segment_reduce),
// written as 3N Jacobian words.
@group(0) @binding(1) var<storage, read> buckets: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

fn load_bucket(i: u32) -> Xyzz {
    let base = 4u * N * i;
    var q: Xyzz;
    for (var k = 0u; k < N; k++) {
        q.x[k] = buckets[base + k];
        q.y[k] = buckets[base + N + k];
        q.zz[k] = buckets[base + 2u * N + k];
        q.zzz[k] = buckets[base + 3u * N + k];
    }
    return q;
}

// (X·ZZ·ZZZ², Y·ZZ³·ZZZ², ZZ·ZZZ), the Jacobian form arkworks' projective points use;
// Z = 0 for the identity.
fn store_jacobian(t: u32, p: Xyzz) {
    let z = fe_mont(p.zz, p.zzz);
    let b = fe_mont(z, p.zzz);
    var x = fe_mont(p.x, b);
    var y = fe_mont(p.y, fe_mont(fe_mont(b, p.zz), p.zz));
    var zv = z;
    let base = 3u * N * t;
    for (var k = 0u; k < N; k++) {
        out[base + k] = x[k];
        out[base + N + k] = y[k];
        out[base + 2u * N + k] = zv[k];
    }
}

// One loop and one addition call site: the running sums (2·len additions), then
// start·Σ B by double-and-add from the top bit (a doubling is p + p), then acc +
// scaled. Every addition inlines the field code once more, and a software driver's
// compiler takes seconds for each copy (a kernel with an addition per step took minutes
// for BLS12-381 on lavapipe).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    let nb = arg(0u);
    let windows = arg(1u);
    let seg_len = arg(2u);
    let segs = (nb + seg_len - 1u) / seg_len;
    for (var t = thread_index(block, thread); t < windows * segs; t += grid_threads()) {
        let w = t / segs;
        let start = (t % segs) * seg_len;
        let len = min(nb - start, seg_len);
        var running = xyzz_identity();
        var acc = xyzz_identity();
        var scaled = xyzz_identity();
        // Steps 0 … 2·len - 1: running += B[start + len - 1 - step / 2] (even), acc +=
        // running (odd); acc then weighs B[start + j] by j + 1. Steps 2·len … 2·len + 63:
        // scaled doubled (even), plus running where bit 31 - (step - 2·len) / 2 of start
        // is set (odd); the last step adds scaled to acc.
        let last = 2u * len + 64u;
        for (var step = 0u; step <= last; step++) {
            var lhs: Xyzz;
            var rhs: Xyzz;
            let even = (step & 1u) == 0u;
            if (step < 2u * len) {
                if (even) {
                    lhs = running;
                    rhs = load_bucket(w * nb + start + len - 1u - step / 2u);
                } else {
                    lhs = acc;
                    rhs = running;
                }
            } else if (step < last) {
                let bit = 31u - (step - 2u * len) / 2u;
                lhs = scaled;
                if (even) {
                    rhs = scaled;
                } else if (((start >> bit) & 1u) != 0u) {
                    rhs = running;
                } else {
                    continue;
                }
            } else {
                lhs = acc;
                rhs = scaled;
            }
            let sum = xyzz_add(lhs, rhs);
            if (step < 2u * len) {
                if (even) {
                    running = sum;
                } else {
                    acc = sum;
                }
            } else if (step < last) {
                scaled = sum;
            } else {
                acc = sum;
            }
        }
        store_jacobian(t, acc);
    }
}
