//! `/arrays` over HTTP: resident arrays made, listed, read in every form and deleted; ops
//! whose operands name them (`{"array": id}`, in JSON and in a bulk header) answer as if
//! the values had been sent; every refusal with its code and path; quotas, the server's
//! cap, expiry, tenants apart and a restart.

use crate::common;

use base64::Engine;
use clap::Parser;
use common::{problem, TestServer};
use gpu_ops::config::Cli;
use gpu_ops::ops::zk::msm::{Curve, Points};
use gpu_ops::ops::zk::samples::{random_elements, random_points};
use gpu_ops::ops::zk::{Field, U256};
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn point_json(points: &Points) -> Vec<Value> {
    (0..points.len())
        .map(|i| match points.coordinates(i) {
            None => Value::Null,
            Some((x, y)) => json!({"x": x.to_string(), "y": y.to_string()}),
        })
        .collect()
}

fn decimals(v: &[U256]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Makes an array; its id.
async fn create(s: &TestServer, body: Value) -> String {
    let res = s.post("/arrays", body).send().await.unwrap();
    assert_eq!(res.status(), 201, "{:?}", res.text().await);
    let v: Value = res.json().await.unwrap();
    v["id"].as_str().unwrap().to_string()
}

async fn json_of(res: reqwest::Response) -> Value {
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

#[tokio::test]
async fn an_msm_over_a_resident_array_is_the_msm_over_its_points() {
    let s = TestServer::start(&[]).await;
    for curve in [Curve::Bn254G1, Curve::Bls12_381G1] {
        let points = random_points(curve, 40, 3);
        let scalars = decimals(&random_elements(curve.scalar_field(), 40, 4));
        let res = s
            .post(
                "/arrays",
                json!({"kind": "points", "curve": curve.name(), "points": point_json(&points), "name": "srs"}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        let location = res.headers()["location"].to_str().unwrap().to_string();
        let v: Value = res.json().await.unwrap();
        let id = v["id"].as_str().unwrap().to_string();
        assert!(
            id.starts_with("arr_") && location == format!("/arrays/{id}"),
            "{v}"
        );
        let width = 2 * curve.coordinate_bytes() as u64;
        assert_eq!(
            (
                &v["kind"],
                &v["curve"],
                &v["length"],
                &v["size_bytes"],
                &v["held"]
            ),
            (
                &json!("points"),
                &json!(curve.name()),
                &json!(40),
                &json!(40 * width),
                &json!(["host", "disk"])
            ),
        );
        assert!(v.get("field").is_none());
        let sent = json_of(
            s.post(
                "/zk/msm",
                json!({"curve": curve.name(), "scalars": scalars, "points": point_json(&points)}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        let named = json_of(
            s.post(
                "/zk/msm",
                json!({"curve": curve.name(), "scalars": scalars, "points": {"array": id}}),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(named, sent, "{curve:?}");
        // In a bulk header too, beside a scalar buffer.
        use crate::bulk::{body, post, Buf};
        let scalar_bytes: Vec<u8> = random_elements(curve.scalar_field(), 40, 4)
            .iter()
            .flat_map(|v| v.0.iter().flat_map(|l| l.to_le_bytes()))
            .collect();
        let bulk = body(
            json!({"curve": curve.name(), "points": {"array": id}}),
            vec![Buf {
                at: "/scalars",
                dtype: gpu_ops::wire::Dtype::U256,
                shape: vec![40],
                bytes: scalar_bytes,
            }],
        );
        assert_eq!(json_of(post(&s, "/zk/msm", bulk, false).await).await, sent);
    }
    assert_eq!(
        s.metric("gpu_ops_array_uses_total{kind=\"points\"}").await,
        4.0
    );
}

#[tokio::test]
async fn element_arrays_stand_for_operands_of_field_ops_ntt_and_shamir() {
    let s = TestServer::start(&[]).await;
    let field = Field::Goldilocks;
    let a = decimals(&random_elements(field, 16, 1));
    let b = decimals(&random_elements(field, 16, 2));
    let id_a = create(
        &s,
        json!({"kind": "field_elements", "field": "goldilocks", "values": a}),
    )
    .await;
    // base64 in, kept the same.
    let b_bytes: Vec<u8> = random_elements(field, 16, 2)
        .iter()
        .flat_map(|v| v.0[0].to_le_bytes())
        .collect();
    let id_b = create(
        &s,
        json!({"kind": "field_elements", "field": "goldilocks", "encoding": "base64", "values": B64.encode(&b_bytes)}),
    )
    .await;
    let post = |path: &'static str, body: Value| {
        let s = &s;
        async move { json_of(s.post(path, body).send().await.unwrap()).await }
    };
    let want = post(
        "/zk/field_mul",
        json!({"field": "goldilocks", "a": a, "b": b}),
    )
    .await;
    let got = post(
        "/zk/field_mul",
        json!({"field": "goldilocks", "a": {"array": id_a}, "b": {"array": id_b}}),
    )
    .await;
    assert_eq!(got, want);
    let want = post("/zk/ntt", json!({"field": "goldilocks", "values": a})).await;
    let got = post(
        "/zk/ntt",
        json!({"field": "goldilocks", "values": {"array": id_a}}),
    )
    .await;
    assert_eq!(got, want);
    // Exponents take elements as integers.
    let want = post(
        "/zk/field_pow",
        json!({"field": "goldilocks", "base": b, "exponent": a}),
    )
    .await;
    let got = post(
        "/zk/field_pow",
        json!({"field": "goldilocks", "base": b, "exponent": {"array": id_a}}),
    )
    .await;
    assert_eq!(got, want);
    // Shares of resident secrets recombine to them.
    let split = post(
        "/mpc/shamir/split",
        json!({"field": "goldilocks", "threshold": 2, "share_count": 3, "secrets": {"array": id_a}}),
    )
    .await;
    let shares: Vec<Value> = split["shares"].as_array().unwrap()[..2].to_vec();
    let combined = post(
        "/mpc/shamir/combine",
        json!({"field": "goldilocks", "threshold": 2, "shares": shares}),
    )
    .await;
    assert_eq!(combined["secrets"], json!(a));
}

#[tokio::test]
async fn an_arrays_data_reads_back_in_every_form() {
    let s = TestServer::start(&[]).await;
    let values = random_elements(Field::Bn254Fr, 5, 9);
    let id = create(
        &s,
        json!({"kind": "field_elements", "field": "bn254_fr", "values": decimals(&values)}),
    )
    .await;
    let v = json_of(s.get(&format!("/arrays/{id}/data")).await).await;
    assert_eq!(v["values"], json!(decimals(&values)));
    assert_eq!(
        (&v["kind"], &v["field"], &v["encoding"]),
        (
            &json!("field_elements"),
            &json!("bn254_fr"),
            &json!("decimal")
        )
    );
    let v = json_of(s.get(&format!("/arrays/{id}/data?encoding=hex")).await).await;
    assert!(v["values"][0].as_str().unwrap().starts_with("0x"));
    let le: Vec<u8> = values
        .iter()
        .flat_map(|x| x.0.iter().flat_map(|l| l.to_le_bytes()))
        .collect();
    let v = json_of(s.get(&format!("/arrays/{id}/data?encoding=base64")).await).await;
    assert_eq!(v["values"], json!(B64.encode(&le)));
    let got = crate::bulk::get_answer(&s, &format!("/arrays/{id}/data")).await;
    let (b, bytes) = &got.buffers["/values"];
    assert_eq!(
        (b.dtype, &b.shape, bytes),
        (gpu_ops::wire::Dtype::U256, &vec![5], &le)
    );

    let points = random_points(Curve::Bls12_381G1, 3, 1);
    let id = create(
        &s,
        json!({"kind": "points", "curve": "bls12_381_g1", "points": point_json(&points)}),
    )
    .await;
    let v = json_of(s.get(&format!("/arrays/{id}/data")).await).await;
    assert_eq!(v["points"], json!(point_json(&points)));
    let v = json_of(s.get(&format!("/arrays/{id}/data?encoding=base64")).await).await;
    assert_eq!(v["points"], json!(B64.encode(points.to_le_bytes())));
    let got = crate::bulk::get_answer(&s, &format!("/arrays/{id}/data")).await;
    let (b, bytes) = &got.buffers["/points"];
    assert_eq!(
        (b.dtype, &b.shape, bytes),
        (
            gpu_ops::wire::Dtype::U64,
            &vec![3, 2, 6],
            &points.to_le_bytes()
        )
    );

    // Listed, then deleted: gone from the list, its page and its uses.
    let list = json_of(s.get("/arrays").await).await;
    assert_eq!(list["arrays"].as_array().unwrap().len(), 2);
    assert_eq!(
        s.delete(&format!("/arrays/{id}"))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    problem(
        s.get(&format!("/arrays/{id}")).await,
        404,
        "array_not_found",
    )
    .await;
    problem(
        s.delete(&format!("/arrays/{id}")).send().await.unwrap(),
        404,
        "array_not_found",
    )
    .await;
    let res = s
        .post(
            "/zk/msm",
            json!({"curve": "bls12_381_g1", "scalars": ["1", "2", "3"], "points": {"array": id}}),
        )
        .send()
        .await
        .unwrap();
    let p = problem(res, 422, "unknown_array").await;
    assert_eq!(p["errors"][0]["path"], "/points/array");
    assert_eq!(
        json_of(s.get("/arrays").await).await["arrays"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn bad_uploads_and_bad_references_get_their_code_and_path() {
    let s = TestServer::start(&["--max-array-ttl", "1h", "--array-ttl", "10m"]).await;
    let refused = |body: Value, status: u16, code: &'static str, path: &'static str| {
        let s = &s;
        async move {
            let p = problem(
                s.post("/arrays", body.clone()).send().await.unwrap(),
                status,
                code,
            )
            .await;
            assert_eq!(p["errors"][0]["path"], path, "{body} → {p}");
        }
    };
    refused(
        json!({"kind": "points", "points": []}),
        422,
        "invalid_request",
        "/curve",
    )
    .await;
    refused(
        json!({"kind": "points", "curve": "bn254_g1"}),
        422,
        "invalid_request",
        "/points",
    )
    .await;
    refused(
        json!({"kind": "points", "field": "bn254_fr", "curve": "bn254_g1", "points": []}),
        422,
        "invalid_request",
        "/field",
    )
    .await;
    refused(
        json!({"kind": "field_elements", "values": ["1"]}),
        422,
        "invalid_request",
        "/field",
    )
    .await;
    refused(
        json!({"kind": "field_elements", "field": "goldilocks", "values": []}),
        422,
        "invalid_parameter",
        "/values",
    )
    .await;
    refused(
        json!({"kind": "field_elements", "field": "babybear", "values": ["1", "2013265921"]}),
        422,
        "invalid_field_element",
        "/values/1",
    )
    .await;
    refused(
        json!({"kind": "points", "curve": "bn254_g1", "points": [{"x": "1", "y": "3"}]}),
        422,
        "invalid_point",
        "/points/0",
    )
    .await;
    refused(json!({"kind": "field_elements", "field": "goldilocks", "values": ["1"], "ttl_seconds": 3601}), 422, "invalid_parameter", "/ttl_seconds").await;
    refused(
        json!({"kind": "field_elements", "field": "goldilocks", "values": ["1"], "ttl_seconds": 0}),
        422,
        "invalid_parameter",
        "/ttl_seconds",
    )
    .await;
    refused(json!({"kind": "field_elements", "field": "goldilocks", "values": ["1"], "name": "n".repeat(201)}), 422, "invalid_parameter", "/name").await;
    refused(json!({"kind": "field_elements", "field": "goldilocks", "values": {"array": "arr_x", "dtype": "u64"}}), 422, "invalid_request", "/values").await;

    // A reference of the wrong kind, field or curve names the operand's `array`.
    let gold = create(
        &s,
        json!({"kind": "field_elements", "field": "goldilocks", "values": ["1", "2"]}),
    )
    .await;
    let bn = create(
        &s,
        json!({"kind": "points", "curve": "bn254_g1", "points": [{"x": "1", "y": "2"}, null]}),
    )
    .await;
    let cases = [
        (
            "/zk/msm",
            json!({"curve": "bn254_g1", "scalars": ["1", "2"], "points": {"array": gold}}),
            "/points/array",
        ),
        (
            "/zk/msm",
            json!({"curve": "bls12_381_g1", "scalars": ["1", "2"], "points": {"array": bn}}),
            "/points/array",
        ),
        (
            "/zk/msm",
            json!({"curve": "bn254_g1", "scalars": {"array": gold}, "points": {"array": bn}}),
            "/scalars/array",
        ),
        (
            "/zk/field_add",
            json!({"field": "babybear", "a": {"array": gold}, "b": ["1"]}),
            "/a/array",
        ),
        (
            "/zk/field_pow",
            json!({"field": "goldilocks", "base": ["1"], "exponent": {"array": bn}}),
            "/exponent/array",
        ),
    ];
    for (route, body, path) in cases {
        let p = problem(
            s.post(route, body.clone()).send().await.unwrap(),
            422,
            "array_mismatch",
        )
        .await;
        assert_eq!(p["errors"][0]["path"], path, "{body}");
    }
    let res = s
        .post(
            "/zk/ntt",
            json!({"field": "goldilocks", "values": {"array": "arr_0000"}}),
        )
        .send()
        .await
        .unwrap();
    let p = problem(res, 422, "unknown_array").await;
    assert_eq!(p["errors"][0]["path"], "/values/array");
}

fn keyed(
    data: &std::path::Path,
    keys: &std::path::Path,
    extra: &[&str],
) -> gpu_ops::config::Settings {
    let mut args = vec![
        "gpu-ops",
        "--backend",
        "cpu",
        "--data-dir",
        data.to_str().unwrap(),
        "--api-keys-file",
        keys.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Cli::try_parse_from(args)
        .unwrap()
        .config
        .validate()
        .unwrap()
}

fn two_tenants(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let data = std::env::temp_dir().join(format!("gpu-ops-arrays-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let keys =
        std::env::temp_dir().join(format!("gpu-ops-arrays-{name}-keys-{}", std::process::id()));
    std::fs::write(
        &keys,
        "key-alice-0123456789 alice\nkey-bobby-0123456789 bob\n",
    )
    .unwrap();
    (data, keys)
}

const ALICE: &str = "key-alice-0123456789";
const BOB: &str = "key-bobby-0123456789";

#[tokio::test]
async fn arrays_survive_a_restart_and_stay_with_their_tenant() {
    let (data, keys) = two_tenants("restart");
    let points = random_points(Curve::Bn254G1, 4, 8);
    let mut s = TestServer::start_with(keyed(&data, &keys, &[]), |r| r).await;
    let res = s
        .post(
            "/arrays",
            json!({"kind": "points", "curve": "bn254_g1", "points": point_json(&points)}),
        )
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    let id = json_of_created(res).await;
    s.trigger_shutdown();
    drop(s);
    let s = TestServer::start_with(keyed(&data, &keys, &[]), |r| r).await;
    let msm =
        json!({"curve": "bn254_g1", "scalars": ["1", "2", "3", "4"], "points": {"array": id}});
    let sent = json!({"curve": "bn254_g1", "scalars": ["1", "2", "3", "4"], "points": point_json(&points)});
    let want = json_of(
        s.post("/zk/msm", sent)
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let got = json_of(
        s.post("/zk/msm", msm.clone())
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(got, want);
    // Bob sees none of it: no page, no listing, no use.
    let res = s
        .client
        .get(format!("{}/arrays/{id}", s.url))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    problem(res, 404, "array_not_found").await;
    let res = s
        .client
        .get(format!("{}/arrays", s.url))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    assert_eq!(json_of(res).await["arrays"], json!([]));
    let res = s
        .post("/zk/msm", msm)
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    problem(res, 422, "unknown_array").await;
    let res = s
        .delete(&format!("/arrays/{id}"))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    problem(res, 404, "array_not_found").await;
    // Without a key, nothing.
    problem(s.get("/arrays").await, 401, "unauthorized").await;
}

async fn json_of_created(res: reqwest::Response) -> String {
    assert_eq!(res.status(), 201, "{:?}", res.text().await);
    res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn quotas_and_the_servers_cap_refuse_uploads_and_are_counted() {
    let (data, keys) = two_tenants("quota");
    // 1 MiB for a tenant and for the server: 32 768 bn254 elements (32 bytes each).
    let settings = keyed(
        &data,
        &keys,
        &[
            "--max-tenant-array-mib",
            "1",
            "--max-arrays-mib",
            "1",
            "--max-tenant-arrays",
            "3",
        ],
    );
    let s = TestServer::start_with(settings, |r| r).await;
    let upload = |n: usize, key: &'static str| {
        let s = &s;
        let bytes = vec![0u8; 32 * n];
        async move {
            s.post(
                "/arrays",
                json!({"kind": "field_elements", "field": "bn254_fr", "encoding": "base64", "values": B64.encode(bytes)}),
            )
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
        }
    };
    json_of_created(upload(16_384, ALICE).await).await;
    let p = problem(upload(16_385, ALICE).await, 422, "array_quota_exceeded").await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("--max-tenant-array-mib"),
        "{p}"
    );
    json_of_created(upload(1, ALICE).await).await;
    json_of_created(upload(1, ALICE).await).await;
    let p = problem(upload(1, ALICE).await, 422, "array_quota_exceeded").await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("--max-tenant-arrays"),
        "{p}"
    );
    // Bob's own quota has room; the server's cap does not.
    problem(upload(16_384, BOB).await, 507, "arrays_full").await;
    json_of_created(upload(16_382, BOB).await).await;
    let refused = |r: &str| format!("gpu_ops_arrays_refused_total{{reason=\"{r}\"}}");
    assert_eq!(s.metric(&refused("tenant_bytes")).await, 1.0);
    assert_eq!(s.metric(&refused("tenant_count")).await, 1.0);
    assert_eq!(s.metric(&refused("server_bytes")).await, 1.0);
    assert_eq!(
        s.metric("gpu_ops_array_bytes{tier=\"host\"}").await,
        1048576.0
    );
    assert_eq!(s.metric("gpu_ops_arrays ").await, 4.0);
}

#[tokio::test]
async fn an_expired_array_is_refused_at_once_and_swept_with_its_files() {
    let data = common::temp_data_dir();
    let settings = Cli::try_parse_from(["gpu-ops", "--backend", "cpu", "--data-dir", &data])
        .unwrap()
        .config
        .validate()
        .unwrap();
    let s = TestServer::start_with(settings, |r| r).await;
    let id = create(
        &s,
        json!({"kind": "field_elements", "field": "goldilocks", "values": ["7"], "ttl_seconds": 1}),
    )
    .await;
    let long = create(
        &s,
        json!({"kind": "field_elements", "field": "goldilocks", "values": ["8"]}),
    )
    .await;
    let v = json_of(s.get(&format!("/arrays/{long}")).await).await;
    let expires = humantime::parse_rfc3339(v["expires_at"].as_str().unwrap()).unwrap();
    let day = expires
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(
        day > std::time::Duration::from_secs(86_000),
        "--array-ttl's 24h: {v}"
    );
    let file = std::path::Path::new(&data)
        .join("arrays")
        .join(format!("{id}.json"));
    assert!(file.exists());
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    problem(
        s.get(&format!("/arrays/{id}")).await,
        404,
        "array_not_found",
    )
    .await;
    let res = s
        .post(
            "/zk/field_inv",
            json!({"field": "goldilocks", "values": {"array": id}}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 422, "unknown_array").await;
    assert_eq!(
        s.wait_for_metric("gpu_ops_arrays_expired_total", 1.0).await,
        1.0
    );
    assert!(!file.exists());
    assert_eq!(
        json_of(s.get("/arrays").await).await["arrays"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// A polynomial product as NTT → multiply → inverse NTT, each step's result kept on the
/// server and named by the next: the same coefficients as the chain with every vector
/// sent back and forth, and no values in the answers until the last.
#[tokio::test]
async fn a_chain_of_kept_results_gives_the_chain_of_sent_ones() {
    let s = TestServer::start(&[]).await;
    let field = Field::Bn254Fr;
    // Two polynomials of degree < 4, padded to 8 coefficients: their product fits.
    let pad = |seed| {
        let mut v = decimals(&random_elements(field, 4, seed));
        v.extend(["0".to_string(), "0".into(), "0".into(), "0".into()]);
        v
    };
    let (f, g) = (pad(1), pad(2));
    let post = |path: &'static str, body: Value| {
        let s = &s;
        async move { json_of(s.post(path, body).send().await.unwrap()).await }
    };
    let nf = post("/zk/ntt", json!({"field": "bn254_fr", "values": f})).await;
    let ng = post("/zk/ntt", json!({"field": "bn254_fr", "values": g})).await;
    let prod = post(
        "/zk/field_mul",
        json!({"field": "bn254_fr", "a": nf["result"], "b": ng["result"]}),
    )
    .await;
    let want = post(
        "/zk/intt",
        json!({"field": "bn254_fr", "values": prod["result"]}),
    )
    .await;

    let quiet = json!({"with_data": false});
    let kf = post(
        "/zk/ntt",
        json!({"field": "bn254_fr", "values": f, "keep": quiet}),
    )
    .await;
    assert!(kf.get("result").is_none(), "{kf}");
    assert_eq!(
        (
            &kf["kept"]["kind"],
            &kf["kept"]["field"],
            &kf["kept"]["length"]
        ),
        (&json!("field_elements"), &json!("bn254_fr"), &json!(8))
    );
    let kg = post(
        "/zk/ntt",
        json!({"field": "bn254_fr", "values": g, "keep": quiet}),
    )
    .await;
    let (idf, idg) = (
        kf["kept"]["id"].as_str().unwrap(),
        kg["kept"]["id"].as_str().unwrap(),
    );
    let kp = post(
        "/zk/field_mul",
        json!({"field": "bn254_fr", "a": {"array": idf}, "b": {"array": idg}, "keep": {"name": "product"}}),
    )
    .await;
    // With data by default: the values and the array both.
    assert_eq!(kp["result"], prod["result"]);
    assert_eq!(kp["kept"]["name"], "product");
    let idp = kp["kept"]["id"].as_str().unwrap();
    let got = post(
        "/zk/intt",
        json!({"field": "bn254_fr", "values": {"array": idp}}),
    )
    .await;
    assert_eq!(got, want);
    let data = json_of(s.get(&format!("/arrays/{idf}/data")).await).await;
    assert_eq!(data["values"], nf["result"]);

    // The keep's own fields are checked before the job, at their paths.
    let res = s
        .post(
            "/zk/ntt",
            json!({"field": "bn254_fr", "values": f, "keep": {"ttl_seconds": 0}}),
        )
        .send()
        .await
        .unwrap();
    let p = problem(res, 422, "invalid_parameter").await;
    assert_eq!(p["errors"][0]["path"], "/keep/ttl_seconds");
}

/// A kept result counts against the tenant's quota like an upload: past it, 422 and
/// nothing kept.
#[tokio::test]
async fn a_kept_result_past_the_quota_is_refused() {
    let s = TestServer::start(&["--max-tenant-arrays", "1"]).await;
    let keep = json!({"field": "goldilocks", "a": ["1", "2"], "b": ["3"], "keep": {}});
    let first = json_of(s.post("/zk/field_add", keep.clone()).send().await.unwrap()).await;
    assert_eq!(first["result"], json!(["4", "5"]));
    let res = s.post("/zk/field_add", keep).send().await.unwrap();
    problem(res, 422, "array_quota_exceeded").await;
    assert_eq!(
        json_of(s.get("/arrays").await).await["arrays"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Past --max-arrays, an upload of any tenant is 507 arrays_full, counted by reason.
#[tokio::test]
async fn the_server_wide_array_count_is_capped() {
    let s = TestServer::start(&["--max-arrays", "1"]).await;
    let upload = json!({"kind": "field_elements", "field": "goldilocks", "values": ["7"]});
    let res = s.post("/arrays", upload.clone()).send().await.unwrap();
    assert_eq!(res.status(), 201);
    let res = s.post("/arrays", upload).send().await.unwrap();
    let p = problem(res, 507, "arrays_full").await;
    assert!(
        p["detail"].as_str().unwrap().contains("--max-arrays"),
        "{p}"
    );
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("gpu_ops_arrays_refused_total{reason=\"server_count\"} 1"),
        "{metrics}"
    );
}
