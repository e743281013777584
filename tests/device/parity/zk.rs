//! Field vectors, pow and inversion, NTT and MSM: bit for bit (MSM compared in affine).

use super::{on_devices_serving, on_every_device, Device};
use gpu_ops::ops::zk::msm::{Curve, MsmJob, Points};
use gpu_ops::ops::zk::ntt::{Direction, NttJob, Order};
use gpu_ops::ops::zk::samples::{edge_values, random_elements, random_points};
use gpu_ops::ops::zk::{
    launch_msm_in_chunks, Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob, FieldVec, U256,
};

/// Every pair of the field's edge values, then `n` uniform pairs.
pub(super) fn inputs(field: Field, n: usize) -> (Vec<U256>, Vec<U256>) {
    let e = edge_values(field);
    let mut xs: Vec<U256> = e.iter().flat_map(|x| e.iter().map(move |_| *x)).collect();
    let mut ys: Vec<U256> = e.iter().flat_map(|_| e.iter().copied()).collect();
    xs.extend(random_elements(field, n, 101));
    ys.extend(random_elements(field, n, 202));
    (xs, ys)
}

pub(super) fn vec(field: Field, xs: &[U256]) -> FieldVec {
    FieldVec::from_integers(field, xs).unwrap()
}

/// Sizes cross the grid-stride boundary (more elements than threads launched); each op
/// also with a broadcast right operand.
#[test]
fn field_ops_are_bit_identical_to_the_cpu() {
    let ops = ["field_add", "field_sub", "field_mul"];
    on_devices_serving(&ops, "field_ops_are_bit_identical_to_the_cpu", |d| {
        for n in d.sizes(
            &[1usize, 255, 257, 100_000, 3_000_000],
            &[1, 255, 257, 9000],
        ) {
            for field in Field::ALL {
                let (xs, ys) = inputs(field, n);
                let (a, b) = (vec(field, &xs), vec(field, &ys));
                let b1 = vec(field, &ys[7..8]);
                for op in FieldOp::ALL {
                    for b in [&b, &b1] {
                        let job = FieldBinaryJob::new(op, a.clone(), b.clone()).unwrap();
                        let case = format!("{op:?} {field:?} n={} |b|={}", xs.len(), b.len());
                        d.check(case, &job);
                    }
                }
            }
        }
    });
}

#[test]
fn pow_and_inv_are_bit_identical_to_the_cpu() {
    let ops = ["field_pow", "field_inv"];
    on_devices_serving(&ops, "pow_and_inv_are_bit_identical_to_the_cpu", |d| {
        for n in d.sizes(&[1usize, 7, 1000, 300_000], &[1, 7, 1000, 9000]) {
            for field in Field::ALL {
                let mut xs = edge_values(field);
                xs.extend(random_elements(field, n, 31));
                let base = vec(field, &xs);
                let exps = random_elements(Field::Bn254Fr, xs.len(), 32);
                for e in [exps.clone(), exps[..1].to_vec()] {
                    let shared = e.len() == 1;
                    let job = FieldPowJob::new(base.clone(), e).unwrap();
                    d.check(
                        format!("pow {field:?} n={} one exponent={shared}", xs.len()),
                        &job,
                    );
                }
                let nonzero: Vec<U256> = xs.into_iter().filter(|x| *x != U256::ZERO).collect();
                let job = FieldInvJob::new(vec(field, &nonzero)).unwrap();
                d.check(format!("inv {field:?} n={}", nonzero.len()), &job);
            }
        }
    });
}

