//! Multi-scalar multiplication Σ sᵢ·Pᵢ over G1 of BN254 and BLS12-381: input validation
//! (canonical coordinates, on the curve, in the prime-order subgroup) and the CPU twin,
//! arkworks' parallel Pippenger. Results are affine, so both backends are compared in
//! the one canonical form a point has.

use super::{Field, FieldVec};
use crate::backend::{DeviceError, DeviceLease, Job};
use ark_ec::short_weierstrass::{Affine, Projective, SWCurveConfig};
use ark_ec::{AffineRepr, CurveGroup, VariableBaseMSM};
use ark_ff::{BigInt, PrimeField, Zero};
use num_bigint::BigUint;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Point errors reported at most; the count says how many there were.
const MAX_REPORTED: usize = 16;

/// A prime-order group of points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Curve {
    /// BN254 (alt_bn128) G1: y² = x³ + 3 over the 254-bit base field, prime order r
    /// (the `bn254_fr` modulus). Coordinates are 32 bytes.
    #[serde(rename = "bn254_g1")]
    Bn254G1,
    /// BLS12-381 G1: y² = x³ + 4 over the 381-bit base field; the points of order r
    /// (the `bls12_381_fr` modulus). Coordinates are 48 bytes.
    #[serde(rename = "bls12_381_g1")]
    Bls12_381G1,
}

impl Curve {
    pub const ALL: [Curve; 2] = [Curve::Bn254G1, Curve::Bls12_381G1];

    pub fn name(self) -> &'static str {
        match self {
            Curve::Bn254G1 => "bn254_g1",
            Curve::Bls12_381G1 => "bls12_381_g1",
        }
    }

    /// The field scalars belong to: the group order.
    pub fn scalar_field(self) -> Field {
        match self {
            Curve::Bn254G1 => Field::Bn254Fr,
            Curve::Bls12_381G1 => Field::Bls12_381Fr,
        }
    }

    /// Bytes of one little-endian coordinate in the base64 form.
    pub fn coordinate_bytes(self) -> usize {
        match self {
            Curve::Bn254G1 => 32,
            Curve::Bls12_381G1 => 48,
        }
    }
}

/// A point as sent: two coordinates, or `None` for the identity.
pub type RawPoint = Option<(BigUint, BigUint)>;

/// Why points were refused: the first few with their index, and how many in all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PointErrors {
    pub listed: Vec<(usize, String)>,
    pub count: usize,
}

/// Validated affine points of one curve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Points {
    Bn254G1(Vec<ark_bn254::G1Affine>),
    Bls12_381G1(Vec<ark_bls12_381::G1Affine>),
}

