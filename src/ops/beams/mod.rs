//! Beam alignment. `channels`: geometric multipath channels between two half-wavelength
//! arrays, drawn from a seed by channel index (counter-based), formed in f64. `sweep`:
//! the received power of every (receive, transmit) beam pair over a batch of channels,
//! generated or uploaded, with DFT or uploaded codebooks and optional measurement noise;
//! each channel's best pair. `docs/TENSORS.md` states the model and the error bounds.
pub mod channels;
pub(crate) mod check_cases;
pub mod geometry;
mod gpu;
pub(crate) mod self_test;
pub mod sweep;

pub use channels::ChannelsJob;
pub use geometry::{Array, ChannelSpec, DrawnPath, MAX_ELEMENTS, MAX_PATHS};
pub use gpu::{kernel_module, launch_channels, launch_sweep};
pub use sweep::{BestPair, Channels, Codebook, MeasurementNoise, SweepJob, Swept};

/// What the beams domain registers (`ops::DOMAINS`).
pub const DOMAIN: super::Domain = super::Domain {
    name: "beams",
    device_ops: &["beams_channels", "beams_sweep"],
    kernel_modules: || vec![kernel_module()],
    self_tests: self_test::self_tests,
    library_checks: super::domain::no_library_checks,
    check_cases: check_cases::check_cases,
};

#[cfg(test)]
mod tests;
