//! `cargo bench --bench service`: the figures in docs/PERFORMANCE.md. Every number is a
//! median of repeated runs, reported beside a reference measured in the same process.
//! Env: BENCH_LOG2 (default 20), BENCH_TINY_REQUESTS (20000), BENCH_CONCURRENCY (32).

mod common;

use ark_ff::{BigInt, Fp256, MontBackend, MontConfig};
use base64::Engine;
use common::{env, median, ms, time};
use gpu_ops::ops::zk::samples::random_elements;
use gpu_ops::ops::zk::{Field, FieldBinaryJob, FieldOp, FieldVec};
use rayon::prelude::*;
use std::time::{Duration, Instant};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// `op` over arkworks elements already in Montgomery form (what an arkworks user holds),
/// on the pool.
fn arkworks_loop<C: MontConfig<4>>(
    cpu: &gpu_ops::backend::CpuExecutor,
    op: FieldOp,
    x: &[[u64; 4]],
    y: &[[u64; 4]],
) -> Duration {
    type F<C> = Fp256<MontBackend<C, 4>>;
    let xf: Vec<F<C>> = x.iter().map(|l| F::<C>::new(BigInt(*l))).collect();
    let yf: Vec<F<C>> = y.iter().map(|l| F::<C>::new(BigInt(*l))).collect();
    cpu.install(|| {
        time(9, || {
            xf.par_iter()
                .zip(&yf)
                .map(|(p, q)| match op {
                    FieldOp::Add => *p + q,
                    FieldOp::Sub => *p - q,
                    FieldOp::Mul => *p * q,
                })
                .collect::<Vec<F<C>>>()
        })
    })
}

/// `op` over Plonky3 field elements (what a Plonky3 user holds; BabyBear's in Montgomery
/// form), on the pool.
fn plonky3_loop<W: Sync, F: p3_field::Field>(
    cpu: &gpu_ops::backend::CpuExecutor,
    op: FieldOp,
    x: &[W],
    y: &[W],
    from: impl Fn(&W) -> F,
) -> Duration {
    let xf: Vec<F> = x.iter().map(&from).collect();
    let yf: Vec<F> = y.iter().map(&from).collect();
    cpu.install(|| {
        time(9, || {
            xf.par_iter()
                .zip(&yf)
                .map(|(p, q)| match op {
                    FieldOp::Add => *p + *q,
                    FieldOp::Sub => *p - *q,
                    FieldOp::Mul => *p * *q,
                })
                .collect::<Vec<F>>()
        })
    })
}

