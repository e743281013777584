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

pub use gpu::{kernel_module, run_combine_cuda, run_share_cuda, run_unmask_cuda};
pub use scalar::lagrange_weights;
