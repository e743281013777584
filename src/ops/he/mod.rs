//! Additively homomorphic aggregation of BFV ciphertexts (fhe.rs): the parameter sets,
//! and the sum of many ciphertexts (optionally weighted by small plaintext scalars) as
//! per-residue modular arithmetic on the GPU, with the crate's own arithmetic as its CPU
//! twin's reference.

pub(crate) mod check_cases;
mod gpu;
pub mod params;
pub(crate) mod self_test;
pub mod sum;

pub use gpu::{kernel_module, launch_sum};
pub use params::ParameterSet;
pub use sum::{check_fresh, CiphertextSumJob, SumBuilder, Unfit};

/// What the he domain registers (`ops::DOMAINS`).
pub const DOMAIN: super::Domain = super::Domain {
    name: "he",
    device_ops: &["he_aggregate"],
    kernel_modules: || vec![kernel_module()],
    self_tests: self_test::self_tests,
    library_checks: super::domain::no_library_checks,
    check_cases: check_cases::check_cases,
};
