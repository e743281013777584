//! `cargo bench --bench device_path`: where a device job's round trip goes on the
//! emulated device, and whether jobs share a device.
//!
//! 1. The host side of a round trip: a job's time on its lease less the time it spent
//!    waiting for the emulated engine (in allocations and host waits), whose streams run
//!    the copies, memsets and launches on threads of their own (what a GPU's allocator,
//!    copy engines and SMs would do); the engine's own time, summed over its streams, is
//!    shown beside it. Each case runs with page-locked staging (field ops, DP privatize,
//!    Shamir and lookups in chunks on two lanes, the others' large copies in staged
//!    pieces), and with staging off (`StagingBudget` 0: pageable copies, the chunked ones
//!    in single-lane passes), in the same process, with the host bytes each moved. On the
//!    emulated device a staged copy is two memcpys (host → staging by the job, staging → device by
//!    the engine) where a pageable one is one, so the staged host side includes a copy a
//!    GPU's driver would otherwise make itself, slower, from pageable memory.
//!    DP privatize runs a third time with its gradients read in place from a request
//!    body in page-locked memory (`backend::device::PinnedBlock`, as a bulk body is read
//!    on a GPU host): each chunk's upload is one copy straight from it, no staging.
//! 2. Several jobs at once: the same field additions from 8 threads on one emulated
//!    device, `--gpu-jobs-per-device` 1 against 4.
//!
//! The cases are issue 57's six, at its sizes by default: field_add and NTT (forward, on
//! a coset) over bn254_fr at 2^22, DP privatize of 256 × 2^20 f32, MSM of 2^20 BN254
//! points, Shamir split of 2^20 bn254_fr secrets 3 of 5, an embeddings lookup of 65 536
//! ids × 512 f32. Env: BENCH_FIELD_LOG2 (22), BENCH_NTT_LOG2 (22), BENCH_DP_ROWS (256),
//! BENCH_DP_LOG2 (20), BENCH_MSM_LOG2 (20), BENCH_SHAMIR_LOG2 (20), BENCH_LOOKUP_ROWS
//! (65536), BENCH_LOOKUP_DIM (512), BENCH_REPEATS (3), BENCH_CASES (all: a comma list of
//! field_add, ntt, privatize, msm, shamir, lookup).

mod common;

use common::{dp_gradients, env, median, privatize_job};
use gpu_ops::backend::device::{
    CopyCounts, DeviceLease, PinnedBlock, StagingBudget, DEFAULT_STAGING_MIB,
};
use gpu_ops::backend::GpuDevice;
use gpu_ops::ops::dp::{launch_privatize, NoiseKey, PrivatizeJob};
use gpu_ops::ops::linalg::{launch_lookup, Dtype, LookupJob};
use gpu_ops::ops::mpc::launch_share;
use gpu_ops::ops::mpc::shamir::{dealer_coefficients, ShareJob};
use gpu_ops::ops::zk::msm::{Curve, MsmJob};
use gpu_ops::ops::zk::ntt::{Direction, NttJob, Order};
use gpu_ops::ops::zk::samples::{random_elements, random_points};
use gpu_ops::ops::zk::{
    launch_field_binary, launch_msm, launch_ntt, Field, FieldBinaryJob, FieldOp, FieldVec, U256,
};
use gpu_ops::wire::Array;
use std::sync::Arc;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

/// A device job run on a lease.
type Job<'j> = Box<dyn Fn(&DeviceLease<'_>) + 'j>;

/// One run of a job on a fresh lease: wall time, the engine's work (summed over its
/// streams), the time the job waited for the engine, the host bytes.
struct Run {
    wall: Duration,
    engine: Duration,
    waited: Duration,
    staged: u64,
    pageable: u64,
    from_body: u64,
}

