//! The device's own measurements. `GET /device/batch_hint`: the batch that fits the device
//! the op would run on (the emulated device under a memory limit, or the CPU), capped by
//! the request limits, and each refusal with its path. `GET /device/bandwidth`: every
//! copy measured, cached until a refresh (at most one per --bandwidth-min-refresh).

use crate::common;

use common::{problem, TestServer};
use serde_json::Value;

async fn hint(s: &TestServer, query: &str) -> reqwest::Response {
    s.get(&format!("/device/batch_hint?{query}")).await
}

/// A hint that must be answered, as JSON.
async fn hint_json(s: &TestServer, query: &str) -> Value {
    let res = hint(s, query).await;
    assert_eq!(res.status(), 200, "{query}");
    res.json().await.unwrap()
}

#[tokio::test]
async fn the_hint_follows_the_device_budget_and_the_request_limits() {
    // The emulated device with a 1 MiB budget: a 64³ product holds A, B and D, 3 × 4096
    // f32 values (48 KiB) per batch entry, so 21 fit.
    let s = TestServer::start(&[
        "--backend",
        "auto",
        "--emulate-device",
        "--gpu-memory-limit-mib",
        "1",
    ])
    .await;
    let res = hint(&s, "op=matmul&shape=64,64,64").await;
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["device"], "emulated:0", "{body}");
    assert_eq!(body["memory_budget_bytes"], 1 << 20);
    assert_eq!(body["bytes_per_item"], 3 * 4096 * 4);
    assert_eq!(body["fits"], 21);
    assert_eq!(body["batch"], 21, "{body}");
    // A 256³ product needs 768 KiB: one fits. 512³ needs 3 MiB: none.
    let body: Value = hint_json(&s, "op=matmul&shape=256,256,256").await;
    assert_eq!(body["batch"], 1, "{body}");
    let body: Value = hint_json(&s, "op=matmul&shape=512,512,512").await;
    assert_eq!(
        (body["fits"].as_u64(), body["batch"].as_u64()),
        (Some(0), Some(0)),
        "{body}"
    );
    // Attention, H = 2, S = 32, D = 16: Q, K, V, O (2·32·16 each) and 64 log-sum-exps,
    // plus the key length: 4·(64·33 + 64·32) + 4 bytes.
    let body: Value = hint_json(&s, "op=attention&shape=2,32,16").await;
    assert_eq!(
        body["bytes_per_item"],
        4 * (64 * 33 + 64 * 32) + 4,
        "{body}"
    );
    assert_eq!(body["fits"], (1u64 << 20) / (4 * (64 * 33 + 64 * 32) + 4));
    // A beam sweep, 16 transmit and 4 receive elements, 32 × 8 beams: the channel
    // (2·4·16), its projections (2·4·32), the powers (8·32) and 3 words, in f64.
    let body: Value = hint_json(&s, "op=beam_sweep&shape=16,4,32,8").await;
    let per = 8 * (2 * 4 * 16 + 2 * 4 * 32 + 8 * 32 + 3);
    assert_eq!(body["bytes_per_item"], per, "{body}");
    assert_eq!(body["fits"], (1u64 << 20) / per);
    // conv2d, 3 × 32 × 32 images, 8 filters of 3 × 3, stride 1, padding 1: the image and
    // its 8 × 32 × 32 output per item; the weights (8·3·9) and one image's im2col matrix
    // (27 × 1024) held whatever the batch. Images go through one at a time, so once one
    // fits, the request limits decide the batch.
    let body: Value = hint_json(&s, "op=conv2d&shape=3,32,32,8,3,3,1,1,1").await;
    assert_eq!(body["bytes_per_item"], 4 * (3 * 1024 + 8 * 1024), "{body}");
    assert_eq!(body["fixed_bytes"], 4 * (8 * 27 + 27 * 1024), "{body}");
    assert_eq!(body["fits"], body["max_per_request"], "{body}");
    assert_eq!(body["batch"], body["max_per_request"], "{body}");
    // A 64-channel 256 × 256 image with 128 filters of 5 × 5: its im2col matrix alone
    // (1600 × 65536 f32, 400 MiB) is over the budget, so nothing fits.
    let body: Value = hint_json(&s, "op=conv2d&shape=64,256,256,128,5,5,1,2,1").await;
    assert_eq!(
        (body["fits"].as_u64(), body["batch"].as_u64()),
        (Some(0), Some(0)),
        "{body}"
    );
    // Lookups in a 1000 × 64 table: the table (256,000 bytes) waits in the device's
    // cache; each id holds itself and its row.
    let body: Value = hint_json(&s, "op=embedding_lookup&shape=1000,64").await;
    assert_eq!(body["fixed_bytes"], 256_000, "{body}");
    assert_eq!(body["bytes_per_item"], 4 + 4 * 64, "{body}");
    assert_eq!(
        body["fits"],
        ((1u64 << 20) - 256_000) / (4 + 4 * 64),
        "{body}"
    );
}

#[tokio::test]
async fn on_the_cpu_the_request_limits_cap_the_hint() {
    let s = TestServer::start(&["--max-tensor-elements", "100000"]).await;
    let body: Value = hint_json(&s, "op=matmul&shape=100,10,100").await;
    assert_eq!(body["device"], "cpu", "{body}");
    // A holds 10^4 values per entry: 10 entries reach --max-tensor-elements.
    assert_eq!(body["max_per_request"], 10, "{body}");
    assert_eq!(body["bytes_per_item"], 3 * 4 * (1000 + 1000 + 10000));
    assert_eq!(body["batch"], 10, "{body}");
    let body: Value = hint_json(&s, "op=attention&shape=4,2,16,40,8,8").await;
    assert_eq!(body["shape"], serde_json::json!([4, 2, 16, 40, 8, 8]));
    // The output, 4·16·8 = 512 values, and K and V, 2·40·8 = 640 each, per sequence.
    assert_eq!(body["max_per_request"], 100000 / 640, "{body}");
}

