//! The wgpu engine in the server, on a real Vulkan driver: lavapipe (Mesa's, on the CPU)
//! in CI, which installs it and sets `REQUIRE_WGPU=1`; elsewhere these tests skip when no
//! wgpu adapter opens. The field ops' kernels against their CPU twins are the parity
//! harness's (`parity::zk`); here: what the server makes of an adapter (served ops,
//! placement, shadow checks) and its faults (a lost device, a kernel that does not
//! compile).

use crate::common::{problem, TestServer};
use gpu_ops::backend::cuda::DeviceSelection;
use gpu_ops::backend::verify::NO_KERNELS;
use gpu_ops::backend::wgpu::{
    discover, Param, SoftwareAdapters, WgslKernel, WgslLibrary, LEFT_OFF,
};
use serde_json::{json, Value};
use std::time::Duration;

/// Whether a wgpu adapter opens here; a skip otherwise (a failure under REQUIRE_WGPU=1).
fn adapter_here() -> bool {
    if !crate::parity::wgpu_devices().is_empty() {
        return true;
    }
    if crate::parity::checked_run() {
        // The checkers are for the emulated device's kernels (`parity::wgpu_devices`);
        // CI runs these tests unchecked.
        return false;
    }
    gpu_ops::skips::skip_unless_required(
        &gpu_ops::skips::current_test(),
        "no wgpu adapter opens here (install mesa-vulkan-drivers for lavapipe)",
        "REQUIRE_WGPU",
    );
    false
}

/// A server on the software adapter, serving there only the ops of `wgpu_ops`: the
/// others' kernels (the MSM's above all, a minute of CPU on lavapipe) are not compiled,
/// and the parity harness checks them on its own opening.
async fn server(software: &str, wgpu_ops: &str, extra: &[&str]) -> TestServer {
    let mut args = vec![
        "--backend",
        "auto",
        "--wgpu-software-adapters",
        software,
        "--wgpu-ops",
        wgpu_ops,
        "--batching",
        "off",
        "--placement-calibration-budget",
        "0s",
    ];
    args.extend_from_slice(extra);
    TestServer::start(&args).await
}

fn mul_body(n: usize, backend: &str) -> Value {
    let a: Vec<String> = (0..n).map(|i| (i * 7919 + 3).to_string()).collect();
    let b: Vec<String> = (0..n)
        .map(|i| (18_446_744_069_414_584_320u64 - i as u64).to_string())
        .collect();
    json!({"field": "goldilocks", "a": a, "b": b, "backend": backend})
}

/// Where a Goldilocks product of `n` elements ran, and its answer.
async fn mul(s: &TestServer, n: usize, backend: &str) -> (String, Value) {
    let res = s
        .post("/zk/field_mul", mul_body(n, backend))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let side = res.headers()["x-backend"].to_str().unwrap().to_string();
    (side, res.json::<Value>().await.unwrap()["result"].clone())
}

/// A software adapter opened under `forced`: it serves the field ops `--wgpu-ops` names
/// (self-tested, shadow-checked), only to requests that name the GPU backend; `auto`
/// keeps off it; an op without kernels there, or left off by `--wgpu-ops`, is refused
/// by name, with why.
#[tokio::test]
async fn a_software_adapter_serves_the_field_ops_only_when_asked() {
    if !adapter_here() {
        return;
    }
    let field_ops = "field_add,field_sub,field_mul,field_pow,field_inv";
    let s = server("forced", field_ops, &["--verify-fraction", "1"]).await;
    let device: Value = s.get("/device").await.json().await.unwrap();
    let gpu = &device["gpus"][0];
    assert_eq!(gpu["adapter"]["software"], true, "{gpu}");
    assert_eq!(gpu["adapter"]["auto_placement"], false, "{gpu}");
    // wgpu reports no memory: a job's budget is one storage binding, so larger work runs
    // in passes that each kernel can bind.
    let budget = s.state.backends.gpus()[0].memory_budget() as u64;
    assert_eq!(
        Some(budget),
        gpu["adapter"]["max_storage_binding_bytes"].as_u64()
    );
    let entry = |op: &str| {
        let ops = gpu["operations"].as_array().unwrap();
        ops.iter()
            .find(|o| o["op"] == op)
            .cloned()
            .unwrap_or_default()
    };
    for op in field_ops.split(',') {
        assert_eq!(entry(op)["state"], "verified", "{op}: {gpu}");
    }
    for op in ["ntt", "intt", "msm"] {
        assert_eq!(entry(op)["state"], "unavailable", "{op}: {gpu}");
        assert_eq!(entry(op)["reason"], LEFT_OFF, "{op}: {gpu}");
    }
    assert_eq!(entry("matmul")["state"], "unavailable", "{gpu}");
    assert_eq!(entry("matmul")["reason"], NO_KERNELS, "{gpu}");
    let kernels = s.state.backends.gpus()[0].module_loads();
    assert!(
        kernels.iter().all(|m| m.module == "field_ops"),
        "{kernels:?}"
    );

    let (side, on_device) = mul(&s, 3000, "gpu").await;
    assert_eq!(side, "wgpu");
    let (side, on_cpu) = mul(&s, 3000, "cpu").await;
    assert_eq!(side, "cpu");
    assert_eq!(on_device, on_cpu);
    // Every device job is checked here (--verify-fraction 1), off the request path.
    s.wait_for_metric(
        r#"gpu_ops_shadow_checks_total{op="field_mul",result="agree"}"#,
        1.0,
    )
    .await;
    for _ in 0..6 {
        assert_eq!(mul(&s, 3000, "auto").await.0, "cpu", "auto keeps off it");
    }
    let forced = r#"gpu_ops_placements_total{backend="wgpu",op="field_mul",reason="forced"}"#;
    assert_eq!(s.metric(forced).await, 1.0);

    let matmul = json!({"a": [[1, 2], [3, 4]], "b": [[5, 6], [7, 8]], "backend": "gpu"});
    let res = s.post("/linalg/matmul", matmul).send().await.unwrap();
    let p = problem(res, 503, "device_unavailable").await;
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("wgpu:0 ({NO_KERNELS})")),
        "{detail}"
    );
    let ntt = json!({"field": "goldilocks", "values": ["1", "2"], "backend": "gpu"});
    let res = s.post("/zk/ntt", ntt).send().await.unwrap();
    let p = problem(res, 503, "device_unavailable").await;
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains(&format!("wgpu:0 ({LEFT_OFF})")), "{detail}");
}

