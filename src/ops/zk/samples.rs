//! Deterministic inputs for tests, parity checks and benchmarks: the edge values every
//! field op must survive, and reproducible pseudo-random canonical elements.

use super::msm::{Curve, Points};
use super::{Field, U256};
use ark_ec::short_weierstrass::{Affine, Projective, SWCurveConfig};
use ark_ec::{AffineRepr, CurveGroup};
use ark_ff::PrimeField;

/// 0, 1, 2, p-1, p-2, (p-1)/2 and 2^64-1 where it is canonical.
pub fn edge_values(field: Field) -> Vec<U256> {
    let p = field.modulus();
    let minus = |k: u64| {
        let mut v = p;
        v.0[0] -= k; // p's low limb is odd and > 2 for both fields: no borrow.
        v
    };
    let mut half = U256::ZERO;
    for i in 0..4 {
        half.0[i] = (p.0[i] >> 1) | if i < 3 { p.0[i + 1] << 63 } else { 0 };
    }
    [
        U256::ZERO,
        U256::from_u64(1),
        U256::from_u64(2),
        minus(1),
        minus(2),
        half,
        U256([u64::MAX, 0, 0, 0]),
    ]
    .into_iter()
    .filter(|v| *v < p)
    .collect()
}

/// `n` canonical elements, uniform in [0, p), the same for the same `seed`.
pub fn random_elements(field: Field, n: usize, seed: u64) -> Vec<U256> {
    let mut state = seed;
    let p = field.modulus();
    let top_bits = bit_length(p);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let mut v = U256([
            splitmix64(&mut state),
            splitmix64(&mut state),
            splitmix64(&mut state),
            splitmix64(&mut state),
        ]);
        // Keep only p's bit length, then reject: uniform, and at least half are kept.
        for (i, limb) in v.0.iter_mut().enumerate() {
            let lo = 64 * i as u32;
            *limb = match top_bits.saturating_sub(lo) {
                0 => 0,
                b if b >= 64 => *limb,
                b => *limb & ((1u64 << b) - 1),
            };
        }
        if v < p {
            out.push(v);
        }
    }
    out
}

/// `n` reproducible points of `curve`: P₀ + i·S for random multiples P₀, S of the
/// generator (additions only, so 2^20 points take a second, not minutes).
pub fn random_points(curve: Curve, n: usize, seed: u64) -> Points {
    match curve {
        Curve::Bn254G1 => Points::Bn254G1(point_walk(n, seed)),
        Curve::Bls12_381G1 => Points::Bls12_381G1(point_walk(n, seed)),
    }
}

fn point_walk<P: SWCurveConfig>(n: usize, seed: u64) -> Vec<Affine<P>>
where
    P::ScalarField: PrimeField<BigInt = ark_ff::BigInt<4>>,
{
    let field = if P::ScalarField::MODULUS == ark_ff::BigInt(crate::ops::zk::field::BN254_R.0) {
        Field::Bn254Fr
    } else {
        Field::Bls12_381Fr
    };
    let k = random_elements(field, 2, seed);
    let g = Affine::<P>::generator();
    let (start, step) = (g.mul_bigint(k[0].0), g.mul_bigint(k[1].0));
    let walk: Vec<Projective<P>> = std::iter::successors(Some(start), |p| Some(*p + step))
        .take(n)
        .collect();
    Projective::normalize_batch(&walk)
}

fn bit_length(v: U256) -> u32 {
    v.0.iter()
        .rposition(|&l| l != 0)
        .map_or(0, |i| 64 * i as u32 + 64 - v.0[i].leading_zeros())
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_elements_are_canonical_reproducible_and_spread() {
        for field in Field::ALL {
            let a = random_elements(field, 1000, 7);
            assert_eq!(a, random_elements(field, 1000, 7));
            assert_ne!(a, random_elements(field, 1000, 8));
            assert!(a.iter().all(|v| *v < field.modulus()));
            // The top limb in use must vary, or the masking is wrong.
            let top = if field.byte_width() <= 8 { 0 } else { 3 };
            assert!(a.iter().any(|v| v.0[top] > field.modulus().0[top] / 2));
        }
    }

    #[test]
    fn random_points_are_valid_distinct_and_reproducible() {
        for curve in Curve::ALL {
            let p = random_points(curve, 50, 3);
            assert_eq!(p, random_points(curve, 50, 3));
            assert_eq!(Points::from_le_bytes(curve, &p.to_le_bytes()).unwrap(), p);
            let coords: std::collections::HashSet<_> = (0..50).map(|i| p.coordinates(i)).collect();
            assert_eq!(coords.len(), 50);
        }
    }

    #[test]
    fn edge_values_include_p_minus_one() {
        for field in Field::ALL {
            let e = edge_values(field);
            let mut pm1 = field.modulus();
            pm1.0[0] -= 1;
            assert!(e.contains(&pm1) && e.contains(&U256::ZERO));
        }
    }
}
