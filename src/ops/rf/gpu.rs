//! The RF kernels (`kernels/rf.cu`): `rf_waveform` synthesises each sample's transmitted
//! waveform from the spec the CPU draws (`generate::draft`), `rf_receive` writes every
//! receiver's recording of a batch of samples from the plans the CPU draws, and
//! `rf_chunk_reduce` reduces those recordings, still on the device, to the per-chunk sums
//! the features are derived from (`features::extract_from_sums`). The batch is packed into
//! flat arrays once; the host build of the kernels (`gpu_host_parity`) and the device read
//! the same arrays.

use super::features::ChunkSums;
use super::generate::{SamplePlan, WaveDraft};
use super::multipath::padded_len;
use super::waveform::{Audio, WaveSpec};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::{LaunchConfig, Operand};
use crate::backend::DeviceLease;
use crate::backend::{DeviceBuffer, DeviceError};
use rustfft::num_complex::Complex32;

/// Every kernel `kernels/rf.cu` must provide.
const KERNEL_NAMES: &[&str] = &["rf_waveform", "rf_receive", "rf_chunk_reduce"];

/// `kernels/rf.cu`: the waveform, the receivers and the chunk reduction.
pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "rf",
        source: include_str!("../../../kernels/rf.cu"),
        entry_points: KERNEL_NAMES.iter().map(|s| s.to_string()).collect(),
        // The FIR, the noise and the chunk sums round as the host twins do, bit for bit
        // (kernels/rf.cuh; ops/rf/gpu_host_parity.rs), and datasets compare sums exactly.
        exact_floats: true,
        nvidia_only: false,
    }
}
/// Receivers run along the grid's y dimension.
pub const MAX_RECEIVERS_PER_LAUNCH: usize = 65_535;

/// Threads per `rf_waveform` block (`RF_WAVE_THREADS`).
pub const WAVE_THREADS: u32 = 256;
/// Threads per `rf_chunk_reduce` block (`RF_REDUCE_THREADS`).
pub const REDUCE_THREADS: u32 = 256;
/// The longest Welch segment `rf_chunk_reduce` takes: its two f32 arrays in shared memory
/// (32 KiB at 4096) stay within the 48 KiB every device gives a block without opting in.
/// Longer segments (sample rates above 1.6 MHz) are reduced on the CPU.
pub const MAX_REDUCE_SEGMENT: usize = 4096;

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

// SAFETY: plain old data with the C struct's layout (#[repr(C)], 8-byte fields: no
// padding); all zeros is a value.
unsafe impl crate::backend::device::Element for RfReceiver {}

/// `struct rf_wave` of `kernels/rf_waveform.cuh`: one waveform for `rf_waveform` to
/// synthesise, its pairs in the batch's `wave_params`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RfWave {
    pub kind: u64,
    pub out: u64,
    pub lead: u64,
    pub len: u64,
    pub total: u64,
    pub params: u64,
    pub count: u64,
    pub per_key: u64,
    pub sample_rate_hz: f64,
    pub fm_scale: f64,
    pub am_depth: f64,
    pub f0: f64,
    pub syllable_hz: f64,
    pub syllable_phase: f64,
}

// SAFETY: plain old data with the C struct's layout (#[repr(C)], 8-byte fields: no
// padding); all zeros is a value.
unsafe impl crate::backend::device::Element for RfWave {}

impl RfWave {
    /// `spec` padded by `lead`, written from index `out` of the waveform arrays; its
    /// harmonics or keys appended to `params`.
    fn new(spec: &WaveSpec, out: u64, lead: usize, params: &mut Vec<f64>) -> Self {
        let kind = super::generate::Modulation::ALL
            .iter()
            .position(|m| *m == spec.modulation)
            .expect("one of ALL") as u64;
        let mut w = RfWave {
            kind,
            out,
            lead: lead as u64,
            len: spec.len as u64,
            total: padded_len(spec.len, lead) as u64,
            params: (params.len() / 2) as u64,
            sample_rate_hz: spec.sample_rate_hz,
            fm_scale: 2.0 * std::f64::consts::PI * spec.deviation_hz,
            am_depth: spec.am_depth,
            ..Default::default()
        };
        let pairs: &[(f64, f64)] = match &spec.audio {
            Audio::Voice(v) => {
                (w.f0, w.syllable_hz, w.syllable_phase) = (v.f0, v.syllable_hz, v.syllable_phase);
                &v.harmonics
            }
            Audio::Tone { hz } => {
                w.f0 = *hz;
                &[]
            }
            Audio::Dtmf { keys, per_key } => {
                w.per_key = *per_key as u64;
                keys
            }
            Audio::None => &[],
        };
        params.extend(pairs.iter().flat_map(|&(a, b)| [a, b]));
        w.count = pairs.len() as u64;
        w
    }
}

