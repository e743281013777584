//! A device gone wrong, shown on the emulated device with injected faults: the self-test
//! every device passes before it is ready, shadow checks of device jobs, quarantine of an
//! op on one device, the fault policy (a job-specific error moves that job alone, a lost
//! device or repeated failures retire the device, a re-probe brings it back), and device
//! work nobody waits for any more dropped before it starts.

use crate::common;

use common::{problem, TestServer};
use gpu_ops::backend::emulated::Fault;
use gpu_ops::backend::{DeviceErrorKind, GpuDevice};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// Every op with a device path, as the domains register them (`ops::DOMAINS`), sorted as
/// `/device` lists them.
fn device_ops() -> Vec<&'static str> {
    let mut ops = gpu_ops::ops::device_ops();
    ops.sort_unstable();
    ops
}

/// A server on the emulated device, uncalibrated (the placement tests use it too).
pub(crate) async fn server(extra: &[&str]) -> TestServer {
    let mut args = vec![
        "--backend",
        "auto",
        "--emulate-device",
        "--job-timeout",
        "600s",
        "--batching",
        "off",
        // No calibration: its launches would take the faults these tests inject.
        "--placement-calibration-budget",
        "0s",
    ];
    args.extend_from_slice(extra);
    TestServer::start(&args).await
}

fn device(s: &TestServer) -> Arc<GpuDevice> {
    s.state.backends.gpus()[0].clone()
}

async fn report(s: &TestServer) -> Value {
    s.get("/device").await.json::<Value>().await.unwrap()["gpus"][0].clone()
}

/// The op's `/device` entry.
async fn op_state(s: &TestServer, op: &str) -> Value {
    report(s).await["operations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["op"] == op)
        .cloned()
        .unwrap_or(Value::Null)
}

/// A Goldilocks field op on `backend`: the status and where it ran.
async fn goldilocks(s: &TestServer, op: &str, backend: &str) -> (u16, String) {
    let res = s
        .post(
            &format!("/zk/{op}"),
            json!({"field": "goldilocks", "a": ["1", "2", "3"], "b": ["5", "6", "7"], "backend": backend}),
        )
        .send()
        .await
        .unwrap();
    let at = res
        .headers()
        .get("x-backend")
        .map_or(String::new(), |v| v.to_str().unwrap().to_string());
    (res.status().as_u16(), at)
}

async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..600 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test]
async fn every_op_passes_its_self_test_before_the_device_is_ready() {
    let s = server(&[]).await;
    let ops = report(&s).await["operations"].clone();
    let names: Vec<&str> = ops
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    assert_eq!(names, device_ops(), "{ops}");
    for o in ops.as_array().unwrap() {
        assert_eq!(o["state"], "verified", "{o}");
    }
    for op in device_ops() {
        assert_eq!(
            s.metric(&format!("gpu_ops_kernel_verified{{gpu=\"0\",op=\"{op}\"}}"))
                .await,
            1.0,
            "{op}"
        );
    }
}

