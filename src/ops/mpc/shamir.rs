//! Shamir secret sharing of field vectors (Shamir 1979): each secret s_j is the constant
//! term of a random polynomial of degree t − 1, and holder i gets every polynomial at its
//! point x_i. Any t shares give the secrets back by Lagrange interpolation at 0; fewer
//! say nothing about them (every value of the secret is equally likely).
//!
//! Both directions are vector kernels over the secrets: `ShareJob` (Horner at each
//! point) and `CombineJob` (weighted sums of whole share vectors). Their CPU twins are the
//! oracle, bit for bit. The coefficients come from ChaCha20 under a fresh OS key, drawn
//! before the job, so both backends evaluate the same polynomials.

use super::scalar::{evaluate, weighted_sums, BabyBearConfig, GoldilocksConfig};
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::ops::dp::NoiseKey;
use crate::ops::invalid::{FieldPath, Invalid};
use crate::ops::zk::{Field, FieldVec, U256};
use chacha20::cipher::{KeyIvInit, StreamCipher};
use chacha20::ChaCha20;
use rayon::prelude::*;
use std::sync::Arc;

/// Most shares one split makes or one combine takes.
pub const MAX_SHARES: usize = 1024;
/// Key-stream domains: the dealer's coefficients, and the verifier's random weights.
pub const DOMAIN_COEFFICIENTS: u32 = 1;
pub const DOMAIN_CHECK_WEIGHTS: u32 = 2;
/// Elements drawn from one ChaCha20 nonce: the unit of parallel generation.
const KEYED_CHUNK: usize = 4096;

/// Why a set of shares cannot be combined.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ShamirError {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error("{given} shares were given and the threshold is {threshold}: at least {threshold} are needed to recover the secrets")]
    TooFewShares { given: usize, threshold: usize },
    /// Share `share` is not on the polynomials through the first `threshold` shares.
    #[error("share {share} disagrees at element {element} with the polynomial through the first {threshold} shares: at least one of these {count} shares is wrong", count = threshold + 1)]
    Inconsistent {
        share: usize,
        element: usize,
        threshold: usize,
    },
}

/// Checks holder points: nonzero (the secret sits at 0) and distinct. `path` names the
/// list; `at(i)` the place of point i within it.
pub fn check_points(xs: &[U256], at: impl Fn(usize) -> FieldPath) -> Result<(), Invalid> {
    let mut seen = std::collections::HashMap::with_capacity(xs.len());
    for (i, x) in xs.iter().enumerate() {
        if x.is_zero() {
            return Err(Invalid::new(
                at(i),
                "a share's x must be nonzero: the secret is the polynomial's value at 0",
            ));
        }
        if let Some(first) = seen.insert(*x, i) {
            return Err(Invalid::new(
                at(i),
                format!("x {x} is also share {first}'s: points must be distinct"),
            ));
        }
    }
    Ok(())
}

/// The threshold against the number of shares: 2 ≤ t ≤ n ≤ `MAX_SHARES`.
pub fn check_threshold(threshold: usize, shares: usize) -> Result<(), Invalid> {
    if !(2..=MAX_SHARES).contains(&shares) {
        return Err(Invalid::field(
            "share_count",
            format!("must be between 2 and {MAX_SHARES}"),
        ));
    }
    if threshold < 2 || threshold > shares {
        return Err(Invalid::field(
            "threshold",
            format!(
                "must be between 2 and the number of shares ({shares}): one share alone would be the secret"
            ),
        ));
    }
    Ok(())
}