impl Points {
    pub fn curve(&self) -> Curve {
        match self {
            Points::Bn254G1(_) => Curve::Bn254G1,
            Points::Bls12_381G1(_) => Curve::Bls12_381G1,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Points::Bn254G1(p) => p.len(),
            Points::Bls12_381G1(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The parts one after the other; all of the first part's curve.
    pub fn concat(parts: Vec<Points>) -> Points {
        let mut parts = parts.into_iter();
        let mut out = parts.next().expect("at least one part");
        for part in parts {
            match (&mut out, part) {
                (Points::Bn254G1(o), Points::Bn254G1(p)) => o.extend(p),
                (Points::Bls12_381G1(o), Points::Bls12_381G1(p)) => o.extend(p),
                _ => panic!("concat of different curves"),
            }
        }
        out
    }

    /// Checks every point (in parallel: the BLS12-381 subgroup check is a scalar
    /// multiplication). `(0, 0)` is the identity, as in Ethereum's precompiles: it is on
    /// neither curve.
    pub fn validate(curve: Curve, raw: &[RawPoint]) -> Result<Points, PointErrors> {
        match curve {
            Curve::Bn254G1 => validate_all(raw).map(Points::Bn254G1),
            Curve::Bls12_381G1 => validate_all(raw).map(Points::Bls12_381G1),
        }
    }

    /// `x ‖ y` per point, each coordinate `curve.coordinate_bytes()` little-endian bytes;
    /// all zero bytes for the identity.
    pub fn from_le_bytes(curve: Curve, bytes: &[u8]) -> Result<Points, PointErrors> {
        let width = curve.coordinate_bytes();
        if bytes.len() % (2 * width) != 0 {
            return Err(PointErrors {
                listed: vec![(
                    bytes.len() / (2 * width),
                    format!(
                        "{} bytes is not a whole number of {}-byte {} points (x ‖ y, little-endian)",
                        bytes.len(),
                        2 * width,
                        curve.name()
                    ),
                )],
                count: 1,
            });
        }
        let raw: Vec<RawPoint> = bytes
            .par_chunks_exact(2 * width)
            .map(|c| {
                Some((
                    BigUint::from_bytes_le(&c[..width]),
                    BigUint::from_bytes_le(&c[width..]),
                ))
            })
            .collect();
        Points::validate(curve, &raw)
    }

    /// Point i's affine coordinates, `None` for the identity.
    pub fn coordinates(&self, i: usize) -> Option<(BigUint, BigUint)> {
        match self {
            Points::Bn254G1(p) => coordinates(&p[i]),
            Points::Bls12_381G1(p) => coordinates(&p[i]),
        }
    }

    /// The inverse of `from_le_bytes`.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let width = self.curve().coordinate_bytes();
        let mut out = vec![0u8; 2 * width * self.len()];
        for (i, chunk) in out.chunks_exact_mut(2 * width).enumerate() {
            if let Some((x, y)) = self.coordinates(i) {
                for (k, v) in [x, y].iter().enumerate() {
                    let bytes = v.to_bytes_le();
                    chunk[k * width..k * width + bytes.len()].copy_from_slice(&bytes);
                }
            }
        }
        out
    }
}

fn coordinates<P: SWCurveConfig>(p: &Affine<P>) -> Option<(BigUint, BigUint)>
where
    P::BaseField: PrimeField,
{
    p.xy()
        .map(|(x, y)| (x.into_bigint().into(), y.into_bigint().into()))
}

fn validate_all<P: SWCurveConfig>(raw: &[RawPoint]) -> Result<Vec<Affine<P>>, PointErrors>
where
    P::BaseField: PrimeField,
{
    let checked: Vec<Result<Affine<P>, String>> = raw.par_iter().map(validate_one).collect();
    let count = checked.iter().filter(|r| r.is_err()).count();
    if count == 0 {
        return Ok(checked.into_iter().map(|r| r.expect("no errors")).collect());
    }
    let listed = checked
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| r.err().map(|m| (i, m)))
        .take(MAX_REPORTED)
        .collect();
    Err(PointErrors { listed, count })
}

fn validate_one<P: SWCurveConfig>(raw: &RawPoint) -> Result<Affine<P>, String>
where
    P::BaseField: PrimeField,
{
    let Some((x, y)) = raw else {
        return Ok(Affine::identity());
    };
    if x.is_zero() && y.is_zero() {
        return Ok(Affine::identity());
    }
    let modulus: BigUint = <P::BaseField as PrimeField>::MODULUS.into();
    let coordinate = |v: &BigUint, name: &str| {
        if *v >= modulus {
            return Err(format!(
                "{name} is not a canonical coordinate: it must be less than the base field modulus {modulus}"
            ));
        }
        Ok(P::BaseField::from(v.clone()))
    };
    let point = Affine::<P>::new_unchecked(coordinate(x, "x")?, coordinate(y, "y")?);
    if !point.is_on_curve() {
        return Err(format!(
            "not on the curve y² = x³ + {}",
            Into::<BigUint>::into(P::COEFF_B.into_bigint())
        ));
    }
    if !point.is_in_correct_subgroup_assuming_on_curve() {
        return Err("on the curve but not in the prime-order subgroup".into());
    }
    Ok(point)
}

/// `--msm-precompute-factor`'s default: multiples of each resident point a device
/// precomputes (`MsmJob::with_precomputed_multiples`). Four, so the windows of buckets a
/// 2^20 BN254 MSM sorts and reduces fall from 16 to 4 for four times its 64 MiB of
/// points; not yet measured against other factors on a GPU (docs/PERFORMANCE.md).
pub const DEFAULT_PRECOMPUTE_FACTOR: u32 = 4;

/// One point set and one or more scalar vectors over it (a batch).
#[derive(Clone, Debug)]
pub struct MsmJob {
    /// Shared with a resident array's points when the request named one: never copied.
    points: std::sync::Arc<Points>,
    scalars: Vec<FieldVec>,
    /// Set when the points are a resident array's: the key under which a device keeps
    /// their upload between jobs (`with_device_key`).
    device_key: Option<String>,
    /// Multiples of each resident point a device may precompute and keep
    /// (`with_precomputed_multiples`); 1: none.
    multiples: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MsmShape {
    #[error("give at least one point")]
    NoPoints,
    #[error("give at least one scalar vector")]
    NoScalars,
    #[error("scalar vector {batch} has {scalars} elements for {points} points: give one scalar per point")]
    Lengths {
        batch: usize,
        scalars: usize,
        points: usize,
    },
    #[error("scalars of {curve} are {expected} elements")]
    WrongField {
        curve: &'static str,
        expected: &'static str,
    },
}

impl MsmJob {
    pub fn new(
        points: impl Into<std::sync::Arc<Points>>,
        scalars: Vec<FieldVec>,
    ) -> Result<Self, MsmShape> {
        let points = points.into();
        if points.is_empty() {
            return Err(MsmShape::NoPoints);
        }
        if scalars.is_empty() {
            return Err(MsmShape::NoScalars);
        }
        let field = points.curve().scalar_field();
        for (batch, s) in scalars.iter().enumerate() {
            if s.field() != field {
                return Err(MsmShape::WrongField {
                    curve: points.curve().name(),
                    expected: field.name(),
                });
            }
            if s.len() != points.len() {
                return Err(MsmShape::Lengths {
                    batch,
                    scalars: s.len(),
                    points: points.len(),
                });
            }
        }
        Ok(Self {
            points,
            scalars,
            device_key: None,
            multiples: 1,
        })
    }

