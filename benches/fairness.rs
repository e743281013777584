//! `cargo bench --bench fairness`: a well-behaved tenant's latency alone and while another
//! tenant floods the server with requests and dataset jobs, under the per-tenant limits
//! the deployment files set (50 requests/s, bursts of 100, 32 in flight). Reports the
//! quiet tenant's p50 and p99 both ways and their ratio, and what the flood got through;
//! nothing is asserted (timings vary with the machine). The flooding clients run in this
//! process on a runtime of one thread and share the machine's cores with the server, so
//! on a small machine the ratio includes their own load.
//! Env: BENCH_FAIR_REQUESTS (300 quiet requests per phase), BENCH_FAIR_FLOODERS (64).

mod common;

use common::{env, ms};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUIET: &str = "quiet-tenant-key-0123456789";
const FLOOD: &str = "flood-tenant-key-0123456789";

fn main() {
    // The server, the quiet client and the flood each on their own runtime, so their
    // tasks never wait in one another's queues; the flood's is one thread, so at most one
    // core of its own goes to making requests.
    let server = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let keys = std::env::temp_dir().join(format!("gpu-ops-fairness-{}", std::process::id()));
    std::fs::write(&keys, format!("{QUIET} quiet\n{FLOOD} flood\n")).unwrap();
    let data = std::env::temp_dir().join(format!("gpu-ops-fairness-data-{}", std::process::id()));
    let url = server.block_on(common::serve(&[
        "--backend",
        "cpu",
        "--data-dir",
        data.to_str().unwrap(),
        "--api-keys-file",
        keys.to_str().unwrap(),
        "--tenant-requests-per-second",
        "50",
        "--tenant-burst",
        "100",
        "--tenant-max-concurrent-requests",
        "32",
    ]));
    let flood = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let quiet = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    quiet.block_on(run(&url, flood.handle()));
}

/// A field multiplication of `n` Goldilocks elements.
fn field_mul(n: u64) -> bytes::Bytes {
    let a: Vec<String> = (0..n).map(|i| (i * 7919 + 1).to_string()).collect();
    serde_json::to_vec(&serde_json::json!({"field": "goldilocks", "a": a, "b": a}))
        .unwrap()
        .into()
}

/// The quiet tenant's round trips: `count` requests, one every 50 ms.
async fn quiet_latencies(client: &reqwest::Client, url: &str, count: usize) -> Vec<Duration> {
    let body = field_mul(1024);
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        let res = client
            .post(format!("{url}/zk/field_mul"))
            .bearer_auth(QUIET)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "the quiet tenant was refused");
        res.bytes().await.unwrap();
        times.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    times.sort();
    times
}

fn p(times: &[Duration], q: usize) -> Duration {
    times[(times.len() * q / 100).min(times.len() - 1)]
}

async fn run(url: &str, flood: &tokio::runtime::Handle) {
    let url = url.to_string();
    let client = reqwest::Client::new();
    let count = env("BENCH_FAIR_REQUESTS", 300);
    let alone = quiet_latencies(&client, &url, count).await;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (served, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let heavy = field_mul(65_536);
    let mut flooders = Vec::new();
    // Its own connections: the server closes one whose body it refused unread, and the
    // quiet tenant's requests must not ride on those.
    let flood_client = reqwest::Client::new();
    for i in 0..env("BENCH_FAIR_FLOODERS", 64) {
        let (client, url, stop, served, refused, heavy) = (
            flood_client.clone(),
            url.clone(),
            stop.clone(),
            served.clone(),
            refused.clone(),
            heavy.clone(),
        );
        flooders.push(flood.spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // One in eight asks for a dataset job; the rest are large products.
                let req = if i % 8 == 0 {
                    n += 1;
                    client
                        .post(format!("{url}/datasets/synthetic"))
                        .json(&serde_json::json!({
                            "name": "flood", "num_samples": 200, "dataset_type": "feature_based",
                            "seed": n, "config": {"signal": {"duration_ms": 100}, "chunk_ms": 50}
                        }))
                } else {
                    client
                        .post(format!("{url}/zk/field_mul"))
                        .header("content-type", "application/json")
                        .body(heavy.clone())
                };
                match req.bearer_auth(FLOOD).send().await {
                    Ok(res) if res.status().is_success() => {
                        served.fetch_add(1, Ordering::Relaxed);
                        let _ = res.bytes().await;
                    }
                    _ => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    // Let the flood reach its steady state first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let flood_started = Instant::now();
    let (served_before, refused_before) = (
        served.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    let flooded = quiet_latencies(&client, &url, count).await;
    let flood_secs = flood_started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        let _ = f.await;
    }
    let served = served.load(Ordering::Relaxed) - served_before;
    let refused = refused.load(Ordering::Relaxed) - refused_before;

    println!("## A quiet tenant beside a flooding one (field_mul of 1024 Goldilocks elements every 50 ms)\n");
    println!("| quiet tenant | requests | p50 | p99 |");
    println!("|---|---|---|---|");
    println!(
        "| alone | {} | {} | {} |",
        alone.len(),
        ms(p(&alone, 50)),
        ms(p(&alone, 99))
    );
    println!(
        "| during the flood | {} | {} | {} |",
        flooded.len(),
        ms(p(&flooded, 50)),
        ms(p(&flooded, 99))
    );
    println!(
        "\np99 during the flood / p99 alone: {:.2}×; the flooding tenant got {:.0} answers/s \
         through and {:.0} refusals/s (429 past its limits, dataset jobs past its queue share)",
        p(&flooded, 99).as_secs_f64() / p(&alone, 99).as_secs_f64(),
        served as f64 / flood_secs,
        refused as f64 / flood_secs
    );
}
