//! GPU launcher for the MSM kernels (`kernels/msm.cu`), and what it shares with their
//! host build: the final combination of the per-segment sums the kernels return (the
//! plan is `msm_plan.rs`).

use super::msm::{MsmJob, Points};
pub(crate) use super::msm_plan::MsmPlan;
use super::msm_plan::SHORT_LOOP_PASS;
use super::FieldVec;
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::LaunchConfig;
use crate::backend::{DeviceBuffer, DeviceError, DeviceErrorKind};
use crate::backend::{DeviceLease, GpuDevice};
use ark_ec::short_weierstrass::{Affine, Projective, SWCurveConfig};
use ark_ec::{AffineRepr, CurveGroup};
use ark_ff::{AdditiveGroup, BigInt, Zero};

/// A curve the kernels know: its kernel prefix, limb count and Montgomery words.
pub(crate) trait DeviceCurve: SWCurveConfig {
    const PREFIX: &'static str;
    /// u32 limbs per base-field element.
    const LIMBS: usize;
    const SCALAR_BITS: u32;
    /// Appends the element's Montgomery form (what the kernels compute in).
    fn push_words(v: &Self::BaseField, out: &mut Vec<u32>);
    fn from_words(w: &[u32]) -> Self::BaseField;
}

macro_rules! device_curve {
    ($config:ty, $fq:ty, $prefix:literal, $limbs64:literal, $bits:literal) => {
        impl DeviceCurve for $config {
            const PREFIX: &'static str = $prefix;
            const LIMBS: usize = 2 * $limbs64;
            const SCALAR_BITS: u32 = $bits;
            fn push_words(v: &$fq, out: &mut Vec<u32>) {
                // arkworks keeps field elements in Montgomery form with the same R.
                for l in v.0 .0 {
                    out.extend([l as u32, (l >> 32) as u32]);
                }
            }
            fn from_words(w: &[u32]) -> $fq {
                let limbs =
                    std::array::from_fn(|i| u64::from(w[2 * i]) | (u64::from(w[2 * i + 1]) << 32));
                <$fq>::new_unchecked(BigInt::<$limbs64>(limbs))
            }
        }
    };
}

device_curve!(ark_bn254::g1::Config, ark_bn254::Fq, "bn254_g1", 4, 254);
device_curve!(
    ark_bls12_381::g1::Config,
    ark_bls12_381::Fq,
    "bls12_381_g1",
    6,
    255
);

/// `kernels/msm.cu`: the shared digit and sort kernels, and multiples, buckets and reduce
/// per curve.
pub fn msm_module() -> KernelModule {
    let shared = ["msm_digits", "msm_count", "msm_scan", "msm_scatter"].map(String::from);
    let per_curve = [
        <ark_bn254::g1::Config as DeviceCurve>::PREFIX,
        <ark_bls12_381::g1::Config as DeviceCurve>::PREFIX,
    ]
    .into_iter()
    .flat_map(|p| ["multiples", "buckets", "partials", "reduce"].map(|k| format!("{p}_msm_{k}")));
    KernelModule {
        name: "msm",
        source: include_str!("../../../kernels/msm.cu"),
        entry_points: shared.into_iter().chain(per_curve).collect(),
        // Sums are checked bit for bit (`verify::exactly`); any float it gained would be
        // too.
        exact_floats: true,
        nvidia_only: false,
    }
}

/// Affine points as the kernels read them: x then y, Montgomery words.
pub(crate) fn point_words<P: DeviceCurve>(points: &[Affine<P>]) -> Vec<u32> {
    let mut out = Vec::with_capacity(points.len() * 2 * P::LIMBS);
    for p in points {
        let (x, y) = p.xy().expect("the identity is filtered out before upload");
        P::push_words(&x, &mut out);
        P::push_words(&y, &mut out);
    }
    out
}

