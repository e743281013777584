//! Shamir sharing and the RF recordings in both forms: the same bits as JSON, and a
//! buffer refused at its descriptor's member.

use super::agreement::{agree, json_post, vectors_as_buffers, words};
use super::{answer, body, post, Buf};
use crate::common::{problem, TestServer};
use base64::Engine;
use gpu_ops::wire::Dtype;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[tokio::test]
async fn shamir_sharing_agrees_in_both_forms() {
    // Seeded, so that both forms deal the same polynomials.
    let s = TestServer::start(&["--dp-allow-client-seed"]).await;
    for (field, dtype, width) in [
        ("babybear", Dtype::U32, 4),
        ("goldilocks", Dtype::U64, 8),
        ("bn254_fr", Dtype::U256, 32),
    ] {
        let secrets: Vec<u64> = (1..=10).map(|i| i * 104_729 + 3).collect();
        let split = json!({"field": field, "secrets": words(&secrets, width), "threshold": 2,
                           "share_count": 3, "seed": 5, "encoding": "base64"});
        agree(
            &s,
            "/mpc/shamir/split",
            &split,
            vectors_as_buffers(&split, &["/secrets"], dtype, width),
        )
        .await;
        let shares = json_post(&s, "/mpc/shamir/split", &split).await["shares"].clone();
        let combine =
            json!({"field": field, "threshold": 2, "shares": shares, "encoding": "base64"});
        agree(
            &s,
            "/mpc/shamir/combine",
            &combine,
            vectors_as_buffers(
                &combine,
                &["/shares/0/values", "/shares/1/values", "/shares/2/values"],
                dtype,
                width,
            ),
        )
        .await;
    }

    // A share checked against its commitments, the share's values a buffer; the answer
    // has no buffer, so a bulk answer is its header alone.
    let secrets: Vec<u64> = (1..=4).collect();
    let split = json!({"field": "bn254_fr", "secrets": words(&secrets, 32), "threshold": 2,
                       "share_count": 2, "commitments": true, "encoding": "base64"});
    let dealt = json_post(&s, "/mpc/shamir/split", &split).await;
    let verify = json!({"field": "bn254_fr", "share": dealt["shares"][1],
                        "commitments": dealt["commitments"]["rows"], "encoding": "base64"});
    let want = json_post(&s, "/mpc/shamir/verify", &verify).await;
    assert_eq!(want["valid"], true, "{want}");
    let bulk = vectors_as_buffers(&verify, &["/share/values"], Dtype::U256, 32);
    let got = answer(post(&s, "/mpc/shamir/verify", bulk, true).await).await;
    assert!(got.buffers.is_empty());
    assert_eq!(got.header, want);

    // A share in another field's width is refused at its dtype.
    let combine = json!({"field": "goldilocks", "threshold": 1,
                         "shares": [{"x": "1", "values": ""}]});
    let bulk = body(
        combine,
        vec![Buf {
            at: "/shares/0/values",
            dtype: Dtype::U32,
            shape: vec![1],
            bytes: vec![1, 0, 0, 0],
        }],
    );
    let p = problem(
        post(&s, "/mpc/shamir/combine", bulk, false).await,
        422,
        "invalid_request",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/shares/0/values/dtype");
}

/// I/Q pairs of a tone with a little noise-like ripple: a recording with a signal.
fn recording(samples: usize) -> Vec<u8> {
    (0..samples)
        .flat_map(|i| {
            let phase = i as f32 * 0.3;
            let ripple = ((i * 7919) % 13) as f32 / 130.0;
            let (re, im) = (phase.cos() + ripple, phase.sin() - ripple);
            re.to_le_bytes().into_iter().chain(im.to_le_bytes())
        })
        .collect()
}

#[tokio::test]
async fn rf_recordings_agree_in_both_forms() {
    let s = TestServer::start(&[]).await;
    let iq = recording(4096);
    let features = json!({"sample_rate_hz": 200_000.0, "iq": B64.encode(&iq),
                          "chunk_ms": 5.0, "per_chunk": true});
    let want = json_post(&s, "/rf/features", &features).await;
    // `header` with its `iq` as a buffer.
    let buffer_in = |header: &Value, dtype, shape: Vec<u64>, bytes: Vec<u8>| {
        let mut header = header.clone();
        header.as_object_mut().unwrap().remove("iq");
        body(
            header,
            vec![Buf {
                at: "/iq",
                dtype,
                shape,
                bytes,
            }],
        )
    };
    let buffer = |dtype, shape, bytes| buffer_in(&features, dtype, shape, bytes);
    let res = post(
        &s,
        "/rf/features",
        buffer(Dtype::Cf32, vec![4096], iq.clone()),
        false,
    )
    .await;
    assert_eq!(res.status(), 200, "{:?}", res.text().await);
    assert_eq!(res.json::<Value>().await.unwrap(), want);

    // The recording's dtype and shape are checked, and a buffer takes no encoding.
    for (dtype, shape, at) in [
        (Dtype::F32, vec![8192], "/iq/dtype"),
        (Dtype::Cf32, vec![64, 64], "/iq/shape"),
    ] {
        let p = problem(
            post(&s, "/rf/features", buffer(dtype, shape, iq.clone()), false).await,
            422,
            "invalid_tensor",
        )
        .await;
        assert_eq!(p["errors"][0]["path"], at);
    }
    // A bulk header may keep the JSON request's `encoding`, which names the text form.
    let mut encoded = features.clone();
    encoded["encoding"] = json!("base64");
    let bulk = buffer_in(&encoded, Dtype::Cf32, vec![4096], iq);
    let res = post(&s, "/rf/features", bulk, false).await;
    assert_eq!(res.status(), 200, "{:?}", res.text().await);
    assert_eq!(res.json::<Value>().await.unwrap(), want);

    // Generated recordings: each receiver's IQ a cf32 buffer of the JSON answer's bytes.
    let request = json!({"seed": 7, "sample_index": 2,
        "config": {"signal": {"duration_ms": 5.0}, "chunk_ms": 5.0,
                   "geometry": {"receivers_min": 3, "receivers_max": 3}}});
    agree(&s, "/rf/iq", &request, body(request.clone(), vec![])).await;
    let got = answer(post(&s, "/rf/iq", body(request, vec![]), true).await).await;
    assert_eq!(got.buffers.len(), 3);
    for (r, _) in got.buffers.values() {
        assert_eq!(r.dtype, Dtype::Cf32);
    }
}
