//! Neural-network layers. `attention`: scaled dot-product attention, fused (tiled, online
//! softmax) on both backends, inputs rounded to their dtype and every sum in f32 (f64 for
//! f64 inputs); `docs/TENSORS.md` states the mask, the error bound and the limits.
pub mod attention;
mod gpu;
pub(crate) mod self_test;

pub use attention::{Attended, AttentionJob, AttentionShape, Tensors, MAX_HEAD_DIM};
pub use gpu::{attention_key_tile, kernel_module, run_attention_cuda};

#[cfg(test)]
mod tests;
