//! The mpc ops under `gpu-ops check`: each op at the level's sizes, with fresh random
//! inputs and edge values, held to its CPU twin; what the report says of each case.
//!
//! Standard: Shamir split and combine of 2^20 secrets in each of the four fields,
//! threshold 3 of 5 holders (the combine checks the two shares beyond the threshold);
//! secure aggregation's unmasking of 2^22 + 5 words by 100 masks (two launches of at
//! most 64 masks, the last ChaCha20 block partial).
//! Quick (the emulated device, 8 192 threads a launch): 8 492 secrets, past one grid
//! stride, at threshold 3 of 5 and at 33 of 40 (past a warp of coefficients), two fields
//! per op; unmasking of 131 125 words (8 196 blocks of 16, past one grid stride, the last
//! partial) by 70 masks (two launches).
//!
//! Edges: the secrets, the top coefficients and the shares start with each field's edge
//! values (0, 1, 2, p − 1, p − 2, (p − 1)/2, 2^64 − 1 where canonical); the holders'
//! points are the field's nonzero edges (1, 2, p − 2, p − 1, …) before small integers;
//! the masked sum holds 0 and 2^32 − 1, the masks the all-zero and all-ones keys.
//!
//! CPU twins at the standard level, on the GPU host's 16 cores, scaled linearly from this
//! 2-core machine (test profile measured here at 2^18 secrets and 2^20 words × 25 masks
//! under a load of about 5; release figures from docs/PERFORMANCE.md):
//! - Split of 2^20 secrets at 5 points: 0.12 s for bn254_fr and bls12_381_fr (245 ms at
//!   2^18 on 2 cores here; 263–327 ms at 2^20 on 2 cores in release, so 35–40 ms on 16),
//!   about 20 ms for goldilocks and babybear.
//! - Combine of 3 shares predicting 2: 0.1 s for the 256-bit fields (200 ms at 2^18 here;
//!   78–98 ms at 2^20 in release on 2 cores), 10 ms for the one-word ones.
//! - The unmask: 100 masks × 16 MiB of ChaCha20 key stream, 0.5 s (0.25 s for 2^20 × 25
//!   here), about 80 ms in release (2 GB/s a core for the stream).
//!
//! Under a second in all; building the inputs (ChaCha20-drawn rows) about 0.2 s.

use super::secagg::{MaskTerm, UnmaskJob};
use super::self_test::points;
use super::shamir::{keyed_elements, CombineJob, ShareJob};
use crate::backend::measure::{case_seed, size_label, CaseInfo, CheckLevel};
use crate::backend::verify::{JobCheck, SelfTest};
use crate::ops::dp::NoiseKey;
use crate::ops::zk::samples::edge_values;
use crate::ops::zk::{Field, FieldVec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::sync::Arc;

/// `m` elements of `field`: its edge values (reversed when `reversed`), then uniform
/// ones drawn from `key` under `domain`.
fn row(field: Field, m: usize, key: &NoiseKey, domain: u32, reversed: bool) -> FieldVec {
    let mut edges = edge_values(field);
    if reversed {
        edges.reverse();
    }
    edges.truncate(m);
    let head = FieldVec::from_integers(field, &edges).expect("edge values are canonical");
    let rest = keyed_elements(field, m - edges.len(), key, domain);
    FieldVec::concat(&head, &[rest])
}

/// One Shamir case: a field, the secrets, the threshold and the holders.
#[derive(Clone, Copy)]
struct Sharing {
    field: Field,
    secrets: usize,
    threshold: usize,
    holders: usize,
}

impl Sharing {
    fn label(&self) -> String {
        format!(
            "{}: {} secrets, threshold {} of {} holders",
            self.field.name(),
            size_label(self.secrets),
            self.threshold,
            self.holders
        )
    }

    fn key(&self, seed: u64, what: &[u8]) -> NoiseKey {
        let mut label = b"gpu-ops/check/".to_vec();
        label.extend_from_slice(what);
        label.extend_from_slice(self.field.name().as_bytes());
        NoiseKey::derive(&label, seed)
    }
}

/// The sharings of the level for `op` ("split" or "combine"): every field at the standard
/// level; two fields (one at a threshold past a warp) at the quick one.
fn sharings(level: CheckLevel, op: &str) -> Vec<Sharing> {
    let at = |field, threshold, holders, secrets| Sharing {
        field,
        secrets,
        threshold,
        holders,
    };
    match level {
        CheckLevel::Standard => Field::ALL.iter().map(|&f| at(f, 3, 5, 1 << 20)).collect(),
        CheckLevel::Quick => {
            let m = 8_192 + 300;
            let (a, b) = if op == "split" {
                (Field::Bn254Fr, Field::BabyBear)
            } else {
                (Field::Bls12_381Fr, Field::Goldilocks)
            };
            vec![at(a, 3, 5, m), at(b, 33, 40, m)]
        }
    }
}

/// Split cases: the dealer's coefficient rows (row 0 the secrets, each row starting with
/// edge values, the top one reversed, so Horner starts and ends on them) at the holders'
/// points.
fn split_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, ShareJob)> {
    sharings(level, "split")
        .into_iter()
        .map(|s| {
            let key = s.key(seed, b"shamir_split/");
            let rows: Vec<FieldVec> = (0..s.threshold)
                .map(|r| row(s.field, s.secrets, &key, 100 + r as u32, r % 2 == 1))
                .collect();
            let coeffs = FieldVec::concat(&rows[0], &rows[1..]);
            let xs = FieldVec::from_integers(s.field, &points(s.field, s.holders))
                .expect("canonical points");
            // The coefficients read once, every holder's share written once.
            let bytes = coeffs.byte_len() + s.holders * s.secrets * s.field.byte_width();
            let job = ShareJob::new(Arc::new(coeffs), s.secrets, xs);
            (CaseInfo::labelled(s.label()).with_bytes(bytes as f64), job)
        })
        .collect()
}

