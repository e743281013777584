//! Service behaviour over a real socket: system endpoints, overload, deadlines,
//! cancellation, auth, panics, metrics, OpenAPI drift and graceful shutdown.

use crate::common;

use common::{problem, settings, TestServer};
use serde_json::{json, Value};
use std::time::Duration;

fn small_job() -> Value {
    json!({"field": "goldilocks", "a": ["1"], "b": ["2"]})
}

#[tokio::test]
async fn system_endpoints_answer() {
    let s = TestServer::start(&[]).await;
    assert_eq!(
        s.get("/health/live").await.json::<Value>().await.unwrap()["status"],
        "live"
    );
    assert_eq!(
        s.get("/health/ready").await.json::<Value>().await.unwrap()["status"],
        "ready"
    );
    let device: Value = s.get("/device").await.json().await.unwrap();
    assert_eq!(device["backend"], "cpu");
    assert_eq!(device["mode"], "cpu");
    assert_eq!(device["cpu"]["threads"], 2);
    assert!(device["reason"].as_str().unwrap().contains("--backend cpu"));
    assert_eq!(device["gpus"], json!([]));
    let spec: Value = s.get("/api-doc/openapi.json").await.json().await.unwrap();
    assert!(spec["paths"]["/zk/field_add"]["post"]["operationId"] == "field_add");
    let docs = s.get("/docs/").await;
    assert_eq!(docs.status(), 200);
    assert!(docs.text().await.unwrap().contains("swagger"));
    let res = s.get("/health/live").await;
    assert!(res.headers().contains_key("x-request-id"));
    assert_eq!(device["hip"]["reason"], "HIP not probed: --backend cpu");
}

/// Without an AMD GPU (every test machine), `/device` says why HIP runs nothing: no
/// runtime found (most machines), or one without a device (CI, which installs Debian's
/// ROCm for the compile check); the ops run on the CPU.
#[tokio::test]
async fn device_says_why_no_amd_gpu_runs_work() {
    let s = TestServer::start(&["--backend", "auto"]).await;
    let device: Value = s.get("/device").await.json().await.unwrap();
    let hip = &device["hip"];
    assert_eq!(hip["devices"], 0, "{hip}");
    let reason = hip["reason"].as_str().unwrap();
    match hip["runtime"].as_str() {
        None => assert!(
            reason.starts_with("no HIP runtime")
                || reason.starts_with("no hipRTC")
                || reason.contains("lacks"),
            "{reason}"
        ),
        Some(runtime) => {
            assert!(runtime.contains("libamdhip64"), "{runtime}");
            assert!(reason.contains("reports no AMD GPU"), "{reason}");
        }
    }
    // Without a CUDA device too (every CI machine), the ops run on the CPU.
    if device["gpus"] == json!([]) {
        assert_eq!(device["backend"], "cpu");
        let res = s
            .post(
                "/zk/field_add",
                json!({"field": "goldilocks", "a": ["1"], "b": ["2"]}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["x-backend"], "cpu");
    }
}

#[tokio::test]
async fn a_client_request_id_is_echoed() {
    let s = TestServer::start(&[]).await;
    let res = s
        .post("/zk/field_add", small_job())
        .header("x-request-id", "trace-me-42")
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["x-request-id"], "trace-me-42");
    let res = s
        .client
        .get(format!("{}/missing", s.url))
        .header("x-request-id", "trace-me-43")
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(res, 404, "not_found").await["request_id"],
        "trace-me-43"
    );
}

#[tokio::test]
async fn in_process_oneshot_uses_the_same_router() {
    use tower::ServiceExt;
    let s = TestServer::start(&[]).await;
    let router = gpu_ops::api::router(s.state.clone());
    let req = axum::http::Request::post("/zk/field_mul")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            r#"{"field":"goldilocks","a":["4"],"b":["5"]}"#,
        ))
        .unwrap();
    let res = router.oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let body = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["result"],
        json!(["20"])
    );
}

