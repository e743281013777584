//! Multi-party computation: Shamir secret sharing with Feldman commitments (a dealer
//! splits, holders verify, any threshold of them combine), and secure aggregation of
//! client vectors (`secagg`).

pub(crate) mod check_cases;
pub mod feldman;
mod gpu;
mod scalar;
pub mod secagg;
pub(crate) mod self_test;
pub mod shamir;

pub use gpu::{kernel_module, launch_combine, launch_share, launch_unmask};
pub use scalar::lagrange_weights;

/// What the mpc domain registers (`ops::DOMAINS`).
pub const DOMAIN: super::Domain = super::Domain {
    name: "mpc",
    device_ops: &["shamir_split", "shamir_combine", "secagg_unmask"],
    kernel_modules: || vec![kernel_module()],
    self_tests: self_test::self_tests,
    library_checks: super::domain::no_library_checks,
    check_cases: check_cases::check_cases,
};
