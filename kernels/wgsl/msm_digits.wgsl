// kernels/msm.cu's msm_digits, (scalars, u64 n, u32 c, u32 windows, u32 block_windows,
// digits): each scalar (8 little-endian words) in `windows` signed c-bit digits, |d| with
// the sign in bit 31, digit w of scalar i at digits[(w % block_windows) * n * blocks +
// (w / block_windows) * n + i] with the windows that fill the last block zero (msm.cuh's
// msm_digits_of; block_windows = windows: digits[w * n + i]).
@group(0) @binding(1) var<storage, read> scalars: array<u32>;
@group(0) @binding(2) var<storage, read_write> digits: array<u32>;

// Bits [start, start + c) of scalar i, c <= 16.
fn window_bits(i: u32, start: u32, c: u32) -> u32 {
    let limb = start / 32u;
    let shift = start % 32u;
    if (limb >= 8u) {
        return 0u;
    }
    var v = scalars[8u * i + limb] >> shift;
    // A shift by 32 is taken modulo 32 in WGSL: the next limb only when it adds bits.
    if (limb + 1u < 8u && shift != 0u) {
        v |= scalars[8u * i + limb + 1u] << (32u - shift);
    }
    return v & ((1u << c) - 1u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    if (thread.x >= block_threads()) {
        return;
    }
    let n = arg(0u);
    let c = arg(2u);
    let windows = arg(3u);
    let block_windows = arg(4u);
    let blocks = (windows + block_windows - 1u) / block_windows;
    let half = 1u << (c - 1u);
    for (var i = thread_index(block, thread); i < n; i += grid_threads()) {
        var carry = 0u;
        for (var w = 0u; w < blocks * block_windows; w++) {
            var d = 0u;
            if (w < windows) {
                let raw = window_bits(i, w * c, c) + carry;
                d = raw;
                carry = 0u;
                // The top window holds at most c - 1 bits: its digit stays positive.
                if (raw >= half && w + 1u < windows) {
                    let mag = (1u << c) - raw;  // raw = 2^c gives 0: nothing here, carry on
                    d = select(mag | MSM_NEG, 0u, mag == 0u);
                    carry = 1u;
                }
            }
            digits[(w % block_windows) * n * blocks + (w / block_windows) * n + i] = d;
        }
    }
}