#[tokio::test]
async fn a_self_test_failure_quarantines_that_op_on_that_device_only() {
    let s = server(&[]).await;
    let dev = device(&s);
    // Every Goldilocks add returns one wrong bit: the self-test's own run catches it.
    dev.inject_fault("goldilocks_add", Fault::Corrupt, 1000)
        .unwrap();
    s.state
        .backends
        .self_test(&dev, &gpu_ops::ops::self_tests());
    let add = op_state(&s, "field_add").await;
    assert_eq!(add["state"], "quarantined", "{add}");
    assert!(
        add["reason"].as_str().unwrap().starts_with("self-test:"),
        "{add}"
    );
    assert_eq!(op_state(&s, "field_mul").await["state"], "verified");
    assert_eq!(
        s.metric("gpu_ops_kernel_verified{gpu=\"0\",op=\"field_add\"}")
            .await,
        0.0
    );
    // The quarantined op: refused on `cuda`, served by the CPU on `auto`; the rest of the
    // device still serves.
    let res = s
        .post(
            "/zk/field_add",
            json!({"field": "goldilocks", "a": ["1"], "b": ["2"], "backend": "cuda"}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 503, "device_unavailable").await;
    assert_eq!(
        goldilocks(&s, "field_mul", "cuda").await,
        (200, "emulated".into())
    );
}

#[tokio::test]
async fn a_shadow_check_catches_a_wrong_answer_and_quarantines_the_op() {
    let s = server(&["--verify-fraction", "1"]).await;
    let dev = device(&s);
    assert_eq!(
        goldilocks(&s, "field_mul", "cuda").await,
        (200, "emulated".into())
    );
    let agree = "gpu_ops_shadow_checks_total{op=\"field_mul\",outcome=\"agree\"}";
    assert_eq!(s.wait_for_metric(agree, 1.0).await, 1.0);
    // One silently wrong answer: its caller already has it; the shadow check sees it.
    dev.inject_fault("goldilocks_mul", Fault::Corrupt, 1)
        .unwrap();
    assert_eq!(
        goldilocks(&s, "field_mul", "cuda").await,
        (200, "emulated".into())
    );
    let mismatch = "gpu_ops_shadow_checks_total{op=\"field_mul\",outcome=\"mismatch\"}";
    assert_eq!(s.wait_for_metric(mismatch, 1.0).await, 1.0);
    let mul = op_state(&s, "field_mul").await;
    assert_eq!(mul["state"], "quarantined", "{mul}");
    assert!(
        mul["reason"].as_str().unwrap().starts_with("shadow check:"),
        "{mul}"
    );
    assert_eq!(
        goldilocks(&s, "field_mul", "auto").await,
        (200, "cpu".into())
    );
    assert_eq!(
        goldilocks(&s, "field_sub", "cuda").await,
        (200, "emulated".into())
    );
}

#[tokio::test]
async fn a_lost_device_is_retired_its_job_rerun_on_the_cpu_and_a_reprobe_brings_it_back() {
    let s = server(&["--device-reprobe-backoff", "200ms"]).await;
    let dev = device(&s);
    dev.inject_fault("goldilocks_add", Fault::Fail(DeviceErrorKind::Fatal), 1)
        .unwrap();
    assert_eq!(
        goldilocks(&s, "field_add", "cuda").await,
        (200, "cpu".into())
    );
    assert!(!dev.is_healthy());
    assert_eq!(
        s.metric("gpu_ops_fallbacks_total{op=\"field_add\",reason=\"device_error\"}")
            .await,
        1.0
    );
    assert_eq!(report(&s).await["healthy"], false);
    // The re-probe rebuilds the engine, reruns the self-test, and returns the device.
    wait_until("the re-probe returns the device", async || dev.is_healthy()).await;
    assert_eq!(report(&s).await["healthy"], true);
    assert_eq!(s.metric("gpu_ops_device_healthy{gpu=\"0\"").await, 1.0);
    assert_eq!(
        goldilocks(&s, "field_add", "cuda").await,
        (200, "emulated".into())
    );
}

#[tokio::test]
async fn job_specific_errors_move_the_job_and_three_in_a_row_retire_the_device() {
    let s = server(&["--device-reprobe-backoff", "1h"]).await;
    let dev = device(&s);
    let oom = Fault::Fail(DeviceErrorKind::OutOfMemory);
    dev.inject_fault("goldilocks_sub", oom, 2).unwrap();
    for _ in 0..2 {
        assert_eq!(
            goldilocks(&s, "field_sub", "cuda").await,
            (200, "cpu".into())
        );
        assert!(
            dev.is_healthy(),
            "one job's error leaves the device in service"
        );
    }
    // A success ends the streak; three failures in a row end the device's service.
    assert_eq!(
        goldilocks(&s, "field_sub", "cuda").await,
        (200, "emulated".into())
    );
    dev.inject_fault("goldilocks_sub", oom, 3).unwrap();
    for _ in 0..3 {
        assert_eq!(
            goldilocks(&s, "field_sub", "cuda").await,
            (200, "cpu".into())
        );
    }
    assert!(!dev.is_healthy());
    assert_eq!(
        s.metric("gpu_ops_fallbacks_total{op=\"field_sub\",reason=\"out_of_memory\"}")
            .await,
        5.0
    );
    let res = s
        .post(
            "/zk/field_sub",
            json!({"field": "goldilocks", "a": ["1"], "b": ["2"], "backend": "cuda"}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 503, "device_unavailable").await;
}

#[tokio::test]
async fn a_job_whose_deadline_passes_while_it_waits_for_the_device_never_runs_there() {
    let s = server(&[]).await;
    let dev = device(&s);
    // Had the job run on the device, this fault would have retired it.
    dev.inject_fault("goldilocks_add", Fault::Fail(DeviceErrorKind::Fatal), 1)
        .unwrap();
    // Someone else holds the device for a second.
    let holder = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            let _lease = dev.lease().unwrap();
            std::thread::sleep(Duration::from_secs(1));
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let res = s
        .post(
            "/zk/field_add",
            json!({"field": "goldilocks", "a": ["1"], "b": ["2"], "backend": "cuda", "timeout_ms": 200}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 504, "deadline_exceeded").await;
    holder.join().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(dev.is_healthy(), "the dropped job never launched");
    // The fault is still there for the next job that does run.
    assert_eq!(
        goldilocks(&s, "field_add", "cuda").await,
        (200, "cpu".into())
    );
}

/// `gpu-ops check` of the emulated device at the quick level: every registered op
/// present with parity ok and its timings (cuBLASLt's and cuDNN's checks skipped: the
/// emulated device has neither library), every kernel with a launch bound, exit 0.
#[test]
fn the_check_proves_every_registered_op_on_the_emulated_device() {
    if gpu_ops::backend::emulated::sanitizer() != "none" {
        gpu_ops::skips::skip(
            "device_faults::the_check_proves_every_registered_op_on_the_emulated_device",
            "the check's sizes are for the plain build (the sanitizer runs cover the same launchers)",
        );
        return;
    }
    let dir = std::path::PathBuf::from(common::temp_data_dir());
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("report.json");
    // Fresh inputs each run, as the check draws by default; the seed is chosen here so
    // that a failure says how to replay it (`--seed`).
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ops"))
        .args(["check", "--emulate-device", "--level", "quick"])
        .args(["--seed", &seed.to_string(), "--json"])
        .arg(&json)
        .arg("--data-dir")
        .arg(&dir)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "seed {seed}: exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("| op | phase | case |"), "{stdout}");
    assert!(stdout.contains("| auto picks |"), "{stdout}");
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let registered: Vec<&str> = report["registered_ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap())
        .collect();
    for op in device_ops() {
        assert!(registered.contains(&op), "{op} is not registered");
    }
    let ops = report["ops"].as_array().unwrap();
    for op in &registered {
        let parity: Vec<&Value> = ops
            .iter()
            .filter(|e| e["op"] == *op && e["phase"] == "parity")
            .collect();
        assert!(!parity.is_empty(), "{op} has no parity case");
        for e in parity {
            let library = *op == "matmul_cublaslt" || *op == "conv2d_cudnn";
            let want = if library { "skipped" } else { "ok" };
            assert_eq!(e["parity"], want, "seed {seed}: {e}");
            if !library {
                let t = &e["timings"];
                assert!(t["device_ms"]["median"].as_f64().unwrap() > 0.0, "{e}");
                assert!(t["kernel_ms"]["runs"].as_u64().unwrap() >= 1, "{e}");
                assert!(t["cpu_ms"].as_f64().is_some(), "{e}");
                assert!(!e["case"].as_str().unwrap().is_empty(), "{e}");
                // Where `auto` would place it, from the run's other cases.
                let picks = e["auto"]["picks"].as_str().unwrap_or_default();
                assert!(picks == "device" || picks == "cpu", "{e}");
                assert!(e["auto"]["ratio"].as_f64().unwrap() >= 1.0, "{e}");
            }
        }
    }
    let device = &report["devices"][0];
    assert_eq!(device["emulated"], true);
    for f in device["functions"].as_array().unwrap() {
        assert_eq!(f["fits"], true, "{f}");
    }
    assert_eq!(report["summary"]["failed"], 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--msm-log2` gives the check's MSM sizes: each on both curves, points sent and resident
/// (with precomputed multiples), all held to the CPU; a size past 2^24 is refused before
/// anything runs.
#[test]
fn the_check_runs_the_msm_at_the_sizes_asked_for() {
    if gpu_ops::backend::emulated::sanitizer() != "none" {
        gpu_ops::skips::skip(
            "device_faults::the_check_runs_the_msm_at_the_sizes_asked_for",
            "the check runs as its own process, in the plain build",
        );
        return;
    }
    let dir = std::path::PathBuf::from(common::temp_data_dir());
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("report.json");
    let check = |log2: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ops"))
            .args([
                "check",
                "--emulate-device",
                "--ops",
                "msm",
                "--msm-log2",
                log2,
            ])
            .arg("--json")
            .arg(&json)
            .arg("--data-dir")
            .arg(&dir)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };
    let out = check("5,7");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let mut cases: Vec<String> = report["ops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["phase"] == "parity")
        .map(|e| {
            assert!(e["reason"].is_null(), "{e}");
            e["case"]
                .as_str()
                .unwrap()
                .split(',')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    cases.sort();
    let mut want = Vec::new();
    for curve in ["bls12_381_g1", "bn254_g1"] {
        for size in ["2^5", "2^7"] {
            want.push(format!("{curve} {size}"));
            want.push(format!("{curve} {size} resident"));
        }
    }
    assert_eq!(cases, want);
    let refused = check("25");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A wrong answer planted in one op's device path (every Goldilocks addition's output
/// corrupted) fails the check, which names that op and only that op. The report so far is
/// written after each op, so a check stopped by a timeout still leaves one.
#[test]
fn the_check_fails_and_names_the_op_whose_device_answer_is_wrong() {
    use clap::Parser;
    use gpu_ops::check::{report::Phase, run_on, Verdict};
    use gpu_ops::config::{Cli, Command};
    let dir = std::env::temp_dir().join(format!("gpu-ops-check-partial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("check.json");
    let cli = Cli::try_parse_from([
        "gpu-ops",
        "check",
        "--emulate-device",
        "--ops",
        "field_add,field_mul",
        "--json",
        json.to_str().unwrap(),
    ])
    .unwrap();
    let Some(Command::Check(args)) = cli.command else {
        panic!("not the check")
    };
    let dev = Arc::new(GpuDevice::emulated(0, 1 << 30));
    dev.inject_fault("goldilocks_add", Fault::Corrupt, u32::MAX)
        .unwrap();
    let opened = Phase {
        phase: "compile and load".into(),
        seconds: 0.0,
    };
    let report = run_on(&args, &[dev], "test".into(), opened).unwrap();
    assert_eq!(gpu_ops::check::verdict(&report), Verdict::Failed);
    assert_eq!(report.summary.failed_ops, ["field_add"]);
    let failed: Vec<_> = report
        .ops
        .iter()
        .filter(|e| e.reason.is_some())
        .map(|e| (e.op.as_str(), e.case.as_str()))
        .collect();
    // The self-test's cases are labelled by size; the parity cases name their field.
    assert!(!failed.is_empty());
    assert!(
        failed.iter().all(|(op, case)| *op == "field_add"
            && (case.contains("goldilocks") || case.starts_with("self-test"))),
        "{failed:?}"
    );
    assert!(report
        .ops
        .iter()
        .any(|e| e.op == "field_mul" && e.reason.is_none()));
    // `run_on` writes no final report (`run_cli` does): what is on disk is the partial
    // one, after the last op, with every case and a last phase saying so.
    let partial: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let phases = partial["phases"].as_array().unwrap();
    let last = phases.last().unwrap()["phase"].as_str().unwrap();
    assert!(
        last.starts_with("partial report, written after field_"),
        "{last}"
    );
    assert_eq!(partial["ops"].as_array().unwrap().len(), report.ops.len());
    assert_eq!(
        partial["summary"]["failed_ops"],
        serde_json::json!(["field_add"])
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// With one job per device, a device job arriving while another holds the device waits
/// for the lease (it is not refused, nor sent elsewhere: it was asked for the device),
/// runs once the lease ends, and is counted; the gauge is back at 0 afterwards.
#[tokio::test]
async fn a_device_job_beyond_the_jobs_per_device_waits_for_a_lease() {
    let s = server(&["--gpu-jobs-per-device", "1"]).await;
    let dev = device(&s);
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (held, holding) = tokio::sync::oneshot::channel();
    let holder = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            let lease = dev.lease_for(None, 1).unwrap();
            held.send(()).unwrap();
            released.recv().unwrap();
            drop(lease);
        })
    };
    holding.await.unwrap();
    let unblock = async {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while dev.jobs_waiting() == 0 {
            assert!(
                std::time::Instant::now() < until,
                "the job never asked for the device"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        release.send(()).unwrap();
    };
    let (answer, ()) = tokio::join!(goldilocks(&s, "field_add", "gpu"), unblock);
    assert_eq!(answer, (200, "emulated".into()));
    holder.join().unwrap();
    assert_eq!(
        s.metric("gpu_ops_device_lease_waits_total{gpu=\"0\"}")
            .await,
        1.0
    );
    assert_eq!(
        s.metric("gpu_ops_device_jobs_running{gpu=\"0\"}").await,
        0.0
    );
}

/// Host bytes `gpu 0`'s device jobs copied `direction` through `host_memory`, so far.
async fn copied(s: &TestServer, direction: &str, host_memory: &str) -> f64 {
    s.metrics()
        .await
        .lines()
        .filter(|l| {
            l.starts_with("gpu_ops_device_copy_bytes_total{")
                && l.contains("gpu=\"0\"")
                && l.contains(&format!("direction=\"{direction}\""))
                && l.contains(&format!("host_memory=\"{host_memory}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A bulk body bound for the device is read into page-locked memory, and the gradients
/// DP privatize reads in place from it go to the device straight from there: each byte
/// touched once on the host (as it arrives), no staging buffer. With
/// `--gpu-pinned-body-mib 0` the same request stages them.
#[tokio::test]
async fn bulk_gradients_go_to_the_device_straight_from_a_page_locked_body() {
    use gpu_ops::wire::{Dtype, EnvelopeWriter};
    let (rows, cols) = (64usize, 8192usize);
    let gradient_bytes = 4.0 * (rows * cols) as f64;
    let gradients: Vec<u8> = (0..rows * cols)
        .flat_map(|i| ((i % 97) as f32 * 0.01 - 0.4).to_le_bytes())
        .collect();
    let mut header = json!({"clip_norm": 1.0, "noise_multiplier": 1.1, "backend": "gpu"});
    let mut writer = EnvelopeWriter::new();
    let shape = vec![rows as u64, cols as u64];
    let descriptor = writer.push(Dtype::F32, shape, bytes::Bytes::from(gradients));
    header["per_example_gradients"] = serde_json::to_value(descriptor).unwrap();
    let body = writer.finish_to_vec(&header).unwrap();
    for (flags, memory) in [
        (&[][..], "request_body"),
        (&["--gpu-pinned-body-mib", "0"][..], "page_locked"),
    ] {
        let s = server(flags).await;
        let privatize = || {
            reqwest::Client::new()
                .post(format!("{}/dp/privatize", s.url))
                .header("content-type", gpu_ops::wire::MEDIA_TYPE)
                .body(body.clone())
                .send()
        };
        let (before, staged_before) = (
            copied(&s, "to_device", memory).await,
            copied(&s, "to_device", "page_locked").await,
        );
        let res = privatize().await.unwrap();
        assert_eq!(res.status(), 200, "{flags:?}");
        assert_eq!(res.headers()["x-backend"], "emulated");
        let moved = copied(&s, "to_device", memory).await - before;
        assert!(
            (gradient_bytes..gradient_bytes + 4096.0).contains(&moved),
            "{memory}: {moved} bytes, the gradients are {gradient_bytes}"
        );
        let pinned = s.metric("gpu_ops_pinned_body_bytes").await;
        if memory == "request_body" {
            let staged = copied(&s, "to_device", "page_locked").await - staged_before;
            assert!(
                staged < 4096.0,
                "the gradients were staged too: {staged} bytes"
            );
            assert!(pinned >= gradient_bytes, "the body's block: {pinned}");
            // The block comes back to the pool and serves the next body.
            let reused = s.metric("gpu_ops_body_pool_reused_total").await;
            assert_eq!(privatize().await.unwrap().status(), 200);
            let reused_now = s.metric("gpu_ops_body_pool_reused_total").await;
            assert_eq!(reused_now, reused + 1.0, "the kept block");
            let pinned_now = s.metric("gpu_ops_pinned_body_bytes").await;
            assert_eq!(pinned_now, pinned, "no new block");
        } else {
            assert_eq!(pinned, 0.0);
        }
        assert_eq!(s.metric("gpu_ops_pinned_body_fallbacks_total").await, 0.0);
    }
}

/// Matmul's f32 operands, read in place from a bulk body, go to the device straight from
/// its page-locked block too: both 1 MiB operands as `request_body` bytes, none staged.
#[tokio::test]
async fn bulk_matmul_operands_go_to_the_device_straight_from_a_page_locked_body() {
    use gpu_ops::wire::{Dtype, EnvelopeWriter};
    let (m, k, n) = (256u64, 1024u64, 256u64);
    let values = |len: u64, seed: u64| -> bytes::Bytes {
        (0..len)
            .flat_map(|i| (((i * seed) % 89) as f32 * 0.125 - 5.0).to_le_bytes())
            .collect::<Vec<u8>>()
            .into()
    };
    let mut header = json!({"backend": "gpu"});
    let mut writer = EnvelopeWriter::new();
    let a = writer.push(Dtype::F32, vec![m, k], values(m * k, 7));
    let b = writer.push(Dtype::F32, vec![k, n], values(k * n, 11));
    header["a"] = serde_json::to_value(a).unwrap();
    header["b"] = serde_json::to_value(b).unwrap();
    let body = writer.finish_to_vec(&header).unwrap();
    let s = server(&[]).await;
    let (before, staged_before) = (
        copied(&s, "to_device", "request_body").await,
        copied(&s, "to_device", "page_locked").await,
    );
    let res = reqwest::Client::new()
        .post(format!("{}/linalg/matmul", s.url))
        .header("content-type", gpu_ops::wire::MEDIA_TYPE)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{:?}", res.text().await);
    assert_eq!(res.headers()["x-backend"], "emulated");
    let operands = 4.0 * (m * k + k * n) as f64;
    let moved = copied(&s, "to_device", "request_body").await - before;
    assert_eq!(moved, operands, "both operands straight from the body");
    let staged = copied(&s, "to_device", "page_locked").await - staged_before;
    assert_eq!(staged, 0.0, "nothing staged on the way in");
}

/// A field op on the device stages its operands through page-locked buffers, each byte
/// once (three Goldilocks pairs in, three sums out: 48 and 24 bytes), and keeps the
/// buffers; with `--gpu-staging-mib 0` the same job copies from pageable memory, counted
/// as a fallback.
#[tokio::test]
async fn device_field_jobs_copy_through_page_locked_staging_unless_it_is_off() {
    for (flags, memory, fallbacks) in [
        (&[][..], "page_locked", 0.0),
        (&["--gpu-staging-mib", "0"][..], "pageable", 1.0),
    ] {
        let s = server(flags).await;
        let (to, from) = (
            copied(&s, "to_device", memory).await,
            copied(&s, "from_device", memory).await,
        );
        assert_eq!(
            goldilocks(&s, "field_add", "gpu").await,
            (200, "emulated".into())
        );
        assert_eq!(copied(&s, "to_device", memory).await - to, 48.0, "{memory}");
        assert_eq!(
            copied(&s, "from_device", memory).await - from,
            24.0,
            "{memory}"
        );
        assert_eq!(
            s.metric("gpu_ops_staging_fallbacks_total{gpu=\"0\"}").await,
            fallbacks
        );
        let held = s.metric("gpu_ops_staging_bytes").await;
        let kept = if fallbacks == 0.0 {
            16.0 * 1048576.0
        } else {
            0.0
        };
        assert_eq!(held, kept, "{memory}");
    }
}
