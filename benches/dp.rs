//! `cargo bench --bench dp`: the DP figures in docs/PERFORMANCE.md, each beside a
//! reference measured in the same run (a plain read of the same data; on a GPU, a
//! device-to-device copy of it).
//! Env: BENCH_DP_ROWS (256), BENCH_DP_LOG2_COLS (20), BENCH_DP_HTTP_ROWS (32).

mod common;

use base64::Engine;
use common::{dp_gradients as gradients, env, privatize_job as job, time};
use gpu_ops::ops::dp::plan::calibrate_gaussian;
use gpu_ops::ops::dp::{Gradients, Mechanism, NoiseJob, NoiseKey, PrivatizeJob};
use rayon::prelude::*;
use std::time::{Duration, Instant};

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn main() {
    let rows = env("BENCH_DP_ROWS", 256);
    let cols = 1usize << env("BENCH_DP_LOG2_COLS", 20);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = gpu_ops::backend::CpuExecutor::new(threads).unwrap();
    let bytes = rows * cols * 4;
    println!(
        "# gpu-ops DP benchmark: privatize B = {rows}, D = {cols}, f32 ({:.0} MiB); CPU: {} ({threads} threads)\n",
        bytes as f64 / (1 << 20) as f64,
        cpu.info.model
    );
    let g = gradients(rows * cols);
    let read = cpu.install(|| {
        time(5, || {
            g.par_chunks(1 << 16)
                .map(|c| c.iter().map(|&x| f64::from(x)).sum::<f64>())
                .sum::<f64>()
        })
    });
    let j = job(g, rows, cols);
    let whole = cpu.install(|| time(3, || j.run_cpu()));
    let noise_only = NoiseJob {
        values: vec![0.0; cols],
        mechanism: Mechanism::Gaussian(j.plan),
        key: j.key,
    };
    let noise = cpu.install(|| time(3, || noise_only.run_cpu()));
    println!("## CPU\n");
    println!("| what | time | effective bandwidth | vs one read pass |");
    println!("|---|---|---|---|");
    println!(
        "| reference: one read pass over the gradients (sum) | {} | {:.2} GB/s | 1.00 |",
        ms(read),
        gbps(bytes, read)
    );
    println!(
        "| privatize (norms pass + clip/sum pass + noise) | {} | {:.2} GB/s | {:.2} |",
        ms(whole),
        gbps(bytes, whole),
        read.as_secs_f64() / whole.as_secs_f64()
    );
    println!(
        "| of which: discrete Gaussian noise for D values | {} | {:.0} ns/value | |",
        ms(noise),
        noise.as_secs_f64() * 1e9 / cols as f64
    );
    let n = 1 << 20;
    let values: Vec<f64> = (0..n).map(|i| i as f64 * 1e-3).collect();
    let gauss = NoiseJob {
        values: values.clone(),
        mechanism: Mechanism::Gaussian(calibrate_gaussian(n, 1.0, 1.0, 1e-5).unwrap().plan),
        key: NoiseKey::from_seed(2),
    };
    let t = cpu.install(|| time(3, || gauss.run_cpu()));
    println!(
        "| /dp/gaussian op, 2^20 values | {} | {:.0} ns/value | |",
        ms(t),
        t.as_secs_f64() * 1e9 / n as f64
    );

    gpu(&j, bytes, &gauss);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(http(env("BENCH_DP_HTTP_ROWS", 32), cols, &cpu));
}

fn gpu(j: &PrivatizeJob, bytes: usize, gauss: &NoiseJob) {
    use gpu_ops::backend::cuda::{discover, DeviceSelection};
    let (devices, reason) = discover(
        &DeviceSelection::All,
        &std::env::temp_dir().join("gpu-ops-bench-kernels"),
        &gpu_ops::ops::kernel_library(),
    );
    let Some(dev) = devices.first() else {
        println!("\n## GPU\n\nnot measured: {reason}\n");
        return;
    };
    println!(
        "\n## GPU: {} (sm {})\n",
        dev.info.name, dev.info.compute_capability
    );
    let lease = dev.lease().unwrap();
    let Gradients::F32(g) = &j.gradients else {
        unreachable!()
    };
    let dg = lease.upload(g).unwrap();
    let mut dcopy = lease.alloc_zeros::<f32>(g.len()).unwrap();
    let copy = time(10, || {
        lease.copy(&dg, &mut dcopy).unwrap();
        lease.synchronize().unwrap();
    });
    let resident = time(10, || {
        gpu_ops::ops::dp::privatize_resident(j, &dg, &lease).unwrap()
    });
    let with_upload = time(5, || gpu_ops::ops::dp::launch_privatize(j, &lease).unwrap());
    let mech = time(10, || {
        gpu_ops::ops::dp::launch_noise(gauss, &lease).unwrap()
    });
    let copy_bw = 2.0 * gbps(bytes, copy);
    println!("| what | time | bandwidth | vs device copy |");
    println!("|---|---|---|---|");
    println!("| reference: device-to-device copy of the gradients (read + write) | {} | {:.0} GB/s | 1.00 |", ms(copy), copy_bw);
    println!(
        "| privatize, gradients resident (2 read passes + noise) | {} | {:.0} GB/s read | {:.2} |",
        ms(resident),
        2.0 * gbps(bytes, resident),
        2.0 * gbps(bytes, resident) / copy_bw
    );
    println!(
        "| privatize incl. host→device upload | {} | {:.1} GB/s | |",
        ms(with_upload),
        gbps(bytes, with_upload)
    );
    println!(
        "| /dp/gaussian op, 2^20 values incl. copies | {} | | |",
        ms(mech)
    );
}

async fn http(rows: usize, cols: usize, cpu: &gpu_ops::backend::CpuExecutor) {
    let data = std::env::temp_dir().join(format!("gpu-ops-bench-dp-{}", std::process::id()));
    let base = common::serve(&[
        "--max-body-bytes",
        "2147483648",
        "--max-tensor-elements",
        "536870912",
        "--data-dir",
        data.to_str().unwrap(),
    ])
    .await;
    let url = format!("{base}/dp/privatize");
    let g = gradients(rows * cols);
    let alone = job(g.clone(), rows, cols);
    let op = cpu.install(|| time(3, || alone.run_cpu()));
    let data_b64 = base64::engine::general_purpose::STANDARD
        .encode(g.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let body = bytes::Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "per_example_gradients": {"encoding": "base64", "dtype": "f32", "shape": [rows, cols], "data": data_b64},
            "clip_norm": 1.0, "noise_multiplier": 1.1,
        }))
        .unwrap(),
    );
    let client = reqwest::Client::new();
    let mut times = Vec::new();
    let mut backend = String::new();
    for i in 0..4 {
        let t = Instant::now();
        let res = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        backend = res.headers()["x-backend"].to_str().unwrap().to_string();
        res.bytes().await.unwrap();
        if i > 0 {
            times.push(t.elapsed());
        }
    }
    times.sort();
    let rt = times[times.len() / 2];
    println!("\n## End to end over HTTP (loopback, base64 f32)\n");
    println!("| request | body | round trip | backend | CPU op alone |");
    println!("|---|---|---|---|---|");
    println!(
        "| privatize B = {rows}, D = {cols} | {:.0} MB | {} | {backend} | {} |",
        body.len() as f64 / 1e6,
        ms(rt),
        ms(op)
    );
    let _ = std::fs::remove_dir_all(data);
}