fn run_once(dev: &GpuDevice, job: &dyn Fn(&DeviceLease<'_>)) -> Run {
    let lease = dev.lease().unwrap();
    let engine_before = dev.emulated_engine_seconds().unwrap();
    let waited_before = dev.emulated_waiting_seconds().unwrap();
    let started = Instant::now();
    job(&lease);
    let wall = started.elapsed();
    let engine = dev.emulated_engine_seconds().unwrap() - engine_before;
    let waited = dev.emulated_waiting_seconds().unwrap() - waited_before;
    let c = lease.copies();
    Run {
        wall,
        engine: Duration::from_secs_f64(engine),
        waited: Duration::from_secs_f64(waited),
        staged: CopyCounts::get(&c.staged_to_device) + CopyCounts::get(&c.staged_from_device),
        pageable: CopyCounts::get(&c.pageable_to_device) + CopyCounts::get(&c.pageable_from_device),
        from_body: CopyCounts::get(&c.body_to_device),
    }
}

/// Median wall, engine and host-side times over `repeats` runs after a warm-up.
fn measure(dev: &GpuDevice, repeats: usize, job: &dyn Fn(&DeviceLease<'_>)) -> (Run, Duration) {
    run_once(dev, job);
    let runs: Vec<Run> = (0..repeats).map(|_| run_once(dev, job)).collect();
    let host = median(
        runs.iter()
            .map(|r| r.wall.saturating_sub(r.waited))
            .collect(),
    );
    let wall = median(runs.iter().map(|r| r.wall).collect());
    let engine = median(runs.iter().map(|r| r.engine).collect());
    let waited = median(runs.iter().map(|r| r.waited).collect());
    let last = runs.last().unwrap();
    (
        Run {
            wall,
            engine,
            waited,
            staged: last.staged,
            pageable: last.pageable,
            from_body: last.from_body,
        },
        host,
    )
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn mb(bytes: u64) -> String {
    format!("{:.0}", bytes as f64 / 1e6)
}

fn field_add(field: Field, n: usize, seed: u64) -> FieldBinaryJob {
    let vec = |s| FieldVec::from_integers(field, &random_elements(field, n, s)).unwrap();
    FieldBinaryJob::new(FieldOp::Add, vec(seed), vec(seed + 1)).unwrap()
}

/// Whether the run asks for case `name` (`BENCH_CASES`; empty: all).
fn wanted(name: &str) -> bool {
    let wanted = std::env::var("BENCH_CASES").unwrap_or_default();
    wanted.is_empty() || wanted.split(',').any(|w| w.trim() == name)
}

/// A request body's bytes in a block registered with a device, as a bulk body is read.
struct PageLockedBody(PinnedBlock, usize);

impl AsRef<[u8]> for PageLockedBody {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the block, written when it was made.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), self.1) }
    }
}

/// The privatize case on a fresh device, its gradients in a page-locked body of that
/// device's.
fn privatize_from_a_page_locked_body() -> (String, GpuDevice, PrivatizeJob) {
    let (rows, log_cols) = (env("BENCH_DP_ROWS", 256), env("BENCH_DP_LOG2", 20));
    let cols = 1usize << log_cols;
    let dev = GpuDevice::emulated(0, 16 * GIB);
    let bytes: Vec<u8> = dp_gradients(rows * cols)
        .iter()
        .flat_map(|g| g.to_le_bytes())
        .collect();
    let mut block = PinnedBlock::new(&dev, bytes.len()).unwrap().unwrap();
    // SAFETY: the block holds at least `bytes.len()` bytes, and no copy reads it yet.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), block.as_mut_ptr(), bytes.len()) };
    let body = bytes::Bytes::from_owner(PageLockedBody(block, bytes.len()));
    let gradients = Array::<f32>::from_le_bytes(body).unwrap();
    assert!(gradients.is_lent(), "read in place");
    let label = format!("DP privatize {rows} × 2^{log_cols} f32");
    (label, dev, privatize_job(gradients, rows, cols))
}

