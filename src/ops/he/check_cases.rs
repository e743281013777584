//! The he ops under `gpu-ops check`: each op at the level's sizes, with fresh random
//! inputs and edge values, held to its CPU twin; what the report says of each case.
//!
//! Standard: sums of 128 ciphertexts at n = 16384 (`bfv128_n16384`, nine moduli: the
//! largest set the service offers), plain and weighted: 2.3 MB a ciphertext, 302 MB a
//! sum. Quick (the emulated device): five ciphertexts at n = 4096, plain and weighted;
//! their 24 576 residues a ciphertext are three grid strides of the emulated device's
//! 8 192 threads.
//!
//! The first two ciphertexts of a sum are real encryptions (a fresh key, random slot
//! values below t); the rest are uniform residues in NTT form, which is what an
//! encryption looks like to the sum, drawn in parallel, so 128 of them cost no
//! encryption time. Edges: every drawn ciphertext holds q − 1 at residues 0, 1 and n − 1
//! of each row and 0 at residue 2, so the sum wraps at every step there; the weights
//! start with t − 1, 0 and 1.
//!
//! CPU twins at the standard level, on the GPU host's 16 cores, scaled linearly from this
//! 2-core machine (test profile measured here at 16 ciphertexts of n = 16384 under a load
//! of about 5: plain 13–19 ms, weighted 60 ms; docs/PERFORMANCE.md's release figures
//! agree): the plain sum of 128 is one memory-bound pass over 302 MB, about 20–30 ms; the
//! weighted one about 60 ms. Building the inputs (the parameter set, two encryptions, 126
//! drawn ciphertexts, one clone for the second sum) took 1.9 s on 2 cores here, about
//! 0.5 s on 16.

use super::params::PLAINTEXT_MODULUS;
use super::sum::CiphertextSumJob;
use super::ParameterSet;
use crate::backend::measure::{case_seed, CaseInfo, CheckLevel};
use crate::backend::verify::{JobCheck, SelfTest};
use fhe::bfv::{BfvParameters, Ciphertext, Encoding, Plaintext, PublicKey, SecretKey};
use fhe_math::rq::{traits::TryConvertFrom, Poly, Representation};
use fhe_traits::{FheEncoder, FheEncrypter};
use rand::rngs::{SmallRng, StdRng};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::sync::Arc;

/// Real encryptions at the head of every sum.
const ENCRYPTED: usize = 2;

/// `count` fresh ciphertexts of `par`: `ENCRYPTED` real encryptions of random slots
/// under a fresh key, the rest uniform residues in NTT form with the edges the module's
/// comment names.
fn ciphertexts(par: &Arc<BfvParameters>, count: usize, seed: u64) -> Vec<Ciphertext> {
    let mut rng = StdRng::seed_from_u64(seed);
    let sk = SecretKey::random(par, &mut rng);
    let pk = PublicKey::new(&sk, &mut rng);
    let n = par.degree();
    let mut cts: Vec<Ciphertext> = (0..ENCRYPTED.min(count))
        .map(|_| {
            let slots: Vec<u64> = (0..n)
                .map(|_| rng.random_range(0..PLAINTEXT_MODULUS))
                .collect();
            let pt = Plaintext::try_encode(&slots, Encoding::simd(), par).expect("slots below t");
            pk.try_encrypt(&pt, &mut rng).expect("encryption")
        })
        .collect();
    let ctx = &par.context_chain().poly_context;
    let moduli = par.moduli();
    let drawn: Vec<Ciphertext> = (ENCRYPTED..count.max(ENCRYPTED))
        .into_par_iter()
        .map(|k| {
            let mut rng =
                SmallRng::seed_from_u64(seed ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let polys = (0..2)
                .map(|_| {
                    let mut residues = Vec::with_capacity(moduli.len() * n);
                    for &q in moduli {
                        let start = residues.len();
                        residues.extend((0..n).map(|_| rng.random_range(0..q)));
                        for i in [0, 1, n - 1] {
                            residues[start + i] = q - 1;
                        }
                        residues[start + 2] = 0;
                    }
                    Poly::try_convert_from(residues, ctx, false, Representation::Ntt)
                        .expect("L × n residues")
                })
                .collect();
            Ciphertext::new(polys, par).expect("two polynomials in NTT form")
        })
        .collect();
    cts.extend(drawn);
    cts
}

/// The sums of the level: the same ciphertexts plain and weighted (t − 1, 0, 1, then
/// uniform below t).
fn sum_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, CiphertextSumJob)> {
    let (set, count) = level.pick(
        (ParameterSet::Bfv128N4096, 5),
        (ParameterSet::Bfv128N16384, 128),
    );
    let par = set.parameters();
    let cts = ciphertexts(&par, count, seed);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x3E16);
    let weights: Vec<u64> = (0..count)
        .map(|k| match k {
            0 => PLAINTEXT_MODULUS - 1,
            1 => 0,
            2 => 1,
            _ => rng.random_range(0..PLAINTEXT_MODULUS),
        })
        .collect();
    let (n, levels) = (set.degree(), set.moduli().len());
    let per_ct = 2 * levels * n;
    // Every ciphertext read once, the sum written once.
    let bytes = (8 * per_ct * (count + 1)) as f64;
    let shape = format!(
        "{} (n = {n}, L = {levels}): {count} ciphertexts",
        set.name()
    );
    let plain = CiphertextSumJob::new(&par, cts.clone(), None).expect("fresh ciphertexts");
    let weighted = CiphertextSumJob::new(&par, cts, Some(weights)).expect("fresh ciphertexts");
    vec![
        (
            CaseInfo::labelled(format!("{shape}, plain sum")).with_bytes(bytes),
            plain,
        ),
        (
            CaseInfo::labelled(format!(
                "{shape}, weighted (weights below {PLAINTEXT_MODULUS})"
            ))
            .with_bytes(bytes),
            weighted,
        ),
    ]
}

