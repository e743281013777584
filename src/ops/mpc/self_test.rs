//! The sharing kernels' self-tests: every field's edge values as secrets and
//! coefficients, edge points (1, p − 1, 2^k), thresholds from 2 to one past a warp of
//! coefficients, and combines with checked extra shares; secure aggregation's unmasking.

use super::secagg::{MaskTerm, UnmaskJob};
use super::shamir::{CombineJob, ShareJob};
use crate::backend::verify::{JobCheck, SelfTest};
use crate::ops::zk::samples::{edge_values, random_elements};
use crate::ops::zk::{Field, FieldVec, U256};
use std::sync::Arc;

fn vec(field: Field, xs: &[U256]) -> FieldVec {
    FieldVec::from_integers(field, xs).expect("samples are canonical")
}

/// Distinct nonzero points: the field's nonzero edge values, then small integers (the
/// self-tests' and the check's holders).
pub(super) fn points(field: Field, n: usize) -> Vec<U256> {
    let mut xs: Vec<U256> = edge_values(field)
        .into_iter()
        .filter(|x| !x.is_zero())
        .collect();
    xs.sort();
    xs.dedup();
    let small: Vec<U256> = (2..)
        .map(U256::from_u64)
        .filter(|x| !xs.contains(x))
        .take(n)
        .collect();
    xs.extend(small);
    xs.truncate(n);
    xs
}

pub(crate) fn self_tests() -> Vec<Box<dyn SelfTest>> {
    let mut share_jobs = Vec::new();
    let mut combine_jobs = Vec::new();
    for field in Field::ALL {
        let mut secrets = edge_values(field);
        secrets.extend(random_elements(field, 300, 21));
        let m = secrets.len();
        for (t, n) in [(2, 3), (3, 5), (5, 9), (33, 40)] {
            let mut coeffs = secrets.clone();
            coeffs.extend(random_elements(field, m * (t - 1), 22 + t as u64));
            let xs = points(field, n);
            share_jobs.push(ShareJob::new(
                Arc::new(vec(field, &coeffs)),
                m,
                vec(field, &xs),
            ));
            let shares: Vec<FieldVec> = (0..n)
                .map(|i| vec(field, &random_elements(field, m, 40 + i as u64)))
                .collect();
            combine_jobs.push(CombineJob::new(t, &xs, shares).expect("distinct nonzero points"));
        }
    }
    vec![
        JobCheck::boxed(share_jobs),
        JobCheck::boxed(combine_jobs),
        JobCheck::boxed(unmask_jobs()),
    ]
}

/// Secure aggregation's unmasking: a partial last block, more masks than one launch
/// takes, both signs, and the all-ones and all-zeros keys.
fn unmask_jobs() -> Vec<UnmaskJob> {
    [(1usize, 1usize), (17, 3), (4099, 70)]
        .into_iter()
        .map(|(len, terms)| {
            let sum: Vec<u32> = (0..len as u32)
                .map(|i| i.wrapping_mul(0x9e37_79b9))
                .collect();
            let terms = (0..terms)
                .map(|t| MaskTerm {
                    key: match t {
                        0 => [0xff; 32],
                        1 => [0; 32],
                        _ => std::array::from_fn(|b| (t * 13 + b) as u8),
                    },
                    subtract: t % 2 == 1,
                })
                .collect();
            UnmaskJob::new(Arc::new(sum), terms)
        })
        .collect()
}
