//! Shamir secret sharing over HTTP: splits recovered by an independent big-integer
//! Lagrange interpolation, combines from any threshold of shares in every encoding,
//! Feldman commitments that accept true shares and refuse changed ones, and each
//! refusal with its code and the path of the bad field.

use crate::common;

use base64::Engine;
use common::{problem, TestServer};
use gpu_ops::ops::zk::samples::random_elements;
use gpu_ops::ops::zk::Field;
use num_bigint::BigUint;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn strings(field: Field, n: usize, seed: u64) -> Vec<String> {
    random_elements(field, n, seed)
        .iter()
        .map(|x| x.to_string())
        .collect()
}

fn modulus(field: Field) -> BigUint {
    field.modulus().to_string().parse().unwrap()
}

fn parse(v: &Value) -> BigUint {
    let s = v.as_str().unwrap();
    match s.strip_prefix("0x") {
        Some(h) => BigUint::parse_bytes(h.as_bytes(), 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

/// Lagrange at 0 over the given (x, value) pairs, in big integers: the oracle.
fn interpolate_at_zero(p: &BigUint, points: &[(BigUint, BigUint)]) -> BigUint {
    let mut acc = BigUint::from(0u32);
    for (i, (xi, yi)) in points.iter().enumerate() {
        let (mut num, mut den) = (BigUint::from(1u32), BigUint::from(1u32));
        for (l, (xl, _)) in points.iter().enumerate() {
            if l != i {
                num = num * xl % p;
                den = den * ((xl + p - xi) % p) % p;
            }
        }
        let inv = den.modpow(&(p - 2u32), p);
        acc = (acc + yi * num % p * inv) % p;
    }
    acc
}

async fn split(s: &TestServer, body: Value) -> Value {
    let res = s.post("/mpc/shamir/split", body).send().await.unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

async fn combine(s: &TestServer, body: Value) -> reqwest::Response {
    s.post("/mpc/shamir/combine", body).send().await.unwrap()
}

#[tokio::test]
async fn shares_interpolate_to_the_secrets_in_every_field() {
    let s = TestServer::start(&[]).await;
    for field in Field::ALL {
        let secrets = strings(field, 64, 1);
        let p = modulus(field);
        let body = split(
            &s,
            json!({"field": field.name(), "secrets": secrets, "threshold": 3, "share_count": 5,
                   "x_coordinates": ["1", "0x2", "1000", (p.clone() - 1u32).to_string(), "77"]}),
        )
        .await;
        assert_eq!(body["threshold"], 3);
        assert_eq!(body["length"], 64);
        let shares = body["shares"].as_array().unwrap();
        assert_eq!(shares.len(), 5);
        assert_eq!(shares[1]["x"], "2");
        for pick in [[0usize, 1, 2], [4, 3, 1]] {
            for (j, secret) in secrets.iter().enumerate() {
                let points: Vec<(BigUint, BigUint)> = pick
                    .iter()
                    .map(|&i| (parse(&shares[i]["x"]), parse(&shares[i]["values"][j])))
                    .collect();
                assert_eq!(
                    interpolate_at_zero(&p, &points).to_string(),
                    *secret,
                    "{field:?} {pick:?} secret {j}"
                );
            }
        }
        // Two shares of a threshold-3 split: the interpolation through them is not the
        // secret (with probability 1 − 1/p per value).
        let two: Vec<(BigUint, BigUint)> = (0..2)
            .map(|i| (parse(&shares[i]["x"]), parse(&shares[i]["values"][0])))
            .collect();
        assert_ne!(interpolate_at_zero(&p, &two).to_string(), secrets[0]);
    }
}

#[tokio::test]
async fn combine_recovers_from_any_threshold_in_every_encoding_and_checks_the_rest() {
    let s = TestServer::start(&[]).await;
    for field in Field::ALL {
        let secrets = strings(field, 100, 2);
        for encoding in ["decimal", "hex", "base64"] {
            let request = |values: Value| {
                json!({"field": field.name(), "secrets": values, "threshold": 2,
                       "share_count": 4, "encoding": encoding})
            };
            let sent = if encoding == "base64" {
                let ints = random_elements(field, 100, 2);
                let w = field.byte_width();
                let bytes: Vec<u8> = ints
                    .iter()
                    .flat_map(|v| v.to_le_bytes()[..w].to_vec())
                    .collect();
                json!(B64.encode(bytes))
            } else {
                json!(secrets)
            };
            let body = split(&s, request(sent.clone())).await;
            let shares = body["shares"].as_array().unwrap().clone();
            if encoding == "hex" {
                assert!(shares[0]["values"][0].as_str().unwrap().starts_with("0x"));
            }
            for pick in [vec![3, 0], vec![1, 2, 0, 3]] {
                let chosen: Vec<Value> = pick.iter().map(|&i| shares[i].clone()).collect();
                let res = combine(
                    &s,
                    json!({"field": field.name(), "threshold": 2, "shares": chosen, "encoding": encoding}),
                )
                .await;
                assert_eq!(res.status(), 200);
                assert_eq!(res.headers()["x-backend"], "cpu");
                let out: Value = res.json().await.unwrap();
                let want = if encoding == "hex" {
                    json!(secrets
                        .iter()
                        .map(|v| format!("0x{:x}", v.parse::<BigUint>().unwrap()))
                        .collect::<Vec<_>>())
                } else {
                    sent.clone()
                };
                assert_eq!(out["secrets"], want, "{field:?} {encoding} {pick:?}");
                assert_eq!(out["shares_used"], 2);
                assert_eq!(out["shares_checked"], pick.len() - 2);
            }
        }
    }
}

#[tokio::test]
async fn a_changed_share_is_found_and_named() {
    let s = TestServer::start(&[]).await;
    let body = split(
        &s,
        json!({"field": "goldilocks", "secrets": strings(Field::Goldilocks, 10, 3), "threshold": 3, "share_count": 4}),
    )
    .await;
    let mut shares = body["shares"].as_array().unwrap().clone();
    let v = parse(&shares[3]["values"][5]);
    shares[3]["values"][5] = json!(((v + 1u32) % modulus(Field::Goldilocks)).to_string());
    let res = combine(
        &s,
        json!({"field": "goldilocks", "threshold": 3, "shares": shares}),
    )
    .await;
    let p = problem(res, 422, "inconsistent_shares").await;
    assert_eq!(p["errors"][0]["path"], "/shares/3/values/5", "{p}");
}

#[tokio::test]
async fn fresh_keys_unless_a_test_server_is_given_a_seed() {
    let s = TestServer::start(&[]).await;
    let body =
        json!({"field": "babybear", "secrets": ["5", "6"], "threshold": 2, "share_count": 2});
    let (a, b) = (split(&s, body.clone()).await, split(&s, body.clone()).await);
    assert_ne!(
        a["shares"], b["shares"],
        "each split draws new coefficients"
    );
    let mut seeded = body.clone();
    seeded["seed"] = json!(7);
    let res = s
        .post("/mpc/shamir/split", seeded.clone())
        .send()
        .await
        .unwrap();
    let p = problem(res, 403, "seed_not_allowed").await;
    assert_eq!(p["errors"][0]["path"], "/seed");

    let t = TestServer::start(&["--dp-allow-client-seed"]).await;
    let (a, b) = (
        split(&t, seeded.clone()).await,
        split(&t, seeded.clone()).await,
    );
    assert_eq!(a, b);
    seeded["seed"] = json!(8);
    assert_ne!(split(&t, seeded).await["shares"], a["shares"]);
}

#[tokio::test]
async fn feldman_commitments_check_each_share() {
    let s = TestServer::start(&[]).await;
    for (field, curve) in [("bn254_fr", "bn254_g1"), ("bls12_381_fr", "bls12_381_g1")] {
        let f = if field == "bn254_fr" {
            Field::Bn254Fr
        } else {
            Field::Bls12_381Fr
        };
        for encoding in ["decimal", "base64"] {
            let secrets: Value = if encoding == "base64" {
                let bytes: Vec<u8> = random_elements(f, 5, 4)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                json!(B64.encode(bytes))
            } else {
                json!(strings(f, 5, 4))
            };
            let body = split(
                &s,
                json!({"field": field, "secrets": secrets, "threshold": 3, "share_count": 4,
                       "commitments": true, "encoding": encoding}),
            )
            .await;
            let commitments = &body["commitments"];
            assert_eq!(commitments["curve"], curve);
            let rows = commitments["rows"].as_array().unwrap();
            assert_eq!(rows.len(), 3);
            let verify = |share: Value| json!({"field": field, "share": share, "commitments": rows, "encoding": encoding});
            for share in body["shares"].as_array().unwrap() {
                let res = s
                    .post("/mpc/shamir/verify", verify(share.clone()))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(res.status(), 200);
                let out: Value = res.json().await.unwrap();
                assert_eq!(
                    out,
                    json!({"valid": true, "curve": curve, "threshold": 3, "length": 5})
                );
            }
            // Share 0's values under share 1's point.
            let mut moved = body["shares"][0].clone();
            moved["x"] = body["shares"][1]["x"].clone();
            let out: Value = s
                .post("/mpc/shamir/verify", verify(moved))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(out["valid"], false, "{field} {encoding}");
        }
    }
}

#[tokio::test]
async fn bad_splits_are_refused_with_their_place() {
    let s = TestServer::start(&[]).await;
    let base =
        json!({"field": "bn254_fr", "secrets": ["1", "2"], "threshold": 2, "share_count": 3});
    let cases = [
        (json!({"threshold": 1}), "invalid_parameter", "/threshold"),
        (
            json!({"share_count": 1}),
            "invalid_parameter",
            "/share_count",
        ),
        (json!({"threshold": 4}), "invalid_parameter", "/threshold"),
        (
            json!({"share_count": 1025, "threshold": 3}),
            "invalid_parameter",
            "/share_count",
        ),
        (
            json!({"x_coordinates": ["1", "2"]}),
            "invalid_parameter",
            "/x_coordinates",
        ),
        (
            json!({"x_coordinates": ["1", "0", "3"]}),
            "invalid_parameter",
            "/x_coordinates/1",
        ),
        (
            json!({"x_coordinates": ["1", "5", "0x5"]}),
            "invalid_parameter",
            "/x_coordinates/2",
        ),
        (
            json!({"x_coordinates": ["1", "2", "21888242871839275222246405745257275088548364400416034343698204186575808495617"]}),
            "invalid_field_element",
            "/x_coordinates/2",
        ),
        (
            json!({"x_coordinates": ["1", "two", "3"]}),
            "invalid_field_element",
            "/x_coordinates/1",
        ),
        (json!({"secrets": []}), "invalid_parameter", "/secrets"),
        (
            json!({"secrets": ["1", "x"]}),
            "invalid_field_element",
            "/secrets/1",
        ),
        (
            json!({"field": "goldilocks", "commitments": true}),
            "invalid_parameter",
            "/commitments",
        ),
    ];
    for (patch, code, path) in cases {
        let mut body = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        let res = s
            .post("/mpc/shamir/split", body.clone())
            .send()
            .await
            .unwrap();
        let p = problem(res, 422, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{body}: {p}");
    }
    let res = s
        .post(
            "/mpc/shamir/split",
            json!({"field": "bn254_fr", "secrets": ["1"], "threshold": 2}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 422, "invalid_request").await;
    // Size limits: 413 at the field that carries the size.
    let many = strings(Field::BabyBear, 30_000, 9);
    let res = s
        .post("/mpc/shamir/split", json!({"field": "bn254_fr", "secrets": many, "threshold": 3, "share_count": 3, "commitments": true}))
        .send()
        .await
        .unwrap();
    let p = problem(res, 413, "payload_too_large").await;
    assert_eq!(p["errors"][0]["path"], "/commitments", "{p}");
    let small = TestServer::start(&["--max-elements", "100"]).await;
    let res = small
        .post("/mpc/shamir/split", json!({"field": "babybear", "secrets": strings(Field::BabyBear, 40, 9), "threshold": 2, "share_count": 3}))
        .send()
        .await
        .unwrap();
    let p = problem(res, 413, "payload_too_large").await;
    assert_eq!(p["errors"][0]["path"], "/secrets", "{p}");
    let res = s
        .post(
            "/mpc/shamir/verify",
            json!({"field": "bn254_fr", "share": {"x": "1", "values": vec!["1"; 33_000]},
                   "commitments": [[null], [null]]}),
        )
        .send()
        .await
        .unwrap();
    let p = problem(res, 413, "payload_too_large").await;
    assert_eq!(p["errors"][0]["path"], "/commitments", "{p}");
}

#[tokio::test]
async fn bad_combines_and_verifies_are_refused_with_their_place() {
    let s = TestServer::start(&[]).await;
    let share = |x: &str, values: Value| json!({"x": x, "values": values});
    let cases = [
        (
            json!([share("1", json!(["4"]))]),
            2,
            "insufficient_shares",
            "/shares",
        ),
        (
            json!([share("1", json!(["4"])), share("1", json!(["5"]))]),
            2,
            "invalid_parameter",
            "/shares/1/x",
        ),
        (
            json!([share("0", json!(["4"])), share("1", json!(["5"]))]),
            2,
            "invalid_parameter",
            "/shares/0/x",
        ),
        (
            json!([share("1", json!(["4"])), share("2", json!(["5", "6"]))]),
            2,
            "invalid_parameter",
            "/shares/1/values",
        ),
        (
            json!([share("1", json!(["4"])), share("2", json!(["-5"]))]),
            2,
            "invalid_field_element",
            "/shares/1/values/0",
        ),
        (
            json!([share("1", json!(["4"])), share("2", json!(["5"]))]),
            1,
            "invalid_parameter",
            "/threshold",
        ),
    ];
    for (shares, threshold, code, path) in cases {
        let body = json!({"field": "babybear", "threshold": threshold, "shares": shares});
        let p = problem(combine(&s, body.clone()).await, 422, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{body}: {p}");
    }

    let body = split(
        &s,
        json!({"field": "bn254_fr", "secrets": ["1", "2"], "threshold": 2, "share_count": 2, "commitments": true}),
    )
    .await;
    let rows = body["commitments"]["rows"].clone();
    let one = body["shares"][0].clone();
    let verify = |patch: Value| {
        let mut b = json!({"field": "bn254_fr", "share": one, "commitments": rows});
        for (k, v) in patch.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let off_curve = json!([[{"x": "1", "y": "3"}, null], rows[1]]);
    let cases = [
        (
            json!({"field": "goldilocks"}),
            "invalid_parameter",
            "/field",
        ),
        (
            json!({"commitments": [rows[0], [null]]}),
            "invalid_parameter",
            "/commitments/1",
        ),
        (
            json!({"commitments": off_curve}),
            "invalid_point",
            "/commitments/0/0",
        ),
        (
            json!({"commitments": []}),
            "invalid_parameter",
            "/commitments",
        ),
        (
            json!({"share": {"x": "0x", "values": ["1", "2"]}}),
            "invalid_field_element",
            "/share/x",
        ),
        (
            json!({"share": {"x": "0", "values": ["1", "2"]}}),
            "invalid_parameter",
            "/share/x",
        ),
        (
            json!({"share": {"x": "1", "values": []}}),
            "invalid_parameter",
            "/share/values",
        ),
    ];
    for (patch, code, path) in cases {
        let res = s
            .post("/mpc/shamir/verify", verify(patch.clone()))
            .send()
            .await
            .unwrap();
        let p = problem(res, 422, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{patch}: {p}");
    }
}
