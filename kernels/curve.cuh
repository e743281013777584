// Points of y² = x³ + b (a = 0: BN254 and BLS12-381 G1) in XYZZ coordinates,
// (X, Y, ZZ, ZZZ) ~ (X/ZZ, Y/ZZZ) with ZZ³ = ZZZ², every coordinate in Montgomery form.
// XYZZ makes the bucket method's mixed additions cheap (8M + 2S) and its formulas
// (hyperelliptic.org EFD: madd-2008-s, add-2008-s, mdbl-2008-s-1, dbl-2008-s-1) have
// one special case each, handled explicitly: the identity (ZZ = 0), P + P (double) and
// P + (-P) (identity). The groups have odd order, so no point has y = 0.
#ifndef GPU_OPS_CURVE_CUH
#define GPU_OPS_CURVE_CUH
#include "fp.cuh"

template <int N> struct xyzz {
    u32 x[N], y[N], zz[N], zzz[N];
};

template <int N> FIELD_FN bool fp_is_zero(const u32 *a) {
    u32 acc = 0;
    for (int i = 0; i < N; i++) acc |= a[i];
    return acc == 0;
}

template <int N> FIELD_FN void fp_copy(u32 *r, const u32 *a) {
    for (int i = 0; i < N; i++) r[i] = a[i];
}

// -a mod p (0 stays 0).
template <int N> FIELD_FN void fp_neg(const fp_params<N> *f, u32 *r, const u32 *a) {
    u32 zero[N] = {0};
    fp_sub(f, r, zero, a);
}

// R mod p: 1 in Montgomery form (R^2 * 1 * R^-1).
template <int N> FIELD_FN void fp_mont_one(const fp_params<N> *f, u32 *r) {
    u32 one[N] = {1};
    fp_mont_mul(f, r, f->r2, one);
}

// a^-1 for a in Montgomery form (the raw words A = aR), in Montgomery form (0 for 0):
// fp_pow reads A as canonical, giving A^(p-2) = a^-1·R^-1; two products by R² make that
// a^-1·R. (A square-and-multiply over the constant exponent written out here, with the
// exponent's bits known at compile time, made NVRTC 12.9 overflow a 2 MiB thread stack
// on BLS12-381's 12 limbs.)
template <int N> FIELD_FN void fp_mont_inv(const fp_params<N> *f, u32 *r, const u32 *a) {
    u32 t[N];
    fp_pow(f, t, a, f->p_minus_2);
    fp_mont_mul(f, r, t, f->r2);
    fp_mont_mul(f, r, r, f->r2);
}

template <int N> FIELD_FN void xyzz_identity(xyzz<N> *p) {
    for (int i = 0; i < N; i++) p->x[i] = p->y[i] = p->zz[i] = p->zzz[i] = 0;
}

template <int N> FIELD_FN bool xyzz_is_identity(const xyzz<N> *p) { return fp_is_zero<N>(p->zz); }

// p = 2·(x, y), (x, y) affine (mdbl-2008-s-1).
template <int N>
FIELD_FN_OUTLINED void xyzz_double_affine(const fp_params<N> *f, xyzz<N> *p, const u32 *x, const u32 *y) {
    u32 u[N], v[N], w[N], s[N], m[N], t[N];
    fp_add(f, u, y, y);
    fp_mont_mul(f, v, u, u);
    fp_mont_mul(f, w, u, v);
    fp_mont_mul(f, s, x, v);
    fp_mont_mul(f, m, x, x);
    fp_add(f, t, m, m);
    fp_add(f, m, t, m);
    fp_mont_mul(f, p->x, m, m);
    fp_add(f, t, s, s);
    fp_sub(f, p->x, p->x, t);
    fp_sub(f, t, s, p->x);
    fp_mont_mul(f, t, m, t);
    fp_mont_mul(f, s, w, y);
    fp_sub(f, p->y, t, s);
    fp_copy<N>(p->zz, v);
    fp_copy<N>(p->zzz, w);
}

// p = 2p (dbl-2008-s-1).
template <int N> FIELD_FN_OUTLINED void xyzz_double(const fp_params<N> *f, xyzz<N> *p) {
    if (xyzz_is_identity(p)) return;
    u32 u[N], v[N], w[N], s[N], m[N], t[N];
    fp_add(f, u, p->y, p->y);
    fp_mont_mul(f, v, u, u);
    fp_mont_mul(f, w, u, v);
    fp_mont_mul(f, s, p->x, v);
    fp_mont_mul(f, m, p->x, p->x);
    fp_add(f, t, m, m);
    fp_add(f, m, t, m);
    // Y3 needs the old Y1: W·Y1 first.
    fp_mont_mul(f, w, w, p->y);
    fp_mont_mul(f, p->x, m, m);
    fp_add(f, t, s, s);
    fp_sub(f, p->x, p->x, t);
    fp_sub(f, t, s, p->x);
    fp_mont_mul(f, t, m, t);
    fp_sub(f, p->y, t, w);
    // W·ZZZ1 = U·V·ZZZ1; w now holds W·Y1, so recompute U·V.
    fp_mont_mul(f, w, u, v);
    fp_mont_mul(f, p->zz, p->zz, v);
    fp_mont_mul(f, p->zzz, p->zzz, w);
}