/// `count` uniform elements of `field` from ChaCha20 under `key`: element stream
/// chunk c reads nonce (domain, c), values are drawn by rejection (masked to the
/// modulus's bit length, kept below it), so every element is uniform and the draw is
/// reproducible from the key.
pub fn keyed_elements(field: Field, count: usize, key: &NoiseKey, domain: u32) -> FieldVec {
    let p = field.modulus();
    let bits = (0..4)
        .rev()
        .find(|&l| p.0[l] != 0)
        .map_or(0, |l| 64 * l as u32 + 64 - p.0[l].leading_zeros());
    let mask: [u64; 4] = std::array::from_fn(|l| {
        let low = 64 * l as u32;
        if bits >= low + 64 {
            u64::MAX
        } else if bits <= low {
            0
        } else {
            (1u64 << (bits - low)) - 1
        }
    });
    let accept = move |b: &[u8]| {
        let mut v = U256::from_le_slice(b);
        for (limb, m) in v.0.iter_mut().zip(mask) {
            *limb &= m;
        }
        (v < p).then_some(v)
    };
    let width = field.byte_width();
    match field {
        Field::Bn254Fr => {
            FieldVec::Bn254Fr(keyed(count, key, domain, width, |b| accept(b).map(|v| v.0)))
        }
        Field::Bls12_381Fr => {
            FieldVec::Bls12_381Fr(keyed(count, key, domain, width, |b| accept(b).map(|v| v.0)))
        }
        Field::Goldilocks => FieldVec::Goldilocks(keyed(count, key, domain, width, |b| {
            accept(b).map(|v| v.0[0])
        })),
        Field::BabyBear => FieldVec::BabyBear(keyed(count, key, domain, width, |b| {
            accept(b).map(|v| v.0[0] as u32)
        })),
    }
}

fn keyed<T: Send>(
    count: usize,
    key: &NoiseKey,
    domain: u32,
    width: usize,
    pick: impl Fn(&[u8]) -> Option<T> + Sync,
) -> Vec<T> {
    (0..count.div_ceil(KEYED_CHUNK))
        .into_par_iter()
        .flat_map_iter(|c| {
            let len = KEYED_CHUNK.min(count - c * KEYED_CHUNK);
            let mut nonce = [0u8; 12];
            nonce[..4].copy_from_slice(&domain.to_le_bytes());
            nonce[4..].copy_from_slice(&(c as u64).to_le_bytes());
            let mut cipher = ChaCha20::new(&key.0.into(), &nonce.into());
            let mut block = vec![0u8; 64 * width];
            let mut out = Vec::with_capacity(len);
            while out.len() < len {
                block.fill(0);
                cipher.apply_keystream(&mut block);
                out.extend(
                    block
                        .chunks_exact(width)
                        .filter_map(&pick)
                        .take(len - out.len()),
                );
            }
            out
        })
        .collect()
}

/// The dealer's polynomials: `threshold` coefficient rows of `secrets.len()` elements,
/// row 0 the secrets themselves and rows 1.. uniform from `key`.
pub fn dealer_coefficients(secrets: &FieldVec, threshold: usize, key: &NoiseKey) -> FieldVec {
    let random = keyed_elements(
        secrets.field(),
        secrets.len() * (threshold - 1),
        key,
        DOMAIN_COEFFICIENTS,
    );
    FieldVec::concat(secrets, &[random])
}

/// `evaluate` on a field vector: `coeffs` holds t rows of `m`; one row per point.
pub(crate) fn evaluate_vec(coeffs: &FieldVec, xs: &FieldVec, m: usize) -> Vec<FieldVec> {
    macro_rules! run {
        ($variant:ident, $config:ty, $n:literal, $c:expr, $x:expr) => {
            evaluate::<$config, $n, _>($c, $x, m)
                .into_iter()
                .map(FieldVec::$variant)
                .collect()
        };
    }
    match (coeffs, xs) {
        (FieldVec::Bn254Fr(c), FieldVec::Bn254Fr(x)) => {
            run!(Bn254Fr, ark_bn254::FrConfig, 4, c, x)
        }
        (FieldVec::Bls12_381Fr(c), FieldVec::Bls12_381Fr(x)) => {
            run!(Bls12_381Fr, ark_bls12_381::FrConfig, 4, c, x)
        }
        (FieldVec::Goldilocks(c), FieldVec::Goldilocks(x)) => {
            run!(Goldilocks, GoldilocksConfig, 1, c, x)
        }
        (FieldVec::BabyBear(c), FieldVec::BabyBear(x)) => run!(BabyBear, BabyBearConfig, 1, c, x),
        _ => unreachable!("the jobs hold one field"),
    }
}

