//! The prime fields and validated vectors of their canonical elements.

use super::u256::U256;
use serde::{Deserialize, Serialize};

/// A prime field. Elements are canonical integers in `[0, p)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Field {
    /// BN254 scalar field, r = 21888242871839275222246405745257275088548364400416034343698204186575808495617.
    Bn254Fr,
    /// BLS12-381 scalar field, r = 52435875175126190479447740508185965837690552500527637822603658699938581184513.
    #[serde(rename = "bls12_381_fr")]
    Bls12_381Fr,
    /// Goldilocks, p = 2^64 - 2^32 + 1 = 18446744069414584321.
    Goldilocks,
    /// BabyBear, p = 2^31 - 2^27 + 1 = 2013265921.
    #[serde(rename = "babybear")]
    BabyBear,
}

pub(crate) const GOLDILOCKS_P: u64 = 0xffff_ffff_0000_0001;
pub(crate) const BABYBEAR_P: u32 = 2_013_265_921;
pub(crate) const BLS12_381_R: U256 = U256([
    0xffff_ffff_0000_0001,
    0x53bd_a402_fffe_5bfe,
    0x3339_d808_09a1_d805,
    0x73ed_a753_299d_7d48,
]);
pub(crate) const BN254_R: U256 = U256([
    0x43e1_f593_f000_0001,
    0x2833_e848_79b9_7091,
    0xb850_45b6_8181_585d,
    0x3064_4e72_e131_a029,
]);

impl Field {
    pub const ALL: [Field; 4] = [
        Field::Bn254Fr,
        Field::Bls12_381Fr,
        Field::Goldilocks,
        Field::BabyBear,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Field::Bn254Fr => "bn254_fr",
            Field::Bls12_381Fr => "bls12_381_fr",
            Field::Goldilocks => "goldilocks",
            Field::BabyBear => "babybear",
        }
    }

    pub fn modulus(self) -> U256 {
        match self {
            Field::Bn254Fr => BN254_R,
            Field::Bls12_381Fr => BLS12_381_R,
            Field::Goldilocks => U256::from_u64(GOLDILOCKS_P),
            Field::BabyBear => U256::from_u64(u64::from(BABYBEAR_P)),
        }
    }

    /// Bytes of one element in the little-endian fixed-width wire form.
    pub fn byte_width(self) -> usize {
        match self {
            Field::Bn254Fr | Field::Bls12_381Fr => 32,
            Field::Goldilocks => 8,
            Field::BabyBear => 4,
        }
    }
}

/// Why one element of an input vector was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElementError {
    pub index: usize,
    pub message: String,
}

/// A vector of canonical elements of one field. Only the constructors below make one,
/// so every value inside is `< p`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldVec {
    /// Little-endian 64-bit limbs.
    Bn254Fr(Vec<[u64; 4]>),
    /// Little-endian 64-bit limbs.
    Bls12_381Fr(Vec<[u64; 4]>),
    Goldilocks(Vec<u64>),
    BabyBear(Vec<u32>),
}

impl FieldVec {
    pub fn field(&self) -> Field {
        match self {
            FieldVec::Bn254Fr(_) => Field::Bn254Fr,
            FieldVec::Bls12_381Fr(_) => Field::Bls12_381Fr,
            FieldVec::Goldilocks(_) => Field::Goldilocks,
            FieldVec::BabyBear(_) => Field::BabyBear,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            FieldVec::Bn254Fr(v) | FieldVec::Bls12_381Fr(v) => v.len(),
            FieldVec::Goldilocks(v) => v.len(),
            FieldVec::BabyBear(v) => v.len(),
        }
    }