// p += (x2, y2), affine (madd-2008-s).
template <int N>
FIELD_FN void xyzz_add_affine(const fp_params<N> *f, xyzz<N> *p, const u32 *x2, const u32 *y2) {
    if (xyzz_is_identity(p)) {
        fp_copy<N>(p->x, x2);
        fp_copy<N>(p->y, y2);
        fp_mont_one(f, p->zz);
        fp_copy<N>(p->zzz, p->zz);
        return;
    }
    u32 pp[N], r[N], ppp[N], q[N], t[N];
    fp_mont_mul(f, pp, x2, p->zz);
    fp_sub(f, pp, pp, p->x);     // P = U2 - X1
    fp_mont_mul(f, r, y2, p->zzz);
    fp_sub(f, r, r, p->y);       // R = S2 - Y1
    if (fp_is_zero<N>(pp)) {
        if (fp_is_zero<N>(r)) xyzz_double_affine(f, p, x2, y2);
        else xyzz_identity(p);
        return;
    }
    fp_mont_mul(f, t, pp, pp);   // PP
    fp_mont_mul(f, ppp, pp, t);  // PPP
    fp_mont_mul(f, p->zz, p->zz, t);
    fp_mont_mul(f, p->zzz, p->zzz, ppp);
    fp_mont_mul(f, q, p->x, t);  // Q = X1·PP
    fp_mont_mul(f, p->x, r, r);
    fp_sub(f, p->x, p->x, ppp);
    fp_add(f, t, q, q);
    fp_sub(f, p->x, p->x, t);    // X3 = R² - PPP - 2Q
    fp_mont_mul(f, ppp, p->y, ppp);
    fp_sub(f, t, q, p->x);
    fp_mont_mul(f, t, r, t);
    fp_sub(f, p->y, t, ppp);     // Y3 = R(Q - X3) - Y1·PPP
}

// p += q (add-2008-s).
template <int N> FIELD_FN_OUTLINED void xyzz_add(const fp_params<N> *f, xyzz<N> *p, const xyzz<N> *q) {
    if (xyzz_is_identity(q)) return;
    if (xyzz_is_identity(p)) {
        *p = *q;
        return;
    }
    u32 u1[N], s1[N], pp[N], r[N], ppp[N], t[N];
    fp_mont_mul(f, u1, p->x, q->zz);
    fp_mont_mul(f, pp, q->x, p->zz);
    fp_sub(f, pp, pp, u1);       // P = U2 - U1
    fp_mont_mul(f, s1, p->y, q->zzz);
    fp_mont_mul(f, r, q->y, p->zzz);
    fp_sub(f, r, r, s1);         // R = S2 - S1
    if (fp_is_zero<N>(pp)) {
        if (fp_is_zero<N>(r)) xyzz_double(f, p);
        else xyzz_identity(p);
        return;
    }
    fp_mont_mul(f, t, pp, pp);   // PP
    fp_mont_mul(f, ppp, pp, t);  // PPP
    fp_mont_mul(f, p->zz, p->zz, q->zz);
    fp_mont_mul(f, p->zz, p->zz, t);
    fp_mont_mul(f, p->zzz, p->zzz, q->zzz);
    fp_mont_mul(f, p->zzz, p->zzz, ppp);
    fp_mont_mul(f, u1, u1, t);   // Q = U1·PP
    fp_mont_mul(f, p->x, r, r);
    fp_sub(f, p->x, p->x, ppp);
    fp_add(f, t, u1, u1);
    fp_sub(f, p->x, p->x, t);    // X3 = R² - PPP - 2Q
    fp_mont_mul(f, s1, s1, ppp);
    fp_sub(f, t, u1, p->x);
    fp_mont_mul(f, t, r, t);
    fp_sub(f, p->y, t, s1);      // Y3 = R(Q - X3) - S1·PPP
}

// Jacobian (X', Y', Z') = (X·ZZ·ZZZ², Y·ZZ³·ZZZ², ZZ·ZZZ), the form arkworks' projective
// points use; Z' = 0 for the identity. out holds 3N limbs.
template <int N> FIELD_FN void xyzz_to_jacobian(const fp_params<N> *f, const xyzz<N> *p, u32 *out) {
    u32 a[N], b[N];
    fp_mont_mul(f, a, p->zz, p->zzz);        // ZZ·ZZZ = Z'
    fp_mont_mul(f, b, a, p->zzz);            // ZZ·ZZZ²
    fp_mont_mul(f, out, p->x, b);
    fp_mont_mul(f, b, b, p->zz);
    fp_mont_mul(f, b, b, p->zz);             // ZZ³·ZZZ²
    fp_mont_mul(f, out + N, p->y, b);
    fp_copy<N>(out + 2 * N, a);
}

// Affine (X/ZZ, Y/ZZZ) into out (x then y, 2N limbs, Montgomery form), for a point that is
// not the identity: one inversion, of ZZ·ZZZ.
template <int N> FIELD_FN void xyzz_to_affine(const fp_params<N> *f, const xyzz<N> *p, u32 *out) {
    u32 t[N], u[N];
    fp_mont_mul(f, t, p->zz, p->zzz);
    fp_mont_inv(f, u, t);                    // 1/(ZZ·ZZZ)
    fp_mont_mul(f, t, u, p->zzz);            // 1/ZZ
    fp_mont_mul(f, out, p->x, t);
    fp_mont_mul(f, t, u, p->zz);             // 1/ZZZ
    fp_mont_mul(f, out + N, p->y, t);
}

#endif