/// Σ over segments and bucket windows (Horner in 2^c) of the reduction's Jacobian words.
pub(crate) fn combine<P: DeviceCurve>(plan: &MsmPlan, words: &[u32]) -> Projective<P> {
    let width = 3 * P::LIMBS;
    let segs = plan.segments() as usize;
    let mut total = Projective::<P>::zero();
    for w in (0..plan.block_windows as usize).rev() {
        for _ in 0..plan.c {
            total.double_in_place();
        }
        for s in 0..segs {
            let j = &words[(w * segs + s) * width..][..width];
            let z = P::from_words(&j[2 * P::LIMBS..]);
            if !z.is_zero() {
                total += Projective::<P>::new_unchecked(
                    P::from_words(&j[..P::LIMBS]),
                    P::from_words(&j[P::LIMBS..2 * P::LIMBS]),
                    z,
                );
            }
        }
    }
    total
}

/// The scalars of the kept points, as u64 words (the kernels read 8 u32 limbs).
pub(crate) fn scalar_words(scalars: &FieldVec, keep: &[usize]) -> Vec<u64> {
    match scalars {
        FieldVec::Bn254Fr(v) | FieldVec::Bls12_381Fr(v) => {
            keep.iter().flat_map(|&i| v[i]).collect()
        }
        _ => unreachable!("MsmJob::new checked the scalar field"),
    }
}

pub fn launch_msm(job: &MsmJob, dev: &DeviceLease<'_>) -> Result<Points, DeviceError> {
    launch_msm_in_chunks(job, dev, usize::MAX)
}

/// As `launch_msm`, with at most `max_chunk` points per device pass (the parity tests
/// use it to exercise the chunked path without filling the device).
pub fn launch_msm_in_chunks(
    job: &MsmJob,
    dev: &DeviceLease<'_>,
    max_chunk: usize,
) -> Result<Points, DeviceError> {
    run_job(job, dev, max_chunk, None)
}

/// The serial work of a job's bucket sums, over all its point chunks and scalar vectors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BucketWork {
    /// The most additions one thread made, per level (the first adds points).
    pub most_adds_per_level: Vec<u32>,
    /// The most entries in one bucket: what one thread per bucket would have added.
    pub largest_bucket: u32,
    /// The plans' largest chunk, which bounds every level.
    pub chunk: u32,
}

impl BucketWork {
    /// The longest chain of additions one bucket's sum waits for.
    pub fn critical_path(&self) -> u32 {
        self.most_adds_per_level.iter().sum()
    }

    fn merge(&mut self, plan: &MsmPlan, most_adds: &[u32], counts: &[u32]) {
        if self.most_adds_per_level.len() < most_adds.len() {
            self.most_adds_per_level.resize(most_adds.len(), 0);
        }
        for (mine, &theirs) in self.most_adds_per_level.iter_mut().zip(most_adds) {
            *mine = (*mine).max(theirs);
        }
        let largest = counts.iter().copied().max().unwrap_or(0);
        self.largest_bucket = self.largest_bucket.max(largest);
        self.chunk = self.chunk.max(plan.chunk);
    }
}

/// As `launch_msm_in_chunks`, also measuring the bucket sums' work per thread (two
/// more downloads per scalar vector): how tests show that skewed scalars cost no more.
pub fn launch_msm_measured(
    job: &MsmJob,
    dev: &DeviceLease<'_>,
    max_chunk: usize,
) -> Result<(Points, BucketWork), DeviceError> {
    let mut work = BucketWork::default();
    let points = run_job(job, dev, max_chunk, Some(&mut work))?;
    Ok((points, work))
}

fn run_job(
    job: &MsmJob,
    dev: &DeviceLease<'_>,
    max_chunk: usize,
    work: Option<&mut BucketWork>,
) -> Result<Points, DeviceError> {
    let scalars = job.scalars();
    let resident = job.device_key().map(|key| Resident {
        key,
        multiples: job.precomputed_multiples(),
    });
    Ok(match job.points() {
        Points::Bn254G1(p) => {
            Points::Bn254G1(run_curve(dev, p, scalars, resident, max_chunk, work)?)
        }
        Points::Bls12_381G1(p) => {
            Points::Bls12_381G1(run_curve(dev, p, scalars, resident, max_chunk, work)?)
        }
    })
}

/// Points that are a resident array's: the key a device keeps them under, and the
/// multiples of each it may precompute (`MsmJob::with_precomputed_multiples`).
#[derive(Clone, Copy)]
struct Resident<'k> {
    key: &'k str,
    multiples: u32,
}

