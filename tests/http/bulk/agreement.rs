//! Every operation that takes the bulk form answers it with the JSON form's bits: the
//! same request sent as JSON (its bulk fields packed in base64) and as a bulk body (those
//! fields as buffers), answered as JSON and as a bulk body.

use super::{answer, body, post, Buf};
use crate::common::TestServer;
use base64::Engine;
use gpu_ops::wire::Dtype;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Values in [-2, 2) from a counter, as f32 bytes.
fn f32s(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .flat_map(|i| {
            let x = ((i.wrapping_mul(2654435761) ^ seed) % 4096) as f32 / 1024.0 - 2.0;
            x.to_le_bytes()
        })
        .collect()
}

fn packed(dtype: &str, shape: &[usize], bytes: &[u8]) -> Value {
    json!({"encoding": "base64", "dtype": dtype, "shape": shape, "data": B64.encode(bytes)})
}

/// `request` with each packed tensor (`{"encoding": "base64", …}`) as a buffer.
fn packed_as_buffers(request: &Value) -> Vec<u8> {
    let mut found = Vec::new();
    find_packed(request, String::new(), &mut found);
    let buffers = found
        .iter()
        .map(|(at, dtype, shape, bytes)| Buf {
            at,
            dtype: *dtype,
            shape: shape.clone(),
            bytes: bytes.clone(),
        })
        .collect();
    body(request.clone(), buffers)
}

type Found = (String, Dtype, Vec<u64>, Vec<u8>);

fn find_packed(v: &Value, path: String, out: &mut Vec<Found>) {
    match v {
        Value::Object(m)
            if m.get("encoding") == Some(&json!("base64")) && m.contains_key("data") =>
        {
            out.push((
                path,
                serde_json::from_value(m["dtype"].clone()).unwrap(),
                serde_json::from_value(m["shape"].clone()).unwrap(),
                B64.decode(m["data"].as_str().unwrap()).unwrap(),
            ))
        }
        Value::Object(m) => m
            .iter()
            .for_each(|(k, v)| find_packed(v, format!("{path}/{k}"), out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| find_packed(v, format!("{path}/{i}"), out)),
        _ => {}
    }
}

/// The answer without what timing changes.
fn untimed(mut v: Value) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.remove("gflops_per_second");
    }
    v
}

pub(super) async fn json_post(s: &TestServer, path: &str, request: &Value) -> Value {
    let res = s.post(path, request.clone()).send().await.unwrap();
    assert_eq!(res.status(), 200, "{path}: {:?}", res.text().await);
    res.json().await.unwrap()
}

/// JSON numbers as a buffer of `dtype` holds them.
fn numbers_as(numbers: &[Value], dtype: Dtype) -> Vec<u8> {
    numbers
        .iter()
        .flat_map(|n| match dtype {
            Dtype::U64 => n.as_u64().unwrap().to_le_bytes().to_vec(),
            Dtype::F64 => n.as_f64().unwrap().to_le_bytes().to_vec(),
            other => panic!("JSON numbers answered as {other:?}"),
        })
        .collect()
}

/// Sends `request` as JSON and `bulk` (the same request with buffers) both ways and
/// checks the answers agree: as JSON, exactly; as a bulk body, each buffer is the JSON
/// answer's packed tensor, base64 vector or number array at the same place, and the rest
/// is the same.
pub(super) async fn agree(s: &TestServer, path: &str, request: &Value, bulk: Vec<u8>) {
    let want = json_post(s, path, request).await;
    let res = post(s, path, bulk.clone(), false).await;
    assert_eq!(res.status(), 200, "{path}: {:?}", res.text().await);
    let got: Value = res.json().await.unwrap();
    assert_eq!(
        untimed(got),
        untimed(want.clone()),
        "{path}: bulk in, JSON out"
    );

    let got = answer(post(s, path, bulk, true).await).await;
    assert!(!got.buffers.is_empty(), "{path}: the answer has buffers");
    let mut header = want.clone();
    for (at, (r, bytes)) in &got.buffers {
        let json = want
            .pointer(at)
            .unwrap_or_else(|| panic!("{path}: {at} in the JSON answer"));
        let json_bytes = match json {
            Value::String(text) => B64.decode(text).unwrap(),
            Value::Array(numbers) => numbers_as(numbers, r.dtype),
            packed => {
                assert_eq!(packed["dtype"], json!(r.dtype), "{path}{at}");
                assert_eq!(packed["shape"], json!(r.shape), "{path}{at}");
                B64.decode(packed["data"].as_str().unwrap()).unwrap()
            }
        };
        assert_eq!(bytes, &json_bytes, "{path}{at}: the buffer's bytes");
        *header.pointer_mut(at).unwrap() = serde_json::to_value(r).unwrap();
    }
    assert_eq!(untimed(got.header), untimed(header), "{path}: the header");
}

