//! GPU launchers for `kernels/mpc.cu`: Shamir's evaluation and weighted sums, and secure
//! aggregation's unmasking.

use super::scalar::mont;
use super::secagg::UnmaskJob;
use super::shamir::{CombineJob, ShareJob};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::{DeviceBuffer, DeviceError, DeviceLease, Element};
use crate::ops::zk::{from_u64, words, Field, FieldVec, Words};
use std::borrow::Cow;

fn kernel_name(field: Field, kernel: &str) -> String {
    format!("{}_shamir_{kernel}", field.name())
}

const UNMASK_KERNEL: &str = "secagg_unmask";
/// Masks per launch of `secagg_unmask`: a launch's length stays bounded, and a caller
/// that left is noticed between launches.
const MASKS_PER_LAUNCH: usize = 64;

/// `kernels/mpc.cu`: evaluation and weighted sums for every field.
pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "mpc",
        source: include_str!("../../../kernels/mpc.cu"),
        entry_points: Field::ALL
            .iter()
            .flat_map(|&f| ["eval", "combine"].map(|k| kernel_name(f, k)))
            .chain([UNMASK_KERNEL.to_string()])
            .collect(),
        // Shares and unmasked sums are checked bit for bit (`verify::exactly`); any float
        // it gained would be too.
        exact_floats: true,
    }
}

/// Points or weights as the kernels take them: in Montgomery form for the 256-bit fields
/// (so each step is one CIOS product), canonical for the one-word fields.
fn montgomery_operand(v: &FieldVec) -> FieldVec {
    match v {
        FieldVec::Bn254Fr(x) => FieldVec::Bn254Fr(
            x.iter()
                .map(|&l| mont::<ark_bn254::FrConfig, 4, _>(l).0 .0)
                .collect(),
        ),
        FieldVec::Bls12_381Fr(x) => FieldVec::Bls12_381Fr(
            x.iter()
                .map(|&l| mont::<ark_bls12_381::FrConfig, 4, _>(l).0 .0)
                .collect(),
        ),
        other => other.clone(),
    }
}

pub fn launch_share(job: &ShareJob, dev: &DeviceLease<'_>) -> Result<Vec<FieldVec>, DeviceError> {
    let points = job.points();
    let name = kernel_name(points.field(), "eval");
    let m = job.secrets();
    let shape = Shape {
        m,
        rows_in: job.threshold(),
        rows_out: points.len(),
    };
    let small = montgomery_operand(points);
    let out = run(dev, &name, job.coefficients(), &small, shape)?;
    Ok(out.split(&vec![m; shape.rows_out]))
}

pub fn launch_combine(
    job: &CombineJob,
    dev: &DeviceLease<'_>,
) -> Result<Vec<FieldVec>, DeviceError> {
    let used = job.used();
    let name = kernel_name(used[0].field(), "combine");
    let m = job.secrets();
    let shape = Shape {
        m,
        rows_in: used.len(),
        rows_out: job.weights().len() / used.len(),
    };
    let rows = FieldVec::concat(&used[0], &used[1..]);
    let out = run(dev, &name, &rows, &montgomery_operand(job.weights()), shape)?;
    Ok(out.split(&vec![m; shape.rows_out]))
}

/// Both kernels' shape: `rows_in` rows of `m` elements in, a small operand, `rows_out`
/// rows of `m` out; arguments (rows, small, out, m, rows_in, rows_out).
#[derive(Clone, Copy)]
struct Shape {
    m: usize,
    rows_in: usize,
    rows_out: usize,
}

fn run(
    dev: &DeviceLease<'_>,
    kernel: &str,
    rows: &FieldVec,
    small: &FieldVec,
    shape: Shape,
) -> Result<FieldVec, DeviceError> {
    match (words(rows), words(small)) {
        (Words::U64(r), Words::U64(s)) => Ok(from_u64(
            rows.field(),
            launch_rows(dev, kernel, r, s, shape)?,
        )),
        (Words::U32(r), Words::U32(s)) => {
            Ok(FieldVec::BabyBear(launch_rows(dev, kernel, r, s, shape)?))
        }
        _ => Err(DeviceError::fatal("mixed fields reached the launcher")),
    }
}

