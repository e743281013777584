//! GPU launchers for the field vector kernels (`kernels/field_ops.cu`).

use super::ntt::{self, Direction, NttJob, Order};
use super::{Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob, FieldVec};
use crate::backend::cuda::DeviceLease;
use crate::backend::DeviceError;
use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg, ValidAsZeroBits};

/// The `extern "C"` name of the kernel for `op` over `field`; the device loads and the
/// launcher calls kernels by this one rule.
fn kernel_name(field: Field, op: FieldOp) -> String {
    format!("{}_{}", field.name(), op.kernel_suffix())
}

/// Every kernel `kernels/field_ops.cu` must provide.
pub fn field_kernel_names() -> Vec<String> {
    Field::ALL
        .iter()
        .flat_map(|&f| {
            FieldOp::ALL
                .map(|op| kernel_name(f, op))
                .into_iter()
                .chain([format!("{}_pow", f.name()), format!("{}_inv", f.name())])
        })
        .collect()
}

/// A field vector as the kernels take it: u64 words (four per 256-bit element, read by
/// the kernels as eight little-endian u32 limbs) or u32 words (BabyBear).
enum Words<'a> {
    U64(&'a [u64]),
    U32(&'a [u32]),
}

fn words(v: &FieldVec) -> Words<'_> {
    match v {
        FieldVec::Bn254Fr(l) | FieldVec::Bls12_381Fr(l) => Words::U64(l.as_flattened()),
        FieldVec::Goldilocks(w) => Words::U64(w),
        FieldVec::BabyBear(w) => Words::U32(w),
    }
}

fn from_u64(field: Field, out: Vec<u64>) -> FieldVec {
    let limbs = |out: Vec<u64>| -> Vec<[u64; 4]> {
        out.chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect()
    };
    match field {
        Field::Bn254Fr => FieldVec::Bn254Fr(limbs(out)),
        Field::Bls12_381Fr => FieldVec::Bls12_381Fr(limbs(out)),
        Field::Goldilocks => FieldVec::Goldilocks(out),
        Field::BabyBear => unreachable!("BabyBear travels as u32"),
    }
}

fn mixed() -> DeviceError {
    DeviceError::fatal("mixed fields reached the launcher")
}

pub fn run_field_binary_cuda(
    job: &FieldBinaryJob,
    dev: &DeviceLease<'_>,
) -> Result<FieldVec, DeviceError> {
    let name = kernel_name(job.field(), job.op());
    let (a, b) = job.inputs();
    let stride = u32::from(!job.is_broadcast());
    match (words(a), words(b)) {
        (Words::U64(x), Words::U64(y)) => Ok(from_u64(
            job.field(),
            launch_pair(dev, &name, x, y, job.len(), stride)?,
        )),
        (Words::U32(x), Words::U32(y)) => Ok(FieldVec::BabyBear(launch_pair(
            dev,
            &name,
            x,
            y,
            job.len(),
            stride,
        )?)),
        _ => Err(mixed()),
    }
}

pub fn run_field_pow_cuda(
    job: &FieldPowJob,
    dev: &DeviceLease<'_>,
) -> Result<FieldVec, DeviceError> {
    let field = job.base().field();
    let name = format!("{}_pow", field.name());
    let stride = u32::from(!job.is_broadcast());
    let exps: Vec<u64> = job.exponents().iter().flat_map(|e| e.0).collect();
    match words(job.base()) {
        Words::U64(base) => Ok(from_u64(
            field,
            launch_pair(dev, &name, base, &exps, job.len(), stride)?,
        )),
        Words::U32(base) => {
            // Eight little-endian u32 limbs per exponent.
            let limbs: Vec<u32> = exps
                .iter()
                .flat_map(|w| [*w as u32, (*w >> 32) as u32])
                .collect();
            let out = launch_pair(dev, &name, base, &limbs, job.len(), stride)?;
            Ok(FieldVec::BabyBear(out))
        }
    }
}

/// The binary and pow kernels' shape: (x, y, out, n, y_stride), out as long as x.
fn launch_pair<T: DeviceRepr + ValidAsZeroBits + Default + Clone + Unpin>(
    dev: &DeviceLease<'_>,
    kernel: &str,
    x: &[T],
    y: &[T],
    n: usize,
    y_stride: u32,
) -> Result<Vec<T>, DeviceError> {
    let f = dev.function(kernel)?;
    let stream = dev.stream();
    let dx = stream.clone_htod(x)?;
    let dy = stream.clone_htod(y)?;
    let mut out: CudaSlice<T> = stream.alloc_zeros(x.len())?;
    let n64 = n as u64;
    let mut launch = stream.launch_builder(f);
    launch
        .arg(&dx)
        .arg(&dy)
        .arg(&mut out)
        .arg(&n64)
        .arg(&y_stride);
    // SAFETY: the kernel reads n elements of x, n (or 1, stride 0) of y, and writes n of
    // out; the buffers hold exactly those words.
    unsafe { launch.launch(dev.launch_config(n)) }?;
    let host = stream.clone_dtoh(&out)?;
    stream.synchronize()?;
    Ok(host)
}

/// Elements per thread in the inversion kernel: enough threads to fill the device, at
/// least 8 elements each so the one Fermat inversion per chunk is amortised.
fn inv_chunk(n: usize, threads: usize) -> u64 {
    n.div_ceil(threads.max(1)).max(8) as u64
}

pub fn run_field_inv_cuda(
    job: &FieldInvJob,
    dev: &DeviceLease<'_>,
) -> Result<FieldVec, DeviceError> {
    let field = job.values().field();
    let name = format!("{}_inv", field.name());
    match words(job.values()) {
        Words::U64(x) => Ok(from_u64(field, launch_inv(dev, &name, x, job.len())?)),
        Words::U32(x) => Ok(FieldVec::BabyBear(launch_inv(dev, &name, x, job.len())?)),
    }
}

