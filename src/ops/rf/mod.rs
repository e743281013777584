//! RF signal processing: feature extraction from complex baseband IQ, and the synthetic
//! multi-receiver dataset generator built on it (CPU twins; formulas in
//! docs/RF_FEATURES.md and docs/RF_DATASETS.md).
pub(crate) mod check_cases;
pub mod dataset;
pub mod features;
pub mod generate;
pub mod gpu;

/// What the rf domain registers (`ops::DOMAINS`).
pub const DOMAIN: super::Domain = super::Domain {
    name: "rf",
    device_ops: &["rf_dataset", "rf_features", recordings::IQ_OP],
    kernel_modules: || vec![kernel_module()],
    self_tests: self_test::self_tests,
    library_checks: super::domain::no_library_checks,
    check_cases: check_cases::check_cases,
};

#[cfg(test)]
mod gpu_host_parity;
pub mod multipath;
pub mod noise;
pub mod recordings;
pub mod rng;
pub mod scenario;
pub(crate) mod self_test;
mod simd;
mod sincos;
pub mod waveform;

pub use features::{extract, ExtractConfig, ExtractError, Extraction, Stats, FEATURE_NAMES};
pub use gpu::kernel_module;

use crate::backend::{DeviceError, DeviceLease, Job};

use rustfft::Fft;
use std::sync::Arc;

thread_local! {
    /// Plans keep their twiddles: building one costs more sine evaluations than a
    /// transform, and every chunk of every recording uses the same size, so every thread
    /// keeps its plans for reuse.
    static PLANNER: std::cell::RefCell<fft_plans::F32Planner> = Default::default();
}

/// A forward FFT plan of `n` points from this thread's cache.
pub(crate) fn fft_plan(n: usize) -> Arc<dyn Fft<f32>> {
    PLANNER.with(|p| p.borrow_mut().forward(n))
}

use rustfft::num_complex::Complex32;

/// `/rf/features` as a pool job: IQ already decoded and checked finite.
pub struct FeaturesJob {
    pub iq: Vec<Complex32>,
    pub config: ExtractConfig,
}

impl Job for FeaturesJob {
    type Output = Result<Extraction, ExtractError>;

    fn name(&self) -> &'static str {
        "rf_features"
    }

    fn size(&self) -> usize {
        self.iq.len()
    }

    fn input_bytes(&self) -> usize {
        8 * self.iq.len()
    }

    /// The CPU extracts a million samples in about 5 ms on one core of the development
    /// machine, and its chunks run in parallel.
    fn gpu_threshold(&self) -> usize {
        1 << 20
    }

    /// `rf_chunk_reduce` keeps a Welch segment in shared memory: up to
    /// `gpu::MAX_REDUCE_SEGMENT` points (sample rates up to about 1.6 MHz at the default
    /// resolution).
    fn device_refusal(&self) -> Option<String> {
        let seg = match features::plan(&self.config, self.iq.len()) {
            Ok((_, seg)) => seg,
            Err(e) => return Some(e.to_string()),
        };
        (seg > gpu::MAX_REDUCE_SEGMENT).then(|| {
            format!(
                "the CUDA path takes Welch segments up to {} points (sample rates up to about 1.6 MHz); this recording's are {seg}: use auto or cpu",
                gpu::MAX_REDUCE_SEGMENT
            )
        })
    }

    fn run_cpu(&self) -> Self::Output {
        extract(&self.iq, &self.config)
    }

    /// The recording's chunk sums on the device (`rf_chunk_reduce`), the features derived
    /// from them on the CPU: `run_cpu`'s features within 1e-3 dB and 0.1 Hz.
    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Self::Output, DeviceError> {
        let (chunk, seg) = match features::plan(&self.config, self.iq.len()) {
            Ok(shape) => shape,
            Err(e) => return Ok(Err(e)),
        };
        let sums = gpu::launch_recording_sums(&self.iq, chunk, seg, dev)?;
        Ok(Ok(
            features::Derivation::new(chunk, seg).extract(&sums, self.config.sample_rate_hz)
        ))
    }

    /// Every chunk's features within `features::chunk_agrees`.
    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        let (d, c) = match (device, cpu) {
            (Ok(d), Ok(c)) => (d, c),
            (Err(d), Err(c)) if d == c => return Ok(()),
            _ => {
                return Err(format!(
                    "{:?} vs {:?}",
                    device.as_ref().err(),
                    cpu.as_ref().err()
                ))
            }
        };
        if d.chunks.len() != c.chunks.len() {
            return Err(format!("{} chunks vs {}", d.chunks.len(), c.chunks.len()));
        }
        for (i, (a, b)) in d.chunks.iter().zip(&c.chunks).enumerate() {
            features::chunk_agrees(a, b, c.segment_len)
                .map_err(|why| format!("chunk {i} {why}"))?;
        }
        Ok(())
    }
}
