//! The four scalar fields as arkworks Montgomery fields, so the sharing maths (Horner,
//! Lagrange weights, weighted sums) is written once for all of them. BN254 and
//! BLS12-381 Fr are arkworks' own; Goldilocks and BabyBear are declared here with the
//! same moduli and generators as `zk::Field`.
//!
//! The vectors stay canonical (`FieldVec`). A canonical word read as a Montgomery
//! internal (`new_unchecked`) times a value in Montgomery form is the canonical product:
//! (a) · (bR) · R⁻¹ = ab. So a step of Horner or of a weighted sum is one Montgomery
//! product and one addition, with no conversion of the long vectors; the kernels do the
//! same with the points and weights passed in Montgomery form.

use crate::ops::zk::{Field, FieldVec, U256};
use ark_ff::{BigInt, BigInteger, Fp, MontBackend, MontConfig, PrimeField};
use rayon::prelude::*;

#[derive(MontConfig)]
#[modulus = "18446744069414584321"]
#[generator = "7"]
pub struct GoldilocksConfig;

#[derive(MontConfig)]
#[modulus = "2013265921"]
#[generator = "31"]
pub struct BabyBearConfig;

/// An arkworks Montgomery field of `N` 64-bit limbs.
pub(crate) type Mont<C, const N: usize> = Fp<MontBackend<C, N>, N>;

/// A canonical element as `FieldVec` stores it, and its limbs.
pub(crate) trait Word<const N: usize>: Copy + Send + Sync + 'static {
    fn big(self) -> BigInt<N>;
    fn from_big(b: BigInt<N>) -> Self;
}

impl Word<4> for [u64; 4] {
    fn big(self) -> BigInt<4> {
        BigInt(self)
    }
    fn from_big(b: BigInt<4>) -> Self {
        b.0
    }
}

impl Word<1> for u64 {
    fn big(self) -> BigInt<1> {
        BigInt([self])
    }
    fn from_big(b: BigInt<1>) -> Self {
        b.0[0]
    }
}

impl Word<1> for u32 {
    fn big(self) -> BigInt<1> {
        BigInt([u64::from(self)])
    }
    fn from_big(b: BigInt<1>) -> Self {
        b.0[0] as u32
    }
}

/// A canonical word in the Montgomery form of its field.
pub(crate) fn mont<C: MontConfig<N>, const N: usize, T: Word<N>>(x: T) -> Mont<C, N> {
    Mont::<C, N>::from_bigint(x.big()).expect("FieldVec holds canonical elements")
}

/// A canonical word read as an internal value: multiplying it by a Montgomery form gives
/// the canonical product.
fn raw<C: MontConfig<N>, const N: usize, T: Word<N>>(x: T) -> Mont<C, N> {
    Mont::<C, N>::new_unchecked(x.big())
}

/// Below this many secrets per share a row runs on one thread.
const PAR_CHUNK: usize = 4096;

/// Row i: `Σ_k coeffs[k·m + j] · xs[i]^k` by Horner for every j < m, with
/// `t = coeffs.len() / m` coefficients per secret: every secret's polynomial at each point.
pub(crate) fn evaluate<C: MontConfig<N>, const N: usize, T: Word<N>>(
    coeffs: &[T],
    xs: &[T],
    m: usize,
) -> Vec<Vec<T>> {
    let t = coeffs.len() / m;
    xs.iter()
        .map(|&x| {
            let x = mont::<C, N, T>(x);
            let mut row = vec![T::from_big(BigInt::zero()); m];
            row.par_chunks_mut(PAR_CHUNK)
                .enumerate()
                .for_each(|(c, part)| {
                    for (jj, o) in part.iter_mut().enumerate() {
                        let j = c * PAR_CHUNK + jj;
                        let mut y = raw::<C, N, T>(coeffs[(t - 1) * m + j]);
                        for k in (0..t - 1).rev() {
                            y = y * x + raw::<C, N, T>(coeffs[k * m + j]);
                        }
                        *o = T::from_big(y.0);
                    }
                });
            row
        })
        .collect()
}

/// Row q: `Σ_i weights[q·k + i] · ys[i][j]` for every j < m, over the k vectors `ys`:
/// weighted sums of whole share vectors, one row per `k` weights.
pub(crate) fn weighted_sums<C: MontConfig<N>, const N: usize, T: Word<N>>(
    ys: &[&[T]],
    weights: &[T],
    m: usize,
) -> Vec<Vec<T>> {
    let k = ys.len();
    weights
        .chunks(k)
        .map(|w| {
            let w: Vec<Mont<C, N>> = w.iter().map(|&w| mont::<C, N, T>(w)).collect();
            let mut row = vec![T::from_big(BigInt::zero()); m];
            row.par_chunks_mut(PAR_CHUNK)
                .enumerate()
                .for_each(|(c, part)| {
                    let base = c * PAR_CHUNK;
                    for (jj, o) in part.iter_mut().enumerate() {
                        let mut acc = Mont::<C, N>::new_unchecked(BigInt::zero());
                        for (y, wi) in ys.iter().zip(&w) {
                            acc += raw::<C, N, T>(y[base + jj]) * wi;
                        }
                        *o = T::from_big(acc.0);
                    }
                });
            row
        })
        .collect()
}

