//! The real binary: start-up validation and signal handling.

use crate::common;

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

/// Peak and current resident memory of a process, in bytes, from /proc.
#[cfg(target_os = "linux")]
fn memory_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = |key: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    (kb("VmHWM:"), kb("VmRSS:"))
}

/// Eight clients send a 12 MB JSON body each at once, retrying on 503 until answered;
/// returns the server's peak RSS growth over its resting RSS, and the 503s seen.
#[cfg(target_os = "linux")]
fn peak_growth_under_eight_large_bodies(extra: &[&str]) -> (u64, usize) {
    let data = std::env::temp_dir().join(format!(
        "gpu-ops-budget-{}-{}",
        std::process::id(),
        extra.join("-")
    ));
    let (mut child, port) = spawn_server(&data, extra);
    let url = format!("http://127.0.0.1:{port}/zk/field_add");
    let n = 1usize << 18;
    let a: Vec<String> = (0..n as u64)
        .map(|i| (u64::MAX / 3 - i * 7919).to_string())
        .collect();
    let body =
        serde_json::to_vec(&serde_json::json!({"field": "goldilocks", "a": a, "b": a})).unwrap();
    assert!(body.len() > 11_000_000, "{}", body.len());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (growth, refused) = rt.block_on(async {
        let client = reqwest::Client::new();
        let small = serde_json::json!({"field": "goldilocks", "a": ["1"], "b": ["2"]});
        let warm = client.post(&url).json(&small).send().await.unwrap();
        assert_eq!(warm.status(), 200);
        let resting = memory_of(child.id()).1;
        let body = bytes::Bytes::from(body);
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let (client, url, body) = (client.clone(), url.clone(), body.clone());
                tokio::spawn(async move {
                    let mut refused = 0;
                    let deadline = Instant::now() + Duration::from_secs(120);
                    loop {
                        let res = client
                            .post(&url)
                            .header("content-type", "application/json")
                            .body(body.clone())
                            .send()
                            .await;
                        match res {
                            Ok(r) if r.status() == 200 => {
                                let v: serde_json::Value = r.json().await.unwrap();
                                return (v["result"].as_array().unwrap().len(), refused);
                            }
                            // 503 body_budget_exhausted, or the connection closed on an
                            // unread body: wait and send again.
                            Ok(r) => assert_eq!(r.status(), 503),
                            Err(e) => assert!(e.is_request() || e.is_connect(), "{e}"),
                        }
                        refused += 1;
                        assert!(Instant::now() < deadline, "never admitted");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
            })
            .collect();
        let mut refused = 0;
        for c in calls {
            let (len, r) = c.await.unwrap();
            assert_eq!(len, n);
            refused += r;
        }
        (memory_of(child.id()).0.saturating_sub(resting), refused)
    });
    child.kill().unwrap();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(data);
    (growth, refused)
}

#[cfg(target_os = "linux")]
#[test]
fn concurrent_large_bodies_stay_within_the_in_flight_body_budget() {
    // A budget of one 16 MiB body: however the eight arrive, the server holds one body
    // with its parsed vectors and its answer at a time. That measured 56–67 MB of peak
    // growth for a 12 MB body (debug build, 2026-11-25); the eight held together, 214–234 MB.
    let budget = 16 << 20;
    let (growth, refused) = peak_growth_under_eight_large_bodies(&[
        "--max-body-bytes",
        &budget.to_string(),
        "--max-inflight-body-bytes",
        &budget.to_string(),
    ]);
    let bound = 8 * budget;
    eprintln!("peak RSS growth {growth} bytes with a {budget}-byte budget ({refused} refusals)");
    assert!(
        growth < bound,
        "peak RSS grew {growth} bytes under a {budget}-byte body budget (bound {bound})"
    );
    // The same eight bodies with room for all of them at once, for the record.
    let (unbounded, _) = peak_growth_under_eight_large_bodies(&[
        "--max-body-bytes",
        &(16 << 20).to_string(),
        "--max-inflight-body-bytes",
        &(8 * (16 << 20)).to_string(),
    ]);
    eprintln!("peak RSS growth {unbounded} bytes with room for all eight bodies");
}

/// One request over a fresh connection (`Connection: close`): the status and the body;
/// status 0 when the server closed the connection unanswered.
fn raw_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    // A connection the server refused (closed at once) reads as status 0.
    if s.read_to_string(&mut text).is_err() {
        return (0, String::new());
    }
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// Whether the server closed `s` (end of stream or reset) before `deadline`.
fn closed_by(s: &mut std::net::TcpStream, deadline: Instant) -> bool {
    use std::io::Read;
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // A 408 or 400 before the close is fine; read on to the end.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// A server reachable from the network is protected by default: without
/// `--api-keys-file` it refuses to start and names both ways forward; with
/// `--allow-unauthenticated` it serves and says so on `/device`.
#[test]
fn a_server_on_the_network_without_keys_refuses_to_start() {
    let data = std::env::temp_dir().join(format!("gpu-ops-open-{}", std::process::id()));
    let out = Command::new(BIN)
        .args(["--bind", "0.0.0.0:0", "--backend", "cpu"])
        .args(["--data-dir", data.to_str().unwrap()])
        .env_remove("GPU_OPS_API_KEYS_FILE")
        .env_remove("GPU_OPS_ALLOW_UNAUTHENTICATED")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("--api-keys-file") && stderr.contains("--allow-unauthenticated"),
        "{stderr}"
    );
    let (mut child, port) =
        spawn_server(&data, &["--bind", "0.0.0.0:0", "--allow-unauthenticated"]);
    let (status, body) = raw_get(port, "/device");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&data);
    assert_eq!(status, 200);
    let device: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(device["authentication"], "unauthenticated");
    let warning = device["warnings"][0].as_str().unwrap();
    assert!(warning.contains("--allow-unauthenticated"), "{warning}");
}