/// A batch of samples' receivers as the kernels read them: their waveforms either
/// synthesised on the host (`wave_re`, `wave_im`; `pack`) or specs for `rf_waveform`
/// (`waves`; `pack_drafts`).
#[derive(Default)]
pub struct Batch {
    pub receivers: Vec<RfReceiver>,
    pub wave_re: Vec<f32>,
    pub wave_im: Vec<f32>,
    pub waves: Vec<RfWave>,
    pub wave_params: Vec<f64>,
    /// Floats in each of the waveform arrays, padding included.
    pub wave_len: u64,
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

/// Samples with their waveforms synthesised on the host.
pub fn pack(samples: &[&SamplePlan]) -> Batch {
    pack_with(samples, |s, b| {
        let (re, im) = s.wave.parts();
        let wave = b.wave_len + s.wave.lead() as u64;
        b.wave_re.extend_from_slice(re);
        b.wave_im.extend_from_slice(im);
        b.wave_len = b.wave_re.len() as u64;
        (wave, s.wave.len() as u64)
    })
}

/// Samples whose waveforms `rf_waveform` synthesises on the device.
pub fn pack_drafts(samples: &[&SamplePlan<WaveDraft>]) -> Batch {
    pack_with(samples, |s, b| {
        let (spec, lead) = (&s.wave.spec, s.wave.lead);
        let w = RfWave::new(spec, b.wave_len, lead, &mut b.wave_params);
        b.wave_len += w.total;
        b.waves.push(w);
        (w.out + w.lead, w.len)
    })
}

/// Packs every sample's receivers; `wave` adds a sample's waveform to the batch and
/// returns where its sample 0 is in the waveform arrays, and its length.
fn pack_with<W>(
    samples: &[&SamplePlan<W>],
    mut wave: impl FnMut(&SamplePlan<W>, &mut Batch) -> (u64, u64),
) -> Batch {
    let mut b = Batch::default();
    for s in samples {
        let (wave, len) = wave(s, &mut b);
        for p in &s.plans {
            let coeff_start = b.coeff_offset.len() as u64;
            for (m, c) in p.channel.coefficients() {
                b.coeff_offset.push(m);
                b.coeff_re.push(c.re as f32);
                b.coeff_im.push(c.im as f32);
            }
            let gains = (b.gains.len() / 2) as u64;
            b.gains.extend(p.gains.iter().flat_map(|g| [g.re, g.im]));
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

/// `struct rf_chunk` of `kernels/rf_features.cuh`: complex samples [start, start + len)
/// of the batch's interleaved recordings.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RfChunk {
    pub start: u64,
    pub len: u64,
}

// SAFETY: plain old data with the C struct's layout (#[repr(C)], 8-byte fields: no
// padding); all zeros is a value.
unsafe impl crate::backend::device::Element for RfChunk {}

impl RfChunk {
    /// The chunk's samples out of the batch's interleaved recordings.
    pub fn samples(&self, interleaved: &[f32]) -> Vec<Complex32> {
        complex(&interleaved[2 * self.start as usize..2 * (self.start + self.len) as usize])
    }
}

/// Interleaved (re, im) floats as complex samples.
fn complex(interleaved: &[f32]) -> Vec<Complex32> {
    interleaved
        .chunks_exact(2)
        .map(|p| Complex32::new(p[0], p[1]))
        .collect()
}

/// The chunks `features::extract` cuts from each receiver's recording, receiver by
/// receiver: whole chunks of `chunk` samples (`features::plan` makes a recording shorter
/// than one chunk a single chunk of its own length).
pub fn chunks_of(b: &Batch, chunk: usize) -> Vec<RfChunk> {
    b.receivers
        .iter()
        .flat_map(|r| recording_chunks(r.out, r.len, chunk))
        .collect()
}

/// The whole chunks of the recording of `len` samples at `start`, as `features::extract`
/// cuts them.
pub fn recording_chunks(start: u64, len: u64, chunk: usize) -> impl Iterator<Item = RfChunk> {
    let size = (chunk as u64).min(len).max(1);
    (0..len / size).map(move |c| RfChunk {
        start: start + c * size,
        len: size,
    })
}

/// e^{−2πim/seg} for m < seg/2, as (re, im) pairs: computed in f64, rounded to f32.
pub fn twiddles(seg: usize) -> Vec<f32> {
    (0..seg / 2)
        .flat_map(|m| {
            let t = -2.0 * std::f64::consts::PI * m as f64 / seg as f64;
            [t.cos() as f32, t.sin() as f32]
        })
        .collect()
}

/// `rf_chunk_reduce`'s output (one record a chunk: seg bin sums, then 4 envelope
/// numbers) as sums.
pub fn chunk_sums(chunks: &[RfChunk], seg: usize, records: &[f64]) -> Vec<ChunkSums> {
    chunks
        .iter()
        .zip(records.chunks_exact(seg + 4))
        .map(|(c, record)| record_sums(c, seg, record))
        .collect()
}

/// One chunk's record of `rf_chunk_reduce` as its sums.
fn record_sums(c: &RfChunk, seg: usize, record: &[f64]) -> ChunkSums {
    let env = &record[seg..];
    ChunkSums {
        power_sum: env[0],
        magnitude_sum: env[1],
        power_max: env[2],
        crossings: env[3] as u64,
        bins: record[..seg].to_vec(),
        segments: c.len as usize / seg,
    }
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
                    complex(&out[at..at + 2 * r.len as usize])
                })
                .collect()
        })
        .collect()
}

