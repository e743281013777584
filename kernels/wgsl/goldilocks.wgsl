// Goldilocks, p = 2^64 - 2^32 + 1: an element is two 32-bit words (low first), as the
// launcher's u64 is in memory. The same arithmetic as kernels/goldilocks.cuh, with each
// 64-bit step composed from 32-bit words: 2^64 = 2^32 - 1 and 2^96 = -1 (mod p).
const N: u32 = 2u;
alias Fe = array<u32, 2>;
alias Exp = array<u32, 8>;

const P_LO: u32 = 1u;
const P_HI: u32 = 0xffffffffu;
var<private> P_MINUS_2: Exp = Exp(0xffffffffu, 0xfffffffeu, 0u, 0u, 0u, 0u, 0u, 0u);

// 64-bit words as vec2 (low, high).
fn w_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + carry(lo, a.x));
}

fn w_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn w_less(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}

const EPSILON: vec2<u32> = vec2<u32>(0xffffffffu, 0u);
const MODULUS: vec2<u32> = vec2<u32>(P_LO, P_HI);

fn gl_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let s = w_add(a, b);
    // A carry out means the true sum is s + 2^64 = s + EPSILON (mod p), and that is < p.
    if (w_less(s, a)) {
        return w_add(s, EPSILON);
    }
    if (w_less(s, MODULUS)) {
        return s;
    }
    return w_sub(s, MODULUS);
}

fn gl_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let d = w_sub(a, b);
    if (w_less(a, b)) {
        return w_add(d, MODULUS);
    }
    return d;
}

// hi * 2^64 + lo mod p.
fn gl_reduce128(hi: vec2<u32>, lo: vec2<u32>) -> vec2<u32> {
    let hi_hi = vec2<u32>(hi.y, 0u);
    var t0 = w_sub(lo, hi_hi);
    if (w_less(lo, hi_hi)) {
        t0 = w_sub(t0, EPSILON); // borrowed 2^64 = EPSILON
    }
    // hi.x * EPSILON = hi.x * 2^32 - hi.x, below 2^64.
    let t1 = w_sub(vec2<u32>(0u, hi.x), vec2<u32>(hi.x, 0u));
    var t2 = w_add(t0, t1);
    if (w_less(t2, t1)) {
        t2 = w_add(t2, EPSILON); // carried 2^64 = EPSILON; cannot overflow again
    }
    if (w_less(t2, MODULUS)) {
        return t2;
    }
    return w_sub(t2, MODULUS);
}

fn gl_mul(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let p00 = mul_wide(a.x, b.x);
    let p01 = mul_wide(a.x, b.y);
    let p10 = mul_wide(a.y, b.x);
    let p11 = mul_wide(a.y, b.y);
    // Word 1: p00.hi + p01.lo + p10.lo, carries into word 2.
    let s1 = p00.y + p01.x;
    let w1 = s1 + p10.x;
    let c1 = carry(s1, p00.y) + carry(w1, s1);
    // Word 2: p01.hi + p10.hi + p11.lo + c1, carries into word 3.
    let s2 = p01.y + p10.y;
    let s3 = s2 + p11.x;
    let w2 = s3 + c1;
    let c2 = carry(s2, p01.y) + carry(s3, s2) + carry(w2, s3);
    let w3 = p11.y + c2;
    return gl_reduce128(vec2<u32>(w2, w3), vec2<u32>(p00.x, w1));
}

fn fe(v: vec2<u32>) -> Fe {
    return Fe(v.x, v.y);
}

fn word(a: Fe) -> vec2<u32> {
    return vec2<u32>(a[0], a[1]);
}

fn fe_add(a: Fe, b: Fe) -> Fe {
    return fe(gl_add(word(a), word(b)));
}

fn fe_sub(a: Fe, b: Fe) -> Fe {
    return fe(gl_sub(word(a), word(b)));
}

fn fe_mul(a: Fe, b: Fe) -> Fe {
    return fe(gl_mul(word(a), word(b)));
}

// x^e for a 256-bit exponent, 0^0 = 1.
fn fe_pow(x: Fe, e_in: Exp) -> Fe {
    var e = e_in;
    let b = word(x);
    var acc = vec2<u32>(1u, 0u);
    for (var i = 255i; i >= 0i; i--) {
        acc = gl_mul(acc, acc);
        if (((e[u32(i) / 32u] >> (u32(i) % 32u)) & 1u) != 0u) {
            acc = gl_mul(acc, b);
        }
    }
    return fe(acc);
}
