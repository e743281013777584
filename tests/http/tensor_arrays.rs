//! Resident tensors (`POST /arrays` with `kind: "tensor"`): each tensor operand of the
//! tensor ops that names one (`{"array": id}`, in JSON and in a bulk header) answers as
//! if its values were sent, kept results chain, and a tensor that does not fit is
//! refused at the operand's `/array`.

use crate::bulk::{body, f32_bytes, post, Buf};
use crate::common::{problem, TestServer};
use base64::Engine;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

async fn created(s: &TestServer, body: Value) -> Value {
    let res = s.post("/arrays", body).send().await.unwrap();
    assert_eq!(res.status(), 201, "{:?}", res.text().await);
    res.json().await.unwrap()
}

async fn ok(s: &TestServer, path: &str, body: Value) -> Value {
    let res = s.post(path, body).send().await.unwrap();
    assert_eq!(res.status(), 200, "{path}: {:?}", res.text().await);
    res.json().await.unwrap()
}

/// Deterministic values that are exact in f16: multiples of 1/8 in [-2, 2).
fn eighths(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 7 + seed * 13) % 32) as f64 / 8.0 - 2.0)
        .collect()
}

/// `values` nested as `shape` (row-major).
fn nest(values: &[f64], shape: &[usize]) -> Value {
    match shape {
        [] => unreachable!("rank at least 1"),
        [_] => json!(values),
        [n, rest @ ..] => {
            let step = values.len() / n;
            Value::Array(values.chunks(step).map(|c| nest(c, rest)).collect())
        }
    }
}

fn tensor(s: &[usize], seed: usize) -> Value {
    nest(&eighths(s.iter().product(), seed), s)
}

