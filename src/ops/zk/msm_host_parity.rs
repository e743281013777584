//! The MSM kernels' bodies (kernels/msm.cuh, curve.cuh), compiled for the host by
//! build.rs, against arkworks: digits, XYZZ formulas, buckets and the segment reduction
//! the GPU runs, and the precomputed multiples a resident array's MSM runs over, checked
//! without a GPU. Only the launches, the atomic counting sort and
//! the one-block scan are GPU-only (tests/device/parity/zk.rs).

use super::msm::{msm_cpu, Curve, Points};
use super::msm_gpu::{combine, point_words, scalar_words, DeviceCurve, MsmPlan};
use super::samples::{random_elements, random_points};
use super::{Field, FieldVec};
use ark_ec::short_weierstrass::Affine;
use ark_ec::{AffineRepr, CurveGroup};
use ark_ff::PrimeField;

extern "C" {
    fn gpu_ops_host_msm_partials(
        curve: i32,
        scalars: *const u64,
        points: *const u32,
        n: usize,
        c: u32,
        windows: u32,
        block_windows: u32,
        seg_len: u32,
        chunk: u32,
        out: *mut u32,
    );
}

/// The kernels' MSM on the host, identity points dropped as the launcher drops them.
fn host_msm<P: DeviceCurve>(
    code: i32,
    points: &[Affine<P>],
    scalars: &FieldVec,
    plan: Option<MsmPlan>,
) -> Affine<P> {
    let keep: Vec<usize> = (0..points.len())
        .filter(|&i| !points[i].is_zero())
        .collect();
    let chosen: Vec<Affine<P>> = keep.iter().map(|&i| points[i]).collect();
    let words = point_words(&chosen);
    let s = scalar_words(scalars, &keep);
    let plan = plan.unwrap_or_else(|| MsmPlan::new(keep.len(), P::SCALAR_BITS));
    let mut out = vec![0u32; plan.partials() * 3 * P::LIMBS];
    // SAFETY: keep.len() scalars of 4 words and points of 2·LIMBS words; out holds
    // partials·3·LIMBS words, what the reduction writes.
    unsafe {
        gpu_ops_host_msm_partials(
            code,
            s.as_ptr(),
            words.as_ptr(),
            keep.len(),
            plan.c,
            plan.windows,
            plan.block_windows,
            plan.seg_len,
            plan.chunk,
            out.as_mut_ptr(),
        )
    };
    combine(&plan, &out).into_affine()
}

fn limbs(v: &FieldVec) -> &[[u64; 4]] {
    match v {
        FieldVec::Bn254Fr(x) | FieldVec::Bls12_381Fr(x) => x,
        _ => unreachable!(),
    }
}

/// Small windows with short segments, so the start·Σ B term and carries are exercised,
/// and short chunks, so bucket sums are cut across chunks and finished over many levels.
fn plans(bits: u32) -> Vec<Option<MsmPlan>> {
    let small = |c: u32, seg_len: u32, chunk: u32| MsmPlan {
        c,
        windows: bits / c + 1,
        blocks: 1,
        block_windows: bits / c + 1,
        nb: 1 << (c - 1),
        seg_len,
        chunk,
    };
    // Over precomputed multiples: `factor` blocks of points (the last one's windows
    // padded with zero digits where the factor does not divide them).
    let multiples = |plan: MsmPlan, factor: u32| MsmPlan {
        chunk: plan.chunk,
        ..plan.with_multiples(1, factor)
    };
    vec![
        None,
        Some(small(4, 2, 4)),
        Some(small(6, 8, 5)),
        Some(small(13, 256, 16)),
        Some(multiples(small(4, 2, 4), 2)),
        Some(multiples(small(6, 8, 5), 5)),
        Some(multiples(small(13, 256, 16), 20)),
        Some(multiples(MsmPlan::new(3000, bits), 4)),
    ]
}

fn check_curve<P: DeviceCurve>(code: i32, curve: Curve)
where
    P::ScalarField: PrimeField<BigInt = ark_ff::BigInt<4>>,
    Points: AsCurve<P>,
{
    let field = curve.scalar_field();
    let mut r_minus_1 = field.modulus();
    r_minus_1.0[0] -= 1;
    for n in [1usize, 2, 31, 33, 257, 3000] {
        let sample = random_points(curve, n, n as u64);
        let mut points = sample.as_curve().to_vec();
        let mut scalars = random_elements(field, n, 100 + n as u64);
        if n >= 31 {
            // The hard cases: identity, P and −P, duplicates (doubling), zero, r − 1,
            // and a run of equal scalars (one bucket per window).
            points[1] = Affine::identity();
            points[2] = -points[3];
            points[5] = points[4];
            scalars[4] = scalars[5];
            scalars[6] = crate::ops::zk::U256::ZERO;
            scalars[7] = r_minus_1;
            for s in scalars.iter_mut().skip(10).take(20) {
                *s = crate::ops::zk::U256::from_u64(0xbeef);
            }
        }
        let s = FieldVec::from_integers(field, &scalars).unwrap();
        let want = msm_cpu(&points, limbs(&s));
        for plan in plans(P::SCALAR_BITS) {
            assert_eq!(
                host_msm(code, &points, &s, plan),
                want,
                "{curve:?} n={n} {plan:?}"
            );
        }
    }
    // Every scalar equal: all points in the same buckets; and all points equal.
    let g = Affine::<P>::generator();
    let same = FieldVec::from_integers(field, &vec![r_minus_1; 64]).unwrap();
    for plan in plans(P::SCALAR_BITS) {
        assert_eq!(
            host_msm(code, &[g; 64], &same, plan),
            msm_cpu(&[g; 64], limbs(&same)),
            "{plan:?}"
        );
    }
}

/// The curve's point vector out of the enum.
trait AsCurve<P: DeviceCurve> {
    fn as_curve(&self) -> &[Affine<P>];
}

impl AsCurve<ark_bn254::g1::Config> for Points {
    fn as_curve(&self) -> &[ark_bn254::G1Affine] {
        match self {
            Points::Bn254G1(p) => p,
            _ => panic!("not bn254_g1"),
        }
    }
}

impl AsCurve<ark_bls12_381::g1::Config> for Points {
    fn as_curve(&self) -> &[ark_bls12_381::G1Affine] {
        match self {
            Points::Bls12_381G1(p) => p,
            _ => panic!("not bls12_381_g1"),
        }
    }
}

#[test]
fn bn254_kernel_msm_matches_arkworks() {
    check_curve::<ark_bn254::g1::Config>(0, Curve::Bn254G1);
}

#[test]
fn bls12_381_kernel_msm_matches_arkworks() {
    check_curve::<ark_bls12_381::g1::Config>(1, Curve::Bls12_381G1);
}

#[test]
fn all_identity_points_sum_to_the_identity() {
    let points = vec![ark_bn254::G1Affine::identity(); 3];
    let s =
        FieldVec::from_integers(Field::Bn254Fr, &random_elements(Field::Bn254Fr, 3, 1)).unwrap();
    assert!(host_msm(0, &points, &s, None).is_zero());
}