#[tokio::test]
async fn tensor_operations_agree_in_both_forms() {
    let s = TestServer::start(&[]).await;
    let matmul = json!({
        "a": packed("f32", &[2, 3, 5], &f32s(30, 1)),
        "b": packed("f32", &[5, 4], &f32s(20, 2)),
        "c": packed("f32", &[3, 4], &f32s(12, 3)),
        "transpose_a": false, "alpha": 0.5,
    });
    agree(&s, "/linalg/matmul", &matmul, packed_as_buffers(&matmul)).await;

    let half: Vec<u8> = f32s(64, 4)
        .chunks_exact(4)
        .flat_map(|c| half::f16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_le_bytes())
        .collect();
    let attention = json!({
        "q": packed("f16", &[1, 2, 4, 8], &half),
        "k": packed("f32", &[1, 1, 6, 8], &f32s(48, 5)),
        "v": packed("f32", &[1, 1, 6, 8], &f32s(48, 6)),
        "dtype": "f32", "causal": true, "return_weights": true,
    });
    // Operands share a dtype: f16 q with f32 k is refused in both forms alike.
    let refused = s
        .post("/nn/attention", attention.clone())
        .send()
        .await
        .unwrap();
    let bulk_refused = post(&s, "/nn/attention", packed_as_buffers(&attention), false).await;
    assert_eq!(
        (refused.status().as_u16(), bulk_refused.status().as_u16()),
        (422, 422)
    );
    let (a, b): (Value, Value) = (
        refused.json().await.unwrap(),
        bulk_refused.json().await.unwrap(),
    );
    assert_eq!((&a["code"], &a["errors"]), (&b["code"], &b["errors"]));
    let attention = json!({
        "q": packed("f32", &[1, 2, 4, 8], &f32s(64, 4)),
        "k": packed("f32", &[1, 1, 6, 8], &f32s(48, 5)),
        "v": packed("f32", &[1, 1, 6, 8], &f32s(48, 6)),
        "causal": true, "return_weights": true,
    });
    agree(
        &s,
        "/nn/attention",
        &attention,
        packed_as_buffers(&attention),
    )
    .await;

    let conv2d = json!({
        "input": packed("f32", &[1, 2, 5, 5], &f32s(50, 7)),
        "weight": packed("f32", &[3, 2, 3, 3], &f32s(54, 8)),
        "padding": [1, 1], "relu": true,
    });
    agree(&s, "/nn/conv2d", &conv2d, packed_as_buffers(&conv2d)).await;

    // Integer positions: JSON integers, or a u32 buffer.
    let sinusoidal = json!({"positions": [[0, 2, 7]], "dim": 6, "encoding": "base64"});
    let positions: Vec<u8> = [0u32, 2, 7].iter().flat_map(|p| p.to_le_bytes()).collect();
    let bulk = body(
        json!({"dim": 6, "encoding": "base64"}),
        vec![Buf {
            at: "/positions",
            dtype: Dtype::U32,
            shape: vec![1, 3],
            bytes: positions,
        }],
    );
    agree(&s, "/embeddings/sinusoidal", &sinusoidal, bulk).await;

    let table = json!({"table": packed("f32", &[6, 4], &f32s(24, 9))});
    let created = s
        .post("/embeddings/tables", table.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let id = created.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let lookup = json!({"ids": [[5, 0], [3, 3]], "encoding": "base64"});
    let ids: Vec<u8> = [5u64, 0, 3, 3]
        .iter()
        .flat_map(|p| p.to_le_bytes())
        .collect();
    let bulk = body(
        json!({"encoding": "base64"}),
        vec![Buf {
            at: "/ids",
            dtype: Dtype::U64,
            shape: vec![2, 2],
            bytes: ids,
        }],
    );
    agree(
        &s,
        &format!("/embeddings/tables/{id}/lookup"),
        &lookup,
        bulk,
    )
    .await;
    // The same table uploaded as a buffer: a JSON view (201) and the same lookups.
    let res = post(&s, "/embeddings/tables", packed_as_buffers(&table), true).await;
    assert_eq!(res.status(), 201, "{:?}", res.text().await);
    assert_eq!(res.headers()["content-type"], "application/json");
    let twin = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        json_post(&s, &format!("/embeddings/tables/{twin}/lookup"), &lookup).await["result"],
        json_post(&s, &format!("/embeddings/tables/{id}/lookup"), &lookup).await["result"],
    );

    let model = json!({"batch": 2, "tx_array": {"columns": 8}, "rx_array": {"rows": 2, "columns": 2},
                       "paths": 2, "seed": 42});
    let channels = json!({"model": model, "encoding": "base64"});
    agree(
        &s,
        "/beams/channels",
        &channels,
        packed_as_buffers(&channels),
    )
    .await;
    let drawn = json_post(&s, "/beams/channels", &channels).await;
    let sweep = json!({"channels": drawn["channels"], "tx_array": {"columns": 8},
                       "rx_array": {"rows": 2, "columns": 2}, "return_grid": true, "encoding": "base64"});
    agree(&s, "/beams/sweep", &sweep, packed_as_buffers(&sweep)).await;
}

