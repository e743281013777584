//! Shamir split and combine, and secure aggregation's unmasking: bit for bit.

use super::on_every_device;
use gpu_ops::backend::Job;
use gpu_ops::ops::dp::NoiseKey;
use gpu_ops::ops::mpc::secagg::{MaskTerm, UnmaskJob};
use gpu_ops::ops::mpc::shamir::{dealer_coefficients, CombineJob, ShareJob};
use gpu_ops::ops::zk::samples::random_elements;
use gpu_ops::ops::zk::{Field, FieldVec, U256};
use std::sync::Arc;

/// `m` random secrets and five points: 1, p − 1, p − 2, 2^20 and 7.
pub(super) fn shamir_inputs(field: Field, m: usize) -> (FieldVec, Vec<U256>) {
    let secrets = FieldVec::from_integers(field, &random_elements(field, m, 31)).unwrap();
    let p = field.modulus();
    let minus = |k: u64| U256([p.0[0] - k, p.0[1], p.0[2], p.0[3]]);
    let xs = vec![
        U256::from_u64(1),
        minus(1),
        minus(2),
        U256::from_u64(1 << 20),
        U256::from_u64(7),
    ];
    (secrets, xs)
}

/// A threshold-3 split of `secrets` at `xs`, and a combine of the CPU's shares with two
/// checked beyond the threshold.
pub(super) fn shamir_jobs(secrets: FieldVec, xs: &[U256]) -> (ShareJob, CombineJob) {
    let (field, m) = (secrets.field(), secrets.len());
    let coeffs = dealer_coefficients(&secrets, 3, &NoiseKey::derive(b"parity", 1));
    let share = ShareJob::new(
        Arc::new(coeffs),
        m,
        FieldVec::from_integers(field, xs).unwrap(),
    );
    let combine = CombineJob::new(3, xs, share.run_cpu()).unwrap();
    (share, combine)
}

/// Sizes cross the grid-stride boundary (more secrets than threads launched); the
/// device's combined rows recover the secrets.
#[test]
fn shamir_split_and_combine_are_bit_identical_to_the_cpu() {
    on_every_device(
        "shamir_split_and_combine_are_bit_identical_to_the_cpu",
        |d| {
            for m in d.sizes(&[1usize, 1000, 1 << 20], &[1, 257, 9000]) {
                for field in Field::ALL {
                    let (secrets, xs) = shamir_inputs(field, m);
                    let (share, combine) = shamir_jobs(secrets.clone(), &xs);
                    d.check(format!("split {field:?} m={m}"), &share);
                    let case = format!("combine {field:?} m={m}");
                    if let Some(rows) = d.check(&case, &combine) {
                        if combine.finish(rows).ok() != Some(secrets) {
                            d.fail(case, "the device's rows do not recover the secrets");
                        }
                    }
                }
            }
        },
    );
}

/// In chunks of about 500 secrets on two lanes: each chunk's columns of every input row
/// are staged as the kernel reads them, and its output rows land at their place in every
/// share (a chunk's rows appended whole, or to the wrong share, fail it).
#[test]
fn shamir_in_chunks_is_bit_identical_to_the_cpu() {
    on_every_device("shamir_in_chunks_is_bit_identical_to_the_cpu", |d| {
        for field in Field::ALL {
            let (secrets, xs) = shamir_inputs(field, 3000);
            let (share, combine) = shamir_jobs(secrets.clone(), &xs);
            // At most eight rows a secret (three in, five out): passes of about 1 000,
            // chunks of about 500.
            let bytes = 8 * field.byte_width() * 1000 + 4096;
            d.in_passes(bytes as u64, |d| {
                d.check(format!("split {field:?} in chunks"), &share);
                let case = format!("combine {field:?} in chunks");
                if let Some(rows) = d.check(&case, &combine) {
                    if combine.finish(rows).ok() != Some(secrets) {
                        d.fail(case, "the device's rows do not recover the secrets");
                    }
                }
            });
        }
    });
}

/// Mask terms with distinct keys, every third subtracted.
fn unmask_job(len: usize, terms: usize) -> UnmaskJob {
    let sum: Vec<u32> = (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let terms = (0..terms)
        .map(|t| MaskTerm {
            key: std::array::from_fn(|b| (t * 31 + b * 7) as u8),
            subtract: t % 3 == 0,
        })
        .collect();
    UnmaskJob::new(Arc::new(sum), terms)
}

/// Lengths off the 16-word block (a partial last block), and beyond the threads launched;
/// 70 masks take two launches.
#[test]
fn secagg_unmask_is_bit_identical_to_the_cpu() {
    on_every_device("secagg_unmask_is_bit_identical_to_the_cpu", |d| {
        for len in d.sizes(&[1usize, 1001, (1 << 20) + 5], &[1, 17, 9001]) {
            for terms in [0, 1, 70] {
                d.check(
                    format!("unmask len={len} terms={terms}"),
                    &unmask_job(len, terms),
                );
            }
        }
    });
}
