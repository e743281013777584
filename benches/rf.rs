//! `cargo bench --bench rf`: synthetic RF samples per second with features, the issue's
//! shape (7 receivers × 1 s × 200 kHz), on one core and on every core, split into
//! generation and feature extraction; and, when a CUDA device is usable, the recordings
//! of a batch by `rf_receive` beside the CPU loop it replaces, and the recordings reduced
//! to chunk sums on the device (`rf_chunk_reduce`) with the features derived on the CPU,
//! beside the CPU's receive and extract (plans drawn on the CPU either way); and the
//! dataset device path whole (`samples_on_device`: waveforms synthesised on the device too)
//! beside the CPU path. Without a device it still reports the host's share per sample:
//! the draws alone (`draft`) against the draws with the waveform (`plan`).
//! Env: BENCH_RF_SAMPLES (default 12), BENCH_RF_GPU_BATCH (default 64).

use gpu_ops::ops::rf::dataset::sample;
use gpu_ops::ops::rf::features;
use gpu_ops::ops::rf::rng::dataset_key;
use gpu_ops::ops::rf::scenario::Scenario;
use rayon::prelude::*;
use std::time::{Duration, Instant};

fn main() {
    let n: u64 = std::env::var("BENCH_RF_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let s = Scenario::default();
    let key = dataset_key(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("# gpu-ops RF dataset benchmark: default scenario (7 receivers, 1 s at 200 kHz, 5 chunks)\n");
    println!(
        "| threads | samples | generation / sample | extraction / sample | samples/s | per core |"
    );
    println!("|---|---|---|---|---|---|");
    for threads in [1, cores] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        // One warm-up sample (FFT plans, page faults).
        pool.install(|| sample(&s, key, 0, false));
        let started = Instant::now();
        let parts: Vec<(Duration, Duration)> = pool.install(|| {
            (1..=n)
                .into_par_iter()
                .map(|i| {
                    let (_, g, e) = sample(&s, key, i, false);
                    (g, e)
                })
                .collect()
        });
        let wall = started.elapsed().as_secs_f64();
        let gen: f64 = parts.iter().map(|p| p.0.as_secs_f64()).sum::<f64>() / n as f64;
        let ext: f64 = parts.iter().map(|p| p.1.as_secs_f64()).sum::<f64>() / n as f64;
        let rate = n as f64 / wall;
        println!(
            "| {threads} | {n} | {:.1} ms | {:.1} ms | {rate:.2} | {:.2} |",
            gen * 1e3,
            ext * 1e3,
            rate / threads as f64
        );
    }
    host_share(&s, key, n);
    gpu(&s, key);
}

/// What a GPU host's CPU does per sample around the device's work, on one thread: the
/// draws alone (`draft`, the dataset device path) against the draws with the waveform
/// synthesised and padded (`plan`, what the CPU path and `pack` need), and the features
/// derived from a sample's chunk sums.
fn host_share(s: &Scenario, key: u64, n: u64) {
    use gpu_ops::ops::rf::generate::{draft, plan};
    let time = |f: &dyn Fn(u64) -> usize| {
        let started = Instant::now();
        let work: usize = (1..=n).map(f).sum();
        assert!(work > 0);
        started.elapsed().as_secs_f64() / n as f64
    };
    let drafting = time(&|i| draft(s, key, i).plans.len());
    let planning = time(&|i| plan(s, key, i).wave.len());
    let (chunk, seg, sums) = cpu_chunk_sums(s, key);
    // As the dataset path derives: one `Derivation` for the whole batch.
    let derivation = features::Derivation::new(chunk, seg);
    let deriving = time(&|_| {
        sums.iter()
            .map(|receiver| {
                derivation
                    .extract(receiver, s.signal.sample_rate_hz)
                    .aggregate()
                    .len()
            })
            .sum()
    });
    println!("\n## Host work per sample around a device, 1 thread\n");
    println!("| step | time / sample | samples/s per core |\n|---|---|---|");
    for (step, t) in [
        (
            "draws only (`draft`; the waveform left to rf_waveform)",
            drafting,
        ),
        ("draws + waveform on the CPU (`plan`)", planning),
        ("features from the chunk sums, every receiver", deriving),
    ] {
        println!("| {step} | {:.3} ms | {:.0} |", t * 1e3, 1.0 / t);
    }
    println!(
        "\ndraft vs plan: {:.0}× less host work",
        planning / drafting
    );
    println!(
        "host share of the device path (draft + features from sums): {:.2} ms a sample, {:.0} samples/s per core",
        (drafting + deriving) * 1e3,
        1.0 / (drafting + deriving)
    );
}

/// Sample 0's recordings reduced to chunk sums on the CPU, per receiver; with the chunk
/// and segment lengths.
fn cpu_chunk_sums(s: &Scenario, key: u64) -> (usize, usize, Vec<Vec<features::ChunkSums>>) {
    use gpu_ops::ops::rf::generate::{plan, receive};
    let p = plan(s, key, 0);
    let cfg = gpu_ops::ops::rf::dataset::extract_config(s);
    let (chunk, seg) = features::plan(&cfg, p.wave.len()).expect("a chunk fits");
    let window = features::hann(seg);
    let fft = fft_plans::F32Planner::default().forward(seg);
    let sums = p
        .plans
        .iter()
        .map(|r| {
            receive(r, &p.wave)
                .chunks_exact(chunk)
                .map(|c| features::chunk_sums(c, &window, fft.as_ref()))
                .collect()
        })
        .collect();
    (chunk, seg, sums)
}

fn gpu(s: &Scenario, key: u64) {
    use gpu_ops::backend::cuda::{discover, DeviceSelection};
    use gpu_ops::ops::rf::generate::{plan, receive};
    use gpu_ops::ops::rf::gpu::{launch_receive, launch_receive_and_reduce, pack};
    let batch: u64 = std::env::var("BENCH_RF_GPU_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let cache = std::env::temp_dir().join("gpu-ops-bench-kernels");
    let (devices, reason) = discover(
        &DeviceSelection::All,
        &cache,
        &gpu_ops::ops::kernel_library(),
    );
    let Some(dev) = devices.first() else {
        println!("\nGPU: skipped ({reason})");
        return;
    };
    let started = Instant::now();
    let plans: Vec<_> = (0..batch)
        .into_par_iter()
        .map(|n| plan(s, key, n))
        .collect();
    let plan_s = started.elapsed().as_secs_f64();
    let packed = pack(&plans.iter().collect::<Vec<_>>());
    let lease = dev.lease().expect("device lease");
    launch_receive(&packed, &lease).expect("warm-up");
    let started = Instant::now();
    let out = launch_receive(&packed, &lease).expect("rf_receive");
    let gpu_s = started.elapsed().as_secs_f64();
    assert_eq!(out.len() as u64, 2 * packed.out_len);
    let started = Instant::now();
    let cpu: usize = plans
        .par_iter()
        .map(|p| {
            p.plans
                .iter()
                .map(|r| receive(r, &p.wave).len())
                .sum::<usize>()
        })
        .sum();
    let cpu_s = started.elapsed().as_secs_f64();
    assert_eq!(cpu as u64, packed.out_len);
    // Recordings and their chunk sums on the device, only the sums copied back; then the
    // features derived on the CPU. Against the CPU's whole sample (receive and extract).
    let cfg = gpu_ops::ops::rf::dataset::extract_config(s);
    let (chunk, seg) = features::plan(&cfg, packed.receivers[0].len as usize).expect("plan");
    launch_receive_and_reduce(&packed, chunk, seg, false, &lease).expect("warm-up");
    let started = Instant::now();
    let (_, sums) = launch_receive_and_reduce(&packed, chunk, seg, false, &lease)
        .expect("rf_receive + rf_chunk_reduce");
    let reduce_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let per_rx = sums.len() / packed.receivers.len();
    // As the dataset path derives: one `Derivation` for the whole batch.
    let derivation = features::Derivation::new(chunk, seg);
    let derived: usize = sums
        .par_chunks(per_rx)
        .map(|c| derivation.extract(c, cfg.sample_rate_hz).chunks.len())
        .sum();
    let derive_s = started.elapsed().as_secs_f64();
    assert_eq!(derived, sums.len());
    let started = Instant::now();
    let cpu_full: usize = plans
        .par_iter()
        .map(|p| {
            p.plans
                .iter()
                .map(|r| {
                    features::extract(&receive(r, &p.wave), &cfg)
                        .expect("chunks")
                        .chunks
                        .len()
                })
                .sum::<usize>()
        })
        .sum();
    let cpu_full_s = started.elapsed().as_secs_f64();
    assert_eq!(cpu_full, sums.len());
    // The dataset device path whole: draws on the CPU, waveforms, recordings and sums on
    // the device, features and decisions on the CPU; against the CPU path's `sample`.
    use gpu_ops::ops::rf::dataset::samples_on_device;
    samples_on_device(s, key, 0..batch, false, &lease).expect("warm-up");
    let started = Instant::now();
    let records = samples_on_device(s, key, batch..2 * batch, false, &lease).expect("device path");
    let dataset_s = started.elapsed().as_secs_f64();
    assert_eq!(records.len() as u64, batch);
    let started = Instant::now();
    let cpu_records = (batch..2 * batch)
        .into_par_iter()
        .map(|i| sample(s, key, i, false).0.features.len())
        .sum::<usize>();
    let cpu_dataset_s = started.elapsed().as_secs_f64();
    assert!(cpu_records > 0);
    let cores = rayon::current_num_threads();
    println!(
        "\n## Dataset samples, {batch} per device batch, on {}\n",
        dev.info.name
    );
    println!("| path | time | samples/s |\n|---|---|---|");
    println!(
        "| device (samples_on_device: draws and features on {cores} CPU threads) | {:.1} ms | {:.0} |",
        dataset_s * 1e3,
        batch as f64 / dataset_s
    );
    println!(
        "| CPU (sample, {cores} threads) | {:.1} ms | {:.0} |",
        cpu_dataset_s * 1e3,
        batch as f64 / cpu_dataset_s
    );
    println!(
        "\nDevice path vs CPU path: {:.1}×",
        cpu_dataset_s / dataset_s
    );
    println!(
        "\n## Recordings of {batch} samples on {} (plans on the CPU)\n",
        dev.info.name
    );
    println!("| step | time | samples/s |\n|---|---|---|");
    println!(
        "| plans, {cores} CPU threads | {:.1} ms | {:.0} |",
        plan_s * 1e3,
        batch as f64 / plan_s
    );
    println!(
        "| rf_receive, with upload and download | {:.1} ms | {:.0} |",
        gpu_s * 1e3,
        batch as f64 / gpu_s
    );
    println!(
        "| CPU receive, {cores} threads | {:.1} ms | {:.0} |",
        cpu_s * 1e3,
        batch as f64 / cpu_s
    );
    println!(
        "| rf_receive + rf_chunk_reduce, sums copied back | {:.1} ms | {:.0} |",
        reduce_s * 1e3,
        batch as f64 / reduce_s
    );
    println!(
        "| features from the sums, {cores} CPU threads | {:.1} ms | {:.0} |",
        derive_s * 1e3,
        batch as f64 / derive_s
    );
    println!(
        "| CPU receive + extract, {cores} threads | {:.1} ms | {:.0} |",
        cpu_full_s * 1e3,
        batch as f64 / cpu_full_s
    );
    println!("\nGPU vs CPU receive: {:.1}×", cpu_s / gpu_s);
    println!(
        "GPU (receive, reduce, derive) vs CPU (receive, extract), plans excluded: {:.1}×",
        cpu_full_s / (reduce_s + derive_s)
    );
}