/// Both directions, the three order pairs, with and without a coset shift; 2^11 crosses
/// the tile (1 024 BN254 elements) into the stages on every field but Goldilocks and
/// BabyBear, which 2^13 crosses.
#[test]
fn ntt_is_bit_identical_to_the_cpu() {
    on_devices_serving(&["ntt", "intt"], "ntt_is_bit_identical_to_the_cpu", |d| {
        for field in Field::ALL {
            let shapes = d.sizes(
                &[(0u32, 3usize), (1, 1), (5, 4), (12, 2), (20, 1)],
                &[(0, 3), (1, 1), (5, 4), (11, 2), (13, 1)],
            );
            for (log_n, batch) in shapes {
                let n = 1usize << log_n;
                let values = vec(field, &random_elements(field, n * batch, 41));
                for direction in [Direction::Forward, Direction::Inverse] {
                    for (input, output) in [
                        (Order::Natural, Order::Natural),
                        (Order::BitReversed, Order::Natural),
                        (Order::Natural, Order::BitReversed),
                    ] {
                        for shift in [None, Some(U256::from_u64(3))] {
                            let job = NttJob::new(
                                direction,
                                values.clone(),
                                batch,
                                input,
                                output,
                                shift,
                                30,
                            )
                            .unwrap();
                            let case = format!("{field:?} n=2^{log_n} batch={batch} {direction:?} {input:?}->{output:?} shift={shift:?}");
                            d.check(case, &job);
                        }
                    }
                }
            }
        }
    });
}

/// The curves an MSM test runs on `d`: both, but one under ThreadSanitizer. The two
/// curves are one kernel template over different field widths: the same threads touch
/// the same shared and global words at the same barriers, so a race in one is a race in
/// the other. The second curve was two fifths of CI's race-checked run (2026-11-28:
/// these two tests 106 s and 87 s of 147 s).
fn msm_curves(d: &Device) -> &'static [Curve] {
    if d.race_checked() {
        &[Curve::Bn254G1]
    } else {
        &[Curve::Bn254G1, Curve::Bls12_381G1]
    }
}

/// `points` with the hard cases appended: the identity, duplicates (the doubling path
/// inside a bucket) and P beside −P.
fn with_hard_points(points: Points) -> Points {
    use ark_ec::short_weierstrass::{Affine, SWCurveConfig};
    fn mix<P: SWCurveConfig>(mut p: Vec<Affine<P>>) -> Vec<Affine<P>> {
        let (a, b) = (p[0], p[1]);
        p.extend([Affine::identity(), a, a, -b]);
        p
    }
    match points {
        Points::Bn254G1(p) => Points::Bn254G1(mix(p)),
        Points::Bls12_381G1(p) => Points::Bls12_381G1(mix(p)),
    }
}

/// The hard scalar vectors for `m` points: random, the edge values (zero, one, r − 1, …),
/// one repeated value (every point in one bucket a window), all zero.
fn hard_scalars(field: Field, m: usize) -> Vec<FieldVec> {
    let mut edge = edge_values(field);
    edge.extend(random_elements(field, m, 5));
    edge.truncate(m);
    [
        random_elements(field, m, 9),
        edge,
        vec![U256::from_u64(7); m],
        vec![U256::ZERO; m],
    ]
    .iter()
    .map(|v| vec(field, v))
    .collect()
}

/// MSM against arkworks on the CPU on the hard cases: tiny and odd sizes, zero and r − 1
/// scalars, the identity, duplicates (the doubling path inside a bucket), P beside −P,
/// every scalar in one bucket, a batch, and the chunked path.
#[test]
fn msm_equals_the_cpu() {
    on_devices_serving(&["msm"], "msm_equals_the_cpu", |d| {
        for &curve in msm_curves(d) {
            let field = curve.scalar_field();
            for n in d.sizes(&[2usize, 31, 1000, 1 << 16], &[2, 31, 1000, 3000]) {
                let points = with_hard_points(random_points(curve, n, n as u64));
                let m = points.len();
                let job = MsmJob::new(points, hard_scalars(field, m)).unwrap();
                d.check(format!("{curve:?} n={m}"), &job);
                if m > 1000 {
                    d.check_with(
                        format!("{curve:?} n={m} in chunks of 2^10"),
                        &job,
                        |j, l| launch_msm_in_chunks(j, l, 1 << 10),
                    );
                }
            }
        }
    });
}