/// Device bytes for a chunk of `n` points.
fn chunk_bytes<P: DeviceCurve>(n: usize, dev: &GpuDevice) -> usize {
    plan_bytes::<P>(n, &MsmPlan::for_device(n, P::SCALAR_BITS, dev))
}

/// Device bytes for `n` points under `plan`: the points (and their multiples), scalars,
/// digits and entries, buckets, slots and partials.
fn plan_bytes<P: DeviceCurve>(n: usize, plan: &MsmPlan) -> usize {
    let terms_per_point = plan.terms(1);
    let per_point = 4 * 2 * P::LIMBS * plan.blocks as usize + 32 + 2 * 4 * terms_per_point;
    let per_bucket = 4 * 4 * P::LIMBS + 3 * 4;
    let (first, second) = plan.slot_buffers(plan.terms(n));
    let per_slot = 4 * (4 * P::LIMBS + 1);
    n * per_point
        + plan.buckets() * per_bucket
        + (first + second) * per_slot
        + plan.partials() * 4 * 3 * P::LIMBS
}

fn chunk_len<P: DeviceCurve>(dev: &DeviceLease<'_>, n: usize) -> usize {
    // Points beyond the device's memory budget run in chunks whose sums are added on
    // the host.
    let budget = dev.memory_budget();
    let mut len = n;
    if dev.device.bounds_loop_iterations() {
        len = len.min(SHORT_LOOP_PASS);
    }
    while len > 1 << 10 && chunk_bytes::<P>(len, dev.device) > budget {
        len = len.div_ceil(2);
    }
    len
}

/// `resident`: the points are a resident array's, kept on the device under its key
/// when they fit one pass (the usual case; points run in chunks only past the job's
/// memory budget, and those chunks are uploaded each time), with their precomputed
/// multiples where the device builds them (`multiples`).
fn run_curve<P: DeviceCurve>(
    dev: &DeviceLease<'_>,
    points: &[Affine<P>],
    scalars: &[FieldVec],
    resident: Option<Resident<'_>>,
    max_chunk: usize,
    mut work: Option<&mut BucketWork>,
) -> Result<Vec<Affine<P>>, DeviceError> {
    let keep: Vec<usize> = (0..points.len())
        .filter(|&i| !points[i].is_zero())
        .collect();
    let mut sums = vec![Projective::<P>::zero(); scalars.len()];
    let chunk = chunk_len::<P>(dev, keep.len()).min(max_chunk).max(1);
    for part in keep.chunks(chunk) {
        let plan = MsmPlan::for_device(part.len(), P::SCALAR_BITS, dev.device);
        let upload = || {
            let chosen: Vec<Affine<P>> = part.iter().map(|&i| points[i]).collect();
            dev.upload(&point_words(&chosen))
        };
        let (plan, words) = match resident.filter(|_| part.len() == keep.len()) {
            Some(r) => match multiples::<P>(dev, plan, part.len(), r, upload)? {
                Some(built) => built,
                None => (plan, dev.cached_table(r.key, upload)?),
            },
            None => (plan, std::sync::Arc::new(upload()?)),
        };
        let mut launcher = Launcher::<P>::new(dev, plan, words)?;
        for (sum, s) in sums.iter_mut().zip(scalars) {
            dev.still_wanted()?;
            *sum += launcher.run(&scalar_words(s, part))?;
            if let Some(work) = work.as_deref_mut() {
                let most_adds = dev.download(&launcher.most_adds)?;
                work.merge(&plan, &most_adds, &dev.download(&launcher.counts)?);
            }
        }
    }
    Ok(Projective::normalize_batch(&sums))
}

/// Points on a device and the plan that reads them.
type PlannedPoints = (MsmPlan, std::sync::Arc<DeviceBuffer<u32>>);