pub(crate) fn check_cases(level: CheckLevel) -> Vec<Box<dyn SelfTest>> {
    vec![JobCheck::described(sum_cases(level, case_seed()))]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Job;

    #[test]
    fn quick_cases_are_of_their_op_and_agree_with_their_own_cpu_output() {
        let ops: Vec<&str> = check_cases(CheckLevel::Quick)
            .iter()
            .map(|t| t.op())
            .collect();
        assert_eq!(ops, ["he_aggregate"]);
        let cases = sum_cases(CheckLevel::Quick, 3);
        assert_eq!(cases.len(), 2);
        for (info, job) in &cases {
            assert_eq!(job.name(), "he_aggregate", "{}", info.label);
            assert!(info.bytes.is_some_and(|b| b > 0.0));
            // Three grid strides of the emulated device's 8 192 threads.
            assert_eq!(job.per_ciphertext(), 3 * 8_192);
            let out = job.run_cpu();
            job.agrees(&out, &job.run_cpu()).expect(&info.label);
        }
        // The drawn ciphertexts carry the edges; the real ones do not by construction.
        let (_, plain) = &cases[0];
        let q = plain.moduli()[0];
        assert_eq!(plain.residues(ENCRYPTED, 0)[..3], [q - 1, q - 1, 0]);
        assert_eq!(plain.residues(ENCRYPTED, 0)[4095], q - 1);
        assert_eq!(
            cases[1].1.weights().unwrap()[..3],
            [PLAINTEXT_MODULUS - 1, 0, 1]
        );
    }

    /// The twin equals fhe.rs's own `+` on the mixed ciphertexts (real and drawn), so
    /// the drawn ones are ciphertexts the crate takes.
    #[test]
    fn drawn_ciphertexts_sum_as_the_crate_sums_them() {
        let par = ParameterSet::Bfv128N4096.parameters();
        let cts = ciphertexts(&par, 4, 11);
        let mut crate_sum = cts[0].clone();
        for ct in &cts[1..] {
            crate_sum += ct;
        }
        let flat: Vec<u64> = crate_sum
            .iter()
            .flat_map(|p| p.coefficients().iter().copied().collect::<Vec<_>>())
            .collect();
        let job = CiphertextSumJob::new(&par, cts, None).unwrap();
        assert!(job.run_cpu() == flat);
    }

    /// Builds the standard cases (about 600 MB of ciphertexts; no CPU twin runs) and
    /// checks the production size.
    #[test]
    fn standard_cases_build_at_production_sizes() {
        let cases = sum_cases(CheckLevel::Standard, 5);
        assert_eq!(cases.len(), 2);
        for (info, job) in &cases {
            assert_eq!(job.name(), "he_aggregate");
            assert_eq!((job.degree(), job.moduli().len()), (16384, 9));
            assert_eq!(job.count(), 128);
            assert_eq!(job.size(), 128 * 2 * 9 * 16384, "{}", info.label);
        }
        assert_eq!(
            cases[0].0.label,
            "bfv128_n16384 (n = 16384, L = 9): 128 ciphertexts, plain sum"
        );
    }
}