#[tokio::test]
async fn bodies_past_the_in_flight_budget_get_503_with_retry_after() {
    let s = TestServer::start(&[
        "--max-body-bytes",
        "1048576",
        "--max-inflight-body-bytes",
        "2097152",
        "--body-idle-timeout",
        "1s",
    ])
    .await;
    let gauge = "gpu_ops_http_body_bytes_in_flight";
    // Two uploads announce 1 MiB each and stall after a few bytes: the budget is spent.
    let addr = s.url.trim_start_matches("http://").to_string();
    let mut stalled = Vec::new();
    for _ in 0..2 {
        stalled.push(stall(&addr, "content-length: 1048576\r\n\r\n{\"field\":").await);
    }
    assert_eq!(s.wait_for_metric(gauge, 2097152.0).await, 2097152.0);

    // Any further body, however small, is refused before it is read.
    let res = s.post("/zk/field_add", small_job()).send().await.unwrap();
    assert_eq!(res.headers()["retry-after"], "1");
    let p = problem(res, 503, "body_budget_exhausted").await;
    assert!(p["detail"].as_str().unwrap().contains("2097152"), "{p}");
    // Requests without a body are not charged.
    assert_eq!(s.get("/health/live").await.status(), 200);

    // The stalled uploads time out (--body-idle-timeout), their clients still
    // connected: their charge comes back.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.metric(gauge).await != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "stalled uploads kept the budget"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(stalled);
    let res = s.post("/zk/field_add", small_job()).send().await.unwrap();
    assert_eq!(res.json::<Value>().await.unwrap()["result"], json!(["3"]));

    // A streamed body without a length is charged --max-body-bytes: two fit, not three.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        stalled.push(stall(&addr, "transfer-encoding: chunked\r\n\r\n1\r\n{\r\n").await);
    }
    assert_eq!(s.wait_for_metric(gauge, 2097152.0).await, 2097152.0);
    problem(
        s.post("/zk/field_add", small_job()).send().await.unwrap(),
        503,
        "body_budget_exhausted",
    )
    .await;
    // Clients that leave return their charge at once.
    drop(stalled);
    assert_eq!(s.wait_for_metric(gauge, 0.0).await, 0.0);

    // A declared length over --max-body-bytes is a 413, never a budget refusal.
    let mut big = Vec::new();
    for _ in 0..2 {
        big.push(stall(&addr, "content-length: 1048576\r\n\r\n{").await);
    }
    assert_eq!(s.wait_for_metric(gauge, 2097152.0).await, 2097152.0);
    let huge = stall(&addr, "content-length: 2000000\r\n\r\n{").await;
    let (mut rx, mut tx) = huge.into_split();
    // The rest of the body; the server stops reading past --max-body-bytes.
    tokio::spawn(async move {
        let _ = tokio::io::AsyncWriteExt::write_all(&mut tx, &vec![b'1'; 1_999_999]).await;
    });
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read(&mut rx, &mut answer),
    )
    .await
    .expect("an answer")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
}

/// A connection that sends a request head and the start of its body, then waits.
async fn stall(addr: &str, body_headers_and_start: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /zk/field_add HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{body_headers_and_start}"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp
}

#[tokio::test]
async fn queue_full_returns_503_with_retry_after() {
    let s = TestServer::start(&["--queue-capacity", "1", "--cpu-threads", "1"]).await;
    s.state.pool.pause();
    // The one worker holds one job and the queue holds one more (both counted in the
    // queue's depth while the pool is paused); the next is refused.
    let mut accepted = Vec::new();
    for depth in [1.0, 2.0] {
        accepted.push(tokio::spawn(s.post("/zk/field_add", small_job()).send()));
        assert_eq!(s.wait_for_metric("gpu_ops_queue_depth", depth).await, depth);
    }
    let res = s.post("/zk/field_add", small_job()).send().await.unwrap();
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    problem(res, 503, "queue_full").await;
    assert_eq!(accepted.len(), 2);
    assert_eq!(s.metric("gpu_ops_queue_capacity").await, 1.0);
    s.state.pool.resume();
    for p in accepted {
        assert_eq!(
            p.await.unwrap().unwrap().status(),
            200,
            "held jobs complete after resume"
        );
    }
}