/// `n` resident points with their precomputed multiples (`MsmPlan::with_multiples`: up
/// to `r.multiples` of each), and the plan over them: built on this device by
/// `<curve>_msm_multiples` on their first MSM here and kept in its table cache under the
/// points' key (so dropped with the array, and evicted like any copy), in place of the
/// points' plain copy (block 0 is the points). None, and the plain plan runs, where the
/// job asks for none, the device has no such kernel or bounds its loops, the build fails,
/// or they are not built yet and would not be kept (more than half the room that results
/// pinned in the cache leave: they would be built again on every call) or the run would
/// take more than the job's memory. One job builds them at a time (`claim_build`); an
/// MSM meanwhile runs the plain plan.
fn multiples<P: DeviceCurve>(
    dev: &DeviceLease<'_>,
    plan: MsmPlan,
    n: usize,
    r: Resident<'_>,
    upload: impl FnOnce() -> Result<DeviceBuffer<u32>, DeviceError>,
) -> Result<Option<PlannedPoints>, DeviceError> {
    let kernel = format!("{}_msm_multiples", P::PREFIX);
    if r.multiples < 2 || dev.device.bounds_loop_iterations() || !dev.has_kernel(&kernel) {
        return Ok(None);
    }
    let plan = plan.with_multiples(n, r.multiples);
    if plan.blocks < 2 {
        return Ok(None);
    }
    let key = format!("{}/multiples/{}x{}", r.key, plan.blocks, plan.block_shift());
    let table_words = n * plan.blocks as usize * 2 * P::LIMBS;
    // Built already: their bytes are the cache's, not this job's.
    if let Some(table) = dev.table::<u32>(&key)?.filter(|t| t.len() == table_words) {
        return Ok(Some((plan, table)));
    }
    let fits = 4 * table_words <= dev.table_cache_room() / 2
        && plan_bytes::<P>(n, &plan) <= dev.memory_budget();
    if !fits {
        return Ok(None);
    }
    // Another job building them now caches them for the next: this one runs the plain
    // plan (a build costs several MSMs: waiting would not pay either).
    let Some(_claim) = dev.device.claim_build(&key) else {
        return Ok(None);
    };
    // Built and cached between this job's lookup and its claim.
    if let Some(table) = dev
        .held_table::<u32>(&key)?
        .filter(|t| t.len() == table_words)
    {
        return Ok(Some((plan, table)));
    }
    match build_multiples::<P>(dev, &plan, n, r.key, &key, upload) {
        Ok(table) => {
            dev.uncache(r.key);
            Ok(Some((plan, table)))
        }
        Err(e) if e.kind == DeviceErrorKind::Abandoned => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, "an MSM's precomputed multiples were not built; the plain plan runs");
            Ok(None)
        }
    }
}

/// Builds the multiples `plan` reads of the `n` points under `points_key` and caches them
/// under `key`. One cache lookup a build (the caller's missed): the points' plain copy is
/// read only where the cache holds it, a hit, and is uploaded otherwise.
fn build_multiples<P: DeviceCurve>(
    dev: &DeviceLease<'_>,
    plan: &MsmPlan,
    n: usize,
    points_key: &str,
    key: &str,
    upload: impl FnOnce() -> Result<DeviceBuffer<u32>, DeviceError>,
) -> Result<std::sync::Arc<DeviceBuffer<u32>>, DeviceError> {
    let base = match dev.held_table::<u32>(points_key)? {
        Some(cached) if cached.len() == n * 2 * P::LIMBS => cached,
        _ => std::sync::Arc::new(upload()?),
    };
    let mut out = dev.alloc_zeros::<u32>(n * plan.blocks as usize * 2 * P::LIMBS)?;
    let (n64, shift) = (n as u64, plan.block_shift());
    let kernel = format!("{}_msm_multiples", P::PREFIX);
    let mut l = dev.launch(&kernel)?;
    l.arg(&*base)
        .arg(&n64)
        .arg(&plan.blocks)
        .arg(&shift)
        .arg(&mut out);
    // SAFETY: base holds n points of 2·LIMBS words (checked above); out n·blocks of them,
    // each thread writing its point's block entries.
    unsafe { l.launch(dev.launch_config(n)) }?;
    let out = std::sync::Arc::new(out);
    dev.cache_table(key, out.clone())?;
    Ok(out)
}