fn main() {
    let n = 1usize << env("BENCH_LOG2", 20);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = gpu_ops::backend::CpuExecutor::new(threads).unwrap();
    println!(
        "# gpu-ops benchmark: n = {n}, CPU: {} ({threads} threads)\n",
        cpu.info.model
    );

    println!("## In-process CPU ops vs direct loops on the same rayon pool\n");
    println!("| op | field | service op | direct loop | ratio |");
    println!("|---|---|---|---|---|");
    for field in Field::ALL {
        let a = FieldVec::from_integers(field, &random_elements(field, n, 1)).unwrap();
        let b = FieldVec::from_integers(field, &random_elements(field, n, 2)).unwrap();
        for op in FieldOp::ALL {
            let job = FieldBinaryJob::new(op, a.clone(), b.clone()).unwrap();
            let service = cpu.install(|| time(9, || job.run_cpu()));
            let (direct, what) = match (&a, &b) {
                (FieldVec::Bn254Fr(x), FieldVec::Bn254Fr(y)) => (
                    arkworks_loop::<ark_bn254::FrConfig>(&cpu, op, x, y),
                    "arkworks Fr",
                ),
                (FieldVec::Bls12_381Fr(x), FieldVec::Bls12_381Fr(y)) => (
                    arkworks_loop::<ark_bls12_381::FrConfig>(&cpu, op, x, y),
                    "arkworks Fr",
                ),
                (FieldVec::BabyBear(x), FieldVec::BabyBear(y)) => (
                    plonky3_loop(&cpu, op, x, y, |v| p3_baby_bear::BabyBear::new(*v)),
                    "Plonky3 BabyBear",
                ),
                (FieldVec::Goldilocks(x), FieldVec::Goldilocks(y)) => (
                    plonky3_loop(&cpu, op, x, y, |v| p3_goldilocks::Goldilocks::new(*v)),
                    "Plonky3 Goldilocks",
                ),
                _ => unreachable!(),
            };
            println!(
                "| {} | {} | {} | {} ({what}) | {:.2}× |",
                op.name(),
                field.name(),
                ms(service),
                ms(direct),
                service.as_secs_f64() / direct.as_secs_f64()
            );
        }
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(http(n, &cpu));
}

async fn http(n: usize, cpu: &gpu_ops::backend::CpuExecutor) {
    let url = common::serve(&["--backend", "cpu", "--queue-capacity", "4096"]).await;
    let client = reqwest::Client::new();

    println!("\n## End to end over HTTP (loopback, one client)\n");
    println!("| request | body | median round trip | CPU op alone | service overhead |");
    println!("|---|---|---|---|---|");
    for (field, op) in [
        (Field::Goldilocks, FieldOp::Add),
        (Field::Bn254Fr, FieldOp::Mul),
    ] {
        let xs = random_elements(field, n, 3);
        let ys = random_elements(field, n, 4);
        let a = FieldVec::from_integers(field, &xs).unwrap();
        let b = FieldVec::from_integers(field, &ys).unwrap();
        let job = FieldBinaryJob::new(op, a.clone(), b.clone()).unwrap();
        let op_alone = cpu.install(|| time(9, || job.run_cpu()));
        let json_body = serde_json::to_vec(&serde_json::json!({
            "field": field.name(),
            "a": xs.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
            "b": ys.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
        }))
        .unwrap();
        let b64_body = serde_json::to_vec(&serde_json::json!({
            "field": field.name(), "encoding": "base64",
            "a": B64.encode(a.to_le_bytes()), "b": B64.encode(b.to_le_bytes()),
        }))
        .unwrap();
        for (label, body) in [("JSON strings", json_body), ("base64", b64_body)] {
            let body = bytes::Bytes::from(body);
            let url = format!("{url}/zk/{}", op.name());
            let mut times = Vec::new();
            for i in 0..8 {
                let t = Instant::now();
                post_ok(&client, &url, body.clone()).await;
                if i > 0 {
                    times.push(t.elapsed());
                }
            }
            let rt = median(times);
            println!(
                "| {} {} | {label}, {:.1} MB | {} | {} | {:.0}% |",
                op.name(),
                field.name(),
                body.len() as f64 / 1e6,
                ms(rt),
                ms(op_alone),
                100.0 * (rt.as_secs_f64() - op_alone.as_secs_f64()) / op_alone.as_secs_f64()
            );
        }
    }

    let total = env("BENCH_TINY_REQUESTS", 20_000);
    let conc = env("BENCH_CONCURRENCY", 32);
    let body = bytes::Bytes::from_static(br#"{"field":"goldilocks","a":["12345"],"b":["678"]}"#);
    let started = Instant::now();
    let tasks: Vec<_> = (0..conc)
        .map(|_| {
            let (client, url, body) = (client.clone(), format!("{url}/zk/field_mul"), body.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                for _ in 0..total / conc {
                    let t = Instant::now();
                    post_ok(&client, &url, body.clone()).await;
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let wall = started.elapsed();
    lat.sort();
    println!("\n## Tiny requests (1 element, field_mul goldilocks), {conc} concurrent clients in the same process\n");
    println!("| requests | throughput | p50 | p99 |");
    println!("|---|---|---|---|");
    println!(
        "| {} | {:.0} req/s | {} | {} |",
        lat.len(),
        lat.len() as f64 / wall.as_secs_f64(),
        ms(lat[lat.len() / 2]),
        ms(lat[lat.len() * 99 / 100])
    );
}

/// POSTs a JSON body, requires 200, and reads the whole answer.
async fn post_ok(client: &reqwest::Client, url: &str, body: bytes::Bytes) {
    let res = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.bytes().await.unwrap();
}
