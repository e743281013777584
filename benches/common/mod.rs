//! Helpers every benchmark shares: env knobs, median timing, and a real server on a
//! loopback port.
#![allow(dead_code)]

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
