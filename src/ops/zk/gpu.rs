//! GPU launchers for the field vector kernels (`kernels/field_ops.cu`).

use super::ntt::{self, Direction, NttJob, Order};
use super::{Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob, FieldVec, U256};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::{LaunchConfig, Operand};
use crate::backend::DeviceLease;
use crate::backend::{DeviceBuffer, DeviceError, Element};

/// The `extern "C"` name of the kernel for `op` over `field`; the device loads and the
/// launcher calls kernels by this one rule.
pub(crate) fn kernel_name(field: Field, op: FieldOp) -> String {
    format!("{}_{}", field.name(), op.kernel_suffix())
}

/// `kernels/field_ops.cu`: add, sub, mul, pow and inv for every field.
pub fn field_ops_module() -> KernelModule {
    let entry_points = Field::ALL
        .iter()
        .flat_map(|&f| {
            FieldOp::ALL
                .map(|op| kernel_name(f, op))
                .into_iter()
                .chain([format!("{}_pow", f.name()), format!("{}_inv", f.name())])
        })
        .collect();
    KernelModule {
        name: "field_ops",
        source: include_str!("../../../kernels/field_ops.cu"),
        entry_points,
        // Field elements are checked bit for bit (`verify::exactly`); any float it gained
        // would be too.
        exact_floats: true,
        nvidia_only: false,
    }
}

/// A field vector as the kernels take it: u64 words (four per 256-bit element, read by
/// the kernels as eight little-endian u32 limbs) or u32 words (BabyBear).
pub(crate) enum Words<'a> {
    U64(&'a [u64]),
    U32(&'a [u32]),
}

pub(crate) fn words(v: &FieldVec) -> Words<'_> {
    match v {
        FieldVec::Bn254Fr(l) | FieldVec::Bls12_381Fr(l) => Words::U64(l.as_flattened()),
        FieldVec::Goldilocks(w) => Words::U64(w),
        FieldVec::BabyBear(w) => Words::U32(w),
    }
}

