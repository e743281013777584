//! Launchers for `kernels/beams.cu`. Both ops run in passes of whole channels sized to
//! the device's memory budget. Generated channels are formed on the device from their
//! path words (`beam_steering_f64`, then `beam_channels_f64`) and, for a sweep, never
//! leave it; uploaded ones are copied in. A sweep then projects each transmit beam through
//! the channel (`beam_project_f64`), forms every pair's power (`beam_power_f64`, with the
//! measurement noise) and, unless the grid is wanted, reduces each channel to its best
//! pair on the device (`beam_best_f64`).

use super::channels::ChannelsJob;
use super::geometry::{ChannelSpec, PATH_WORDS};
use super::sweep::{BestPair, Channels, SweepJob, Swept};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::{DeviceBuffer, LaunchConfig, Operand};
use crate::backend::{DeviceError, DeviceLease};
use crate::ops::linalg::Dtype;

const KERNEL_NAMES: &[&str] = &[
    "beam_steering_f64",
    "beam_channels_f64",
    "beam_project_f64",
    "beam_power_f64",
    "beam_best_f64",
];

/// kernels/beams.cu `BEAM_BEST_THREADS`.
const BEST_THREADS: u32 = 256;

pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "beams",
        source: include_str!("../../../kernels/beams.cu"),
        entry_points: KERNEL_NAMES.iter().map(|s| s.to_string()).collect(),
        // Channels and powers are held to a tolerance (`SweepJob::agrees`): FMA stays.
        exact_floats: false,
        nvidia_only: false,
    }
}

/// Device bytes per generated channel: its path words, phasors and values.
fn generated_bytes(spec: &ChannelSpec) -> usize {
    let (nr, nt) = (spec.rx.elements(), spec.tx.elements());
    8 * (PATH_WORDS * spec.paths + 2 * spec.paths * (nr + nt) + 2 * nr * nt)
}

/// Forms `count` channels from their path words on the device: `[count, N_r, N_t]`.
fn form_on_device(
    dev: &DeviceLease<'_>,
    spec: &ChannelSpec,
    words: &[f64],
) -> Result<DeviceBuffer<f64>, DeviceError> {
    let (nr, nt) = (spec.rx.elements(), spec.tx.elements());
    let count = words.len() / (PATH_WORDS * spec.paths);
    let d_words = dev.upload(words)?;
    let mut rx = dev.alloc_zeros::<f64>(2 * count * spec.paths * nr)?;
    let mut tx = dev.alloc_zeros::<f64>(2 * count * spec.paths * nt)?;
    let mut h = dev.alloc_zeros::<f64>(2 * count * nr * nt)?;
    form_into(dev, spec, count, &d_words, [&mut rx, &mut tx], &mut h)?;
    Ok(h)
}

/// Queues the two kernels that form `count` channels from their path words on the
/// device into `h`, through the steering phasors `rx` and `tx` (buffers at least as
/// long as the channels need).
fn form_into(
    dev: &DeviceLease<'_>,
    spec: &ChannelSpec,
    count: usize,
    d_words: &DeviceBuffer<f64>,
    [rx, tx]: [&mut DeviceBuffer<f64>; 2],
    h: &mut DeviceBuffer<f64>,
) -> Result<(), DeviceError> {
    let (nr, nt) = (spec.rx.elements(), spec.tx.elements());
    let total = count * spec.paths;
    let (total64, rx_cols, nr64) = (total as u64, spec.rx.columns as u64, nr as u64);
    let (tx_cols, nt64) = (spec.tx.columns as u64, nt as u64);
    let mut l = dev.launch("beam_steering_f64")?;
    l.arg(d_words)
        .arg(&total64)
        .arg(&rx_cols)
        .arg(&nr64)
        .arg(&tx_cols)
        .arg(&nt64)
        .arg(&mut *rx)
        .arg(&mut *tx);
    // SAFETY: `total` paths of PATH_WORDS words in; total·nr and total·nt phasors out.
    unsafe { l.launch(dev.launch_config(total * (nr + nt))) }?;
    let (count64, paths) = (count as u64, spec.paths as u64);
    let mut l = dev.launch("beam_channels_f64")?;
    l.arg(&*rx)
        .arg(&*tx)
        .arg(&count64)
        .arg(&paths)
        .arg(&nr64)
        .arg(&nt64)
        .arg(h);
    // SAFETY: count·paths phasors of each array in; count·nr·nt complex values out.
    unsafe { l.launch(dev.launch_config(count * nr * nt)) }
}

/// The channels streamed in chunks on two lanes (`DeviceLease::stream_items`): each
/// chunk's path words staged and uploaded, its channels formed through the lane's own
/// phasor scratch, and downloaded while the other lane's chunk is formed.
pub fn launch_channels(job: &ChannelsJob, dev: &DeviceLease<'_>) -> Result<Vec<f64>, DeviceError> {
    let spec = &job.spec;
    let (nr, nt) = (spec.rx.elements(), spec.tx.elements());
    let inputs = [
        Operand::slice(&job.words, PATH_WORDS * spec.paths),
        Operand::scratch(2 * spec.paths * nr),
        Operand::scratch(2 * spec.paths * nt),
    ];
    let mut out = dev.stream_items(spec.count, &inputs, 2 * nr * nt, 0, |ins, h, chunk| {
        let [words, rx, tx] = ins else {
            unreachable!("the three operands above")
        };
        // Each lane's scratch is its own, reused chunk after chunk in its stream's order.
        form_into(dev, spec, chunk.len(), words, [rx, tx], h)
    })?;
    job.round(&mut out);
    Ok(out)
}

