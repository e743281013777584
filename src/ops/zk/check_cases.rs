//! The zk ops under `gpu-ops check`: field vectors of every field (edge values first, the
//! rest uniform), pow with full-width exponents, inversion, NTTs up to 2^22 with a coset
//! and both orders, and MSMs of 2^20 points with uniform and skewed scalars (most of them
//! small, many repeated: the buckets a real prover's witness fills unevenly), their points
//! sent and resident with precomputed multiples.

use super::msm::{Curve, MsmJob};
use super::ntt::{Direction, NttJob, Order};
use super::samples::{edge_values, random_elements, random_points};
use super::{Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob, FieldVec, U256};
use crate::backend::measure::{case_seed, msm_log2, CaseInfo, CheckLevel};
use crate::backend::verify::{JobCheck, SelfTest};

fn vec(field: Field, xs: &[U256]) -> FieldVec {
    FieldVec::from_integers(field, xs).expect("samples are canonical")
}

/// `n` elements: the field's edge values, then uniform ones from `seed`.
fn elements(field: Field, n: usize, seed: u64) -> Vec<U256> {
    let mut xs = edge_values(field);
    xs.truncate(n);
    xs.extend(random_elements(field, n - xs.len(), seed));
    xs
}

/// "2^22" for a power of two, else the number.
fn size_label(n: usize) -> String {
    if n.is_power_of_two() {
        format!("2^{}", n.trailing_zeros())
    } else {
        n.to_string()
    }
}

fn field_ops(level: CheckLevel, seed: u64) -> Vec<Box<dyn SelfTest>> {
    let n = level.pick(1 << 12, 1 << 22);
    FieldOp::ALL
        .into_iter()
        .map(|op| {
            let cases = Field::ALL
                .iter()
                .map(|&f| {
                    let (a, b) = (elements(f, n, seed ^ 1), elements(f, n, seed ^ 2));
                    let job = FieldBinaryJob::new(op, vec(f, &a), vec(f, &b))
                        .expect("equal lengths of one field");
                    let width = f.byte_width() as f64;
                    let info = CaseInfo::labelled(format!("{} {}", f.name(), size_label(n)))
                        .with_bytes(3.0 * n as f64 * width);
                    (info, job)
                })
                .collect();
            JobCheck::described(cases)
        })
        .collect()
}

fn pow_and_inv(level: CheckLevel, seed: u64) -> Vec<Box<dyn SelfTest>> {
    let n = level.pick(512, 1 << 20);
    let pow = Field::ALL
        .iter()
        .map(|&f| {
            let exps = random_elements(Field::Bn254Fr, n, seed ^ 3);
            let job = FieldPowJob::new(vec(f, &elements(f, n, seed ^ 4)), exps)
                .expect("one exponent per base");
            let width = f.byte_width() as f64;
            let info =
                CaseInfo::labelled(format!("{} {}, 254-bit exponents", f.name(), size_label(n)))
                    .with_bytes(n as f64 * (2.0 * width + 32.0));
            (info, job)
        })
        .collect();
    let inv = Field::ALL
        .iter()
        .map(|&f| {
            let nonzero: Vec<U256> = elements(f, n + 1, seed ^ 5)
                .into_iter()
                .filter(|x| *x != U256::ZERO)
                .take(n)
                .collect();
            let job = FieldInvJob::new(vec(f, &nonzero)).expect("no zeros");
            let bytes = 2.0 * nonzero.len() as f64 * f.byte_width() as f64;
            let info = CaseInfo::labelled(format!("{} {}", f.name(), size_label(n)));
            (info.with_bytes(bytes), job)
        })
        .collect();
    vec![JobCheck::described(pow), JobCheck::described(inv)]
}

fn ntts(level: CheckLevel, seed: u64) -> Vec<Box<dyn SelfTest>> {
    // Quick: 2^12 × 2, through BN254's 1 024-element tile into the stages. Standard: one
    // 2^22 transform per field, and a batch of 64 small ones.
    let (large, batched) = level.pick(((1 << 12, 2), (1 << 8, 4)), ((1 << 22, 1), (1 << 14, 64)));
    [Direction::Forward, Direction::Inverse]
        .into_iter()
        .map(|direction| {
            let cases = Field::ALL
                .iter()
                .flat_map(|&f| {
                    let width = f.byte_width() as f64;
                    let (n, batch) = large;
                    let coset = NttJob::new(
                        direction,
                        vec(f, &elements(f, n * batch, seed ^ 6)),
                        batch,
                        Order::Natural,
                        Order::Natural,
                        Some(U256::from_u64(7)),
                        30,
                    );
                    let (m, rows) = batched;
                    let reversed = NttJob::new(
                        direction,
                        vec(f, &elements(f, m * rows, seed ^ 7)),
                        rows,
                        Order::BitReversed,
                        Order::Natural,
                        None,
                        30,
                    );
                    let label = |n, batch, how: &str| {
                        format!("{} {} × {batch}, {how}", f.name(), size_label(n))
                    };
                    [
                        (
                            CaseInfo::labelled(label(n, batch, "coset, natural order"))
                                .with_bytes(2.0 * (n * batch) as f64 * width),
                            coset,
                        ),
                        (
                            CaseInfo::labelled(label(m, rows, "bit-reversed in"))
                                .with_bytes(2.0 * (m * rows) as f64 * width),
                            reversed,
                        ),
                    ]
                })
                .map(|(info, job)| {
                    (
                        info,
                        job.expect("a power-of-two size within the field's two-adicity"),
                    )
                })
                .collect();
            JobCheck::described(cases)
        })
        .collect()
}