    /// Marks the points as a resident array's, kept on a device under `key` after their
    /// first upload there (`DeviceLease::cached_table`, under `--gpu-table-cache-mib`),
    /// so a later MSM over them uploads only its scalars. The key must name these points
    /// and nothing else for as long as any device may hold it.
    pub fn with_device_key(mut self, key: String) -> Self {
        self.device_key = Some(key);
        self
    }

    /// The key a device keeps these points under, when they are a resident array's.
    pub fn device_key(&self) -> Option<&str> {
        self.device_key.as_deref()
    }

    /// For resident points (`with_device_key`): a device may build up to `factor`
    /// multiples of each point once (2^(k·c·W')·P for k < ⌈W/W'⌉, W' = ⌈W / factor⌉ of
    /// the W digit windows) and keep them under the points' key, so this and every later
    /// MSM over them sorts and reduces W' windows of buckets instead of W
    /// (`MsmPlan::with_multiples`). It builds them only where they fit half the room of
    /// its table cache (`--gpu-table-cache-mib`) and the job's memory; 1 (the default)
    /// builds none.
    pub fn with_precomputed_multiples(mut self, factor: u32) -> Self {
        self.multiples = factor.max(1);
        self
    }

    /// The multiples of each resident point a device may precompute (1: none).
    pub fn precomputed_multiples(&self) -> u32 {
        self.multiples
    }

    pub fn curve(&self) -> Curve {
        self.points.curve()
    }

    pub fn points(&self) -> &Points {
        &self.points
    }

    pub fn scalars(&self) -> &[FieldVec] {
        &self.scalars
    }

    /// Points × scalar vectors: the multiply-adds the job asks for.
    pub fn terms(&self) -> usize {
        self.points.len() * self.scalars.len()
    }

    pub fn input_bytes(&self) -> usize {
        2 * self.curve().coordinate_bytes() * self.points.len()
            + self.scalars.iter().map(FieldVec::byte_len).sum::<usize>()
    }

    /// One result per scalar vector, as a point vector of the job's curve.
    pub fn run_cpu(&self) -> Points {
        match &*self.points {
            Points::Bn254G1(p) => Points::Bn254G1(self.each_batch(|s| msm_cpu(p, s))),
            Points::Bls12_381G1(p) => Points::Bls12_381G1(self.each_batch(|s| msm_cpu(p, s))),
        }
    }