fn launch_inv<T: DeviceRepr + ValidAsZeroBits + Default + Clone + Unpin>(
    dev: &DeviceLease<'_>,
    kernel: &str,
    x: &[T],
    n: usize,
) -> Result<Vec<T>, DeviceError> {
    let f = dev.function(kernel)?;
    let stream = dev.stream();
    let din = stream.clone_htod(x)?;
    let mut out: CudaSlice<T> = stream.alloc_zeros(x.len())?;
    let config = dev.launch_config(n);
    let threads = (config.grid_dim.0 * config.block_dim.0) as usize;
    let (n64, chunk) = (n as u64, inv_chunk(n, threads));
    let mut launch = stream.launch_builder(f);
    launch.arg(&din).arg(&mut out).arg(&n64).arg(&chunk);
    // SAFETY: in and out hold n elements; each chunk writes only its own range.
    unsafe { launch.launch(config) }?;
    let host = stream.clone_dtoh(&out)?;
    stream.synchronize()?;
    Ok(host)
}

/// Every kernel `kernels/ntt.cu` must provide.
pub fn ntt_kernel_names() -> Vec<String> {
    Field::ALL
        .iter()
        .flat_map(|f| ["scale", "bitrev", "stage"].map(|k| format!("{}_ntt_{k}", f.name())))
        .collect()
}

/// The NTT on the device; the same steps as the CPU twin (`ntt.rs`): [bit-reverse a
/// bit-reversed input back], [coset scaling], bit-reverse, stages, [n^-1 and inverse
/// coset scaling], [bit-reverse for a bit-reversed output].
pub fn run_ntt_cuda(job: &NttJob, dev: &DeviceLease<'_>) -> Result<FieldVec, DeviceError> {
    let field = job.values.field();
    let n = job.size();
    let (tw, scale) = ntt::device_tables(field, n, job.direction, job.coset_shift);
    match (words(&job.values), words(&tw)) {
        (Words::U64(x), Words::U64(t)) => {
            let s = scale.as_ref().map(|s| match words(s) {
                Words::U64(w) => w,
                Words::U32(_) => unreachable!("one field, one representation"),
            });
            Ok(from_u64(field, ntt_steps(dev, job, x, t, s)?))
        }
        (Words::U32(x), Words::U32(t)) => {
            let s = scale.as_ref().map(|s| match words(s) {
                Words::U32(w) => w,
                Words::U64(_) => unreachable!("one field, one representation"),
            });
            Ok(FieldVec::BabyBear(ntt_steps(dev, job, x, t, s)?))
        }
        _ => Err(mixed()),
    }
}

fn ntt_steps<T: DeviceRepr + ValidAsZeroBits + Default + Clone + Unpin>(
    dev: &DeviceLease<'_>,
    job: &NttJob,
    x: &[T],
    twiddles: &[T],
    scale: Option<&[T]>,
) -> Result<Vec<T>, DeviceError> {
    let name = job.values.field().name();
    let stream = dev.stream();
    let (n, total) = (job.size() as u64, job.values.len() as u64);
    let log_n = n.trailing_zeros();
    let mut dx = stream.clone_htod(x)?;
    // A one-element twiddle table for n = 1 keeps every buffer non-empty.
    let dtw = if twiddles.is_empty() {
        stream.alloc_zeros::<T>(1)?
    } else {
        stream.clone_htod(twiddles)?
    };
    let ds = scale.map(|s| stream.clone_htod(s)).transpose()?;
    let bitrev = dev.function(&format!("{name}_ntt_bitrev"))?;
    let scale_fn = dev.function(&format!("{name}_ntt_scale"))?;
    let stage = dev.function(&format!("{name}_ntt_stage"))?;
    let all = dev.launch_config(job.values.len());
    let butterflies = dev.launch_config(job.values.len() / 2);
    let permute = |dx: &mut CudaSlice<T>| -> Result<(), DeviceError> {
        let mut l = stream.launch_builder(bitrev);
        l.arg(dx).arg(&n).arg(&log_n).arg(&total);
        // SAFETY: x holds `total` elements in polynomials of n; swaps stay inside each.
        unsafe { l.launch(all) }?;
        Ok(())
    };
    let scale_by = |dx: &mut CudaSlice<T>, ds: &CudaSlice<T>| -> Result<(), DeviceError> {
        let mut l = stream.launch_builder(scale_fn);
        l.arg(dx).arg(ds).arg(&n).arg(&total);
        // SAFETY: x holds `total` elements, the table n.
        unsafe { l.launch(all) }?;
        Ok(())
    };
    if job.input_order == Order::BitReversed {
        permute(&mut dx)?;
    }
    if let (Direction::Forward, Some(ds)) = (job.direction, &ds) {
        scale_by(&mut dx, ds)?;
    }
    permute(&mut dx)?;
    let half_total = total / 2;
    let mut half = 1u64;
    while half < n {
        let mut l = stream.launch_builder(stage);
        l.arg(&mut dx).arg(&dtw).arg(&n).arg(&half).arg(&half_total);
        // SAFETY: total/2 butterflies, each on two elements of its own polynomial;
        // twiddle indices stay below n/2.
        unsafe { l.launch(butterflies) }?;
        half *= 2;
    }
    if let (Direction::Inverse, Some(ds)) = (job.direction, &ds) {
        scale_by(&mut dx, ds)?;
    }
    if job.output_order == Order::BitReversed {
        permute(&mut dx)?;
    }
    let host = stream.clone_dtoh(&dx)?;
    stream.synchronize()?;
    Ok(host)
}
