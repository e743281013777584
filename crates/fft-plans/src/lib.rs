//! rustfft's planners for `f32` and `f64`, instantiated here once.
//!
//! `FftPlanner<T>` is generic, so every crate that names `FftPlanner::<f32>` compiles every
//! algorithm it may choose (the scalar, SSE and AVX butterflies, radix 4, Rader, Bluestein,
//! mixed radix) into itself. In gpu-ops that was 28 % of the library's unoptimised code and
//! half the LLVM time of each test-profile build of it, paid twice by `cargo test` (the
//! library and its unit tests) and again by each test or bench crate that planned a
//! transform. Here the instantiation is compiled once, optimised (the workspace's
//! `[profile.dev.package.fft-plans]`), and callers reach it through the non-generic methods
//! below, which return `Arc<dyn Fft<_>>` as rustfft's planner does. The transforms are
//! rustfft's own: this crate only decides where they are compiled.
//!
//! gpu-ops' `layering` test fails on a `FftPlanner` named anywhere outside this crate.

use rustfft::{Fft, FftPlanner};
use std::sync::Arc;

/// A planner of `f32` transforms. It keeps every plan it made (rustfft caches them with
/// their twiddles), so a caller that keeps the planner pays for a size once.
pub struct F32Planner(FftPlanner<f32>);

impl Default for F32Planner {
    fn default() -> Self {
        Self(FftPlanner::new())
    }
}

impl F32Planner {
    /// The forward transform of `len` points (unnormalised, as rustfft's).
    pub fn forward(&mut self, len: usize) -> Arc<dyn Fft<f32>> {
        self.0.plan_fft_forward(len)
    }
}

/// A planner of `f64` transforms: the references that `f32` results are held to.
pub struct F64Planner(FftPlanner<f64>);

impl Default for F64Planner {
    fn default() -> Self {
        Self(FftPlanner::new())
    }
}

impl F64Planner {
    /// The forward transform of `len` points (unnormalised, as rustfft's).
    pub fn forward(&mut self, len: usize) -> Arc<dyn Fft<f64>> {
        self.0.plan_fft_forward(len)
    }

    /// The inverse transform of `len` points (unnormalised: `len` times the mean).
    pub fn inverse(&mut self, len: usize) -> Arc<dyn Fft<f64>> {
        self.0.plan_fft_inverse(len)
    }
}
