//! Zero-knowledge primitives: prime-field vectors, NTT, MSM.
pub(crate) mod check_cases;
mod field;
mod gpu;
pub mod held;
pub mod msm;
mod msm_gpu;
mod msm_plan;
pub mod ntt;
mod pow_inv;
pub mod samples;
pub(crate) mod self_test;
mod u256;
mod vector_ops;
pub mod wgsl;
mod wgsl_msm;

pub use field::{ElementError, Field, FieldVec};
pub(crate) use gpu::{from_u64, words, Words};
pub use gpu::{
    launch_field_binary, launch_field_inv, launch_field_pow, launch_ntt, tile_plan, TILE_BYTES,
};
pub use msm_gpu::{launch_msm, launch_msm_in_chunks, launch_msm_measured, BucketWork};
pub use pow_inv::{FieldInvJob, FieldPowJob, InvError, PowShape};
pub use u256::{ParseError, U256};
pub use vector_ops::{FieldBinaryJob, FieldOp, LengthMismatch};

/// The domain's CUDA modules: `field_ops.cu`, `ntt.cu`, `msm.cu`.
pub fn kernel_modules() -> Vec<crate::backend::cuda::kernels::KernelModule> {
    vec![
        gpu::field_ops_module(),
        gpu::ntt_module(),
        msm_gpu::msm_module(),
    ]
}

/// What the zk domain registers (`ops::DOMAINS`).
pub const DOMAIN: super::Domain = super::Domain {
    name: "zk",
    device_ops: &[
        "field_add",
        "field_sub",
        "field_mul",
        "field_pow",
        "field_inv",
        "ntt",
        "intt",
        "msm",
    ],
    kernel_modules,
    self_tests: self_test::self_tests,
    library_checks: super::domain::no_library_checks,
    check_cases: check_cases::check_cases,
};

#[cfg(test)]
mod host_kernel_parity;
#[cfg(test)]
mod msm_host_parity;
