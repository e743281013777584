//! HE in both forms: ciphertexts as `u8` buffers sum to the JSON form's bits; the dealer's
//! keys, encryption and decryption take and answer keys, ciphertexts and slots as buffers.

use super::agreement::{agree, json_post};
use super::{answer, body, post, Buf};
use crate::common::{problem, TestServer};
use base64::Engine;
use gpu_ops::wire::Dtype;
use serde_json::json;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ciphertext_sums_agree_in_both_forms() {
    let s = TestServer::start(&["--he-dealer-mode"]).await;
    let set = "bfv128_n4096";
    let keys = json_post(&s, "/he/keys", &json!({"parameters": set})).await;
    let mut cts = Vec::new();
    for k in 0..3u64 {
        let values: Vec<u64> = (0..50).map(|i| (i * 31 + k * 7) % 65537).collect();
        let encrypt =
            json!({"parameters": set, "public_key": keys["public_key"], "values": values});
        cts.push(json_post(&s, "/he/encrypt", &encrypt).await["ciphertext"].clone());
    }
    let request = json!({"parameters": set, "ciphertexts": cts, "weights": [1, 2, 3]});
    let ats: Vec<String> = (0..cts.len())
        .map(|i| format!("/ciphertexts/{i}"))
        .collect();
    let buffers = |dtype| {
        ats.iter()
            .zip(&cts)
            .map(|(at, ct)| {
                let bytes = B64.decode(ct.as_str().unwrap()).unwrap();
                Buf {
                    at,
                    dtype,
                    shape: vec![bytes.len() as u64],
                    bytes,
                }
            })
            .collect()
    };
    agree(
        &s,
        "/he/aggregate",
        &request,
        body(request.clone(), buffers(Dtype::U8)),
    )
    .await;

    // A ciphertext buffer is bytes: another dtype is refused at the descriptor's member.
    let u32_words = body(
        json!({"parameters": set, "ciphertexts": ["", ""]}),
        ats[..2]
            .iter()
            .map(|at| Buf {
                at,
                dtype: Dtype::U32,
                shape: vec![2],
                bytes: vec![0; 8],
            })
            .collect(),
    );
    let p = problem(
        post(&s, "/he/aggregate", u32_words, false).await,
        422,
        "invalid_parameter",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/ciphertexts/0/dtype");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dealer_calls_take_and_answer_the_bulk_form() {
    let s = TestServer::start(&["--he-dealer-mode"]).await;
    let set = "bfv128_n4096";
    let keys = reqwest::Client::new()
        .post(format!("{}/he/keys", s.url))
        .header("accept", gpu_ops::wire::MEDIA_TYPE)
        .json(&json!({"parameters": set}))
        .send()
        .await
        .unwrap();
    let keys = answer(keys).await;
    assert_eq!(keys.header["slots"], 4096);
    let key = |at: &str| {
        let (r, bytes) = &keys.buffers[at];
        assert_eq!(
            (r.dtype, r.shape.clone()),
            (Dtype::U8, vec![bytes.len() as u64])
        );
        bytes.clone()
    };
    let (public_key, secret_key) = (key("/public_key"), key("/secret_key"));

    // Encrypted from buffers, answered as one: its randomness differs from any other
    // encryption, so it is checked by decrypting it.
    let values: Vec<u64> = (0..300).map(|i| (i * 977 + 5) % 65537).collect();
    let encrypt = body(
        json!({"parameters": set}),
        vec![
            Buf {
                at: "/public_key",
                dtype: Dtype::U8,
                shape: vec![public_key.len() as u64],
                bytes: public_key,
            },
            Buf {
                at: "/values",
                dtype: Dtype::U64,
                shape: vec![300],
                bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
        ],
    );
    let ct = answer(post(&s, "/he/encrypt", encrypt, true).await).await;
    let (r, ciphertext) = &ct.buffers["/ciphertext"];
    assert_eq!(r.dtype, Dtype::U8);

    // Decryption answers the same slots in both forms, and they are the values sent.
    let request = json!({"parameters": set, "secret_key": B64.encode(&secret_key),
                         "ciphertext": B64.encode(ciphertext)});
    let bulk = body(
        json!({"parameters": set}),
        vec![
            Buf {
                at: "/secret_key",
                dtype: Dtype::U8,
                shape: vec![secret_key.len() as u64],
                bytes: secret_key.clone(),
            },
            Buf {
                at: "/ciphertext",
                dtype: Dtype::U8,
                shape: vec![ciphertext.len() as u64],
                bytes: ciphertext.clone(),
            },
        ],
    );
    agree(&s, "/he/decrypt", &request, bulk).await;
    let slots = json_post(&s, "/he/decrypt", &request).await["values"].clone();
    let slots: Vec<u64> = serde_json::from_value(slots).unwrap();
    assert_eq!(slots[..300], values[..]);
    assert!(slots[300..].iter().all(|&v| v == 0));

    // Slot values are u64: another dtype is refused at the descriptor's member.
    let as_f64 = body(
        json!({"parameters": set, "public_key": B64.encode(&secret_key)}),
        vec![Buf {
            at: "/values",
            dtype: Dtype::F64,
            shape: vec![1],
            bytes: 1f64.to_le_bytes().to_vec(),
        }],
    );
    let p = problem(
        post(&s, "/he/encrypt", as_f64, false).await,
        422,
        "invalid_parameter",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/values/dtype");
}