/// `request` with the base64 vectors at `fields` as buffers of `dtype`.
pub(super) fn vectors_as_buffers(
    request: &Value,
    fields: &[&str],
    dtype: Dtype,
    width: usize,
) -> Vec<u8> {
    let buffers = fields
        .iter()
        .map(|at| {
            let bytes = B64
                .decode(request.pointer(at).unwrap().as_str().unwrap())
                .unwrap();
            Buf {
                at,
                dtype,
                shape: vec![(bytes.len() / width) as u64],
                bytes,
            }
        })
        .collect();
    body(request.clone(), buffers)
}

pub(super) fn words(values: &[u64], width: usize) -> String {
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|v| {
            let mut b = v.to_le_bytes().to_vec();
            b.resize(width, 0);
            b
        })
        .collect();
    B64.encode(bytes)
}

#[tokio::test]
async fn field_vector_operations_agree_in_both_forms() {
    let s = TestServer::start(&[]).await;
    for (field, dtype, width) in [
        ("babybear", Dtype::U32, 4),
        ("goldilocks", Dtype::U64, 8),
        ("bn254_fr", Dtype::U256, 32),
        ("bls12_381_fr", Dtype::U256, 32),
    ] {
        let a: Vec<u64> = (1..=8).map(|i| i * 1_000_003 % 2_013_265_921).collect();
        let b: Vec<u64> = (1..=8).map(|i| i * 7919 + 5).collect();
        for op in ["field_add", "field_sub", "field_mul"] {
            let request = json!({"field": field, "a": words(&a, width), "b": words(&b, width), "encoding": "base64"});
            agree(
                &s,
                &format!("/zk/{op}"),
                &request,
                vectors_as_buffers(&request, &["/a", "/b"], dtype, width),
            )
            .await;
        }
        let inv = json!({"field": field, "values": words(&a, width), "encoding": "base64"});
        agree(
            &s,
            "/zk/field_inv",
            &inv,
            vectors_as_buffers(&inv, &["/values"], dtype, width),
        )
        .await;
        // Exponents are 256-bit integers whatever the field.
        let pow = json!({"field": field, "base": words(&a, width), "exponent": words(&b, 32), "encoding": "base64"});
        let bulk = body(
            json!({"field": field, "encoding": "base64"}),
            vec![
                Buf {
                    at: "/base",
                    dtype,
                    shape: vec![8],
                    bytes: B64.decode(words(&a, width)).unwrap(),
                },
                Buf {
                    at: "/exponent",
                    dtype: Dtype::U256,
                    shape: vec![8],
                    bytes: B64.decode(words(&b, 32)).unwrap(),
                },
            ],
        );
        agree(&s, "/zk/field_pow", &pow, bulk).await;
        for op in ["ntt", "intt"] {
            let request = json!({"field": field, "values": words(&a, width), "batch": 2, "encoding": "base64"});
            agree(
                &s,
                &format!("/zk/{op}"),
                &request,
                vectors_as_buffers(&request, &["/values"], dtype, width),
            )
            .await;
        }
    }

    // A field's vector in another width is refused at its dtype; a matrix at its shape;
    // a value at or above the modulus at its index, as in JSON.
    let one = 1u64.to_le_bytes().to_vec();
    let cases = [
        (
            Dtype::U32,
            vec![1],
            vec![1, 0, 0, 0],
            "invalid_request",
            "/a/dtype",
        ),
        (
            Dtype::U64,
            vec![1, 1],
            one.clone(),
            "invalid_request",
            "/a/shape",
        ),
        (
            Dtype::U64,
            vec![2],
            [1u64, u64::MAX]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            "invalid_field_element",
            "/a/1",
        ),
    ];
    for (dtype, shape, bytes, code, path) in cases {
        let a = Buf {
            at: "/a",
            dtype,
            shape,
            bytes,
        };
        let b = Buf {
            at: "/b",
            dtype: Dtype::U64,
            shape: vec![1],
            bytes: one.clone(),
        };
        let req = body(json!({"field": "goldilocks"}), vec![a, b]);
        let p =
            crate::common::problem(post(&s, "/zk/field_add", req, false).await, 422, code).await;
        assert_eq!(p["errors"][0]["path"], path);
    }
}

