//! `cargo bench --bench he`: the aggregation of BENCH_HE_COUNT (default 100) BFV
//! ciphertexts of each parameter set through the service's CPU twin, per ciphertext,
//! against fhe.rs's own arithmetic on the same ciphertexts in the same process (the
//! issue's reference): `+=` for the plain sum, and `× plaintext` (every slot the weight)
//! then `+=` for the weighted one. The twin is timed on one
//! thread (as the crate's loop runs) and on every thread, and beside what a request adds
//! per ciphertext before it: decoding the crate's serialisation.

mod common;

use common::{env, time};
use fhe::bfv::{Ciphertext, Encoding, Plaintext, PublicKey, SecretKey};
use fhe_traits::{DeserializeParametrized, FheEncoder, FheEncrypter, Serialize};
use gpu_ops::backend::{CpuExecutor, Job};
use gpu_ops::ops::he::{CiphertextSumJob, ParameterSet};
use std::time::Duration;

fn per(d: Duration, count: usize) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6 / count as f64)
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let all = CpuExecutor::new(threads).unwrap();
    let one = CpuExecutor::new(1).unwrap();
    let count = env("BENCH_HE_COUNT", 100).max(2);
    println!(
        "# gpu-ops ciphertext aggregation, CPU: {} ({threads} threads), {count} ciphertexts, per ciphertext\n",
        all.info.model
    );
    println!("| set | bytes | crate `+=` | twin, 1 thread | ratio | twin, {threads} threads | decode (1 thread) | crate `× pt` + `+=` | weighted twin, 1 thread | ratio |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for set in ParameterSet::ALL {
        let par = set.parameters();
        let mut rng = rand::rng();
        let pk = PublicKey::new(&SecretKey::random(&par, &mut rng), &mut rng);
        let n = set.degree();
        let cts: Vec<Ciphertext> = (0..count as u64)
            .map(|k| {
                let v: Vec<u64> = (0..n as u64).map(|i| (i * 31 + k) % 65537).collect();
                let pt = Plaintext::try_encode(&v, Encoding::simd(), &par).unwrap();
                pk.try_encrypt(&pt, &mut rng).unwrap()
            })
            .collect();
        let weights: Vec<u64> = (0..count as u64).map(|k| 1 + k * 655).collect();
        let weight_pts: Vec<Plaintext> = weights
            .iter()
            .map(|&w| Plaintext::try_encode(&vec![w; n], Encoding::simd(), &par).unwrap())
            .collect();

        let crate_sum = time(3, || {
            let mut acc = cts[0].clone();
            for ct in &cts[1..] {
                acc += ct;
            }
            acc
        });
        let crate_weighted = time(3, || {
            let mut acc = &cts[0] * &weight_pts[0];
            for (ct, w) in cts.iter().zip(&weight_pts).skip(1) {
                acc += &(ct * w);
            }
            acc
        });
        let plain = CiphertextSumJob::new(&par, cts.clone(), None).unwrap();
        let weighted = CiphertextSumJob::new(&par, cts.clone(), Some(weights.clone())).unwrap();
        let twin_one = one.install(|| time(3, || plain.run_cpu()));
        let twin_all = all.install(|| time(3, || plain.run_cpu()));
        // What a request adds per ciphertext before the sum: fhe.rs's decoding (the bytes
        // hold the coefficients; decoding runs the forward NTT of both polynomials).
        let bytes: Vec<Vec<u8>> = cts.iter().map(|ct| ct.to_bytes()).collect();
        let decode = time(3, || {
            bytes
                .iter()
                .map(|b| Ciphertext::from_bytes(b, &par).unwrap())
                .collect::<Vec<_>>()
        });
        let weighted_one = one.install(|| time(3, || weighted.run_cpu()));
        let ratio = |a: Duration, b: Duration| format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64());
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            set.name(),
            cts[0].to_bytes().len(),
            per(crate_sum, count),
            per(twin_one, count),
            ratio(twin_one, crate_sum),
            per(twin_all, count),
            per(decode, count),
            per(crate_weighted, count),
            per(weighted_one, count),
            ratio(weighted_one, crate_weighted),
        );
    }
    println!("\nratio: the twin's time over the crate's (below 1: the twin is faster).");
}