/// Whether `s` is still open and silent: nothing to read yet, neither an answer nor
/// the end of the stream.
fn still_open(s: &std::net::TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    let open = matches!(s.peek(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    open
}

/// Slow headers (slowloris): 200 connections that send half a request line, and one
/// that sends nothing, are all closed by the server under `--header-read-timeout`,
/// and a well-behaved request is answered meanwhile, while they are all still open.
#[test]
fn connections_that_never_finish_their_headers_are_closed() {
    use std::io::Write;
    // Room for 201 connections and a request before any of them times out, however
    // loaded the machine.
    let timeout = Duration::from_secs(10);
    let data = std::env::temp_dir().join(format!("gpu-ops-slow-{}", std::process::id()));
    let (mut child, port) = spawn_server(&data, &["--header-read-timeout", "10s"]);
    let opened = Instant::now();
    let mut slow: Vec<std::net::TcpStream> = (0..200)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(b"GET /health/li").unwrap();
            s
        })
        .collect();
    slow.push(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
    let (status, _) = raw_get(port, "/health/live");
    // Answered while every slow connection is still held, not after they were closed.
    let held = slow.iter().filter(|s| still_open(s)).count();
    // Liveness only: the timeout and then some; the server closes them at the timeout.
    let deadline = opened + timeout + Duration::from_secs(30);
    let open = slow
        .iter_mut()
        .map(|s| closed_by(s, deadline))
        .filter(|closed| !closed)
        .count();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&data);
    assert_eq!(status, 200);
    assert_eq!(
        held, 201,
        "only {held} of 201 slow connections were still open when the request was answered"
    );
    assert_eq!(
        open,
        0,
        "{open} of 201 connections still open {:?} after they opened",
        deadline - opened
    );
}

/// `--max-connections`: a connection past the cap is closed at once and counted, and the
/// server serves again as soon as one closes.
#[test]
fn connections_past_the_cap_are_closed_and_counted() {
    use std::io::Write;
    let data = std::env::temp_dir().join(format!("gpu-ops-cap-{}", std::process::id()));
    let (mut child, port) = spawn_server(&data, &["--max-connections", "8"]);
    let mut held: Vec<std::net::TcpStream> = (0..8)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    // The server has taken all eight once one of them is answered on.
    held[0]
        .write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 64];
    let _ = std::io::Read::read(&mut held[0], &mut buf).unwrap();
    let mut extra = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let refused = closed_by(&mut extra, Instant::now() + Duration::from_secs(3));
    drop(held.pop());
    let start = Instant::now();
    let metrics = loop {
        let (status, body) = raw_get(port, "/metrics");
        if status == 200 || start.elapsed() > Duration::from_secs(5) {
            break body;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&data);
    assert!(refused, "the ninth connection was kept open");
    let counted = metrics
        .lines()
        .find(|l| l.starts_with("gpu_ops_connections_refused_total{reason=\"max_connections\"}"));
    assert!(counted.is_some_and(|l| !l.ends_with(" 0")), "{counted:?}");
}

