//! Resident recordings (`POST /arrays` with `kind: "recording"`, and `/rf/iq`'s `keep`):
//! `/rf/features` over a named recording answers as over the same samples sent, in
//! either upload form; the data reads back bit for bit; what does not fit is refused at
//! the field, and a keep past the quota keeps nothing.

use crate::bulk::{body, get_answer, post, Buf};
use crate::common::{problem, TestServer};
use base64::Engine;
use gpu_ops::wire::Dtype;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
const FS: f64 = 200_000.0;

/// The JSON of a 200 or 201: a `POST` of `body`, or a `GET` where `body` is null.
async fn ok(s: &TestServer, path: &str, body: Value) -> Value {
    let res = match body {
        Value::Null => s.get(path).await,
        body => s.post(path, body).send().await.unwrap(),
    };
    let status = res.status();
    let text = res.text().await.unwrap();
    assert!(status == 200 || status == 201, "{path}: {status} {text}");
    serde_json::from_str(&text).unwrap()
}

/// `n` samples of a tone at `FS / 16` with a small ramp, as `cf32_le`: finite, and
/// different sample to sample.
fn tone(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let ph = std::f64::consts::TAU * i as f64 / 16.0;
            let ramp = 1.0 + i as f64 / n as f64;
            [(ramp * ph.cos()) as f32, (ramp * ph.sin()) as f32]
        })
        .flat_map(f32::to_le_bytes)
        .collect()
}

fn features(iq: Value) -> Value {
    json!({"sample_rate_hz": FS, "iq": iq, "chunk_ms": 1.0, "per_chunk": true})
}

/// The small scenario `/rf/iq` generates in these tests: 2 receivers of 1 000 samples.
fn scenario(keep: Value) -> Value {
    json!({"seed": 7, "sample_index": 3, "keep": keep,
           "config": {"signal": {"duration_ms": 5.0}, "chunk_ms": 5.0,
                      "geometry": {"receivers_min": 2, "receivers_max": 2}}})
}

#[tokio::test]
async fn recordings_kept_from_rf_iq_read_as_the_recordings_sent() {
    let s = TestServer::start(&[]).await;
    let kept = ok(
        &s,
        "/rf/iq",
        scenario(json!({"name": "rx", "ttl_seconds": 600})),
    )
    .await;
    let n = kept["samples_per_recording"].as_u64().unwrap();
    let fs = kept["sample_rate_hz"].clone();
    let receivers = kept["receivers"].as_array().unwrap();
    assert_eq!(receivers.len(), 2);
    for rx in receivers {
        let view = &rx["kept"];
        assert_eq!(
            (
                &view["kind"],
                &view["length"],
                &view["size_bytes"],
                &view["name"]
            ),
            (&json!("recording"), &json!(n), &json!(8 * n), &json!("rx")),
            "{view}"
        );
        let id = view["id"].as_str().unwrap();
        let read = ok(&s, &format!("/arrays/{id}"), Value::Null).await;
        assert_eq!(read["id"], view["id"]);
        // The features over the kept recording are those over the answer's samples.
        let body = |iq: Value| json!({"sample_rate_hz": fs, "iq": iq, "chunk_ms": 5.0});
        let sent = ok(&s, "/rf/features", body(rx["iq"].clone())).await;
        let named = ok(&s, "/rf/features", body(json!({"array": id}))).await;
        assert_eq!(named, sent);
        // The data reads back as the answer's base64, and in the bulk form as cf32.
        let data = ok(&s, &format!("/arrays/{id}/data"), Value::Null).await;
        assert_eq!(
            (&data["kind"], &data["iq"]),
            (&json!("recording"), &rx["iq"])
        );
        let bulk = get_answer(&s, &format!("/arrays/{id}/data")).await;
        let (buf, bytes) = &bulk.buffers["/iq"];
        assert_eq!((buf.dtype, buf.shape.as_slice()), (Dtype::Cf32, &[n][..]));
        assert_eq!(*bytes, B64.decode(rx["iq"].as_str().unwrap()).unwrap());
    }

    // Without the data: the same recordings, kept and not answered.
    let quiet = ok(&s, "/rf/iq", scenario(json!({"with_data": false}))).await;
    for (rx, loud) in quiet["receivers"].as_array().unwrap().iter().zip(receivers) {
        assert!(rx.get("iq").is_none(), "{rx}");
        assert_eq!(rx["truth"], loud["truth"]);
        let id = rx["kept"]["id"].as_str().unwrap();
        let data = ok(
            &s,
            &format!("/arrays/{id}/data?encoding=base64"),
            Value::Null,
        )
        .await;
        assert_eq!(data["iq"], loud["iq"]);
        let hex = s.get(&format!("/arrays/{id}/data?encoding=hex")).await;
        let p = problem(hex, 422, "invalid_parameter").await;
        assert_eq!(p["errors"][0]["path"], "/encoding", "{p}");
    }
    let listed = ok(&s, "/arrays", Value::Null).await;
    assert_eq!(listed["arrays"].as_array().unwrap().len(), 4);
}

