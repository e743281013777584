//! `cargo bench --bench arrays`: resident arrays over HTTP (loopback, one client, the CPU
//! backend, or with BENCH_BACKEND=gpu every op on a device: the host's GPUs, or the
//! emulated device with BENCH_EMULATE=1, shadow checks off), each beside its reference in
//! the same process: an MSM whose points are sent
//! in every request's bulk body against one whose points name a resident array; a
//! polynomial product (NTT, NTT, multiply, inverse NTT) whose vectors go back and forth
//! against one whose intermediates stay on the server (`keep`; on a device they stay on
//! the device, not downloaded until read). Medians of BENCH_RUNS
//! (default 5) after one warm-up. Then the caps filled (`caps`): memory, files and a
//! restart's load time with many arrays. And a model's stack of layers, products and
//! convolutions, each output sent back and up against kept (`layers`, `arrays/layers.rs`).
//! Env: BENCH_CASES (comma-separated of msm, chain, layers, caps; default all), BENCH_MSM_LOG2
//! (comma-separated, default "16,18"), BENCH_CHAIN_LOG2 (default 20), BENCH_CAP_ARRAYS
//! (default 10000), BENCH_CAP_MIB (default 256).

#[path = "arrays/caps.rs"]
mod caps;
mod common;
#[path = "arrays/layers.rs"]
mod layers;

use common::{env, median, ms};
use gpu_ops::ops::zk::msm::Curve;
use gpu_ops::ops::zk::samples::{random_elements, random_points};
use gpu_ops::ops::zk::Field;
use gpu_ops::wire::{Dtype, EnvelopeWriter, MEDIA_TYPE};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn le_bytes(v: &[gpu_ops::ops::zk::U256]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| x.0.iter().flat_map(|l| l.to_le_bytes()))
        .collect()
}

/// A bulk body: `header` with each `(field, dtype, shape, bytes)` as a buffer.
fn bulk(mut header: Value, buffers: Vec<(&str, Dtype, Vec<u64>, Vec<u8>)>) -> bytes::Bytes {
    let mut w = EnvelopeWriter::new();
    for (at, dtype, shape, bytes) in buffers {
        let d = w.push(dtype, shape, bytes.into());
        header[at] = serde_json::to_value(d).unwrap();
    }
    w.finish_to_vec(&header).unwrap().into()
}

async fn post(client: &reqwest::Client, url: &str, media: &str, body: bytes::Bytes) -> Value {
    let res = client
        .post(url)
        .header("content-type", media)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{url}");
    res.json().await.unwrap()
}

/// Median time of `runs` calls of `f` after one warm-up.
async fn timed<F: std::future::Future<Output = Value>>(
    runs: usize,
    mut f: impl FnMut() -> F,
) -> (Duration, Value) {
    let mut last = f().await;
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        last = f().await;
        times.push(t.elapsed());
    }
    (median(times), last)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let cases = std::env::var("BENCH_CASES").unwrap_or_else(|_| "msm,chain,layers,caps".into());
    let case = |name: &str| cases.split(',').any(|c| c.trim() == name);
    if case("msm") || case("chain") || case("layers") {
        msm_and_chain(case("msm"), case("chain"), case("layers")).await;
    }
    if case("caps") {
        caps::run(
            env("BENCH_CAP_ARRAYS", 10_000),
            env("BENCH_CAP_MIB", 256) as u64,
        )
        .await;
    }
}

/// Where the ops run: `cpu`, or `gpu` (BENCH_BACKEND).
fn backend() -> &'static str {
    match std::env::var("BENCH_BACKEND").as_deref() {
        Ok("gpu") => "gpu",
        _ => "cpu",
    }
}

async fn msm_and_chain(msm: bool, chain: bool, layers: bool) {
    let runs = env("BENCH_RUNS", 5);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut args = vec!["--max-elements", "16777216", "--backend"];
    let on = if backend() == "gpu" {
        args.extend(["auto", "--verify-fraction", "0"]);
        if std::env::var("BENCH_EMULATE").as_deref() == Ok("1") {
            args.push("--emulate-device");
            "the emulated device (kernels on the host's CPU: its times are not a GPU's)"
        } else {
            "the host's GPU"
        }
    } else {
        args.push("cpu");
        "CPU backend"
    };
    let url = common::serve(&args).await;
    let client = reqwest::Client::new();
    println!("# gpu-ops benchmark: resident arrays over HTTP, {on}, {threads} threads\n");
    if msm {
        msm_cases(&client, &url, runs).await;
    }
    if chain {
        chain_case(&client, &url, runs).await;
    }
    if layers {
        layers::run(&client, &url).await;
    }
}

