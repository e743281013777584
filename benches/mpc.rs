//! `cargo bench --bench mpc`: Shamir split and combine of 2^BENCH_SHAMIR_LOG2 secrets
//! (default 20), t = 3 of n = 5, through the service's CPU twins beside a direct arkworks
//! loop over the same values on the same rayon pool (the reference). The direct
//! loop starts from arkworks field elements (Montgomery form) and its Horner and Lagrange
//! sums are written the obvious way, in parallel over the secrets; the service starts
//! from canonical integers, as they arrive. Goldilocks and BabyBear have no arkworks
//! field, so only the service's time is shown for them. Split is reported with and
//! without drawing the random coefficients (ChaCha20), which the direct loop does not do.
//! Then Feldman commitments and one share's check against them, and secure aggregation's
//! unmasking (100 clients × 2^20 values by default) against the floor of expanding its
//! ChaCha20 streams at the rate the `chacha20` crate reaches on this machine.

mod common;

use ark_ff::{BigInt, PrimeField};
use common::{env, ms, time};
use gpu_ops::backend::Job;
use gpu_ops::ops::dp::NoiseKey;
use gpu_ops::ops::mpc::shamir::{dealer_coefficients, CombineJob, ShareJob};
use gpu_ops::ops::zk::samples::random_elements;
use gpu_ops::ops::zk::{Field, FieldVec, U256};
use rayon::prelude::*;
use std::sync::Arc;
use std::time::Duration;

const T: usize = 3;
const N: usize = 5;

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = gpu_ops::backend::CpuExecutor::new(threads).unwrap();
    let log_m = env("BENCH_SHAMIR_LOG2", 20);
    let m = 1usize << log_m;
    println!(
        "# gpu-ops Shamir benchmark, CPU: {} ({threads} threads), 2^{log_m} secrets, t = {T} of n = {N}\n",
        cpu.info.model
    );
    println!("| field | split: draw + evaluate | evaluate only | arkworks evaluate | ratio | combine | arkworks combine | ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for field in Field::ALL {
        let secrets = FieldVec::from_integers(field, &random_elements(field, m, 1)).unwrap();
        let xs: Vec<U256> = (1..=N as u64).map(U256::from_u64).collect();
        let points = FieldVec::from_integers(field, &xs).unwrap();
        let key = NoiseKey::derive(b"bench", 1);
        let full = cpu.install(|| {
            time(3, || {
                let coeffs = dealer_coefficients(&secrets, T, &key);
                ShareJob::new(Arc::new(coeffs), m, points.clone()).run_cpu()
            })
        });
        let coeffs = Arc::new(dealer_coefficients(&secrets, T, &key));
        let share = ShareJob::new(coeffs.clone(), m, points.clone());
        let eval = cpu.install(|| time(3, || share.run_cpu()));
        let shares = share.run_cpu();
        let pick = [4usize, 1, 2];
        let chosen: Vec<U256> = pick.iter().map(|&i| xs[i]).collect();
        let given: Vec<FieldVec> = pick.iter().map(|&i| shares[i].clone()).collect();
        // The shares as a request decodes them: owned, one copy per timed run.
        let mut requests = vec![given; 4];
        let combine = cpu.install(|| {
            time(3, || {
                let job = CombineJob::new(T, &chosen, requests.pop().unwrap()).unwrap();
                job.finish(job.run_cpu()).unwrap()
            })
        });
        let direct = match field {
            Field::Bn254Fr => Some(arkworks::<ark_bn254::Fr>(&cpu, &coeffs, &shares, &pick, m)),
            Field::Bls12_381Fr => Some(arkworks::<ark_bls12_381::Fr>(
                &cpu, &coeffs, &shares, &pick, m,
            )),
            _ => None,
        };
        let (de, dc) = match direct {
            Some((e, c)) => (ms(e), ms(c)),
            None => ("—".into(), "—".into()),
        };
        let ratio = |ours: Duration, theirs: Option<Duration>| {
            theirs.map_or("—".into(), |t| {
                format!("{:.2}×", ours.as_secs_f64() / t.as_secs_f64())
            })
        };
        println!(
            "| {} | {} | {} | {de} | {} | {} | {dc} | {} |",
            field.name(),
            ms(full),
            ms(eval),
            ratio(eval, direct.map(|d| d.0)),
            ms(combine),
            ratio(combine, direct.map(|d| d.1)),
        );
    }
    feldman(&cpu);
    secure_aggregation(&cpu, threads);
}

