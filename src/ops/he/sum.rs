//! The sum of K ciphertexts of one parameter set, as the kernel computes it: each
//! ciphertext's 2 × L × n residues (component, RNS row, NTT coefficient), read from the
//! crate's in-memory form, summed per residue mod the row's modulus, each first
//! multiplied by its weight where given.

use crate::backend::{DeviceError, DeviceLease, Job};
use fhe::bfv::{BfvParameters, Ciphertext};
use fhe_math::rq::{traits::TryConvertFrom, Poly, Representation};
use rayon::prelude::*;
use std::sync::Arc;

/// Why a decoded ciphertext is not one the sum (or decryption) takes. fhe.rs's decoder
/// accepts any representation and any residue the bit width allows; its arithmetic then
/// asserts (a panic) or computes garbage, so these are checked first.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Unfit {
    #[error("{0} polynomials: only fresh (2-polynomial) ciphertexts are taken")]
    Polynomials(usize),
    #[error("not at the top level of its parameter set (all its moduli)")]
    Level,
    #[error("a polynomial not in NTT form, as encryption leaves it")]
    NotNtt,
    #[error("a residue at or above its modulus")]
    NotCanonical,
}

/// A fresh ciphertext of the set with `moduli` and degree n: 2 polynomials at the top
/// level, in NTT form, coefficients in standard layout, every residue below its modulus
/// (the kernel and the twin add residues below q without a wider type).
pub fn check_fresh(ct: &Ciphertext, moduli: &[u64], degree: usize) -> Result<(), Unfit> {
    if ct.len() != 2 {
        return Err(Unfit::Polynomials(ct.len()));
    }
    for poly in ct.iter() {
        if poly.ctx().moduli() != moduli {
            return Err(Unfit::Level);
        }
        if *poly.representation() != Representation::Ntt {
            return Err(Unfit::NotNtt);
        }
        let coefficients = poly.coefficients();
        let Some(all) = coefficients.to_slice() else {
            return Err(Unfit::NotNtt);
        };
        for (row, &q) in all.chunks_exact(degree).zip(moduli) {
            if row.iter().any(|&x| x >= q) {
                return Err(Unfit::NotCanonical);
            }
        }
    }
    Ok(())
}

pub struct CiphertextSumJob {
    /// The decoded ciphertexts themselves, read in place (no copy into one buffer): each
    /// is 2 polynomials at the top level, coefficients in standard layout, every residue
    /// below its modulus (`SumBuilder::push` checks).
    cts: Arc<Vec<Ciphertext>>,
    moduli: Arc<Vec<u64>>,
    weights: Option<Arc<Vec<u64>>>,
    degree: usize,
}

/// Gathers checked ciphertexts one at a time, so a request's base64 can be dropped as each
/// is decoded.
pub struct SumBuilder {
    cts: Vec<Ciphertext>,
    moduli: Vec<u64>,
    degree: usize,
}

impl SumBuilder {
    /// Room for `capacity` ciphertexts of `params` at its top level.
    pub fn new(params: &BfvParameters, capacity: usize) -> Self {
        Self {
            cts: Vec::with_capacity(capacity),
            moduli: params.moduli().to_vec(),
            degree: params.degree(),
        }
    }

    /// Takes a fresh ciphertext (2 polynomials in NTT form at the top level, every
    /// residue below its modulus), decoded with the set's `Arc`.
    pub fn push(&mut self, ct: Ciphertext) -> Result<(), Unfit> {
        check_fresh(&ct, &self.moduli, self.degree)?;
        self.cts.push(ct);
        Ok(())
    }

    /// The job over every ciphertext pushed, with one weight each where given.
    pub fn finish(self, weights: Option<Vec<u64>>) -> CiphertextSumJob {
        CiphertextSumJob {
            cts: Arc::new(self.cts),
            moduli: Arc::new(self.moduli),
            weights: weights.map(Arc::new),
            degree: self.degree,
        }
    }
}

