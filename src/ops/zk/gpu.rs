//! GPU launcher for the field vector kernels (`kernels/field_ops.cu`).

use super::{Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob, FieldVec};
use crate::backend::cuda::DeviceLease;
use crate::backend::DeviceError;
use cudarc::driver::{CudaSlice, PushKernelArg};

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

/// Both fields travel as u64 words; a BN254 element is four of them.
fn words(v: &FieldVec) -> &[u64] {
    match v {
        FieldVec::Goldilocks(w) => w,
        FieldVec::Bn254Fr(l) => l.as_flattened(),
    }
}

fn from_words(field: Field, out: Vec<u64>) -> FieldVec {
    match field {
        Field::Goldilocks => FieldVec::Goldilocks(out),
        Field::Bn254Fr => FieldVec::Bn254Fr(
            out.chunks_exact(4)
                .map(|c| [c[0], c[1], c[2], c[3]])
                .collect(),
        ),
    }
}

pub fn run_field_pow_cuda(
    job: &FieldPowJob,
    dev: &DeviceLease<'_>,
) -> Result<FieldVec, DeviceError> {
    let field = job.base().field();
    let f = dev.function(&format!("{}_pow", field.name()))?;
    let stream = dev.stream();
    let base = words(job.base());
    let exps: Vec<u64> = job.exponents().iter().flat_map(|e| e.0).collect();
    let db = stream.clone_htod(base)?;
    let de = stream.clone_htod(&exps)?;
    let mut out: CudaSlice<u64> = stream.alloc_zeros(base.len())?;
    let (n, e_stride) = (job.len() as u64, u32::from(!job.is_broadcast()));
    let mut launch = stream.launch_builder(f);
    launch
        .arg(&db)
        .arg(&de)
        .arg(&mut out)
        .arg(&n)
        .arg(&e_stride);
    // SAFETY: base and out hold n elements, exponents n (or 1 with stride 0) of 32 bytes.
    unsafe { launch.launch(dev.launch_config(job.len())) }?;
    let host = stream.clone_dtoh(&out)?;
    stream.synchronize()?;
    Ok(from_words(field, host))
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
    let f = dev.function(&format!("{}_inv", field.name()))?;
    let stream = dev.stream();
    let input = words(job.values());
    let din = stream.clone_htod(input)?;
    let mut out: CudaSlice<u64> = stream.alloc_zeros(input.len())?;
    let config = dev.launch_config(job.len());
    let threads = (config.grid_dim.0 * config.block_dim.0) as usize;
    let (n, chunk) = (job.len() as u64, inv_chunk(job.len(), threads));
    let mut launch = stream.launch_builder(f);
    launch.arg(&din).arg(&mut out).arg(&n).arg(&chunk);
    // SAFETY: in and out hold n elements; each chunk writes only its own range.
    unsafe { launch.launch(config) }?;
    let host = stream.clone_dtoh(&out)?;
    stream.synchronize()?;
    Ok(from_words(field, host))
}

pub fn run_field_binary_cuda(
    job: &FieldBinaryJob,
    dev: &DeviceLease<'_>,
) -> Result<FieldVec, DeviceError> {
    let name = kernel_name(job.field(), job.op());
    let (a, b) = job.inputs();
    // Both fields travel as u64 words; a BN254 element is four of them.
    let (a_words, b_words): (&[u64], &[u64]) = match (a, b) {
        (FieldVec::Goldilocks(a), FieldVec::Goldilocks(b)) => (a, b),
        (FieldVec::Bn254Fr(a), FieldVec::Bn254Fr(b)) => (a.as_flattened(), b.as_flattened()),
        _ => return Err(DeviceError::fatal("mixed fields reached the launcher")),
    };
    let out = launch_binary(
        dev,
        &name,
        a_words,
        b_words,
        job.len(),
        u32::from(!job.is_broadcast()),
    )?;
    Ok(match a {
        FieldVec::Goldilocks(_) => FieldVec::Goldilocks(out),
        FieldVec::Bn254Fr(_) => FieldVec::Bn254Fr(
            out.chunks_exact(4)
                .map(|c| [c[0], c[1], c[2], c[3]])
                .collect(),
        ),
    })
}

fn launch_binary(
    dev: &DeviceLease<'_>,
    kernel: &str,
    a: &[u64],
    b: &[u64],
    n: usize,
    b_stride: u32,
) -> Result<Vec<u64>, DeviceError> {
    let f = dev.function(kernel)?;
    let stream = dev.stream();
    let da = stream.clone_htod(a)?;
    let db = stream.clone_htod(b)?;
    let mut out: CudaSlice<u64> = stream.alloc_zeros(a.len())?;
    let n64 = n as u64;
    let mut launch = stream.launch_builder(f);
    launch
        .arg(&da)
        .arg(&db)
        .arg(&mut out)
        .arg(&n64)
        .arg(&b_stride);
    // SAFETY: the kernel reads n elements of a, n (or 1, stride 0) of b, and writes n of
    // out; every buffer above has exactly that many words.
    unsafe { launch.launch(dev.launch_config(n)) }?;
    let host = stream.clone_dtoh(&out)?;
    stream.synchronize()?;
    Ok(host)
}
