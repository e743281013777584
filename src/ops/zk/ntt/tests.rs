use super::*;
use crate::ops::zk::samples::random_elements;
use ark_poly::{EvaluationDomain, Radix2EvaluationDomain};

fn job(d: Direction, v: FieldVec, batch: usize, i: Order, o: Order, s: Option<U256>) -> NttJob {
    NttJob::new(d, v, batch, i, o, s, 30).unwrap()
}

#[test]
fn roots_have_exact_order_n() {
    use crate::ops::zk::{FieldBinaryJob, FieldOp};
    for field in Field::ALL {
        for log_n in [2u32, 5, 16] {
            let n = 1usize << log_n;
            // ω^(n/2) = −1 exactly when ω (with ω^n = 1) has order n.
            let tw = device_tables(field, n, Direction::Forward, None).0;
            let at = |k: usize| FieldVec::from_integers(field, &[tw.get(k)]).unwrap();
            let half = FieldBinaryJob::new(FieldOp::Mul, at(n / 2 - 1), at(1))
                .unwrap()
                .run_cpu();
            assert_eq!(
                half.get(0),
                sub_small(field.modulus(), 1),
                "{field:?} n=2^{log_n}"
            );
        }
    }
}

#[test]
fn round_trips_in_every_order_with_and_without_a_coset() {
    for field in Field::ALL {
        for log_n in [0u32, 1, 3, 10] {
            let n = 1usize << log_n;
            let xs = random_elements(field, 3 * n, 77);
            let v = FieldVec::from_integers(field, &xs).unwrap();
            for shift in [None, Some(U256::from_u64(field.generator()))] {
                for (i, o) in [
                    (Order::Natural, Order::BitReversed),
                    (Order::BitReversed, Order::Natural),
                    (Order::Natural, Order::Natural),
                ] {
                    let fwd = job(Direction::Forward, v.clone(), 3, i, o, shift).run_cpu();
                    let back = job(Direction::Inverse, fwd, 3, o, i, shift).run_cpu();
                    assert_eq!(back, v, "{field:?} n={n} {i:?}->{o:?} shift={shift:?}");
                }
            }
        }
    }
}

#[test]
fn reference_agrees_with_ark_poly_domains_including_cosets() {
    // The reference, not `run_cpu`: the 256-bit service transform is ark-poly's own.
    fn check<C: MontConfig<4>>(field: Field) {
        for log_n in [1u32, 4, 12] {
            let n = 1usize << log_n;
            let xs = random_elements(field, n, 5);
            let v = FieldVec::from_integers(field, &xs).unwrap();
            let coeffs: Vec<Fp<C>> = xs.iter().map(|x| from_limbs::<C>(&x.0)).collect();
            let domain = Radix2EvaluationDomain::<Fp<C>>::new(n).unwrap();
            let want: Vec<[u64; 4]> = domain.fft(&coeffs).into_iter().map(to_limbs).collect();
            let got = job(
                Direction::Forward,
                v.clone(),
                1,
                Order::Natural,
                Order::Natural,
                None,
            )
            .run_reference();
            assert_eq!(
                got.to_le_bytes(),
                FieldVec::from_integers(field, &want.iter().map(|l| U256(*l)).collect::<Vec<_>>())
                    .unwrap()
                    .to_le_bytes()
            );
            let shift = Fp::<C>::from(9u64);
            let coset = domain.get_coset(shift).unwrap();
            let want: Vec<U256> = coset
                .fft(&coeffs)
                .into_iter()
                .map(|x| U256(to_limbs(x)))
                .collect();
            let got = job(
                Direction::Forward,
                v,
                1,
                Order::Natural,
                Order::Natural,
                Some(U256::from_u64(9)),
            )
            .run_reference();
            assert_eq!(
                got,
                FieldVec::from_integers(field, &want).unwrap(),
                "{field:?} coset n={n}"
            );
        }
    }
    check::<ark_bn254::FrConfig>(Field::Bn254Fr);
    check::<ark_bls12_381::FrConfig>(Field::Bls12_381Fr);
}

