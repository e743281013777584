//! `cargo bench --bench device_path`: where a device job's round trip goes on the
//! emulated device, and whether jobs share a device.
//!
//! 1. The host side of a round trip: a job's time on its lease less the emulated
//!    engine's own time in copies, memsets and launches (what a GPU's copy engines and
//!    SMs would do). Each case runs with page-locked staging in chunks on two lanes, and
//!    with staging off (`StagingBudget` 0: single-lane passes on pageable copies), in the
//!    same process, with the host bytes each moved. On the emulated device a staged copy
//!    is two memcpys (host → staging by the job, staging → device by the engine) where a
//!    pageable one is one, so the staged host side includes a copy a GPU's driver would
//!    otherwise make itself, slower, from pageable memory.
//! 2. Several jobs at once: the same field additions from 8 threads on one emulated
//!    device, `--gpu-jobs-per-device` 1 against 4.
//!
//! Env: BENCH_FIELD_LOG2 (default 22), BENCH_LOOKUP_ROWS (65536), BENCH_LOOKUP_DIM (512),
//! BENCH_REPEATS (3).

mod common;

use common::{env, median};
use gpu_ops::backend::device::{CopyCounts, DeviceLease, StagingBudget, DEFAULT_STAGING_MIB};
use gpu_ops::backend::GpuDevice;
use gpu_ops::ops::linalg::{launch_lookup, Dtype, LookupJob};
use gpu_ops::ops::zk::samples::random_elements;
use gpu_ops::ops::zk::{launch_field_binary, Field, FieldBinaryJob, FieldOp, FieldVec};
use std::sync::Arc;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

/// A device job run on a lease.
type Job<'j> = Box<dyn Fn(&DeviceLease<'_>) + 'j>;

/// One run of a job on a fresh lease: wall time, the engine's part, the host bytes.
struct Run {
    wall: Duration,
    engine: Duration,
    staged: u64,
    pageable: u64,
}

fn run_once(dev: &GpuDevice, job: &dyn Fn(&DeviceLease<'_>)) -> Run {
    let lease = dev.lease().unwrap();
    let engine_before = dev.emulated_engine_seconds().unwrap();
    let started = Instant::now();
    job(&lease);
    let wall = started.elapsed();
    let engine = dev.emulated_engine_seconds().unwrap() - engine_before;
    let c = lease.copies();
    Run {
        wall,
        engine: Duration::from_secs_f64(engine),
        staged: CopyCounts::get(&c.staged_to_device) + CopyCounts::get(&c.staged_from_device),
        pageable: CopyCounts::get(&c.pageable_to_device) + CopyCounts::get(&c.pageable_from_device),
    }
}

/// Median wall, engine and host-side times over `repeats` runs after a warm-up.
fn measure(dev: &GpuDevice, repeats: usize, job: &dyn Fn(&DeviceLease<'_>)) -> (Run, Duration) {
    run_once(dev, job);
    let runs: Vec<Run> = (0..repeats).map(|_| run_once(dev, job)).collect();
    let host = median(
        runs.iter()
            .map(|r| r.wall.saturating_sub(r.engine))
            .collect(),
    );
    let wall = median(runs.iter().map(|r| r.wall).collect());
    let engine = median(runs.iter().map(|r| r.engine).collect());
    let last = runs.last().unwrap();
    (
        Run {
            wall,
            engine,
            staged: last.staged,
            pageable: last.pageable,
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

fn main() {
    let repeats = env("BENCH_REPEATS", 3);
    let log_n = env("BENCH_FIELD_LOG2", 22);
    let (rows, dim) = (
        env("BENCH_LOOKUP_ROWS", 65536),
        env("BENCH_LOOKUP_DIM", 512),
    );
    println!("# Device round trips on the emulated device (host side = time on the lease less the engine's copies and kernels)\n");
    println!("| case | copies | round trip ms | engine ms | host side ms | host MB staged | host MB pageable |");
    println!("|---|---|---|---|---|---|---|");

    let add = field_add(Field::Bn254Fr, 1 << log_n, 7);
    let vocab = 4096;
    let table: Arc<Vec<f32>> = Arc::new((0..vocab * dim).map(|i| i as f32 * 0.5).collect());
    let ids: Vec<u32> = (0..rows as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % vocab as u32)
        .collect();
    let lookup = LookupJob::new("bench".into(), table, dim, ids, Dtype::F32).unwrap();
    let cases: [(String, Job<'_>); 2] = [
        (
            format!("field_add bn254_fr 2^{log_n}"),
            Box::new(|lease: &DeviceLease<'_>| {
                std::hint::black_box(launch_field_binary(&add, lease).unwrap());
            }),
        ),
        (
            format!("embeddings lookup {rows} × {dim} f32 (table cached)"),
            Box::new(|lease: &DeviceLease<'_>| {
                std::hint::black_box(launch_lookup(&lookup, lease).unwrap());
            }),
        ),
    ];
    for (label, job) in &cases {
        for staging in [true, false] {
            let dev = GpuDevice::emulated(0, 8 * GIB);
            if !staging {
                dev.share_staging(StagingBudget::new(0));
            }
            let (run, host) = measure(&dev, repeats, job.as_ref());
            println!(
                "| {label} | {} | {} | {} | {} | {} | {} |",
                if staging {
                    "page-locked, 2 lanes"
                } else {
                    "pageable, 1 lane"
                },
                ms(run.wall),
                ms(run.engine),
                ms(host),
                mb(run.staged),
                mb(run.pageable),
            );
        }
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