/// Combine cases: every holder's share vector (edge values first, alternately reversed),
/// the first `threshold` combined and the rest predicted for the check.
fn combine_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, CombineJob)> {
    sharings(level, "combine")
        .into_iter()
        .map(|s| {
            let key = s.key(seed, b"shamir_combine/");
            let shares: Vec<FieldVec> = (0..s.holders)
                .map(|i| row(s.field, s.secrets, &key, 200 + i as u32, i % 2 == 1))
                .collect();
            let xs = points(s.field, s.holders);
            // The used shares read once; the secrets and a prediction of each further
            // share written once.
            let rows = s.threshold + 1 + (s.holders - s.threshold);
            let bytes = rows * s.secrets * s.field.byte_width();
            let job = CombineJob::new(s.threshold, &xs, shares).expect("distinct nonzero points");
            let label = format!("{}, {} checked", s.label(), s.holders - s.threshold);
            (CaseInfo::labelled(label).with_bytes(bytes as f64), job)
        })
        .collect()
}

/// The unmasking of the level: a masked sum (uniform words, its first and last ones
/// 0 and 2^32 − 1) and the masks to remove (random keys and signs; the first two the
/// all-ones and all-zero keys).
fn unmask_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, UnmaskJob)> {
    let (len, masks): (usize, usize) = level.pick((8_196 * 16 - 11, 70), ((1 << 22) + 5, 100));
    const PIECE: usize = 1 << 16;
    let mut sum = vec![0u32; len];
    sum.par_chunks_mut(PIECE)
        .enumerate()
        .for_each(|(p, piece)| {
            let mut rng =
                SmallRng::seed_from_u64(seed ^ (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            piece.iter_mut().for_each(|x| *x = rng.random());
        });
    sum[..2].copy_from_slice(&[0, u32::MAX]);
    sum[len - 2..].copy_from_slice(&[u32::MAX, 0]);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x05EC_4A66);
    let terms: Vec<MaskTerm> = (0..masks)
        .map(|t| MaskTerm {
            key: match t {
                0 => [0xff; 32],
                1 => [0; 32],
                _ => rng.random(),
            },
            subtract: t == 0 || (t > 1 && rng.random_bool(0.5)),
        })
        .collect();
    let label = format!(
        "{} words, {masks} masks ({} launches)",
        size_label(len),
        masks.div_ceil(64)
    );
    // The sum read once and the result written once, and the keys.
    let bytes = 8 * len + 33 * masks;
    let info = CaseInfo::labelled(label).with_bytes(bytes as f64);
    vec![(info, UnmaskJob::new(Arc::new(sum), terms))]
}

pub(crate) fn check_cases(level: CheckLevel) -> Vec<Box<dyn SelfTest>> {
    let seed = case_seed();
    vec![
        JobCheck::described(split_cases(level, seed)),
        JobCheck::described(combine_cases(level, seed ^ 1)),
        JobCheck::described(unmask_cases(level, seed ^ 2)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Job;
    use crate::ops::zk::U256;
    use num_bigint::BigUint;

    const OPS: [&str; 3] = ["shamir_split", "shamir_combine", "secagg_unmask"];

    fn assert_ops<J: Job>(cases: &[(CaseInfo, J)], op: &str) {
        assert!(!cases.is_empty(), "{op}: no case");
        for (info, job) in cases {
            assert_eq!(job.name(), op, "{}", info.label);
            assert!(info.bytes.is_some_and(|b| b > 0.0), "{}", info.label);
        }
    }

    fn big(x: U256) -> BigUint {
        x.0.iter()
            .rev()
            .fold(BigUint::ZERO, |acc, &limb| (acc << 64u32) + limb)
    }

    /// Elements checked of each vector: both ends (the edge values) and a stride through
    /// the middle.
    fn sample(len: usize) -> Vec<usize> {
        (0..16)
            .chain((16..len - 16).step_by(97))
            .chain(len - 16..len)
            .collect()
    }

    /// Σ y_i·Π_{j≠i} (z − x_j)/(x_i − x_j) mod p: the polynomial through (x_i, y_i) at z.
    fn lagrange_at(z: &BigUint, xs: &[BigUint], ys: &[BigUint], p: &BigUint) -> BigUint {
        let inverse = |a: &BigUint| a.modpow(&(p - 2u32), p);
        let mut total = BigUint::ZERO;
        for (i, (xi, yi)) in xs.iter().zip(ys).enumerate() {
            let (mut num, mut den) = (BigUint::from(1u32), BigUint::from(1u32));
            for (j, xj) in xs.iter().enumerate() {
                if j != i {
                    num = num * ((z + p - xj) % p) % p;
                    den = den * ((xi + p - xj) % p) % p;
                }
            }
            total = (total + yi * num % p * inverse(&den)) % p;
        }
        total
    }

    /// `rows` with element `at` of row `row` changed.
    fn wrong_in(rows: &[FieldVec], row: usize, at: usize) -> Vec<FieldVec> {
        let mut rows = rows.to_vec();
        let v = &rows[row];
        let mut elements: Vec<U256> = (0..v.len()).map(|i| v.get(i)).collect();
        elements[at] = if elements[at] == U256::ZERO {
            U256::from_u64(1)
        } else {
            U256::ZERO
        };
        rows[row] = FieldVec::from_integers(v.field(), &elements).unwrap();
        rows
    }

    /// Each quick case's CPU answer is held to an oracle the code does not share (the
    /// polynomials evaluated and interpolated on big integers; the masks expanded by the
    /// DP module's own ChaCha20, not the `chacha20` crate the twin uses), and the job's
    /// `agrees` refuses that answer with one element made wrong.
    #[test]
    fn quick_cases_agree_with_an_independent_oracle_and_refuse_a_wrong_answer() {
        let level = CheckLevel::Quick;
        let ops: Vec<&str> = check_cases(level).iter().map(|t| t.op()).collect();
        assert_eq!(ops, OPS);
        let split = split_cases(level, 3);
        assert_ops(&split, OPS[0]);
        for (info, job) in &split {
            let p = big(job.points().field().modulus());
            let (m, t) = (job.secrets(), job.threshold());
            let shares = job.run_cpu();
            for (h, share) in shares.iter().enumerate() {
                let x = big(job.points().get(h));
                for s in sample(m) {
                    // Horner from the top coefficient (row r of the dealer's rows).
                    let want = (0..t).rev().fold(BigUint::ZERO, |acc, r| {
                        (acc * &x + big(job.coefficients().get(r * m + s))) % &p
                    });
                    assert_eq!(
                        big(share.get(s)),
                        want,
                        "{}: holder {h}, secret {s}",
                        info.label
                    );
                }
            }
            let wrong = wrong_in(&shares, 1, m / 2);
            assert!(job.agrees(&wrong, &shares).is_err(), "{}", info.label);
        }
        let combine = combine_cases(level, 4);
        assert_ops(&combine, OPS[1]);
        for (info, job) in &combine {
            let field = job.used()[0].field();
            let p = big(field.modulus());
            let threshold = job.used().len();
            let xs: Vec<BigUint> = points(field, threshold + job.extra_shares())
                .into_iter()
                .map(big)
                .collect();
            let rows = job.run_cpu();
            assert_eq!(rows.len(), 1 + job.extra_shares(), "{}", info.label);
            for s in sample(job.secrets()) {
                let ys: Vec<BigUint> = job.used().iter().map(|v| big(v.get(s))).collect();
                for (r, row) in rows.iter().enumerate() {
                    // Row 0 at 0 (the secrets), then at each further holder's point.
                    let z = match r {
                        0 => BigUint::ZERO,
                        _ => xs[threshold + r - 1].clone(),
                    };
                    let want = lagrange_at(&z, &xs[..threshold], &ys, &p);
                    assert_eq!(big(row.get(s)), want, "{}: row {r}, secret {s}", info.label);
                }
            }
            let wrong = wrong_in(&rows, 0, 7);
            assert!(job.agrees(&wrong, &rows).is_err(), "{}", info.label);
        }
        let unmask = unmask_cases(level, 5);
        assert_ops(&unmask, OPS[2]);
        for (info, job) in &unmask {
            let out = job.run_cpu();
            let mut want = job.sum().to_vec();
            for term in job.terms() {
                let key = term.key_words();
                for (b, words) in want.chunks_mut(16).enumerate() {
                    let stream = crate::ops::dp::chacha::block(&key, b as u32, [0; 3]);
                    for (w, k) in words.iter_mut().zip(stream) {
                        *w = if term.subtract {
                            w.wrapping_sub(k)
                        } else {
                            w.wrapping_add(k)
                        };
                    }
                }
            }
            assert!(out == want, "{}: the unmasked sum differs", info.label);
            let mut wrong = want.clone();
            wrong[want.len() - 1] ^= 1;
            assert!(job.agrees(&wrong, &out).is_err(), "{}", info.label);
        }
    }

    /// Past one grid stride of the emulated device's 8 192 threads, past a warp of
    /// coefficients, past one launch of masks, and a partial last ChaCha20 block.
    #[test]
    fn quick_shapes_cross_the_kernels_edges() {
        let split = split_cases(CheckLevel::Quick, 3);
        assert!(split.iter().all(|(_, j)| j.secrets() > 8_192));
        assert!(split.iter().any(|(_, j)| j.threshold() > 32));
        let combine = combine_cases(CheckLevel::Quick, 4);
        assert!(combine.iter().any(|(_, j)| j.used().len() > 32));
        let (_, unmask) = &unmask_cases(CheckLevel::Quick, 5)[0];
        assert!(unmask.sum().len().div_ceil(16) > 8_192 && unmask.sum().len() % 16 != 0);
        assert!(unmask.terms().len() > 64);
        // The points and each vector start on the edges.
        let (_, job) = &split[0];
        assert_eq!(job.points().get(0), U256::from_u64(1));
        assert_eq!(job.coefficients().get(0), U256::ZERO);
    }

    /// Builds every standard case (about 1 GiB of inputs; no CPU twin runs) and checks
    /// the production sizes.
    #[test]
    fn standard_cases_build_at_production_sizes() {
        let level = CheckLevel::Standard;
        let split = split_cases(level, 6);
        assert_ops(&split, OPS[0]);
        let fields: Vec<Field> = split.iter().map(|(_, j)| j.points().field()).collect();
        assert_eq!(fields, Field::ALL);
        for (info, job) in &split {
            assert_eq!(job.secrets(), 1 << 20, "{}", info.label);
            assert_eq!((job.threshold(), job.points().len()), (3, 5));
        }
        assert_eq!(
            split[0].0.label,
            "bn254_fr: 2^20 secrets, threshold 3 of 5 holders"
        );
        drop(split);
        let combine = combine_cases(level, 7);
        assert_ops(&combine, OPS[1]);
        assert!(combine
            .iter()
            .all(|(_, j)| j.secrets() == 1 << 20 && j.extra_shares() == 2));
        drop(combine);
        let unmask = unmask_cases(level, 8);
        assert_ops(&unmask, OPS[2]);
        assert_eq!(unmask[0].1.sum().len(), (1 << 22) + 5);
        assert_eq!(unmask[0].1.terms().len(), 100);
    }
}
