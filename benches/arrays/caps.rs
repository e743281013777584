//! The resident arrays' caps, filled over HTTP: how fast arrays go in, what they cost the
//! process's memory and the disk, that the one past each cap is refused, and how long a
//! restart takes to load them all (checked again, as `Arrays::open` does at start).

use super::common::ms;
use gpu_ops::arrays::{ArrayLimits, ArrayMetrics, Arrays, TableLimits};
use gpu_ops::wire::{Dtype, EnvelopeWriter, MEDIA_TYPE};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

/// The process's resident and peak resident memory, in MiB (`/proc/self/status`).
fn memory_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Files under `dir` and their bytes.
fn files(dir: &Path) -> (usize, u64) {
    std::fs::read_dir(dir).map_or((0, 0), |d| {
        d.filter_map(Result::ok)
            .filter_map(|e| e.metadata().ok())
            .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
    })
}

async fn create(client: &reqwest::Client, url: &str, media: &str, body: Vec<u8>) -> (u16, Value) {
    let res = client
        .post(format!("{url}/arrays"))
        .header("content-type", media)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// Fills a server's count cap with `count` small arrays (16 Goldilocks elements each),
/// then its byte cap of `mib` MiB with 16 MiB f32 tensors, and reports each.
pub async fn run(count: usize, mib: u64) {
    let client = reqwest::Client::new();
    println!("\n## Resident arrays at the caps: {count} small arrays, then {mib} MiB of tensors\n");
    println!("| phase | arrays | time | per array | RSS (peak) after | files under arrays/ |");
    println!("|---|---|---|---|---|---|");
    let (rss0, _) = memory_mib();
    let root = std::env::temp_dir().join(format!("gpu-ops-bench-caps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (small_dir, large_dir) = (root.join("small"), root.join("large"));
    // The tenant's caps one above the server's, so the server's refuses first.
    let (cap, tenant_cap) = (count.to_string(), (count + 1).to_string());
    let url = super::common::serve(&[
        "--backend",
        "cpu",
        "--data-dir",
        small_dir.to_str().unwrap(),
        "--max-arrays",
        &cap,
        "--max-tenant-arrays",
        &tenant_cap,
    ])
    .await;
    let small = |i: usize| {
        let values: Vec<String> = (0..16).map(|k| (i * 16 + k).to_string()).collect();
        serde_json::to_vec(
            &json!({"kind": "field_elements", "field": "goldilocks", "values": values}),
        )
        .unwrap()
    };
    let t = Instant::now();
    for i in 0..count {
        let (status, v) = create(&client, &url, "application/json", small(i)).await;
        assert_eq!(status, 201, "{v}");
    }
    let took = t.elapsed();
    let (status, v) = create(&client, &url, "application/json", small(count)).await;
    assert_eq!((status, &v["code"]), (507, &json!("arrays_full")), "{v}");
    let (rss, peak) = memory_mib();
    let (n, bytes) = files(&small_dir.join("arrays"));
    println!(
        "| {count} × 16 goldilocks elements (128 B), JSON; the next 507 `arrays_full` | {count} | {} | {:.2} ms | {rss:.0} MiB ({peak:.0}), +{:.0} | {n} files, {:.1} MB |",
        ms(took),
        took.as_secs_f64() * 1e3 / count as f64,
        rss - rss0,
        bytes as f64 / 1e6
    );

    let url = super::common::serve(&[
        "--backend",
        "cpu",
        "--data-dir",
        large_dir.to_str().unwrap(),
        "--max-arrays-mib",
        &mib.to_string(),
        "--max-tenant-array-mib",
        &(mib + 16).to_string(),
    ])
    .await;
    let values = 4usize << 20;
    let tensor: Vec<u8> = (0..values)
        .flat_map(|i| ((i % 1000) as f32 / 8.0).to_le_bytes())
        .collect();
    let upload = || {
        let mut w = EnvelopeWriter::new();
        let d = w.push(Dtype::F32, vec![values as u64], tensor.clone().into());
        w.finish_to_vec(&json!({"kind": "tensor", "tensor": d}))
            .unwrap()
    };
    let (rss1, _) = memory_mib();
    let fit = (mib / 16) as usize;
    let t = Instant::now();
    for _ in 0..fit {
        let (status, v) = create(&client, &url, MEDIA_TYPE, upload()).await;
        assert_eq!(status, 201, "{v}");
    }
    let took = t.elapsed();
    let (status, v) = create(&client, &url, MEDIA_TYPE, upload()).await;
    assert_eq!((status, &v["code"]), (507, &json!("arrays_full")), "{v}");
    let (rss, peak) = memory_mib();
    let (n, bytes) = files(&large_dir.join("arrays"));
    println!(
        "| {fit} × 16 MiB f32 tensors (2^22 values), bulk; the next 507 `arrays_full` | {fit} | {} | {:.1} ms | {rss:.0} MiB ({peak:.0}), +{:.0} | {n} files, {:.1} MB |",
        ms(took),
        took.as_secs_f64() * 1e3 / fit as f64,
        rss - rss1,
        bytes as f64 / 1e6
    );

    // A restart: every array loaded from its files and checked again.
    let limits = ArrayLimits {
        tenant_bytes: u64::MAX,
        tenant_count: usize::MAX,
        server_bytes: u64::MAX,
        server_count: usize::MAX,
        read_back_wait: std::time::Duration::from_secs(60),
        tables: TableLimits::NONE,
    };
    for (dir, what, n) in [
        (
            &small_dir,
            "restart: the small arrays loaded and checked",
            count,
        ),
        (&large_dir, "restart: the tensors loaded and checked", fit),
    ] {
        let t = Instant::now();
        let loaded =
            Arrays::open(dir.join("arrays"), limits, ArrayMetrics::unregistered()).unwrap();
        let took = t.elapsed();
        assert_eq!(loaded.list("").unwrap().len(), n, "{what}");
        let (rss, peak) = memory_mib();
        println!(
            "| {what} | {n} | {} | {:.3} ms | {rss:.0} MiB ({peak:.0}) | |",
            ms(took),
            took.as_secs_f64() * 1e3 / n as f64
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}
