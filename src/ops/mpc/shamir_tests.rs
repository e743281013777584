use super::*;
use crate::ops::mpc::feldman::{CommitJob, ShareCheckJob};
use crate::ops::zk::samples::random_elements;
use crate::ops::zk::FieldBinaryJob;
use crate::ops::zk::FieldOp;

fn vec(field: Field, xs: &[U256]) -> FieldVec {
    FieldVec::from_integers(field, xs).unwrap()
}

fn split(field: Field, secrets: &FieldVec, t: usize, xs: &[U256], seed: u64) -> Vec<FieldVec> {
    let coeffs = dealer_coefficients(secrets, t, &NoiseKey::derive(b"test", seed));
    let m = secrets.len();
    ShareJob::new(Arc::new(coeffs), m, vec(field, xs)).run_cpu()
}

fn p_minus(field: Field, k: u64) -> U256 {
    let mut p = field.modulus();
    p.0[0] -= k;
    p
}

#[test]
fn any_threshold_of_shares_gives_the_secrets_back() {
    for field in Field::ALL {
        let secrets = vec(field, &random_elements(field, 257, 1));
        let xs = [
            U256::from_u64(1),
            p_minus(field, 1),
            U256::from_u64(7),
            p_minus(field, 2),
            U256::from_u64(1 << 20),
        ];
        let shares = split(field, &secrets, 3, &xs, 9);
        for pick in [[0, 1, 2], [4, 2, 0], [1, 3, 4], [3, 4, 1]] {
            let chosen: Vec<U256> = pick.iter().map(|&i| xs[i]).collect();
            let given: Vec<FieldVec> = pick.iter().map(|&i| shares[i].clone()).collect();
            let job = CombineJob::new(3, &chosen, given).unwrap();
            assert_eq!(
                job.finish(job.run_cpu()).unwrap(),
                secrets,
                "{field:?} {pick:?}"
            );
        }
        // All five: three interpolate, two are checked.
        let job = CombineJob::new(3, &xs, shares).unwrap();
        assert_eq!(job.extra_shares(), 2);
        assert_eq!(job.finish(job.run_cpu()).unwrap(), secrets, "{field:?} all");
    }
}

/// The Horner kernel's twin against Σ_k c_k·x^k written with the field-op twins.
#[test]
fn shares_are_the_polynomials_at_the_points() {
    for field in Field::ALL {
        let m = 50;
        let coeffs: Vec<FieldVec> = (0..4)
            .map(|k| vec(field, &random_elements(field, m, 60 + k)))
            .collect();
        let x = vec(field, &[p_minus(field, 5)]);
        let mut want = coeffs[0].clone();
        let mut power = x.clone();
        for c in &coeffs[1..] {
            let term = FieldBinaryJob::new(FieldOp::Mul, c.clone(), power.clone())
                .unwrap()
                .run_cpu();
            want = FieldBinaryJob::new(FieldOp::Add, want, term)
                .unwrap()
                .run_cpu();
            power = FieldBinaryJob::new(FieldOp::Mul, power, x.clone())
                .unwrap()
                .run_cpu();
        }
        let all = FieldVec::concat(&coeffs[0], &coeffs[1..]);
        assert_eq!(evaluate_vec(&all, &x, m), vec![want], "{field:?}");
    }
}

#[test]
fn a_changed_extra_share_is_named_with_its_element() {
    let field = Field::Goldilocks;
    let secrets = vec(field, &random_elements(field, 40, 2));
    let xs: Vec<U256> = (1..=4).map(U256::from_u64).collect();
    let mut shares = split(field, &secrets, 2, &xs, 3);
    let FieldVec::Goldilocks(v) = &mut shares[3] else {
        unreachable!()
    };
    v[17] = (v[17] + 1) % crate::ops::zk::Field::Goldilocks.modulus().0[0];
    let job = CombineJob::new(2, &xs, shares).unwrap();
    assert_eq!(
        job.finish(job.run_cpu()).unwrap_err(),
        ShamirError::Inconsistent {
            share: 3,
            element: 17,
            threshold: 2
        }
    );
}

