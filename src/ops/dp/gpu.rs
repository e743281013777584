//! GPU launchers for `kernels/dp.cu`. Clip factors are computed on the host from the
//! device's squared norms with the CPU twin's own function, so both backends clip alike.

use super::privatize::{clip_factors, clip_stats, Gradients, PrivatizeJob, Privatized, LANES};
use super::release::{Mechanism, NoiseJob};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::Operand;
use crate::backend::DeviceLease;
use crate::backend::{DeviceBuffer, DeviceError, Element};

/// Every kernel `kernels/dp.cu` must provide.
const KERNEL_NAMES: &[&str] = &[
    "dp_sq_norms_f32",
    "dp_sq_norms_f64",
    "dp_clip_sum_noise_f32",
    "dp_clip_sum_noise_f64",
    "dp_gaussian_release",
    "dp_laplace_release",
];

/// `kernels/dp.cu`: gradient norms, clip-sum-noise and the noise releases.
pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "dp",
        source: include_str!("../../../kernels/dp.cu"),
        entry_points: KERNEL_NAMES.iter().map(|s| s.to_string()).collect(),
        // Privatized gradients and releases are checked bit for bit (`verify::same_bits`).
        exact_floats: true,
    }
}

pub fn launch_privatize(
    job: &PrivatizeJob,
    dev: &DeviceLease<'_>,
) -> Result<Privatized, DeviceError> {
    match &job.gradients {
        Gradients::F32(g) => privatize_resident(job, &dev.upload(g)?, dev),
        Gradients::F64(g) => privatize_resident(job, &dev.upload(g)?, dev),
    }
}

/// The gradients' element type, as the kernels are named.
pub trait GradientElement: Element {
    const DTYPE: &'static str;
}

impl GradientElement for f32 {
    const DTYPE: &'static str = "f32";
}

impl GradientElement for f64 {
    const DTYPE: &'static str = "f64";
}

/// Privatizes gradients already on the device (`job.gradients` is not read): the two
/// kernel passes plus the small norm, factor and result copies. Benchmarks time this to
/// measure device bandwidth without the upload.
pub fn privatize_resident<T: GradientElement>(
    job: &PrivatizeJob,
    dg: &DeviceBuffer<T>,
    dev: &DeviceLease<'_>,
) -> Result<Privatized, DeviceError> {
    let dtype = T::DTYPE;
    let (rows, cols, layers) = (job.rows as u64, job.cols as u64, job.layers() as u32);
    let dbounds = dev.upload(&job.bounds)?;
    let mut dsq: DeviceBuffer<f64> = dev.alloc_zeros(job.rows * job.layers())?;
    let norms = format!("dp_sq_norms_{dtype}");
    let mut launch = dev.launch(&norms)?;
    launch
        .arg(dg)
        .arg(&rows)
        .arg(&cols)
        .arg(&dbounds)
        .arg(&layers)
        .arg(&mut dsq);
    // The reduction needs exactly LANES threads per block; one block per (row, layer).
    let config = dev.launch_config(job.rows * job.layers() * LANES);
    assert_eq!(config.block_dim.0 as usize, LANES);
    // SAFETY: g has rows*cols elements, bounds layers+1 (the last = cols), sq rows*layers.
    unsafe { launch.launch(config) }?;
    let sq = dev.download(&dsq)?;

    let factors = clip_factors(&sq, &job.clip_norms);
    let dfactors = dev.upload(&factors)?;
    let key = job.key.words();
    let dkey = dev.upload(&key)?;
    let mut dout: DeviceBuffer<f64> = dev.alloc_zeros(job.cols)?;
    let (grid, inv_grid) = (job.plan.grid, 1.0 / job.plan.grid);
    let sum = format!("dp_clip_sum_noise_{dtype}");
    let mut launch = dev.launch(&sum)?;
    launch
        .arg(dg)
        .arg(&rows)
        .arg(&cols)
        .arg(&dbounds)
        .arg(&layers)
        .arg(&dfactors)
        .arg(&dkey)
        .arg(&inv_grid)
        .arg(&grid)
        .arg(&job.plan.t)
        .arg(&job.plan.c)
        .arg(&job.divisor)
        .arg(&mut dout);
    // SAFETY: as above; factors has rows*layers entries, key 8 words, out cols.
    unsafe { launch.launch(dev.launch_config(job.cols)) }?;
    let gradient = dev.download(&dout)?;
    Ok(Privatized {
        gradient,
        stats: clip_stats(&sq, &job.clip_norms),
    })
}

/// The release streamed in chunks (`DeviceLease::stream_items`): each chunk's values
/// staged in, released with the noise of their indices in the whole, staged back, on two
/// lanes so one chunk's copies overlap another's kernel.
pub fn launch_noise(job: &NoiseJob, dev: &DeviceLease<'_>) -> Result<Vec<f64>, DeviceError> {
    let key = job.key.words();
    let dkey = dev.upload(&key)?;
    let grid = job.mechanism.grid();
    let inv_grid = 1.0 / grid;
    // The Gaussian kernel takes one more scale parameter (c) before the output.
    let (kernel, t, c) = match job.mechanism {
        Mechanism::Gaussian(p) => ("dp_gaussian_release", p.t, Some(p.c)),
        Mechanism::Laplace(p) => ("dp_laplace_release", p.t, None),
    };
    let values = [Operand::slice(&job.values, 1)];
    let fixed = std::mem::size_of_val(&key);
    dev.stream_items(job.len(), &values, 1, fixed, |dx, dout, chunk| {
        let (n, first) = (chunk.len() as u64, chunk.items.start as u64);
        let mut launch = dev.launch(kernel)?;
        launch
            .arg(&dx[0])
            .arg(&n)
            .arg(&first)
            .arg(&dkey)
            .arg(&inv_grid)
            .arg(&grid)
            .arg(&t);
        if let Some(c) = &c {
            launch.arg(c);
        }
        launch.arg(dout);
        // SAFETY: x and out hold at least n elements, key 8 words; the arguments match
        // the kernel's parameters in order.
        unsafe { launch.launch(dev.launch_config(chunk.len())) }
    })
}
