//! Noise mechanisms on a vector: each value snapped to the plan's grid plus discrete noise
//! from its own stream. The CPU twin of `dp_gaussian_release` / `dp_laplace_release`.

use super::noise::{for_each_stream, BitStream, NoiseKey, DOMAIN_GAUSSIAN, DOMAIN_LAPLACE};
use super::plan::{snap, GaussianPlan, LaplacePlan, MAX_SNAPPED};
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::ops::invalid::{FieldPath, Invalid};
use rayon::prelude::*;

#[derive(Clone, Copy, Debug)]
pub enum Mechanism {
    Gaussian(GaussianPlan),
    Laplace(LaplacePlan),
}

impl Mechanism {
    pub fn name(&self) -> &'static str {
        match self {
            Mechanism::Gaussian(_) => "dp_gaussian",
            Mechanism::Laplace(_) => "dp_laplace",
        }
    }

    pub fn grid(&self) -> f64 {
        match self {
            Mechanism::Gaussian(p) => p.grid,
            Mechanism::Laplace(p) => p.grid,
        }
    }

    /// Values the grid can carry: each must snap within ±2^62 steps. An error names the
    /// first that does not, under `values`.
    pub fn check_values(&self, values: &[f64]) -> Result<(), Invalid> {
        let grid = self.grid();
        match values.iter().position(|x| (x / grid).abs() >= MAX_SNAPPED) {
            None => Ok(()),
            Some(i) => Err(Invalid::new(
                FieldPath::root().field("values").index(i),
                format!(
                    "too large for the noise grid {grid:e} (|value| must be below 2^62 grid steps)"
                ),
            )),
        }
    }

    /// The stream domain of the mechanism's noise.
    fn domain(&self) -> u32 {
        match self {
            Mechanism::Gaussian(_) => DOMAIN_GAUSSIAN,
            Mechanism::Laplace(_) => DOMAIN_LAPLACE,
        }
    }

    /// One noise value, in grid steps, from an element's stream.
    fn sample(&self, stream: &mut BitStream) -> i64 {
        match self {
            Mechanism::Gaussian(p) => stream.discrete_gaussian(p.t, p.c),
            Mechanism::Laplace(p) => stream.discrete_laplace(p.t),
        }
    }
}

/// One release: the values (already checked to snap inside ±2^62) and a fresh key.
pub struct NoiseJob {
    pub values: Vec<f64>,
    pub mechanism: Mechanism,
    pub key: NoiseKey,
}

impl NoiseJob {
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn run_cpu(&self) -> Vec<f64> {
        const CHUNK: usize = 256;
        let grid = self.mechanism.grid();
        let domain = self.mechanism.domain();
        let mut out = vec![0.0; self.values.len()];
        out.par_chunks_mut(CHUNK)
            .zip(self.values.par_chunks(CHUNK))
            .enumerate()
            .for_each(|(chunk, (out, values))| {
                let first = (chunk * CHUNK) as u64;
                for_each_stream(&self.key, domain, first, out.len(), |j, stream| {
                    let noise = self.mechanism.sample(stream);
                    out[j] = (snap(values[j], grid) + noise) as f64 * grid;
                });
            });
        out
    }
}

impl Job for NoiseJob {
    /// The released values, in order.
    type Output = Vec<f64>;

    fn name(&self) -> &'static str {
        self.mechanism.name()
    }

    fn size(&self) -> usize {
        self.len()
    }

    fn input_bytes(&self) -> usize {
        8 * self.len()
    }

    /// Sampling exact noise costs the CPU about a microsecond per value.
    fn gpu_threshold(&self) -> usize {
        1 << 12
    }

    fn run_cpu(&self) -> Vec<f64> {
        NoiseJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Vec<f64>, DeviceError> {
        super::gpu::launch_noise(self, dev)
    }

    /// Exact noise: the device draws the same samples, bit for bit.
    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        crate::backend::verify::same_bits(device, cpu)
    }
}
