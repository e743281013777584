//! Feldman's verifiable secret sharing (FOCS 1987) over the sharing of `shamir`: the
//! dealer publishes C_kj = a_kj·G for every coefficient of every secret's polynomial
//! (G the curve's generator, scalars in the curve's group order, so bn254_g1 commits
//! bn254_fr shares and bls12_381_g1 bls12_381_fr shares). Holder i's value y_j is right
//! when y_j·G = Σ_k x_i^k·C_kj.
//!
//! A share of m values is checked at once with random weights ρ_j (a fresh OS key):
//! Σ_j ρ_j·y_j·G − Σ_kj ρ_j·x_i^k·C_kj is the identity. One MSM over the t·m
//! commitments and G. A share wrong in any value passes with probability 1/r (r ≈ 2^254).

use super::shamir::{keyed_elements, DOMAIN_CHECK_WEIGHTS, MAX_SHARES};
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::ops::dp::NoiseKey;
use crate::ops::invalid::Invalid;
use crate::ops::zk::msm::{Curve, MsmJob, Points};
use crate::ops::zk::{Field, FieldVec, U256};
use ark_ec::scalar_mul::ScalarMul;
use ark_ec::short_weierstrass::{Affine, Projective, SWCurveConfig};
use ark_ec::{AffineRepr, PrimeGroup};
use ark_ff::{BigInt, Field as _, PrimeField};
use std::sync::Arc;

/// Most commitments (secrets × threshold) one split computes or one check takes: each is
/// a fixed-base multiplication on the CPU, about 11–12 µs on two threads
/// (docs/PERFORMANCE.md), so 65,536 take under a second.
pub const MAX_COMMITMENTS: usize = 1 << 16;

/// The curve whose group order is `field`'s modulus.
pub fn curve_of(field: Field) -> Option<Curve> {
    Curve::ALL.into_iter().find(|c| c.scalar_field() == field)
}

/// The dealer's commitments to its coefficients: point k·m + j is coefficient k of
/// secret j times G, in the coefficients' own order.
#[derive(Clone, Debug)]
pub struct CommitJob {
    coeffs: Arc<FieldVec>,
}

impl CommitJob {
    /// Refuses a field without a curve (goldilocks, babybear) and more than
    /// `MAX_COMMITMENTS` coefficients, at `commitments`.
    pub fn new(coeffs: Arc<FieldVec>) -> Result<Self, Invalid> {
        if curve_of(coeffs.field()).is_none() {
            return Err(Invalid::field(
                "commitments",
                format!(
                    "Feldman commitments need a curve whose group order is the field: bn254_fr (bn254_g1) \
                     or bls12_381_fr (bls12_381_g1), not {}",
                    coeffs.field().name()
                ),
            ));
        }
        if coeffs.len() > MAX_COMMITMENTS {
            return Err(Invalid::field(
                "commitments",
                format!(
                    "secrets × threshold is {} commitments; at most {MAX_COMMITMENTS} per split",
                    coeffs.len()
                ),
            ));
        }
        Ok(Self { coeffs })
    }
}

fn commit<P: SWCurveConfig>(limbs: &[[u64; 4]]) -> Vec<Affine<P>>
where
    P::ScalarField: PrimeField<BigInt = BigInt<4>>,
{
    let scalars: Vec<P::ScalarField> = limbs
        .iter()
        .map(|l| P::ScalarField::from_bigint(BigInt(*l)).expect("canonical coefficients"))
        .collect();
    Projective::<P>::generator().batch_mul(&scalars)
}

impl Job for CommitJob {
    type Output = Points;

    fn name(&self) -> &'static str {
        "shamir_commit"
    }

    fn size(&self) -> usize {
        self.coeffs.len()
    }

    fn input_bytes(&self) -> usize {
        self.coeffs.byte_len()
    }

    fn gpu_threshold(&self) -> usize {
        usize::MAX
    }

    fn device_refusal(&self) -> Option<String> {
        Some("Feldman commitments run on the CPU (arkworks' fixed-base multiplication)".into())
    }

    fn run_cpu(&self) -> Points {
        match &*self.coeffs {
            FieldVec::Bn254Fr(c) => Points::Bn254G1(commit::<ark_bn254::g1::Config>(c)),
            FieldVec::Bls12_381Fr(c) => Points::Bls12_381G1(commit::<ark_bls12_381::g1::Config>(c)),
            _ => unreachable!("CommitJob::new refuses fields without a curve"),
        }
    }

    fn run_device(&self, _: &DeviceLease<'_>) -> Result<Points, DeviceError> {
        Err(DeviceError::unsupported(
            "Feldman commitments run on the CPU",
        ))
    }

    fn agrees(&self, device: &Points, cpu: &Points) -> Result<(), String> {
        (device == cpu)
            .then_some(())
            .ok_or_else(|| "commitments differ".into())
    }
}