/// Runs `rf_receive` over the batch; returns the interleaved recordings.
pub fn launch_receive(b: &Batch, dev: &DeviceLease<'_>) -> Result<Vec<f32>, DeviceError> {
    if b.receivers.is_empty() {
        return Ok(Vec::new());
    }
    let out = receive_on_device(b, dev)?;
    dev.download(&out)
}

/// The batch's recordings reduced to chunk sums on the device (`features::plan` gives
/// `chunk` and `seg`), with the recordings themselves when `keep_iq`: all the device sends
/// back otherwise is seg + 4 numbers a chunk.
pub fn launch_receive_and_reduce(
    b: &Batch,
    chunk: usize,
    seg: usize,
    keep_iq: bool,
    dev: &DeviceLease<'_>,
) -> Result<(Option<Vec<f32>>, Vec<ChunkSums>), DeviceError> {
    check_segment(chunk, seg)?;
    if b.receivers.is_empty() {
        return Ok((keep_iq.then(Vec::new), Vec::new()));
    }
    let recordings = receive_on_device(b, dev)?;
    let chunks = chunks_of(b, chunk);
    let sums = reduce_on_device(&recordings, &chunks, seg, dev)?;
    let iq = keep_iq.then(|| dev.download(&recordings)).transpose()?;
    Ok((iq, sums))
}

