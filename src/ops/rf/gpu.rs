//! The `rf_receive` kernel (`kernels/rf.cu`): every receiver's recording of a batch of
//! samples, from the plans the CPU draws (`generate::plan`). The batch is packed into
//! flat arrays once; the host build of the kernel (`gpu_host_parity`) and the device read
//! the same arrays.

use super::generate::SamplePlan;
use crate::backend::cuda::DeviceErrorKind;
use crate::backend::cuda::DeviceLease;
use crate::backend::DeviceError;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rustfft::num_complex::Complex32;

/// Every kernel `kernels/rf.cu` must provide.
pub const KERNEL_NAMES: &[&str] = &["rf_receive"];
/// Receivers run along the grid's y dimension.
pub const MAX_RECEIVERS_PER_LAUNCH: usize = 65_535;

/// `struct rf_receiver` of `kernels/rf.cuh`: 8-byte fields only, so the layouts agree.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RfReceiver {
    pub wave: u64,
    pub coeff_start: u64,
    pub coeff_end: u64,
    pub gains: u64,
    pub block: u64,
    pub len: u64,
    pub out: u64,
    pub noise_key: u64,
    pub carrier_offset_hz: f64,
    pub drift_hz_per_s: f64,
    pub sample_rate_hz: f64,
    pub noise_sigma: f64,
}

// SAFETY: plain old data with the C struct's layout (#[repr(C)], 8-byte fields).
unsafe impl cudarc::driver::DeviceRepr for RfReceiver {}

/// A batch of samples' receivers as the kernel reads them.
#[derive(Default)]
pub struct Batch {
    pub receivers: Vec<RfReceiver>,
    pub wave_re: Vec<f32>,
    pub wave_im: Vec<f32>,
    pub coeff_offset: Vec<i64>,
    pub coeff_re: Vec<f32>,
    pub coeff_im: Vec<f32>,
    /// Block gains as (re, im) pairs.
    pub gains: Vec<f64>,
    /// Receivers per sample, in order.
    pub per_sample: Vec<usize>,
    /// Complex samples out, all receivers.
    pub out_len: u64,
}

pub fn pack(samples: &[&SamplePlan]) -> Batch {
    let mut b = Batch::default();
    for s in samples {
        let (re, im) = s.wave.parts();
        let wave = (b.wave_re.len() + s.wave.lead()) as u64;
        b.wave_re.extend_from_slice(re);
        b.wave_im.extend_from_slice(im);
        for p in &s.plans {
            let coeff_start = b.coeff_offset.len() as u64;
            for (m, c) in p.channel.coefficients() {
                b.coeff_offset.push(m);
                b.coeff_re.push(c.re as f32);
                b.coeff_im.push(c.im as f32);
            }
            let gains = (b.gains.len() / 2) as u64;
            b.gains.extend(p.gains.iter().flat_map(|g| [g.re, g.im]));
            let len = s.wave.len() as u64;
            b.receivers.push(RfReceiver {
                wave,
                coeff_start,
                coeff_end: b.coeff_offset.len() as u64,
                gains,
                block: p.block as u64,
                len,
                out: b.out_len,
                noise_key: p.noise.0.key(),
                carrier_offset_hz: p.carrier_offset_hz,
                drift_hz_per_s: p.drift_hz_per_s,
                sample_rate_hz: p.sample_rate_hz,
                noise_sigma: p.noise_sigma,
            });
            b.out_len += len;
        }
        b.per_sample.push(s.plans.len());
    }
    b
}

/// The kernel's interleaved output as recordings, per sample per receiver.
pub fn unpack(b: &Batch, out: &[f32]) -> Vec<Vec<Vec<Complex32>>> {
    let mut receivers = b.receivers.iter();
    b.per_sample
        .iter()
        .map(|&count| {
            (0..count)
                .map(|_| {
                    let r = receivers.next().expect("one per packed receiver");
                    let at = 2 * r.out as usize;
                    out[at..at + 2 * r.len as usize]
                        .chunks_exact(2)
                        .map(|p| Complex32::new(p[0], p[1]))
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Runs `rf_receive` over the batch; returns the interleaved recordings.
pub fn receive_cuda(b: &Batch, dev: &DeviceLease<'_>) -> Result<Vec<f32>, DeviceError> {
    if b.receivers.is_empty() {
        return Ok(Vec::new());
    }
    if b.receivers.len() > MAX_RECEIVERS_PER_LAUNCH {
        return Err(DeviceError {
            kind: DeviceErrorKind::Unsupported,
            message: format!(
                "{} receivers in one batch; rf_receive takes at most {MAX_RECEIVERS_PER_LAUNCH} (grid y)",
                b.receivers.len()
            ),
        });
    }
    let stream = dev.stream();
    let receivers = stream.clone_htod(&b.receivers)?;
    let wave_re = stream.clone_htod(&b.wave_re)?;
    let wave_im = stream.clone_htod(&b.wave_im)?;
    // Never empty: every channel has its first arrival's coefficient.
    let coeff_offset = stream.clone_htod(&b.coeff_offset)?;
    let coeff_re = stream.clone_htod(&b.coeff_re)?;
    let coeff_im = stream.clone_htod(&b.coeff_im)?;
    let gains = stream.clone_htod(&b.gains)?;
    let mut out = stream.alloc_zeros::<f32>(2 * b.out_len as usize)?;
    let longest = b.receivers.iter().map(|r| r.len).max().unwrap_or(0) as usize;
    let mut config = dev.launch_config(longest);
    config = LaunchConfig {
        grid_dim: (config.grid_dim.0, b.receivers.len() as u32, 1),
        ..config
    };
    let f = dev.function("rf_receive")?;
    let mut launch = stream.launch_builder(f);
    launch
        .arg(&receivers)
        .arg(&wave_re)
        .arg(&wave_im)
        .arg(&coeff_offset)
        .arg(&coeff_re)
        .arg(&coeff_im)
        .arg(&gains)
        .arg(&mut out);
    // SAFETY: every offset in `receivers` was produced by `pack` over these arrays: the
    // waveform indices stay inside wave_re/im (padded by the channels' reach), coefficient
    // and gain ranges inside theirs, outputs inside out (2·out_len floats).
    unsafe { launch.launch(config) }?;
    let host = stream.clone_dtoh(&out)?;
    stream.synchronize()?;
    Ok(host)
}
