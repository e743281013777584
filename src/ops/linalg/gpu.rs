//! Launchers for `kernels/linalg.cu`. Matmul uploads the (already rounded) operands, runs
//! the batch in passes that fit the device's memory budget, and rounds D to the output
//! dtype; sinusoidal embeddings run rows in passes the same way.

use super::lookup::LookupJob;
use super::matmul::{MatmulJob, Operands, Strides, Values};
use super::on_device::{pack_half, pack_half_on_host, unpack_half, DeviceRef};
use super::sinusoidal::{Layout, SinusoidalJob};
use super::Compute;
use crate::backend::cuda::blaslt::{
    BlasCompute, OperandStorage, RowMajorProduct, MATMUL_BLASLT_OP,
};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::DeviceBuffer;
use crate::backend::device::{LaunchConfig, Operand};
use crate::backend::{DeviceError, DeviceErrorKind, DeviceLease};
use std::sync::Arc;

const KERNEL_NAMES: &[&str] = &[
    "matmul_f32",
    "round_output_f32",
    "any_zero_element",
    "copy_range_f32",
    "pack_half_f32",
    "unpack_half_f32",
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

    /// Whether this provider's passes pack A and B into 16 bits on the device (cuBLASLt's
    /// f16 and bf16 products), so a pass needs room for the packed copies too.
    pub(crate) fn packs(self, compute: Compute) -> bool {
        self == MatmulProvider::BlasLt && matches!(compute, Compute::F16 | Compute::Bf16)
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
    let (entry_bytes, shared_bytes) = s.device_bytes(c.is_some(), provider.packs(job.compute));
    let budget = dev.memory_budget().saturating_sub(shared_bytes);
    let per_pass = (budget / entry_bytes.max(1)).clamp(1, s.batch);
    // A and B go up packed into 16 bits where cuBLASLt will read them so (an f16 or bf16
    // product it takes, judged on a full pass): half the bytes cross the bus.
    let (m, n) = (s.m, s.n);
    let c_len = c
        .as_ref()
        .map(|_| if s.c_batched { per_pass * m * n } else { m * n });
    let full_pass = MatmulPass::of(job, per_pass);
    let packed = blaslt_takes(provider, &full_pass, job.compute, c_len, per_pass * m * n)
        .and_then(|_| half_dtype(job.compute));
    let upload = |v: &[f32]| match packed {
        Some(dtype) => Ok(Uploaded::Packed(
            Arc::new(dev.upload(&pack_half_on_host(v, dtype))?),
            dtype,
        )),
        None => Ok::<_, DeviceError>(Uploaded::F32(Arc::new(dev.upload(v)?))),
    };
    // An operand is uploaded once when it is broadcast or the batch fits one pass (from
    // the device's cache when it is a resident array's: `MatmulJob::device_keys`, packed
    // ones under a key of their own), else per pass.
    let one_pass = per_pass >= s.batch;
    let whole = |v: &[f32], batched: bool, key: &Option<String>| {
        if batched && !one_pass {
            return Ok(None);
        }
        Ok::<_, DeviceError>(Some(match (key, packed) {
            (Some(key), Some(dtype)) => {
                let packed_key = format!("{key}/packed");
                let table =
                    dev.cached_table(&packed_key, || dev.upload(&pack_half_on_host(v, dtype)))?;
                Uploaded::Packed(table, dtype)
            }
            (Some(key), None) => Uploaded::F32(dev.cached_table(key, || dev.upload(v))?),
            (None, _) => upload(v)?,
        }))
    };
    let [key_a, key_b, key_c] = &job.device_keys;
    let a_all = whole(a, s.a_batched, key_a)?;
    let b_all = whole(b, s.b_batched, key_b)?;
    let c_all = match c {
        Some(c) if !s.c_batched || one_pass => Some(match key_c {
            Some(key) => dev.cached_table(key, || dev.upload(c))?,
            None => Arc::new(dev.upload(c)?),
        }),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.out_len());
    let mut first = 0;
    while first < s.batch {
        dev.still_wanted()?;
        let count = per_pass.min(s.batch - first);
        // A batched operand's entries of this pass, when the batch takes several.
        let range = |len: usize| first * len..(first + count) * len;
        let per_pass = |batched: bool| batched && !one_pass;
        let a_pass = match per_pass(s.a_batched) {
            true => Some(upload(&a[range(s.m * s.k)])?),
            false => None,
        };
        let b_pass = match per_pass(s.b_batched) {
            true => Some(upload(&b[range(s.k * s.n)])?),
            false => None,
        };
        let c_pass = match c {
            Some(c) if per_pass(s.c_batched) => Some(dev.upload(&c[range(s.m * s.n)])?),
            _ => None,
        };
        let d_a = a_pass.as_ref().or(a_all.as_ref()).expect("A uploaded");
        let d_b = b_pass.as_ref().or(b_all.as_ref()).expect("B uploaded");
        let mut d = dev.alloc_zeros::<f32>(count * s.m * s.n)?;
        let pass = MatmulPass::of(job, count);
        let d_c = c_pass.as_ref().or(c_all.as_deref());
        let operands = (d_a.operand(), d_b.operand());
        matmul_pass(dev, provider, job.compute, &pass, operands, d_c, &mut d)?;
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

/// An operand of a pass on the device: f32, or packed into 16 bits of `Dtype`.
#[derive(Clone, Copy)]
pub(crate) enum PassOperand<'a> {
    F32(&'a DeviceBuffer<f32>),
    Packed(&'a DeviceBuffer<u16>, super::Dtype),
}

/// An operand uploaded for a pass (or cached for the job's passes).
enum Uploaded {
    F32(Arc<DeviceBuffer<f32>>),
    Packed(Arc<DeviceBuffer<u16>>, super::Dtype),
}

impl Uploaded {
    fn operand(&self) -> PassOperand<'_> {
        match self {
            Uploaded::F32(b) => PassOperand::F32(b),
            Uploaded::Packed(b, dtype) => PassOperand::Packed(b, *dtype),
        }
    }
}

/// The 16-bit storage of an f16 or bf16 product's operands.
fn half_dtype(compute: Compute) -> Option<super::Dtype> {
    match compute {
        Compute::F16 => Some(super::Dtype::F16),
        Compute::Bf16 => Some(super::Dtype::Bf16),
        _ => None,
    }
}

impl<'a> PassOperand<'a> {
    /// As f32, widened on the device if it came packed (for our kernel).
    fn widened(self, dev: &DeviceLease<'_>) -> Result<DeviceRef<'a, f32>, DeviceError> {
        match self {
            PassOperand::F32(b) => Ok(DeviceRef::Borrowed(b)),
            PassOperand::Packed(b, dtype) => Ok(DeviceRef::Made(unpack_half(dev, b, dtype)?)),
        }
    }

    /// As 16-bit `dtype`, packed on the device if it came as f32 (for cuBLASLt).
    fn packed(
        self,
        dev: &DeviceLease<'_>,
        dtype: super::Dtype,
    ) -> Result<DeviceRef<'a, u16>, DeviceError> {
        match self {
            PassOperand::Packed(b, had) if had == dtype => Ok(DeviceRef::Borrowed(b)),
            PassOperand::Packed(..) => Err(DeviceError::fatal(
                "an operand packed in another 16-bit type than its product's",
            )),
            PassOperand::F32(b) => Ok(DeviceRef::Made(pack_half(dev, b, dtype)?)),
        }
    }
}

/// One pass by `provider`. cuBLASLt takes C as D's starting value, so it runs where C is
/// absent or can be copied into D whole (batched, or a single entry); a pass it cannot
/// take, whose operand strides are not plain row-major, or that cuBLASLt refuses (no
/// algorithm for it), runs on our kernel, with packed operands widened first. Our kernel
/// reads C, not D, and writes all of D, so the copy already made does not matter then.
pub(crate) fn matmul_pass(
    dev: &DeviceLease<'_>,
    provider: MatmulProvider,
    compute: Compute,
    pass: &MatmulPass,
    (a, b): (PassOperand<'_>, PassOperand<'_>),
    c: Option<&DeviceBuffer<f32>>,
    d: &mut DeviceBuffer<f32>,
) -> Result<(), DeviceError> {
    let on_kernel = |d: &mut DeviceBuffer<f32>| {
        let (a, b) = (a.widened(dev)?, b.widened(dev)?);
        launch_matmul_f32(dev, pass, &a, &b, c, d)
    };
    let c_len = c.map(|c| c.len());
    let Some(mut product) = blaslt_takes(provider, pass, compute, c_len, d.len()) else {
        return on_kernel(d);
    };
    match c {
        Some(c) => dev.copy(c, d)?,
        None => product.beta = 0.0,
    }
    let ran = match half_dtype(compute) {
        None => {
            let (a, b) = (a.widened(dev)?, b.widened(dev)?);
            dev.blaslt_matmul(&product, &a, &b, d)
        }
        Some(dtype) => match (a.packed(dev, dtype), b.packed(dev, dtype)) {
            (Ok(a16), Ok(b16)) => dev.blaslt_matmul(&product, &a16, &b16, d),
            // No room for packed copies of f32 operands: the library converts them.
            (Err(e), _) | (_, Err(e)) if e.kind == DeviceErrorKind::OutOfMemory => {
                product.storage = OperandStorage::F32;
                let (a, b) = (a.widened(dev)?, b.widened(dev)?);
                dev.blaslt_matmul(&product, &a, &b, d)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        },
    };
    match ran {
        Err(e) if e.kind == DeviceErrorKind::Unsupported => {
            tracing::debug!(reason = %e.message, "cuBLASLt declined a pass; our kernel runs it");
            on_kernel(d)
        }
        done => done,
    }
}

/// The pass as cuBLASLt runs it, where `provider` is cuBLASLt and the pass is one it
/// takes: its operands' strides (`blaslt_product`), and C (`c_len` values) absent or one
/// it can start from, copied into D (`d_len` values) whole: batched, or a single entry.
fn blaslt_takes(
    provider: MatmulProvider,
    pass: &MatmulPass,
    compute: Compute,
    c_len: Option<usize>,
    d_len: usize,
) -> Option<RowMajorProduct> {
    let whole_c = pass.batches == 1 || pass.c_batch == pass.m * pass.n;
    let c_fits = c_len.is_none_or(|c| c == d_len && whole_c);
    (provider == MatmulProvider::BlasLt && c_fits)
        .then(|| blaslt_product(pass, compute))
        .flatten()
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
        storage: match compute {
            BlasCompute::F16 => OperandStorage::F16,
            BlasCompute::Bf16 => OperandStorage::Bf16,
            BlasCompute::F32 | BlasCompute::Tf32 => OperandStorage::F32,
        },
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

    /// Bytes a lease copied to its device, all ways.
    fn uploaded(dev: &DeviceLease<'_>) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let c = dev.copies();
        [
            &c.staged_to_device,
            &c.body_to_device,
            &c.pageable_to_device,
        ]
        .iter()
        .map(|n| n.load(Relaxed))
        .sum()
    }

    /// With cuBLASLt the operands of an f16 or bf16 product go up packed into 16 bits.
    /// The emulated device has no cuBLASLt, so there each pass takes the way back: the
    /// packed operands widened on the device for our kernel. The answer must be the CPU's,
    /// in one pass and in several, with two bytes uploaded a value of A and B.
    #[test]
    fn half_products_upload_packed_operands_and_our_kernel_reads_them_widened() {
        use crate::backend::{GpuDevice, Job};
        use crate::ops::linalg::{Dtype, MatmulJob, Operands};
        let spread = |len: usize, salt: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 31 + salt * 7) as f32 * 0.377).sin() * (1 + (i + salt) % 5) as f32)
                .collect()
        };
        let shape = MatmulShape {
            batch: 24,
            m: 70,
            n: 33,
            k: 65,
            a_batched: true,
            b_batched: false,
            c_batched: true,
            trans_a: false,
            trans_b: true,
        };
        // A device whose budget takes the batch whole, and one that takes it in passes.
        for (memory, passes) in [(1u64 << 28, false), (1 << 20, true)] {
            let dev = GpuDevice::emulated(0, memory);
            for compute in [Compute::F16, Compute::Bf16] {
                let operands = Operands::F32 {
                    a: spread(shape.a_len(), 1).into(),
                    b: spread(shape.b_len(), 2).into(),
                    c: Some(spread(shape.c_len(), 3).into()),
                };
                let job =
                    MatmulJob::new(shape, operands, 1.25, -0.5, compute, Dtype::F32, Dtype::F32)
                        .unwrap();
                let lease = dev.lease().unwrap();
                let (entry, shared) = shape.device_bytes(true, true);
                assert_eq!(entry * shape.batch + shared > lease.memory_budget(), passes);
                let got = run_matmul_on(&job, &lease, MatmulProvider::BlasLt).unwrap();
                job.agrees(&got, &job.run_cpu())
                    .unwrap_or_else(|e| panic!("{compute:?}, passes {passes}: {e}"));
                let halves = 2 * (shape.a_len() + shape.b_len()) + 4 * shape.c_len();
                assert_eq!(uploaded(&lease), halves as u64, "{compute:?}");
            }
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