/// The server's unmasking of a round: rebuild the needed secrets from every revealed
/// share (checked against commitments and keys), derive the masks, and subtract their
/// streams from the sum. Timed against the floor: the same number of stream bytes at the
/// single-thread ChaCha20 rate of the `chacha20` crate, times the threads.
fn secure_aggregation(cpu: &gpu_ops::backend::CpuExecutor, threads: usize) {
    use chacha20::cipher::{KeyIvInit, StreamCipher};
    use gpu_ops::ops::mpc::secagg::protocol::*;
    use gpu_ops::ops::mpc::secagg::round::{Member, RoundConfig, Secret, Sets};
    use gpu_ops::ops::mpc::secagg::unmask::{unmask_terms, PublicMember, RevealedShare};
    use gpu_ops::ops::mpc::secagg::UnmaskJob;
    let n = env("BENCH_SECAGG_CLIENTS", 100) as u32;
    let len = 1usize << env("BENCH_SECAGG_LOG2", 20);
    let dropped = n / 10;
    // The floor's rate: one thread, one long stream.
    let mut block = vec![0u8; 64 << 20];
    let stream = time(3, || {
        chacha20::ChaCha20::new(&[7u8; 32].into(), &[0u8; 12].into()).apply_keystream(&mut block)
    });
    let rate = block.len() as f64 / stream.as_secs_f64();
    println!(
        "\n## Secure aggregation: unmasking {n} clients × {len} values, {dropped} dropouts\n\n\
         ChaCha20 (`chacha20` crate) on one thread: {:.2} GB/s; the floor is the masks' \
         stream bytes at that rate on {threads} threads.\n",
        rate / 1e9
    );
    println!("| round | masks | unmask | floor | ratio |");
    println!("|---|---|---|---|---|");
    let round = "sar_bench";
    for (label, k, after_upload) in [
        (
            "everyone's neighbours, dropouts before upload",
            n - 1,
            false,
        ),
        ("SecAgg+ k = 12, dropouts before upload", 12, false),
        ("everyone's neighbours, dropouts after upload", n - 1, true),
    ] {
        let t = k / 2 + 1;
        let config = RoundConfig {
            clients: n,
            threshold: t,
            neighbours: k,
            vector_length: len,
            clip: 1.0,
            scale_bits: 8,
            graph_seed: "5a".repeat(32),
            backend: Default::default(),
        };
        let graph = config.graph();
        let sigma: Vec<Fr> = (0..n).map(|_| random_fr().unwrap()).collect();
        let beta: Vec<Fr> = (0..n).map(|_| random_fr().unwrap()).collect();
        let members: Vec<Member> = (1..=n)
            .map(|id| Member {
                id,
                shared: true,
                uploaded: after_upload || id > dropped,
                unmasked: id > dropped,
            })
            .collect();
        let sets = Sets::of(&members);
        let public: Vec<PublicMember> = (1..=n)
            .map(|id| PublicMember {
                id,
                mask_key: mask_public(round, &sigma[id as usize - 1]),
                self_mask_commitment: Some(self_mask_commitment(round, id, &beta[id as usize - 1])),
            })
            .collect();
        // Every neighbour that stayed reveals its share of each needed secret.
        let mut reveals = Vec::new();
        for (owner, kind) in sets.needed() {
            let holders = graph.neighbours(owner);
            let secret = match kind {
                Secret::SelfMask => beta[owner as usize - 1],
                Secret::MaskKey => sigma[owner as usize - 1],
            };
            let ys = share_secret(secret, t as usize, &holders).unwrap();
            for (&holder, value) in holders.iter().zip(ys) {
                if sets.unmasked.contains(&holder) {
                    reveals.push(RevealedShare {
                        owner,
                        holder,
                        secret: kind,
                        value,
                    });
                }
            }
        }
        let sum: std::sync::Arc<Vec<u32>> = std::sync::Arc::new((0..len as u32).collect());
        let mut masks = 0;
        let unmask = cpu.install(|| {
            time(3, || {
                let terms = unmask_terms(round, &config, &sets, &public, &reveals).unwrap();
                masks = terms.len();
                UnmaskJob::new(sum.clone(), terms).run_cpu()
            })
        });
        let floor = Duration::from_secs_f64((masks * len * 4) as f64 / (rate * threads as f64));
        println!(
            "| {label} | {masks} | {} | {} | {:.2}× |",
            ms(unmask),
            ms(floor),
            unmask.as_secs_f64() / floor.as_secs_f64()
        );
    }
}

