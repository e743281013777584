//! Sinusoidal position embeddings (Vaswani et al. 2017): for position p and pair i of a
//! `dim`-wide embedding, angle = (p + offset)·scale·base^(−2i/dim), with sin and cos of it
//! interleaved (sin, cos, sin, …) or split (all sines, then all cosines). Angles and their
//! sines are f64 on both backends, rounded once to the output dtype.

use super::precision::Dtype;
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::ops::invalid::{FieldPath, Invalid};
use rayon::prelude::*;

/// Widest embedding served.
pub const MAX_DIM: usize = 65_536;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Interleaved,
    Split,
}

#[derive(Clone, Debug)]
pub struct SinusoidalJob {
    /// (p + offset)·scale per row, in order.
    pub times: Vec<f64>,
    /// base^(−2i/dim) per pair i.
    pub frequencies: Vec<f64>,
    pub layout: Layout,
    pub output: Dtype,
}

impl SinusoidalJob {
    /// `positions` with the encoding's parameters; paths name the request's fields.
    pub fn new(
        positions: &[f64],
        dim: usize,
        base: f64,
        scale: f64,
        offset: f64,
        layout: Layout,
        output: Dtype,
    ) -> Result<Self, Invalid> {
        let root = FieldPath::root();
        if dim < 2 || dim % 2 != 0 || dim > MAX_DIM {
            return Err(Invalid::new(
                root.field("dim"),
                format!("must be even, from 2 to {MAX_DIM}"),
            ));
        }
        if !(base.is_finite() && base > 1.0) {
            return Err(Invalid::new(
                root.field("base"),
                "must be finite and above 1",
            ));
        }
        if !(scale.is_finite() && scale != 0.0) {
            return Err(Invalid::new(
                root.field("scale"),
                "must be finite and nonzero",
            ));
        }
        if !offset.is_finite() {
            return Err(Invalid::new(root.field("offset"), "must be finite"));
        }
        let times: Vec<f64> = positions.iter().map(|&p| (p + offset) * scale).collect();
        if let Some(i) = times.iter().position(|t| !t.is_finite() || t.abs() > 1e15) {
            return Err(Invalid::new(
                root.field("positions").index(i),
                "(position + offset)·scale must stay within ±1e15",
            ));
        }
        let frequencies = (0..dim / 2)
            .map(|i| base.powf(-2.0 * i as f64 / dim as f64))
            .collect();
        Ok(Self {
            times,
            frequencies,
            layout,
            output,
        })
    }

    pub fn dim(&self) -> usize {
        2 * self.frequencies.len()
    }

    /// Where pair i's sine and cosine go in a row.
    pub fn slots(&self, i: usize) -> (usize, usize) {
        match self.layout {
            Layout::Interleaved => (2 * i, 2 * i + 1),
            Layout::Split => (i, i + self.frequencies.len()),
        }
    }

    /// Rounds f64 values to the output dtype (once: f16 and bf16 straight from f64).
    pub fn round_output(&self, values: &mut [f64]) {
        let output = self.output;
        values
            .par_iter_mut()
            .with_min_len(1 << 14)
            .for_each(|x| *x = output.round_f64(*x));
    }

    pub fn run_cpu(&self) -> Vec<f64> {
        let dim = self.dim();
        let mut out = vec![0.0; self.times.len() * dim];
        out.par_chunks_mut(dim)
            .zip(&self.times)
            .with_min_len(64)
            .for_each(|(row, &t)| {
                for (i, &f) in self.frequencies.iter().enumerate() {
                    let (s, c) = (t * f).sin_cos();
                    let (si, ci) = self.slots(i);
                    row[si] = s;
                    row[ci] = c;
                }
            });
        self.round_output(&mut out);
        out
    }
}

impl Job for SinusoidalJob {
    /// Rows × dim values, row-major, already in the output dtype.
    type Output = Vec<f64>;

    fn name(&self) -> &'static str {
        "embeddings_sinusoidal"
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.output.name().into()
    }

    fn size(&self) -> usize {
        self.times.len() * self.dim()
    }

    fn input_bytes(&self) -> usize {
        8 * (self.times.len() + self.frequencies.len())
    }

    /// A sine and a cosine cost the CPU tens of nanoseconds: 2^18 values and up go to
    /// the device on `auto`.
    fn gpu_threshold(&self) -> usize {
        1 << 18
    }

    fn run_cpu(&self) -> Vec<f64> {
        SinusoidalJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Vec<f64>, DeviceError> {
        super::gpu::launch_sinusoidal(self, dev)
    }

    /// The device's sin/cos (CUDA's double-precision, within 2 ulp) and the host's differ
    /// in the last bits of the f64, so a value rounded to the output dtype may land one
    /// ulp of it apart.
    fn agrees(&self, device: &Vec<f64>, cpu: &Vec<f64>) -> Result<(), String> {
        if device.len() != cpu.len() {
            return Err(format!(
                "{} values where the CPU has {}",
                device.len(),
                cpu.len()
            ));
        }
        let u = 2.0 * self.output.unit_roundoff();
        match (0..cpu.len()).find(|&i| {
            (device[i] - cpu[i]).abs() > u * cpu[i].abs().max(1e-30) + 1e-300 && device[i] != cpu[i]
        }) {
            None => Ok(()),
            Some(i) => Err(format!(
                "value {i}: device {} against CPU {}",
                device[i], cpu[i]
            )),
        }
    }
}