/// Device buffers for one chunk of points, reused across the batch's scalar vectors.
struct Launcher<'a, P: DeviceCurve> {
    dev: &'a DeviceLease<'a>,
    plan: MsmPlan,
    n: usize,
    /// The chunk's points (x then y, Montgomery words), maybe a resident array's cached
    /// upload shared with other jobs: only read.
    points: std::sync::Arc<DeviceBuffer<u32>>,
    digits: DeviceBuffer<u32>,
    counts: DeviceBuffer<u32>,
    offsets: DeviceBuffer<u32>,
    cursor: DeviceBuffer<u32>,
    entries: DeviceBuffer<u32>,
    buckets: DeviceBuffer<u32>,
    /// The two slot sequences (keys, XYZZ partial sums) the levels alternate between.
    slots: [(DeviceBuffer<u32>, DeviceBuffer<u32>); 2],
    /// The most additions one thread made, per level.
    most_adds: DeviceBuffer<u32>,
    partials: DeviceBuffer<u32>,
    _curve: std::marker::PhantomData<P>,
}

impl<'a, P: DeviceCurve> Launcher<'a, P> {
    fn new(
        dev: &'a DeviceLease<'a>,
        plan: MsmPlan,
        points: std::sync::Arc<DeviceBuffer<u32>>,
    ) -> Result<Self, DeviceError> {
        // The scalars' count: the points hold `blocks` multiples of each.
        let n = points.len() / (2 * P::LIMBS) / plan.blocks as usize;
        let terms = plan.terms(n);
        let (first, second) = plan.slot_buffers(terms);
        let point_words = 4 * P::LIMBS;
        let slots = |len: usize| -> Result<_, DeviceError> {
            Ok((dev.alloc_zeros(len)?, dev.alloc_zeros(len * point_words)?))
        };
        Ok(Self {
            dev,
            plan,
            n,
            points,
            digits: dev.alloc_zeros(terms)?,
            counts: dev.alloc_zeros(plan.buckets())?,
            offsets: dev.alloc_zeros(plan.buckets())?,
            cursor: dev.alloc_zeros(plan.buckets())?,
            entries: dev.alloc_zeros(terms)?,
            buckets: dev.alloc_zeros(plan.buckets() * point_words)?,
            slots: [slots(first)?, slots(second)?],
            most_adds: dev.alloc_zeros(1 + plan.levels(terms).len())?,
            partials: dev.alloc_zeros(plan.partials() * 3 * P::LIMBS)?,
            _curve: std::marker::PhantomData,
        })
    }