    fn each_batch<T>(&self, f: impl Fn(&[[u64; 4]]) -> T) -> Vec<T> {
        self.scalars
            .iter()
            .map(|s| match s {
                FieldVec::Bn254Fr(v) | FieldVec::Bls12_381Fr(v) => f(v),
                _ => unreachable!("MsmJob::new checked the scalar field"),
            })
            .collect()
    }
}

/// arkworks' MSM (parallel over windows) on canonical scalar limbs.
pub(crate) fn msm_cpu<P: SWCurveConfig>(points: &[Affine<P>], scalars: &[[u64; 4]]) -> Affine<P>
where
    P::ScalarField: PrimeField<BigInt = BigInt<4>>,
{
    let bigints: Vec<BigInt<4>> = scalars.iter().map(|s| BigInt(*s)).collect();
    Projective::<P>::msm_bigint(points, &bigints).into_affine()
}

impl Job for MsmJob {
    /// One sum per scalar vector.
    type Output = Points;

    fn name(&self) -> &'static str {
        "msm"
    }

    /// Resident points apart: a device's time over them has no point upload (nor, once
    /// built, the multiples' cost).
    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        match self.device_key {
            Some(_) => format!("{}/resident", self.curve().name()).into(),
            None => self.curve().name().into(),
        }
    }

    fn size(&self) -> usize {
        self.terms()
    }

    fn input_bytes(&self) -> usize {
        MsmJob::input_bytes(self)
    }

    /// A 2^10 MSM takes the CPU about a millisecond: less than a device round trip with
    /// its seven launches.
    fn gpu_threshold(&self) -> usize {
        1 << 12
    }