async fn msm_cases(client: &reqwest::Client, url: &str, runs: usize) {
    println!("## MSM in the bulk form: points sent each call against a resident array\n");
    println!(
        "| curve | points | points sent (body) | resident array (body) | ratio | upload once |"
    );
    println!("|---|---|---|---|---|---|");
    let sizes = std::env::var("BENCH_MSM_LOG2").unwrap_or_else(|_| "16,18".into());
    for log2 in sizes
        .split(',')
        .filter_map(|s| s.trim().parse::<u32>().ok())
    {
        let n = 1usize << log2;
        for curve in [Curve::Bn254G1, Curve::Bls12_381G1] {
            let points = random_points(curve, n, 7).to_le_bytes();
            let scalars = le_bytes(&random_elements(curve.scalar_field(), n, 8));
            let words = (curve.coordinate_bytes() / 8) as u64;
            let point_buf = || {
                (
                    "points",
                    Dtype::U64,
                    vec![n as u64, 2, words],
                    points.clone(),
                )
            };
            let scalar_buf = || ("scalars", Dtype::U256, vec![n as u64], scalars.clone());
            let header = json!({"curve": curve.name(), "backend": backend()});
            let sent = bulk(header.clone(), vec![scalar_buf(), point_buf()]);
            let msm = format!("{url}/zk/msm");
            let (t_sent, want) = timed(runs, || post(client, &msm, MEDIA_TYPE, sent.clone())).await;
            let t = Instant::now();
            let upload = bulk(
                json!({"kind": "points", "curve": curve.name()}),
                vec![point_buf()],
            );
            let res = client
                .post(format!("{url}/arrays"))
                .header("content-type", MEDIA_TYPE)
                .body(upload)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 201);
            let upload_time = t.elapsed();
            let id = res.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string();
            let named = bulk(
                json!({"curve": curve.name(), "points": {"array": id}, "backend": backend()}),
                vec![scalar_buf()],
            );
            let (t_named, got) =
                timed(runs, || post(client, &msm, MEDIA_TYPE, named.clone())).await;
            assert_eq!(got, want, "the same sum");
            println!(
                "| {} | 2^{log2} | {} ({:.1} MB) | {} ({:.1} MB) | {:.2}× | {} |",
                curve.name(),
                ms(t_sent),
                sent.len() as f64 / 1e6,
                ms(t_named),
                named.len() as f64 / 1e6,
                t_sent.as_secs_f64() / t_named.as_secs_f64(),
                ms(upload_time)
            );
            let _ = client.delete(format!("{url}/arrays/{id}")).send().await;
        }
    }
}

async fn chain_case(client: &reqwest::Client, url: &str, runs: usize) {
    let log2 = env("BENCH_CHAIN_LOG2", 20);
    let n = 1usize << log2;
    println!("\n## Polynomial product, bn254_fr, 2^{log2} coefficients: NTT, NTT, multiply, inverse NTT (base64 JSON)\n");
    let f = le_bytes(&random_elements(Field::Bn254Fr, n, 1));
    let g = le_bytes(&random_elements(Field::Bn254Fr, n, 2));
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let (f64s, g64s) = (b64(&f), b64(&g));
    let j = |v: Value| bytes::Bytes::from(serde_json::to_vec(&v).unwrap());
    let json = "application/json";
    let (ntt, mul, intt) = (
        format!("{url}/zk/ntt"),
        format!("{url}/zk/field_mul"),
        format!("{url}/zk/intt"),
    );
    let on = backend();
    let sent_chain = || async {
        let base = |values: &Value| json!({"field": "bn254_fr", "encoding": "base64", "values": values, "backend": on});
        let nf = post(client, &ntt, json, j(base(&json!(f64s)))).await;
        let ng = post(client, &ntt, json, j(base(&json!(g64s)))).await;
        let p = post(client, &mul, json, j(json!({"field": "bn254_fr", "encoding": "base64", "a": nf["result"], "b": ng["result"], "backend": on}))).await;
        post(client, &intt, json, j(base(&p["result"]))).await["result"].clone()
    };
    let kept_chain = || async {
        let keep = json!({"ttl_seconds": 60, "with_data": false});
        let base = |values: Value| json!({"field": "bn254_fr", "encoding": "base64", "values": values, "keep": keep, "backend": on});
        let nf = post(client, &ntt, json, j(base(json!(f64s)))).await;
        let ng = post(client, &ntt, json, j(base(json!(g64s)))).await;
        let id = |v: &Value| json!({"array": v["kept"]["id"]});
        let p = post(client, &mul, json, j(json!({"field": "bn254_fr", "encoding": "base64", "a": id(&nf), "b": id(&ng), "keep": keep, "backend": on}))).await;
        let last =
            json!({"field": "bn254_fr", "encoding": "base64", "values": id(&p), "backend": on});
        let out = post(client, &intt, json, j(last)).await;
        if on == "gpu" {
            // On a device the intermediates stayed there: none was read back.
            assert_eq!(nf["kept"]["held"], json!(["device"]), "{nf}");
        }
        for v in [&nf, &ng, &p] {
            let _ = client
                .delete(format!(
                    "{url}/arrays/{}",
                    v["kept"]["id"].as_str().unwrap()
                ))
                .send()
                .await;
        }
        out["result"].clone()
    };
    let (t_sent, want) = timed(runs, sent_chain).await;
    let (t_kept, got) = timed(runs, kept_chain).await;
    assert_eq!(got, want, "the same product");
    println!("| chain | median | sent / this (above 1: this is faster) |");
    println!("|---|---|---|");
    println!(
        "| every vector sent back and forth | {} | 1.00 |",
        ms(t_sent)
    );
    println!(
        "| intermediates kept (`keep`, `with_data: false`) | {} | {:.2} |",
        ms(t_kept),
        t_sent.as_secs_f64() / t_kept.as_secs_f64()
    );
}