/// One uploaded recording's chunk sums (`/rf/features` on the device): whole chunks of
/// `chunk` samples, as `features::extract` cuts them (`features::plan` gives `chunk` and
/// `seg`). Streamed in chunks on two lanes (`DeviceLease::stream_items`), an item being
/// one feature chunk: its samples staged straight from the recording (complex samples are
/// the interleaved floats the kernel reads) and its record of sums staged back, while the
/// other lane's chunks are reduced.
pub fn launch_recording_sums(
    iq: &[Complex32],
    chunk: usize,
    seg: usize,
    dev: &DeviceLease<'_>,
) -> Result<Vec<ChunkSums>, DeviceError> {
    check_segment(chunk, seg)?;
    let chunks: Vec<RfChunk> = recording_chunks(0, iq.len() as u64, chunk).collect();
    let Some(size) = chunks.first().map(|c| c.len as usize) else {
        return Ok(Vec::new());
    };
    check_grid(chunks.len())?;
    let floats: &[f32] = bytemuck::cast_slice(iq);
    // Feature chunk i starts at i · size in the recording, and a lane's buffer starts at
    // its first item, so its j-th item starts at j · size there: the recording's own
    // table of chunks serves every launch (its first `count` entries).
    let fixed = std::mem::size_of_val(chunks.as_slice()) + 8 * seg;
    let tables = ReduceTables::upload(&chunks, seg, dev)?;
    let inputs = [Operand::slice(floats, 2 * size)];
    let records = dev.stream_items(chunks.len(), &inputs, seg + 4, fixed, |ins, out, c| {
        tables.launch(&ins[0], c.len(), out, dev)
    })?;
    Ok(chunk_sums(&chunks, seg, &records))
}

/// Whether one launch of `rf_chunk_reduce` (a block per chunk) takes `count` chunks.
fn check_grid(count: usize) -> Result<(), DeviceError> {
    if count > i32::MAX as usize {
        return Err(DeviceError::unsupported(format!(
            "{count} chunks in one batch; the grid takes 2^31 − 1"
        )));
    }
    Ok(())
}

/// Whether `rf_chunk_reduce` takes this shape.
fn check_segment(chunk: usize, seg: usize) -> Result<(), DeviceError> {
    if !seg.is_power_of_two() || !(2..=MAX_REDUCE_SEGMENT).contains(&seg) || chunk < seg {
        return Err(DeviceError::unsupported(format!(
            "rf_chunk_reduce takes power-of-two segments up to {MAX_REDUCE_SEGMENT} within a chunk; got {seg} in {chunk}"
        )));
    }
    Ok(())
}

/// Launches `rf_chunk_reduce` over `chunks` of the interleaved recordings on the device;
/// returns their sums.
fn reduce_on_device(
    recordings: &DeviceBuffer<f32>,
    chunks: &[RfChunk],
    seg: usize,
    dev: &DeviceLease<'_>,
) -> Result<Vec<ChunkSums>, DeviceError> {
    check_grid(chunks.len())?;
    let tables = ReduceTables::upload(chunks, seg, dev)?;
    let mut records = dev.alloc_zeros::<f64>(chunks.len() * (seg + 4))?;
    tables.launch(recordings, chunks.len(), &mut records, dev)?;
    Ok(chunk_sums(chunks, seg, &dev.download(&records)?))
}

/// What `rf_chunk_reduce` reads besides the recordings: the chunks (where each starts in
/// them), the Hann window and the FFT's twiddles, on the device.
struct ReduceTables {
    chunks: DeviceBuffer<RfChunk>,
    window: DeviceBuffer<f32>,
    twiddles: DeviceBuffer<f32>,
    seg: u32,
}

impl ReduceTables {
    fn upload(chunks: &[RfChunk], seg: usize, dev: &DeviceLease<'_>) -> Result<Self, DeviceError> {
        Ok(ReduceTables {
            chunks: dev.upload(chunks)?,
            window: dev.upload(&super::features::hann(seg))?,
            twiddles: dev.upload(&twiddles(seg))?,
            seg: seg as u32,
        })
    }

    /// Reduces the first `count` chunks into `out` (`seg + 4` doubles each).
    fn launch(
        &self,
        recordings: &DeviceBuffer<f32>,
        count: usize,
        out: &mut DeviceBuffer<f64>,
        dev: &DeviceLease<'_>,
    ) -> Result<(), DeviceError> {
        let (seg, bits) = (self.seg, self.seg.trailing_zeros());
        let config = LaunchConfig {
            grid_dim: (count as u32, 1, 1),
            block_dim: (REDUCE_THREADS, 1, 1),
            shared_mem_bytes: 8 * seg,
        };
        let mut launch = dev.launch("rf_chunk_reduce")?;
        launch
            .arg(recordings)
            .arg(&self.chunks)
            .arg(&self.window)
            .arg(&self.twiddles)
            .arg(&seg)
            .arg(&bits)
            .arg(out);
        // SAFETY: each of the first `count` chunks lies inside `recordings` (made by
        // chunks_of or recording_chunks over what they were cut from, or, streamed, over
        // a lane's buffer of `count` chunks); window holds seg floats and tw seg/2 pairs,
        // out seg + 4 doubles per chunk; the shared memory holds the 2·seg floats a
        // segment needs, and check_segment keeps seg within MAX_REDUCE_SEGMENT, the
        // default limit; count ≤ 2^31 − 1 (check_grid).
        unsafe { launch.launch(config) }
    }
}