/// Issue 57's cases the run asks for (`BENCH_CASES`), each built once.
fn cases() -> Vec<(String, Job<'static>)> {
    let wants = wanted;
    let mut cases: Vec<(String, Job<'static>)> = Vec::new();
    if wants("field_add") {
        let log_n = env("BENCH_FIELD_LOG2", 22);
        let add = field_add(Field::Bn254Fr, 1 << log_n, 7);
        cases.push((
            format!("field_add bn254_fr 2^{log_n}"),
            Box::new(move |lease| {
                std::hint::black_box(launch_field_binary(&add, lease).unwrap());
            }),
        ));
    }
    if wants("ntt") {
        let log_n = env("BENCH_NTT_LOG2", 22);
        let field = Field::Bn254Fr;
        let values =
            FieldVec::from_integers(field, &random_elements(field, 1 << log_n, 3)).unwrap();
        let ntt = NttJob::new(
            Direction::Forward,
            values,
            1,
            Order::Natural,
            Order::Natural,
            Some(U256::from_u64(5)),
            32,
        )
        .unwrap();
        cases.push((
            format!("NTT bn254_fr 2^{log_n}, coset"),
            Box::new(move |lease| {
                std::hint::black_box(launch_ntt(&ntt, lease).unwrap());
            }),
        ));
    }
    if wants("privatize") {
        let (rows, log_cols) = (env("BENCH_DP_ROWS", 256), env("BENCH_DP_LOG2", 20));
        let cols = 1usize << log_cols;
        let job = privatize_job(dp_gradients(rows * cols), rows, cols);
        cases.push((
            format!("DP privatize {rows} × 2^{log_cols} f32"),
            Box::new(move |lease| {
                std::hint::black_box(launch_privatize(&job, lease).unwrap());
            }),
        ));
    }
    if wants("msm") {
        let log_n = env("BENCH_MSM_LOG2", 20);
        let n = 1usize << log_n;
        let curve = Curve::Bn254G1;
        let scalars = random_elements(curve.scalar_field(), n, 77);
        let job = MsmJob::new(
            random_points(curve, n, 5),
            vec![FieldVec::from_integers(curve.scalar_field(), &scalars).unwrap()],
        )
        .unwrap();
        cases.push((
            format!("MSM bn254_g1 2^{log_n}"),
            Box::new(move |lease| {
                std::hint::black_box(launch_msm(&job, lease).unwrap());
            }),
        ));
    }
    if wants("shamir") {
        let log_m = env("BENCH_SHAMIR_LOG2", 20);
        let (field, m) = (Field::Bn254Fr, 1usize << log_m);
        let secrets = FieldVec::from_integers(field, &random_elements(field, m, 1)).unwrap();
        let xs: Vec<U256> = (1..=5).map(U256::from_u64).collect();
        let coeffs = dealer_coefficients(&secrets, 3, &NoiseKey::derive(b"bench", 1));
        let job = ShareJob::new(
            Arc::new(coeffs),
            m,
            FieldVec::from_integers(field, &xs).unwrap(),
        );
        cases.push((
            format!("Shamir split bn254_fr 2^{log_m}, 3 of 5"),
            Box::new(move |lease| {
                std::hint::black_box(launch_share(&job, lease).unwrap());
            }),
        ));
    }
    if wants("lookup") {
        let (rows, dim) = (
            env("BENCH_LOOKUP_ROWS", 65536),
            env("BENCH_LOOKUP_DIM", 512),
        );
        let vocab = 4096;
        let table = gpu_ops::wire::Array::from(
            (0..vocab * dim)
                .map(|i| i as f32 * 0.5)
                .collect::<Vec<f32>>(),
        )
        .shared();
        let ids: Vec<u32> = (0..rows as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % vocab as u32)
            .collect();
        let lookup = LookupJob::new("bench".into(), table, dim, ids, Dtype::F32).unwrap();
        cases.push((
            format!("embeddings lookup {rows} × {dim} f32 (table cached)"),
            Box::new(move |lease| {
                std::hint::black_box(launch_lookup(&lookup, lease).unwrap());
            }),
        ));
    }
    cases
}

fn main() {
    let repeats = env("BENCH_REPEATS", 3);
    println!("# Device round trips on the emulated device (host side = time on the lease less its waits for the engine)\n");
    println!("| case | copies | round trip ms | engine work ms (all streams) | waiting for the engine ms | host side ms | host MB staged | host MB pageable | host MB from the body |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let row = |label: &str, copies: &str, (run, host): (Run, Duration)| {
        println!(
            "| {label} | {copies} | {} | {} | {} | {} | {} | {} | {} |",
            ms(run.wall),
            ms(run.engine),
            ms(run.waited),
            ms(host),
            mb(run.staged),
            mb(run.pageable),
            mb(run.from_body),
        );
    };
    for (label, job) in &cases() {
        for staging in [true, false] {
            let dev = GpuDevice::emulated(0, 16 * GIB);
            if !staging {
                dev.share_staging(StagingBudget::new(0));
            }
            let copies = if staging { "page-locked" } else { "pageable" };
            row(label, copies, measure(&dev, repeats, job.as_ref()));
        }
    }
    if wanted("privatize") {
        let (label, dev, job) = privatize_from_a_page_locked_body();
        let run = measure(&dev, repeats, &|lease: &DeviceLease<'_>| {
            std::hint::black_box(launch_privatize(&job, lease).unwrap());
        });
        row(&label, "page-locked body", run);
    }
    println!("\n# 8 field_add goldilocks 2^20 jobs from 8 threads on one emulated device\n");
    println!("| --gpu-jobs-per-device | wall ms (median of {repeats}) | ratio to 1 |");
    println!("|---|---|---|");
    let jobs: Vec<FieldBinaryJob> = (0..8)
        .map(|i| field_add(Field::Goldilocks, 1 << 20, 100 + i))
        .collect();
    let mut first = None;
    for per_device in [1, 4] {
        let dev = GpuDevice::emulated(0, 8 * GIB);
        dev.set_jobs_per_device(per_device);
        dev.share_staging(StagingBudget::new(DEFAULT_STAGING_MIB as usize * (1 << 20)));
        let batch = || {
            let started = Instant::now();
            std::thread::scope(|s| {
                for job in &jobs {
                    let dev = &dev;
                    s.spawn(move || {
                        // What the pool asks for such a job: 4× its 16 MiB of input.
                        let lease = dev.lease_for(None, 64 << 20).unwrap();
                        std::hint::black_box(launch_field_binary(job, &lease).unwrap());
                    });
                }
            });
            started.elapsed()
        };
        batch();
        let wall = median((0..repeats).map(|_| batch()).collect());
        let base = *first.get_or_insert(wall);
        println!(
            "| {per_device} | {} | {:.2} |",
            ms(wall),
            wall.as_secs_f64() / base.as_secs_f64()
        );
    }
}