/// Feldman commitments (fixed-base multiplications, arkworks' windowed table) and one
/// holder's check (one MSM), at 2^BENCH_FELDMAN_LOG2 coefficients (default 14).
fn feldman(cpu: &gpu_ops::backend::CpuExecutor) {
    use gpu_ops::ops::mpc::feldman::{CommitJob, ShareCheckJob};
    let log_c = env("BENCH_FELDMAN_LOG2", 14);
    let secrets = (1usize << log_c) / T;
    println!("\n## Feldman commitments: {secrets} secrets × t = {T}\n");
    println!("| field | commit | per commitment | verify one share |");
    println!("|---|---|---|---|");
    for field in [Field::Bn254Fr, Field::Bls12_381Fr] {
        let values = FieldVec::from_integers(field, &random_elements(field, secrets, 2)).unwrap();
        let coeffs = Arc::new(dealer_coefficients(
            &values,
            T,
            &NoiseKey::derive(b"bench", 2),
        ));
        let job = CommitJob::new(coeffs.clone()).unwrap();
        let commit = cpu.install(|| time(3, || job.run_cpu()));
        let points = job.run_cpu();
        let share = ShareJob::new(
            coeffs.clone(),
            secrets,
            FieldVec::from_integers(field, &[U256::from_u64(3)]).unwrap(),
        )
        .run_cpu()
        .remove(0);
        let check = ShareCheckJob::new(
            points,
            U256::from_u64(3),
            &share,
            &NoiseKey::from_os().unwrap(),
        )
        .unwrap();
        let verify = cpu.install(|| time(3, || check.run_cpu()));
        assert!(ShareCheckJob::holds(&check.run_cpu()));
        println!(
            "| {} | {} | {:.1} µs | {} |",
            field.name(),
            ms(commit),
            commit.as_secs_f64() * 1e6 / coeffs.len() as f64,
            ms(verify)
        );
    }
}

/// Horner at the five points and Lagrange at 0 from shares `pick`, on arkworks field
/// elements; returns the median times (evaluate, combine).
fn arkworks<F: PrimeField<BigInt = BigInt<4>>>(
    cpu: &gpu_ops::backend::CpuExecutor,
    coeffs: &FieldVec,
    shares: &[FieldVec],
    pick: &[usize],
    m: usize,
) -> (Duration, Duration) {
    let to_f = |v: &FieldVec| -> Vec<F> {
        (0..v.len())
            .map(|i| F::from_bigint(BigInt(v.get(i).0)).unwrap())
            .collect()
    };
    let c = to_f(coeffs);
    let xs: Vec<F> = (1..=N as u64).map(F::from).collect();
    let eval = cpu.install(|| {
        time(3, || {
            xs.iter()
                .map(|&x| {
                    (0..m)
                        .into_par_iter()
                        .map(|j| {
                            (0..T)
                                .rev()
                                .fold(F::zero(), |acc, k| acc * x + c[k * m + j])
                        })
                        .collect::<Vec<F>>()
                })
                .collect::<Vec<_>>()
        })
    });
    let ys: Vec<Vec<F>> = pick.iter().map(|&i| to_f(&shares[i])).collect();
    let px: Vec<F> = pick.iter().map(|&i| xs[i]).collect();
    let combine = cpu.install(|| {
        time(3, || {
            let weights: Vec<F> = (0..px.len())
                .map(|i| {
                    let (num, den) = (0..px.len())
                        .filter(|&l| l != i)
                        .fold((F::one(), F::one()), |(n, d), l| {
                            (n * px[l], d * (px[l] - px[i]))
                        });
                    num * den.inverse().unwrap()
                })
                .collect();
            (0..m)
                .into_par_iter()
                .map(|j| (0..px.len()).map(|i| weights[i] * ys[i][j]).sum::<F>())
                .collect::<Vec<F>>()
        })
    });
    (eval, combine)
}
