//! `ChannelsJob`: a batch of geometric multipath channels from a seed. The paths are drawn
//! on the host (a few numbers per path, the same for both backends by construction); the
//! phasors and their sums, N_r·N_t·L complex products per channel, run on the backend.

use super::geometry::{form_channels, ChannelSpec, DrawnPath};
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::ops::invalid::{FieldPath, Invalid};
use crate::ops::linalg::Dtype;

#[derive(Clone, Debug)]
pub struct ChannelsJob {
    pub spec: ChannelSpec,
    pub drawn: Vec<DrawnPath>,
    /// `PATH_WORDS` per drawn path.
    pub words: Vec<f64>,
    /// f32 or f64: what the channels are rounded to.
    pub output: Dtype,
}

impl ChannelsJob {
    pub fn new(spec: ChannelSpec, output: Dtype) -> Result<Self, Invalid> {
        spec.validate(&FieldPath::root())?;
        let drawn = spec.draw();
        let words = spec.path_words(&drawn);
        Ok(Self {
            spec,
            drawn,
            words,
            output,
        })
    }

    pub fn paths(&self) -> usize {
        self.spec.paths
    }

    /// Rounds to the output dtype.
    pub fn round(&self, h: &mut [f64]) {
        if self.output != Dtype::F64 {
            h.iter_mut().for_each(|x| *x = self.output.round_f64(*x));
        }
    }

    pub fn run_cpu(&self) -> Vec<f64> {
        let s = &self.spec;
        let mut h = form_channels(&self.words, s.paths, s.rx, s.tx);
        self.round(&mut h);
        h
    }

    /// How far two correct formings of channel b may differ in one component
    /// (`ChannelSpec::formed_tolerance`).
    pub fn tolerance(&self, b: usize) -> f64 {
        self.spec.formed_tolerance(&self.words, b)
    }
}

impl Job for ChannelsJob {
    /// `[B, N_r, N_t]` complex, interleaved, in the output dtype.
    type Output = Vec<f64>;

    fn name(&self) -> &'static str {
        "beams_channels"
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.output.name().into()
    }

    fn size(&self) -> usize {
        self.spec.count * self.spec.channel_len()
    }

    fn input_bytes(&self) -> usize {
        8 * self.words.len()
    }

    /// Each complex value costs the CPU L complex products: 2^18 values and up go to the
    /// device on `auto`.
    fn gpu_threshold(&self) -> usize {
        1 << 18
    }

    fn run_cpu(&self) -> Vec<f64> {
        ChannelsJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Vec<f64>, DeviceError> {
        super::gpu::launch_channels(self, dev)
    }

    fn agrees(&self, device: &Vec<f64>, cpu: &Vec<f64>) -> Result<(), String> {
        let per = 2 * self.spec.channel_len();
        if device.len() != cpu.len() {
            return Err(format!(
                "{} values where the CPU has {}",
                device.len(),
                cpu.len()
            ));
        }
        let u = 2.0 * self.output.unit_roundoff();
        for (b, (d, c)) in device.chunks(per).zip(cpu.chunks(per)).enumerate() {
            let tol = self.tolerance(b);
            if let Some(i) = (0..per).find(|&i| (d[i] - c[i]).abs() > tol + u * c[i].abs()) {
                return Err(format!(
                    "channel {b}, value {i}: device {} against CPU {} (tolerance {tol:e})",
                    d[i], c[i]
                ));
            }
        }
        Ok(())
    }
}
