//! Homomorphic ciphertext sums: bit for bit.

use super::on_every_device;
use fhe::bfv::{Encoding, Plaintext, PublicKey, SecretKey};
use fhe_traits::{FheEncoder, FheEncrypter};
use gpu_ops::ops::he::{CiphertextSumJob, ParameterSet};

/// Plain and weighted sums; then, with room for about three ciphertexts of 192 KiB beside
/// the running sum and the output, the five summed in passes, each pass starting from the
/// last's sum.
#[test]
fn he_ciphertext_sum_is_bit_identical_to_the_cpu() {
    let par = ParameterSet::Bfv128N4096.parameters();
    let mut rng = rand::rng();
    let sk = SecretKey::random(&par, &mut rng);
    let pk = PublicKey::new(&sk, &mut rng);
    let cts: Vec<_> = (0..5u64)
        .map(|k| {
            let v: Vec<u64> = (0..4096u64).map(|i| (i ^ k) % 65537).collect();
            pk.try_encrypt(
                &Plaintext::try_encode(&v, Encoding::simd(), &par).unwrap(),
                &mut rng,
            )
            .unwrap()
        })
        .collect();
    on_every_device("he_ciphertext_sum_is_bit_identical_to_the_cpu", |d| {
        for weights in [None, Some(vec![1, 65536, 3, 1, 40000])] {
            let job = CiphertextSumJob::new(&par, cts.clone(), weights.clone()).unwrap();
            d.check(format!("sum, weights {weights:?}"), &job);
        }
        d.in_passes(1 << 20, |d| {
            let weights = Some(vec![2, 1, 65536, 5, 9]);
            let job = CiphertextSumJob::new(&par, cts.clone(), weights).unwrap();
            d.check("sum in passes", &job);
        });
    });
}
