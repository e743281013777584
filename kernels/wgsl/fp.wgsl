// A prime field of N 32-bit limbs with p < 2^(32N - 1), little-endian: BN254 Fr, BN254 Fq
// and BLS12-381 Fr (N = 8), BLS12-381 Fq (N = 12), BabyBear (N = 1). The same arithmetic as kernels/fp.cuh:
// canonical in and out, Montgomery products (CIOS) inside. The engine's library fills in
// N and the constants from the field's modulus (`ops::zk::wgsl`).
const N: u32 = {{N}}u;
alias Fe = array<u32, {{N}}>;
// An exponent of EXP_LIMBS little-endian limbs: 256 bits (the ops' exponents) in every
// field but a wider one, which takes N.
const EXP_LIMBS: u32 = {{EXP_LIMBS}}u;
alias Exp = array<u32, {{EXP_LIMBS}}>;

var<private> P: Fe = Fe({{P}});
// R^2 mod p, R = 2^(32N).
var<private> R2: Fe = Fe({{R2}});
// p - 2, the Fermat exponent of an inverse.
var<private> P_MINUS_2: Exp = Exp({{P_MINUS_2}});
// -p^-1 mod 2^32.
const INV: u32 = {{INV}}u;

struct Difference {
    value: Fe,
    borrow: u32,
}

// a - b limb by limb, and the final borrow.
fn fe_sub_borrow(a_in: Fe, b_in: Fe) -> Difference {
    var a = a_in;
    var b = b_in;
    var r: Fe;
    var borrow = 0u;
    for (var i = 0u; i < N; i++) {
        let d1 = a[i] - b[i];
        let d2 = d1 - borrow;
        borrow = select(0u, 1u, a[i] < b[i]) | select(0u, 1u, d1 < borrow);
        r[i] = d2;
    }
    return Difference(r, borrow);
}

fn fe_sub_p(a: Fe) -> Difference {
    return fe_sub_borrow(a, P);
}

// a if a < p, else a - p; a < 2p is the caller's invariant.
fn fe_reduce_once(a: Fe) -> Fe {
    let d = fe_sub_p(a);
    if (d.borrow == 0u) {
        return d.value;
    }
    return a;
}

// a + b limb by limb, the carry out of the top limb dropped.
fn fe_add_limbs(a_in: Fe, b_in: Fe) -> Fe {
    var a = a_in;
    var b = b_in;
    var r: Fe;
    var c = 0u;
    for (var i = 0u; i < N; i++) {
        let s1 = a[i] + b[i];
        let s2 = s1 + c;
        c = carry(s1, a[i]) | carry(s2, s1);
        r[i] = s2;
    }
    return r;
}

fn fe_add(a: Fe, b: Fe) -> Fe {
    // p < 2^(32N-1): a + b never carries out of N limbs.
    return fe_reduce_once(fe_add_limbs(a, b));
}

fn fe_sub(a: Fe, b: Fe) -> Fe {
    let d = fe_sub_borrow(a, b);
    if (d.borrow != 0u) {
        // a - b + 2^(32N) + p: the dropped carry takes the 2^(32N) back off.
        return fe_add_limbs(d.value, P);
    }
    return d.value;
}

// a * b * R^-1 mod p (CIOS), as fp_mont_mul in kernels/fp.cuh.
fn fe_mont(a_in: Fe, b_in: Fe) -> Fe {
    var a = a_in;
    var b = b_in;
    var t: array<u32, {{N_PLUS_2}}>;
    for (var i = 0u; i < N; i++) {
        var c = 0u;
        for (var j = 0u; j < N; j++) {
            let s = mac(t[j], a[j], b[i], c);
            t[j] = s.x;
            c = s.y;
        }
        let s = t[N] + c;
        t[N + 1u] = carry(s, c);
        t[N] = s;
        let m = t[0] * INV;
        c = mac(t[0], m, P[0], 0u).y;
        for (var j = 1u; j < N; j++) {
            let s2 = mac(t[j], m, P[j], c);
            t[j - 1u] = s2.x;
            c = s2.y;
        }
        let s3 = t[N] + c;
        t[N - 1u] = s3;
        t[N] = t[N + 1u] + carry(s3, c);
    }
    var r: Fe;
    for (var i = 0u; i < N; i++) {
        r[i] = t[i];
    }
    return fe_reduce_once(r);
}

fn fe_mul(a: Fe, b: Fe) -> Fe {
    return fe_mont(fe_mont(a, b), R2);
}

// x^e, canonical in and out, 0^0 = 1: square-and-multiply over all 32·EXP_LIMBS bits in
// the Montgomery domain.
fn fe_pow(x: Fe, e_in: Exp) -> Fe {
    var e = e_in;
    var one: Fe;
    one[0] = 1u;
    let xm = fe_mont(x, R2);
    var acc = fe_mont(one, R2);
    for (var i = i32(32u * EXP_LIMBS) - 1i; i >= 0i; i--) {
        acc = fe_mont(acc, acc);
        if (((e[u32(i) / 32u] >> (u32(i) % 32u)) & 1u) != 0u) {
            acc = fe_mont(acc, xm);
        }
    }
    return fe_mont(acc, one);
}