/// /dp/privatize's gradients written as one-number rows (`[[0],[0],…]`), 4 bytes of JSON
/// per value: the worst shape of a matrix body. Built as `Vec<Vec<f64>>` such a body once
/// took the server 20 times its size (48 MB to 961 MB peak, release build); read flat
/// into 8 bytes per value, the body and its values together are 3 times the body
/// (docs/SECURITY.md, "What a body becomes"), with up to 2 MiB of buffers besides (the
/// connection's reads, the job's blocks of norms): 3.01–3.06× measured for this 24 MB
/// body, debug build, 2026-11-27.
#[cfg(target_os = "linux")]
#[test]
fn a_body_of_one_number_rows_stays_within_three_times_its_size() {
    let rows = 6_000_000;
    let mut body = Vec::with_capacity(4 * rows + 128);
    body.extend_from_slice(
        br#"{"clip_norm": 1.0, "noise_multiplier": 1.0, "per_example_gradients": ["#,
    );
    for i in 0..rows {
        body.extend_from_slice(if i == 0 { b"[0]" } else { b",[0]" });
    }
    body.extend_from_slice(b"]}");
    let data = std::env::temp_dir().join(format!("gpu-ops-rows-{}", std::process::id()));
    let (mut child, port) = spawn_server(&data, &["--max-body-bytes", &(64 << 20).to_string()]);
    let url = format!("http://127.0.0.1:{port}/dp/privatize");
    let size = body.len() as u64;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let resting = rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        // A body over 256 KiB first, so the parser's thread and the job's are running.
        let warm_rows = vec![[1.0]; 70_000];
        let warm = serde_json::json!({"per_example_gradients": warm_rows, "clip_norm": 1.0, "noise_multiplier": 1.0});
        let warm = client.post(&url).json(&warm).send().await.unwrap();
        assert_eq!(warm.status(), 200);
        let resting = memory_of(child.id()).1;
        let res = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = res.status();
        let answer: serde_json::Value = res.json().await.unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["gradient"].as_array().map(Vec::len), Some(1), "{answer}");
        resting
    });
    let growth = memory_of(child.id()).0.saturating_sub(resting);
    child.kill().unwrap();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(data);
    eprintln!(
        "peak RSS growth {growth} bytes for a {size}-byte body of one-number rows ({:.2}×)",
        growth as f64 / size as f64
    );
    assert!(
        growth <= 3 * size + (2 << 20),
        "peak RSS grew {growth} bytes for a {size}-byte body: over 3× its size and 2 MiB"
    );
}