/// An MSM over resident points with precomputed multiples
/// (`MsmJob::with_precomputed_multiples`) equals the CPU's on the hard points and scalars,
/// with factors that divide the windows and factors that leave the last block padded:
/// built on the first run and kept under the points' key, read from the cache on the
/// second, and dropped with the key. A device that builds none (wgpu: it bounds its
/// loops, and has no such kernel) runs the plain plan and keeps the points alone.
#[test]
fn msm_over_precomputed_multiples_equals_the_cpu() {
    on_devices_serving(
        &["msm"],
        "msm_over_precomputed_multiples_equals_the_cpu",
        |d| {
            let builds = d.lease().has_kernel("bn254_g1_msm_multiples")
                && !d.device().bounds_loop_iterations();
            for &curve in msm_curves(d) {
                let field = curve.scalar_field();
                let mut cases = d.sizes(
                    &[(1usize << 16, 4u32), (1000, 3), (64, 16)],
                    &[(300, 2), (500, 3), (64, 16)],
                );
                if !builds {
                    // The plain plan, which msm_equals_the_cpu covers: one case shows the
                    // fallback.
                    cases.truncate(1);
                }
                for (n, factor) in cases {
                    let points = with_hard_points(random_points(curve, n, 40 + n as u64));
                    let m = points.len();
                    let key = format!("array/multiples-test-{curve:?}-{n}-{factor}");
                    let job = MsmJob::new(points, hard_scalars(field, m))
                        .unwrap()
                        .with_device_key(key.clone())
                        .with_precomputed_multiples(factor);
                    let at = format!("{curve:?} n={m} ×{factor}");
                    d.check(format!("{at}, first run"), &job);
                    // The table the first run kept, to see that the second reads it.
                    let held = d.device().tables_under(&key);
                    let cached = |k: &str| d.lease().table::<u32>(k).ok().flatten();
                    let first = held.first().and_then(|k| cached(k));
                    d.check(format!("{at}, second run"), &job);
                    match (builds, held.as_slice()) {
                        (true, [one]) if one.starts_with(&format!("{key}/multiples/")) => {
                            // Built again, the cache would hold another table there.
                            let same = first
                                .zip(cached(one))
                                .is_some_and(|(a, b)| std::sync::Arc::ptr_eq(&a, &b));
                            if !same {
                                d.fail(&at, "the second run did not read the first's multiples");
                            }
                            if d.device().holds_table(&key) {
                                d.fail(&at, "the points' plain copy was kept beside them");
                            }
                            // While another job builds them, a job does without: the
                            // plain plan, nothing built beside the builder's.
                            d.lease().uncache(one);
                            let claim = d.device().claim_build(one);
                            d.check(format!("{at}, while another builds"), &job);
                            if claim.is_none() || d.device().holds_table(one) {
                                d.fail(&at, "built beside another job's claim");
                            }
                            drop(claim);
                        }
                        (false, []) if d.device().holds_table(&key) => {}
                        _ => d.fail(&at, format!("device tables under the key: {held:?}")),
                    }
                    d.device().forget_table(&key);
                    if !d.device().tables_under(&key).is_empty() {
                        d.fail(&at, "the multiples outlived their key");
                    }
                }
            }
        },
    );
}