#[tokio::test]
async fn a_job_whose_deadline_passes_in_the_queue_gets_504_and_never_runs() {
    let s = TestServer::start(&[]).await;
    s.state.pool.pause();
    let mut body = small_job();
    body["timeout_ms"] = json!(100);
    let res = s.post("/zk/field_add", body).send().await.unwrap();
    problem(res, 504, "deadline_exceeded").await;
    s.state.pool.resume();
    let expired = r#"gpu_ops_jobs_total{backend="none",op="field_add",outcome="expired"}"#;
    assert_eq!(s.wait_for_metric(expired, 1.0).await, 1.0);
    assert_eq!(
        s.metric(r#"gpu_ops_jobs_total{backend="cpu",op="field_add",outcome="ok"}"#)
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_its_queued_job() {
    let s = TestServer::start(&[]).await;
    s.state.pool.pause();
    let request = tokio::spawn(s.post("/zk/field_mul", small_job()).send());
    // The job is held by the paused worker; then the client goes away (its connection
    // dropped with the aborted task), and the server lets go of the request.
    assert_eq!(s.wait_for_metric("gpu_ops_queue_depth", 1.0).await, 1.0);
    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    let in_flight = "gpu_ops_http_body_bytes_in_flight";
    assert_eq!(s.wait_for_metric(in_flight, 0.0).await, 0.0);
    s.state.pool.resume();
    let cancelled = r#"gpu_ops_jobs_total{backend="none",op="field_mul",outcome="cancelled"}"#;
    assert_eq!(s.wait_for_metric(cancelled, 1.0).await, 1.0);
}

/// One tenant past its rate is answered 429 with Retry-After and counted; another tenant,
/// and the open routes, are not held back by it.
#[tokio::test]
async fn a_tenant_past_its_rate_gets_429_while_another_is_served() {
    let dir = std::env::temp_dir().join(format!("gpu-ops-rate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(
        &keys,
        "aaaaaaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbbbbbb bob\n",
    )
    .unwrap();
    let s = TestServer::start(&[
        "--api-keys-file",
        keys.to_str().unwrap(),
        "--tenant-requests-per-second",
        "0.1",
        "--tenant-burst",
        "2",
    ])
    .await;
    let call = |key: &'static str| s.post("/zk/field_add", small_job()).bearer_auth(key).send();
    for _ in 0..2 {
        assert_eq!(call("aaaaaaaaaaaaaaaaaaaa").await.unwrap().status(), 200);
    }
    let res = call("aaaaaaaaaaaaaaaaaaaa").await.unwrap();
    let wait: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // A token every 10 s: the third call waits most of that.
    assert!((1..=10).contains(&wait), "Retry-After {wait}");
    problem(res, 429, "tenant_rate_limited").await;
    assert_eq!(call("bbbbbbbbbbbbbbbbbbbb").await.unwrap().status(), 200);
    for open in ["/health/ready", "/device"] {
        assert_eq!(s.get(open).await.status(), 200, "{open}");
    }
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics
            .contains(r#"gpu_ops_tenant_requests_refused_total{reason="rate",tenant="alice"} 1"#),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("tenant_requests"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn api_keys_guard_the_api_but_not_health_metrics_or_docs() {
    let dir = std::env::temp_dir().join(format!("gpu-ops-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, "0123456789abcdef0123 alice\n").unwrap();
    let s = TestServer::start(&["--api-keys-file", keys.to_str().unwrap()]).await;
    let res = s.post("/zk/field_add", small_job()).send().await.unwrap();
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
    problem(res, 401, "unauthorized").await;
    let res = s
        .post("/zk/field_add", small_job())
        .bearer_auth("wrong-key-wrong-key")
        .send()
        .await
        .unwrap();
    problem(res, 401, "unauthorized").await;
    let res = s
        .post("/zk/field_add", small_job())
        .bearer_auth("0123456789abcdef0123")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    for open in [
        "/health/live",
        "/health/ready",
        "/metrics",
        "/device",
        "/api-doc/openapi.json",
    ] {
        assert_eq!(s.get(open).await.status(), 200, "{open}");
    }
    let device: serde_json::Value = s.get("/device").await.json().await.unwrap();
    assert_eq!(device["authentication"], "api_keys");
    assert_eq!(device["warnings"], serde_json::json!([]));
    // A cached bandwidth report is open; a measurement, which leases every device, is not.
    let refresh = format!("{}/device/bandwidth?refresh=true", s.url);
    let res = s.client.get(&refresh).send().await.unwrap();
    problem(res, 401, "unauthorized").await;
    let res = s.client.get(&refresh).bearer_auth("0123456789abcdef0123");
    assert_eq!(res.send().await.unwrap().status(), 200);
    assert_eq!(s.get("/device/bandwidth").await.status(), 200);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_loopback_server_without_keys_says_so_on_device() {
    let s = TestServer::start(&[]).await;
    let device: serde_json::Value = s.get("/device").await.json().await.unwrap();
    assert_eq!(device["authentication"], "loopback_only");
    assert_eq!(device["warnings"], serde_json::json!([]));
}

#[tokio::test]
async fn a_panicking_handler_gets_a_500_problem_and_the_server_keeps_serving() {
    let s = TestServer::start_with(settings(&[]), |r| {
        r.route(
            "/test/panic",
            axum::routing::get(|| async { panic!("deliberate") as &'static str }),
        )
    })
    .await;
    problem(s.get("/test/panic").await, 500, "internal").await;
    assert_eq!(
        s.post("/zk/field_add", small_job())
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

/// A fresh BFV ciphertext of the smallest set, base64 in the crate's format.
fn he_ciphertext() -> String {
    use base64::Engine;
    use fhe::bfv::{Encoding, Plaintext, PublicKey, SecretKey};
    use fhe_traits::{FheEncoder, FheEncrypter, Serialize};
    let par = gpu_ops::ops::he::ParameterSet::Bfv128N4096.parameters();
    let mut rng = rand::rng();
    let pk = PublicKey::new(&SecretKey::random(&par, &mut rng), &mut rng);
    let pt = Plaintext::try_encode(&[1u64, 2, 3], Encoding::simd(), &par).unwrap();
    let ct = pk.try_encrypt(&pt, &mut rng).unwrap();
    base64::engine::general_purpose::STANDARD.encode(ct.to_bytes())
}

#[tokio::test]
async fn metric_names_are_present_after_traffic() {
    let s = TestServer::start(&[]).await;
    assert_eq!(
        s.post("/zk/field_add", small_job())
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let budget: serde_json::Value = s
        .post(
            "/dp/budgets",
            serde_json::json!({"epsilon_limit": 5.0, "delta": 1e-5}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let release = serde_json::json!({"values": [1.0], "sensitivity": 1.0, "epsilon": 1.0,
        "delta": 1e-5, "budget_id": budget["id"]});
    let res = s.post("/dp/gaussian", release).send().await.unwrap();
    assert_eq!(res.status(), 200);
    // A combine with a share beyond the threshold counts a share check.
    let split: serde_json::Value = s
        .post(
            "/mpc/shamir/split",
            serde_json::json!({"field": "babybear", "secrets": ["5"], "threshold": 2, "share_count": 3}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let combine =
        serde_json::json!({"field": "babybear", "threshold": 2, "shares": split["shares"]});
    let res = s.post("/mpc/shamir/combine", combine).send().await.unwrap();
    assert_eq!(res.status(), 200);
    // A secure-aggregation round opened, and one client registered in it.
    let round: serde_json::Value = s
        .post(
            "/secagg/rounds",
            serde_json::json!({"clients": 3, "threshold": 2, "vector_length": 1, "clip": 1.0}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=";
    let res = s
        .post(
            &format!("/secagg/rounds/{}/keys", round["id"].as_str().unwrap()),
            serde_json::json!({"share_key": key, "mask_key": key}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    // Two ciphertexts (under a key made here: the server is not in dealer mode) summed.
    let ciphertext = he_ciphertext();
    let res = s
        .post(
            "/he/aggregate",
            serde_json::json!({"parameters": "bfv128_n4096", "ciphertexts": [ciphertext, ciphertext]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let text = s.metrics().await;
    // GPU gauges only exist where NVML does; everything else must be exported here.
    for (name, _) in gpu_ops::metrics::NAMES.iter().filter(|(n, _)| {
        !n.starts_with("gpu_ops_gpu_")
            && *n != "gpu_ops_device_healthy"
            // A device job makes these (tests/device/device_faults.rs).
            && *n != "gpu_ops_device_jobs_running"
            && *n != "gpu_ops_device_lease_waits_total"
            && *n != "gpu_ops_device_copy_bytes_total"
            && *n != "gpu_ops_staging_fallbacks_total"
            && *n != "gpu_ops_fallbacks_total"
            // So do these (tests/device/resident_arrays.rs).
            && *n != "gpu_ops_device_cache_bytes"
            && *n != "gpu_ops_device_cache_total"
            // A device's self-test and shadow checks make these (tests/device/device_faults.rs).
            && *n != "gpu_ops_kernel_verified"
            && *n != "gpu_ops_shadow_checks_total"
            // Batches run by default only while a GPU is in service.
            && *n != "gpu_ops_batch_size"
            // Only a tenant past its limits makes it (a_tenant_past_its_rate_gets_429_…).
            && *n != "gpu_ops_tenant_requests_refused_total"
    }) {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    assert!(text.contains(
        r#"gpu_ops_http_requests_total{method="POST",route="/zk/field_add",status="200"} 1"#
    ));
    assert!(text.contains(r#"gpu_ops_jobs_total{backend="cpu",op="field_add",outcome="ok"} 1"#));
    assert!(text.contains(r#"gpu_ops_processed_elements_total{backend="cpu",op="field_add"} 1"#));
}

#[tokio::test]
async fn openapi_document_matches_the_committed_file() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
            .unwrap_or_default();
    let generated = gpu_ops::api::openapi_json();
    assert!(
        committed == generated,
        "openapi/openapi.json is stale: run `cargo run -- openapi > openapi/openapi.json` and commit it"
    );
    let spec: Value = serde_json::from_str(&generated).unwrap();
    for (path, id) in [
        ("/zk/field_add", "field_add"),
        ("/zk/field_sub", "field_sub"),
        ("/zk/field_mul", "field_mul"),
    ] {
        assert_eq!(spec["paths"][path]["post"]["operationId"], id);
    }
    for (path, id) in [
        ("/health/live", "health_live"),
        ("/health/ready", "health_ready"),
        ("/device", "device_info"),
        ("/metrics", "metrics"),
    ] {
        assert_eq!(spec["paths"][path]["get"]["operationId"], id);
    }
}

/// Polls `done` every 10 ms until it holds; panics naming `what` after `limit`, a
/// liveness deadline for a state that must come, not a bound on how soon.
async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn graceful_shutdown_drains_an_in_flight_job() {
    // A grace far past the liveness deadline below: the server stops because it drained,
    // never because the grace ran out.
    let mut s = TestServer::start(&["--shutdown-grace", "10m"]).await;
    s.state.pool.pause();
    let in_flight = tokio::spawn(s.post("/zk/field_mul", small_job()).send());
    // The server has the request: its body is admitted and not yet answered. Past that
    // point shutdown lets it finish (the pool closes only once every connection is done).
    let held = &s.state.metrics.http_body_bytes_in_flight;
    wait_until(
        "the request reached the server",
        Duration::from_secs(30),
        || held.get() > 0,
    )
    .await;
    s.trigger_shutdown();
    wait_until("shutdown began", Duration::from_secs(30), || {
        s.state.is_shutting_down()
    })
    .await;
    // The server accepts nothing more: shutdown is past its listener, waiting on the
    // connection.
    let addr = s.url.trim_start_matches("http://").to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(&addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still accepting 30 s into shutdown"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The paused pool holds the job through the shutdown; it has not finished, and the
    // server has not stopped without it.
    assert!(!in_flight.is_finished());
    assert!(
        !s.handle.as_ref().unwrap().is_finished(),
        "the server stopped with a job in flight"
    );
    s.state.pool.resume();
    let res = in_flight.await.unwrap().unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["result"], json!(["2"]));
    let served = tokio::time::timeout(Duration::from_secs(60), s.handle.take().unwrap()).await;
    assert!(served
        .expect("server stopped once drained")
        .unwrap()
        .is_ok());
}

#[test]
fn readme_lists_every_error_code_metric_and_alert() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for (code, _, _) in gpu_ops::api::problem::ERROR_CODES {
        assert!(
            readme.contains(&format!("`{code}`")),
            "README lacks error code {code}"
        );
    }
    for (name, _) in gpu_ops::metrics::NAMES {
        assert!(readme.contains(name), "README lacks metric {name}");
    }
    // Every shipped alert rule has its row in the README's alert table.
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/prometheus/rules/gpu-ops.yml"
    ))
    .unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 8, "{alerts:?}");
    for alert in alerts {
        assert!(
            readme.contains(&format!("| `{alert}` |")),
            "README's alert table lacks {alert}"
        );
    }
}