#[tokio::test]
async fn recordings_upload_as_base64_or_a_bulk_buffer_and_features_agree() {
    let s = TestServer::start(&[]).await;
    let iq = tone(1000);
    let text = ok(
        &s,
        "/arrays",
        json!({"kind": "recording", "iq": B64.encode(&iq), "name": "tone"}),
    )
    .await;
    assert_eq!(
        (&text["kind"], &text["length"], &text["size_bytes"]),
        (&json!("recording"), &json!(1000), &json!(8000))
    );
    let res = post(
        &s,
        "/arrays",
        body(
            json!({"kind": "recording"}),
            vec![Buf {
                at: "/iq",
                dtype: Dtype::Cf32,
                shape: vec![1000],
                bytes: iq.clone(),
            }],
        ),
        false,
    )
    .await;
    assert_eq!(res.status(), 201);
    let buffer: Value = res.json().await.unwrap();
    let copy = ok(
        &s,
        "/arrays",
        json!({"kind": "recording", "iq": {"array": text["id"]}}),
    )
    .await;
    assert_eq!(copy["length"], 1000);

    let sent = ok(&s, "/rf/features", features(json!(B64.encode(&iq)))).await;
    assert_eq!(sent["chunks"], 5);
    for made in [&text, &buffer, &copy] {
        let named = ok(&s, "/rf/features", features(json!({"array": made["id"]}))).await;
        assert_eq!(named, sent, "{}", made["id"]);
    }
    // Named in a bulk header too, with no buffers.
    let framed = body(features(json!({"array": buffer["id"]})), vec![]);
    let res = post(&s, "/rf/features", framed, false).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap(), sent);
}

#[tokio::test]
async fn recordings_that_do_not_fit_are_refused_at_the_field() {
    let s = TestServer::start(&[]).await;
    let refused = |path: &'static str, body: Value, status: u16, code: &'static str, at: &str| {
        let (s, at) = (&s, at.to_string());
        async move {
            let res = s.post(path, body.clone()).send().await.unwrap();
            let p = problem(res, status, code).await;
            assert_eq!(p["errors"][0]["path"], at, "{body} → {p}");
        }
    };
    let tensor = ok(
        &s,
        "/arrays",
        json!({"kind": "tensor", "tensor": [1.0, 2.0]}),
    )
    .await;
    let mut nan = tone(200);
    nan[8 * 7 + 4..8 * 7 + 8].copy_from_slice(&f32::NAN.to_le_bytes());
    let cases = [
        (json!({"kind": "recording"}), "invalid_request", "/iq"),
        (
            json!({"kind": "recording", "iq": B64.encode(tone(2)), "tensor": [1.0]}),
            "invalid_request",
            "/tensor",
        ),
        (
            json!({"kind": "tensor", "iq": B64.encode(tone(2))}),
            "invalid_request",
            "/iq",
        ),
        (
            json!({"kind": "recording", "iq": B64.encode([0u8; 12])}),
            "invalid_tensor",
            "/iq",
        ),
        (
            json!({"kind": "recording", "iq": B64.encode(&nan)}),
            "invalid_tensor",
            "/iq",
        ),
        (
            json!({"kind": "recording", "iq": "not base64!"}),
            "invalid_tensor",
            "/iq",
        ),
        (
            json!({"kind": "recording", "iq": {"array": tensor["id"]}}),
            "array_mismatch",
            "/iq/array",
        ),
    ];
    for (body, code, at) in cases {
        refused("/arrays", body, 422, code, at).await;
    }
    refused(
        "/rf/features",
        features(json!({"array": tensor["id"]})),
        422,
        "array_mismatch",
        "/iq/array",
    )
    .await;
    refused(
        "/rf/features",
        features(json!({"array": "arr_0000000000000000deadbeef"})),
        422,
        "unknown_array",
        "/iq/array",
    )
    .await;
    // A recording too short for a chunk is refused by the features as one sent would be.
    let short = ok(
        &s,
        "/arrays",
        json!({"kind": "recording", "iq": B64.encode(tone(10))}),
    )
    .await;
    let res = s
        .post("/rf/features", features(json!({"array": short["id"]})))
        .send()
        .await
        .unwrap();
    problem(res, 422, "invalid_parameter").await;
    // A buffer of another dtype names its descriptor's member.
    let res = post(
        &s,
        "/arrays",
        body(
            json!({"kind": "recording"}),
            vec![Buf {
                at: "/iq",
                dtype: Dtype::F32,
                shape: vec![4],
                bytes: vec![0; 16],
            }],
        ),
        false,
    )
    .await;
    let p = problem(res, 422, "invalid_tensor").await;
    assert_eq!(p["errors"][0]["path"], "/iq/dtype", "{p}");
}

/// `/rf/iq`'s keep is all or none: past the tenant's count, the first receiver's
/// recording, already stored, is removed again.
#[tokio::test]
async fn a_keep_past_the_quota_keeps_no_recording() {
    let s = TestServer::start(&["--max-tenant-arrays", "1"]).await;
    let res = s.post("/rf/iq", scenario(json!({}))).send().await.unwrap();
    problem(res, 422, "array_quota_exceeded").await;
    let listed = ok(&s, "/arrays", Value::Null).await;
    assert_eq!(listed["arrays"], json!([]), "{listed}");
    // Without keep the same request answers.
    let mut plain = scenario(Value::Null);
    plain.as_object_mut().unwrap().remove("keep");
    let answered = ok(&s, "/rf/iq", plain).await;
    assert_eq!(answered["receivers"].as_array().unwrap().len(), 2);
}
