//! The bulk wire form (`application/vnd.gpu-ops.bulk`, docs/WIRE.md) over HTTP: a
//! client's writer and reader built on `gpu_ops::wire`, the framing and layout refusals
//! every bulk operation shares, and content negotiation. Each domain's module checks that
//! its operations answer the same bits in both forms, with these helpers.

mod agreement;
mod ciphertexts;
mod shares_and_recordings;

use crate::common::{problem, TestServer};
use bytes::Bytes;
use gpu_ops::wire::{self, BufferRef, Dtype, EnvelopeWriter};
use serde_json::{json, Value};

/// One buffer of a request: the JSON pointer of the field it stands for, its dtype,
/// shape and little-endian bytes.
pub struct Buf<'a> {
    pub at: &'a str,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub bytes: Vec<u8>,
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A bulk body: `header` with each buffer's descriptor put at its pointer (whose parent
/// must exist), then the buffers.
pub fn body(mut header: Value, buffers: Vec<Buf<'_>>) -> Vec<u8> {
    let mut writer = EnvelopeWriter::new();
    for b in buffers {
        let descriptor = writer.push(b.dtype, b.shape, Bytes::from(b.bytes));
        let (parent, key) = b.at.rsplit_once('/').expect("a JSON pointer");
        let parent = if parent.is_empty() {
            &mut header
        } else {
            header.pointer_mut(parent).expect("the parent exists")
        };
        let descriptor = serde_json::to_value(descriptor).unwrap();
        match parent {
            Value::Array(items) => items[key.parse::<usize>().expect("an index")] = descriptor,
            object => object[key] = descriptor,
        }
    }
    writer.finish_to_vec(&header).unwrap()
}

/// A body framed by hand: `header` as given and `data` as the data section.
pub fn raw(header: &Value, data: &[u8]) -> Vec<u8> {
    let text = header.to_string();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Posts a bulk body; `bulk_answer` asks for the answer in the bulk form too.
pub async fn post(
    s: &TestServer,
    path: &str,
    body: Vec<u8>,
    bulk_answer: bool,
) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("{}{path}", s.url))
        .header("content-type", wire::MEDIA_TYPE)
        .body(body);
    if bulk_answer {
        req = req.header("accept", wire::MEDIA_TYPE);
    }
    req.send().await.unwrap()
}

/// A bulk answer: its header, and each buffer's bytes by the pointer of its descriptor.
pub struct Answer {
    pub header: Value,
    pub buffers: std::collections::BTreeMap<String, (BufferRef, Vec<u8>)>,
}

pub async fn answer(res: reqwest::Response) -> Answer {
    assert_eq!(res.status(), 200, "{:?}", res.text().await);
    assert_eq!(res.headers()["content-type"], wire::MEDIA_TYPE);
    assert_eq!(res.headers()["vary"], "accept");
    let bytes = res.bytes().await.unwrap();
    read(&bytes)
}

/// `GET path` asking for a bulk answer, split and checked.
pub async fn get_answer(s: &TestServer, path: &str) -> Answer {
    let res = s
        .client
        .get(format!("{}{path}", s.url))
        .header("accept", wire::MEDIA_TYPE)
        .send()
        .await
        .unwrap();
    answer(res).await
}

/// Splits and checks a bulk body as a client would.
pub fn read(bytes: &[u8]) -> Answer {
    let envelope = wire::split(bytes).unwrap();
    assert_eq!(
        (bytes.len() - envelope.data.len()) % 64,
        0,
        "the data section starts 64-byte aligned"
    );
    let header: Value = serde_json::from_str(envelope.header.trim_end()).unwrap();
    let mut found = Vec::new();
    collect(&header, String::new(), &mut found);
    let refs: Vec<(&str, &BufferRef)> = found.iter().map(|(p, b)| (p.as_str(), b)).collect();
    wire::check_layout(&refs, envelope.data.len()).unwrap();
    let buffers = found
        .iter()
        .map(|(p, b)| {
            (
                p.clone(),
                (b.clone(), wire::bytes_of(envelope.data, b).to_vec()),
            )
        })
        .collect();
    Answer { header, buffers }
}

fn collect(v: &Value, path: String, out: &mut Vec<(String, BufferRef)>) {
    match v {
        Value::Object(m) if m.contains_key("byte_offset") => {
            out.push((path, serde_json::from_value(v.clone()).unwrap()))
        }
        Value::Object(m) => m
            .iter()
            .for_each(|(k, v)| collect(v, format!("{path}/{k}"), out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| collect(v, format!("{path}/{i}"), out)),
        _ => {}
    }
}

fn matrix(rows: u64, cols: u64, seed: f32) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| (i as f32 * 0.37 + seed).sin() * 3.0)
        .collect()
}

fn packed(values: &[f32], shape: &[u64]) -> Value {
    use base64::Engine;
    json!({"encoding": "base64", "dtype": "f32", "shape": shape,
           "data": base64::engine::general_purpose::STANDARD.encode(f32_bytes(values))})
}

