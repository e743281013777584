// The first log_tile stages of every tile out of workgroup memory: (x, tw, u64 n,
// u32 log_tile, u64 tiles). A tile is at most TILE_WORDS words (16 KiB, WebGPU's
// guaranteed workgroup storage); the launcher sizes it from the kernel's limits. No
// thread returns early: every one reaches every barrier.
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;

const TILE_WORDS: u32 = 4096u;
var<workgroup> sh: array<u32, 4096>;

fn load_sh(i: u32) -> Fe {
    var v: Fe;
    for (var k = 0u; k < N; k++) {
        v[k] = sh[N * i + k];
    }
    return v;
}

fn store_sh(i: u32, v_in: Fe) {
    var v = v_in;
    for (var k = 0u; k < N; k++) {
        sh[N * i + k] = v[k];
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) block: vec3<u32>, @builtin(local_invocation_id) thread: vec3<u32>) {
    let threads = block_threads();
    let n = arg(0u);
    let log_tile = arg(2u);
    let tiles = arg(3u);
    let tile = 1u << log_tile;
    for (var b = block.x; b < tiles; b += grid_blocks()) {
        let base = N * tile * b;
        for (var i = thread.x; i < N * tile && thread.x < threads; i += threads) {
            sh[i] = x[base + i];
        }
        workgroupBarrier();
        for (var half = 1u; half < tile; half <<= 1u) {
            for (var k = thread.x; k < tile / 2u && thread.x < threads; k += threads) {
                let j = k & (half - 1u);
                let i0 = ((k - j) << 1u) + j;
                let w = j * (n / (2u * half));
                let r = butterfly(load_sh(i0), load_sh(i0 + half), load_table(w));
                store_sh(i0, r.a);
                store_sh(i0 + half, r.b);
            }
            workgroupBarrier();
        }
        for (var i = thread.x; i < N * tile && thread.x < threads; i += threads) {
            x[base + i] = sh[i];
        }
        workgroupBarrier();
    }
}
