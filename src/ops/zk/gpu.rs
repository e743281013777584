//! GPU launcher for the field vector kernels (`kernels/field_ops.cu`).

use super::{Field, FieldBinaryJob, FieldOp, FieldVec};
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
        .flat_map(|&f| FieldOp::ALL.map(|op| kernel_name(f, op)))
        .collect()
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
