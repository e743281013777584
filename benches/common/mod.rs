//! Helpers every benchmark shares: env knobs, median timing, and a real server on a
//! loopback port.
#![allow(dead_code)]

use gpu_ops::ops::dp::{GaussianPlan, Gradients, NoiseKey, PrivatizeJob};
use gpu_ops::wire::Array;
use std::time::{Duration, Instant};

pub fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// Median of `runs` calls after one warm-up call.
pub fn time<R>(runs: usize, mut f: impl FnMut() -> R) -> Duration {
    std::hint::black_box(f());
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed()
            })
            .collect(),
    )
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Starts the service with `args` (after the program name) on 127.0.0.1 and returns its
/// base URL once device discovery has finished.
pub async fn serve(args: &[&str]) -> String {
    use clap::Parser;
    let settings =
        gpu_ops::config::Cli::parse_from(std::iter::once("gpu-ops").chain(args.iter().copied()))
            .config
            .validate()
            .unwrap();
    let app = gpu_ops::App::start(settings).unwrap();
    app.discovery_finished().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(app.serve(listener, std::future::pending()));
    url
}

/// `n` gradient values in ±1e-3 from a fixed xorshift stream: DP's benchmark inputs.
pub fn dp_gradients(n: usize) -> Vec<f32> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u32 << 24) as f32 - 0.5) * 2e-3
        })
        .collect()
}

/// A privatize job over `rows` × `cols` f32 gradients: one clipping group, σ = 1.1.
pub fn privatize_job(g: impl Into<Array<f32>>, rows: usize, cols: usize) -> PrivatizeJob {
    PrivatizeJob {
        gradients: Gradients::F32(g.into()),
        rows,
        cols,
        bounds: vec![0, cols as u64],
        clip_norms: vec![1.0],
        plan: GaussianPlan::new(1.1, 1.0 / 1024.0 / (cols as f64).sqrt()).unwrap(),
        divisor: rows as f64,
        key: NoiseKey::from_seed(1),
    }
}