/// The Lagrange basis at each target, over distinct points: row q holds
/// `L_i(targets[q]) = Π_{l≠i} (z − x_l) / (x_i − x_l)` for every point i, so the
/// polynomial through `(x_i, y_i)` takes the value `Σ_i L_i(z) · y_i` at z.
pub(crate) fn lagrange_rows<F: PrimeField>(xs: &[F], targets: &[F]) -> Vec<F> {
    let mut denominators: Vec<F> = (0..xs.len())
        .map(|i| {
            (0..xs.len())
                .filter(|&l| l != i)
                .map(|l| xs[i] - xs[l])
                .product()
        })
        .collect();
    ark_ff::batch_inversion(&mut denominators);
    let mut rows = Vec::with_capacity(targets.len() * xs.len());
    for &z in targets {
        if let Some(at) = xs.iter().position(|&x| x == z) {
            rows.extend((0..xs.len()).map(|i| if i == at { F::one() } else { F::zero() }));
            continue;
        }
        let all: F = xs.iter().map(|&x| z - x).product();
        let mut gaps: Vec<F> = xs.iter().map(|&x| z - x).collect();
        ark_ff::batch_inversion(&mut gaps);
        rows.extend(
            gaps.iter()
                .zip(&denominators)
                .map(|(&gap, &d)| all * gap * d),
        );
    }
    rows
}

/// `lagrange_rows` on canonical integers of `field`, the rows written canonically.
pub fn lagrange_weights(field: Field, xs: &[U256], targets: &[U256]) -> FieldVec {
    fn run<F: PrimeField>(xs: &[U256], targets: &[U256]) -> Vec<U256> {
        let to_f = |v: &U256| F::from_le_bytes_mod_order(&v.to_le_bytes());
        let xs: Vec<F> = xs.iter().map(to_f).collect();
        let targets: Vec<F> = targets.iter().map(to_f).collect();
        lagrange_rows(&xs, &targets)
            .iter()
            .map(|w| {
                let limbs = w.into_bigint().to_bytes_le();
                U256::from_le_slice(&limbs)
            })
            .collect()
    }
    let rows = match field {
        Field::Bn254Fr => run::<ark_bn254::Fr>(xs, targets),
        Field::Bls12_381Fr => run::<ark_bls12_381::Fr>(xs, targets),
        Field::Goldilocks => run::<Mont<GoldilocksConfig, 1>>(xs, targets),
        Field::BabyBear => run::<Mont<BabyBearConfig, 1>>(xs, targets),
    };
    FieldVec::from_integers(field, &rows).expect("field arithmetic gives canonical values")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::zk::samples::random_elements;
    use crate::ops::zk::{FieldBinaryJob, FieldOp};

    fn vec(field: Field, xs: &[U256]) -> FieldVec {
        FieldVec::from_integers(field, xs).unwrap()
    }

    #[test]
    fn declared_fields_have_the_zk_moduli() {
        assert_eq!(
            U256::from_le_slice(&GoldilocksConfig::MODULUS.to_bytes_le()),
            Field::Goldilocks.modulus()
        );
        assert_eq!(
            U256::from_le_slice(&BabyBearConfig::MODULUS.to_bytes_le()),
            Field::BabyBear.modulus()
        );
    }

    /// One Horner step (t = 2: c0 + c1·x) equals the field-op kernels' CPU twins.
    #[test]
    fn a_linear_polynomial_matches_field_mul_and_add() {
        for field in Field::ALL {
            let m = 300;
            let c0 = vec(field, &random_elements(field, m, 1));
            let c1 = vec(field, &random_elements(field, m, 2));
            let x = vec(field, &random_elements(field, 1, 3));
            let product = FieldBinaryJob::new(FieldOp::Mul, c1.clone(), x.clone())
                .unwrap()
                .run_cpu();
            let want = FieldBinaryJob::new(FieldOp::Add, product, c0.clone())
                .unwrap()
                .run_cpu();
            let coeffs = FieldVec::concat(&c0, &[c1]);
            let got = crate::ops::mpc::shamir::evaluate_vec(&coeffs, &x, m);
            assert_eq!(got, vec![want], "{field:?}");
        }
    }

    #[test]
    fn lagrange_rows_reproduce_a_polynomial() {
        use ark_ff::{One, Zero};
        type F = Mont<GoldilocksConfig, 1>;
        let coeffs: Vec<F> = [5u64, u64::MAX - 3, 1 << 40, 77].map(F::from).to_vec();
        let p = |x: F| coeffs.iter().rev().fold(F::zero(), |acc, c| acc * x + c);
        let xs: Vec<F> = [3u64, 9, 12, 40].iter().map(|&v| F::from(v)).collect();
        let targets = [F::zero(), F::from(7u64), xs[2], -F::one()];
        let rows = lagrange_rows(&xs, &targets);
        for (q, z) in targets.iter().enumerate() {
            let got: F = (0..4).map(|i| rows[q * 4 + i] * p(xs[i])).sum();
            assert_eq!(got, p(*z));
        }
    }
}
