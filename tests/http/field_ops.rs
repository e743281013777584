//! The field vector ops over HTTP: results against an independent big-integer oracle,
//! in every encoding, and each kind of bad input with its problem code.

use crate::common;

use base64::Engine;
use common::{problem, TestServer};
use gpu_ops::ops::zk::samples::{edge_values, random_elements};
use gpu_ops::ops::zk::{Field, U256};
use num_bigint::BigUint;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn big(v: &U256) -> BigUint {
    BigUint::from_slice(
        &v.0.iter()
            .flat_map(|l| [*l as u32, (*l >> 32) as u32])
            .collect::<Vec<_>>(),
    )
}

fn oracle(op: &str, field: Field, x: &U256, y: &U256) -> BigUint {
    let p = big(&field.modulus());
    match op {
        "field_add" => (big(x) + big(y)) % &p,
        "field_sub" => (big(x) + &p - big(y)) % &p,
        _ => (big(x) * big(y)) % &p,
    }
}

fn field_name(f: Field) -> &'static str {
    f.name()
}

#[tokio::test]
async fn every_op_and_field_matches_the_oracle_including_edges_and_broadcast() {
    let s = TestServer::start(&[]).await;
    for field in Field::ALL {
        let mut xs = edge_values(field);
        let mut ys: Vec<U256> = xs.iter().rev().copied().collect();
        xs.extend(random_elements(field, 200, 11));
        ys.extend(random_elements(field, 200, 12));
        for op in ["field_add", "field_sub", "field_mul"] {
            for broadcast in [false, true] {
                let b = if broadcast { vec![ys[3]] } else { ys.clone() };
                let res = s
                    .post(
                        &format!("/zk/{op}"),
                        json!({
                            "field": field_name(field),
                            "a": xs.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
                            "b": b.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
                        }),
                    )
                    .send()
                    .await
                    .unwrap();
                assert_eq!(res.status(), 200);
                assert_eq!(res.headers()["x-backend"], "cpu");
                for h in ["x-queue-time-ms", "x-compute-time-ms", "x-request-id"] {
                    assert!(res.headers().contains_key(h), "{h}");
                }
                let body: Value = res.json().await.unwrap();
                assert_eq!(body["length"], xs.len());
                let result = body["result"].as_array().unwrap();
                for (i, x) in xs.iter().enumerate() {
                    let y = if broadcast { &b[0] } else { &b[i] };
                    let want = oracle(op, field, x, y).to_str_radix(10);
                    assert_eq!(result[i], want, "{op} {field:?} element {i}");
                }
            }
        }
    }
}

