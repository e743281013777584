//! `cargo bench --bench rf`: synthetic RF samples per second with features, the issue's
//! shape (7 receivers × 1 s × 200 kHz), on one core and on every core, split into
//! generation and feature extraction. Env: BENCH_RF_SAMPLES (default 12).

use gpu_ops::ops::rf::dataset::sample;
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
}