/// `weighted_sums` on field vectors: k rows of `m`, weight rows of k; one row per
/// weight row.
pub(crate) fn weighted_sums_vec(ys: &[FieldVec], weights: &FieldVec, m: usize) -> Vec<FieldVec> {
    macro_rules! run {
        ($variant:ident, $config:ty, $n:literal, $w:expr) => {{
            let rows: Vec<_> = ys
                .iter()
                .map(|y| match y {
                    FieldVec::$variant(v) => v.as_slice(),
                    _ => unreachable!("the jobs hold one field"),
                })
                .collect();
            weighted_sums::<$config, $n, _>(&rows, $w, m)
                .into_iter()
                .map(FieldVec::$variant)
                .collect()
        }};
    }
    match weights {
        FieldVec::Bn254Fr(w) => run!(Bn254Fr, ark_bn254::FrConfig, 4, w),
        FieldVec::Bls12_381Fr(w) => run!(Bls12_381Fr, ark_bls12_381::FrConfig, 4, w),
        FieldVec::Goldilocks(w) => run!(Goldilocks, GoldilocksConfig, 1, w),
        FieldVec::BabyBear(w) => run!(BabyBear, BabyBearConfig, 1, w),
    }
}

/// Split: every secret's polynomial at every holder's point. Output: one share of `m`
/// values per holder, in the order of `xs`.
#[derive(Clone, Debug)]
pub struct ShareJob {
    coeffs: Arc<FieldVec>,
    xs: FieldVec,
    secrets: usize,
}

impl ShareJob {
    /// `coeffs` from `dealer_coefficients`; `xs` checked by `check_points`.
    pub fn new(coeffs: Arc<FieldVec>, secrets: usize, xs: FieldVec) -> Self {
        assert!(secrets > 0 && coeffs.len() % secrets == 0 && coeffs.field() == xs.field());
        Self {
            coeffs,
            xs,
            secrets,
        }
    }

    pub fn secrets(&self) -> usize {
        self.secrets
    }

    pub fn threshold(&self) -> usize {
        self.coeffs.len() / self.secrets
    }

    pub fn coefficients(&self) -> &FieldVec {
        &self.coeffs
    }

    pub fn points(&self) -> &FieldVec {
        &self.xs
    }
}

impl Job for ShareJob {
    type Output = Vec<FieldVec>;

    fn name(&self) -> &'static str {
        "shamir_split"
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.coeffs.field().name().into()
    }

    fn size(&self) -> usize {
        self.secrets * self.xs.len()
    }

    fn input_bytes(&self) -> usize {
        self.coeffs.byte_len() + self.xs.byte_len()
    }

    fn gpu_threshold(&self) -> usize {
        1 << 16
    }

    fn run_cpu(&self) -> Vec<FieldVec> {
        evaluate_vec(&self.coeffs, &self.xs, self.secrets)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Vec<FieldVec>, DeviceError> {
        super::gpu::launch_share(self, dev)
    }

    fn agrees(&self, device: &Vec<FieldVec>, cpu: &Vec<FieldVec>) -> Result<(), String> {
        crate::backend::verify::exactly(device, cpu)
    }
}

/// Combine: the secrets from the first `threshold` shares (Lagrange at 0), and each
/// further share checked against the polynomials through those (Lagrange at its x).
#[derive(Clone, Debug)]
pub struct CombineJob {
    /// The first `threshold` share vectors.
    used: Vec<FieldVec>,
    /// Lagrange rows over the used points: at 0, then at each extra share's x.
    weights: FieldVec,
    /// The further shares, to compare with the rows after the first.
    extra: Vec<FieldVec>,
    secrets: usize,
}