/// The batch's waveforms synthesised by `rf_waveform` (a batch from `pack_drafts`),
/// copied back as (re, im): what `pack` would have uploaded, within the kernel's
/// tolerance.
pub fn launch_waveforms(
    b: &Batch,
    dev: &DeviceLease<'_>,
) -> Result<(Vec<f32>, Vec<f32>), DeviceError> {
    if b.waves.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let (re, im) = waveforms_on_device(b, dev)?;
    Ok((dev.download(&re)?, dev.download(&im)?))
}

/// Launches `rf_waveform` over `b.waves`; the waveforms stay on the device.
fn waveforms_on_device(
    b: &Batch,
    dev: &DeviceLease<'_>,
) -> Result<(DeviceBuffer<f32>, DeviceBuffer<f32>), DeviceError> {
    if b.waves.len() > i32::MAX as usize {
        return Err(DeviceError::unsupported(format!(
            "{} waveforms in one batch; the grid takes 2^31 − 1",
            b.waves.len()
        )));
    }
    let waves = dev.upload(&b.waves)?;
    // Carriers and tones have no pairs; an upload is never empty.
    let params = dev.upload(if b.wave_params.is_empty() {
        &[0.0][..]
    } else {
        &b.wave_params
    })?;
    let mut re = dev.alloc_zeros::<f32>(b.wave_len as usize)?;
    let mut im = dev.alloc_zeros::<f32>(b.wave_len as usize)?;
    let config = LaunchConfig {
        grid_dim: (b.waves.len() as u32, 1, 1),
        block_dim: (WAVE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = dev.launch("rf_waveform")?;
    launch.arg(&waves).arg(&params).arg(&mut re).arg(&mut im);
    // SAFETY: `pack_drafts` laid the waves out back to back in arrays of wave_len floats
    // (each [out, out + total)), their pairs inside params; the block is WAVE_THREADS =
    // RF_WAVE_THREADS threads, the size of the kernel's shared arrays.
    unsafe { launch.launch(config) }?;
    Ok((re, im))
}

/// Launches `rf_receive`; the recordings stay on the device.
fn receive_on_device(b: &Batch, dev: &DeviceLease<'_>) -> Result<DeviceBuffer<f32>, DeviceError> {
    if b.receivers.len() > MAX_RECEIVERS_PER_LAUNCH {
        return Err(DeviceError::unsupported(format!(
                "{} receivers in one batch; rf_receive takes at most {MAX_RECEIVERS_PER_LAUNCH} (grid y)",
                b.receivers.len()
            )));
    }
    let receivers = dev.upload(&b.receivers)?;
    let (wave_re, wave_im) = if b.waves.is_empty() {
        (dev.upload(&b.wave_re)?, dev.upload(&b.wave_im)?)
    } else {
        waveforms_on_device(b, dev)?
    };
    // Never empty: every channel has its first arrival's coefficient.
    let coeff_offset = dev.upload(&b.coeff_offset)?;
    let coeff_re = dev.upload(&b.coeff_re)?;
    let coeff_im = dev.upload(&b.coeff_im)?;
    let gains = dev.upload(&b.gains)?;
    let mut out = dev.alloc_zeros::<f32>(2 * b.out_len as usize)?;
    let longest = b.receivers.iter().map(|r| r.len).max().unwrap_or(0) as usize;
    let mut config = dev.launch_config(longest);
    config = LaunchConfig {
        grid_dim: (config.grid_dim.0, b.receivers.len() as u32, 1),
        ..config
    };
    let mut launch = dev.launch("rf_receive")?;
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
    Ok(out)
}