/// A bulk DP batch's f32 gradients are read where they lie in the body (`wire::Array`):
/// the server's peak grows by the body, the answer and a constant, not by a decoded copy
/// of the gradients as well (which made it twice the body, docs/PERFORMANCE.md). The
/// constant (the job's blocks of norms, the connection's reads, the answer) is held to
/// 16 MiB: 71,397,376 bytes of growth for this 67,109,056-byte body and 1,048,960-byte
/// answer, a constant of 3.2 MB (debug build, 2-core VM, 2026-11-29); a decoded copy
/// would add 64 MiB.
#[cfg(target_os = "linux")]
#[test]
fn a_bulk_dp_batch_costs_its_body_and_answer_and_no_copy() {
    use gpu_ops::wire::{Dtype, EnvelopeWriter};
    let bulk = |rows: u64, cols: u64| {
        let values: Vec<u8> = (0..rows * cols)
            .flat_map(|i| (((i % 1999) as f32) * 1e-4 - 0.1).to_le_bytes())
            .collect();
        let mut w = EnvelopeWriter::new();
        let g = w.push(Dtype::F32, vec![rows, cols], bytes::Bytes::from(values));
        let header = serde_json::json!({"clip_norm": 1.0, "noise_multiplier": 1.0,
            "per_example_gradients": g});
        w.finish_to_vec(&header).unwrap()
    };
    let (rows, cols) = (64u64, 1u64 << 18);
    let body = bulk(rows, cols);
    let size = body.len() as u64;
    let data = std::env::temp_dir().join(format!("gpu-ops-bulk-dp-{}", std::process::id()));
    let (mut child, port) = spawn_server(&data, &[]);
    let url = format!("http://127.0.0.1:{port}/dp/privatize");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (resting, answer) = rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap();
        let post = |body: Vec<u8>| {
            client
                .post(&url)
                .header("content-type", gpu_ops::wire::MEDIA_TYPE)
                .header("accept", gpu_ops::wire::MEDIA_TYPE)
                .body(body)
                .send()
        };
        // A small batch first (under the body pool's size), so the parser's and the
        // job's threads are running and nothing is kept for the large one.
        let warm = post(bulk(4, 1 << 12)).await.unwrap();
        assert_eq!(warm.status(), 200);
        // The peak so far reset to the resident now, so only this request's counts.
        std::fs::write(format!("/proc/{}/clear_refs", child.id()), "5").unwrap();
        let resting = memory_of(child.id()).1;
        let res = post(body).await.unwrap();
        assert_eq!(res.status(), 200);
        (resting, res.bytes().await.unwrap().len() as u64)
    });
    let growth = memory_of(child.id()).0.saturating_sub(resting);
    child.kill().unwrap();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(data);
    eprintln!(
        "peak RSS growth {growth} bytes for a {size}-byte bulk body and a {answer}-byte answer \
         (constant {} bytes)",
        growth as i64 - (size + answer) as i64
    );
    assert!(
        answer >= cols * 4,
        "the privatized gradient, f32: {answer} bytes"
    );
    assert!(
        growth <= size + answer + (16 << 20),
        "peak RSS grew {growth} bytes: over the {size}-byte body, the {answer}-byte answer \
         and 16 MiB"
    );
}

/// Opens a POST to `/zk/field_add` that declares `len` body bytes and sends the first
/// few: the server admits it (charging `len`) and waits for the rest.
fn open_upload(port: u16, key: Option<&str>, len: usize) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        s,
        "POST /zk/field_add HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{auth}Content-Length: {len}\r\n\r\n{{\"field\":"
    )
    .unwrap();
    s
}

/// Polls `/metrics` until the unlabelled `series` reads `want`, so that a test asserts on
/// the state it waited for rather than sleeping; the 30 s deadline only ends a test whose
/// server never gets there.
fn wait_for_metric(port: u16, series: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = raw_get(port, "/metrics");
        let value = body.lines().find_map(|line| {
            let v = line.strip_prefix(series)?.strip_prefix(' ')?;
            v.trim().parse::<f64>().ok()
        });
        if value == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} is {value:?}, not {want}, after 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

const BODY_BYTES_IN_FLIGHT: &str = "gpu_ops_http_body_bytes_in_flight";

/// The status line and body of the answer on `s` (read to its close or 10 s).
fn answer(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut text = Vec::new();
    let _ = s.read_to_end(&mut text);
    String::from_utf8_lossy(&text).into_owned()
}

/// A body trickled slower than --min-body-rate is answered 408 and its connection
/// closed once the grace has passed (not before), and the server serves on.
#[test]
fn a_body_slower_than_the_minimum_rate_is_refused_and_closed() {
    use std::io::Write;
    let data = std::env::temp_dir().join(format!("gpu-ops-trickle-{}", std::process::id()));
    let (mut child, port) = spawn_server(
        &data,
        &["--min-body-rate", "1000", "--min-body-rate-grace", "1s"],
    );
    // Before connecting: the server's grace cannot start earlier than this.
    let started = Instant::now();
    let mut s = open_upload(port, None, 100_000);
    s.set_nonblocking(true).unwrap();
    // A byte each 200 ms: 5 bytes/s, far under 1000, until the server answers or closes
    // (the 100 000 bytes would take hours). The deadline is liveness only.
    let deadline = started + Duration::from_secs(120);
    loop {
        let mut peek = [0u8; 1];
        match s.peek(&mut peek) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            _ => break,
        }
        if s.write_all(b" ").is_err() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no answer to a 5 bytes/s body in {:?}",
            deadline - started
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    s.set_nonblocking(false).unwrap();
    let text = answer(&mut s);
    let took = started.elapsed();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_too_slow"), "{text}");
    assert!(
        took >= Duration::from_secs(1),
        "refused after {took:?}, within the 1 s grace"
    );
    assert!(closed_by(&mut s, Instant::now() + Duration::from_secs(30)));
    assert_eq!(raw_get(port, "/health/ready").0, 200);
    child.kill().unwrap();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(data);
}

