//! Dense tensor operations. `sinusoidal`: position embeddings in f64, rounded once to the
//! output dtype. `lookup`: rows of a resident embedding table, cached on the device. `matmul`: batched `op(A)·op(B)` with f32 accumulation on both
//! backends, operands first rounded to the compute precision (tf32, f16, bf16) as tensor
//! cores round them, so the CPU twin and the device see the same operands and differ only
//! in the order of the f32 sums (`docs/TENSORS.md` states the error bounds).
pub(crate) mod check_cases;
mod gpu;
pub mod held;
pub mod kept;
pub mod lookup;
pub mod matmul;
mod on_device;
mod precision;
pub(crate) mod self_test;
pub mod sinusoidal;
pub(crate) mod views;

pub use gpu::{kernel_module, launch_lookup, launch_matmul, launch_sinusoidal};
pub(crate) use gpu::{matmul_pass, run_matmul_on, MatmulPass, MatmulProvider, PassOperand};
pub use lookup::LookupJob;
pub use matmul::{MatmulJob, MatmulShape, Operands, Strides, Values};
pub(crate) use on_device::{any_zero_element, copy_range, DeviceRef};
pub use precision::{Compute, Dtype};
pub use sinusoidal::{Layout, SinusoidalJob};
pub use views::cpu_kernels;

/// What the linalg domain registers (`ops::DOMAINS`).
pub const DOMAIN: super::Domain = super::Domain {
    name: "linalg",
    device_ops: &["matmul", "embeddings_lookup", "embeddings_sinusoidal"],
    kernel_modules: || vec![kernel_module()],
    self_tests: self_test::self_tests,
    library_checks: || vec![self_test::blaslt_check()],
    check_cases: check_cases::check_cases,
};

#[cfg(test)]
mod kernel_paths;
#[cfg(test)]
pub(crate) mod tests;
