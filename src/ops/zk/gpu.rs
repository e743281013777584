//! GPU launchers for the field vector kernels (`kernels/field_ops.cu`).

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
