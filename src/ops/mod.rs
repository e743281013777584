//! The domains: maths only, no HTTP. Each op is a job type (`backend::Job`) beside its CPU
//! twin (the oracle) and its device launcher; each domain registers its kernel modules.
pub mod dp;
pub mod invalid;
mod kernels;
pub mod rf;
pub mod zk;

pub use invalid::{FieldPath, Invalid};
pub use kernels::kernel_library;
