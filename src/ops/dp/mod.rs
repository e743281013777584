//! Differential privacy: RDP accounting, exact discrete noise shared by the CPU and the
//! GPU, and DP-SGD gradient privatization.

pub mod accountant;
pub(crate) mod chacha;
pub(crate) mod check_cases;
mod gpu;

/// What the dp domain registers (`ops::DOMAINS`).
pub const DOMAIN: super::Domain = super::Domain {
    name: "dp",
    device_ops: &["dp_gaussian", "dp_laplace", "dp_privatize"],
    kernel_modules: || vec![kernel_module()],
    self_tests: self_test::self_tests,
    library_checks: super::domain::no_library_checks,
    check_cases: check_cases::check_cases,
};

#[cfg(test)]
mod host_kernel_parity;
pub mod noise;
pub mod plan;
pub mod privatize;
pub mod release;
pub(crate) mod self_test;
pub mod sgd;

pub use gpu::{kernel_module, launch_noise, launch_privatize, privatize_resident, GradientElement};
pub use noise::NoiseKey;
pub use plan::{GaussianPlan, LaplacePlan};
pub use privatize::{Gradients, PrivatizeJob, Privatized};
pub use release::{Mechanism, NoiseJob};
pub use sgd::{check_noise_multiplier, Clipping, SgdPlan};