/// Runs in passes over the secrets, as many per pass as the device's memory budget
/// allows; a pass's rows are gathered into one contiguous upload and its output rows
/// scattered back.
fn launch_rows<T: Element + Default>(
    dev: &DeviceLease<'_>,
    kernel: &str,
    rows: &[T],
    small: &[T],
    shape: Shape,
) -> Result<Vec<T>, DeviceError> {
    let Shape {
        m,
        rows_in,
        rows_out,
    } = shape;
    let w = rows.len() / (rows_in * m);
    let size = std::mem::size_of::<T>();
    let per_pass = dev.items_per_pass(
        m,
        (rows_in + rows_out) * w * size,
        std::mem::size_of_val(small),
    );
    let d_small = dev.upload(small)?;
    let mut host = Vec::new();
    let (a, b) = (rows_in as u32, rows_out as u32);
    for start in (0..m).step_by(per_pass) {
        dev.still_wanted()?;
        let len = per_pass.min(m - start);
        let input = gather(rows, rows_in, m * w, start * w, len * w);
        let d_in = dev.upload(&input)?;
        let mut d_out: DeviceBuffer<T> = dev.alloc_zeros(rows_out * len * w)?;
        let len64 = len as u64;
        let mut launch = dev.launch(kernel)?;
        launch
            .arg(&d_in)
            .arg(&d_small)
            .arg(&mut d_out)
            .arg(&len64)
            .arg(&a)
            .arg(&b);
        // SAFETY: the kernel reads rows_in rows of len elements and rows_in × rows_out
        // (or rows_out) small elements, and writes rows_out rows of len; the buffers hold
        // exactly those words.
        unsafe { launch.launch(dev.launch_config(len)) }?;
        let out = dev.download(&d_out)?;
        if len == m {
            // One pass: its rows are the answer's, already in place.
            return Ok(out);
        }
        if host.is_empty() {
            host = vec![T::default(); rows_out * m * w];
        }
        for (r, part) in out.chunks_exact(len * w).enumerate() {
            let at = r * m * w + start * w;
            host[at..at + len * w].copy_from_slice(part);
        }
    }
    Ok(host)
}

/// Columns `[start, start + len)` of every `row_len`-word row, one row after the other;
/// the rows themselves when that is all of them.
fn gather<T: Copy>(
    rows: &[T],
    count: usize,
    row_len: usize,
    start: usize,
    len: usize,
) -> Cow<'_, [T]> {
    if start == 0 && len == row_len {
        return Cow::Borrowed(rows);
    }
    Cow::Owned(
        (0..count)
            .flat_map(|r| {
                rows[r * row_len + start..r * row_len + start + len]
                    .iter()
                    .copied()
            })
            .collect(),
    )
}

/// Unmasking: the sum uploaded once, the masks' keys and signs, then one launch per group
/// of masks over the whole vector, in place.
pub fn launch_unmask(job: &UnmaskJob, dev: &DeviceLease<'_>) -> Result<Vec<u32>, DeviceError> {
    let len = job.sum().len();
    let mut d_out = dev.upload(job.sum())?;
    let keys: Vec<u32> = job.terms().iter().flat_map(|t| t.key_words()).collect();
    let subtract: Vec<u32> = job.terms().iter().map(|t| u32::from(t.subtract)).collect();
    let len64 = len as u64;
    for (group, signs) in keys
        .chunks(8 * MASKS_PER_LAUNCH)
        .zip(subtract.chunks(MASKS_PER_LAUNCH))
    {
        dev.still_wanted()?;
        let d_keys = dev.upload(group)?;
        let d_signs = dev.upload(signs)?;
        let count = signs.len() as u32;
        let mut launch = dev.launch(UNMASK_KERNEL)?;
        launch
            .arg(&mut d_out)
            .arg(&d_keys)
            .arg(&d_signs)
            .arg(&count)
            .arg(&len64);
        // SAFETY: the kernel reads and writes `len` words of `out`, and reads 8 key words
        // and one sign per mask of the group; the buffers hold exactly those.
        unsafe { launch.launch(dev.launch_config(len.div_ceil(16))) }?;
    }
    dev.download(&d_out)
}