#[tokio::test]
async fn a_resident_tensor_stands_for_any_tensor_operand() {
    let s = TestServer::start(&[]).await;
    let (a, b) = (tensor(&[3, 4], 1), tensor(&[4, 2], 2));
    let made = created(&s, json!({"kind": "tensor", "tensor": a, "name": "w"})).await;
    assert_eq!(
        (
            &made["kind"],
            &made["dtype"],
            &made["shape"],
            &made["length"],
            &made["size_bytes"]
        ),
        (
            &json!("tensor"),
            &json!("f32"),
            &json!([3, 4]),
            &json!(12),
            &json!(48)
        ),
        "{made}"
    );
    let id = made["id"].as_str().unwrap();
    let sent = ok(&s, "/linalg/matmul", json!({"a": a, "b": b})).await;
    let named = ok(&s, "/linalg/matmul", json!({"a": {"array": id}, "b": b})).await;
    assert_eq!(named["result"], sent["result"]);

    // In a bulk header, beside a buffer: the same product.
    let b_values: Vec<f32> = eighths(8, 2).iter().map(|&x| x as f32).collect();
    let bulk = body(
        json!({"a": {"array": id}}),
        vec![Buf {
            at: "/b",
            dtype: gpu_ops::wire::Dtype::F32,
            shape: vec![4, 2],
            bytes: f32_bytes(&b_values),
        }],
    );
    let res = post(&s, "/linalg/matmul", bulk, false).await;
    assert_eq!(res.status(), 200);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["result"], sent["result"]);

    // conv2d's weight, attention's keys and values, an embedding table, a sweep's
    // channels: each the same as sent.
    let (x, w) = (tensor(&[1, 2, 4, 4], 3), tensor(&[3, 2, 3, 3], 4));
    let wid = created(&s, json!({"kind": "tensor", "tensor": w})).await["id"].clone();
    let sent = ok(
        &s,
        "/nn/conv2d",
        json!({"input": x, "weight": w, "padding": [1, 1]}),
    )
    .await;
    let named = ok(
        &s,
        "/nn/conv2d",
        json!({"input": x, "weight": {"array": wid}, "padding": [1, 1]}),
    )
    .await;
    assert_eq!(named["result"], sent["result"]);

    let (q, k, v) = (
        tensor(&[1, 2, 3, 4], 5),
        tensor(&[1, 1, 5, 4], 6),
        tensor(&[1, 1, 5, 4], 7),
    );
    let kid = created(&s, json!({"kind": "tensor", "tensor": k})).await["id"].clone();
    let vid = created(&s, json!({"kind": "tensor", "tensor": v})).await["id"].clone();
    let sent = ok(
        &s,
        "/nn/attention",
        json!({"q": q, "k": k, "v": v, "causal": true}),
    )
    .await;
    let named = ok(
        &s,
        "/nn/attention",
        json!({"q": q, "k": {"array": kid}, "v": {"array": vid}, "causal": true}),
    )
    .await;
    assert_eq!(named["output"], sent["output"]);

    let table = tensor(&[5, 3], 8);
    let tid = created(&s, json!({"kind": "tensor", "tensor": table})).await["id"].clone();
    let res = s
        .post("/embeddings/tables", json!({"table": {"array": tid}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201, "{:?}", res.text().await);
    let t: Value = res.json().await.unwrap();
    let rows = ok(
        &s,
        &format!("/embeddings/tables/{}/lookup", t["id"].as_str().unwrap()),
        json!({"ids": [4, 0]}),
    )
    .await;
    assert_eq!(rows["result"], json!([table[4], table[0]]));

    let channels = tensor(&[2, 2, 3, 2], 9);
    let cid = created(&s, json!({"kind": "tensor", "tensor": channels})).await["id"].clone();
    let sent = ok(&s, "/beams/sweep", json!({"channels": channels})).await;
    let named = ok(&s, "/beams/sweep", json!({"channels": {"array": cid}})).await;
    assert_eq!(named["best"], sent["best"]);

    // Seven operands, and the lookup's table (a table is a resident tensor).
    assert_eq!(
        s.metric("gpu_ops_array_uses_total{kind=\"tensor\"}").await,
        8.0
    );
}

#[tokio::test]
async fn a_tensor_is_kept_in_its_dtype_and_reads_back_in_every_form() {
    let s = TestServer::start(&[]).await;
    // 0.1 is not an f16: nested numbers are rounded to the dtype once, when kept.
    let made = created(
        &s,
        json!({"kind": "tensor", "dtype": "f16", "tensor": [[0.1, 2.0, -3.5]]}),
    )
    .await;
    assert_eq!(
        (&made["dtype"], &made["size_bytes"]),
        (&json!("f16"), &json!(12))
    );
    let id = made["id"].as_str().unwrap();
    let f16 = half::f16::from_f64(0.1).to_f64();
    let v = ok_get(&s, &format!("/arrays/{id}/data")).await;
    assert_eq!(
        (&v["kind"], &v["shape"], &v["tensor"]),
        (&json!("tensor"), &json!([1, 3]), &json!([[f16, 2.0, -3.5]]))
    );
    let le: Vec<u8> = [f16, 2.0, -3.5]
        .iter()
        .flat_map(|&x| half::f16::from_f64(x).to_le_bytes())
        .collect();
    let v = ok_get(&s, &format!("/arrays/{id}/data?encoding=base64")).await;
    assert_eq!(
        v["tensor"],
        json!({"encoding": "base64", "dtype": "f16", "shape": [1, 3], "data": B64.encode(&le)})
    );
    let got = crate::bulk::get_answer(&s, &format!("/arrays/{id}/data")).await;
    let (b, bytes) = &got.buffers["/tensor"];
    assert_eq!(
        (b.dtype, &b.shape, bytes),
        (gpu_ops::wire::Dtype::F16, &vec![1, 3], &le)
    );
    let res = s.get(&format!("/arrays/{id}/data?encoding=hex")).await;
    assert_eq!(
        problem(res, 422, "invalid_parameter").await["errors"][0]["path"],
        "/encoding"
    );

    // Packed and bulk uploads state their dtype; a copy of another array keeps it.
    let packed = json!({"encoding": "base64", "dtype": "bf16", "shape": [2], "data": B64.encode([half::bf16::from_f32(1.5).to_le_bytes(), half::bf16::from_f32(-4.0).to_le_bytes()].concat())});
    let made = created(&s, json!({"kind": "tensor", "tensor": packed})).await;
    assert_eq!(
        (&made["dtype"], &made["shape"]),
        (&json!("bf16"), &json!([2]))
    );
    let copy = created(
        &s,
        json!({"kind": "tensor", "tensor": {"array": made["id"]}}),
    )
    .await;
    assert_eq!(
        (&copy["dtype"], &copy["shape"]),
        (&json!("bf16"), &json!([2]))
    );
    let bulk = body(
        json!({"kind": "tensor"}),
        vec![Buf {
            at: "/tensor",
            dtype: gpu_ops::wire::Dtype::F64,
            shape: vec![2, 1],
            bytes: [0.25f64.to_le_bytes(), 1e300f64.to_le_bytes()].concat(),
        }],
    );
    let res = post(&s, "/arrays", bulk, false).await;
    assert_eq!(res.status(), 201);
    let made: Value = res.json().await.unwrap();
    assert_eq!(
        (&made["dtype"], &made["size_bytes"]),
        (&json!("f64"), &json!(16))
    );
    let v = ok_get(
        &s,
        &format!("/arrays/{}/data", made["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(v["tensor"], json!([[0.25], [1e300]]));
}

async fn ok_get(s: &TestServer, path: &str) -> Value {
    let res = s.get(path).await;
    assert_eq!(res.status(), 200, "{path}: {:?}", res.text().await);
    res.json().await.unwrap()
}

#[tokio::test]
async fn kept_tensors_chain_as_the_sent_ones_do() {
    let s = TestServer::start(&[]).await;
    let (a, b, c) = (tensor(&[2, 3], 1), tensor(&[3, 4], 2), tensor(&[4, 2], 3));
    let ab = ok(&s, "/linalg/matmul", json!({"a": a, "b": b})).await;
    let want = ok(&s, "/linalg/matmul", json!({"a": ab["result"], "b": c})).await;
    let kept = ok(
        &s,
        "/linalg/matmul",
        json!({"a": a, "b": b, "keep": {"with_data": false, "name": "ab"}}),
    )
    .await;
    assert!(kept.get("result").is_none(), "{kept}");
    assert_eq!(
        (
            &kept["kept"]["kind"],
            &kept["kept"]["shape"],
            &kept["kept"]["name"]
        ),
        (&json!("tensor"), &json!([2, 4]), &json!("ab"))
    );
    let id = kept["kept"]["id"].as_str().unwrap();
    let got = ok(&s, "/linalg/matmul", json!({"a": {"array": id}, "b": c})).await;
    assert_eq!(got["result"], want["result"]);
    assert_eq!(
        ok_get(&s, &format!("/arrays/{id}/data")).await["tensor"],
        ab["result"]
    );

    // A convolution's output kept with its data, then attended over.
    let (x, w) = (tensor(&[1, 1, 4, 4], 4), tensor(&[1, 1, 3, 3], 5));
    let conv = ok(
        &s,
        "/nn/conv2d",
        json!({"input": x, "weight": w, "padding": [1, 1], "dtype": "f64", "keep": {}}),
    )
    .await;
    assert_eq!(
        (&conv["kept"]["dtype"], &conv["kept"]["shape"]),
        (&json!("f64"), &json!([1, 1, 4, 4]))
    );
    let sent = ok(
        &s,
        "/nn/attention",
        json!({"q": conv["result"], "k": conv["result"], "v": conv["result"], "dtype": "f64"}),
    )
    .await;
    let cid = &conv["kept"]["id"];
    let named = ok(
        &s,
        "/nn/attention",
        json!({"q": {"array": cid}, "k": {"array": cid}, "v": {"array": cid}, "keep": {}}),
    )
    .await;
    assert_eq!(named["output"], sent["output"]);
    assert_eq!(named["kept"]["shape"], json!([1, 1, 4, 4]));
}

#[tokio::test]
async fn tensors_that_do_not_fit_are_refused_at_the_operand() {
    let s = TestServer::start(&[]).await;
    let refused =
        |body: Value, path: &'static str, status: u16, code: &'static str, at: &'static str| {
            let s = &s;
            async move {
                let res = s.post(path, body.clone()).send().await.unwrap();
                let p = problem(res, status, code).await;
                assert_eq!(p["errors"][0]["path"], at, "{body} → {p}");
            }
        };
    let row = created(&s, json!({"kind": "tensor", "tensor": [1.0, 2.0]})).await["id"].clone();
    let half = created(
        &s,
        json!({"kind": "tensor", "dtype": "f16", "tensor": [[1.0, 2.0], [3.0, 4.0]]}),
    )
    .await["id"]
        .clone();
    let field = created(
        &s,
        json!({"kind": "field_elements", "field": "goldilocks", "values": ["1"]}),
    )
    .await["id"]
        .clone();
    let m = json!([[1.0, 2.0], [3.0, 4.0]]);
    refused(
        json!({"a": {"array": "arr_none"}, "b": m}),
        "/linalg/matmul",
        422,
        "unknown_array",
        "/a/array",
    )
    .await;
    refused(
        json!({"a": m, "b": {"array": field}}),
        "/linalg/matmul",
        422,
        "array_mismatch",
        "/b/array",
    )
    .await;
    refused(
        json!({"a": {"array": row}, "b": m}),
        "/linalg/matmul",
        422,
        "array_mismatch",
        "/a/array",
    )
    .await;
    refused(
        json!({"a": m, "b": {"array": half}}),
        "/linalg/matmul",
        422,
        "array_mismatch",
        "/b/array",
    )
    .await;
    refused(
        json!({"q": {"array": half}, "k": m, "v": m}),
        "/nn/attention",
        422,
        "array_mismatch",
        "/q/array",
    )
    .await;
    refused(
        json!({"field": "goldilocks", "a": {"array": row}, "b": ["1"]}),
        "/zk/field_add",
        422,
        "array_mismatch",
        "/a/array",
    )
    .await;
    // A reference is `array` alone.
    refused(
        json!({"a": {"array": row, "dtype": "f32"}, "b": m}),
        "/linalg/matmul",
        422,
        "invalid_request",
        "/a",
    )
    .await;
    // Uploads: the kind's own fields, values that fit the dtype.
    refused(
        json!({"kind": "tensor", "field": "goldilocks", "tensor": m}),
        "/arrays",
        422,
        "invalid_request",
        "/field",
    )
    .await;
    refused(
        json!({"kind": "tensor", "dtype": "f32"}),
        "/arrays",
        422,
        "invalid_request",
        "/tensor",
    )
    .await;
    refused(
        json!({"kind": "field_elements", "field": "goldilocks", "values": ["1"], "dtype": "f32"}),
        "/arrays",
        422,
        "invalid_request",
        "/dtype",
    )
    .await;
    refused(
        json!({"kind": "tensor", "dtype": "f16", "tensor": [1e6]}),
        "/arrays",
        422,
        "invalid_tensor",
        "/tensor",
    )
    .await;
    refused(
        json!({"kind": "tensor", "tensor": [[[[[1.0]]]]]}),
        "/arrays",
        422,
        "invalid_request",
        "/tensor/0/0/0/0",
    )
    .await;
    let packed = json!({"encoding": "base64", "dtype": "f32", "shape": [1], "data": B64.encode(1f32.to_le_bytes())});
    refused(
        json!({"kind": "tensor", "dtype": "f64", "tensor": packed}),
        "/arrays",
        422,
        "invalid_parameter",
        "/tensor/dtype",
    )
    .await;
    let s2 = TestServer::start(&["--max-tensor-elements", "4"]).await;
    let res = s2
        .post(
            "/arrays",
            json!({"kind": "tensor", "tensor": [1, 2, 3, 4, 5]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 413);
}

/// A lookup's ids and sinusoidal positions name resident tensors of integers: the rows
/// are those of the same ids sent; an id an f32 tensor may have rounded at its upload
/// (2^24 up), a non-integer, another rank or another kind is refused at `…/array`.
#[tokio::test]
async fn integer_operands_take_resident_tensors_of_integers() {
    let s = TestServer::start(&[]).await;
    let res = s
        .post(
            "/embeddings/tables",
            json!({"table": [[1.0, 1.5], [2.0, 2.5], [3.0, 3.5]]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let t: Value = res.json().await.unwrap();
    let lookup = format!("/embeddings/tables/{}/lookup", t["id"].as_str().unwrap());
    let ids = json!([[2, 0], [1, 1]]);
    let sent = ok(&s, &lookup, json!({"ids": ids})).await;
    assert_eq!(
        sent["result"],
        json!([[[3.0, 3.5], [1.0, 1.5]], [[2.0, 2.5], [2.0, 2.5]]])
    );
    for dtype in ["f32", "f64", "bf16"] {
        let made = created(&s, json!({"kind": "tensor", "tensor": ids, "dtype": dtype})).await;
        let named = ok(&s, &lookup, json!({"ids": {"array": made["id"]}})).await;
        assert_eq!(named["result"], sent["result"], "{dtype}");
        assert_eq!(named["shape"], sent["shape"], "{dtype}");
    }
    let positions = json!([0, 5, 70000]);
    let body = |p: Value| json!({"positions": p, "dim": 4});
    let want = ok(&s, "/embeddings/sinusoidal", body(positions.clone())).await;
    let made = created(
        &s,
        json!({"kind": "tensor", "tensor": positions, "dtype": "f64"}),
    )
    .await;
    let named = ok(
        &s,
        "/embeddings/sinusoidal",
        body(json!({"array": made["id"]})),
    )
    .await;
    assert_eq!(named["result"], want["result"]);

    let refused = |path: String, body: Value, code: &'static str| {
        let s = &s;
        async move {
            let res = s.post(&path, body).send().await.unwrap();
            problem(res, 422, code).await
        }
    };
    // 2^24 + 1 is stored as 2^24 by an f32 tensor: no id from 2^24 up is taken from one.
    let big = created(
        &s,
        json!({"kind": "tensor", "tensor": [16777217.0], "dtype": "f32"}),
    )
    .await;
    let p = refused(
        "/embeddings/sinusoidal".into(),
        body(json!({"array": big["id"]})),
        "invalid_tensor",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/positions/array", "{p}");
    assert!(p["detail"].as_str().unwrap().contains("f64"), "{p}");
    let half = created(&s, json!({"kind": "tensor", "tensor": [0.5]})).await;
    let p = refused(
        lookup.clone(),
        json!({"ids": {"array": half["id"]}}),
        "invalid_tensor",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/ids/array", "{p}");
    let out_of_range = created(&s, json!({"kind": "tensor", "tensor": [3.0]})).await;
    let p = refused(
        lookup.clone(),
        json!({"ids": {"array": out_of_range["id"]}}),
        "invalid_tensor",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/ids/array", "{p}");
    let cube = created(&s, json!({"kind": "tensor", "tensor": [[[1.0]]]})).await;
    let p = refused(
        lookup.clone(),
        json!({"ids": {"array": cube["id"]}}),
        "array_mismatch",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/ids/array", "{p}");
    let bytes = created(&s, json!({"kind": "bytes", "bytes": "AAAAAA=="})).await;
    let p = refused(
        lookup.clone(),
        json!({"ids": {"array": bytes["id"]}}),
        "array_mismatch",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/ids/array", "{p}");
    let p = refused(
        lookup,
        json!({"ids": {"array": "arr_nothing"}}),
        "unknown_array",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/ids/array", "{p}");
}

/// A resident tensor of ids or positions whose answer would pass --max-tensor-elements is
/// refused at the array it names (413 at `…/array`), as the same ids sent are at theirs.
#[tokio::test]
async fn an_answer_too_large_for_resident_ids_is_refused_at_their_array() {
    let s = TestServer::start(&["--max-tensor-elements", "100"]).await;
    let t: Value = s
        .post(
            "/embeddings/tables",
            json!({"table": [[1.0, 2.0], [3.0, 4.0]]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let lookup = format!("/embeddings/tables/{}/lookup", t["id"].as_str().unwrap());
    // 60 ids of 2 values each: 120 values to answer.
    let ids = created(&s, json!({"kind": "tensor", "tensor": vec![1.0; 60]})).await;
    for (path, body, at) in [
        (
            lookup.clone(),
            json!({"ids": {"array": ids["id"]}}),
            "/ids/array",
        ),
        (lookup, json!({"ids": vec![1; 60]}), "/ids"),
        (
            "/embeddings/sinusoidal".to_string(),
            json!({"positions": {"array": ids["id"]}, "dim": 2}),
            "/positions/array",
        ),
    ] {
        let res = s.post(&path, body).send().await.unwrap();
        let p = problem(res, 413, "payload_too_large").await;
        assert_eq!(p["errors"][0]["path"], at, "{p}");
    }
}

/// The DP releases' operands name resident tensors too: privatize's gradients (rank 2),
/// laplace's and gaussian's values (rank 1), the same release (same seed) as with the
/// values sent as numbers; another rank or an unknown array is refused at `…/array`.
#[tokio::test]
async fn dp_releases_take_resident_tensors() {
    let s = TestServer::start(&["--dp-allow-client-seed"]).await;
    let grads = tensor(&[4, 3], 5);
    let g = created(
        &s,
        json!({"kind": "tensor", "tensor": grads, "dtype": "f64"}),
    )
    .await;
    let step = |grads: Value| json!({"per_example_gradients": grads, "clip_norm": 1.0, "noise_multiplier": 1.1, "seed": 9});
    let sent = ok(&s, "/dp/privatize", step(grads.clone())).await;
    let named = ok(&s, "/dp/privatize", step(json!({"array": g["id"]}))).await;
    assert_eq!(named["gradient"], sent["gradient"], "{named}");
    assert_eq!(named["fraction_clipped"], sent["fraction_clipped"]);

    let values = tensor(&[6], 3);
    let v = created(
        &s,
        json!({"kind": "tensor", "tensor": values, "dtype": "f64"}),
    )
    .await;
    for (path, extra) in [
        ("/dp/laplace", json!({"epsilon": 0.5})),
        ("/dp/gaussian", json!({"epsilon": 0.5, "delta": 1e-6})),
    ] {
        let body = |values: Value| {
            let mut b = json!({"values": values, "sensitivity": 1.0, "seed": 4});
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            b
        };
        let sent = ok(&s, path, body(values.clone())).await;
        let named = ok(&s, path, body(json!({"array": v["id"]}))).await;
        assert_eq!(named["values"], sent["values"], "{path}");
        // A matrix where a vector goes, and a vector where a matrix goes.
        let res = s
            .post(path, body(json!({"array": g["id"]})))
            .send()
            .await
            .unwrap();
        let p = problem(res, 422, "array_mismatch").await;
        assert_eq!(p["errors"][0]["path"], "/values/array");
    }
    let res = s
        .post("/dp/privatize", step(json!({"array": v["id"]})))
        .send()
        .await
        .unwrap();
    let p = problem(res, 422, "array_mismatch").await;
    assert_eq!(p["errors"][0]["path"], "/per_example_gradients/array");
    let res = s
        .post(
            "/dp/laplace",
            json!({"values": {"array": "arr_none"}, "sensitivity": 1.0, "epsilon": 1.0}),
        )
        .send()
        .await
        .unwrap();
    let p = problem(res, 422, "unknown_array").await;
    assert_eq!(p["errors"][0]["path"], "/values/array");
    let res = s
        .post("/dp/laplace", json!({"values": {"array": v["id"], "dtype": "f32"}, "sensitivity": 1.0, "epsilon": 1.0}))
        .send()
        .await
        .unwrap();
    problem(res, 422, "invalid_request").await;
}
