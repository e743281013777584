//! Launchers for `kernels/linalg.cu`. Matmul uploads the (already rounded) operands, runs
//! the batch in passes that fit the device's memory budget, and rounds D to the output
//! dtype; sinusoidal embeddings run rows in passes the same way.

use super::lookup::LookupJob;
use super::matmul::{MatmulJob, Operands, Strides, Values};
use super::sinusoidal::{Layout, SinusoidalJob};
use super::Compute;
use crate::backend::cuda::blaslt::{BlasCompute, RowMajorProduct, MATMUL_BLASLT_OP};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::DeviceBuffer;
use crate::backend::device::{LaunchConfig, Operand};
use crate::backend::{DeviceError, DeviceErrorKind, DeviceLease, Element};
use std::sync::Arc;

const KERNEL_NAMES: &[&str] = &[
    "matmul_f32",
    "round_output_f32",
    "any_zero_element",
    "copy_range_f32",
    "sinusoidal_f64",
    "embedding_gather_f32",
];

/// Output tile of one block (kernels/linalg.cu `MM_TILE`) and its threads.
const TILE: usize = 64;
const THREADS: u32 = 256;

pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "linalg",
        source: include_str!("../../../kernels/linalg.cu"),
        entry_points: KERNEL_NAMES.iter().map(|s| s.to_string()).collect(),
        // Matmul and sinusoidal embeddings are held to tolerances, and FMA is matmul's
        // speed; the lookups, checked bit for bit, only copy.
        exact_floats: false,
        nvidia_only: false,
    }
}

/// Which code forms a device's products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MatmulProvider {
    /// Our `matmul_f32` kernel (every device, the emulated one included).
    Kernel,
    /// cuBLASLt, for the passes it takes (others stay on the kernel).
    BlasLt,
}

impl MatmulProvider {
    /// cuBLASLt where this device has it, its self-test passed, and the operator left it
    /// on; our kernel otherwise.
    pub(crate) fn for_device(dev: &DeviceLease<'_>) -> Self {
        if dev.has_blaslt() && dev.device.op_verified(MATMUL_BLASLT_OP) {
            MatmulProvider::BlasLt
        } else {
            MatmulProvider::Kernel
        }
    }
}

pub fn launch_matmul(job: &MatmulJob, dev: &DeviceLease<'_>) -> Result<Values, DeviceError> {
    run_matmul_on(job, dev, MatmulProvider::for_device(dev))
}

pub(crate) fn run_matmul_on(
    job: &MatmulJob,
    dev: &DeviceLease<'_>,
    provider: MatmulProvider,
) -> Result<Values, DeviceError> {
    let Operands::F32 { a, b, c } = &job.operands else {
        return Err(DeviceError {
            kind: DeviceErrorKind::Unsupported,
            message: "f64 matmul runs on the CPU only".into(),
        });
    };
    let s = job.shape;
    let (entry_bytes, shared_bytes) = s.device_bytes(c.is_some());
    let budget = dev.memory_budget().saturating_sub(shared_bytes);
    let per_pass = (budget / entry_bytes.max(1)).clamp(1, s.batch);
    // An operand is uploaded once when it is broadcast or the batch fits one pass (from
    // the device's cache when it is a resident array's: `MatmulJob::device_keys`), else
    // per pass.
    let one_pass = per_pass >= s.batch;
    let whole = |v: &[f32], batched: bool, key: &Option<String>| {
        if batched && !one_pass {
            return Ok(None);
        }
        Ok::<_, DeviceError>(Some(match key {
            Some(key) => dev.cached_table(key, || dev.upload(v))?,
            None => Arc::new(dev.upload(v)?),
        }))
    };
    let [key_a, key_b, key_c] = &job.device_keys;
    let a_all = whole(a, s.a_batched, key_a)?;
    let b_all = whole(b, s.b_batched, key_b)?;
    let c_all = match c {
        Some(c) => whole(c, s.c_batched, key_c)?,
        None => None,
    };
    let mut out = Vec::with_capacity(s.out_len());
    let mut first = 0;
    while first < s.batch {
        dev.still_wanted()?;
        let count = per_pass.min(s.batch - first);
        let slice = |v: &[f32], batched: bool, len: usize| -> Result<_, DeviceError> {
            Ok(if batched && !one_pass {
                Some(dev.upload(&v[first * len..(first + count) * len])?)
            } else {
                None
            })
        };
        let a_pass = slice(a, s.a_batched, s.m * s.k)?;
        let b_pass = slice(b, s.b_batched, s.k * s.n)?;
        let c_pass = match c {
            Some(c) => slice(c, s.c_batched, s.m * s.n)?,
            None => None,
        };
        let d_a = a_pass.as_ref().or(a_all.as_deref()).expect("A uploaded");
        let d_b = b_pass.as_ref().or(b_all.as_deref()).expect("B uploaded");
        let mut d = dev.alloc_zeros::<f32>(count * s.m * s.n)?;
        let pass = MatmulPass::of(job, count);
        let d_c = c_pass.as_ref().or(c_all.as_deref());
        matmul_pass(dev, provider, job.compute, &pass, d_a, d_b, d_c, &mut d)?;
        out.extend(dev.download(&d)?);
        first += count;
    }
    job.output.round_all(&mut out);
    Ok(Values::F32(out.into()))
}

