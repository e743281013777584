//! GPU launchers for `kernels/dp.cu`. The batch's rows are streamed in chunks on two
//! lanes: each chunk's norms (per segment of a row, then folded) and clip factors, then
//! its clipped rows added to the column sums, while the next chunk is uploaded on the
//! other lane. A chunk's kernels wait for the previous chunk's, so the sums are added in
//! row order, as the CPU twin adds them. The clip factors are computed on the device with
//! each step correctly rounded, so they equal the twin's to the bit.
use super::privatize::{clip_stats, Gradients, PrivatizeJob, Privatized, LANES, SEGMENT};
use super::release::{Mechanism, NoiseJob};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::{Event, Operand};
use crate::backend::DeviceLease;
use crate::backend::{DeviceBuffer, DeviceError, Element};

/// Every kernel `kernels/dp.cu` must provide.
const KERNEL_NAMES: &[&str] = &[
    "dp_sq_partials_f32",
    "dp_sq_partials_f64",
    "dp_fold_norms",
    "dp_clip_sum_f32",
    "dp_clip_sum_f64",
    "dp_snap_noise",
    "dp_gaussian_release",
    "dp_laplace_release",
];

/// `kernels/dp.cu`: gradient norms and clip factors, clipped column sums, snapping and
/// noise, and the noise releases.
pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "dp",
        source: include_str!("../../../kernels/dp.cu"),
        entry_points: KERNEL_NAMES.iter().map(|s| s.to_string()).collect(),
        // Privatized gradients and releases are checked bit for bit (`verify::same_bits`).
        exact_floats: true,
        nvidia_only: false,
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

/// What every chunk of one batch shares on the device: the layer bounds, their segments'
/// bounds, the clip norms and the running column sums, which every chunk's sums kernel
/// writes, on either lane: it is handed to that kernel mutably, so the emulated device's
/// order check sees both lanes' writes and refuses any the events do not order.
struct Batch<'j> {
    job: &'j PrivatizeJob,
    bounds: DeviceBuffer<u64>,
    seg_bounds: DeviceBuffer<u64>,
    segments: usize,
    clip: DeviceBuffer<f64>,
    sums: DeviceBuffer<f64>,
}

/// A chunk's own device room, per lane: its rows' segment partials (`segments` f64 a row)
/// and clip factors (`layers` f64 a row). Typed as the lane's other buffers are (the
/// pipeline's scratch operands share the gradients' element type); the kernels read
/// them as f64.
struct Scratch<'b, S> {
    partials: &'b mut DeviceBuffer<S>,
    factors: &'b mut DeviceBuffer<S>,
}

impl<'j> Batch<'j> {
    fn new(job: &'j PrivatizeJob, dev: &DeviceLease<'_>) -> Result<Self, DeviceError> {
        let seg_bounds = segment_bounds(job);
        let segments = seg_bounds[job.layers()] as usize;
        Ok(Batch {
            job,
            bounds: dev.upload(&job.bounds)?,
            seg_bounds: dev.upload(&seg_bounds)?,
            segments,
            clip: dev.upload(&job.clip_norms)?,
            sums: dev.alloc_zeros(job.cols)?,
        })
    }

    /// Device bytes the batch holds besides its chunks, for the memory budget: the
    /// bounds, the clip norms, the sums, and (at the end) the answer and the key.
    fn bytes(job: &PrivatizeJob) -> usize {
        8 * (2 * job.bounds.len() + job.clip_norms.len() + 2 * job.cols) + 32
    }

    /// Queues chunk `rows` (held in `g`) on the current stream, after `previous` (the
    /// end of the chunk before it, on either lane): its squared norms into `sq` (by
    /// segment partials, folded) and its clip factors, then its clipped rows into the
    /// column sums.
    fn chunk<T: GradientElement, S: Element>(
        &mut self,
        dev: &DeviceLease<'_>,
        g: &DeviceBuffer<T>,
        rows: std::ops::Range<usize>,
        scratch: Scratch<'_, S>,
        sq: &mut DeviceBuffer<f64>,
        previous: Option<&Event>,
    ) -> Result<(), DeviceError> {
        let (dtype, job) = (T::DTYPE, self.job);
        let n = rows.len() as u64;
        let (cols, layers) = (job.cols as u64, job.layers() as u32);
        let (partials, sum) = (
            format!("dp_sq_partials_{dtype}"),
            format!("dp_clip_sum_{dtype}"),
        );
        // The chunk's kernels follow the previous chunk's (the other lane's) in row order;
        // only its upload, queued before this wait, runs beside them.
        if let Some(previous) = previous {
            dev.wait(previous)?;
        }
        let mut launch = dev.launch(&partials)?;
        launch
            .arg(g)
            .arg(&n)
            .arg(&cols)
            .arg(&self.bounds)
            .arg(&self.seg_bounds)
            .arg(&layers)
            .arg(&mut *scratch.partials);
        // The reduction needs exactly LANES threads per block; one block per (row, segment).
        let config = dev.launch_config(rows.len() * self.segments * LANES);
        assert_eq!(config.block_dim.0 as usize, LANES);
        // SAFETY: g holds the chunk's n × cols values, bounds and seg_bounds layers + 1
        // (bounds' last = cols, seg_bounds' the segments of a row), partials n × segments
        // f64 (`scratch_elements`).
        unsafe { launch.launch(config) }?;
        let mut launch = dev.launch("dp_fold_norms")?;
        launch
            .arg(&*scratch.partials)
            .arg(&n)
            .arg(&self.seg_bounds)
            .arg(&layers)
            .arg(&self.clip)
            .arg(sq)
            .arg(&mut *scratch.factors);
        // SAFETY: as above; clip holds layers, sq and factors n × layers f64.
        unsafe { launch.launch(dev.launch_config(rows.len() * job.layers())) }?;
        let mut launch = dev.launch(&sum)?;
        launch
            .arg(g)
            .arg(&n)
            .arg(&cols)
            .arg(&self.bounds)
            .arg(&layers)
            .arg(&*scratch.factors)
            .arg(&mut self.sums);
        // SAFETY: as above; sums holds cols.
        unsafe { launch.launch(dev.launch_config(job.cols)) }
    }