    /// Element i is zero.
    pub fn is_zero(&self, i: usize) -> bool {
        match self {
            FieldVec::Bn254Fr(v) | FieldVec::Bls12_381Fr(v) => v[i] == [0; 4],
            FieldVec::Goldilocks(v) => v[i] == 0,
            FieldVec::BabyBear(v) => v[i] == 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn byte_len(&self) -> usize {
        self.len() * self.field().byte_width()
    }

    /// Refuses the first value that is not canonical, naming its index.
    pub fn from_integers(field: Field, values: &[U256]) -> Result<Self, ElementError> {
        let p = field.modulus();
        if let Some(index) = values.iter().position(|v| *v >= p) {
            return Err(non_canonical(field, index));
        }
        Ok(match field {
            Field::Bn254Fr => FieldVec::Bn254Fr(values.iter().map(|v| v.0).collect()),
            Field::Bls12_381Fr => FieldVec::Bls12_381Fr(values.iter().map(|v| v.0).collect()),
            Field::Goldilocks => FieldVec::Goldilocks(values.iter().map(|v| v.0[0]).collect()),
            Field::BabyBear => FieldVec::BabyBear(values.iter().map(|v| v.0[0] as u32).collect()),
        })
    }

    /// Values below 2^64, taken as they are (no copy for Goldilocks); refuses the first
    /// that is not canonical, naming its index.
    pub fn from_words(field: Field, values: Vec<u64>) -> Result<Self, ElementError> {
        let first_over = |p: u64| values.iter().position(|&v| v >= p);
        match field {
            Field::Goldilocks => match first_over(GOLDILOCKS_P) {
                Some(index) => Err(non_canonical(field, index)),
                None => Ok(FieldVec::Goldilocks(values)),
            },
            Field::BabyBear => match first_over(u64::from(BABYBEAR_P)) {
                Some(index) => Err(non_canonical(field, index)),
                None => Ok(FieldVec::BabyBear(
                    values.iter().map(|&v| v as u32).collect(),
                )),
            },
            // Both moduli are above 2^254: every 64-bit value is canonical.
            Field::Bn254Fr => Ok(FieldVec::Bn254Fr(
                values.iter().map(|&v| [v, 0, 0, 0]).collect(),
            )),
            Field::Bls12_381Fr => Ok(FieldVec::Bls12_381Fr(
                values.iter().map(|&v| [v, 0, 0, 0]).collect(),
            )),
        }
    }

    /// 256-bit values as little-endian limbs, taken as they are (no copy for the 256-bit
    /// fields); refuses the first that is not canonical, naming its index.
    pub fn from_limbs(field: Field, values: Vec<[u64; 4]>) -> Result<Self, ElementError> {
        let p = field.modulus();
        if let Some(index) = values.iter().position(|&v| U256(v) >= p) {
            return Err(non_canonical(field, index));
        }
        Ok(match field {
            Field::Bn254Fr => FieldVec::Bn254Fr(values),
            Field::Bls12_381Fr => FieldVec::Bls12_381Fr(values),
            Field::Goldilocks => FieldVec::Goldilocks(values.iter().map(|v| v[0]).collect()),
            Field::BabyBear => FieldVec::BabyBear(values.iter().map(|v| v[0] as u32).collect()),
        })
    }

    /// Little-endian fixed-width values, `field.byte_width()` bytes each.
    pub fn from_le_bytes(field: Field, bytes: &[u8]) -> Result<Self, ElementError> {
        let width = field.byte_width();
        if bytes.len() % width != 0 {
            return Err(ElementError {
                index: bytes.len() / width,
                message: format!(
                    "{} bytes is not a whole number of {width}-byte {} elements",
                    bytes.len(),
                    field.name()
                ),
            });
        }
        let word = |w: &[u8]| u64::from_le_bytes(w.try_into().expect("8-byte chunk"));
        let p = field.modulus();
        let limbs = |c: &[u8]| {
            [
                word(&c[..8]),
                word(&c[8..16]),
                word(&c[16..24]),
                word(&c[24..]),
            ]
        };
        let vec = match field {
            Field::Goldilocks => FieldVec::Goldilocks(bytes.chunks_exact(8).map(word).collect()),
            Field::BabyBear => FieldVec::BabyBear(
                bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().expect("4-byte chunk")))
                    .collect(),
            ),
            Field::Bn254Fr => FieldVec::Bn254Fr(bytes.chunks_exact(32).map(limbs).collect()),
            Field::Bls12_381Fr => {
                FieldVec::Bls12_381Fr(bytes.chunks_exact(32).map(limbs).collect())
            }
        };
        match (0..vec.len()).find(|&i| vec.get(i) >= p) {
            Some(index) => Err(non_canonical(field, index)),
            None => Ok(vec),
        }
    }

    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            FieldVec::Bn254Fr(v) | FieldVec::Bls12_381Fr(v) => {
                v.iter().flatten().flat_map(|l| l.to_le_bytes()).collect()
            }
            FieldVec::Goldilocks(v) => v.iter().flat_map(|l| l.to_le_bytes()).collect(),
            FieldVec::BabyBear(v) => v.iter().flat_map(|l| l.to_le_bytes()).collect(),
        }
    }

    /// The values as little-endian bytes: borrowed where the host is little-endian.
    pub fn le_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        if cfg!(target_endian = "big") {
            return self.to_le_bytes().into();
        }
        match self {
            FieldVec::Bn254Fr(v) | FieldVec::Bls12_381Fr(v) => bytemuck::cast_slice(v).into(),
            FieldVec::Goldilocks(v) => bytemuck::cast_slice(v).into(),
            FieldVec::BabyBear(v) => bytemuck::cast_slice(v).into(),
        }
    }

    pub fn get(&self, i: usize) -> U256 {
        match self {
            FieldVec::Bn254Fr(v) | FieldVec::Bls12_381Fr(v) => U256(v[i]),
            FieldVec::Goldilocks(v) => U256::from_u64(v[i]),
            FieldVec::BabyBear(v) => U256::from_u64(u64::from(v[i])),
        }
    }
}

