// Shared by every WGSL kernel (src/backend/wgpu): CUDA's launch geometry and the launch's
// scalar arguments, and 64-bit arithmetic composed from 32-bit words, so no kernel needs
// `SHADER_INT64` (an adapter without 64-bit integers runs them all).
//
// `params`, as the engine packs it for every launch: words 0-2 gridDim, 3-5 blockDim,
// then each scalar argument in the launcher's order, an 8-byte one as two words (low
// first), PARAM_WORDS in all. A uniform buffer, so that every storage binding a
// kernel has is one of its buffers, which follow as bindings 1, 2, … in the launcher's
// order (WebGPU promises 8 a stage; the MSM's bucket kernel binds 8).
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 8>;

fn param(word: u32) -> u32 {
    return params[word / 4u][word % 4u];
}

// CUDA's gridDim.x and blockDim.x.
fn grid_blocks() -> u32 {
    return param(0u);
}

fn block_threads() -> u32 {
    return param(3u);
}

// Every kernel's @workgroup_size: the engine's `max_threads` for a launch's block.
const BLOCK: u32 = 256u;

// The launch's index of this thread (blockIdx.x * blockDim.x + threadIdx.x), and the
// threads in the grid (a grid-stride loop's step).
fn thread_index(block: vec3<u32>, thread: vec3<u32>) -> u32 {
    return block.x * block_threads() + thread.x;
}

fn grid_threads() -> u32 {
    return grid_blocks() * block_threads();
}

// A scalar argument: `word` counts from the first scalar's first word.
fn arg(word: u32) -> u32 {
    return param(6u + word);
}

fn carry(sum: u32, addend: u32) -> u32 {
    return select(0u, 1u, sum < addend);
}

// a * b as (low word, high word), from 16-bit halves (WGSL has no multiply-high).
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p10 = a1 * b0;
    // p01 + two 16-bit values stays below 2^32.
    let mid = a0 * b1 + (p00 >> 16u) + (p10 & 0xffffu);
    return vec2<u32>((mid << 16u) | (p00 & 0xffffu), a1 * b1 + (mid >> 16u) + (p10 >> 16u));
}

// t + a * b + c as (low word, high word): at most 2^64 - 1, as in CUDA's CIOS loop.
fn mac(t: u32, a: u32, b: u32, c: u32) -> vec2<u32> {
    let p = mul_wide(a, b);
    let s1 = p.x + t;
    let s2 = s1 + c;
    return vec2<u32>(s2, p.y + carry(s1, t) + carry(s2, c));
}