#[tokio::test]
async fn hex_and_base64_answer_in_kind() {
    let s = TestServer::start(&[]).await;
    let res: Value = s
        .post("/zk/field_add", json!({"field": "goldilocks", "a": ["0xff", "1"], "b": ["1", "0x0"], "encoding": "hex"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(res["result"], json!(["0x100", "0x1"]));

    let a: Vec<u8> = [3u64, u64::MAX - (1 << 32)]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let b: Vec<u8> = 5u64.to_le_bytes().to_vec();
    let res: Value = s
        .post(
            "/zk/field_mul",
            json!({"field": "goldilocks", "a": B64.encode(&a), "b": B64.encode(&b), "encoding": "base64"}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(res["encoding"], "base64");
    let out = B64.decode(res["result"].as_str().unwrap()).unwrap();
    let p = 0xffff_ffff_0000_0001u128;
    let want: Vec<u8> = [15u128, (u128::from(u64::MAX - (1 << 32)) * 5) % p]
        .iter()
        .flat_map(|v| (*v as u64).to_le_bytes())
        .collect();
    assert_eq!(out, want);

    // BN254 over base64: 32 bytes per element, p - 1 + 1 = 0.
    let mut pm1 = Field::Bn254Fr.modulus();
    pm1.0[0] -= 1;
    let a: Vec<u8> = pm1.0.iter().flat_map(|l| l.to_le_bytes()).collect();
    let mut one = vec![0u8; 32];
    one[0] = 1;
    let res: Value = s
        .post("/zk/field_add", json!({"field": "bn254_fr", "a": B64.encode(&a), "b": B64.encode(&one), "encoding": "base64"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        B64.decode(res["result"].as_str().unwrap()).unwrap(),
        vec![0u8; 32]
    );
}

async fn bad(s: &TestServer, body: Value, status: u16, code: &str) -> Value {
    problem(
        s.post("/zk/field_add", body).send().await.unwrap(),
        status,
        code,
    )
    .await
}

#[tokio::test]
async fn bad_inputs_get_their_problem_code_and_path() {
    let s = TestServer::start(&["--max-elements", "4"]).await;
    let p = "18446744069414584321";
    // (body, status, code, JSON pointer of the first listed error)
    let cases = [
        (
            json!({"field": "goldilocks", "a": ["1", p], "b": ["1"]}),
            422,
            "invalid_field_element",
            "/a/1",
        ),
        (
            json!({"field": "goldilocks", "a": ["1"], "b": ["-1"]}),
            422,
            "invalid_field_element",
            "/b/0",
        ),
        (
            json!({"field": "goldilocks", "a": [1, "2"], "b": ["1"]}),
            422,
            "invalid_field_element",
            "/a/0",
        ),
        (
            json!({"field": "goldilocks", "a": ["1", "2", "3"], "b": ["1", "2"]}),
            422,
            "length_mismatch",
            "/b",
        ),
        (
            json!({"field": "goldilocks", "a": [], "b": []}),
            422,
            "length_mismatch",
            "/b",
        ),
        (
            json!({"field": "pallas_fr", "a": ["1"], "b": ["1"]}),
            422,
            "invalid_request",
            "/field",
        ),
        (
            json!({"a": ["1"], "b": ["1"]}),
            422,
            "invalid_request",
            "/field",
        ),
        (
            json!({"field": "goldilocks", "a": ["1"], "b": ["1"], "c": 1}),
            422,
            "invalid_request",
            "/c",
        ),
        (
            json!({"field": "goldilocks", "a": ["1"], "b": ["1"], "timeout_ms": 0}),
            422,
            "invalid_parameter",
            "/timeout_ms",
        ),
        (
            json!({"field": "goldilocks", "a": "AQ==", "b": ["1"]}),
            422,
            "invalid_request",
            "/a",
        ),
        (
            json!({"field": "goldilocks", "a": "%%%", "b": "AQ==", "encoding": "base64"}),
            422,
            "invalid_field_element",
            "/a",
        ),
        (
            json!({"field": "goldilocks", "a": ["1", "1", "1", "1", "1"], "b": ["1"]}),
            413,
            "payload_too_large",
            "/a",
        ),
    ];
    for (body, status, code, path) in cases {
        let problem = bad(&s, body.clone(), status, code).await;
        assert_eq!(problem["errors"][0]["path"], path, "{body}");
        if body["a"][0].is_number() {
            let message = problem["errors"][0]["message"].as_str().unwrap();
            assert!(message.contains("strings"), "{message}");
        }
    }

    let res = s
        .client
        .post(format!("{}/zk/field_add", s.url))
        .header("content-type", "application/json")
        .body("{\"field\":")
        .send()
        .await
        .unwrap();
    problem(res, 400, "malformed_json").await;
    let res = s
        .client
        .post(format!("{}/zk/field_add", s.url))
        .body("field=goldilocks")
        .send()
        .await
        .unwrap();
    problem(res, 415, "unsupported_media_type").await;
    problem(s.get("/zk/nothing").await, 404, "not_found").await;
    problem(s.get("/zk/field_add").await, 405, "method_not_allowed").await;

    // Still serving after all of that.
    let res = s
        .post(
            "/zk/field_sub",
            json!({"field": "goldilocks", "a": ["0"], "b": ["1"]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.json::<Value>().await.unwrap()["result"],
        json!(["18446744069414584320"])
    );
}

#[tokio::test]
async fn bodies_over_the_limit_get_413() {
    let s = TestServer::start(&["--max-body-bytes", "2048"]).await;
    let a: Vec<String> = (0..500).map(|i| i.to_string()).collect();
    let res = s
        .post(
            "/zk/field_add",
            json!({"field": "goldilocks", "a": a, "b": ["1"]}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 413, "payload_too_large").await;
}

#[tokio::test]
async fn forcing_a_gpu_without_one_is_503_device_unavailable() {
    let s = TestServer::start(&[]).await;
    // `cuda`, the old name, is the same choice as `gpu`.
    for backend in ["gpu", "cuda"] {
        let res = s
            .post(
                "/zk/field_mul",
                json!({"field": "goldilocks", "a": ["2"], "b": ["3"], "backend": backend}),
            )
            .send()
            .await
            .unwrap();
        let body = problem(res, 503, "device_unavailable").await;
        assert!(
            body["detail"].as_str().unwrap().contains("no usable GPU"),
            "{body}"
        );
    }
    let res = s
        .post(
            "/zk/field_mul",
            json!({"field": "goldilocks", "a": ["2"], "b": ["3"], "backend": "cpu"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
}

#[tokio::test]
async fn a_large_vector_round_trips_through_the_blocking_decoder() {
    let s = TestServer::start(&[]).await;
    let n = 50_000u64;
    let a: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let res: Value = s
        .post(
            "/zk/field_mul",
            json!({"field": "goldilocks", "a": a, "b": ["3"]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let result = res["result"].as_array().unwrap();
    assert_eq!(result.len(), n as usize);
    assert_eq!(result[49_999], (49_999u64 * 3).to_string());
}

async fn result_of(s: &TestServer, path: &str, body: Value) -> Vec<BigUint> {
    let res = s.post(path, body).send().await.unwrap();
    assert_eq!(res.status(), 200, "{path}");
    let v: Value = res.json().await.unwrap();
    v["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().parse::<BigUint>().unwrap())
        .collect()
}

#[tokio::test]
async fn pow_and_inv_match_big_integer_arithmetic() {
    let s = TestServer::start(&[]).await;
    for field in Field::ALL {
        let p = big(&field.modulus());
        let xs: Vec<U256> = random_elements(field, 200, 11);
        let es: Vec<U256> = random_elements(Field::Bn254Fr, 200, 12);
        let strings = |v: &[U256]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let got = result_of(
            &s,
            "/zk/field_pow",
            json!({"field": field_name(field), "base": strings(&xs), "exponent": strings(&es)}),
        )
        .await;
        for i in 0..xs.len() {
            assert_eq!(
                got[i],
                big(&xs[i]).modpow(&big(&es[i]), &p),
                "{field:?} pow {i}"
            );
        }
        // One exponent for all, beyond p (exponents are not reduced): x^(p) = x.
        let got = result_of(
            &s,
            "/zk/field_pow",
            json!({"field": field_name(field), "base": strings(&xs[..5]), "exponent": [field.modulus().to_string()]}),
        )
        .await;
        assert!((0..5).all(|i| got[i] == big(&xs[i])));

        let nonzero: Vec<U256> = xs.into_iter().filter(|x| *x != U256::ZERO).collect();
        let got = result_of(
            &s,
            "/zk/field_inv",
            json!({"field": field_name(field), "values": strings(&nonzero)}),
        )
        .await;
        for (x, inv) in nonzero.iter().zip(&got) {
            assert_eq!((big(x) * inv) % &p, BigUint::from(1u32), "{field:?} inv");
        }
    }
    // base64 in, base64 out; exponents are 32 bytes each.
    let base = B64.encode(3u64.to_le_bytes());
    let mut e = [0u8; 32];
    e[0] = 4;
    let res: Value = s
        .post("/zk/field_pow", json!({"field": "goldilocks", "encoding": "base64", "base": base, "exponent": B64.encode(e)}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(res["result"], B64.encode(81u64.to_le_bytes()));
}

#[tokio::test]
async fn pow_and_inv_bad_inputs() {
    let s = TestServer::start(&[]).await;
    let zeros = json!({"field": "goldilocks", "values": ["3", "0", "5", "0"]});
    let p = problem(
        s.post("/zk/field_inv", zeros).send().await.unwrap(),
        422,
        "not_invertible",
    )
    .await;
    let paths: Vec<&str> = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/values/1", "/values/3"]);
    let res = s
        .post(
            "/zk/field_inv",
            json!({"field": "goldilocks", "values": []}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 422, "length_mismatch").await;
    let cases = [
        (
            json!({"field": "bn254_fr", "base": ["1", "2"], "exponent": ["1", "2", "3"]}),
            "length_mismatch",
            "/exponent",
        ),
        (
            json!({"field": "bn254_fr", "base": ["1"], "exponent": ["x"]}),
            "invalid_field_element",
            "/exponent/0",
        ),
        (
            json!({"field": "goldilocks", "base": ["18446744069414584321"], "exponent": ["1"]}),
            "invalid_field_element",
            "/base/0",
        ),
        (
            json!({"field": "goldilocks", "encoding": "base64", "base": "AQAAAAAAAAA=", "exponent": "AQAAAAAAAAA="}),
            "invalid_field_element",
            "/exponent",
        ),
    ];
    for (body, code, path) in cases {
        let res = s.post("/zk/field_pow", body.clone()).send().await.unwrap();
        let p = problem(res, 422, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{body}");
    }
}

#[tokio::test]
async fn ntt_evaluates_on_the_documented_domain_and_intt_inverts_it() {
    let s = TestServer::start(&[]).await;
    for field in Field::ALL {
        let p = big(&field.modulus());
        let n = 8usize;
        let xs = random_elements(field, 3 * n, 21);
        let strings: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
        // ω = g^((p−1)/n); X_k = Σ_j x_j (s ω^k)^j, for s = 1 and s = 3.
        let omega = BigUint::from(field.generator()).modpow(&((&p - 1u32) / n), &p);
        for shift in [1u32, 3] {
            let mut body = json!({"field": field_name(field), "values": strings, "batch": 3});
            if shift != 1 {
                body["coset_shift"] = json!([shift.to_string()]);
            }
            let got = result_of(&s, "/zk/ntt", body.clone()).await;
            for poly in 0..3 {
                for k in 0..n {
                    let point = (BigUint::from(shift) * omega.modpow(&BigUint::from(k), &p)) % &p;
                    let want = (0..n).fold(BigUint::from(0u32), |acc, j| {
                        (acc + big(&xs[poly * n + j]) * point.modpow(&BigUint::from(j), &p)) % &p
                    });
                    assert_eq!(
                        got[poly * n + k],
                        want,
                        "{field:?} shift {shift} poly {poly} k {k}"
                    );
                }
            }
            // Bit-reversed out, then back in through the inverse.
            body["output_order"] = json!("bit_reversed");
            let evals: Vec<String> = result_of(&s, "/zk/ntt", body.clone())
                .await
                .iter()
                .map(|v| v.to_string())
                .collect();
            let mut back = body.clone();
            back["values"] = json!(evals);
            back["input_order"] = json!("bit_reversed");
            back["output_order"] = json!("natural");
            let coeffs = result_of(&s, "/zk/intt", back).await;
            assert!(
                coeffs.iter().zip(&xs).all(|(c, x)| *c == big(x)),
                "{field:?} round trip"
            );
        }
    }
}

#[tokio::test]
async fn ntt_shapes_out_of_range_get_422() {
    let s = TestServer::start(&["--max-ntt-log2", "3"]).await;
    let cases = [
        (
            json!({"field": "babybear", "values": ["1", "2", "3"]}),
            "/values",
        ),
        (
            json!({"field": "babybear", "values": vec!["1"; 16]}),
            "/values",
        ),
        (
            json!({"field": "babybear", "values": ["1", "2"], "batch": 0}),
            "/batch",
        ),
        (
            json!({"field": "babybear", "values": ["1", "2", "3", "4"], "batch": 3}),
            "/batch",
        ),
        (
            json!({"field": "babybear", "values": ["1", "2"], "coset_shift": ["0"]}),
            "/coset_shift",
        ),
        (
            json!({"field": "babybear", "values": ["1", "2"], "coset_shift": ["1", "2"]}),
            "/coset_shift",
        ),
    ];
    for (body, path) in cases {
        let res = s.post("/zk/ntt", body.clone()).send().await.unwrap();
        let p = problem(res, 422, "invalid_parameter").await;
        assert_eq!(p["errors"][0]["path"], path, "{body}: {p}");
    }
}

#[tokio::test]
async fn small_requests_are_batched_and_each_caller_gets_its_own_answer() {
    let s = TestServer::start(&["--batching", "always", "--batch-max-delay", "200ms"]).await;
    let calls: Vec<_> = (0..8u64)
        .map(|i| {
            // Mixed lengths and a broadcast b: the batch must expand and split correctly.
            let a: Vec<String> = (0..=i).map(|k| (k + 100 * i).to_string()).collect();
            let body = json!({"field": "goldilocks", "a": a, "b": [(7 * i).to_string()]});
            let req = s.post("/zk/field_add", body);
            tokio::spawn(async move { req.send().await.unwrap().json::<Value>().await.unwrap() })
        })
        .collect();
    for (i, h) in calls.into_iter().enumerate() {
        let i = i as u64;
        let want: Vec<String> = (0..=i).map(|k| (k + 100 * i + 7 * i).to_string()).collect();
        assert_eq!(h.await.unwrap()["result"], json!(want), "caller {i}");
    }
    assert_eq!(s.metric("gpu_ops_batch_size_sum").await, 8.0);
    let batches = s.metric("gpu_ops_batch_size_count").await;
    assert!(
        batches < 8.0,
        "no two requests shared a launch ({batches} batches)"
    );

    // The default batches only while a GPU is in service: none on this CPU-only server.
    let plain = TestServer::start(&[]).await;
    let body = json!({"field": "goldilocks", "a": ["1"], "b": ["2"]});
    assert_eq!(
        plain
            .post("/zk/field_add", body)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(plain.metric("gpu_ops_batch_size_count").await, 0.0);
}

#[tokio::test]
async fn tiny_requests_run_inline_and_larger_ones_on_the_compute_threads() {
    let s = TestServer::start(&[]).await;
    let inline = r#"gpu_ops_cpu_inline_jobs_total{op="field_mul"}"#;
    let body = json!({"field": "goldilocks", "a": ["3"], "b": ["18446744069414584320"]});
    let res = s.post("/zk/field_mul", body).send().await.unwrap();
    assert_eq!(res.headers()["x-backend"], "cpu");
    // 3 · (p − 1) = −3 mod p.
    assert_eq!(
        res.json::<Value>().await.unwrap()["result"],
        json!(["18446744069414584318"])
    );
    assert_eq!(s.metric(inline).await, 1.0);

    // 1024 BN254 products (the largest inline job) and 1025 (the smallest that is not)
    // both answer the oracle's values; only the first counts as inline.
    let r = Field::Bn254Fr.modulus();
    for (n, inline_after) in [(1024u64, 2.0), (1025, 2.0)] {
        let xs: Vec<U256> = (0..n).map(|k| U256::from_u64(k * 7919 + 1)).collect();
        let mut ys = xs.clone();
        ys[0] = U256([r.0[0] - 1, r.0[1], r.0[2], r.0[3]]);
        let strings = |v: &[U256]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let body = json!({"field": "bn254_fr", "a": strings(&xs), "b": strings(&ys)});
        let got = result_of(&s, "/zk/field_mul", body).await;
        for (k, (x, y)) in xs.iter().zip(&ys).enumerate() {
            assert_eq!(
                got[k],
                oracle("field_mul", Field::Bn254Fr, x, y),
                "n={n} k={k}"
            );
        }
        assert_eq!(s.metric(inline).await, inline_after, "n={n}");
    }

    let off = TestServer::start(&["--cpu-inline-small-jobs", "false"]).await;
    let body = json!({"field": "goldilocks", "a": ["3"], "b": ["5"]});
    let res = off.post("/zk/field_mul", body).send().await.unwrap();
    assert_eq!(res.json::<Value>().await.unwrap()["result"], json!(["15"]));
    assert_eq!(off.metric(inline).await, 0.0);
}

#[tokio::test]
async fn an_impatient_caller_does_not_expire_its_batch_mates() {
    let s = TestServer::start(&["--batching", "always", "--batch-max-delay", "100ms"]).await;
    let patient = s.post(
        "/zk/field_mul",
        json!({"field": "babybear", "a": ["3"], "b": ["4"]}),
    );
    let patient = tokio::spawn(async move { patient.send().await.unwrap() });
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    // Joins the same batch but only waits 20 ms: the batch launches after 100 ms.
    let hasty = s.post(
        "/zk/field_mul",
        json!({"field": "babybear", "a": ["5"], "b": ["6"], "timeout_ms": 20}),
    );
    problem(hasty.send().await.unwrap(), 504, "deadline_exceeded").await;
    let res = patient.await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["result"], json!(["12"]));
}