/// One launch of `matmul_f32`: `batches` entries of D (m × n each, contiguous) from A
/// and B read through their strides, C (row-major m × n per entry, `c_batch` apart) added
/// with `beta` when given.
pub(crate) struct MatmulPass {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Strides,
    pub b: Strides,
    pub c_batch: usize,
    pub alpha: f32,
    pub beta: f32,
    pub batches: usize,
}

impl MatmulPass {
    /// `batches` entries of `job`'s product.
    pub(crate) fn of(job: &MatmulJob, batches: usize) -> Self {
        let s = job.shape;
        MatmulPass {
            m: s.m,
            n: s.n,
            k: s.k,
            a: s.a_strides(),
            b: s.b_strides(),
            c_batch: s.c_batch_stride(),
            alpha: job.alpha as f32,
            beta: job.beta as f32,
            batches,
        }
    }
}

/// One pass by `provider`. cuBLASLt takes C as D's starting value, so it runs where C is
/// absent or can be copied into D whole (batched, or a single entry); a pass it cannot
/// take, whose operand strides are not plain row-major, or that cuBLASLt refuses (no
/// algorithm for it), runs on our kernel. Our kernel reads C, not D, and writes all of
/// D, so the copy already made does not matter then.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_pass(
    dev: &DeviceLease<'_>,
    provider: MatmulProvider,
    compute: Compute,
    pass: &MatmulPass,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    c: Option<&DeviceBuffer<f32>>,
    d: &mut DeviceBuffer<f32>,
) -> Result<(), DeviceError> {
    let product = match provider {
        MatmulProvider::BlasLt => blaslt_product(pass, compute),
        MatmulProvider::Kernel => None,
    };
    let whole_c = pass.batches == 1 || pass.c_batch == pass.m * pass.n;
    let c_fits = c.is_none_or(|c| c.len() == d.len() && whole_c);
    let (Some(mut product), true) = (product, c_fits) else {
        return launch_matmul_f32(dev, pass, a, b, c, d);
    };
    match c {
        Some(c) => dev.copy(c, d)?,
        None => product.beta = 0.0,
    }
    match dev.blaslt_matmul(&product, a, b, d) {
        Err(e) if e.kind == DeviceErrorKind::Unsupported => {
            tracing::debug!(reason = %e.message, "cuBLASLt declined a pass; our kernel runs it");
            launch_matmul_f32(dev, pass, a, b, c, d)
        }
        done => done,
    }
}

/// The pass as cuBLASLt takes it, if its operands are plain row-major matrices (each
/// stored as itself or as its transpose) and its precision is one of f32's.
fn blaslt_product(pass: &MatmulPass, compute: Compute) -> Option<RowMajorProduct> {
    // Whether an operand of `rows × cols` is stored transposed; None: other strides.
    let transposed = |s: Strides, rows: usize, cols: usize| {
        if s.col == 1 && s.row == cols {
            Some(false)
        } else if s.row == 1 && s.col == rows {
            Some(true)
        } else {
            None
        }
    };
    let compute = match compute {
        Compute::F32 => BlasCompute::F32,
        Compute::Tf32 => BlasCompute::Tf32,
        Compute::F16 => BlasCompute::F16,
        Compute::Bf16 => BlasCompute::Bf16,
        Compute::F64 => return None,
    };
    Some(RowMajorProduct {
        m: pass.m,
        n: pass.n,
        k: pass.k,
        trans_a: transposed(pass.a, pass.m, pass.k)?,
        trans_b: transposed(pass.b, pass.k, pass.n)?,
        a_batch_stride: pass.a.batch,
        b_batch_stride: pass.b.batch,
        batches: pass.batches,
        alpha: pass.alpha,
        beta: pass.beta,
        compute,
    })
}