/// With keys, one tenant's uploads hold at most its share of the in-flight body budget:
/// past it that tenant is refused 503 while another tenant's body is admitted.
#[test]
fn one_tenant_holds_at_most_its_share_of_the_bodies_in_flight() {
    let data = std::env::temp_dir().join(format!("gpu-ops-share-{}", std::process::id()));
    std::fs::create_dir_all(&data).unwrap();
    let keys = data.join("keys");
    std::fs::write(
        &keys,
        "aaaaaaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbbbbbb bob\n",
    )
    .unwrap();
    let mib = 1 << 20;
    let (mut child, port) = spawn_server(
        &data,
        &[
            "--api-keys-file",
            keys.to_str().unwrap(),
            "--max-body-bytes",
            &mib.to_string(),
            "--max-inflight-body-bytes",
            &(4 * mib).to_string(),
            "--max-tenant-inflight-body-percent",
            "50",
        ],
    );
    let alice = Some("aaaaaaaaaaaaaaaaaaaa");
    // Two of alice's 1 MiB uploads, held open: her 2 MiB share of the 4 MiB budget.
    let held: Vec<_> = (0..2).map(|_| open_upload(port, alice, mib)).collect();
    wait_for_metric(port, BODY_BYTES_IN_FLIGHT, (2 * mib) as f64);
    let small = br#"{"field":"goldilocks","a":["1"],"b":["2"]}"#;
    let post = |key: &str| {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "POST /zk/field_add HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAuthorization: Bearer {key}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            small.len()
        )
        .unwrap();
        s.write_all(small).unwrap();
        answer(&mut s)
    };
    let refused = post("aaaaaaaaaaaaaaaaaaaa");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("body_budget_exhausted") && refused.contains("share"),
        "{refused}"
    );
    let served = post("bbbbbbbbbbbbbbbbbbbb");
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    // Her share comes back with her uploads.
    drop(held);
    wait_for_metric(port, BODY_BYTES_IN_FLIGHT, 0.0);
    let after = post("aaaaaaaaaaaaaaaaaaaa");
    assert!(after.starts_with("HTTP/1.1 200"), "{after}");
    child.kill().unwrap();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(data);
}

/// A body declared longer than --max-body-bytes is answered 413 at once, unread and
/// uncharged: the server does not wait for bytes it would refuse.
#[test]
fn a_body_declared_over_the_limit_is_refused_before_it_is_sent() {
    let data = std::env::temp_dir().join(format!("gpu-ops-declared-{}", std::process::id()));
    let (mut child, port) = spawn_server(&data, &["--max-body-bytes", "4096"]);
    // The body is never sent: a server that read it before refusing would answer only
    // when it gave up waiting (408 `body_too_slow` after --body-idle-timeout), so a 413
    // is the answer given unread.
    let mut s = open_upload(port, None, 100_000);
    let text = answer(&mut s);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("payload_too_large"), "{text}");
    child.kill().unwrap();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(data);
}