/// Skewed scalars cost the bucket sums no more than random ones: all zero, all one, one
/// repeated value, a few values in turn and r − 1 everywhere put up to n entries in one
/// bucket, yet no thread adds more than the plan's chunk in any level (read back from
/// the kernels' per-thread addition counts), and the answers equal the CPU's.
#[test]
fn msm_bucket_work_is_balanced_whatever_the_scalars() {
    use gpu_ops::ops::zk::launch_msm_measured;
    on_devices_serving(
        &["msm"],
        "msm_bucket_work_is_balanced_whatever_the_scalars",
        |d| {
            for &curve in msm_curves(d) {
                let field = curve.scalar_field();
                for n in d.sizes(&[1usize << 16], &[1000, 3000]) {
                    let points = random_points(curve, n, 77);
                    let random = random_elements(field, n, 78);
                    let mut r_minus_1 = field.modulus();
                    r_minus_1.0[0] -= 1;
                    let few: Vec<U256> = (0..n).map(|i| random[i % 4]).collect();
                    let cases = [
                        ("random", random.clone()),
                        ("all zero", vec![U256::ZERO; n]),
                        ("all one", vec![U256::from_u64(1); n]),
                        ("one repeated value", vec![random[0]; n]),
                        ("four values in turn", few),
                        ("r - 1", vec![r_minus_1; n]),
                    ];
                    // The random scalars' critical path, once measured.
                    let mut random_path = None;
                    for (name, scalars) in cases {
                        let job = MsmJob::new(points.clone(), vec![vec(field, &scalars)]).unwrap();
                        let at = format!("{curve:?} n={n} {name}");
                        let mut work = None;
                        d.check_with(&at, &job, |j, l| {
                            let (out, w) = launch_msm_measured(j, l, usize::MAX)?;
                            work = Some(w);
                            Ok(out)
                        });
                        let Some(work) = work else { continue };
                        eprintln!("{at}: {work:?}, critical path {}", work.critical_path());
                        for (level, &adds) in work.most_adds_per_level.iter().enumerate() {
                            if adds > work.chunk {
                                d.fail(&at, format!("level {level} {work:?}"));
                            }
                        }
                        match random_path {
                            None if name == "random" => random_path = Some(work.critical_path()),
                            Some(random) if work.critical_path() > random + work.chunk => {
                                d.fail(&at, format!("{work:?} against random's {random}"));
                            }
                            _ => {}
                        }
                        // One thread per bucket would have added every point in turn.
                        if name == "all one" && work.largest_bucket as usize != n {
                            d.fail(&at, format!("largest bucket {}", work.largest_bucket));
                        }
                    }
                }
            }
        },
    );
}

/// With a 1 MiB memory limit (`--gpu-memory-limit-mib`), work many times larger runs in
/// passes and still equals the CPU: field vectors by element ranges, NTT batches by whole
/// polynomials, MSM by point chunks, Shamir by secret ranges.
#[test]
fn work_beyond_the_memory_limit_runs_in_passes() {
    on_every_device("work_beyond_the_memory_limit_runs_in_passes", |d| {
        // The emulated device at 1/16 of the limit and the sizes: still many passes.
        let scale = if d.device().on_host_cores() { 4 } else { 0 };
        d.in_passes(1 << (20 - scale), |d| {
            let field = Field::Bn254Fr;
            let (xs, ys) = inputs(field, 1 << (18 - scale));
            let job = FieldBinaryJob::new(FieldOp::Mul, vec(field, &xs), vec(field, &ys)).unwrap();
            d.check("field_mul in passes", &job);

            let nonzero: Vec<U256> = xs.iter().copied().filter(|x| *x != U256::ZERO).collect();
            let inv = FieldInvJob::new(vec(field, &nonzero)).unwrap();
            d.check("field_inv in passes", &inv);

            let values = vec(field, &random_elements(field, 8 << (14 - scale), 4));
            let ntt = NttJob::new(
                Direction::Inverse,
                values,
                8,
                Order::Natural,
                Order::Natural,
                Some(U256::from_u64(5)),
                30,
            )
            .unwrap();
            d.check("NTT batch in passes", &ntt);

            let points = random_points(Curve::Bn254G1, 1 << (15 - scale), 2);
            let scalars = vec(field, &random_elements(field, 1 << (15 - scale), 6));
            let msm = MsmJob::new(points, vec![scalars]).unwrap();
            d.check("MSM in chunks", &msm);

            let (secrets, xs) = super::mpc::shamir_inputs(field, 1 << (14 - scale));
            let (share, combine) = super::mpc::shamir_jobs(secrets, &xs);
            d.check("Shamir split in passes", &share);
            d.check("Shamir combine in passes", &combine);
        });
    });
}