    fn run_cpu(&self) -> Points {
        MsmJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Points, DeviceError> {
        super::msm_gpu::launch_msm(self, dev)
    }

    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        crate::backend::verify::exactly(device, cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::zk::samples::{random_elements, random_points};
    use crate::ops::zk::U256;

    /// The naive Σ sᵢ·Pᵢ, one scalar multiplication at a time.
    fn naive<P: SWCurveConfig>(points: &[Affine<P>], scalars: &[[u64; 4]]) -> Affine<P> {
        points
            .iter()
            .zip(scalars)
            .map(|(p, s)| p.mul_bigint(s))
            .sum::<Projective<P>>()
            .into_affine()
    }

    fn scalars(field: Field, values: &[U256]) -> FieldVec {
        FieldVec::from_integers(field, values).unwrap()
    }

    #[test]
    fn bn254_generator_and_precompile_vector() {
        // Ethereum's ecMul (EIP-196) test: 2·G for G = (1, 2).
        let g = Points::validate(Curve::Bn254G1, &[Some((1u32.into(), 2u32.into()))]).unwrap();
        let job = MsmJob::new(g, vec![scalars(Field::Bn254Fr, &[U256::from_u64(2)])]).unwrap();
        let (x, y) = job.run_cpu().coordinates(0).unwrap();
        assert_eq!(
            x.to_string(),
            "1368015179489954701390400359078579693043519447331113978918064868415326638035"
        );
        assert_eq!(
            y.to_string(),
            "9918110051302171585080402603319702774565515993150576347155970296011118125764"
        );
    }

    #[test]
    fn off_curve_non_canonical_and_wrong_subgroup_points_are_named() {
        let q: BigUint = ark_bn254::Fq::MODULUS.into();
        let raw = vec![
            Some((1u32.into(), 2u32.into())),
            Some((1u32.into(), 3u32.into())),
            None,
            Some((q.clone(), 2u32.into())),
            Some((0u32.into(), 0u32.into())),
        ];
        let err = Points::validate(Curve::Bn254G1, &raw).unwrap_err();
        assert_eq!(err.count, 2);
        assert_eq!(err.listed[0].0, 1);
        assert!(err.listed[0].1.contains("not on the curve y² = x³ + 3"));
        assert_eq!(err.listed[1].0, 3);
        assert!(err.listed[1].1.contains("x is not a canonical"));

        // A BLS12-381 curve point outside the r-order subgroup: x = 0 has no square
        // root for b = 4 ... search small x for one on the curve, which (cofactor h ≠ 1)
        // is outside the subgroup with overwhelming probability.
        let outside = (1u64..)
            .find_map(|x| {
                let x = ark_bls12_381::Fq::from(x);
                let rhs = x * x * x + ark_bls12_381::Fq::from(4u64);
                ark_ff::Field::sqrt(&rhs).map(|y| ark_bls12_381::G1Affine::new_unchecked(x, y))
            })
            .unwrap();
        assert!(!outside.is_in_correct_subgroup_assuming_on_curve());
        let err = Points::validate(Curve::Bls12_381G1, &[coordinates(&outside)]).unwrap_err();
        assert!(err.listed[0].1.contains("prime-order subgroup"), "{err:?}");
    }

    #[test]
    fn le_bytes_round_trip_with_identity() {
        for curve in Curve::ALL {
            let sample = random_points(curve, 5, 1);
            let mut raw: Vec<RawPoint> = (0..5).map(|i| sample.coordinates(i)).collect();
            raw[2] = None;
            let points = Points::validate(curve, &raw).unwrap();
            let bytes = points.to_le_bytes();
            assert_eq!(bytes.len(), 5 * 2 * curve.coordinate_bytes());
            assert!(
                bytes[4 * curve.coordinate_bytes()..6 * curve.coordinate_bytes()]
                    .iter()
                    .all(|&b| b == 0)
            );
            assert_eq!(Points::from_le_bytes(curve, &bytes).unwrap(), points);
            assert!(Points::from_le_bytes(curve, &bytes[1..]).is_err());
        }
    }

    /// The hard cases of a bucket method against naive scalar multiplication.
    #[test]
    fn msm_matches_naive_on_the_hard_cases() {
        let g = ark_bn254::G1Affine::generator();
        let p = (g * ark_bn254::Fr::from(12345u64)).into_affine();
        let minus_one = {
            let mut r = crate::ops::zk::field::BN254_R;
            r.0[0] -= 1;
            r.0
        };
        let cases: Vec<(Vec<ark_bn254::G1Affine>, Vec<[u64; 4]>)> = vec![
            // P and -P together, the identity, duplicates (the doubling path).
            (
                vec![p, -p, ark_bn254::G1Affine::identity(), p, p],
                vec![
                    [7, 0, 0, 0],
                    [7, 0, 0, 0],
                    [5, 0, 0, 0],
                    [3, 0, 0, 0],
                    [3, 0, 0, 0],
                ],
            ),
            // Zero scalars and r - 1.
            (vec![p, g, p], vec![[0; 4], minus_one, [0; 4]]),
            // All scalars in one bucket.
            (vec![g; 40], vec![[9, 0, 0, 0]; 40]),
        ];
        for (points, s) in cases {
            assert_eq!(msm_cpu(&points, &s), naive(&points, &s));
        }
    }

    #[test]
    fn batch_of_random_vectors_matches_naive_for_odd_sizes() {
        for n in [1usize, 3, 31, 33, 100] {
            let Points::Bls12_381G1(points) = random_points(Curve::Bls12_381G1, n, n as u64) else {
                unreachable!()
            };
            let batch: Vec<FieldVec> = (0..3)
                .map(|k| {
                    scalars(
                        Field::Bls12_381Fr,
                        &random_elements(Field::Bls12_381Fr, n, k),
                    )
                })
                .collect();
            let job = MsmJob::new(Points::Bls12_381G1(points.clone()), batch.clone()).unwrap();
            let Points::Bls12_381G1(results) = job.run_cpu() else {
                panic!("curve changed")
            };
            for (r, s) in results.iter().zip(&batch) {
                let FieldVec::Bls12_381Fr(limbs) = s else {
                    unreachable!()
                };
                assert_eq!(*r, naive(&points, limbs));
            }
        }
    }

    #[test]
    fn shapes_are_checked() {
        let g = Points::Bn254G1(vec![ark_bn254::G1Affine::generator(); 2]);
        let one = scalars(Field::Bn254Fr, &[U256::from_u64(1)]);
        assert!(matches!(
            MsmJob::new(g.clone(), vec![one]),
            Err(MsmShape::Lengths { batch: 0, .. })
        ));
        let two_bls = scalars(Field::Bls12_381Fr, &[U256::from_u64(1); 2]);
        assert!(matches!(
            MsmJob::new(g.clone(), vec![two_bls]),
            Err(MsmShape::WrongField { .. })
        ));
        assert_eq!(MsmJob::new(g, vec![]).unwrap_err(), MsmShape::NoScalars);
    }
}
