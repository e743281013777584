//! `POST /zk/msm` over HTTP: sums against a naive arkworks oracle (one scalar
//! multiplication per term, no Pippenger), in every encoding, with the hard cases in the
//! input, and each kind of bad input with its problem code and path.

use crate::common;

use ark_ec::short_weierstrass::{Affine, Projective, SWCurveConfig};
use ark_ec::{AffineRepr, CurveGroup};
use ark_ff::PrimeField;
use base64::Engine;
use common::{problem, TestServer};
use gpu_ops::ops::zk::msm::{Curve, Points};
use gpu_ops::ops::zk::samples::{edge_values, random_elements, random_points};
use gpu_ops::ops::zk::U256;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn naive<P: SWCurveConfig>(points: &[Affine<P>], scalars: &[U256]) -> Affine<P> {
    let sum: Projective<P> = points
        .iter()
        .zip(scalars)
        .map(|(p, s)| p.mul_bigint(s.0))
        .sum();
    sum.into_affine()
}

fn oracle(points: &Points, scalars: &[U256]) -> Option<(String, String)> {
    let sum = match points {
        Points::Bn254G1(p) => Points::Bn254G1(vec![naive(p, scalars)]),
        Points::Bls12_381G1(p) => Points::Bls12_381G1(vec![naive(p, scalars)]),
    };
    sum.coordinates(0)
        .map(|(x, y)| (x.to_string(), y.to_string()))
}

/// Random points with the hard cases mixed in: the identity, a duplicate (the doubling
/// path in a bucket) and P beside −P.
fn hard_points(curve: Curve, n: usize, seed: u64) -> Points {
    fn mix<P: SWCurveConfig>(mut p: Vec<Affine<P>>) -> Vec<Affine<P>> {
        let (a, b) = (p[0], p[1]);
        p.push(Affine::identity());
        p.push(a);
        p.push(-b);
        p
    }
    match random_points(curve, n, seed) {
        Points::Bn254G1(p) => Points::Bn254G1(mix(p)),
        Points::Bls12_381G1(p) => Points::Bls12_381G1(mix(p)),
    }
}

fn scalars_for(curve: Curve, n: usize, seed: u64) -> Vec<U256> {
    let field = curve.scalar_field();
    let mut s = edge_values(field);
    s.extend(random_elements(field, n, seed));
    s.truncate(n);
    // The duplicate and the negated point get the same scalar as their twins.
    s[n - 2] = s[0];
    s[n - 1] = s[1];
    s
}

fn json_points(points: &Points, hex: bool) -> Vec<Value> {
    (0..points.len())
        .map(|i| match points.coordinates(i) {
            None => Value::Null,
            Some((x, y)) if hex => json!({"x": format!("0x{x:x}"), "y": format!("0x{y:x}")}),
            Some((x, y)) => json!({"x": x.to_string(), "y": y.to_string()}),
        })
        .collect()
}

fn hex_of(v: &U256) -> String {
    let mut s = String::new();
    v.write_hex(&mut s);
    s
}

fn base64_scalars(s: &[U256]) -> String {
    B64.encode(
        s.iter()
            .flat_map(|v| v.0.iter().flat_map(|l| l.to_le_bytes()))
            .collect::<Vec<u8>>(),
    )
}