impl CombineJob {
    /// `shares[i]` is holder i's vector at `xs[i]`. Refuses fewer than `threshold`
    /// shares, zero or repeated points (`ops::Invalid` under `shares`), and vectors of
    /// different lengths.
    pub fn new(threshold: usize, xs: &[U256], shares: Vec<FieldVec>) -> Result<Self, ShamirError> {
        assert_eq!(xs.len(), shares.len(), "one point per share");
        let at = |i: usize| FieldPath::root().field("shares").index(i);
        if !(2..=MAX_SHARES).contains(&threshold) {
            return Err(
                Invalid::field("threshold", format!("must be between 2 and {MAX_SHARES}")).into(),
            );
        }
        if shares.len() > MAX_SHARES {
            return Err(Invalid::field("shares", format!("at most {MAX_SHARES} shares")).into());
        }
        if shares.len() < threshold {
            return Err(ShamirError::TooFewShares {
                given: shares.len(),
                threshold,
            });
        }
        check_points(xs, |i| at(i).field("x"))?;
        let secrets = shares[0].len();
        if secrets == 0 {
            return Err(
                Invalid::new(at(0).field("values"), "a share holds at least one value").into(),
            );
        }
        if let Some(i) = shares.iter().position(|s| s.len() != secrets) {
            return Err(Invalid::new(
                at(i).field("values"),
                format!(
                    "{} values where share 0 has {secrets}: every share holds one value per secret",
                    shares[i].len()
                ),
            )
            .into());
        }
        let field = shares[0].field();
        let mut targets = vec![U256::ZERO];
        targets.extend_from_slice(&xs[threshold..]);
        let weights = super::scalar::lagrange_weights(field, &xs[..threshold], &targets);
        let mut used = shares;
        let extra = used.split_off(threshold);
        Ok(Self {
            used,
            weights,
            extra,
            secrets,
        })
    }

    pub fn secrets(&self) -> usize {
        self.secrets
    }

    pub fn extra_shares(&self) -> usize {
        self.extra.len()
    }

    pub fn used(&self) -> &[FieldVec] {
        &self.used
    }

    pub fn weights(&self) -> &FieldVec {
        &self.weights
    }

    /// The secrets, once every extra share has matched its prediction.
    pub fn finish(&self, mut rows: Vec<FieldVec>) -> Result<FieldVec, ShamirError> {
        for (e, (predicted, given)) in rows[1..].iter().zip(&self.extra).enumerate() {
            if predicted == given {
                continue;
            }
            if let Some(element) = (0..self.secrets).find(|&j| predicted.get(j) != given.get(j)) {
                return Err(ShamirError::Inconsistent {
                    share: self.used.len() + e,
                    element,
                    threshold: self.used.len(),
                });
            }
        }
        Ok(rows.swap_remove(0))
    }
}

impl Job for CombineJob {
    type Output = Vec<FieldVec>;

    fn name(&self) -> &'static str {
        "shamir_combine"
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.weights.field().name().into()
    }

    fn size(&self) -> usize {
        self.secrets * (self.used.len() + self.extra.len())
    }

    fn input_bytes(&self) -> usize {
        self.used
            .iter()
            .chain(&self.extra)
            .map(FieldVec::byte_len)
            .sum()
    }

    fn gpu_threshold(&self) -> usize {
        1 << 16
    }

    fn run_cpu(&self) -> Vec<FieldVec> {
        weighted_sums_vec(&self.used, &self.weights, self.secrets)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Vec<FieldVec>, DeviceError> {
        super::gpu::launch_combine(self, dev)
    }

    fn agrees(&self, device: &Vec<FieldVec>, cpu: &Vec<FieldVec>) -> Result<(), String> {
        crate::backend::verify::exactly(device, cpu)
    }
}

#[cfg(test)]
#[path = "shamir_tests.rs"]
mod tests;