/// Under `auto`, a software adapter is a side like any device: `auto` measures it (a
/// size class it never ran is explored on it) and places by time.
#[tokio::test]
async fn under_auto_a_software_adapter_competes_by_measured_time() {
    if !adapter_here() {
        return;
    }
    let s = server("auto", "field_mul", &[]).await;
    let device: Value = s.get("/device").await.json().await.unwrap();
    assert_eq!(device["gpus"][0]["adapter"]["auto_placement"], true);
    let mut sides = Vec::new();
    for _ in 0..8 {
        sides.push(mul(&s, 3000, "auto").await.0);
    }
    assert!(sides.iter().any(|s| s == "wgpu"), "{sides:?}");
    let explored = r#"gpu_ops_placements_total{backend="wgpu",op="field_mul",reason="explored"}"#;
    assert!(s.metric(explored).await >= 1.0);
}

/// A device lost under the server (destroyed, as a driver reset would) fails its next
/// job as fatal: the job is answered from the CPU, the device retired, then re-probed
/// (the adapter found and opened again, its kernels compiled, its self-test passed) and
/// back in service.
#[tokio::test]
async fn a_lost_device_is_retired_and_comes_back_after_a_reprobe() {
    if !adapter_here() {
        return;
    }
    let s = server("forced", "field_mul", &["--device-reprobe-backoff", "1s"]).await;
    let dev = s.state.backends.gpus()[0].clone();
    dev.destroy_wgpu_device().unwrap();
    let (side, _) = mul(&s, 100, "gpu").await;
    assert_eq!(side, "cpu", "rerun on the CPU");
    assert!(!dev.is_healthy(), "retired");
    // Up to two minutes: the re-probe compiles the kernels again (those of --wgpu-ops)
    // and reruns the self-test, on a CPU driver that CI's other tests keep busy.
    let mut back = false;
    for _ in 0..480 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if dev.is_healthy() {
            back = true;
            break;
        }
    }
    assert!(back, "the re-probe brought it back");
    assert_eq!(mul(&s, 100, "gpu").await.0, "wgpu");
    let kernels = dev.module_loads();
    assert!(
        kernels.iter().all(|m| m.module == "field_ops"),
        "the re-probe compiled --wgpu-ops' kernels only: {kernels:?}"
    );
}

/// A kernel that does not compile fails the adapter's opening, naming the kernel: no
/// op is served by a library that is partly broken.
#[test]
fn a_kernel_that_does_not_compile_fails_the_opening() {
    if !adapter_here() {
        return;
    }
    let broken = WgslKernel {
        name: "goldilocks_add".into(),
        module: "field_ops",
        ops: vec!["field_add"],
        source: "@compute @workgroup_size(256) fn main() { let x: u32 = 1.5; }".into(),
        params: vec![Param::Read, Param::Read, Param::Write, Param::Scalar(8)],
        shared_bytes: 0,
    };
    let library = WgslLibrary {
        kernels: vec![broken],
        ops: vec!["field_add"],
        left_off: Vec::new(),
    };
    let (opened, why) = discover(&DeviceSelection::All, SoftwareAdapters::Forced, &library);
    assert!(opened.is_empty(), "{why}");
    assert!(
        why.contains("goldilocks_add") && why.contains("does not compile"),
        "{why}"
    );
}
