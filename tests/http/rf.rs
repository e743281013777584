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
            json!({"sample_rate_hz": FS, "iq": ok}),
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