#[test]
fn bad_share_sets_are_refused_with_their_place() {
    let field = Field::BabyBear;
    let s = |n: usize| vec(field, &random_elements(field, n, 5));
    let xs = |v: &[u64]| v.iter().map(|&x| U256::from_u64(x)).collect::<Vec<_>>();
    assert_eq!(
        CombineJob::new(3, &xs(&[1, 2]), vec![s(4), s(4)]).unwrap_err(),
        ShamirError::TooFewShares {
            given: 2,
            threshold: 3
        }
    );
    let path = |e: ShamirError| match e {
        ShamirError::Invalid(i) => format!("{:?}", i.path.segments()),
        other => panic!("{other:?}"),
    };
    let dup = CombineJob::new(2, &xs(&[1, 5, 5]), vec![s(4), s(4), s(4)]).unwrap_err();
    assert_eq!(path(dup), r#"[Field("shares"), Index(2), Field("x")]"#);
    let zero = CombineJob::new(2, &xs(&[0, 5]), vec![s(4), s(4)]).unwrap_err();
    assert_eq!(path(zero), r#"[Field("shares"), Index(0), Field("x")]"#);
    let ragged = CombineJob::new(2, &xs(&[1, 5]), vec![s(4), s(3)]).unwrap_err();
    assert_eq!(
        path(ragged),
        r#"[Field("shares"), Index(1), Field("values")]"#
    );
    assert!(check_threshold(1, 3).is_err());
    assert!(check_threshold(4, 3).is_err());
    assert!(check_threshold(3, MAX_SHARES + 1).is_err());
    assert!(check_threshold(3, 3).is_ok());
}

#[test]
fn keyed_elements_are_canonical_reproducible_and_cover_the_top_bits() {
    let key = NoiseKey::derive(b"test", 1);
    for field in Field::ALL {
        let n = 3 * KEYED_CHUNK + 5;
        let a = keyed_elements(field, n, &key, DOMAIN_COEFFICIENTS);
        assert_eq!(a.len(), n);
        assert_eq!(a, keyed_elements(field, n, &key, DOMAIN_COEFFICIENTS));
        assert_ne!(a, keyed_elements(field, n, &key, DOMAIN_CHECK_WEIGHTS));
        let p = field.modulus();
        let mut half = p;
        half.0 = [
            half.0[0] >> 1 | half.0[1] << 63,
            half.0[1] >> 1 | half.0[2] << 63,
            half.0[2] >> 1 | half.0[3] << 63,
            half.0[3] >> 1,
        ];
        let above = (0..n).filter(|&i| a.get(i) >= half).count();
        assert!((0..n).all(|i| a.get(i) < p), "{field:?}: not canonical");
        // Uniform on [0, p): about half lie above p/2 (binomial sd ≈ 61 here).
        assert!(
            above.abs_diff(n / 2) < 400,
            "{field:?}: {above} of {n} above p/2"
        );
    }
}

#[test]
fn feldman_commitments_accept_true_shares_and_refuse_changed_ones() {
    let key = NoiseKey::from_os().unwrap();
    for field in [Field::Bn254Fr, Field::Bls12_381Fr] {
        let secrets = vec(field, &random_elements(field, 6, 7));
        let coeffs = Arc::new(dealer_coefficients(&secrets, 3, &NoiseKey::derive(b"t", 4)));
        let commitments = CommitJob::new(coeffs.clone()).unwrap().run_cpu();
        assert_eq!(commitments.len(), 18);
        let xs: Vec<U256> = (1..=4).map(U256::from_u64).collect();
        let shares = ShareJob::new(coeffs, 6, vec(field, &xs)).run_cpu();
        for (x, share) in xs.iter().zip(&shares) {
            let check = ShareCheckJob::new(commitments.clone(), *x, share, &key).unwrap();
            assert!(ShareCheckJob::holds(&check.run_cpu()), "{field:?} x={x}");
        }
        // Share 1 presented as share 2's, and a share with one value changed.
        let wrong_x = ShareCheckJob::new(commitments.clone(), xs[2], &shares[1], &key).unwrap();
        assert!(!ShareCheckJob::holds(&wrong_x.run_cpu()));
        let mut values: Vec<U256> = (0..6).map(|j| shares[0].get(j)).collect();
        values[5].0[0] ^= 1;
        let changed =
            ShareCheckJob::new(commitments.clone(), xs[0], &vec(field, &values), &key).unwrap();
        assert!(!ShareCheckJob::holds(&changed.run_cpu()));
        // Commitments for a different number of values are refused.
        assert!(ShareCheckJob::new(commitments, xs[0], &vec(field, &values[..4]), &key).is_err());
    }
    let gl = Arc::new(vec(
        Field::Goldilocks,
        &[U256::from_u64(1), U256::from_u64(2)],
    ));
    assert!(CommitJob::new(gl).is_err());
}
