//! RF signal processing: feature extraction from complex baseband IQ, and the synthetic
//! multi-receiver dataset generator built on it (CPU twins; formulas in
//! docs/RF_FEATURES.md and docs/RF_DATASETS.md).
pub mod dataset;
pub mod features;
pub mod generate;
pub mod rng;
pub mod scenario;

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
