//! RF signal processing: feature extraction from complex baseband IQ, and the synthetic
//! multi-receiver dataset generator built on it (CPU twins; formulas in
//! docs/RF_FEATURES.md and docs/RF_DATASETS.md).
pub mod dataset;
pub mod features;
pub mod generate;
pub mod gpu;
#[cfg(test)]
mod gpu_host_parity;
pub mod multipath;
pub mod noise;
pub mod rng;
pub mod scenario;
mod simd;
mod sincos;
pub mod waveform;

pub use features::{extract, ExtractConfig, ExtractError, Extraction, Stats, FEATURE_NAMES};

use rustfft::{Fft, FftPlanner};
use std::sync::Arc;

thread_local! {
    /// Plans keep their twiddles: building one costs more sine evaluations than a
    /// transform, and every chunk of every recording uses the same size, so every thread
    /// keeps its plans for reuse.
    static PLANNER: std::cell::RefCell<FftPlanner<f32>> = std::cell::RefCell::new(FftPlanner::new());
}

/// A forward FFT plan of `n` points from this thread's cache.
pub(crate) fn fft_plan(n: usize) -> Arc<dyn Fft<f32>> {
    PLANNER.with(|p| p.borrow_mut().plan_fft_forward(n))
}

use rustfft::num_complex::Complex32;

/// `/rf/features` as a pool job: IQ already decoded and checked finite.
pub struct FeaturesJob {
    pub iq: Vec<Complex32>,
    pub config: ExtractConfig,
}

impl FeaturesJob {
    pub fn run_cpu(&self) -> Result<Extraction, ExtractError> {
        extract(&self.iq, &self.config)
    }

    /// Whether `run_cuda` takes this recording: its Welch segments within
    /// `gpu::MAX_REDUCE_SEGMENT` (sample rates up to about 1.6 MHz at the default
    /// resolution).
    pub fn fits_device(&self) -> bool {
        features::plan(&self.config, self.iq.len())
            .is_ok_and(|(_, seg)| seg <= gpu::MAX_REDUCE_SEGMENT)
    }

    /// The recording's chunk sums on the device (`rf_chunk_reduce`), the features derived
    /// from them on the CPU: `run_cpu`'s features within 1e-3 dB and 0.1 Hz.
    pub fn run_cuda(
        &self,
        dev: &crate::backend::cuda::DeviceLease<'_>,
    ) -> Result<Result<Extraction, ExtractError>, crate::backend::DeviceError> {
        let (chunk, seg) = match features::plan(&self.config, self.iq.len()) {
            Ok(shape) => shape,
            Err(e) => return Ok(Err(e)),
        };
        let sums = gpu::recording_sums_cuda(&self.iq, chunk, seg, dev)?;
        Ok(Ok(
            features::Derivation::new(chunk, seg).extract(&sums, self.config.sample_rate_hz)
        ))
    }
}