/// Scalars as a prover's witness gives them: 90 % below 2^16, a quarter of those the
/// same few values, the rest uniform; edge values first.
fn skewed_scalars(field: Field, n: usize, seed: u64) -> Vec<U256> {
    let uniform = random_elements(field, n, seed);
    let mut xs = edge_values(field);
    xs.truncate(n);
    xs.extend(
        uniform[xs.len()..]
            .iter()
            .enumerate()
            .map(|(i, u)| match i % 10 {
                9 => *u,
                0 | 4 => U256::from_u64(1 + (i % 3) as u64),
                _ => U256::from_u64(u.0[0] & 0xffff),
            }),
    );
    xs
}

/// The check's MSM sizes: `--msm-log2`'s, else the level's one.
fn msm_sizes(level: CheckLevel) -> Vec<usize> {
    match msm_log2() {
        Some(log2) => log2.iter().map(|&k| 1usize << k).collect(),
        None => vec![level.pick(1 << 10, 1 << 20)],
    }
}

fn msms(level: CheckLevel, seed: u64) -> Vec<Box<dyn SelfTest>> {
    let cases = msm_sizes(level)
        .into_iter()
        .flat_map(|n| Curve::ALL.into_iter().map(move |curve| (n, curve)))
        .flat_map(|(n, curve)| {
            let field = curve.scalar_field();
            let points = random_points(curve, n, seed ^ 8);
            let scalars = vec![
                vec(field, &random_elements(field, n, seed ^ 9)),
                vec(field, &skewed_scalars(field, n, seed ^ 10)),
            ];
            let job = MsmJob::new(points, scalars).expect("one scalar per point");
            // Affine points (two base-field coordinates) and two scalar sets, read once.
            let point_bytes = match curve {
                Curve::Bn254G1 => 64.0,
                Curve::Bls12_381G1 => 96.0,
            };
            let label = format!("{} {}", curve.name(), size_label(n));
            let sent = CaseInfo::labelled(format!("{label}, uniform and skewed scalars"))
                .with_bytes(n as f64 * (point_bytes + 2.0 * 32.0));
            // The same points as a resident array's: cached on the device with their
            // precomputed multiples (built in the warm-up), so only scalars cross.
            let key = format!("check/msm-{}-{n}", curve.name());
            let resident = job
                .clone()
                .with_device_key(key)
                .with_precomputed_multiples(CHECK_MULTIPLES);
            let kept = CaseInfo::labelled(format!(
                "{label} resident, {CHECK_MULTIPLES} multiples, uniform and skewed scalars"
            ))
            .with_bytes(n as f64 * 2.0 * 32.0);
            [(sent, job), (kept, resident)]
        })
        .collect();
    vec![JobCheck::described(cases)]
}

/// The precomputed multiples of the check's resident MSM case: `serve`'s default
/// (`--msm-precompute-factor`).
const CHECK_MULTIPLES: u32 = super::msm::DEFAULT_PRECOMPUTE_FACTOR;

pub(crate) fn check_cases(level: CheckLevel) -> Vec<Box<dyn SelfTest>> {
    let seed = case_seed();
    let mut checks = field_ops(level, seed);
    checks.extend(pow_and_inv(level, seed));
    checks.extend(ntts(level, seed));
    checks.extend(msms(level, seed));
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_zk_op_has_a_case_and_the_standard_sizes_are_production_sizes() {
        let ops: Vec<&str> = check_cases(CheckLevel::Quick)
            .iter()
            .map(|c| c.op())
            .collect();
        for op in [
            "field_add",
            "field_sub",
            "field_mul",
            "field_pow",
            "field_inv",
            "ntt",
            "intt",
            "msm",
        ] {
            assert!(ops.contains(&op), "{op} has no check case: {ops:?}");
        }
        // The standard NTT reaches 2^22 (not built here: the sizes are what is checked).
        let ((n, _), _) = CheckLevel::Standard.pick(((0, 0), (0, 0)), ((1 << 22, 1), (0, 0)));
        assert_eq!(n, 1usize << 22);
    }

    #[test]
    fn skewed_scalars_are_mostly_small_and_canonical() {
        let xs = skewed_scalars(Field::Bn254Fr, 1000, 1);
        let small = xs.iter().filter(|x| *x < &U256::from_u64(1 << 16)).count();
        assert!(small > 800, "{small} of 1000 below 2^16");
        assert!(xs.iter().all(|x| *x < Field::Bn254Fr.modulus()));
    }
}
