//! The BFV parameter sets served, named by security level: the 128-bit sets of the
//! HomomorphicEncryption.org standard (as fhe.rs's `default_parameters_128` builds them),
//! each with plaintext modulus 65537, a prime ≡ 1 mod 2n, so every set packs n slots.

use fhe::bfv::{BfvParameters, BfvParametersBuilder};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, OnceLock};

/// The plaintext modulus t of every set: slot values live in Z/65537.
pub const PLAINTEXT_MODULUS: u64 = 65537;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ParameterSet {
    /// n = 4096 slots, log Q = 109 (three RNS moduli of 36–37 bits): 128-bit security.
    Bfv128N4096,
    /// n = 8192 slots, log Q = 218 (five moduli of 43–44 bits): 128-bit security.
    Bfv128N8192,
    /// n = 16384 slots, log Q = 438 (nine moduli of 48–49 bits): 128-bit security.
    Bfv128N16384,
}

impl ParameterSet {
    pub const ALL: [ParameterSet; 3] = [Self::Bfv128N4096, Self::Bfv128N8192, Self::Bfv128N16384];

    pub fn name(self) -> &'static str {
        match self {
            Self::Bfv128N4096 => "bfv128_n4096",
            Self::Bfv128N8192 => "bfv128_n8192",
            Self::Bfv128N16384 => "bfv128_n16384",
        }
    }

    pub fn degree(self) -> usize {
        match self {
            Self::Bfv128N4096 => 4096,
            Self::Bfv128N8192 => 8192,
            Self::Bfv128N16384 => 16384,
        }
    }

    /// The ciphertext moduli q_0 … q_{L−1}, each a prime ≡ 1 mod 2n.
    pub fn moduli(self) -> &'static [u64] {
        match self {
            Self::Bfv128N4096 => &[0xffffee001, 0xffffc4001, 0x1ffffe0001],
            Self::Bfv128N8192 => &[
                0x7fffffd8001,
                0x7fffffc8001,
                0xfffffffc001,
                0xffffff6c001,
                0xfffffebc001,
            ],
            Self::Bfv128N16384 => &[
                0xfffffffd8001,
                0xfffffffa0001,
                0xfffffff00001,
                0x1fffffff68001,
                0x1fffffff50001,
                0x1ffffffee8001,
                0x1ffffffea0001,
                0x1ffffffe88001,
                0x1ffffffe48001,
            ],
        }
    }

    /// The set's parameters, built once per process: the crate's ciphertext arithmetic
    /// checks that both operands share one `Arc`.
    pub fn parameters(self) -> Arc<BfvParameters> {
        static SETS: [OnceLock<Arc<BfvParameters>>; 3] =
            [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        let i = Self::ALL
            .iter()
            .position(|&s| s == self)
            .expect("a listed set");
        SETS[i]
            .get_or_init(|| {
                BfvParametersBuilder::new()
                    .set_degree(self.degree())
                    .set_plaintext_modulus(PLAINTEXT_MODULUS)
                    .set_moduli(self.moduli())
                    .build_arc()
                    .expect("the standard 128-bit sets are valid BFV parameters")
            })
            .clone()
    }
}
