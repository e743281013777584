// Points of y² = x³ + b (a = 0: BN254 and BLS12-381 G1) in XYZZ coordinates over the
// base field above (fp.wgsl with the curve's modulus), every coordinate in Montgomery
// form: the formulas and special cases of kernels/curve.cuh (hyperelliptic.org EFD:
// madd-2008-s, add-2008-s, mdbl-2008-s-1, dbl-2008-s-1). The identity has ZZ = 0, and
// is all zero words.
struct Xyzz {
    x: Fe,
    y: Fe,
    zz: Fe,
    zzz: Fe,
}

fn fe_is_zero(a_in: Fe) -> bool {
    var a = a_in;
    var acc = 0u;
    for (var i = 0u; i < N; i++) {
        acc |= a[i];
    }
    return acc == 0u;
}

// -a mod p (0 stays 0).
fn fe_neg(a: Fe) -> Fe {
    var zero: Fe;
    return fe_sub(zero, a);
}

// R mod p: 1 in Montgomery form.
fn fe_mont_one() -> Fe {
    var one: Fe;
    one[0] = 1u;
    return fe_mont(R2, one);
}

fn xyzz_identity() -> Xyzz {
    var p: Xyzz;
    return p;
}

fn xyzz_is_identity(p: Xyzz) -> bool {
    return fe_is_zero(p.zz);
}

// 2·(x, y), (x, y) affine (mdbl-2008-s-1).
fn xyzz_double_affine(x: Fe, y: Fe) -> Xyzz {
    let u = fe_add(y, y);
    let v = fe_mont(u, u);
    let w = fe_mont(u, v);
    let s = fe_mont(x, v);
    let x2 = fe_mont(x, x);
    let m = fe_add(fe_add(x2, x2), x2);
    var r: Xyzz;
    r.x = fe_sub(fe_mont(m, m), fe_add(s, s));
    r.y = fe_sub(fe_mont(m, fe_sub(s, r.x)), fe_mont(w, y));
    r.zz = v;
    r.zzz = w;
    return r;
}

// 2p (dbl-2008-s-1).
fn xyzz_double(p: Xyzz) -> Xyzz {
    if (xyzz_is_identity(p)) {
        return p;
    }
    let u = fe_add(p.y, p.y);
    let v = fe_mont(u, u);
    let w = fe_mont(u, v);
    let s = fe_mont(p.x, v);
    let x2 = fe_mont(p.x, p.x);
    let m = fe_add(fe_add(x2, x2), x2);
    var r: Xyzz;
    r.x = fe_sub(fe_mont(m, m), fe_add(s, s));
    r.y = fe_sub(fe_mont(m, fe_sub(s, r.x)), fe_mont(w, p.y));
    r.zz = fe_mont(p.zz, v);
    r.zzz = fe_mont(p.zzz, w);
    return r;
}

// p + (x2, y2), affine (madd-2008-s).
fn xyzz_add_affine(p: Xyzz, x2: Fe, y2: Fe) -> Xyzz {
    if (xyzz_is_identity(p)) {
        let one = fe_mont_one();
        return Xyzz(x2, y2, one, one);
    }
    let pp = fe_sub(fe_mont(x2, p.zz), p.x);   // P = U2 - X1
    let rr = fe_sub(fe_mont(y2, p.zzz), p.y);  // R = S2 - Y1
    if (fe_is_zero(pp)) {
        if (fe_is_zero(rr)) {
            return xyzz_double_affine(x2, y2);
        }
        return xyzz_identity();
    }
    let pp2 = fe_mont(pp, pp);
    let ppp = fe_mont(pp, pp2);
    let q = fe_mont(p.x, pp2);                  // Q = X1·PP
    var r: Xyzz;
    r.zz = fe_mont(p.zz, pp2);
    r.zzz = fe_mont(p.zzz, ppp);
    r.x = fe_sub(fe_sub(fe_mont(rr, rr), ppp), fe_add(q, q));  // R² - PPP - 2Q
    r.y = fe_sub(fe_mont(rr, fe_sub(q, r.x)), fe_mont(p.y, ppp));
    return r;
}

// p + q (add-2008-s).
fn xyzz_add(p: Xyzz, q: Xyzz) -> Xyzz {
    if (xyzz_is_identity(q)) {
        return p;
    }
    if (xyzz_is_identity(p)) {
        return q;
    }
    let u1 = fe_mont(p.x, q.zz);
    let pp = fe_sub(fe_mont(q.x, p.zz), u1);    // P = U2 - U1
    let s1 = fe_mont(p.y, q.zzz);
    let rr = fe_sub(fe_mont(q.y, p.zzz), s1);   // R = S2 - S1
    if (fe_is_zero(pp)) {
        if (fe_is_zero(rr)) {
            return xyzz_double(p);
        }
        return xyzz_identity();
    }
    let pp2 = fe_mont(pp, pp);
    let ppp = fe_mont(pp, pp2);
    let qq = fe_mont(u1, pp2);                  // Q = U1·PP
    var r: Xyzz;
    r.zz = fe_mont(fe_mont(p.zz, q.zz), pp2);
    r.zzz = fe_mont(fe_mont(p.zzz, q.zzz), ppp);
    r.x = fe_sub(fe_sub(fe_mont(rr, rr), ppp), fe_add(qq, qq));  // R² - PPP - 2Q
    r.y = fe_sub(fe_mont(rr, fe_sub(qq, r.x)), fe_mont(s1, ppp));
    return r;
}
