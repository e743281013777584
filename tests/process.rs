//! The real binary: start-up validation and signal handling.

mod common;

use common::binary::spawn_server;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-ops");

#[test]
fn invalid_flags_fail_at_start_up_with_one_line() {
    for args in [
        &["--queue-capacity", "0"][..],
        &["--backend", "tpu"],
        &["--job-timeout", "soon"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("gpu-ops: "), "{stderr}");
    }
}

#[test]
fn openapi_subcommand_prints_the_committed_document() {
    let out = Command::new(BIN).arg("openapi").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        gpu_ops::api::openapi_json()
    );
}

#[cfg(unix)]
#[test]
fn sigterm_stops_the_server_cleanly_with_exit_code_0() {
    let data = std::env::temp_dir().join(format!("gpu-ops-process-{}", std::process::id()));
    let (mut child, _port) = spawn_server(&data, &[]);
    let start = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "server did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
    let _ = std::fs::remove_dir_all(data);
}

/// A charge is durable before anything is released: kill -9 the server after the
/// budget recorded a release but before the release's response, restart, and the
/// spend is still there.
#[cfg(unix)]
#[test]
fn a_budget_charge_survives_a_crash_before_the_response() {
    use serde_json::{json, Value};
    let data = std::env::temp_dir().join(format!("gpu-ops-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    let (mut child, port) = spawn_server(&data, &[]);
    let url = format!("http://127.0.0.1:{port}");
    let (id, spent_before_kill) = rt.block_on(async {
        let b: Value = client
            .post(format!("{url}/dp/budgets"))
            .json(&json!({"epsilon_limit": 100.0, "delta": 1e-5}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = b["id"].as_str().unwrap().to_string();
        // Exact noise costs about a microsecond a value on one thread: seconds of work
        // between the charge and the response.
        let release = json!({"values": vec![0.25; 10_000_000], "sensitivity": 1.0, "epsilon": 1.0, "budget_id": id});
        let pending = tokio::spawn(client.post(format!("{url}/dp/laplace")).json(&release).send());
        let start = Instant::now();
        let spent = loop {
            let b: Value = client
                .get(format!("{url}/dp/budgets/{id}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if b["charges"] == 1 {
                break b["epsilon_spent"].as_f64().unwrap();
            }
            assert!(start.elapsed() < Duration::from_secs(60), "the charge never appeared");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(!pending.is_finished(), "the release answered before the crash; make it bigger");
        child.kill().unwrap();
        let _ = child.wait();
        let answer = pending.await.unwrap();
        assert!(answer.is_err(), "no response may arrive from a killed server");
        (id, spent)
    });
    assert!(spent_before_kill > 0.0);
    let (mut child, port) = spawn_server(&data, &[]);
    let after: Value = rt.block_on(async {
        client
            .get(format!("http://127.0.0.1:{port}/dp/budgets/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    assert_eq!(after["charges"], 1, "{after}");
    assert_eq!(after["epsilon_spent"].as_f64(), Some(spent_before_kill));
    let _ = std::fs::remove_dir_all(data);
}

#[cfg(unix)]
#[test]
fn healthcheck_subcommand_reports_liveness_by_exit_code() {
    let data = std::env::temp_dir().join(format!("gpu-ops-health-{}", std::process::id()));
    let (mut child, port) = spawn_server(&data, &[]);
    let probe = |port: u16| {
        Command::new(BIN)
            .args(["healthcheck", "--addr", &format!("127.0.0.1:{port}")])
            .stderr(Stdio::null())
            .status()
            .unwrap()
    };
    assert!(probe(port).success());
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    assert!(
        !probe(port).success(),
        "a stopped server must fail the probe"
    );
    let _ = std::fs::remove_dir_all(data);
}