#[tokio::test]
async fn sums_match_the_naive_oracle_in_every_encoding() {
    let s = TestServer::start(&[]).await;
    for curve in [Curve::Bn254G1, Curve::Bls12_381G1] {
        let points = hard_points(curve, 45, 7);
        let scalars = scalars_for(curve, points.len(), 8);
        let (x, y) = oracle(&points, &scalars).expect("a random sum is not the identity");

        let body: Value = s
            .post(
                "/zk/msm",
                json!({"curve": curve.name(), "scalars": scalars.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
                    "points": json_points(&points, false)}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(body["result"], json!({"x": x, "y": y}), "{curve:?} decimal");
        assert_eq!(body["points"], points.len());
        assert_eq!(body["curve"], curve.name());

        let res = s
            .post(
                "/zk/msm",
                json!({"curve": curve.name(), "encoding": "hex",
                    "scalars": scalars.iter().map(hex_of).collect::<Vec<_>>(),
                    "points": json_points(&points, true)}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let body: Value = res.json().await.unwrap();
        let hex = |d: &str| format!("0x{:x}", d.parse::<num_bigint::BigUint>().unwrap());
        assert_eq!(
            body["result"],
            json!({"x": hex(&x), "y": hex(&y)}),
            "{curve:?} hex"
        );

        let body: Value = s
            .post(
                "/zk/msm",
                json!({"curve": curve.name(), "encoding": "base64", "scalars": base64_scalars(&scalars),
                    "points": B64.encode(points.to_le_bytes())}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let bytes = B64.decode(body["result"].as_str().unwrap()).unwrap();
        let back = Points::from_le_bytes(curve, &bytes).unwrap();
        let (bx, by) = back.coordinates(0).unwrap();
        assert_eq!((bx.to_string(), by.to_string()), (x, y), "{curve:?} base64");
    }
}

#[tokio::test]
async fn a_batch_answers_each_vector_in_order_and_the_identity_as_null() {
    let s = TestServer::start(&[]).await;
    let curve = Curve::Bls12_381G1;
    let points = hard_points(curve, 20, 3);
    let n = points.len();
    let batch = [
        scalars_for(curve, n, 1),
        vec![U256::ZERO; n],
        scalars_for(curve, n, 2),
    ];
    let res = s
        .post(
            "/zk/msm",
            json!({"curve": "bls12_381_g1", "points": json_points(&points, false),
                "scalar_batch": batch.iter().map(|v| v.iter().map(|e| e.to_string()).collect::<Vec<_>>()).collect::<Vec<_>>()}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert!(body.get("result").is_none());
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for (k, scalars) in batch.iter().enumerate() {
        let want = match oracle(&points, scalars) {
            None => Value::Null,
            Some((x, y)) => json!({"x": x, "y": y}),
        };
        assert_eq!(results[k], want, "vector {k}");
    }
    assert_eq!(results[1], Value::Null);
}

#[tokio::test]
async fn ethereum_precompile_vector_doubles_the_generator() {
    // EIP-196 ecMul: 2·(1, 2) on alt_bn128.
    let s = TestServer::start(&[]).await;
    let body: Value = s
        .post(
            "/zk/msm",
            json!({"curve": "bn254_g1", "scalars": ["1", "1"], "points": [{"x": "1", "y": "2"}, {"x": "0x1", "y": "0x2"}]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        body["result"],
        json!({"x": "1368015179489954701390400359078579693043519447331113978918064868415326638035",
            "y": "9918110051302171585080402603319702774565515993150576347155970296011118125764"})
    );
}

/// A point of y² = x³ + 4 over the BLS12-381 base field outside the order-r subgroup.
fn bls_point_outside_subgroup() -> (String, String) {
    type Cfg = ark_bls12_381::g1::Config;
    let mut x = ark_bls12_381::Fq::from(5u64);
    loop {
        if let Some(p) = Affine::<Cfg>::get_point_from_x_unchecked(x, false) {
            if !p.is_in_correct_subgroup_assuming_on_curve() {
                let (x, y) = p.xy().unwrap();
                return (x.into_bigint().to_string(), y.into_bigint().to_string());
            }
        }
        x += ark_bls12_381::Fq::from(1u64);
    }
}

#[tokio::test]
async fn bad_inputs_get_their_problem_code_and_path() {
    let s = TestServer::start(&["--max-elements", "4"]).await;
    let q = ark_bn254::Fq::MODULUS.to_string();
    let g = json!({"x": "1", "y": "2"});
    let (ox, oy) = bls_point_outside_subgroup();
    let bls_g = Affine::<ark_bls12_381::g1::Config>::generator();
    let bls_g =
        json!({"x": bls_g.x.into_bigint().to_string(), "y": bls_g.y.into_bigint().to_string()});
    let r = Curve::Bn254G1.scalar_field().modulus().to_string();
    // (body, status, code, JSON pointer of the first listed error)
    let cases = [
        (
            json!({"curve": "bn254_g1", "scalars": ["1", "1", "1"], "points": [g, null, {"x": "1", "y": "3"}]}),
            422,
            "invalid_point",
            "/points/2",
        ),
        (
            json!({"curve": "bn254_g1", "scalars": ["1"], "points": [{"x": q, "y": "2"}]}),
            422,
            "invalid_point",
            "/points/0",
        ),
        (
            json!({"curve": "bn254_g1", "scalars": ["1", "1"], "points": [g, {"x": "one", "y": "2"}]}),
            422,
            "invalid_point",
            "/points/1",
        ),
        (
            json!({"curve": "bls12_381_g1", "scalars": ["1", "1"], "points": [bls_g, {"x": ox, "y": oy}]}),
            422,
            "invalid_point",
            "/points/1",
        ),
        (
            json!({"curve": "bn254_g1", "encoding": "base64", "scalars": B64.encode([0u8; 32]), "points": B64.encode([1u8; 40])}),
            422,
            "invalid_point",
            "/points/0",
        ),
        (
            json!({"curve": "bn254_g1", "scalars": [r], "points": [g]}),
            422,
            "invalid_field_element",
            "/scalars/0",
        ),
        (
            json!({"curve": "bn254_g1", "scalars": ["1", "2"], "points": [g]}),
            422,
            "length_mismatch",
            "/scalars",
        ),
        (
            json!({"curve": "bn254_g1", "scalar_batch": [["1"], ["1", "2"]], "points": [g]}),
            422,
            "length_mismatch",
            "/scalar_batch/1",
        ),
        (
            json!({"curve": "bn254_g1", "scalars": ["1"], "scalar_batch": [["1"]], "points": [g]}),
            422,
            "invalid_request",
            "/scalar_batch",
        ),
        (
            json!({"curve": "bn254_g1", "points": [g]}),
            422,
            "invalid_request",
            "/scalars",
        ),
        (
            json!({"curve": "bn254_g1", "scalars": [], "points": []}),
            422,
            "invalid_parameter",
            "/points",
        ),
        (
            json!({"curve": "bn254_g1", "scalars": ["1"], "points": B64.encode([0u8; 64])}),
            422,
            "invalid_request",
            "/points",
        ),
        (
            json!({"curve": "secp256k1", "scalars": ["1"], "points": [g]}),
            422,
            "invalid_request",
            "/curve",
        ),
        (
            json!({"curve": "bn254_g1", "scalars": ["1", "1", "1", "1", "1"], "points": [g, g, g, g, g]}),
            413,
            "payload_too_large",
            "/scalars",
        ),
        (
            json!({"curve": "bn254_g1", "scalars": ["1"], "points": [g, g, g, g, g]}),
            413,
            "payload_too_large",
            "/points",
        ),
        (
            json!({"curve": "bn254_g1", "scalar_batch": [["1", "1", "1"], ["1", "1", "1"]], "points": [g, g, g]}),
            413,
            "payload_too_large",
            "/scalar_batch",
        ),
    ];
    for (body, status, code, path) in cases {
        let res = s.post("/zk/msm", body.clone()).send().await.unwrap();
        let p = problem(res, status, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{body}: {p}");
    }
    // Still serving.
    let res = s
        .post(
            "/zk/msm",
            json!({"curve": "bn254_g1", "scalars": ["3"], "points": [g]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
}

/// The bulk form (docs/WIRE.md): scalars as `u256` and points as `u64` words `[n, 2, w]`
/// give the JSON form's sums; the sums come back in the header either way.
#[tokio::test]
async fn the_bulk_form_gives_the_json_forms_sums() {
    use crate::bulk::{answer, body, post, Buf};
    use gpu_ops::wire::Dtype;
    let s = TestServer::start(&[]).await;
    for curve in [Curve::Bn254G1, Curve::Bls12_381G1] {
        let points = hard_points(curve, 9, 5);
        let scalars = scalars_for(curve, points.len(), 6);
        let n = points.len() as u64;
        let want: Value = s
            .post(
                "/zk/msm",
                json!({"curve": curve.name(), "encoding": "base64", "scalars": base64_scalars(&scalars),
                    "points": B64.encode(points.to_le_bytes())}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let words = (curve.coordinate_bytes() / 8) as u64;
        let bulk = |point_shape: Vec<u64>| {
            body(
                json!({"curve": curve.name(), "encoding": "base64"}),
                vec![
                    Buf {
                        at: "/scalars",
                        dtype: Dtype::U256,
                        shape: vec![n],
                        bytes: B64.decode(base64_scalars(&scalars)).unwrap(),
                    },
                    Buf {
                        at: "/points",
                        dtype: Dtype::U64,
                        shape: point_shape,
                        bytes: points.to_le_bytes(),
                    },
                ],
            )
        };
        let res = post(&s, "/zk/msm", bulk(vec![n, 2, words]), false).await;
        assert_eq!(res.json::<Value>().await.unwrap(), want, "{curve:?}");
        let got = answer(post(&s, "/zk/msm", bulk(vec![n, 2, words]), true).await).await;
        assert_eq!(got.header, want, "{curve:?}");
        // The words per coordinate are the curve's.
        let res = post(&s, "/zk/msm", bulk(vec![n, 2 * words]), false).await;
        let p = problem(res, 422, "invalid_request").await;
        assert_eq!(p["errors"][0]["path"], "/points/shape");
    }
}
