//! `POST /embeddings/sinusoidal` over HTTP: the table and lookups, both layouts, packed
//! half precision, and each refusal with its code and path.

use crate::common;

use base64::Engine;
use common::{problem, TestServer};
use serde_json::{json, Value};

async fn sinusoidal(s: &TestServer, body: Value) -> reqwest::Response {
    s.post("/embeddings/sinusoidal", body).send().await.unwrap()
}

#[tokio::test]
async fn the_table_and_lookups_follow_the_closed_form() {
    let s = TestServer::start(&[]).await;
    let res = sinusoidal(&s, json!({"num_positions": 3, "dim": 4})).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-backend"], "cpu");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["shape"], json!([3, 4]));
    assert_eq!(body["dtype"], "f32");
    let row = |p: f64| -> Vec<f64> {
        let (a0, a1) = (p, p / 100.0); // base^(−2i/4) for i = 0, 1 with base 10^4
        vec![a0.sin(), a0.cos(), a1.sin(), a1.cos()]
            .into_iter()
            .map(|x| f64::from(x as f32))
            .collect()
    };
    assert_eq!(body["result"], json!([row(0.0), row(1.0), row(2.0)]));

    // A [B, S] lookup, split: the same values, sines first.
    let body: Value = sinusoidal(
        &s,
        json!({"positions": [[2], [0]], "dim": 4, "layout": "split"}),
    )
    .await
    .json()
    .await
    .unwrap();
    let r = row(2.0);
    assert_eq!(body["shape"], json!([2, 1, 4]));
    assert_eq!(body["result"][0][0], json!([r[0], r[2], r[1], r[3]]));
    assert_eq!(body["result"][1][0], json!([0.0, 0.0, 1.0, 1.0]));

    // Packed bf16, scale and offset: position 1 → angle (1 + 1)·0.5 = 1.
    let body: Value = sinusoidal(
        &s,
        json!({"positions": [1], "dim": 2, "scale": 0.5, "offset": 1, "out_dtype": "bf16", "encoding": "base64"}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(body["result"]["dtype"], "bf16");
    assert_eq!(body["result"]["shape"], json!([1, 2]));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(body["result"]["data"].as_str().unwrap())
        .unwrap();
    let got: Vec<f64> = bytes
        .chunks(2)
        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
        .collect();
    let want: Vec<f64> = [1f64.sin(), 1f64.cos()]
        .iter()
        .map(|&x| half::bf16::from_f64(x).to_f64())
        .collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn bad_parameters_are_refused_with_their_code_and_path() {
    let s = TestServer::start(&["--max-tensor-elements", "64"]).await;
    let cases = [
        (
            json!({"num_positions": 2, "dim": 3}),
            422,
            "invalid_parameter",
            "/dim",
        ),
        (
            json!({"num_positions": 2, "dim": 4, "base": 1}),
            422,
            "invalid_parameter",
            "/base",
        ),
        (
            json!({"num_positions": 2, "dim": 4, "scale": 0}),
            422,
            "invalid_parameter",
            "/scale",
        ),
        (
            json!({"num_positions": 0, "dim": 4}),
            422,
            "invalid_parameter",
            "/num_positions",
        ),
        (
            json!({"dim": 4}),
            422,
            "invalid_parameter",
            "/num_positions",
        ),
        (
            json!({"num_positions": 2, "positions": [1], "dim": 4}),
            422,
            "invalid_parameter",
            "/num_positions",
        ),
        (
            json!({"positions": [1, -2], "dim": 4}),
            422,
            "invalid_tensor",
            "/positions",
        ),
        (
            json!({"positions": [1.5], "dim": 4}),
            422,
            "invalid_tensor",
            "/positions",
        ),
        (
            json!({"positions": [[1], [2, 3]], "dim": 4}),
            422,
            "invalid_request",
            "/positions/1",
        ),
        (
            json!({"positions": [1], "dim": 4, "scale": 1e300}),
            422,
            "invalid_parameter",
            "/positions/0",
        ),
        (
            json!({"num_positions": 17, "dim": 4}),
            413,
            "payload_too_large",
            "/num_positions",
        ),
        (
            json!({"positions": [[1, 2, 3], [4, 5, 6]], "dim": 12}),
            413,
            "payload_too_large",
            "/positions",
        ),
    ];
    for (body, status, code, path) in cases {
        let p = problem(sinusoidal(&s, body.clone()).await, status, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{body}: {p}");
    }
    assert_eq!(
        sinusoidal(&s, json!({"num_positions": 1, "dim": 2}))
            .await
            .status(),
        200
    );
}
