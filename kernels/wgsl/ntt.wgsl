// The NTT's four kernels (kernels/ntt.cu, index maps of kernels/ntt.cuh) over the field's
// source above: `{{TABLE_MUL}}` multiplies an element by a twiddle or scale factor as the
// launcher's tables hold them (a Montgomery product for the 256-bit fields, whose tables
// are in Montgomery form; the canonical product for Goldilocks and BabyBear). One of the
// four entry points (ntt_scale, ntt_bitrev, ntt_stage, ntt_tile) follows, with `x` and
// `table`.

fn load_x(i: u32) -> Fe {
    var v: Fe;
    for (var k = 0u; k < N; k++) {
        v[k] = x[N * i + k];
    }
    return v;
}

fn store_x(i: u32, v_in: Fe) {
    var v = v_in;
    for (var k = 0u; k < N; k++) {
        x[N * i + k] = v[k];
    }
}

fn load_table(i: u32) -> Fe {
    var v: Fe;
    for (var k = 0u; k < N; k++) {
        v[k] = table[N * i + k];
    }
    return v;
}

// (a, b) <- (a + w·b, a - w·b).
struct Pair {
    a: Fe,
    b: Fe,
}

fn butterfly(a: Fe, b: Fe, w: Fe) -> Pair {
    let v = {{TABLE_MUL}}(b, w);
    return Pair(fe_add(a, v), fe_sub(a, v));
}

fn bitrev(k: u32, bits: u32) -> u32 {
    if (bits == 0u) {
        return 0u;
    }
    return reverseBits(k) >> (32u - bits);
}