pub(crate) fn launch_matmul_f32(
    dev: &DeviceLease<'_>,
    pass: &MatmulPass,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    c: Option<&DeviceBuffer<f32>>,
    d: &mut DeviceBuffer<f32>,
) -> Result<(), DeviceError> {
    // Without C the kernel never reads it; A stands in as a valid pointer.
    let has_c = u32::from(c.is_some());
    let (m, n, k) = (pass.m as u64, pass.n as u64, pass.k as u64);
    let (sa, sb) = (pass.a, pass.b);
    let (a_batch, a_row, a_col) = (sa.batch as u64, sa.row as u64, sa.col as u64);
    let (b_batch, b_row, b_col) = (sb.batch as u64, sb.row as u64, sb.col as u64);
    let c_batch = pass.c_batch as u64;
    let batches = pass.batches as u64;
    let tiles = pass.batches * pass.m.div_ceil(TILE) * pass.n.div_ceil(TILE);
    let blocks = tiles.min(dev.launch_config(tiles * THREADS as usize).grid_dim.0 as usize);
    let config = LaunchConfig {
        grid_dim: (blocks.max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = dev.launch("matmul_f32")?;
    l.arg(a).arg(b).arg(c.unwrap_or(a));
    l.arg(d)
        .arg(&m)
        .arg(&n)
        .arg(&k)
        .arg(&a_batch)
        .arg(&a_row)
        .arg(&a_col)
        .arg(&b_batch)
        .arg(&b_row)
        .arg(&b_col)
        .arg(&c_batch)
        .arg(&has_c)
        .arg(&pass.alpha)
        .arg(&pass.beta)
        .arg(&batches);
    // SAFETY: the caller's buffers hold `batches` entries read through the strides (a
    // zero batch stride for a broadcast operand), and D batches·m·n values.
    unsafe { l.launch(config) }
}

/// Rounds `d` to `dtype` on the device, as `Dtype::round_all` does on the host (f32:
/// unchanged); whether a value is not finite afterwards (one read of four bytes).
pub(crate) fn round_output(
    dev: &DeviceLease<'_>,
    d: &mut DeviceBuffer<f32>,
    dtype: super::Dtype,
) -> Result<bool, DeviceError> {
    use super::Dtype;
    let code: u32 = match dtype {
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
        Dtype::F32 | Dtype::F64 => 0,
    };
    let mut non_finite = dev.alloc_zeros::<u32>(1)?;
    let len = d.len();
    let n = len as u64;
    let mut l = dev.launch("round_output_f32")?;
    l.arg(d).arg(&n).arg(&code).arg(&mut non_finite);
    // SAFETY: the kernel reads and writes d's n values and sets the one flag.
    unsafe { l.launch(dev.launch_config(len)) }?;
    Ok(dev.download(&non_finite)?[0] != 0)
}

/// Copies `n` values of `src` from `src_at` on into `dst` from `dst_at` on, on the device
/// (the engines' own copies take whole buffers). A range past either end is refused here:
/// the kernel does not check.
pub(crate) fn copy_range(
    dev: &DeviceLease<'_>,
    (src, src_at): (&DeviceBuffer<f32>, usize),
    (dst, dst_at): (&mut DeviceBuffer<f32>, usize),
    n: usize,
) -> Result<(), DeviceError> {
    let fits = |at: usize, len: usize| at.checked_add(n).is_some_and(|end| end <= len);
    if !fits(src_at, src.len()) || !fits(dst_at, dst.len()) {
        return Err(DeviceError::fatal(format!(
            "a device copy of {n} values from {src_at} of {} into {dst_at} of {}",
            src.len(),
            dst.len()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let (from, to, count) = (src_at as u64, dst_at as u64, n as u64);
    let mut l = dev.launch("copy_range_f32")?;
    l.arg(src).arg(&from).arg(dst).arg(&to).arg(&count);
    // SAFETY: both ranges lie inside their buffers (checked above).
    unsafe { l.launch(dev.launch_config(n)) }
}

/// Whether `x` (`n` elements of `words` u32 words each: any field's buffer) has an
/// element whose words are all zero, found on the device (one read of four bytes).
/// `Unsupported` on an engine without the kernel (wgpu's).
pub(crate) fn any_zero_element<T: Element>(
    dev: &DeviceLease<'_>,
    x: &DeviceBuffer<T>,
    n: usize,
    words: u32,
) -> Result<bool, DeviceError> {
    let mut zeros = dev.alloc_zeros::<u32>(1)?;
    let n64 = n as u64;
    let mut l = dev.launch("any_zero_element")?;
    l.arg(x).arg(&n64).arg(&words).arg(&mut zeros);
    // SAFETY: x holds n·words u32 words (its elements' words, read as u32); one flag.
    unsafe { l.launch(dev.launch_config(n)) }?;
    Ok(dev.download(&zeros)?[0] != 0)
}

pub fn launch_sinusoidal(
    job: &SinusoidalJob,
    dev: &DeviceLease<'_>,
) -> Result<Vec<f64>, DeviceError> {
    let dim = job.dim();
    let half = job.frequencies.len() as u32;
    let split = u32::from(job.layout == Layout::Split);
    let freq = dev.upload(&job.frequencies)?;
    let per_row = 8 * (dim + 1);
    let rows_per_pass = (dev.memory_budget() / per_row).clamp(1, job.times.len().max(1));
    let mut out = Vec::with_capacity(job.times.len() * dim);
    for times in job.times.chunks(rows_per_pass) {
        dev.still_wanted()?;
        let d_times = dev.upload(times)?;
        let mut d_out = dev.alloc_zeros::<f64>(times.len() * dim)?;
        let rows = times.len() as u64;
        let mut l = dev.launch("sinusoidal_f64")?;
        l.arg(&d_times)
            .arg(&rows)
            .arg(&freq)
            .arg(&half)
            .arg(&split)
            .arg(&mut d_out);
        // SAFETY: `rows` times and `half` frequencies in; rows·2·half values out.
        unsafe { l.launch(dev.launch_config(times.len() * half as usize)) }?;
        out.extend(dev.download(&d_out)?);
    }
    job.round_output(&mut out);
    Ok(out)
}

/// Rows of the job's table: the table from the device's cache (uploaded on a miss), the
/// ids streamed in chunks beside it (`DeviceLease::stream_items`), rows staged back.
pub fn launch_lookup(job: &LookupJob, dev: &DeviceLease<'_>) -> Result<Vec<f32>, DeviceError> {
    let table = dev.cached_table(&job.key, || dev.upload(&job.table))?;
    let dim = job.dim;
    let ids = [Operand::slice(&job.ids, 1)];
    let mut out = dev.stream_items(job.ids.len(), &ids, dim, 0, |d_ids, d_out, chunk| {
        let (rows, dim64) = (chunk.len() as u64, dim as u64);
        let mut l = dev.launch("embedding_gather_f32")?;
        l.arg(table.as_ref())
            .arg(&dim64)
            .arg(&d_ids[0])
            .arg(&rows)
            .arg(d_out);
        // SAFETY: every id is below the table's rows (checked by the job); rows·dim out,
        // within the output buffer.
        unsafe { l.launch(dev.launch_config(rows as usize * dim)) }
    })?;
    job.round(&mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::linalg::MatmulShape;

    fn pass(shape: MatmulShape) -> MatmulPass {
        MatmulPass {
            m: shape.m,
            n: shape.n,
            k: shape.k,
            a: shape.a_strides(),
            b: shape.b_strides(),
            c_batch: 0,
            alpha: 2.0,
            beta: 0.5,
            batches: shape.batch,
        }
    }

    #[test]
    fn cublaslt_takes_plain_and_transposed_operands_with_their_batch_strides() {
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let shape = MatmulShape {
                batch: 3,
                m: 5,
                n: 7,
                k: 11,
                a_batched: true,
                b_batched: false,
                c_batched: false,
                trans_a,
                trans_b,
            };
            let p = blaslt_product(&pass(shape), Compute::Tf32).expect("plain strides");
            assert_eq!((p.trans_a, p.trans_b), (trans_a, trans_b));
            assert_eq!((p.m, p.n, p.k, p.batches), (5, 7, 11, 3));
            assert_eq!((p.a_batch_stride, p.b_batch_stride), (55, 0));
            assert_eq!((p.alpha, p.beta, p.compute), (2.0, 0.5, BlasCompute::Tf32));
        }
    }

    #[test]
    fn cublaslt_declines_f64_and_strides_that_are_not_a_matrix() {
        let shape = MatmulShape {
            batch: 1,
            m: 4,
            n: 4,
            k: 4,
            a_batched: false,
            b_batched: false,
            c_batched: false,
            trans_a: false,
            trans_b: false,
        };
        assert!(blaslt_product(&pass(shape), Compute::F64).is_none());
        let mut odd = pass(shape);
        odd.a.row = 8; // a padded leading dimension
        assert!(blaslt_product(&odd, Compute::F32).is_none());
    }
}