#[tokio::test]
async fn matmul_answers_the_same_bits_in_both_forms() {
    use base64::Engine;
    let s = TestServer::start(&[]).await;
    let (m, k, n) = (3, 5, 4);
    let (a, b) = (matrix(m, k, 0.0), matrix(k, n, 1.0));
    let json_answer: Value = s
        .post(
            "/linalg/matmul",
            json!({"a": packed(&a, &[m, k]), "b": packed(&b, &[k, n])}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let want = base64::engine::general_purpose::STANDARD
        .decode(json_answer["result"]["data"].as_str().unwrap())
        .unwrap();
    let buffers = || {
        vec![
            Buf {
                at: "/a",
                dtype: Dtype::F32,
                shape: vec![m, k],
                bytes: f32_bytes(&a),
            },
            Buf {
                at: "/b",
                dtype: Dtype::F32,
                shape: vec![k, n],
                bytes: f32_bytes(&b),
            },
        ]
    };

    // Bulk in, bulk out: the result is a buffer with the JSON answer's bytes.
    let got = answer(post(&s, "/linalg/matmul", body(json!({}), buffers()), true).await).await;
    assert_eq!(got.header["shape"], json!([m, n]));
    assert_eq!(got.header["dtype"], "f32");
    let (r, bytes) = &got.buffers["/result"];
    assert_eq!((r.dtype, r.shape.clone()), (Dtype::F32, vec![m, n]));
    assert_eq!(bytes, &want);

    // Bulk in, JSON out: packed base64 (the operands stated their dtype), the same bits.
    let res = post(&s, "/linalg/matmul", body(json!({}), buffers()), false).await;
    assert_eq!(res.headers()["content-type"], "application/json");
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["result"], json_answer["result"]);

    // JSON in (nested numbers), bulk out.
    let nested = |x: &[f32], cols: u64| {
        Value::from(
            x.chunks(cols as usize)
                .map(|r| Value::from(r.iter().map(|&v| f64::from(v)).collect::<Vec<_>>()))
                .collect::<Vec<_>>(),
        )
    };
    let res = s
        .post(
            "/linalg/matmul",
            json!({"a": nested(&a, k), "b": nested(&b, n)}),
        )
        .header(
            "accept",
            format!("application/json;q=0.5, {}", wire::MEDIA_TYPE),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer(res).await.buffers["/result"].1, want);

    // f16 operands: the bulk answer's buffer is the packed JSON answer's f16 bytes.
    let f16_bytes = |x: &[f32]| -> Vec<u8> {
        x.iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect()
    };
    let packed16 = |x: &[f32], shape: &[u64]| {
        json!({"encoding": "base64", "dtype": "f16", "shape": shape,
               "data": base64::engine::general_purpose::STANDARD.encode(f16_bytes(x))})
    };
    let json16: Value = s
        .post(
            "/linalg/matmul",
            json!({"a": packed16(&a, &[m, k]), "b": packed16(&b, &[k, n])}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let bulk16 = body(
        json!({}),
        vec![
            Buf {
                at: "/a",
                dtype: Dtype::F16,
                shape: vec![m, k],
                bytes: f16_bytes(&a),
            },
            Buf {
                at: "/b",
                dtype: Dtype::F16,
                shape: vec![k, n],
                bytes: f16_bytes(&b),
            },
        ],
    );
    let got = answer(post(&s, "/linalg/matmul", bulk16, true).await).await;
    assert_eq!(got.header["dtype"], "f16");
    let (r, bytes) = &got.buffers["/result"];
    assert_eq!(r.dtype, Dtype::F16);
    let want16 = base64::engine::general_purpose::STANDARD
        .decode(json16["result"]["data"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes, &want16);
}

#[tokio::test]
async fn framing_and_layout_refusals_name_the_descriptor_member() {
    let s = TestServer::start(&[]).await;
    let matmul = |body: Vec<u8>| post(&s, "/linalg/matmul", body, false);

    // Framing: 400 before any JSON is read.
    problem(matmul(vec![1, 2, 3]).await, 400, "malformed_bulk_body").await;
    let mut past_end = 100u64.to_le_bytes().to_vec();
    past_end.extend_from_slice(b"{}");
    problem(matmul(past_end).await, 400, "malformed_bulk_body").await;
    let mut too_long = (2u64 << 20).to_le_bytes().to_vec();
    too_long.extend_from_slice(b"{}");
    problem(matmul(too_long).await, 400, "malformed_bulk_body").await;
    // The header is JSON like any body.
    problem(
        matmul(raw(&json!("x"), &[])[..].to_vec()).await,
        422,
        "invalid_request",
    )
    .await;
    let mut not_json = 3u64.to_le_bytes().to_vec();
    not_json.extend_from_slice(b"{a}");
    problem(matmul(not_json).await, 400, "malformed_json").await;

    let a = |offset: u64, length: u64| json!({"dtype": "f32", "shape": [2, 2], "byte_offset": offset, "byte_length": length});
    let b = json!({"dtype": "f32", "shape": [2, 2], "byte_offset": 64, "byte_length": 16});
    let data = vec![0u8; 80];
    let at = |body: Value| body["errors"][0]["path"].as_str().unwrap().to_string();

    // Layout: each defect at the member at fault.
    let p = problem(
        matmul(raw(&json!({"a": a(0, 12), "b": b}), &data)).await,
        422,
        "invalid_buffer",
    )
    .await;
    assert_eq!(at(p), "/a/byte_length");
    let p = problem(
        matmul(raw(&json!({"a": a(8, 16), "b": b}), &data)).await,
        422,
        "invalid_buffer",
    )
    .await;
    assert_eq!(at(p), "/a/byte_offset");
    let p = problem(
        matmul(raw(&json!({"a": a(0, 16), "b": b}), &data[..70])).await,
        422,
        "invalid_buffer",
    )
    .await;
    assert_eq!(at(p), "/b/byte_length");
    let p = problem(
        matmul(raw(
            &json!({"a": a(0, 16), "b": b}),
            &[data.clone(), vec![0; 64]].concat(),
        ))
        .await,
        422,
        "invalid_buffer",
    )
    .await;
    assert!(
        p["detail"].as_str().unwrap().contains("data section"),
        "{p}"
    );
    let extra =
        json!({"dtype": "f32", "shape": [2, 2], "byte_offset": 0, "byte_length": 16, "stride": 4});
    let p = problem(
        matmul(raw(&json!({"a": extra, "b": b}), &data)).await,
        422,
        "invalid_buffer",
    )
    .await;
    assert!(at(p).starts_with("/a"));

    // Past the layout, the same checks as JSON: a dtype the tensor cannot take, values.
    let u32s = json!({"dtype": "u32", "shape": [2, 2], "byte_offset": 0, "byte_length": 16});
    let p = problem(
        matmul(raw(&json!({"a": u32s, "b": b}), &data)).await,
        422,
        "invalid_request",
    )
    .await;
    assert_eq!(at(p), "/a/dtype");
    let mut nan = data.clone();
    nan[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
    let p = problem(
        matmul(raw(&json!({"a": a(0, 16), "b": b}), &nan)).await,
        422,
        "invalid_tensor",
    )
    .await;
    assert_eq!(at(p), "/a");
    let chained = json!({"dtype": "f32", "shape": [4, 1], "byte_offset": 64, "byte_length": 16});
    let p = problem(
        matmul(raw(&json!({"a": a(0, 16), "b": chained}), &data)).await,
        422,
        "invalid_tensor",
    )
    .await;
    assert_eq!(at(p), "/b/shape");

    // A descriptor has no meaning in a JSON body.
    let res = s
        .post("/linalg/matmul", json!({"a": a(0, 16), "b": b}))
        .send()
        .await
        .unwrap();
    let p = problem(res, 422, "invalid_request").await;
    assert_eq!(at(p), "/a");

    // Neither JSON nor bulk.
    let res = reqwest::Client::new()
        .post(format!("{}/linalg/matmul", s.url))
        .header("content-type", "application/octet-stream")
        .body(vec![0u8; 8])
        .send()
        .await
        .unwrap();
    let p = problem(res, 415, "unsupported_media_type").await;
    assert!(p["detail"].as_str().unwrap().contains(wire::MEDIA_TYPE));

    // Still serving.
    let ok = post(
        &s,
        "/linalg/matmul",
        raw(&json!({"a": a(0, 16), "b": b}), &data),
        true,
    )
    .await;
    assert_eq!(answer(ok).await.buffers["/result"].1, vec![0u8; 16]);
}

#[tokio::test]
async fn json_answers_stay_json_unless_the_bulk_form_is_preferred() {
    let s = TestServer::start(&[]).await;
    let data = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let bulk = || {
        body(
            json!({}),
            vec![
                Buf {
                    at: "/a",
                    dtype: Dtype::F32,
                    shape: vec![2, 2],
                    bytes: data.clone(),
                },
                Buf {
                    at: "/b",
                    dtype: Dtype::F32,
                    shape: vec![2, 2],
                    bytes: data.clone(),
                },
            ],
        )
    };
    for (accept, bulk_answer) in [
        ("application/json", false),
        ("*/*", false),
        (wire::MEDIA_TYPE, true),
        ("application/json, application/vnd.gpu-ops.bulk", true),
        (
            "application/json;q=1, application/vnd.gpu-ops.bulk;q=0.9",
            false,
        ),
        ("application/vnd.gpu-ops.bulk;q=0", false),
    ] {
        let res = reqwest::Client::new()
            .post(format!("{}/linalg/matmul", s.url))
            .header("content-type", wire::MEDIA_TYPE)
            .header("accept", accept)
            .body(bulk())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{accept}");
        let media = if bulk_answer {
            wire::MEDIA_TYPE
        } else {
            "application/json"
        };
        assert_eq!(res.headers()["content-type"], media, "{accept}");
        assert_eq!(res.headers()["vary"], "accept", "{accept}");
    }
}
