//! RF signal processing: feature extraction from complex baseband IQ (the CPU twin;
//! the synthetic dataset generator builds on it).
pub mod features;

pub use features::{extract, ExtractConfig, ExtractError, Extraction, Stats, FEATURE_NAMES};

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
}