/// Applies `$body` to the inner Vec of every variant, rebuilding the same variant.
macro_rules! each_variant {
    ($v:expr, |$x:ident| $body:expr) => {
        match $v {
            FieldVec::Bn254Fr($x) => FieldVec::Bn254Fr($body),
            FieldVec::Bls12_381Fr($x) => FieldVec::Bls12_381Fr($body),
            FieldVec::Goldilocks($x) => FieldVec::Goldilocks($body),
            FieldVec::BabyBear($x) => FieldVec::BabyBear($body),
        }
    };
}

impl FieldVec {
    /// `self` repeated to `n` elements when it holds one (a broadcast operand), else a copy.
    pub fn expanded(&self, n: usize) -> FieldVec {
        each_variant!(self, |v| if v.len() == 1 {
            vec![v[0]; n]
        } else {
            v.clone()
        })
    }

    /// The parts one after the other; all of `first`'s field.
    pub fn concat(first: &FieldVec, rest: &[FieldVec]) -> FieldVec {
        let mut out = first.clone();
        for part in rest {
            match (&mut out, part) {
                (FieldVec::Bn254Fr(o), FieldVec::Bn254Fr(p))
                | (FieldVec::Bls12_381Fr(o), FieldVec::Bls12_381Fr(p)) => o.extend_from_slice(p),
                (FieldVec::Goldilocks(o), FieldVec::Goldilocks(p)) => o.extend_from_slice(p),
                (FieldVec::BabyBear(o), FieldVec::BabyBear(p)) => o.extend_from_slice(p),
                _ => panic!("concat of different fields"),
            }
        }
        out
    }

    /// Consecutive pieces of the given lengths (which sum to `self.len()`).
    pub fn split(&self, lens: &[usize]) -> Vec<FieldVec> {
        let mut start = 0;
        lens.iter()
            .map(|&n| {
                let piece = each_variant!(self, |v| v[start..start + n].to_vec());
                start += n;
                piece
            })
            .collect()
    }
}

fn non_canonical(field: Field, index: usize) -> ElementError {
    ElementError {
        index,
        message: format!(
            "not a canonical {} element: it must be less than the modulus {}",
            field.name(),
            field.modulus()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ff::PrimeField;

    #[test]
    fn moduli_match_arkworks_and_the_definitions() {
        assert_eq!(BN254_R.0, ark_bn254::Fr::MODULUS.0);
        assert_eq!(BLS12_381_R.0, ark_bls12_381::Fr::MODULUS.0);
        assert_eq!(BABYBEAR_P, (1u32 << 31) - (1 << 27) + 1);
    }

    #[test]
    fn modulus_itself_is_refused_and_p_minus_one_accepted() {
        for field in Field::ALL {
            let p = field.modulus();
            let mut p_minus_1 = p;
            p_minus_1.0[0] -= 1;
            let ok = FieldVec::from_integers(field, &[U256::ZERO, p_minus_1]).unwrap();
            assert_eq!(ok.get(1), p_minus_1);
            let err = FieldVec::from_integers(field, &[U256::ZERO, p_minus_1, p]).unwrap_err();
            assert_eq!(err.index, 2);
        }
    }

    #[test]
    fn le_bytes_round_trip_and_reject_ragged_lengths() {
        let v = FieldVec::from_integers(Field::Bn254Fr, &[U256([1, 2, 3, 4]), U256::ZERO]).unwrap();
        let bytes = v.to_le_bytes();
        assert_eq!(bytes.len(), 64);
        assert_eq!(FieldVec::from_le_bytes(Field::Bn254Fr, &bytes).unwrap(), v);
        assert!(FieldVec::from_le_bytes(Field::Bn254Fr, &bytes[..63]).is_err());
        let big = u64::MAX.to_le_bytes();
        assert_eq!(
            FieldVec::from_le_bytes(Field::Goldilocks, &big)
                .unwrap_err()
                .index,
            0
        );
    }
}
