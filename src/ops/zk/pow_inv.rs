//! Element-wise exponentiation and batch inversion: the CPU twins of the `*_pow` and
//! `*_inv` kernels in `kernels/field_ops.cu`.

use super::field::{FieldVec, BABYBEAR_P, GOLDILOCKS_P};
use super::u256::U256;
use super::vector_ops::{babybear, goldilocks, Fp};
use crate::backend::{DeviceError, DeviceLease, Job};
use ark_ff::{BigInt, Field as _, MontConfig, PrimeField};
use rayon::prelude::*;

/// Chunk of one Montgomery-trick pass on the CPU: one inversion per chunk, chunks in
/// parallel.
const INV_CHUNK: usize = 4096;
/// Zero elements reported at most, as for malformed elements.
const MAX_REPORTED: usize = 16;

/// `base[i] ^ exponent[i]` (or one exponent for all), exponents any 256-bit integer.
#[derive(Clone, Debug)]
pub struct FieldPowJob {
    base: FieldVec,
    exponents: Vec<U256>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PowShape {
    #[error("base is empty: give at least one element")]
    Empty,
    #[error(
        "base has {base} elements and exponent {exponent}: give as many exponents, or exactly one"
    )]
    Lengths { base: usize, exponent: usize },
}

impl PowShape {
    /// A base of `base` elements takes as many exponents, or one for all.
    pub fn check(base: usize, exponents: usize) -> Result<(), PowShape> {
        if base == 0 {
            return Err(PowShape::Empty);
        }
        if exponents != base && exponents != 1 {
            return Err(PowShape::Lengths {
                base,
                exponent: exponents,
            });
        }
        Ok(())
    }
}

impl FieldPowJob {
    pub fn new(base: FieldVec, exponents: Vec<U256>) -> Result<Self, PowShape> {
        PowShape::check(base.len(), exponents.len())?;
        Ok(Self { base, exponents })
    }

    pub fn base(&self) -> &FieldVec {
        &self.base
    }

    pub fn exponents(&self) -> &[U256] {
        &self.exponents
    }

    pub fn len(&self) -> usize {
        self.base.len()
    }

    pub fn is_empty(&self) -> bool {
        self.base.is_empty()
    }

    pub fn is_broadcast(&self) -> bool {
        self.exponents.len() != self.base.len()
    }

    pub fn input_bytes(&self) -> usize {
        self.base.byte_len() + 32 * self.exponents.len()
    }

    pub fn run_cpu(&self) -> FieldVec {
        let exp = |i: usize| &self.exponents[if self.is_broadcast() { 0 } else { i }];
        match &self.base {
            FieldVec::Bn254Fr(b) => FieldVec::Bn254Fr(fp256_pow::<ark_bn254::FrConfig>(b, exp)),
            FieldVec::Bls12_381Fr(b) => {
                FieldVec::Bls12_381Fr(fp256_pow::<ark_bls12_381::FrConfig>(b, exp))
            }
            FieldVec::Goldilocks(b) => FieldVec::Goldilocks(
                b.par_iter()
                    .enumerate()
                    .with_min_len(1024)
                    .map(|(i, &x)| goldilocks_pow(x, exp(i)))
                    .collect(),
            ),
            FieldVec::BabyBear(b) => FieldVec::BabyBear(
                b.par_iter()
                    .enumerate()
                    .with_min_len(1024)
                    .map(|(i, &x)| babybear_pow(x, exp(i)))
                    .collect(),
            ),
        }
    }
}

fn fp256_pow<'a, C: MontConfig<4>>(
    b: &[[u64; 4]],
    exp: impl Fn(usize) -> &'a U256 + Sync,
) -> Vec<[u64; 4]> {
    b.par_iter()
        .enumerate()
        .with_min_len(256)
        .map(|(i, x)| {
            let x = Fp::<C>::from_bigint(BigInt(*x)).expect("canonical by construction");
            x.pow(exp(i).0).into_bigint().0
        })
        .collect()
}

fn babybear_pow(x: u32, e: &U256) -> u32 {
    let mut acc = 1u32;
    for i in (0..256).rev() {
        acc = babybear::mul(acc, acc);
        if (e.0[i / 64] >> (i % 64)) & 1 == 1 {
            acc = babybear::mul(acc, x);
        }
    }
    acc
}

/// Square-and-multiply from the top bit, through the u128 arithmetic of the Goldilocks
/// twin; 0^0 = 1.
fn goldilocks_pow(x: u64, e: &U256) -> u64 {
    let mut acc = 1u64;
    for i in (0..256).rev() {
        acc = goldilocks::mul(acc, acc);
        if (e.0[i / 64] >> (i % 64)) & 1 == 1 {
            acc = goldilocks::mul(acc, x);
        }
    }
    acc
}