impl CiphertextSumJob {
    /// The job over `cts` (see `SumBuilder::push` for what each must be).
    pub fn new(
        params: &BfvParameters,
        cts: Vec<Ciphertext>,
        weights: Option<Vec<u64>>,
    ) -> Result<Self, Unfit> {
        let mut sum = SumBuilder::new(params, cts.len());
        for ct in cts {
            sum.push(ct)?;
        }
        Ok(sum.finish(weights))
    }

    /// Residues per ciphertext: 2 components × L moduli × n.
    pub fn per_ciphertext(&self) -> usize {
        2 * self.moduli.len() * self.degree
    }

    /// Row `row` (component row / L, modulus row % L) of ciphertext `k`: n residues.
    pub fn residues(&self, k: usize, row: usize) -> &[u64] {
        let (levels, n) = (self.moduli.len(), self.degree);
        let all = self.cts[k][row / levels]
            .coefficients()
            .to_slice()
            .expect("standard layout, checked by SumBuilder::push");
        &all[(row % levels) * n..(row % levels + 1) * n]
    }

    /// Ciphertexts `range`, ciphertext after ciphertext, into `out` (of exactly their
    /// `per_ciphertext` residues each): the kernel's layout.
    pub fn write_rows(&self, range: std::ops::Range<usize>, out: &mut [u64]) {
        let n = self.degree;
        let rows = range.flat_map(|k| (0..2 * self.moduli.len()).map(move |row| (k, row)));
        for ((k, row), into) in rows.zip(out.chunks_exact_mut(n)) {
            into.copy_from_slice(self.residues(k, row));
        }
    }

    pub fn moduli(&self) -> &[u64] {
        &self.moduli
    }

    pub fn weights(&self) -> Option<&[u64]> {
        self.weights.as_deref().map(|w| w.as_slice())
    }

    pub fn degree(&self) -> usize {
        self.degree
    }

    pub fn count(&self) -> usize {
        self.cts.len()
    }