/// An `iq_raw` job whose samples are large holds only what --dataset-memory-mib pays
/// for: one sample here is charged 20 MB (360 000 complex samples per recording, four
/// recordings kept, the waveform and the spectra), so a 48 MiB budget runs batches of
/// two where the two dataset threads would otherwise take eight. Measured (debug build,
/// 2-core machine, 2026-11-28): 44.3 MB of peak growth with the 48 MiB budget, 106.7 MB
/// with 1024 MiB (batches of eight). Requests are answered throughout.
#[cfg(target_os = "linux")]
#[test]
fn an_iq_raw_job_stays_within_the_dataset_memory_budget() {
    let budget_mib = 48u64;
    let data = std::env::temp_dir().join(format!("gpu-ops-dsmem-{}", std::process::id()));
    let (mut child, port) = spawn_server(
        &data,
        &[
            "--cpu-threads",
            "2",
            "--dataset-memory-mib",
            &budget_mib.to_string(),
        ],
    );
    let base = format!("http://127.0.0.1:{port}");
    let job = |seed: u64, n: u64| {
        serde_json::json!({
            "name": "large samples", "num_samples": n, "dataset_type": "iq_raw", "seed": seed,
            "config": {
                "signal": {"duration_ms": 1800},
                "chunk_ms": 50,
                "geometry": {"receivers_min": 4, "receivers_max": 4},
                "quality": {"min_receivers": 1, "min_snr_db": -50, "max_gdop": 1e9}
            }
        })
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (growth, answered) = rt.block_on(async {
        let client = reqwest::Client::new();
        let run = |body: serde_json::Value| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let res = client
                    .post(format!("{base}/datasets/synthetic"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(res.status(), 202);
                let id = res.json::<serde_json::Value>().await.unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string();
                id
            }
        };
        let status = |id: String| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let v: serde_json::Value = client
                    .get(format!("{base}/datasets/{id}"))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                v["status"].as_str().unwrap().to_string()
            }
        };
        let deadline = Instant::now() + Duration::from_secs(300);
        let resting = memory_of(child.id()).1;
        let id = run(job(2, 8)).await;
        let mut answered = 0;
        loop {
            let s = status(id.clone()).await;
            if s == "completed" {
                break;
            }
            assert!(matches!(s.as_str(), "queued" | "running"), "{s}");
            assert!(Instant::now() < deadline, "the job never completed");
            // A well-behaved client is served while the job runs.
            let res = client
                .post(format!("{base}/zk/field_add"))
                .json(&serde_json::json!({"field": "goldilocks", "a": ["1"], "b": ["2"]}))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            answered += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (memory_of(child.id()).0.saturating_sub(resting), answered)
    });
    child.kill().unwrap();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(data);
    eprintln!(
        "peak RSS growth {growth} bytes for an iq_raw job under a {budget_mib} MiB budget \
         ({answered} requests answered meanwhile)"
    );
    let bound = (budget_mib + 8) << 20;
    assert!(
        growth <= bound,
        "peak RSS grew {growth} bytes running the job: over the {budget_mib} MiB budget and 8 MiB"
    );
}

/// A body's parsed values are charged against --max-inflight-body-bytes on top of the
/// body: 120 000 one-number rows are a 480 kB body and 960 kB of values. Beside a held
/// 1 MiB upload, the 2 MiB budget takes the body but not its values (503, counted as
/// `decoded`); alone it takes both; under a 1 MiB budget the two never fit (413).
#[test]
fn a_body_is_charged_for_its_parsed_values_too() {
    let mut body =
        br#"{"clip_norm": 1.0, "noise_multiplier": 1.0, "per_example_gradients": ["#.to_vec();
    for i in 0..120_000 {
        body.extend_from_slice(if i == 0 { b"[0]" } else { b",[0]" });
    }
    body.extend_from_slice(b"]}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let post = |port: u16| {
        rt.block_on(async {
            let res = reqwest::Client::new()
                .post(format!("http://127.0.0.1:{port}/dp/privatize"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            (status, res.text().await.unwrap())
        })
    };
    let data = std::env::temp_dir().join(format!("gpu-ops-decoded-{}", std::process::id()));
    let max_body = (1u64 << 20).to_string();
    let (mut child, port) = spawn_server(
        &data,
        &[
            "--max-body-bytes",
            &max_body,
            "--max-inflight-body-bytes",
            &(2u64 << 20).to_string(),
        ],
    );
    let held = open_upload(port, None, 1 << 20);
    wait_for_metric(port, BODY_BYTES_IN_FLIGHT, f64::from(1u32 << 20));
    let (status, text) = post(port);
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains("body_budget_exhausted") && text.contains("once parsed"),
        "{text}"
    );
    drop(held);
    wait_for_metric(port, BODY_BYTES_IN_FLIGHT, 0.0);
    let (status, text) = post(port);
    assert_eq!(status, 200, "{text}");
    let metrics = raw_get(port, "/metrics").1;
    assert!(
        metrics.contains("gpu_ops_http_bodies_refused_total{reason=\"decoded\"} 1"),
        "{metrics}"
    );
    child.kill().unwrap();
    let _ = child.wait();
    let (mut child, port) = spawn_server(
        &data,
        &[
            "--max-body-bytes",
            &max_body,
            "--max-inflight-body-bytes",
            &max_body,
        ],
    );
    let (status, text) = post(port);
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains("payload_too_large") && text.contains("once parsed"),
        "{text}"
    );
    child.kill().unwrap();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(data);
}