    /// Σ sᵢ·Pᵢ over this chunk for one scalar vector (u64 words, 4 per scalar).
    fn run(&mut self, scalars: &[u64]) -> Result<Projective<P>, DeviceError> {
        let Self {
            dev,
            plan,
            n,
            points,
            digits,
            counts,
            offsets,
            cursor,
            entries,
            buckets: bucket_sums,
            slots,
            most_adds,
            partials,
            ..
        } = self;
        let (dev, plan, n_points) = (*dev, *plan, *n);
        let (n, terms) = (n_points as u64, plan.terms(n_points) as u64);
        // Every bucket window's digits cover each point's every multiple.
        let all_points = n * u64::from(plan.blocks);
        let buckets = plan.buckets() as u64;
        let d_scalars = dev.upload(scalars)?;

        let mut l = dev.launch("msm_digits")?;
        l.arg(&d_scalars)
            .arg(&n)
            .arg(&plan.c)
            .arg(&plan.windows)
            .arg(&plan.block_windows)
            .arg(&mut *digits);
        // SAFETY: n scalars of 8 limbs in, n·blocks·block_windows digits out.
        unsafe { l.launch(dev.launch_config(n_points)) }?;

        dev.zero(counts)?;
        let mut l = dev.launch("msm_count")?;
        l.arg(&*digits)
            .arg(&terms)
            .arg(&all_points)
            .arg(&plan.nb)
            .arg(&mut *counts);
        // SAFETY: digits hold `terms` words; every bucket index is < block_windows·nb.
        unsafe { l.launch(dev.launch_config(terms as usize)) }?;

        let mut l = dev.launch("msm_scan")?;
        l.arg(&*counts).arg(&mut *offsets).arg(&buckets);
        // One block, as many threads as the kernel takes (its shared array's size: 1024
        // in msm.cu, a WGSL workgroup's 256).
        let threads = dev.max_threads("msm_scan").unwrap_or(1024).min(1024);
        let one_block = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: counts and offsets hold `buckets` words; the kernel's shared array
        // holds a word per thread of the block.
        unsafe { l.launch(one_block) }?;

        dev.copy(offsets, cursor)?;
        let mut l = dev.launch("msm_scatter")?;
        l.arg(&*digits)
            .arg(&terms)
            .arg(&all_points)
            .arg(&plan.nb)
            .arg(&mut *cursor)
            .arg(&mut *entries);
        // SAFETY: offsets are an exclusive scan of the counts, so every position is
        // below the number of nonzero digits ≤ terms.
        unsafe { l.launch(dev.launch_config(terms as usize)) }?;

        // Buckets no run finishes are empty: the identity is all zero words.
        dev.zero(bucket_sums)?;
        dev.zero(most_adds)?;
        let threads = terms.div_ceil(u64::from(plan.chunk));
        let [(first_keys, first_vals), (second_keys, second_vals)] = slots;
        let name = format!("{}_msm_buckets", P::PREFIX);
        let mut l = dev.launch(&name)?;
        l.arg(&**points)
            .arg(&*entries)
            .arg(&*offsets)
            .arg(&*counts)
            .arg(&buckets)
            .arg(&threads)
            .arg(&plan.chunk)
            .arg(&mut *bucket_sums)
            .arg(&mut *first_keys)
            .arg(&mut *first_vals)
            .arg(&mut *most_adds);
        // SAFETY: entries name points < n·blocks; one XYZZ point (4·LIMBS words) per bucket;
        // `threads` chunks leave two slots each, which the first slot buffers hold.
        unsafe { l.launch(dev.launch_config(threads as usize)) }?;

        let name = format!("{}_msm_partials", P::PREFIX);
        for (level, len) in plan.levels(terms as usize).into_iter().enumerate() {
            // Levels 1, 3, … read the first buffers and write the second; 2, 4, … the reverse.
            let (keys, vals, next_keys, next_vals) = if level % 2 == 0 {
                (
                    &*first_keys,
                    &*first_vals,
                    &mut *second_keys,
                    &mut *second_vals,
                )
            } else {
                (
                    &*second_keys,
                    &*second_vals,
                    &mut *first_keys,
                    &mut *first_vals,
                )
            };
            let (len, level) = (len as u64, level as u32 + 1);
            let mut l = dev.launch(&name)?;
            l.arg(keys)
                .arg(vals)
                .arg(&len)
                .arg(&plan.chunk)
                .arg(&mut *bucket_sums)
                .arg(next_keys)
                .arg(next_vals)
                .arg(&mut *most_adds)
                .arg(&level);
            // SAFETY: `len` slots in (what the previous level wrote); two slots per chunk
            // out, fewer than the other buffer holds (MsmPlan::slot_buffers).
            unsafe { l.launch(dev.launch_config(len.div_ceil(u64::from(plan.chunk)) as usize)) }?;
        }

        let name = format!("{}_msm_reduce", P::PREFIX);
        let mut l = dev.launch(&name)?;
        l.arg(&*bucket_sums)
            .arg(&plan.nb)
            .arg(&plan.block_windows)
            .arg(&plan.seg_len)
            .arg(&mut *partials);
        // SAFETY: block_windows·segments threads each write 3·LIMBS words of `partials`.
        unsafe { l.launch(dev.launch_config(plan.partials())) }?;

        let words = dev.download(partials)?;
        Ok(combine::<P>(&plan, &words))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn montgomery_words_round_trip() {
        let x = ark_bn254::Fq::from(123456789u64);
        let mut w = Vec::new();
        <ark_bn254::g1::Config as DeviceCurve>::push_words(&x, &mut w);
        assert_eq!(w.len(), 8);
        assert_eq!(<ark_bn254::g1::Config as DeviceCurve>::from_words(&w), x);
    }
}