/// Element-wise inverses of a vector with no zero.
#[derive(Clone, Debug)]
pub struct FieldInvJob {
    values: FieldVec,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvError {
    Empty,
    /// Indices of zero elements (the first `MAX_REPORTED`) and how many there are.
    Zeros {
        indices: Vec<usize>,
        count: usize,
    },
}

impl InvError {
    /// Why `values` cannot be inverted, if they cannot: empty, or with zeros.
    pub fn check(values: &FieldVec) -> Result<(), InvError> {
        if values.is_empty() {
            return Err(InvError::Empty);
        }
        let (mut indices, mut count) = (Vec::new(), 0);
        for i in (0..values.len()).filter(|&i| values.is_zero(i)) {
            count += 1;
            if indices.len() < MAX_REPORTED {
                indices.push(i);
            }
        }
        if count > 0 {
            return Err(InvError::Zeros { indices, count });
        }
        Ok(())
    }
}

impl FieldInvJob {
    pub fn new(values: FieldVec) -> Result<Self, InvError> {
        InvError::check(&values)?;
        Ok(Self { values })
    }

    pub fn values(&self) -> &FieldVec {
        &self.values
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn input_bytes(&self) -> usize {
        self.values.byte_len()
    }

    pub fn run_cpu(&self) -> FieldVec {
        match &self.values {
            FieldVec::Bn254Fr(v) => FieldVec::Bn254Fr(fp256_inv::<ark_bn254::FrConfig>(v)),
            FieldVec::Bls12_381Fr(v) => {
                FieldVec::Bls12_381Fr(fp256_inv::<ark_bls12_381::FrConfig>(v))
            }
            FieldVec::Goldilocks(v) => FieldVec::Goldilocks(
                v.par_chunks(INV_CHUNK)
                    .flat_map_iter(|c| {
                        word_batch_inv(c, 1, goldilocks::mul, |x| {
                            goldilocks_pow(x, &U256::from_u64(GOLDILOCKS_P - 2))
                        })
                    })
                    .collect(),
            ),
            FieldVec::BabyBear(v) => FieldVec::BabyBear(
                v.par_chunks(INV_CHUNK)
                    .flat_map_iter(|c| {
                        word_batch_inv(c, 1, babybear::mul, |x| {
                            babybear_pow(x, &U256::from_u64(u64::from(BABYBEAR_P - 2)))
                        })
                    })
                    .collect(),
            ),
        }
    }
}

fn fp256_inv<C: MontConfig<4>>(v: &[[u64; 4]]) -> Vec<[u64; 4]> {
    v.par_chunks(INV_CHUNK)
        .flat_map_iter(|c| {
            let mut f: Vec<Fp<C>> = c
                .iter()
                .map(|x| Fp::<C>::from_bigint(BigInt(*x)).expect("canonical"))
                .collect();
            ark_ff::batch_inversion(&mut f);
            f.into_iter().map(|x| x.into_bigint().0)
        })
        .collect()
}

/// Montgomery's trick over a one-word field: prefix products, one inversion, back
/// substitution.
fn word_batch_inv<T: Copy + Default>(
    c: &[T],
    one: T,
    mul: fn(T, T) -> T,
    invert: impl Fn(T) -> T,
) -> Vec<T> {
    let mut prefix = Vec::with_capacity(c.len());
    let mut acc = one;
    for &x in c {
        acc = mul(acc, x);
        prefix.push(acc);
    }
    let mut inv = invert(acc);
    let mut out = vec![T::default(); c.len()];
    for i in (1..c.len()).rev() {
        out[i] = mul(inv, prefix[i - 1]);
        inv = mul(inv, c[i]);
    }
    out[0] = inv;
    out
}

impl Job for FieldPowJob {
    type Output = FieldVec;

    fn name(&self) -> &'static str {
        "field_pow"
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.base.field().name().into()
    }

    fn size(&self) -> usize {
        self.len()
    }

    fn input_bytes(&self) -> usize {
        FieldPowJob::input_bytes(self)
    }

    /// 256 squarings per element: compute-bound from small sizes on.
    fn gpu_threshold(&self) -> usize {
        1 << 10
    }

    fn run_cpu(&self) -> FieldVec {
        FieldPowJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<FieldVec, DeviceError> {
        super::gpu::launch_field_pow(self, dev)
    }

    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        crate::backend::verify::exactly(device, cpu)
    }
}

impl Job for FieldInvJob {
    type Output = FieldVec;

    fn name(&self) -> &'static str {
        "field_inv"
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.values.field().name().into()
    }