#[tokio::test]
async fn dp_releases_agree_in_both_forms() {
    // Seeded noise, so that both forms draw the same.
    let s = TestServer::start(&["--dp-allow-client-seed"]).await;
    let privatize = json!({
        "per_example_gradients": packed("f32", &[8, 16], &f32s(128, 11)),
        "clip_norm": 1.0, "noise_multiplier": 1.1, "seed": 7,
    });
    agree(
        &s,
        "/dp/privatize",
        &privatize,
        packed_as_buffers(&privatize),
    )
    .await;
    let f64s: Vec<u8> = (0..64)
        .flat_map(|i| (f64::from(i) * 0.25 - 3.0).to_le_bytes())
        .collect();
    let laplace = json!({"values": packed("f64", &[64], &f64s), "sensitivity": 1.0, "epsilon": 0.5, "seed": 3});
    agree(&s, "/dp/laplace", &laplace, packed_as_buffers(&laplace)).await;
    let gaussian = json!({"values": packed("f32", &[32], &f32s(32, 12)), "sensitivity": 1.0,
                          "epsilon": 1.0, "delta": 1e-5, "seed": 4});
    agree(&s, "/dp/gaussian", &gaussian, packed_as_buffers(&gaussian)).await;
    // A gradient matrix is two-dimensional in either form.
    let flat = json!({"per_example_gradients": packed("f32", &[128], &f32s(128, 11)),
                      "clip_norm": 1.0, "noise_multiplier": 1.1, "seed": 7});
    let p = crate::common::problem(
        post(&s, "/dp/privatize", packed_as_buffers(&flat), false).await,
        422,
        "invalid_tensor",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/per_example_gradients/shape");
}
