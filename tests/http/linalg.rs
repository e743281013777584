//! `POST /linalg/matmul` over HTTP: nested and packed operands, batches and broadcasts,
//! half precisions, and each refusal with its code and path.

use crate::common;

use base64::Engine;
use common::{problem, TestServer};
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

async fn matmul(s: &TestServer, body: Value) -> reqwest::Response {
    s.post("/linalg/matmul", body).send().await.unwrap()
}

#[tokio::test]
async fn nested_operands_multiply_with_transposes_batches_and_c() {
    let s = TestServer::start(&[]).await;
    let res = matmul(&s, json!({"a": [[1, 2], [3, 4]], "b": [[5, 6], [7, 8]]})).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-backend"], "cpu");
    let compute_ms: f64 = res.headers()["x-compute-time-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["result"], json!([[19.0, 22.0], [43.0, 50.0]]));
    assert_eq!(body["shape"], json!([2, 2]));
    assert_eq!(body["dtype"], "f32");
    assert_eq!(body["compute"], "f32");
    assert_eq!(body["flops"], 16.0);
    // The rate is the flops over the compute time the header prints to 0.001 ms (0 where
    // the clock saw none).
    let gflops = body["gflops_per_second"].as_f64().unwrap();
    if gflops > 0.0 {
        let implied_ms = 16.0 / gflops / 1e6;
        assert!(
            (implied_ms - compute_ms).abs() <= 0.0005 + 1e-9,
            "{gflops} GFLOP/s is {implied_ms} ms of compute; the header says {compute_ms}"
        );
    } else {
        assert_eq!(compute_ms, 0.0, "{body}");
    }

    // A batch of two against a broadcast Bᵀ, plus beta·C.
    let body: Value = matmul(
        &s,
        json!({"a": [[[1, 0], [0, 1]], [[2, 0], [0, 2]]], "b": [[1, 3], [2, 4]],
               "transpose_b": true, "c": [[1, 1], [1, 1]], "alpha": 2, "beta": -1}),
    )
    .await
    .json()
    .await
    .unwrap();
    // Bᵀ = [[1, 2], [3, 4]]; D = 2·A·Bᵀ − 1.
    assert_eq!(
        body["result"],
        json!([[[1.0, 3.0], [5.0, 7.0]], [[3.0, 7.0], [11.0, 15.0]]]),
        "{body}"
    );
    assert_eq!(body["shape"], json!([2, 2, 2]));

    // f64 on the CPU keeps what f32 would lose.
    let x = 1.0 + 2f64.powi(-40);
    let body: Value = matmul(&s, json!({"a": [[x]], "b": [[1.0]], "dtype": "f64"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["result"], json!([[x]]));
    assert_eq!(body["compute"], "f64");
}

/// op(X)[r][c] of a nested matrix: X itself, or X stored transposed.
fn op(x: &[Vec<f64>], transposed: bool, r: usize, c: usize) -> f64 {
    if transposed {
        x[c][r]
    } else {
        x[r][c]
    }
}

/// Every transpose combination, on a 3×4·4×2 product in a batch of two against a
/// broadcast B, with C: the answer is held to a triple loop over explicit indices written
/// here. Small integers, so every product and sum is exact in f32 and any wrong index
/// shows.
#[tokio::test]
async fn every_transpose_combination_is_the_naive_product() {
    let s = TestServer::start(&[]).await;
    let (m, k, n) = (3usize, 4usize, 2usize);
    let entry = |salt: usize, r: usize, c: usize| ((r * 7 + c * 3 + salt * 5) % 11) as f64 - 5.0;
    let matrix = |salt: usize, rows: usize, cols: usize| -> Vec<Vec<f64>> {
        (0..rows)
            .map(|r| (0..cols).map(|c| entry(salt, r, c)).collect())
            .collect()
    };
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        // Stored as the request holds them: A is k×m when transposed, B n×k.
        let a: Vec<Vec<Vec<f64>>> = (0..2)
            .map(|e| if ta { matrix(e, k, m) } else { matrix(e, m, k) })
            .collect();
        let b = if tb { matrix(7, n, k) } else { matrix(7, k, n) };
        let c = matrix(9, m, n);
        let body = json!({"a": a, "b": b, "c": c, "alpha": 2, "beta": -1,
                          "transpose_a": ta, "transpose_b": tb});
        let res = matmul(&s, body).await;
        assert_eq!(res.status(), 200, "ta={ta} tb={tb}");
        let got: Value = res.json().await.unwrap();
        assert_eq!(got["shape"], json!([2, m, n]), "ta={ta} tb={tb}");
        for (e, a) in a.iter().enumerate() {
            for i in 0..m {
                for j in 0..n {
                    let sum: f64 = (0..k).map(|p| op(a, ta, i, p) * op(&b, tb, p, j)).sum();
                    let want = 2.0 * sum - c[i][j];
                    assert_eq!(
                        got["result"][e][i][j].as_f64(),
                        Some(want),
                        "ta={ta} tb={tb} D[{e}][{i}][{j}]: {got}"
                    );
                }
            }
        }
    }
}

#[tokio::test]
async fn packed_half_precision_operands_answer_packed() {
    let s = TestServer::start(&[]).await;
    let pack = |values: &[f32]| {
        B64.encode(
            values
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect::<Vec<u8>>(),
        )
    };
    let a = json!({"encoding": "base64", "dtype": "f16", "shape": [1, 3], "data": pack(&[1.0, 2.0, 0.5])});
    let b = json!({"encoding": "base64", "dtype": "f16", "shape": [3, 1], "data": pack(&[4.0, 0.25, -2.0])});
    let res = matmul(&s, json!({"a": a, "b": b, "compute": "f16"})).await;
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["dtype"], "f16");
    assert_eq!(body["result"]["dtype"], "f16");
    assert_eq!(body["result"]["shape"], json!([1, 1]));
    assert_eq!(body["result"]["data"], pack(&[3.5]));

    // bf16 compute rounds 1 + 2^-12 to 1 (f32 compute would not).
    let x = 1.0 + 2f64.powi(-12);
    let body: Value = matmul(&s, json!({"a": [[x]], "b": [[x]], "compute": "bf16"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["result"], json!([[1.0]]));
}

#[tokio::test]
async fn bad_operands_are_refused_with_their_code_and_path() {
    let s = TestServer::start(&["--max-tensor-elements", "16"]).await;
    let cases = [
        (
            json!({"a": [[1, 2], [3]], "b": [[1]]}),
            422,
            "invalid_request",
            "/a/1",
        ),
        (
            json!({"a": [1, 2], "b": [[1]]}),
            422,
            "invalid_tensor",
            "/a",
        ),
        (
            json!({"a": [[1, 2]], "b": [[1, 2]]}),
            422,
            "invalid_tensor",
            "/b/shape",
        ),
        (
            json!({"a": [[1]], "b": [[1]], "c": [[1, 2]]}),
            422,
            "invalid_tensor",
            "/c/shape",
        ),
        (
            json!({"a": [[[1]], [[1]]], "b": [[[1]], [[1]], [[1]]]}),
            422,
            "invalid_tensor",
            "/b/shape",
        ),
        (
            json!({"a": [[1]], "b": [[1]], "beta": 2}),
            422,
            "invalid_parameter",
            "/beta",
        ),
        (
            json!({"a": [[1]], "b": [[1]], "compute": "f64"}),
            422,
            "invalid_parameter",
            "/compute",
        ),
        (
            json!({"a": [[1e6]], "b": [[1]], "dtype": "f16"}),
            422,
            "invalid_tensor",
            "/a",
        ),
        (
            json!({"a": [[300]], "b": [[300]], "out_dtype": "f16"}),
            422,
            "result_not_finite",
            "/out_dtype",
        ),
        (
            json!({"a": [[1]], "b": {"encoding": "base64", "dtype": "f16", "shape": [1, 1], "data": "AAA="}}),
            422,
            "invalid_parameter",
            "/b/dtype",
        ),
        (
            json!({"a": {"encoding": "base64", "dtype": "f32", "shape": [1, 2], "data": "AAAAAA=="}, "b": [[1], [1]]}),
            422,
            "invalid_tensor",
            "/a/data",
        ),
        (
            json!({"a": [vec![1; 17]], "b": [[1]]}),
            413,
            "payload_too_large",
            "/a",
        ),
        (
            json!({"a": [[1], [1], [1], [1], [1]], "b": [[1, 1, 1, 1]]}),
            413,
            "payload_too_large",
            "/b/shape",
        ),
        (
            json!({"a": [[1]], "b": [[1]], "dtype": "f64", "backend": "cuda"}),
            422,
            "invalid_parameter",
            "/backend",
        ),
    ];
    for (body, status, code, path) in cases {
        let p = problem(matmul(&s, body.clone()).await, status, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{body}: {p}");
    }
    // The server keeps serving.
    assert_eq!(
        matmul(&s, json!({"a": [[2]], "b": [[3]]})).await.status(),
        200
    );
}