pub(crate) fn from_u64(field: Field, out: Vec<u64>) -> FieldVec {
    // The downloaded words are already the elements' layout: the vector is taken over as
    // it is, with no pass over it, unless its capacity is not whole elements.
    let limbs = |out: Vec<u64>| -> Vec<[u64; 4]> {
        bytemuck::allocation::try_cast_vec(out).unwrap_or_else(|(_, out)| {
            out.chunks_exact(4)
                .map(|c| [c[0], c[1], c[2], c[3]])
                .collect()
        })
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

/// The kernels take each field's elements as they are held: a 256-bit element as
/// `[u64; 4]` (read as eight little-endian u32 limbs), so the answer needs no repacking.
pub fn launch_field_binary(
    job: &FieldBinaryJob,
    dev: &DeviceLease<'_>,
) -> Result<FieldVec, DeviceError> {
    let name = kernel_name(job.field(), job.op());
    let (n, stride) = (job.len(), u32::from(!job.is_broadcast()));
    Ok(match job.inputs() {
        (FieldVec::Bn254Fr(x), FieldVec::Bn254Fr(y)) => {
            FieldVec::Bn254Fr(launch_pair(dev, &name, x, y, n, stride)?)
        }
        (FieldVec::Bls12_381Fr(x), FieldVec::Bls12_381Fr(y)) => {
            FieldVec::Bls12_381Fr(launch_pair(dev, &name, x, y, n, stride)?)
        }
        (FieldVec::Goldilocks(x), FieldVec::Goldilocks(y)) => {
            FieldVec::Goldilocks(launch_pair(dev, &name, x, y, n, stride)?)
        }
        (FieldVec::BabyBear(x), FieldVec::BabyBear(y)) => {
            FieldVec::BabyBear(launch_pair(dev, &name, x, y, n, stride)?)
        }
        _ => return Err(mixed()),
    })
}

pub fn launch_field_pow(job: &FieldPowJob, dev: &DeviceLease<'_>) -> Result<FieldVec, DeviceError> {
    let field = job.base().field();
    let name = format!("{}_pow", field.name());
    let (n, stride) = (job.len(), u32::from(!job.is_broadcast()));
    // Each exponent is 256 bits: one element's worth on the 256-bit fields, four u64
    // words beside a Goldilocks base, eight little-endian u32 limbs beside a BabyBear one.
    let exps = || job.exponents().iter().map(|e| e.0);
    Ok(match job.base() {
        FieldVec::Bn254Fr(base) => {
            let exps: Vec<[u64; 4]> = exps().collect();
            FieldVec::Bn254Fr(launch_pair(dev, &name, base, &exps, n, stride)?)
        }
        FieldVec::Bls12_381Fr(base) => {
            let exps: Vec<[u64; 4]> = exps().collect();
            FieldVec::Bls12_381Fr(launch_pair(dev, &name, base, &exps, n, stride)?)
        }
        FieldVec::Goldilocks(base) => {
            let exps: Vec<u64> = exps().flatten().collect();
            FieldVec::Goldilocks(launch_pair(dev, &name, base, &exps, n, stride)?)
        }
        FieldVec::BabyBear(base) => {
            let limbs = exponent_limbs(job.exponents());
            FieldVec::BabyBear(launch_pair(dev, &name, base, &limbs, n, stride)?)
        }
    })
}

/// Exponents as the BabyBear pow kernel reads them: eight little-endian u32 limbs each.
pub(crate) fn exponent_limbs(exponents: &[U256]) -> Vec<u32> {
    exponents
        .iter()
        .flat_map(|e| e.0)
        .flat_map(|w| [w as u32, (w >> 32) as u32])
        .collect()
}

/// The binary and pow kernels' shape: (x, y, out, n, y_stride), out as long as x, y
/// broadcast when its stride is 0. Streamed in chunks (`DeviceLease::stream_items`): x
/// and a full y staged chunk by chunk, a broadcast y uploaded once.
fn launch_pair<T: Element>(
    dev: &DeviceLease<'_>,
    kernel: &str,
    x: &[T],
    y: &[T],
    n: usize,
    y_stride: u32,
) -> Result<Vec<T>, DeviceError> {
    let wx = x.len() / n.max(1);
    let broadcast = y_stride == 0;
    let dy_all = broadcast.then(|| dev.upload(y)).transpose()?;
    let mut inputs = vec![Operand::slice(x, wx)];
    if !broadcast {
        inputs.push(Operand::slice(y, y.len() / n.max(1)));
    }
    let fixed = dy_all.as_ref().map_or(0, |_| std::mem::size_of_val(y));
    dev.stream_items(n, &inputs, wx, fixed, |ins, out, chunk| {
        let m = chunk.len();
        let dy = dy_all.as_ref().unwrap_or_else(|| &ins[1]);
        let m64 = m as u64;
        let mut launch = dev.launch(kernel)?;
        launch
            .arg(&ins[0])
            .arg(dy)
            .arg(out)
            .arg(&m64)
            .arg(&y_stride);
        // SAFETY: the kernel reads m elements of x, m (or 1, stride 0) of y, and writes m
        // of out; the buffers hold at least those words.
        unsafe { launch.launch(dev.launch_config(m)) }
    })
}

/// `{field}_inv` over whole buffers: `out` the inverses of `x`'s `n` elements (none zero).
pub(super) fn invert_whole<T: Element>(
    dev: &DeviceLease<'_>,
    kernel: &str,
    x: &DeviceBuffer<T>,
    n: usize,
) -> Result<DeviceBuffer<T>, DeviceError> {
    let mut out = dev.alloc_zeros::<T>(x.len())?;
    let config = dev.launch_config(n);
    let threads = (config.grid_dim.0 * config.block_dim.0) as usize;
    let (n64, chunk) = (n as u64, inv_chunk(n, threads));
    let mut launch = dev.launch(kernel)?;
    launch.arg(x).arg(&mut out).arg(&n64).arg(&chunk);
    // SAFETY: x and out hold n elements; each chunk writes only its own range.
    unsafe { launch.launch(config) }?;
    Ok(out)
}

/// Elements per thread in the inversion kernel: enough threads to fill the device, at
/// least 8 elements each so the one Fermat inversion per chunk is amortised.
fn inv_chunk(n: usize, threads: usize) -> u64 {
    n.div_ceil(threads.max(1)).max(8) as u64
}

pub fn launch_field_inv(job: &FieldInvJob, dev: &DeviceLease<'_>) -> Result<FieldVec, DeviceError> {
    let name = format!("{}_inv", job.values().field().name());
    let n = job.len();
    Ok(match job.values() {
        FieldVec::Bn254Fr(x) => FieldVec::Bn254Fr(launch_inv(dev, &name, x, n)?),
        FieldVec::Bls12_381Fr(x) => FieldVec::Bls12_381Fr(launch_inv(dev, &name, x, n)?),
        FieldVec::Goldilocks(x) => FieldVec::Goldilocks(launch_inv(dev, &name, x, n)?),
        FieldVec::BabyBear(x) => FieldVec::BabyBear(launch_inv(dev, &name, x, n)?),
    })
}

fn launch_inv<T: Element>(
    dev: &DeviceLease<'_>,
    kernel: &str,
    x: &[T],
    n: usize,
) -> Result<Vec<T>, DeviceError> {
    let w = x.len() / n.max(1);
    let inputs = [Operand::slice(x, w)];
    dev.stream_items(n, &inputs, w, 0, |ins, out, chunk| {
        let m = chunk.len();
        let config = dev.launch_config(m);
        let threads = (config.grid_dim.0 * config.block_dim.0) as usize;
        let (m64, chunk) = (m as u64, inv_chunk(m, threads));
        let mut launch = dev.launch(kernel)?;
        launch.arg(&ins[0]).arg(out).arg(&m64).arg(&chunk);
        // SAFETY: in and out hold at least m elements; each chunk writes only its own
        // range.
        unsafe { launch.launch(config) }
    })
}

/// `kernels/ntt.cu`: the NTT's four kernels for every field.
pub fn ntt_module() -> KernelModule {
    let entry_points = Field::ALL
        .iter()
        .flat_map(|f| ["scale", "bitrev", "stage", "tile"].map(|k| format!("{}_ntt_{k}", f.name())))
        .collect();
    KernelModule {
        name: "ntt",
        source: include_str!("../../../kernels/ntt.cu"),
        entry_points,
        // As field_ops: checked bit for bit.
        exact_floats: true,
        nvidia_only: false,
    }
}

/// The NTT on the device; the same steps as the CPU twin (`ntt.rs`): [bit-reverse a
/// bit-reversed input back], [coset scaling], bit-reverse, stages, [n^-1 and inverse
/// coset scaling], [bit-reverse for a bit-reversed output]. The constant tables stay on
/// the device between calls, keyed by (field, size, direction[, shift]); a batch larger
/// than the memory budget runs in passes of whole polynomials.
pub fn launch_ntt(job: &NttJob, dev: &DeviceLease<'_>) -> Result<FieldVec, DeviceError> {
    let plan = NttPlan::of(job);
    match words(&job.values) {
        Words::U64(x) => {
            let (tw, scale) = ntt_tables(dev, &plan, u64_words)?;
            let out = ntt_steps(dev, &plan, job.batch, x, &tw, scale.as_deref())?;
            Ok(from_u64(plan.field, out))
        }
        Words::U32(x) => {
            let (tw, scale) = ntt_tables(dev, &plan, u32_words)?;
            let out = ntt_steps(dev, &plan, job.batch, x, &tw, scale.as_deref())?;
            Ok(FieldVec::BabyBear(out))
        }
    }
}

/// What the NTT's kernels need of a job: everything but its values.
pub(crate) struct NttPlan {
    pub field: Field,
    /// The size of one transform.
    pub n: usize,
    pub direction: Direction,
    pub input_order: Order,
    pub output_order: Order,
    pub coset_shift: Option<super::U256>,
}

impl NttPlan {
    fn of(job: &NttJob) -> Self {
        Self {
            field: job.values.field(),
            n: job.size(),
            direction: job.direction,
            input_order: job.input_order,
            output_order: job.output_order,
            coset_shift: job.coset_shift,
        }
    }
}

type Table<T> = std::sync::Arc<DeviceBuffer<T>>;

/// The transform's twiddles and, when it scales, its scale factors: kept on the device
/// between calls, keyed by (field, size, direction[, shift]).
pub(crate) fn ntt_tables<T: Element>(
    dev: &DeviceLease<'_>,
    plan: &NttPlan,
    words: fn(&FieldVec) -> &[T],
) -> Result<(Table<T>, Option<Table<T>>), DeviceError> {
    let (field, n) = (plan.field, plan.n);
    let host_tables = std::cell::OnceCell::new();
    let tables = || {
        host_tables.get_or_init(|| ntt::kernel_tables(field, n, plan.direction, plan.coset_shift))
    };
    let key = format!("ntt/{}/{n}/{:?}", field.name(), plan.direction);
    let scaled = plan.direction == Direction::Inverse || plan.coset_shift.is_some();
    let scale_key = format!("{key}/scale/{:?}", plan.coset_shift);
    let tw = dev.cached_table(&format!("{key}/twiddles"), || {
        upload_table(dev, words(&tables().0))
    })?;
    let scale = scaled
        .then(|| {
            dev.cached_table(&scale_key, || {
                upload_table(dev, words(tables().1.as_ref().expect("scaled")))
            })
        })
        .transpose()?;
    Ok((tw, scale))
}

pub(crate) fn u64_words(v: &FieldVec) -> &[u64] {
    match words(v) {
        Words::U64(w) => w,
        Words::U32(_) => &[],
    }
}

pub(crate) fn u32_words(v: &FieldVec) -> &[u32] {
    match words(v) {
        Words::U32(w) => w,
        Words::U64(_) => &[],
    }
}

/// A table on the device; one zero word for an empty one (n = 1 has no twiddles) keeps
/// every buffer non-empty.
fn upload_table<T: Element>(
    dev: &DeviceLease<'_>,
    words: &[T],
) -> Result<DeviceBuffer<T>, DeviceError> {
    if words.is_empty() {
        dev.alloc_zeros::<T>(1)
    } else {
        dev.upload(words)
    }
}

/// Shared memory per tile block: 32 KiB fits every architecture's default 48 KiB and
/// leaves room for two resident blocks per SM on sm_80+.
pub const TILE_BYTES: usize = 32 << 10;

/// log2 of the tile (elements whose first stages run in shared memory) and the threads
/// per tile block.
pub fn tile_plan(n: usize, element_bytes: usize) -> (u32, u32) {
    tile_plan_within(n, element_bytes, TILE_BYTES)
}

/// `tile_plan` for a tile kernel whose shared memory holds `tile_bytes`.
fn tile_plan_within(n: usize, element_bytes: usize, tile_bytes: usize) -> (u32, u32) {
    let max_tile = (tile_bytes / element_bytes).max(2);
    let tile = n.min(1 << max_tile.ilog2());
    (tile.trailing_zeros(), (tile / 2).clamp(1, 512) as u32)
}

/// `batch` transforms of `x` (w words per element) in passes of whole polynomials that
/// fit the lease's memory, each uploaded, transformed in place and downloaded.
fn ntt_steps<T: Element>(
    dev: &DeviceLease<'_>,
    plan: &NttPlan,
    batch: usize,
    x: &[T],
    tw: &DeviceBuffer<T>,
    scale: Option<&DeviceBuffer<T>>,
) -> Result<Vec<T>, DeviceError> {
    let n = plan.n;
    let w = x.len() / (n * batch);
    let polys = dev.items_per_pass(batch, n * w * std::mem::size_of::<T>(), 0);
    let mut host = Vec::with_capacity(x.len());
    for first in (0..batch).step_by(polys) {
        dev.still_wanted()?;
        let m = polys.min(batch - first);
        let mut dx = dev.upload(&x[first * n * w..(first + m) * n * w])?;
        ntt_in_place(dev, plan, w, &mut dx, tw, scale)?;
        dev.download_into(&dx, &mut host)?;
    }
    Ok(host)
}

/// The same steps as the CPU twin (`ntt.rs`) over every polynomial `dx` holds, in place:
/// [bit-reverse a bit-reversed input back], [coset scaling], bit-reverse, stages, [n^-1
/// and inverse coset scaling], [bit-reverse for a bit-reversed output].
pub(crate) fn ntt_in_place<T: Element>(
    dev: &DeviceLease<'_>,
    plan: &NttPlan,
    w: usize,
    dx: &mut DeviceBuffer<T>,
    tw: &DeviceBuffer<T>,
    scale: Option<&DeviceBuffer<T>>,
) -> Result<(), DeviceError> {
    let name = plan.field.name();
    let n = plan.n;
    let element_bytes = w * std::mem::size_of::<T>();
    let (n64, log_n) = (n as u64, n.trailing_zeros());
    let bitrev = format!("{name}_ntt_bitrev");
    let scale_fn = format!("{name}_ntt_scale");
    let stage = format!("{name}_ntt_stage");
    let tile_fn = format!("{name}_ntt_tile");
    // An engine may bound the tile kernel's shared memory and block below CUDA's (a
    // WGSL kernel's workgroup array and size): the tile shrinks, its block loops.
    let tile_bytes = dev
        .max_shared_bytes(&tile_fn)
        .map_or(TILE_BYTES, |b| TILE_BYTES.min(b as usize));
    let (log_tile, tile_threads) = tile_plan_within(n, element_bytes, tile_bytes);
    let tile_threads = tile_threads.min(dev.max_threads(&tile_fn).unwrap_or(tile_threads));
    let elements = dx.len() / w;
    let total = elements as u64;
    let all = dev.launch_config(elements);
    let permute = |dx: &mut DeviceBuffer<T>| -> Result<(), DeviceError> {
        let mut l = dev.launch(&bitrev)?;
        l.arg(dx).arg(&n64).arg(&log_n).arg(&total);
        // SAFETY: x holds `total` elements in polynomials of n; swaps stay inside each.
        unsafe { l.launch(all) }?;
        Ok(())
    };
    let scale_by = |dx: &mut DeviceBuffer<T>, ds: &DeviceBuffer<T>| -> Result<(), DeviceError> {
        let mut l = dev.launch(&scale_fn)?;
        l.arg(dx).arg(ds).arg(&n64).arg(&total);
        // SAFETY: x holds `total` elements, the table n.
        unsafe { l.launch(all) }?;
        Ok(())
    };
    if plan.input_order == Order::BitReversed {
        permute(dx)?;
    }
    if let (Direction::Forward, Some(ds)) = (plan.direction, scale) {
        scale_by(dx, ds)?;
    }
    permute(dx)?;
    if n > 1 {
        let tiles = total >> log_tile;
        let mut l = dev.launch(&tile_fn)?;
        l.arg(&mut *dx).arg(tw).arg(&n64).arg(&log_tile).arg(&tiles);
        let config = LaunchConfig {
            grid_dim: (tiles.min(1 << 16) as u32, 1, 1),
            block_dim: (tile_threads, 1, 1),
            shared_mem_bytes: (element_bytes << log_tile) as u32,
        };
        // SAFETY: tiles·2^log_tile = total elements; each block stages its own tile in
        // `shared_mem_bytes` of shared memory; twiddle indices stay below n/2.
        unsafe { l.launch(config) }?;
    }
    let butterflies = dev.launch_config(elements / 2);
    let mut half = 1u64 << log_tile;
    while half < n64 {
        let mut l = dev.launch(&stage)?;
        l.arg(&mut *dx).arg(tw).arg(&n64).arg(&half).arg(&total);
        // SAFETY: total/2 butterflies, each on two elements of its own polynomial;
        // twiddle indices stay below n/2.
        unsafe { l.launch(butterflies) }?;
        half *= 2;
    }
    if let (Direction::Inverse, Some(ds)) = (plan.direction, scale) {
        scale_by(dx, ds)?;
    }
    if plan.output_order == Order::BitReversed {
        permute(dx)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Downloaded words become 256-bit elements in place: the same allocation, in order.
    #[test]
    fn downloaded_words_become_elements_without_a_copy() {
        let mut words: Vec<u64> = Vec::with_capacity(8);
        words.extend(1..=8);
        let at = words.as_ptr();
        let FieldVec::Bn254Fr(elements) = from_u64(Field::Bn254Fr, words) else {
            unreachable!()
        };
        assert_eq!(elements, [[1, 2, 3, 4], [5, 6, 7, 8]]);
        assert_eq!(
            elements.as_ptr().cast::<u64>(),
            at,
            "taken over, not copied"
        );
        // A capacity that is not whole elements is copied, still right.
        let mut odd: Vec<u64> = Vec::with_capacity(9);
        odd.extend(1..=8);
        let FieldVec::Bls12_381Fr(elements) = from_u64(Field::Bls12_381Fr, odd) else {
            unreachable!()
        };
        assert_eq!(elements, [[1, 2, 3, 4], [5, 6, 7, 8]]);
    }
}