#[test]
fn small_fields_match_the_definition() {
    // X_k = Σ_j x_j ω^(jk), evaluated naively.
    for field in [Field::Goldilocks, Field::BabyBear] {
        let n = 16;
        let xs = random_elements(field, n, 3);
        let v = FieldVec::from_integers(field, &xs).unwrap();
        let got = job(
            Direction::Forward,
            v,
            1,
            Order::Natural,
            Order::Natural,
            None,
        )
        .run_cpu();
        let tw = device_tables(field, 2 * n, Direction::Forward, None).0; // ω_{2n}^k; ω_n = ω_{2n}^2
        let p = num_bigint::BigUint::from_bytes_le(
            &field
                .modulus()
                .0
                .iter()
                .flat_map(|l| l.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        let big = |u: U256| {
            num_bigint::BigUint::from_bytes_le(
                &u.0.iter().flat_map(|l| l.to_le_bytes()).collect::<Vec<_>>(),
            )
        };
        let omega = (big(tw.get(1)) * big(tw.get(1))) % &p;
        for k in 0..n {
            let mut acc = num_bigint::BigUint::from(0u32);
            for (j, x) in xs.iter().enumerate() {
                acc = (acc + big(*x) * omega.modpow(&((j * k) as u64).into(), &p)) % &p;
            }
            assert_eq!(big(got.get(k)), acc, "{field:?} k={k}");
        }
    }
}

#[test]
fn shapes_are_checked() {
    let v = |n| FieldVec::from_integers(Field::BabyBear, &vec![U256::from_u64(1); n]).unwrap();
    let new = |v, b, s| {
        NttJob::new(
            Direction::Forward,
            v,
            b,
            Order::Natural,
            Order::Natural,
            s,
            30,
        )
    };
    assert_eq!(
        new(v(12), 1, None).unwrap_err(),
        NttShape::NotPowerOfTwo { n: 12 }
    );
    assert_eq!(
        new(v(12), 5, None).unwrap_err(),
        NttShape::Uneven { len: 12, batch: 5 }
    );
    assert_eq!(new(v(12), 3, None).unwrap().size(), 4);
    assert_eq!(new(v(8), 0, None).unwrap_err(), NttShape::ZeroBatch);
    assert_eq!(
        new(v(8), 1, Some(U256::ZERO)).unwrap_err(),
        NttShape::ZeroShift
    );
    let too_big = NttJob::new(
        Direction::Forward,
        v(8),
        1,
        Order::Natural,
        Order::Natural,
        None,
        2,
    );
    assert_eq!(
        too_big.unwrap_err(),
        NttShape::TooLarge { n: 8, max_log2: 2 }
    );
}

#[test]
fn library_transforms_equal_the_radix_2_reference_bit_for_bit() {
    // Plonky3 (small fields) and ark-poly (256-bit fields) against this module's own
    // radix-2 transform: every direction, order pair, coset and batch. Sizes go down and
    // up again so Plonky3's shared twiddle cache serves sizes below its largest.
    for field in Field::ALL {
        // Plonky3 takes a batch a group of transforms to a matrix, as many as fit 256 KiB:
        // small transforms are one group; 2^14 × 3 is Goldilocks groups of two and one
        // (BabyBear one group of three), 2^15 × 3 BabyBear two and one (Goldilocks one
        // column each), 2^16 × 2 one column each in both fields.
        for (log_n, batch) in [
            (12u32, 1usize),
            (0, 3),
            (1, 2),
            (5, 3),
            (15, 1),
            (3, 4),
            (4, 17),
            (6, 40),
            (0, 16),
            (14, 3),
            (15, 3),
            (16, 2),
        ] {
            let n = 1usize << log_n;
            let xs = random_elements(field, batch * n, u64::from(log_n) + 11);
            let v = FieldVec::from_integers(field, &xs).unwrap();
            for direction in [Direction::Forward, Direction::Inverse] {
                for shift in [None, Some(U256::from_u64(field.generator() + 2))] {
                    for (i, o) in [
                        (Order::Natural, Order::Natural),
                        (Order::BitReversed, Order::Natural),
                        (Order::Natural, Order::BitReversed),
                        (Order::BitReversed, Order::BitReversed),
                    ] {
                        let j = job(direction, v.clone(), batch, i, o, shift);
                        assert_eq!(
                            j.run_cpu(),
                            j.run_reference(),
                            "{field:?} n=2^{log_n}×{batch} {direction:?} {i:?}->{o:?} shift={shift:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn small_field_transforms_beyond_the_cached_twiddles_equal_the_reference() {
    // Above CACHED_TWIDDLES_MAX_LOG2 each job builds its own Plonky3 tables.
    for field in [Field::Goldilocks, Field::BabyBear] {
        let n = 1usize << 21;
        let v = FieldVec::from_integers(field, &random_elements(field, n, 21)).unwrap();
        for (direction, shift) in [
            (Direction::Forward, Some(U256::from_u64(3))),
            (Direction::Inverse, None),
        ] {
            let j = job(
                direction,
                v.clone(),
                1,
                Order::Natural,
                Order::Natural,
                shift,
            );
            assert!(j.run_cpu() == j.run_reference(), "{field:?} {direction:?}");
        }
    }
}
