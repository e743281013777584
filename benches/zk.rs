//! `cargo bench --bench zk`: BN254 MSM through the service beside a direct in-process
//! arkworks call on the same rayon pool (the aim: ≤ 1.15×), over HTTP with base64
//! bodies, and, when a CUDA device is usable, MSM and NTT on it: end to end per call, and
//! device time estimated as end to end minus a host↔device round trip of the same bytes
//! measured in the same run. Env: BENCH_MSM_LOG2 (comma-separated, default "16,18"),
//! BENCH_MSM_GPU_LOG2 (default "16,18,20,22"), BENCH_NTT_GPU_LOG2 (default "16,20,24").

mod common;

use ark_ec::short_weierstrass::Projective;
use ark_ec::VariableBaseMSM;
use ark_ff::BigInt;
use base64::Engine;
use common::{median, ms, time};
use gpu_ops::ops::zk::msm::{Curve, MsmJob, Points};
use gpu_ops::ops::zk::samples::{random_elements, random_points};
use gpu_ops::ops::zk::{FieldVec, U256};
use std::time::{Duration, Instant};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn sizes(name: &str, default: &str) -> Vec<u32> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn inputs(log_n: u32) -> (MsmJob, Vec<U256>) {
    let n = 1usize << log_n;
    let points = random_points(Curve::Bn254G1, n, u64::from(log_n));
    let scalars = random_elements(Curve::Bn254G1.scalar_field(), n, 77);
    let job = MsmJob::new(
        points,
        vec![FieldVec::from_integers(Curve::Bn254G1.scalar_field(), &scalars).unwrap()],
    )
    .unwrap();
    (job, scalars)
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = gpu_ops::backend::CpuExecutor::new(threads).unwrap();
    println!(
        "# gpu-ops MSM benchmark, CPU: {} ({threads} threads)\n",
        cpu.info.model
    );
    println!("## BN254 G1, in process: service op vs arkworks `msm_bigint` on the same pool\n");
    println!("| n | service op | arkworks direct | ratio |");
    println!("|---|---|---|---|");
    let cpu_sizes = sizes("BENCH_MSM_LOG2", "16,18");
    for &log_n in &cpu_sizes {
        let (job, scalars) = inputs(log_n);
        let Points::Bn254G1(points) = job.points() else {
            unreachable!()
        };
        // What an arkworks caller holds: affine points and BigInt scalars.
        let bigints: Vec<BigInt<4>> = scalars.iter().map(|s| BigInt(s.0)).collect();
        let direct = cpu.install(|| {
            time(5, || {
                Projective::<ark_bn254::g1::Config>::msm_bigint(points, &bigints)
            })
        });
        let service = cpu.install(|| time(5, || job.run_cpu()));
        println!(
            "| 2^{log_n} | {} | {} | {:.2}× |",
            ms(service),
            ms(direct),
            service.as_secs_f64() / direct.as_secs_f64()
        );
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(http(&cpu_sizes, &cpu));
    gpu(
        &sizes("BENCH_MSM_GPU_LOG2", "16,18,20,22"),
        &sizes("BENCH_NTT_GPU_LOG2", "16,20,24"),
    );
}

async fn http(cpu_sizes: &[u32], cpu: &gpu_ops::backend::CpuExecutor) {
    let url = format!(
        "{}/zk/msm",
        common::serve(&["--backend", "cpu", "--max-elements", "4194304"]).await
    );
    let client = reqwest::Client::new();

    println!("\n## BN254 G1 over HTTP (loopback, base64 body; points validated on the curve)\n");
    println!("| n | body | median round trip | service op alone | overhead |");
    println!("|---|---|---|---|---|");
    for &log_n in cpu_sizes {
        let (job, _) = inputs(log_n);
        let op_alone = cpu.install(|| time(5, || job.run_cpu()));
        let body = bytes::Bytes::from(
            serde_json::to_vec(&serde_json::json!({
                "curve": "bn254_g1", "encoding": "base64",
                "scalars": B64.encode(job.scalars()[0].to_le_bytes()),
                "points": B64.encode(job.points().to_le_bytes()),
            }))
            .unwrap(),
        );
        let mut times = Vec::new();
        for i in 0..6 {
            let t = Instant::now();
            let res = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            res.bytes().await.unwrap();
            if i > 0 {
                times.push(t.elapsed());
            }
        }
        let rt = median(times);
        println!(
            "| 2^{log_n} | {:.1} MB | {} | {} | {:.0}% |",
            body.len() as f64 / 1e6,
            ms(rt),
            ms(op_alone),
            100.0 * (rt.as_secs_f64() - op_alone.as_secs_f64()) / op_alone.as_secs_f64()
        );
    }
}

/// Host→device and back for `bytes` bytes: the transfer share of an end-to-end call.
fn copy_round_trip(lease: &gpu_ops::backend::DeviceLease<'_>, bytes: usize) -> Duration {
    let host = vec![0u8; bytes];
    time(5, || {
        let d = lease.upload(&host).unwrap();
        lease.download(&d).unwrap()
    })
}

fn gpu(msm_sizes: &[u32], ntt_sizes: &[u32]) {
    use gpu_ops::backend::cuda::{discover, DeviceSelection};
    use gpu_ops::ops::zk::ntt::{Direction, NttJob, Order};
    use gpu_ops::ops::zk::Field;
    let cache = std::env::temp_dir().join("gpu-ops-bench-kernels");
    let (devices, reason) = discover(
        &DeviceSelection::All,
        &cache,
        &gpu_ops::ops::kernel_library(),
    );
    let Some(dev) = devices.first() else {
        println!("\n## GPU: skipped ({reason})");
        return;
    };
    println!(
        "\n## GPU {} (sm {}): BN254 G1 MSM per call\n",
        dev.info.name, dev.info.compute_capability
    );
    println!("| n | end to end | transfers | device (difference) | CPU twin | speed-up (end to end) | equal |");
    println!("|---|---|---|---|---|---|---|");
    for &log_n in msm_sizes {
        let (job, _) = inputs(log_n);
        let lease = dev.lease().expect("device lease");
        let out = gpu_ops::ops::zk::launch_msm(&job, &lease).expect("kernels run");
        let e2e = time(5, || gpu_ops::ops::zk::launch_msm(&job, &lease).unwrap());
        let copies = copy_round_trip(&lease, job.input_bytes());
        drop(lease);
        let cpu_out = job.run_cpu();
        let cpu = time(3, || job.run_cpu());
        println!(
            "| 2^{log_n} | {} | {} | {} | {} | {:.1}× | {} |",
            ms(e2e),
            ms(copies),
            ms(e2e.saturating_sub(copies)),
            ms(cpu),
            cpu.as_secs_f64() / e2e.as_secs_f64(),
            out == cpu_out
        );
    }
    println!(
        "\n## GPU {}: forward NTT per call, one polynomial\n",
        dev.info.name
    );
    println!("| field | n | end to end | transfers | device (difference) | CPU twin | equal |");
    println!("|---|---|---|---|---|---|---|");
    for field in [Field::Bn254Fr, Field::Goldilocks] {
        for &log_n in ntt_sizes {
            let n = 1usize << log_n;
            let values = FieldVec::from_integers(field, &random_elements(field, n, 12)).unwrap();
            let bytes = values.byte_len();
            let job = NttJob::new(
                Direction::Forward,
                values,
                1,
                Order::Natural,
                Order::Natural,
                None,
                32,
            )
            .unwrap();
            let lease = dev.lease().expect("device lease");
            let out = gpu_ops::ops::zk::launch_ntt(&job, &lease).expect("kernels run");
            let e2e = time(5, || gpu_ops::ops::zk::launch_ntt(&job, &lease).unwrap());
            let copies = copy_round_trip(&lease, bytes);
            drop(lease);
            let cpu_out = job.run_cpu();
            let cpu = time(1, || job.run_cpu());
            println!(
                "| {} | 2^{log_n} | {} | {} | {} | {} | {} |",
                field.name(),
                ms(e2e),
                ms(copies),
                ms(e2e.saturating_sub(copies)),
                ms(cpu),
                out == cpu_out
            );
        }
    }
}
