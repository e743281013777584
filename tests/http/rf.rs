//! `POST /rf/features` over HTTP: a tone in noise and pure noise read as they should, and
//! each kind of bad input gets its problem code and path.

use crate::common;

use base64::Engine;
use common::{problem, TestServer};
use serde_json::{json, Value};
use std::f64::consts::PI;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
const FS: f64 = 200_000.0;

/// `n` samples: a tone of power `p_tone` at `f` Hz plus complex Gaussian noise of power
/// `p_noise` (Box–Muller on splitmix64), as interleaved little-endian f32 I/Q.
fn recording(n: usize, f: f64, p_tone: f64, p_noise: f64, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut uniform = move || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let (a, sigma) = (p_tone.sqrt(), (p_noise / 2.0).sqrt());
    let mut out = Vec::with_capacity(8 * n);
    for i in 0..n {
        let r = (-2.0 * uniform().max(1e-300).ln()).sqrt() * sigma;
        let th = 2.0 * PI * uniform();
        let ph = 2.0 * PI * f * i as f64 / FS;
        out.extend_from_slice(&((a * ph.cos() + r * th.cos()) as f32).to_le_bytes());
        out.extend_from_slice(&((a * ph.sin() + r * th.sin()) as f32).to_le_bytes());
    }
    out
}

#[tokio::test]
async fn a_tone_in_noise_and_pure_noise_read_as_they_should() {
    let s = TestServer::start(&[]).await;
    let tone = recording(200_000, -31_250.0, 1e-8, 1e-9, 1);
    let res = s
        .post(
            "/rf/features",
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": B64.encode(&tone), "per_chunk": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-backend"], "cpu");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["samples"], 200_000);
    assert_eq!(body["chunks"], 5);
    assert_eq!(body["samples_per_chunk"], 40_000);
    assert_eq!(body["per_chunk"].as_array().unwrap().len(), 5);
    let f = &body["features"];
    assert_eq!(f["signal_present"]["min"], 1.0);
    let offset = f["frequency_offset_hz"]["mean"].as_f64().unwrap();
    assert!((offset + 31_250.0).abs() < 50.0, "{offset}");
    let snr = f["snr_db"]["mean"].as_f64().unwrap();
    assert!((snr - 10.0 * 11f64.log10()).abs() < 0.2, "{snr}");
    let rssi = f["rssi_dbm"]["mean"].as_f64().unwrap();
    assert!((rssi - 10.0 * 1.1e-8f64.log10()).abs() < 0.05, "{rssi}");

    let noise = recording(200_000, 0.0, 0.0, 1e-9, 2);
    let body: Value = s
        .post(
            "/rf/features",
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": B64.encode(&noise), "chunk_ms": 100}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["chunks"], 10);
    assert!(body.get("per_chunk").is_none());
    let f = &body["features"];
    assert_eq!(f["signal_present"]["max"], 0.0, "{f}");
    assert!(f["snr_db"]["mean"].as_f64().unwrap().abs() < 0.15, "{f}");
    assert!((f["noise_floor_dbm"]["mean"].as_f64().unwrap() + 90.0).abs() < 0.15);
}