/// One holder's share checked against the dealer's commitments: an MSM whose sum is the
/// identity exactly when the share is consistent (up to the 1/r chance above).
#[derive(Clone, Debug)]
pub struct ShareCheckJob(MsmJob);

impl ShareCheckJob {
    /// `commitments` as `CommitJob` makes them (t rows of `values.len()` points); `x`
    /// the share's point, `values` its values; `key` fresh from the OS, drawn after the
    /// share is fixed, for the random weights. Mismatched shapes are refused at
    /// `commitments`, more than `MAX_COMMITMENTS` too.
    pub fn new(
        commitments: Points,
        x: U256,
        values: &FieldVec,
        key: &NoiseKey,
    ) -> Result<Self, Invalid> {
        let (m, field) = (values.len(), values.field());
        if commitments.curve().scalar_field() != field {
            return Err(Invalid::field(
                "commitments",
                format!(
                    "{} commitments are for {} shares, not {}",
                    commitments.curve().name(),
                    commitments.curve().scalar_field().name(),
                    field.name()
                ),
            ));
        }
        let t = commitments.len() / m.max(1);
        if m == 0
            || t == 0
            || commitments.len() != t * m
            || t > MAX_SHARES
            || t * m > MAX_COMMITMENTS
        {
            return Err(Invalid::field(
                "commitments",
                format!(
                    "{} points for {m} values: give threshold × {m} (one per coefficient of each secret, \
                     coefficient-major), threshold at most {MAX_SHARES}, at most {MAX_COMMITMENTS} points",
                    commitments.len()
                ),
            ));
        }
        let rho = keyed_elements(field, m, key, DOMAIN_CHECK_WEIGHTS);
        let job = match (commitments, values, rho) {
            (Points::Bn254G1(c), FieldVec::Bn254Fr(y), FieldVec::Bn254Fr(r)) => {
                let (points, scalars) = check_terms::<ark_bn254::g1::Config>(c, x, y, &r);
                MsmJob::new(Points::Bn254G1(points), vec![FieldVec::Bn254Fr(scalars)])
            }
            (Points::Bls12_381G1(c), FieldVec::Bls12_381Fr(y), FieldVec::Bls12_381Fr(r)) => {
                let (points, scalars) = check_terms::<ark_bls12_381::g1::Config>(c, x, y, &r);
                MsmJob::new(
                    Points::Bls12_381G1(points),
                    vec![FieldVec::Bls12_381Fr(scalars)],
                )
            }
            _ => unreachable!("the curve's scalar field was checked"),
        };
        Ok(Self(job.expect("one scalar per point")))
    }

    /// Whether the MSM's sum says the share is consistent.
    pub fn holds(sum: &Points) -> bool {
        sum.len() == 1 && sum.coordinates(0).is_none()
    }
}

/// Points C_kj then G; scalars ρ_j·x^k then −Σ_j ρ_j·y_j.
fn check_terms<P: SWCurveConfig>(
    mut commitments: Vec<Affine<P>>,
    x: U256,
    values: &[[u64; 4]],
    rho: &[[u64; 4]],
) -> (Vec<Affine<P>>, Vec<[u64; 4]>)
where
    P::ScalarField: PrimeField<BigInt = BigInt<4>>,
{
    let f = |l: &[u64; 4]| P::ScalarField::from_bigint(BigInt(*l)).expect("canonical");
    let m = values.len();
    let t = commitments.len() / m;
    let x = P::ScalarField::from_le_bytes_mod_order(&x.to_le_bytes());
    let rho: Vec<P::ScalarField> = rho.iter().map(f).collect();
    let mut scalars = Vec::with_capacity(t * m + 1);
    let mut power = P::ScalarField::ONE;
    for _ in 0..t {
        scalars.extend(rho.iter().map(|r| (*r * power).into_bigint().0));
        power *= x;
    }
    let lhs: P::ScalarField = values.iter().zip(&rho).map(|(y, r)| f(y) * r).sum();
    scalars.push((-lhs).into_bigint().0);
    commitments.push(Affine::<P>::generator());
    (commitments, scalars)
}

impl Job for ShareCheckJob {
    type Output = Points;

    fn name(&self) -> &'static str {
        "shamir_verify"
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn input_bytes(&self) -> usize {
        self.0.input_bytes()
    }

    fn gpu_threshold(&self) -> usize {
        self.0.gpu_threshold()
    }

    fn device_refusal(&self) -> Option<String> {
        self.0.device_refusal()
    }

    fn run_cpu(&self) -> Points {
        self.0.run_cpu()
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Points, DeviceError> {
        self.0.run_device(dev)
    }

    fn agrees(&self, device: &Points, cpu: &Points) -> Result<(), String> {
        self.0.agrees(device, cpu)
    }
}