    /// The column sums snapped, noised and scaled, once every chunk's sums have finished
    /// (the caller has waited for them), and the answer downloaded.
    fn finish(self, dev: &DeviceLease<'_>, sq: &[f64]) -> Result<Privatized, DeviceError> {
        let job = self.job;
        let key = job.key.words();
        let dkey = dev.upload(&key)?;
        let mut out: DeviceBuffer<f64> = dev.alloc_zeros(job.cols)?;
        let (grid, inv_grid, cols) = (job.plan.grid, 1.0 / job.plan.grid, job.cols as u64);
        let mut launch = dev.launch("dp_snap_noise")?;
        launch
            .arg(&self.sums)
            .arg(&cols)
            .arg(&dkey)
            .arg(&inv_grid)
            .arg(&grid)
            .arg(&job.plan.t)
            .arg(&job.plan.c)
            .arg(&job.divisor)
            .arg(&mut out);
        // SAFETY: sums and out hold cols, key 8 words.
        unsafe { launch.launch(dev.launch_config(job.cols)) }?;
        Ok(Privatized {
            gradient: dev.download(&out)?,
            stats: clip_stats(sq, &job.clip_norms),
        })
    }
}

/// Where each layer's segments start, and (last) how many a row has: layer l has
/// ceil(width / SEGMENT) of them.
fn segment_bounds(job: &PrivatizeJob) -> Vec<u64> {
    let mut at = 0u64;
    let widths = job.bounds.windows(2).map(|w| w[1] - w[0]);
    let starts = widths.map(|w| {
        at += w.div_ceil(SEGMENT as u64);
        at
    });
    std::iter::once(0).chain(starts).collect()
}

/// The batch streamed in chunks of rows on two lanes (`DeviceLease::stream_items`, the
/// rows' squared norms its output): a chunk's upload (from the request body where it lies
/// in page-locked memory) overlaps the other lane's kernels.
pub fn launch_privatize(
    job: &PrivatizeJob,
    dev: &DeviceLease<'_>,
) -> Result<Privatized, DeviceError> {
    match &job.gradients {
        Gradients::F32(g) => privatize_streamed(job, g, dev),
        Gradients::F64(g) => privatize_streamed(job, g, dev),
    }
}

/// Elements of `S` that hold `f64s` f64 values (S is 4 or 8 bytes wide).
fn scratch_elements<S>(f64s: usize) -> usize {
    8 * f64s / std::mem::size_of::<S>()
}

fn privatize_streamed<T: GradientElement>(
    job: &PrivatizeJob,
    g: &[T],
    dev: &DeviceLease<'_>,
) -> Result<Privatized, DeviceError> {
    let mut batch = Batch::new(job, dev)?;
    let operands = [
        Operand::slice(g, job.cols),
        Operand::scratch(scratch_elements::<T>(batch.segments)),
        Operand::scratch(scratch_elements::<T>(job.layers())),
    ];
    let mut previous: Option<Event> = None;
    let sq = dev.stream_items(
        job.rows,
        &operands,
        job.layers(),
        Batch::bytes(job),
        |ins, sq, chunk| {
            let [g, partials, factors] = ins else {
                unreachable!("three operands")
            };
            let scratch = Scratch { partials, factors };
            batch.chunk(dev, g, chunk.items, scratch, sq, previous.as_ref())?;
            previous = Some(dev.record()?);
            Ok(())
        },
    )?;
    batch.finish(dev, &sq)
}

/// Privatizes gradients already on the device (`job.gradients` is not read), as one
/// chunk: the two kernel passes, the snap and the small copies. Benchmarks time this to
/// measure device bandwidth without the upload.
pub fn privatize_resident<T: GradientElement>(
    job: &PrivatizeJob,
    dg: &DeviceBuffer<T>,
    dev: &DeviceLease<'_>,
) -> Result<Privatized, DeviceError> {
    let mut batch = Batch::new(job, dev)?;
    let mut partials: DeviceBuffer<f64> = dev.alloc_zeros((job.rows * batch.segments).max(1))?;
    let mut factors: DeviceBuffer<f64> = dev.alloc_zeros(job.rows * job.layers())?;
    let mut dsq: DeviceBuffer<f64> = dev.alloc_zeros(job.rows * job.layers())?;
    let scratch = Scratch {
        partials: &mut partials,
        factors: &mut factors,
    };
    batch.chunk(dev, dg, 0..job.rows, scratch, &mut dsq, None)?;
    let sq = dev.download(&dsq)?;
    batch.finish(dev, &sq)
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