#[tokio::test]
async fn bad_inputs_get_their_problem_code_and_path() {
    let s = TestServer::start(&["--max-elements", "100000"]).await;
    let ok = B64.encode(recording(1000, 0.0, 0.0, 1.0, 3));
    let wide = B64.encode(recording(70_000, 0.0, 0.0, 1.0, 5));
    let mut nan = recording(1000, 0.0, 0.0, 1.0, 3);
    nan[8 * 7..8 * 7 + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let cases = [
        (
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": "%%%"}),
            422,
            "invalid_tensor",
            "/iq",
        ),
        (
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": B64.encode([0u8; 12])}),
            422,
            "invalid_tensor",
            "/iq",
        ),
        (
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": B64.encode(&nan)}),
            422,
            "invalid_tensor",
            "/iq",
        ),
        (
            json!({"sample_rate_hz": 0.0, "encoding": "base64", "iq": ok}),
            422,
            "invalid_parameter",
            "/sample_rate_hz",
        ),
        (
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": ok, "chunk_ms": 0}),
            422,
            "invalid_parameter",
            "/chunk_ms",
        ),
        (
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": ok, "chunk_ms": 0.5}),
            422,
            "invalid_parameter",
            "/chunk_ms",
        ),
        (
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": B64.encode(recording(100, 0.0, 0.0, 1.0, 4))}),
            422,
            "invalid_parameter",
            "/iq",
        ),
        (
            // 8192-point Welch segments at 4 MHz: longer than the CUDA path takes.
            json!({"sample_rate_hz": 4e6, "encoding": "base64", "iq": wide, "backend": "cuda"}),
            422,
            "invalid_parameter",
            "/backend",
        ),
        (
            json!({"sample_rate_hz": FS, "encoding": "hex", "iq": ok}),
            422,
            "invalid_request",
            "/encoding",
        ),
        (
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": B64.encode(vec![0u8; 8 * 100_001])}),
            413,
            "payload_too_large",
            "/iq",
        ),
    ];
    for (body, status, code, path) in cases {
        let res = s.post("/rf/features", body.clone()).send().await.unwrap();
        let p = problem(res, status, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{p}");
    }
    // A shape the CUDA path takes: computed there on a GPU host, refused as 503 where the
    // server has no device.
    let res = s
        .post(
            "/rf/features",
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": ok, "backend": "cuda"}),
        )
        .send()
        .await
        .unwrap();
    if res.status() == 200 {
        assert_eq!(res.headers()["x-backend"], "cuda");
    } else {
        problem(res, 503, "device_unavailable").await;
    }
    let res = s
        .post(
            "/rf/features",
            json!({"sample_rate_hz": FS, "encoding": "base64", "iq": ok}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "still serving");
}

/// `POST /rf/iq` with `format: sigmf`: every receiver's recording with its truth and SigMF
/// metadata, the same answer for the same request, and the same bits an `iq_raw` dataset of
/// that seed and config stores for that generator index.
#[tokio::test]
async fn rf_iq_gives_the_recordings_a_dataset_holds_for_its_seed_config_and_index() {
    use sha2::Digest;
    let s = TestServer::start(&[]).await;
    let mut dataset = common::small_dataset(21, 2);
    dataset["dataset_type"] = json!("iq_raw");
    let config = dataset["config"].clone();
    let res = s.post("/datasets/synthetic", dataset).send().await.unwrap();
    assert_eq!(res.status(), 202);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut status = Value::Null;
    for _ in 0..600 {
        status = s
            .get(&format!("/datasets/{id}"))
            .await
            .json()
            .await
            .unwrap();
        if status["status"] == "completed" || status["status"] == "failed" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status["status"], "completed", "{status}");
    let stored = format!("/datasets/{id}/samples/1/iq/2?format=");
    let meta: Value = s.get(&format!("{stored}meta")).await.json().await.unwrap();
    let data = s.get(&format!("{stored}data")).await.bytes().await.unwrap();
    let index = meta["global"]["gpu_ops:sample_index"].as_u64().unwrap();

    let request = json!({"config": config, "seed": 21, "sample_index": index, "format": "sigmf"});
    let res = s.post("/rf/iq", request.clone()).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-backend"], "cpu");
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        (
            &body["seed"],
            &body["sample_index"],
            &body["samples_per_recording"]
        ),
        (&json!(21), &json!(index), &json!(20_000))
    );
    assert_eq!(body["sample_rate_hz"], 200_000.0);
    let receivers = body["receivers"].as_array().unwrap();
    assert_eq!(receivers.len(), 4);
    let rx = &receivers[2];
    let iq = B64.decode(rx["iq"].as_str().unwrap()).unwrap();
    assert_eq!(iq, data, "the dataset's stored recording");
    let g = &rx["sigmf_meta"]["global"];
    let sha: String = sha2::Sha512::digest(&iq)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(g["core:sha512"], sha);
    assert_eq!(g["core:datatype"], "cf32_le");
    assert_eq!(g["gpu_ops:seed"], 21);
    assert_eq!(g["gpu_ops:receiver"], 2);
    assert!(g.get("gpu_ops:dataset_id").is_none() && g.get("gpu_ops:quality").is_none());
    for key in [
        "gpu_ops:transmitter",
        "gpu_ops:receiver_truth",
        "core:geolocation",
    ] {
        assert_eq!(g[key], meta["global"][key], "{key}");
    }
    assert_eq!(
        rx["truth"]["lat"],
        meta["global"]["gpu_ops:receiver_truth"]["lat"]
    );
    assert_eq!(
        body["transmitter"]["modulation"],
        meta["global"]["gpu_ops:transmitter"]["modulation"]
    );

    // The same request, the same answer; cf32 leaves the metadata out; the next index is
    // another sample.
    let again: Value = s
        .post("/rf/iq", request.clone())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again, body);
    let mut plain = request.clone();
    plain["format"] = json!("cf32");
    let plain: Value = s
        .post("/rf/iq", plain)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(plain["receivers"][2].get("sigmf_meta").is_none());
    assert_eq!(plain["receivers"][2]["iq"], rx["iq"]);
    let mut next = request;
    next["sample_index"] = json!(index + 1);
    let next: Value = s
        .post("/rf/iq", next)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(next["receivers"][2]["iq"], rx["iq"]);
}

#[tokio::test]
async fn rf_iq_refusals_name_their_field() {
    let s = TestServer::start(&["--max-elements", "100000"]).await;
    let small = json!({"signal": {"duration_ms": 10}, "chunk_ms": 10});
    let cases = [
        (
            // 7 receivers × 200 000 samples: past --max-elements.
            json!({"seed": 1}),
            413,
            "payload_too_large",
            "/config/signal/duration_ms",
        ),
        (
            json!({"seed": 1, "config": {"signal": {"duration_ms": -1}}}),
            422,
            "invalid_parameter",
            "/config/signal/duration_ms",
        ),
        (
            json!({"seed": 1, "config": {"geometry": {"receivers_min": 0}}}),
            422,
            "invalid_parameter",
            "/config/geometry/receivers_min",
        ),
        (
            json!({"seed": 9_223_372_036_854_775_808_u64, "config": small}),
            422,
            "invalid_parameter",
            "/seed",
        ),
        (
            json!({"seed": 1, "config": small, "sample_index": 9_223_372_036_854_775_808_u64}),
            422,
            "invalid_parameter",
            "/sample_index",
        ),
        (
            json!({"seed": 1, "config": small, "format": "wav"}),
            422,
            "invalid_request",
            "/format",
        ),
        (
            json!({"seed": 1, "config": small, "sample_index": -1}),
            422,
            "invalid_request",
            "/sample_index",
        ),
        (
            json!({"seed": 1, "config": small, "receivers": 3}),
            422,
            "invalid_request",
            "/receivers",
        ),
        (
            json!({"seed": 1, "config": small, "timeout_ms": 0}),
            422,
            "invalid_parameter",
            "/timeout_ms",
        ),
    ];
    for (body, status, code, path) in cases {
        let res = s.post("/rf/iq", body.clone()).send().await.unwrap();
        let p = problem(res, status, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{body}: {p}");
    }
    // Without a seed the server draws one and reports it; without a device `cuda` is 503.
    let res = s
        .post("/rf/iq", json!({"config": small}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert!(body["seed"].as_u64().unwrap() < 1 << 63);
    assert_eq!(body["receivers"].as_array().unwrap().len(), 7);
    let res = s
        .post(
            "/rf/iq",
            json!({"seed": 1, "config": small, "backend": "cuda"}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 503, "device_unavailable").await;
}