    fn size(&self) -> usize {
        self.len()
    }

    fn input_bytes(&self) -> usize {
        FieldInvJob::input_bytes(self)
    }

    fn gpu_threshold(&self) -> usize {
        1 << 14
    }

    fn run_cpu(&self) -> FieldVec {
        FieldInvJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<FieldVec, DeviceError> {
        super::gpu::launch_field_inv(self, dev)
    }

    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        crate::backend::verify::exactly(device, cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::zk::samples::{edge_values, random_elements};
    use crate::ops::zk::Field;

    #[test]
    fn inverses_multiply_to_one() {
        use crate::ops::zk::{FieldBinaryJob, FieldOp};
        for field in Field::ALL {
            let mut xs: Vec<U256> = edge_values(field)
                .into_iter()
                .filter(|v| *v != U256::ZERO)
                .collect();
            xs.extend(
                random_elements(field, 10_000, 5)
                    .into_iter()
                    .filter(|v| *v != U256::ZERO),
            );
            let v = FieldVec::from_integers(field, &xs).unwrap();
            let inv = FieldInvJob::new(v.clone()).unwrap().run_cpu();
            let product = FieldBinaryJob::new(FieldOp::Mul, v, inv).unwrap().run_cpu();
            assert!(
                (0..xs.len()).all(|i| product.get(i) == U256::from_u64(1)),
                "{field:?}"
            );
        }
    }

    #[test]
    fn batch_inversion_matches_element_wise_inversion() {
        let xs: Vec<U256> = random_elements(Field::Bls12_381Fr, 5000, 8);
        let v = FieldVec::from_integers(Field::Bls12_381Fr, &xs).unwrap();
        let FieldVec::Bls12_381Fr(inv) = FieldInvJob::new(v).unwrap().run_cpu() else {
            unreachable!()
        };
        for (x, i) in xs.iter().zip(inv) {
            let x = ark_bls12_381::Fr::from_bigint(BigInt(x.0)).unwrap();
            assert_eq!(x.inverse().unwrap().into_bigint().0, i);
        }
    }

    #[test]
    fn zeros_are_refused_with_their_indices() {
        let v = FieldVec::from_integers(
            Field::Goldilocks,
            &[U256::from_u64(3), U256::ZERO, U256::from_u64(1), U256::ZERO],
        )
        .unwrap();
        assert_eq!(
            FieldInvJob::new(v).unwrap_err(),
            InvError::Zeros {
                indices: vec![1, 3],
                count: 2
            }
        );
    }

    #[test]
    fn pow_agrees_with_repeated_multiplication_and_fermat() {
        for field in Field::ALL {
            let xs = random_elements(field, 50, 9);
            let v = FieldVec::from_integers(field, &xs).unwrap();
            // x^0 = 1 (also for 0), x^1 = x, x^(p-1) = 1 for x != 0, x^p = x.
            let p = field.modulus();
            let mut p_minus_1 = p;
            p_minus_1.0[0] -= 1;
            let one = FieldPowJob::new(v.clone(), vec![U256::ZERO])
                .unwrap()
                .run_cpu();
            assert!((0..50).all(|i| one.get(i) == U256::from_u64(1)));
            assert_eq!(
                FieldPowJob::new(v.clone(), vec![U256::from_u64(1)])
                    .unwrap()
                    .run_cpu(),
                v
            );
            assert_eq!(FieldPowJob::new(v.clone(), vec![p]).unwrap().run_cpu(), v);
            let fermat = FieldPowJob::new(v.clone(), vec![p_minus_1])
                .unwrap()
                .run_cpu();
            assert!((0..50).all(|i| xs[i] == U256::ZERO || fermat.get(i) == U256::from_u64(1)));
            // x^3 per element, against two multiplications.
            let cube = FieldPowJob::new(v.clone(), vec![U256::from_u64(3); 50])
                .unwrap()
                .run_cpu();
            let sq = crate::ops::zk::FieldBinaryJob::new(
                crate::ops::zk::FieldOp::Mul,
                v.clone(),
                v.clone(),
            )
            .unwrap()
            .run_cpu();
            let want =
                crate::ops::zk::FieldBinaryJob::new(crate::ops::zk::FieldOp::Mul, sq, v.clone())
                    .unwrap()
                    .run_cpu();
            assert_eq!(cube, want);
        }
        let zero = FieldVec::from_integers(Field::Bn254Fr, &[U256::ZERO]).unwrap();
        assert_eq!(
            FieldPowJob::new(zero, vec![U256::ZERO])
                .unwrap()
                .run_cpu()
                .get(0),
            U256::from_u64(1)
        );
    }
}
