//! Neural-network layers. `attention`: scaled dot-product attention, fused (tiled, online
//! softmax) on both backends. `conv2d`: batched 2-D convolution lowered to products of
//! the weights and the input windows. Inputs rounded to their dtype and every sum in f32
//! (f64 for f64 inputs); `docs/TENSORS.md` states the error bounds and the limits.
pub mod attention;
pub(crate) mod check_cases;
pub mod conv2d;
mod conv_launch;
mod gpu;
pub mod kept;
mod real;
pub(crate) mod self_test;

pub use attention::{Attended, AttentionJob, AttentionShape, Tensors, MAX_HEAD_DIM};
pub use conv2d::{Conv2dJob, Conv2dShape, ConvTensors};
pub use conv_launch::launch_conv2d;
pub(crate) use conv_launch::run_conv2d_cudnn;
pub use gpu::{attention_key_tile, kernel_module, launch_attention};

use crate::ops::linalg::{Dtype, Values};

/// Each device value within its tolerance of the CPU's (plus the output dtype's
/// subnormal step).
pub(crate) fn within(
    device: &Values,
    cpu: &Values,
    tol: &[f64],
    dtype: Dtype,
    what: &str,
) -> Result<(), String> {
    let (Values::F32(d), Values::F32(c)) = (device, cpu) else {
        return Err("the device answered a different dtype".into());
    };
    if d.len() != c.len() || d.len() != tol.len() {
        return Err(format!(
            "{} {what} values where the CPU has {}",
            d.len(),
            c.len()
        ));
    }
    let (step, _) = dtype.subnormal_step_and_max();
    match (0..d.len()).find(|&i| {
        let (x, y) = (f64::from(d[i]), f64::from(c[i]));
        !(x == y || (x - y).abs() <= tol[i] + step)
    }) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what} {i}: device {} against CPU {} (tolerance {:e})",
            d[i], c[i], tol[i]
        )),
    }
}

/// What the nn domain registers (`ops::DOMAINS`).
pub const DOMAIN: super::Domain = super::Domain {
    name: "nn",
    device_ops: &["conv2d", "attention"],
    kernel_modules: || vec![kernel_module(), attention::tensor_core_module()],
    self_tests: self_test::self_tests,
    library_checks: || vec![self_test::cudnn_check()],
    check_cases: check_cases::check_cases,
};

#[cfg(test)]
mod conv_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tolerance_tests;
