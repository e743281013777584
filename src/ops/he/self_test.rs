//! The ciphertext sum's self-test: real ciphertexts of the smallest set, summed plain and
//! weighted (with the largest weight, t − 1).

use super::sum::CiphertextSumJob;
use super::ParameterSet;
use crate::backend::verify::{JobCheck, SelfTest};
use fhe::bfv::{Encoding, Plaintext, PublicKey, SecretKey};
use fhe_traits::{FheEncoder, FheEncrypter};

pub(crate) fn self_tests() -> Vec<Box<dyn SelfTest>> {
    let par = ParameterSet::Bfv128N4096.parameters();
    let mut rng = rand::rng();
    let sk = SecretKey::random(&par, &mut rng);
    let pk = PublicKey::new(&sk, &mut rng);
    let cts: Vec<_> = (0..3u64)
        .map(|k| {
            let v: Vec<u64> = (0..4096u64)
                .map(|i| (i * 31 + k) % super::params::PLAINTEXT_MODULUS)
                .collect();
            let pt = Plaintext::try_encode(&v, Encoding::simd(), &par).expect("values below t");
            pk.try_encrypt(&pt, &mut rng).expect("encryption")
        })
        .collect();
    let jobs = vec![
        CiphertextSumJob::new(&par, cts.clone(), None).expect("fresh ciphertexts"),
        CiphertextSumJob::new(
            &par,
            cts.clone(),
            Some(vec![1, 2, super::params::PLAINTEXT_MODULUS - 1]),
        )
        .expect("fresh ciphertexts"),
    ];
    vec![JobCheck::boxed(jobs)]
}