    /// The summed residues back as a ciphertext of `params`.
    pub fn to_ciphertext(sum: &[u64], params: &Arc<BfvParameters>) -> Result<Ciphertext, String> {
        let ctx = &params.context_chain().poly_context;
        let half = sum.len() / 2;
        let polys = [&sum[..half], &sum[half..]]
            .into_iter()
            .map(|part| {
                Poly::try_convert_from(part.to_vec(), ctx, false, Representation::Ntt)
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ciphertext::new(polys, params).map_err(|e| e.to_string())
    }
}

/// Shoup's precomputed quotient ⌊w · 2^64 / q⌋ of a weight w < q: with it a product
/// x · w mod q takes two multiplications and no division (`mul_shoup`).
pub fn shoup(w: u64, q: u64) -> u64 {
    ((u128::from(w) << 64) / u128::from(q)) as u64
}

/// x · w mod q for x, w < q < 2^63, given w' = `shoup(w, q)`. The estimate ⌊x·w'/2^64⌋
/// of ⌊x·w/q⌋ is low by at most one, so one conditional subtraction finishes it;
/// `kernels/he.cu` computes the same.
fn mul_shoup(x: u64, w: u64, w_shoup: u64, q: u64) -> u64 {
    let estimate = ((u128::from(x) * u128::from(w_shoup)) >> 64) as u64;
    let r = x.wrapping_mul(w).wrapping_sub(estimate.wrapping_mul(q));
    if r >= q {
        r - q
    } else {
        r
    }
}

/// acc[i] = acc[i] + x[i] mod q, for residues below q.
fn add_into(acc: &mut [u64], x: impl Iterator<Item = u64>, q: u64) {
    for (a, v) in acc.iter_mut().zip(x) {
        let s = *a + v;
        *a = if s >= q { s - q } else { s };
    }
}

impl Job for CiphertextSumJob {
    type Output = Vec<u64>;

    fn name(&self) -> &'static str {
        "he_aggregate"
    }

    /// Residues in all: what the GPU threshold counts.
    fn size(&self) -> usize {
        self.count() * self.per_ciphertext()
    }

    fn input_bytes(&self) -> usize {
        self.size() * 8
    }

    /// A few million residues: 15 ciphertexts at n = 16384.
    fn gpu_threshold(&self) -> usize {
        1 << 22
    }

    fn run_cpu(&self) -> Vec<u64> {
        let per_ct = self.per_ciphertext();
        let (n, levels) = (self.degree, self.moduli.len());
        let mut out = vec![0u64; per_ct];
        out.par_chunks_mut(n).enumerate().for_each(|(row, acc)| {
            let q = self.moduli[row % levels];
            for k in 0..self.count() {
                let x = self.residues(k, row);
                match self.weights.as_ref().map(|w| w[k]) {
                    None | Some(1) => add_into(acc, x.iter().copied(), q),
                    Some(w) => {
                        let w_shoup = shoup(w, q);
                        add_into(acc, x.iter().map(|&v| mul_shoup(v, w, w_shoup, q)), q);
                    }
                }
            }
        });
        out
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Vec<u64>, DeviceError> {
        super::gpu::launch_sum(self, dev)
    }

    fn agrees(&self, device: &Vec<u64>, cpu: &Vec<u64>) -> Result<(), String> {
        match device.iter().zip(cpu).position(|(a, b)| a != b) {
            None if device.len() == cpu.len() => Ok(()),
            None => Err(format!("{} residues, expected {}", device.len(), cpu.len())),
            Some(i) => Err(format!("residue {i}: device {}, CPU {}", device[i], cpu[i])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::he::ParameterSet;
    use fhe::bfv::{Encoding, Plaintext, PublicKey, SecretKey};
    use fhe_traits::{FheDecoder, FheDecrypter, FheEncoder, FheEncrypter};

    #[test]
    fn the_twin_equals_the_crates_sum_and_weighted_sum() {
        let set = ParameterSet::Bfv128N4096;
        let par = set.parameters();
        let mut rng = rand::rng();
        let sk = SecretKey::random(&par, &mut rng);
        let pk = PublicKey::new(&sk, &mut rng);
        let values: Vec<Vec<u64>> = (0..5u64)
            .map(|k| (0..4096u64).map(|i| (i * (k + 3)) % 1000).collect())
            .collect();
        let cts: Vec<Ciphertext> = values
            .iter()
            .map(|v| {
                let pt = Plaintext::try_encode(v, Encoding::simd(), &par).unwrap();
                pk.try_encrypt(&pt, &mut rng).unwrap()
            })
            .collect();
        let plain = CiphertextSumJob::new(&par, cts.clone(), None)
            .unwrap()
            .run_cpu();
        let mut crate_sum = cts[0].clone();
        for ct in &cts[1..] {
            crate_sum += ct;
        }
        let flat: Vec<u64> = crate_sum
            .iter()
            .flat_map(|p| p.coefficients().iter().copied().collect::<Vec<_>>())
            .collect();
        assert!(plain == flat, "bit for bit the crate's +");
        let weights = vec![1, 2, 3, 65536, 7];
        let weighted = CiphertextSumJob::new(&par, cts.clone(), Some(weights.clone()))
            .unwrap()
            .run_cpu();
        // The crate's weighted sum: each ciphertext times the plaintext whose every slot
        // is its weight (the constant polynomial w), then added.
        let scaled = |k: usize| {
            let w = Plaintext::try_encode(&vec![weights[k]; 4096], Encoding::simd(), &par).unwrap();
            &cts[k] * &w
        };
        let mut crate_weighted = scaled(0);
        for k in 1..cts.len() {
            crate_weighted += &scaled(k);
        }
        let flat: Vec<u64> = crate_weighted
            .iter()
            .flat_map(|p| p.coefficients().iter().copied().collect::<Vec<_>>())
            .collect();
        assert!(
            weighted == flat,
            "bit for bit the crate's × plaintext and +"
        );
        let ct = CiphertextSumJob::to_ciphertext(&weighted, &par).unwrap();
        let got = Vec::<u64>::try_decode(&sk.try_decrypt(&ct).unwrap(), Encoding::simd()).unwrap();
        for i in 0..4096 {
            let want = (0..5).map(|k| weights[k] * values[k][i]).sum::<u64>() % 65537;
            assert_eq!(got[i], want, "slot {i}");
        }
    }

    #[test]
    fn shoup_products_equal_division() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for set in ParameterSet::ALL {
            for &q in set.moduli() {
                for w in [0, 1, 2, 65535, 65536] {
                    let ws = shoup(w, q);
                    for v in [0, 1, q - 1, q / 2] {
                        assert_eq!(
                            mul_shoup(v, w, ws, q),
                            ((v as u128 * w as u128) % q as u128) as u64
                        );
                    }
                    for _ in 0..1000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let v = x % q;
                        assert_eq!(
                            mul_shoup(v, w, ws, q),
                            ((v as u128 * w as u128) % q as u128) as u64
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_residue_at_its_modulus_is_refused() {
        let set = ParameterSet::Bfv128N4096;
        let par = set.parameters();
        let mut rng = rand::rng();
        let pk = PublicKey::new(&SecretKey::random(&par, &mut rng), &mut rng);
        let pt = Plaintext::try_encode(&[1u64], Encoding::simd(), &par).unwrap();
        let good = pk.try_encrypt(&pt, &mut rng).unwrap();
        let mut residues: Vec<u64> = good[1].coefficients().iter().copied().collect();
        residues[4096 + 5] = set.moduli()[1];
        let bad_poly =
            Poly::try_convert_from(residues, good[1].ctx(), false, Representation::Ntt).unwrap();
        let bad = Ciphertext::new(vec![good[0].clone(), bad_poly], &par).unwrap();
        assert_eq!(
            CiphertextSumJob::new(&par, vec![good, bad], None).err(),
            Some(Unfit::NotCanonical)
        );
    }

    /// The most noise `/he/aggregate` admits, on the set with the least room for it: one
    /// ciphertext 1024 times (its noise adds up coherently, the worst case), each with
    /// the largest weight, t − 1. Summed as 32 copies weighted t − 1, then 32 copies of
    /// that sum: the same residues as the one request. It must still decrypt.
    #[test]
    fn the_largest_admitted_weighted_sum_decrypts() {
        let set = ParameterSet::Bfv128N4096;
        let par = set.parameters();
        let mut rng = rand::rng();
        let sk = SecretKey::random(&par, &mut rng);
        let pk = PublicKey::new(&sk, &mut rng);
        let values: Vec<u64> = (0..4096u64).map(|i| (i * 7919 + 65000) % 65537).collect();
        let pt = Plaintext::try_encode(&values, Encoding::simd(), &par).unwrap();
        let ct = pk.try_encrypt(&pt, &mut rng).unwrap();
        let copies = vec![ct.clone(); 32];
        let weighted = CiphertextSumJob::new(&par, copies.clone(), Some(vec![65536; 32]))
            .unwrap()
            .run_cpu();
        let partial = CiphertextSumJob::to_ciphertext(&weighted, &par).unwrap();
        let copies = vec![partial; 32];
        let total = CiphertextSumJob::new(&par, copies.clone(), None)
            .unwrap()
            .run_cpu();
        let total = CiphertextSumJob::to_ciphertext(&total, &par).unwrap();
        let got =
            Vec::<u64>::try_decode(&sk.try_decrypt(&total).unwrap(), Encoding::simd()).unwrap();
        for (i, (&g, &v)) in got.iter().zip(&values).enumerate() {
            assert_eq!(g, 1024 * 65536 * v % 65537, "slot {i}");
        }
        // SAFETY: `measure_noise` is `unsafe` because it leaks the noise; a test key.
        let bits = unsafe { sk.measure_noise(&total) }.unwrap();
        // Decryption holds while the noise stays under Δ/2 ≈ q/(2t): 2^92 here.
        eprintln!("noise after the largest sum: {bits} bits of at most 92");
        assert!(bits < 80, "{bits} bits of noise: too little margin");
    }
}