pub fn launch_sweep(job: &SweepJob, dev: &DeviceLease<'_>) -> Result<Swept, DeviceError> {
    let (nr, nt) = (job.rx.elements(), job.tx.elements());
    let (kr, kt) = (job.rx_book.beams, job.tx_book.beams);
    let pairs = kr * kt;
    let mut per_channel = SweepJob::device_bytes_per_channel(nr, nt, kr, kt);
    if let Channels::Generated { spec, .. } = &job.channels {
        per_channel += generated_bytes(spec);
    }
    // The codebooks and the noise scales stay on the device beside every pass.
    let fixed = 8 * (job.tx_book.values.len() + job.rx_book.values.len() + kr);
    let per_pass = dev.items_per_pass(job.count, per_channel, fixed);
    let d_f = dev.upload(&job.tx_book.values)?;
    let d_w = dev.upload(&job.rx_book.values)?;
    let d_scale = dev.upload(&job.noise_scales())?;
    let keys = job.noise_keys();
    let noisy = u32::from(keys.is_some());
    let keys = keys.unwrap_or_else(|| vec![0; job.count]);
    let mut grid = job.grid.then(|| Vec::with_capacity(job.count * pairs));
    let mut best = Vec::with_capacity(job.count);
    let mut first = 0;
    while first < job.count {
        dev.still_wanted()?;
        let count = per_pass.min(job.count - first);
        let h = match &job.channels {
            Channels::Generated { spec, words, .. } => {
                let per = PATH_WORDS * spec.paths;
                form_on_device(dev, spec, &words[first * per..(first + count) * per])?
            }
            Channels::Uploaded(h) => {
                let per = 2 * nr * nt;
                dev.upload(&h[first * per..(first + count) * per])?
            }
        };
        let (count64, nr64, nt64, kt64, kr64) =
            (count as u64, nr as u64, nt as u64, kt as u64, kr as u64);
        let mut x = dev.alloc_zeros::<f64>(2 * count * nr * kt)?;
        let mut l = dev.launch("beam_project_f64")?;
        l.arg(&h)
            .arg(&count64)
            .arg(&nr64)
            .arg(&nt64)
            .arg(&d_f)
            .arg(&kt64)
            .arg(&mut x);
        // SAFETY: count channels of nr·nt and kt beams of nt in; count·nr·kt out.
        unsafe { l.launch(dev.launch_config(count * nr * kt)) }?;
        let d_keys = dev.upload(&keys[first..first + count])?;
        let mut power = dev.alloc_zeros::<f64>(count * pairs)?;
        let mut l = dev.launch("beam_power_f64")?;
        l.arg(&x)
            .arg(&count64)
            .arg(&nr64)
            .arg(&kt64)
            .arg(&d_w)
            .arg(&kr64)
            .arg(&d_keys)
            .arg(&d_scale)
            .arg(&noisy)
            .arg(&mut power);
        // SAFETY: count·nr·kt projections, kr beams of nr, count keys and kr scales in;
        // count·kr·kt powers out.
        unsafe { l.launch(dev.launch_config(count * pairs)) }?;
        match &mut grid {
            // The grid comes back whole: the best pairs are picked from it as the CPU
            // picks them.
            Some(g) => g.extend(dev.download(&power)?),
            None => best.extend(best_on_device(dev, job, &power, count)?),
        }
        first += count;
    }
    Ok(match grid {
        Some(g) => job.finish(g),
        None => Swept { best, grid: None },
    })
}

/// Each of `count` channels' best pair, reduced on the device.
fn best_on_device(
    dev: &DeviceLease<'_>,
    job: &SweepJob,
    power: &DeviceBuffer<f64>,
    count: usize,
) -> Result<Vec<BestPair>, DeviceError> {
    let kt = job.tx_book.beams;
    let (count64, pairs) = (count as u64, job.pairs() as u64);
    let as_f32 = u32::from(job.output == Dtype::F32);
    let mut index = dev.alloc_zeros::<u64>(count)?;
    let mut top = dev.alloc_zeros::<f64>(count)?;
    let blocks = count.min(dev.launch_config(count * BEST_THREADS as usize).grid_dim.0 as usize);
    let config = LaunchConfig {
        grid_dim: (blocks.max(1) as u32, 1, 1),
        block_dim: (BEST_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = dev.launch("beam_best_f64")?;
    l.arg(power)
        .arg(&count64)
        .arg(&pairs)
        .arg(&as_f32)
        .arg(&mut index)
        .arg(&mut top);
    // SAFETY: count·pairs powers in; count indices and powers out; BEST_THREADS threads,
    // the size of the kernel's shared arrays.
    unsafe { l.launch(config) }?;
    let (index, top) = (dev.download(&index)?, dev.download(&top)?);
    Ok(index
        .into_iter()
        .zip(top)
        .map(|(k, power)| BestPair {
            rx: k as usize / kt,
            tx: k as usize % kt,
            power,
        })
        .collect())
}
