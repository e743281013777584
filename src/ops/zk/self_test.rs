//! The zk ops' self-tests: every field's edge values (0, 1, p − 1, …) against each other
//! and random elements, broadcasts, NTTs through a tile and into the stages with a coset
//! and bit-reversed orders, and MSMs with the identity, duplicates and edge scalars.

use super::msm::{Curve, MsmJob};
use super::ntt::{Direction, NttJob, Order};
use super::samples::{edge_values, random_elements, random_points};
use super::{Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob, FieldVec, U256};
use crate::backend::verify::{JobCheck, SelfTest};

fn vec(field: Field, xs: &[U256]) -> FieldVec {
    FieldVec::from_integers(field, xs).expect("samples are canonical")
}

/// Every pair of edge values, then random elements: (a, b).
fn pairs(field: Field) -> (Vec<U256>, Vec<U256>) {
    let e = edge_values(field);
    let mut a: Vec<U256> = e.iter().flat_map(|x| e.iter().map(move |_| *x)).collect();
    let mut b: Vec<U256> = e.iter().flat_map(|_| e.iter().copied()).collect();
    a.extend(random_elements(field, 600, 1));
    b.extend(random_elements(field, 600, 2));
    (a, b)
}

pub(crate) fn self_tests() -> Vec<Box<dyn SelfTest>> {
    let mut tests = Vec::new();
    for op in FieldOp::ALL {
        let jobs = Field::ALL
            .iter()
            .flat_map(|&f| {
                let (a, b) = pairs(f);
                let one = vec(f, &b[b.len() - 1..]);
                [
                    FieldBinaryJob::new(op, vec(f, &a), vec(f, &b)),
                    FieldBinaryJob::new(op, vec(f, &a), one),
                ]
            })
            .map(|j| j.expect("equal lengths or a broadcast"))
            .collect();
        tests.push(JobCheck::boxed(jobs));
    }
    let pow = Field::ALL
        .iter()
        .map(|&f| {
            let (a, _) = pairs(f);
            let exps = random_elements(Field::Bn254Fr, a.len(), 3);
            FieldPowJob::new(vec(f, &a), exps).expect("one exponent per base")
        })
        .collect();
    tests.push(JobCheck::boxed(pow));
    let inv = Field::ALL
        .iter()
        .map(|&f| {
            let (a, _) = pairs(f);
            let nonzero: Vec<U256> = a.into_iter().filter(|x| *x != U256::ZERO).collect();
            FieldInvJob::new(vec(f, &nonzero)).expect("no zeros")
        })
        .collect();
    tests.push(JobCheck::boxed(inv));
    for direction in [Direction::Forward, Direction::Inverse] {
        let jobs = Field::ALL
            .iter()
            .flat_map(|&f| {
                // 2^11 × 2: past BN254's 1 024-element tile into the stages.
                let values = vec(f, &random_elements(f, 4096, 4));
                [
                    NttJob::new(
                        direction,
                        values.clone(),
                        2,
                        Order::Natural,
                        Order::Natural,
                        None,
                        30,
                    ),
                    NttJob::new(
                        direction,
                        values,
                        2,
                        Order::BitReversed,
                        Order::BitReversed,
                        Some(U256::from_u64(3)),
                        30,
                    ),
                ]
            })
            .map(|j| j.expect("a power-of-two size within the field's two-adicity"))
            .collect();
        tests.push(JobCheck::boxed(jobs));
    }
    let msm = [Curve::Bn254G1, Curve::Bls12_381G1]
        .into_iter()
        .map(|curve| {
            let field = curve.scalar_field();
            let points = random_points(curve, 300, 5);
            let mut edge = edge_values(field);
            edge.extend(random_elements(field, 300, 6));
            edge.truncate(300);
            let scalars = vec![
                vec(field, &random_elements(field, 300, 7)),
                vec(field, &edge),
                vec(field, &vec![U256::from_u64(1); 300]),
            ];
            MsmJob::new(points, scalars).expect("one scalar per point")
        })
        .collect();
    tests.push(JobCheck::boxed(msm));
    tests
}
