//! GPU launchers for `kernels/mpc.cu`: Shamir's evaluation and weighted sums, and secure
//! aggregation's unmasking.

use super::scalar::mont;
use super::secagg::UnmaskJob;
use super::shamir::{CombineJob, ShareJob};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::{Chunk, Operand};
use crate::backend::{DeviceBuffer, DeviceError, DeviceLease, Element};
use crate::ops::zk::{from_u64, words, Field, FieldVec, Words};

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
        nvidia_only: false,
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
    let shape = Shape {
        m: job.secrets(),
        rows_in: job.threshold(),
        rows_out: points.len(),
    };
    let coeffs = job.coefficients();
    // The coefficients are one vector of `threshold` rows.
    let rows = Rows {
        vecs: std::slice::from_ref(coeffs),
        per_vec: shape.rows_in,
    };
    run(dev, "eval", rows, &montgomery_operand(points), shape)
}

pub fn launch_combine(
    job: &CombineJob,
    dev: &DeviceLease<'_>,
) -> Result<Vec<FieldVec>, DeviceError> {
    let used = job.used();
    let shape = Shape {
        m: job.secrets(),
        rows_in: used.len(),
        rows_out: job.weights().len() / used.len(),
    };
    let rows = Rows {
        vecs: used,
        per_vec: 1,
    };
    run(
        dev,
        "combine",
        rows,
        &montgomery_operand(job.weights()),
        shape,
    )
}

/// A kernel's input rows: each vector cut into `per_vec` rows of the same length.
#[derive(Clone, Copy)]
struct Rows<'a> {
    vecs: &'a [FieldVec],
    per_vec: usize,
}

/// Runs kernel `kernel` of the rows' field in the field's words: u32 for BabyBear, u64
/// (a 256-bit element's four limbs) otherwise.
fn run(
    dev: &DeviceLease<'_>,
    kernel: &str,
    rows: Rows<'_>,
    small: &FieldVec,
    shape: Shape,
) -> Result<Vec<FieldVec>, DeviceError> {
    match small.field() {
        Field::BabyBear => run_in::<u32>(dev, kernel, rows, small, shape),
        _ => run_in::<u64>(dev, kernel, rows, small, shape),
    }
}

fn run_in<T: Word>(
    dev: &DeviceLease<'_>,
    kernel: &str,
    rows: Rows<'_>,
    small: &FieldVec,
    shape: Shape,
) -> Result<Vec<FieldVec>, DeviceError> {
    let field = small.field();
    let mixed = || DeviceError::fatal("mixed fields reached the launcher");
    let mut input = Vec::with_capacity(shape.rows_in);
    for v in rows.vecs {
        let words = T::of(v).filter(|_| v.field() == field).ok_or_else(mixed)?;
        input.extend(words.chunks_exact((words.len() / rows.per_vec).max(1)));
    }
    let small = T::of(small).ok_or_else(mixed)?;
    let out = launch_rows(dev, &kernel_name(field, kernel), &input, small, shape)?;
    Ok(out.into_iter().map(|r| T::field_vec(field, r)).collect())
}

/// The word a field's kernels work in.
trait Word: Element {
    /// The vector's words, if they are of this type.
    fn of(v: &FieldVec) -> Option<&[Self]>;
    /// Words of this type as a vector of `field`, taken over without a pass.
    fn field_vec(field: Field, words: Vec<Self>) -> FieldVec;
}

impl Word for u64 {
    fn of(v: &FieldVec) -> Option<&[u64]> {
        match words(v) {
            Words::U64(w) => Some(w),
            Words::U32(_) => None,
        }
    }

    fn field_vec(field: Field, words: Vec<u64>) -> FieldVec {
        from_u64(field, words)
    }
}

impl Word for u32 {
    fn of(v: &FieldVec) -> Option<&[u32]> {
        match words(v) {
            Words::U32(w) => Some(w),
            Words::U64(_) => None,
        }
    }

    fn field_vec(_: Field, words: Vec<u32>) -> FieldVec {
        FieldVec::BabyBear(words)
    }
}

/// Both kernels' shape: `rows_in` rows of `m` elements in, a small operand, `rows_out`
/// rows of `m` out; arguments (rows, small, out, m, rows_in, rows_out).
#[derive(Clone, Copy)]
struct Shape {
    m: usize,
    rows_in: usize,
    rows_out: usize,
}

/// Streams the secrets in chunks of columns on two lanes (`DeviceLease::stream_items_to`):
/// each chunk's columns of every input row are written straight into its staging as
/// `rows_in` rows of the chunk's length (the layout the kernel reads, with `m` the
/// chunk's length), and its `rows_out` output rows are appended to the answer's rows as
/// they come back. Each input and output word is copied once on the host.
fn launch_rows<T: Element>(
    dev: &DeviceLease<'_>,
    kernel: &str,
    rows: &[&[T]],
    small: &[T],
    shape: Shape,
) -> Result<Vec<Vec<T>>, DeviceError> {
    let Shape {
        m,
        rows_in,
        rows_out,
    } = shape;
    let w = rows.first().map_or(0, |r| r.len() / m.max(1));
    let mut out: Vec<Vec<T>> = (0..rows_out).map(|_| Vec::with_capacity(m * w)).collect();
    if m == 0 {
        return Ok(out);
    }
    // Uploaded before the first chunk: both lanes' kernels read it.
    let d_small = dev.upload(small)?;
    let columns = |items: std::ops::Range<usize>, into: &mut [T]| {
        let len = items.len() * w;
        for (row, to) in rows.iter().zip(into.chunks_exact_mut(len)) {
            to.copy_from_slice(&row[items.start * w..items.end * w]);
        }
    };
    let inputs = [Operand::written(rows_in * w, &columns)];
    let (a, b) = (rows_in as u32, rows_out as u32);
    let kernel = |d_in: &mut [DeviceBuffer<T>], d_out: &mut DeviceBuffer<T>, chunk: Chunk| {
        let len64 = chunk.len() as u64;
        let mut launch = dev.launch(kernel)?;
        launch
            .arg(&d_in[0])
            .arg(&d_small)
            .arg(d_out)
            .arg(&len64)
            .arg(&a)
            .arg(&b);
        // SAFETY: the kernel reads rows_in rows of the chunk's len elements and
        // rows_in × rows_out (or rows_out) small elements, and writes rows_out rows of
        // len; the buffers hold at least those words.
        unsafe { launch.launch(dev.launch_config(chunk.len())) }
    };
    let fixed = std::mem::size_of_val(small);
    dev.stream_items_to(
        m,
        &inputs,
        rows_out * w,
        fixed,
        kernel,
        &mut |items, from: &[T]| {
            for (row, part) in out.iter_mut().zip(from.chunks_exact(items.len() * w)) {
                row.extend_from_slice(part);
            }
        },
    )?;
    Ok(out)
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
