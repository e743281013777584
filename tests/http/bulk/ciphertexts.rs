//! HE aggregation in both forms: ciphertexts as `u8` buffers sum to the JSON form's bits.

use super::agreement::{agree, json_post};
use super::{body, post, Buf};
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
