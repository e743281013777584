//! `/nn` over HTTP. `POST /nn/attention`: the causal mask worked by hand, grouped heads,
//! packed half precisions, padded sequences, weights, and each refusal with its code and
//! path. `POST /nn/conv2d`: a convolution worked by hand in both layouts, groups, bias
//! and ReLU, packed inputs, and each refusal.

use crate::common;

use base64::Engine;
use common::{problem, TestServer};
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

async fn attention(s: &TestServer, body: Value) -> reqwest::Response {
    s.post("/nn/attention", body).send().await.unwrap()
}

fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(items) => items.iter().flat_map(flat).collect(),
        x => vec![x.as_f64().expect("a number")],
    }
}

fn softmax(logits: &[f64]) -> Vec<f64> {
    let top = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - top).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

#[tokio::test]
async fn the_causal_mask_and_weights_are_as_worked_by_hand() {
    let s = TestServer::start(&[]).await;
    let res = attention(
        &s,
        json!({"q": [[[[1, 0], [0, 1]]]], "k": [[[[1, 0], [0, 1], [1, 1]]]],
               "v": [[[[1, 2], [3, 4], [5, 6]]]], "causal": true, "return_weights": true}),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-backend"], "cpu");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["shape"], json!([1, 1, 2, 2]));
    assert_eq!(body["dtype"], "f32");
    assert_eq!(body["flops"], 2.0 * 2.0 * 3.0 * 4.0);
    // Two queries, three keys, aligned bottom right: query 0 sees keys 0 and 1, query 1
    // all three. scale = 1/√2.
    let r = std::f64::consts::FRAC_1_SQRT_2;
    let w0 = softmax(&[r, 0.0]);
    let w1 = softmax(&[0.0, r, r]);
    let want_w = [w0[0], w0[1], 0.0, w1[0], w1[1], w1[2]];
    let want_out = [
        w0[0] + 3.0 * w0[1],
        2.0 * w0[0] + 4.0 * w0[1],
        w1[0] + 3.0 * w1[1] + 5.0 * w1[2],
        2.0 * w1[0] + 4.0 * w1[1] + 6.0 * w1[2],
    ];
    for (got, want) in [
        (flat(&body["output"]), &want_out[..]),
        (flat(&body["weights"]), &want_w[..]),
    ] {
        assert_eq!(got.len(), want.len());
        for (x, y) in got.iter().zip(want) {
            assert!((x - y).abs() < 1e-6, "{x} against {y}: {body}");
        }
    }
    // Without return_weights there are none.
    let body: Value = attention(&s, json!({"q": [[[[1]]]], "k": [[[[1]]]], "v": [[[[7]]]]}))
        .await
        .json()
        .await
        .unwrap();
    assert!(body.get("weights").is_none(), "{body}");
    assert_eq!(body["output"], json!([[[[7.0]]]]));
}

#[tokio::test]
async fn grouped_heads_padding_and_packed_half_precision() {
    let s = TestServer::start(&[]).await;
    let pack = |values: &[f32]| {
        B64.encode(
            values
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect::<Vec<u8>>(),
        )
    };
    let packed = |shape: [usize; 4], values: &[f32]| json!({"encoding": "base64", "dtype": "f16", "shape": shape, "data": pack(values)});
    // Two query heads share one key/value head; the second sequence has one real key.
    let q = packed([2, 2, 1, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0, -1.0, 0.5]);
    let k = packed([2, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 9.0, 9.0]);
    let v = packed([2, 1, 2, 1], &[10.0, 20.0, 4.0, 1000.0]);
    let res = attention(
        &s,
        json!({"q": q, "k": k, "v": v, "key_lengths": [2, 1], "scale": 1}),
    )
    .await;
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["dtype"], "f16");
    assert_eq!(body["output"]["dtype"], "f16");
    assert_eq!(body["output"]["shape"], json!([2, 2, 1, 1]));
    let data = B64
        .decode(body["output"]["data"].as_str().unwrap())
        .unwrap();
    let got: Vec<f64> = data
        .chunks(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
        .collect();
    let p = softmax(&[1.0, 0.0]);
    let head0 = p[0] * 10.0 + p[1] * 20.0;
    // Head 1 asks [0, 1]: the logits the other way round.
    let head1 = p[1] * 10.0 + p[0] * 20.0;
    let want = [head0, head1, 4.0, 4.0];
    for (x, y) in got.iter().zip(want) {
        let y = half::f16::from_f64(y).to_f64();
        assert_eq!(*x, y, "{got:?} against {want:?}");
    }

    // A sequence with no keys answers zeros.
    let body: Value = attention(
        &s,
        json!({"q": [[[[1, 2]]], [[[3, 4]]]], "k": [[[[1, 1]]], [[[1, 1]]]],
               "v": [[[[5]]], [[[6]]]], "key_lengths": [0, 1], "return_weights": true}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(body["output"], json!([[[[0.0]]], [[[6.0]]]]), "{body}");
    assert_eq!(body["weights"], json!([[[[0.0]]], [[[1.0]]]]), "{body}");
}

#[tokio::test]
async fn bad_inputs_are_refused_with_their_code_and_path() {
    let s = TestServer::start(&["--max-tensor-elements", "64"]).await;
    let one = json!([[[[1.0]]]]);
    let cases = [
        (
            json!({"q": [[[1]]], "k": one, "v": one}),
            422,
            "invalid_tensor",
            "/q",
        ),
        (
            json!({"q": one, "k": [[[[1]]], [[[1]]]], "v": one}),
            422,
            "invalid_tensor",
            "/k/shape",
        ),
        (
            json!({"q": one, "k": [[[[1, 2]]]], "v": one}),
            422,
            "invalid_tensor",
            "/k/shape",
        ),
        (
            json!({"q": [[[[1]], [[1]], [[1]]]], "k": [[[[1]], [[1]]]], "v": [[[[1]], [[1]]]]}),
            422,
            "invalid_tensor",
            "/k/shape",
        ),
        (
            json!({"q": one, "k": one, "v": [[[[1]], [[1]]]]}),
            422,
            "invalid_tensor",
            "/v/shape",
        ),
        (
            json!({"q": one, "k": one, "v": one, "key_lengths": [1, 1]}),
            422,
            "invalid_parameter",
            "/key_lengths",
        ),
        (
            json!({"q": one, "k": one, "v": one, "key_lengths": [2]}),
            422,
            "invalid_parameter",
            "/key_lengths/0",
        ),
        (
            json!({"q": one, "k": one, "v": one, "key_lengths": [-1]}),
            422,
            "invalid_request",
            "/key_lengths/0",
        ),
        (
            json!({"q": one, "k": one, "v": one, "scale": 1e-40}),
            422,
            "invalid_parameter",
            "/scale",
        ),
        (
            json!({"q": [[[[1e30]]]], "k": [[[[1e30]]]], "v": one}),
            422,
            "invalid_parameter",
            "/q",
        ),
        (
            // Scaled, the logit is 4e18; unscaled, the dot overflows f32.
            json!({"q": [[[[2e19]]]], "k": [[[[2e19]]]], "v": one, "scale": 1e-20}),
            422,
            "invalid_parameter",
            "/q",
        ),
        (
            json!({"q": one, "k": [[[[0], [0]]]], "v": [[[[3e38], [3e38]]]]}),
            422,
            "invalid_parameter",
            "/v",
        ),
        (
            json!({"q": one, "k": one, "v": [[[[1e5]]]], "out_dtype": "f16"}),
            422,
            "result_not_finite",
            "/out_dtype",
        ),
        (
            json!({"q": one, "k": {"encoding": "base64", "dtype": "f16", "shape": [1, 1, 1, 1], "data": "AAA="}, "v": one}),
            422,
            "invalid_parameter",
            "/k/dtype",
        ),
        (
            json!({"q": one, "k": one, "v": one, "dtype": "f64", "backend": "cuda"}),
            422,
            "invalid_parameter",
            "/backend",
        ),
        (
            json!({"q": [[vec![vec![1; 65]]]], "k": one, "v": one}),
            413,
            "payload_too_large",
            "/q",
        ),
        (
            // 16 queries × 30 values: the output is over the limit, the inputs not.
            json!({"q": [[vec![vec![1]; 8], vec![vec![1]; 8]]], "k": [[vec![vec![1]; 2]]],
                   "v": [[vec![vec![1; 30]; 2]]]}),
            413,
            "payload_too_large",
            "/v/shape",
        ),
    ];
    for (body, status, code, path) in cases {
        let p = problem(attention(&s, body.clone()).await, status, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{body}: {p}");
    }
    // Weights past 2^22 are refused before any work.
    let s = TestServer::start(&[]).await;
    let column = |n: usize| json!([[vec![vec![1]; n]]]);
    let p = problem(
        attention(
            &s,
            json!({"q": column(2048), "k": column(2049), "v": column(2049), "return_weights": true}),
        )
        .await,
        413,
        "payload_too_large",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/return_weights", "{p}");
    // Without the weights the same shapes run.
    let res = attention(
        &s,
        json!({"q": column(2048), "k": column(2049), "v": column(2049)}),
    )
    .await;
    assert_eq!(res.status(), 200);
}

async fn conv2d(s: &TestServer, body: Value) -> reqwest::Response {
    s.post("/nn/conv2d", body).send().await.unwrap()
}

#[tokio::test]
async fn convolution_is_as_worked_by_hand_in_both_layouts() {
    let s = TestServer::start(&[]).await;
    // A 3 × 3 image, a 2 × 2 filter [[1, 0], [0, −1]] and one zero of padding all round:
    // out[y][x] = in[y−1][x−1] − in[y][x] with zeros outside.
    let image = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]];
    let at = |y: i64, x: i64| -> f64 {
        if (0..3).contains(&y) && (0..3).contains(&x) {
            image[y as usize][x as usize]
        } else {
            0.0
        }
    };
    let want: Vec<Vec<f64>> = (0..4)
        .map(|y| (0..4).map(|x| at(y - 1, x - 1) - at(y, x)).collect())
        .collect();
    let res = conv2d(
        &s,
        json!({"input": [[image]], "weight": [[[[1, 0], [0, -1]]]], "padding": [1, 1]}),
    )
    .await;
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["shape"], json!([1, 1, 4, 4]));
    assert_eq!(body["result"], json!([[want]]), "{body}");
    assert_eq!(body["flops"], 2.0 * 16.0 * 4.0);

    // Two channels in two groups (depthwise), stride 2, bias and ReLU, channels last.
    let nhwc = json!([[[[1, -1], [2, -2]], [[3, -3], [4, -4]]]]); // [1, 2, 2, 2]
    let body: Value = conv2d(
        &s,
        json!({"input": nhwc, "layout": "nhwc", "weight": [[[[1]]], [[[2]]]], "groups": 2,
               "stride": [2, 2], "bias": [0.5, 10], "relu": true}),
    )
    .await
    .json()
    .await
    .unwrap();
    // Positions (0, 0) only: channel 0 → 1 + 0.5; channel 1 → max(−2 + 10, 0).
    assert_eq!(body["shape"], json!([1, 1, 1, 2]), "{body}");
    assert_eq!(body["result"], json!([[[[1.5, 8.0]]]]), "{body}");
    // ReLU clamps what the bias leaves negative.
    let body: Value = conv2d(
        &s,
        json!({"input": [[[[1.0]]]], "weight": [[[[-3.0]]]], "bias": [1], "relu": true}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(body["result"], json!([[[[0.0]]]]), "{body}");
}

#[tokio::test]
async fn packed_convolution_answers_packed() {
    let s = TestServer::start(&[]).await;
    let pack = |values: &[f32]| {
        B64.encode(
            values
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
    };
    let input = json!({"encoding": "base64", "dtype": "f32", "shape": [1, 1, 2, 3],
                       "data": pack(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])});
    let weight = json!({"encoding": "base64", "dtype": "f32", "shape": [2, 1, 1, 2],
                        "data": pack(&[1.0, 1.0, 1.0, -1.0])});
    let body: Value = conv2d(
        &s,
        json!({"input": input, "weight": weight, "dilation": [1, 2]}),
    )
    .await
    .json()
    .await
    .unwrap();
    // Dilation 2 on columns: pairs (x, x + 2): sums 4, 10 and differences −2, −2.
    assert_eq!(body["result"]["shape"], json!([1, 2, 2, 1]), "{body}");
    assert_eq!(
        body["result"]["data"],
        pack(&[4.0, 10.0, -2.0, -2.0]),
        "{body}"
    );
}

#[tokio::test]
async fn bad_convolutions_are_refused_with_their_code_and_path() {
    let s = TestServer::start(&["--max-tensor-elements", "64"]).await;
    let image = json!([[[[1, 2], [3, 4]]]]);
    let filter = json!([[[[1]]]]);
    let cases = [
        (
            json!({"input": [[[1]]], "weight": filter}),
            422,
            "invalid_tensor",
            "/input",
        ),
        (
            json!({"input": image, "weight": [[[[1]], [[1]]]]}),
            422,
            "invalid_tensor",
            "/weight/shape",
        ),
        (
            json!({"input": image, "weight": [[[[1, 1, 1], [1, 1, 1], [1, 1, 1]]]]}),
            422,
            "invalid_parameter",
            "/weight",
        ),
        (
            json!({"input": image, "weight": filter, "groups": 2}),
            422,
            "invalid_parameter",
            "/groups",
        ),
        (
            json!({"input": image, "weight": filter, "stride": [1]}),
            422,
            "invalid_parameter",
            "/stride",
        ),
        (
            json!({"input": image, "weight": filter, "dilation": [0, 1]}),
            422,
            "invalid_parameter",
            "/dilation",
        ),
        (
            json!({"input": image, "weight": filter, "padding": [1, 1, 1]}),
            422,
            "invalid_parameter",
            "/padding",
        ),
        (
            json!({"input": image, "weight": filter, "bias": [1, 2]}),
            422,
            "invalid_parameter",
            "/bias",
        ),
        (
            json!({"input": image, "weight": filter, "bias": [1e6], "dtype": "f16"}),
            422,
            "invalid_parameter",
            "/bias/0",
        ),
        (
            json!({"input": [[[[300]]]], "weight": [[[[300]]]], "out_dtype": "f16"}),
            422,
            "result_not_finite",
            "/out_dtype",
        ),
        (
            json!({"input": image, "weight": filter, "dtype": "f64", "backend": "cuda"}),
            422,
            "invalid_parameter",
            "/backend",
        ),
        (
            json!({"input": [[vec![vec![1; 65]]]], "weight": filter}),
            413,
            "payload_too_large",
            "/input",
        ),
        (
            // 2 × 2 input padded by 3 all round: 8 × 8 = 64 positions, two filters.
            json!({"input": image, "weight": [[[[1]]], [[[1]]]], "padding": [3, 3]}),
            413,
            "payload_too_large",
            "/weight/shape",
        ),
    ];
    for (body, status, code, path) in cases {
        let p = problem(conv2d(&s, body.clone()).await, status, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{body}: {p}");
    }
    assert_eq!(
        conv2d(&s, json!({"input": image, "weight": filter}))
            .await
            .status(),
        200
    );
}