#[tokio::test]
async fn bad_queries_are_refused_with_their_path() {
    let s = TestServer::start(&[]).await;
    for (query, code, path) in [
        ("op=fft&shape=1,2,3", "invalid_parameter", "/op"),
        ("shape=1,2,3", "invalid_parameter", "/op"),
        ("op=matmul&shape=1,0,3", "invalid_parameter", "/shape"),
        ("op=matmul&shape=1,x,3", "invalid_parameter", "/shape"),
        ("op=matmul&shape=1,2", "invalid_parameter", "/shape"),
        (
            "op=matmul&shape=16777216,16777216,16777216",
            "invalid_parameter",
            "/shape",
        ),
        (
            "op=attention&shape=3,2,8,8,4,4",
            "invalid_parameter",
            "/shape",
        ),
        (
            "op=attention&shape=1,4294967296,1",
            "invalid_parameter",
            "/shape",
        ),
        ("op=attention&shape=1,8,257", "invalid_parameter", "/shape"),
        ("op=beam_sweep&shape=16,4,32", "invalid_parameter", "/shape"),
        ("op=conv2d&shape=3,32,32,8,3", "invalid_parameter", "/shape"),
        (
            "op=conv2d&shape=3,32,32,8,3,3,1,1,2",
            "invalid_parameter",
            "/shape",
        ),
        ("op=conv2d&shape=3,4,4,8,5,5", "invalid_parameter", "/shape"),
        (
            "op=conv2d&shape=3,32,32,8,3,3,1,1,0",
            "invalid_parameter",
            "/shape",
        ),
        (
            "op=embedding_lookup&shape=1000",
            "invalid_parameter",
            "/shape",
        ),
        (
            "op=embedding_lookup&shape=1000,0",
            "invalid_parameter",
            "/shape",
        ),
    ] {
        let p = problem(hint(&s, query).await, 422, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{query}: {p}");
    }
}

#[tokio::test]
async fn bandwidth_is_measured_once_and_cached_until_a_refresh() {
    // A refresh within --bandwidth-min-refresh of the measurement answers it: an hour
    // here, so however slow the machine, every refresh below falls within it.
    let s = TestServer::start(&[
        "--backend",
        "auto",
        "--emulate-device",
        "--bandwidth-min-refresh",
        "1h",
    ])
    .await;
    let first: Value = s.get("/device/bandwidth").await.json().await.unwrap();
    assert!(
        first["host_memcpy_gb_per_s"].as_f64().unwrap() > 0.0,
        "{first}"
    );
    assert_eq!(first["host_bytes"], 64 << 20);
    assert!(
        humantime::parse_rfc3339(first["measured_at"].as_str().unwrap()).is_ok(),
        "{first}"
    );
    let gpus = first["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1, "{first}");
    assert_eq!(gpus[0]["device"], "emulated:0");
    let bytes = gpus[0]["bytes"].as_u64().unwrap();
    assert!(bytes > 0 && bytes <= 64 << 20 && bytes % 4 == 0, "{first}");
    for copy in [
        "h2d_pageable",
        "d2h_pageable",
        "h2d_pinned",
        "d2h_pinned",
        "d2d",
    ] {
        let rate = gpus[0][format!("{copy}_gb_per_s")].as_f64().unwrap();
        assert!(rate > 0.0 && rate.is_finite(), "{copy}: {first}");
    }
    // Cached: the same figures, to the bit.
    let again: Value = s.get("/device/bandwidth").await.json().await.unwrap();
    assert_eq!(again, first);
    // A refresh within --bandwidth-min-refresh answers the cached measurement.
    let soon: Value = s
        .get("/device/bandwidth?refresh=true")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(soon, first);

    // With 0s every refresh measures anew: a later `measured_at` (microseconds; a
    // measurement is many copies long), then cached until the next refresh.
    let s0 = TestServer::start(&["--bandwidth-min-refresh", "0s"]).await;
    let at = |r: &Value| humantime::parse_rfc3339(r["measured_at"].as_str().unwrap()).unwrap();
    let before: Value = s0.get("/device/bandwidth").await.json().await.unwrap();
    let fresh: Value = s0
        .get("/device/bandwidth?refresh=true")
        .await
        .json()
        .await
        .unwrap();
    assert!(at(&fresh) > at(&before), "{before} then {fresh}");
    let cached: Value = s0.get("/device/bandwidth").await.json().await.unwrap();
    assert_eq!(cached, fresh);
    let again: Value = s0
        .get("/device/bandwidth?refresh=true")
        .await
        .json()
        .await
        .unwrap();
    assert!(at(&again) > at(&fresh), "{fresh} then {again}");

    let p = problem(
        s.get("/device/bandwidth?refresh=maybe").await,
        422,
        "invalid_parameter",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/refresh", "{p}");
}

/// `--wgpu-ops` names ops with WGSL kernels: a misspelt or unserved one stops the start
/// with the flag and the ops it takes, whatever the backend (it is checked before any
/// device is looked for).
#[tokio::test]
async fn an_unknown_wgpu_op_stops_the_start() {
    let settings = common::settings(&["--wgpu-ops", "field_mul,matmul"]);
    let err = gpu_ops::App::start(settings)
        .err()
        .expect("the start fails");
    assert!(
        err.contains("--wgpu-ops") && err.contains("\"matmul\"") && err.contains("msm"),
        "{err}"
    );
    let settings = common::settings(&["--wgpu-ops", "field_mul,msm"]);
    assert!(gpu_ops::App::start(settings).is_ok());
}
