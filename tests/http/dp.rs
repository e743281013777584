//! `/dp/*` over a real socket: accountant answers, privatization, mechanisms, budgets,
//! tenants, concurrency, and every kind of bad input.

use crate::common;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use common::{problem, TestServer};
use serde_json::{json, Value};

async fn ok(server: &TestServer, path: &str, body: Value) -> Value {
    let res = server.post(path, body).send().await.unwrap();
    let status = res.status();
    let text = res.text().await.unwrap();
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

async fn budget(server: &TestServer, limit: f64) -> String {
    let res = server
        .post(
            "/dp/budgets",
            json!({"epsilon_limit": limit, "delta": 1e-5, "name": "test"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let location = res.headers()["location"].to_str().unwrap().to_string();
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        location,
        format!("/dp/budgets/{}", body["id"].as_str().unwrap())
    );
    assert_eq!(
        (body["epsilon_spent"].as_f64(), body["charges"].as_u64()),
        (Some(0.0), Some(0))
    );
    body["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn accountant_matches_published_cases() {
    let server = TestServer::start(&[]).await;
    let got = ok(
        &server,
        "/dp/accountant/epsilon",
        json!({"sample_rate": 0.04, "noise_multiplier": 1.5, "steps": 2250, "delta": 1e-5}),
    )
    .await;
    let eps = got["epsilon"].as_f64().unwrap();
    assert!((eps - 7.32911117143).abs() < 7.33e-6, "{got}");
    assert_eq!(got["optimal_order"], 3.9);

    let got = ok(
        &server,
        "/dp/accountant/epsilon",
        json!({"sample_rate": 0.0025, "noise_multiplier": 1.3, "steps": 6000, "delta": 1e-5, "orders": "tf"}),
    )
    .await;
    assert!((got["epsilon"].as_f64().unwrap() - 0.7242234026109595).abs() < 1e-6 * 0.7243);

    let got = ok(
        &server,
        "/dp/accountant/noise_multiplier",
        json!({"target_epsilon": 8.0, "delta": 1e-5, "sample_rate": 0.04, "steps": 2250}),
    )
    .await;
    assert!(
        (got["noise_multiplier"].as_f64().unwrap() - 1.416).abs() < 1e-3,
        "{got}"
    );
    assert!(got["epsilon"].as_f64().unwrap() <= 8.0);
}

#[tokio::test]
async fn bad_parameters_get_422_with_the_field_path() {
    let server = TestServer::start(&[]).await;
    let eps = json!({"sample_rate": 0.01, "noise_multiplier": 1.0, "steps": 10, "delta": 1e-5});
    let with = |base: &Value, k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let grads = json!({"per_example_gradients": [[1.0, 2.0], [3.0, 4.0]], "clip_norm": 1.0, "noise_multiplier": 1.0});
    let nan_f64 = B64.encode(
        f64::NAN
            .to_le_bytes()
            .into_iter()
            .chain(1.0f64.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    let cases: Vec<(&str, Value, u16, &str, &str)> = vec![
        (
            "/dp/accountant/epsilon",
            with(&eps, "delta", json!(1.0)),
            422,
            "invalid_parameter",
            "/delta",
        ),
        (
            "/dp/accountant/epsilon",
            with(&eps, "delta", json!(0.0)),
            422,
            "invalid_parameter",
            "/delta",
        ),
        (
            "/dp/accountant/epsilon",
            with(&eps, "sample_rate", json!(0.0)),
            422,
            "invalid_parameter",
            "/sample_rate",
        ),
        (
            "/dp/accountant/epsilon",
            with(&eps, "sample_rate", json!(1.5)),
            422,
            "invalid_parameter",
            "/sample_rate",
        ),
        (
            "/dp/accountant/epsilon",
            with(&eps, "noise_multiplier", json!(0.0)),
            422,
            "invalid_parameter",
            "/noise_multiplier",
        ),
        (
            "/dp/accountant/epsilon",
            with(&eps, "steps", json!(0)),
            422,
            "invalid_parameter",
            "/steps",
        ),
        (
            "/dp/accountant/epsilon",
            with(&eps, "orders", json!([2.0, 1.0])),
            422,
            "invalid_parameter",
            "/orders/1",
        ),
        (
            "/dp/accountant/epsilon",
            with(&eps, "steps", json!(-1)),
            422,
            "invalid_request",
            "/steps",
        ),
        (
            "/dp/accountant/noise_multiplier",
            json!({"target_epsilon": -1.0, "delta": 1e-5, "sample_rate": 0.1, "steps": 10}),
            422,
            "invalid_parameter",
            "/target_epsilon",
        ),
        (
            "/dp/accountant/noise_multiplier",
            json!({"target_epsilon": 1e-7, "delta": 1e-5, "sample_rate": 1.0, "steps": 1000}),
            422,
            "invalid_parameter",
            "/target_epsilon",
        ),
        (
            "/dp/privatize",
            with(&grads, "clip_norm", json!(0.0)),
            422,
            "invalid_parameter",
            "/clip_norm",
        ),
        (
            "/dp/privatize",
            with(&grads, "noise_multiplier", json!(-1.0)),
            422,
            "invalid_parameter",
            "/noise_multiplier",
        ),
        (
            "/dp/privatize",
            with(&grads, "layers", json!([{"columns": 2, "clip_norm": 1.0}])),
            422,
            "invalid_parameter",
            "/clip_norm",
        ),
        (
            "/dp/privatize",
            with(&grads, "per_example_gradients", json!([[1.0, 2.0], [3.0]])),
            422,
            "invalid_tensor",
            "/per_example_gradients/1",
        ),
        (
            "/dp/privatize",
            with(&grads, "per_example_gradients", json!([])),
            422,
            "invalid_tensor",
            "/per_example_gradients",
        ),
        (
            "/dp/privatize",
            with(&grads, "per_example_gradients", json!([[1.0, "x"]])),
            422,
            "invalid_request",
            "/per_example_gradients/0/1",
        ),
        (
            "/dp/privatize",
            with(
                &grads,
                "per_example_gradients",
                json!({"encoding": "base64", "dtype": "f64", "shape": [1, 2], "data": nan_f64}),
            ),
            422,
            "invalid_tensor",
            "/per_example_gradients/data",
        ),
        (
            "/dp/privatize",
            with(
                &grads,
                "per_example_gradients",
                json!({"encoding": "base64", "dtype": "f32", "shape": [2, 2], "data": "AAAA"}),
            ),
            422,
            "invalid_tensor",
            "/per_example_gradients/data",
        ),
        (
            "/dp/privatize",
            with(
                &grads,
                "per_example_gradients",
                json!({"encoding": "base64", "dtype": "f32", "shape": [4], "data": "AAAA"}),
            ),
            422,
            "invalid_tensor",
            "/per_example_gradients/shape",
        ),
        (
            "/dp/privatize",
            with(&grads, "expected_batch_size", json!(0)),
            422,
            "invalid_parameter",
            "/expected_batch_size",
        ),
        (
            "/dp/privatize",
            with(&grads, "budget_id", json!("bud_x")),
            422,
            "invalid_parameter",
            "/sample_rate",
        ),
        (
            "/dp/privatize",
            with(
                &with(&grads, "clip_norm", Value::Null),
                "layers",
                json!([{"columns": 1, "clip_norm": 1.0}]),
            ),
            422,
            "invalid_parameter",
            "/layers",
        ),
        (
            "/dp/privatize",
            with(&grads, "seed", json!(7)),
            403,
            "seed_not_allowed",
            "/seed",
        ),
        (
            "/dp/laplace",
            json!({"values": [1.0], "sensitivity": 1.0, "epsilon": 0.0}),
            422,
            "invalid_parameter",
            "/epsilon",
        ),
        (
            "/dp/laplace",
            json!({"values": [], "sensitivity": 1.0, "epsilon": 1.0}),
            422,
            "invalid_tensor",
            "/values",
        ),
        (
            "/dp/laplace",
            json!({"values": [1e300], "sensitivity": 1.0, "epsilon": 1.0}),
            422,
            "invalid_parameter",
            "/values/0",
        ),
        (
            "/dp/gaussian",
            json!({"values": [1.0], "sensitivity": 1.0, "epsilon": 1.0, "delta": 1.0}),
            422,
            "invalid_parameter",
            "/delta",
        ),
        (
            "/dp/gaussian",
            json!({"values": [1.0], "sensitivity": 0.0, "epsilon": 1.0, "delta": 1e-5}),
            422,
            "invalid_parameter",
            "/sensitivity",
        ),
        (
            "/dp/gaussian",
            json!({"values": [1.0], "sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5, "budget_id": "bud_none"}),
            404,
            "budget_not_found",
            "/budget_id",
        ),
        (
            "/dp/budgets",
            json!({"epsilon_limit": 0.0, "delta": 1e-5}),
            422,
            "invalid_parameter",
            "/epsilon_limit",
        ),
        (
            "/dp/budgets",
            json!({"epsilon_limit": 1.0, "delta": 2.0}),
            422,
            "invalid_parameter",
            "/delta",
        ),
        (
            "/dp/budgets",
            json!({"epsilon_limit": 1.0, "delta": 1e-5, "accountant": "prv"}),
            422,
            "invalid_request",
            "/accountant",
        ),
    ];
    for (path, body, status, code, pointer) in cases {
        let res = server.post(path, body.clone()).send().await.unwrap();
        let p = problem(res, status, code).await;
        assert_eq!(p["errors"][0]["path"], pointer, "{path} {body}: {p}");
    }
    // The server kept serving.
    assert_eq!(server.get("/health/live").await.status(), 200);
}

#[tokio::test]
async fn privatize_clips_exactly_and_answers_in_kind() {
    let server = TestServer::start(&[]).await;
    // Noise far below the tolerance: the answer is the clipped mean.
    let got = ok(
        &server,
        "/dp/privatize",
        json!({"per_example_gradients": [[3.0, 4.0], [0.3, 0.4]], "clip_norm": 1.0, "noise_multiplier": 1e-9}),
    )
    .await;
    let f = 1.0 / (5.0 + 1e-6);
    let want = [(3.0 * f + 0.3) / 2.0, (4.0 * f + 0.4) / 2.0];
    for (g, w) in got["gradient"].as_array().unwrap().iter().zip(want) {
        assert!((g.as_f64().unwrap() - w).abs() < 1e-7, "{got}");
    }
    assert_eq!(got["fraction_clipped"], 0.5);
    assert_eq!(got["max_norm"], 5.0);
    assert!(got["privacy"].is_null());

    // Packed f32 in, packed f32 out with shape [D]; `sum` does not divide.
    let rows: Vec<f32> = vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6];
    let data = B64.encode(
        rows.iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    let got = ok(
        &server,
        "/dp/privatize",
        json!({"per_example_gradients": {"encoding": "base64", "dtype": "f32", "shape": [2, 3], "data": data},
               "clip_norm": 10.0, "noise_multiplier": 1e-9, "reduction": "sum"}),
    )
    .await;
    assert_eq!(got["gradient"]["dtype"], "f32");
    assert_eq!(got["gradient"]["shape"], json!([3]));
    let bytes = B64
        .decode(got["gradient"]["data"].as_str().unwrap())
        .unwrap();
    let out: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for (o, w) in out.iter().zip([0.5f32, 0.7, 0.9]) {
        assert!((o - w).abs() < 1e-6, "{out:?}");
    }
}

/// erfc(x) by Numerical Recipes' `erfcc` (a Chebyshev fit of t·exp(−z² + P(t)),
/// t = 1/(1 + z/2)): fractional error below 1.2e-7 for every x.
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let poly = p.iter().rev().fold(0.0, |acc, &c| acc * t + c);
    let r = t * (-z * z + poly).exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// The standard normal CDF.
fn phi(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

/// The exact δ(ε) of the Gaussian mechanism with L2 sensitivity `d` and noise σ
/// (Balle & Wang 2018, Theorem 8).
fn analytic_delta(d: f64, sigma: f64, epsilon: f64) -> f64 {
    let (a, b) = (d / (2.0 * sigma), epsilon * sigma / d);
    phi(a - b) - epsilon.exp() * phi(-a - b)
}

/// The least σ at which Gaussian noise is (ε, δ)-DP at all (the analytic Gaussian
/// mechanism): δ(σ) falls with σ, so bisect for δ(σ) = δ.
fn analytic_sigma(d: f64, epsilon: f64, delta: f64) -> f64 {
    let (mut low, mut high) = (1e-3 * d, d);
    while analytic_delta(d, high, epsilon) > delta {
        high *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (low + high);
        if analytic_delta(d, mid, epsilon) > delta {
            low = mid;
        } else {
            high = mid;
        }
    }
    high
}

/// σ from the zCDP closed form (Bun & Steinke 2016, Proposition 1.3): ρ-zCDP with
/// ρ = Δ²/(2σ²) gives (ρ + 2√(ρ ln(1/δ)), δ)-DP; solved for ρ: √ρ = √(L + ε) − √L.
fn zcdp_sigma(d: f64, epsilon: f64, delta: f64) -> f64 {
    let l = (1.0 / delta).ln();
    let rho = ((l + epsilon).sqrt() - l.sqrt()).powi(2);
    d / (2.0 * rho).sqrt()
}

/// The RDP recipe over a dense grid of orders α = 1.01, 1.02, …, 256: at each α the
/// σ that makes α·Δ²/(2σ²) − (ln δ + ln α)/(α − 1) + ln((α − 1)/α) equal ε, in closed
/// form; the least of them and its order.
fn dense_rdp_sigma(d: f64, epsilon: f64, delta: f64) -> (f64, f64) {
    (101..=25_600)
        .map(|k| f64::from(k) / 100.0)
        .filter_map(|a| {
            let conversion = -(delta.ln() + a.ln()) / (a - 1.0) + ((a - 1.0) / a).ln();
            let room = epsilon - conversion;
            (room > 0.0).then(|| (d * (a / (2.0 * room)).sqrt(), a))
        })
        .fold((f64::INFINITY, f64::NAN), |best, x| {
            if x.0 < best.0 {
                x
            } else {
                best
            }
        })
}

#[test]
fn the_tests_normal_cdf_and_analytic_gaussian_are_right() {
    // erfc against Python's math.erfc (from the C library), at points of the range the
    // bisection visits and in the tails.
    for (x, want) in [
        (0.0, 1.0),
        (0.5, 0.479_500_122_186_953_5),
        (1.0, 0.157_299_207_050_285_13),
        (2.0, 4.677_734_981_047_265e-3),
        (3.0, 2.209_049_699_858_543_8e-5),
        (4.0, 1.541_725_790_028_002e-8),
        (-1.0, 1.842_700_792_949_715),
    ] {
        let got = erfc(x);
        assert!(
            ((got - want) / want).abs() < 2e-7,
            "erfc({x}) = {got}, want {want}"
        );
    }
    // ε = 1, δ = 1e-5, Δ = 1: the same bisection with Python's math.erfc gives σ =
    // 3.730 631 634 8 (the classical √(2 ln(1.25/δ))·Δ/ε = 4.84, for ε < 1 only).
    let s = analytic_sigma(1.0, 1.0, 1e-5);
    assert!((s / 3.730_631_634_8 - 1.0).abs() < 1e-6, "analytic σ {s}");
    assert!((analytic_delta(1.0, s, 1.0) / 1e-5 - 1.0).abs() < 1e-6);
    // σ scales with Δ.
    assert!((analytic_sigma(2.0, 1.0, 1e-5) / s - 2.0).abs() < 1e-9);
}

#[tokio::test]
async fn seeded_noise_is_reproducible_and_has_the_stated_spread() {
    let server = TestServer::start(&["--dp-allow-client-seed"]).await;
    let n = 50_000;
    let (epsilon, delta) = (1.0, 1e-5);
    let body = |seed: u64| json!({"values": vec![0.0; n], "sensitivity": 1.0, "epsilon": epsilon, "delta": delta, "seed": seed});
    let a = ok(&server, "/dp/gaussian", body(1)).await;
    let b = ok(&server, "/dp/gaussian", body(1)).await;
    let c = ok(&server, "/dp/gaussian", body(2)).await;
    assert_eq!(a["values"], b["values"]);
    assert_ne!(a["values"], c["values"]);
    let sigma = a["noise"]["scale"].as_f64().unwrap();
    let grid = a["noise"]["grid"].as_f64().unwrap();
    // The σ the service must have chosen, derived here without src/ops/dp: the least
    // that meets (ε, δ) by RDP for the snapped sensitivity Δ it reports.
    let d = a["noise"]["sensitivity"].as_f64().unwrap();
    assert!(
        (1.0..=1.0 + 1.0 / 1024.0).contains(&d),
        "snapped sensitivity {d}"
    );
    let upper = zcdp_sigma(d, epsilon, delta);
    let lower = analytic_sigma(d, epsilon, delta);
    let (dense, order) = dense_rdp_sigma(d, epsilon, delta);
    let numbers = format!(
        "σ reported {sigma}, Δ {d}: analytic (least any Gaussian) {lower}, \
         dense RDP {dense} (α = {order}), zCDP {upper}"
    );
    // (a) Never more than the looser zCDP conversion asks.
    assert!(sigma <= upper, "above the zCDP bound: {numbers}");
    // (b) Never less than any Gaussian noise that is (ε, δ)-DP at all.
    assert!(sigma >= lower, "below the analytic Gaussian: {numbers}");
    // (c) The RDP minimum, up to the service's coarser orders and its calibration for
    // the largest Δ snapping can leave (1 + 1/1024).
    assert!(
        sigma >= dense * (1.0 - 1e-9) && sigma <= 1.05 * dense,
        "not the least σ by RDP: {numbers}"
    );
    let xs: Vec<f64> = a["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(
        xs.iter().all(|x| (x / grid).fract() == 0.0),
        "values are on the grid"
    );
    // The noise actually added has the spread derived here (within about 3 % in
    // variance: 5 standard errors), not merely the spread the service reports.
    let mean = xs.iter().sum::<f64>() / n as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    assert!(
        mean.abs() < 5.0 * dense / (n as f64).sqrt(),
        "mean {mean}: {numbers}"
    );
    assert!(
        (var / (dense * dense) - 1.0).abs() < 5.0 * (2.0 / n as f64).sqrt(),
        "var {var}, want {}: {numbers}",
        dense * dense
    );
    assert!(a["epsilon"].as_f64().unwrap() <= epsilon);
    println!("{numbers}; sample variance {var}");

    let l = ok(
        &server,
        "/dp/laplace",
        json!({"values": vec![0.0; n], "sensitivity": 2.0, "epsilon": 0.5, "seed": 3}),
    )
    .await;
    let b_scale = l["noise"]["scale"].as_f64().unwrap();
    assert!((4.0..4.01).contains(&b_scale), "{}", l["noise"]);
    let xs: Vec<f64> = l["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let var = xs.iter().map(|x| x * x).sum::<f64>() / n as f64;
    let want = 2.0 * b_scale * b_scale;
    assert!(
        (var / want - 1.0).abs() < 5.0 * (5.0 / n as f64).sqrt(),
        "laplace var {var} vs {want}"
    );
}

#[tokio::test]
async fn budgets_charge_before_release_and_refuse_past_the_limit() {
    let server = TestServer::start(&[]).await;
    let id = budget(&server, 3.0).await;
    let release = json!({"values": [1.0, 2.0], "sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5, "budget_id": id});
    let mut spent = Vec::new();
    loop {
        let res = server
            .post("/dp/gaussian", release.clone())
            .send()
            .await
            .unwrap();
        if res.status() == 409 {
            let p = problem(res, 409, "budget_exhausted").await;
            assert!(p["detail"].as_str().unwrap().contains("limit of 3"));
            break;
        }
        assert_eq!(res.status(), 200);
        let body: Value = res.json().await.unwrap();
        let report = &body["privacy"];
        assert_eq!(report["budget_id"], id.as_str());
        assert_eq!(report["charge_seq"].as_u64(), Some(spent.len() as u64 + 1));
        spent.push(report["epsilon_spent"].as_f64().unwrap());
        assert!(spent.len() < 50, "the budget never ran out");
    }
    assert!(
        spent.len() >= 2 && spent.windows(2).all(|w| w[0] < w[1]) && *spent.last().unwrap() <= 3.0
    );
    let detail: Value = server
        .get(&format!("/dp/budgets/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        detail["charges"].as_u64(),
        Some(spent.len() as u64),
        "a refused release is not charged"
    );
    assert_eq!(detail["epsilon_spent"].as_f64(), spent.last().copied());
    assert_eq!(detail["history"].as_array().unwrap().len(), spent.len());
    assert_eq!(detail["history"][0]["kind"], "gaussian");
    let list: Value = server.get("/dp/budgets").await.json().await.unwrap();
    assert_eq!(list["budgets"][0]["id"], id.as_str());
    assert_eq!(
        server
            .metric("gpu_ops_dp_budget_charges_total{outcome=\"exhausted\"}")
            .await,
        1.0
    );
    problem(
        server.get("/dp/budgets/bud_missing").await,
        404,
        "budget_not_found",
    )
    .await;

    // DP-SGD steps charge the subsampled Gaussian at the effective noise multiplier.
    let id = budget(&server, 10.0).await;
    let got = ok(
        &server,
        "/dp/privatize",
        json!({"per_example_gradients": [[1.0, 0.0]], "clip_norm": 1.0, "noise_multiplier": 1.5,
               "sample_rate": 0.04, "budget_id": id}),
    )
    .await;
    let nm = got["effective_noise_multiplier"].as_f64().unwrap();
    assert!(nm < 1.5 && nm > 1.5 * (1.0 - 2e-3));
    let single = ok(
        &server,
        "/dp/accountant/epsilon",
        json!({"sample_rate": 0.04, "noise_multiplier": nm, "steps": 1, "delta": 1e-5}),
    )
    .await;
    let charged = got["privacy"]["epsilon_spent"].as_f64().unwrap();
    // Budgets track more orders than Opacus' default, so they are at least as tight.
    assert!(charged <= single["epsilon"].as_f64().unwrap() + 1e-12 && charged > 0.0);
}

#[tokio::test]
async fn concurrent_releases_never_overspend_a_budget() {
    let server = TestServer::start(&[]).await;
    let id = budget(&server, 4.0).await;
    let release =
        json!({"values": vec![0.5; 64], "sensitivity": 1.0, "epsilon": 1.5, "budget_id": id});
    let calls = (0..24).map(|_| server.post("/dp/laplace", release.clone()).send());
    let statuses: Vec<u16> = futures_statuses(calls).await;
    let granted = statuses.iter().filter(|&&s| s == 200).count();
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 409),
        "{statuses:?}"
    );
    let detail: Value = server
        .get(&format!("/dp/budgets/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert!(detail["epsilon_spent"].as_f64().unwrap() <= 4.0);
    assert_eq!(detail["charges"].as_u64(), Some(granted as u64));
    assert!((2..24).contains(&granted), "{granted}");
}

async fn futures_statuses(
    calls: impl Iterator<
        Item = impl std::future::Future<Output = reqwest::Result<reqwest::Response>> + Send + 'static,
    >,
) -> Vec<u16> {
    let handles: Vec<_> = calls.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap().unwrap().status().as_u16());
    }
    out
}

/// Query parameters are refused like body fields (422 `invalid_parameter` at `/name`),
/// and an empty value counts as absent.
#[tokio::test]
async fn bad_history_limits_get_422_with_the_parameter_path() {
    let server = TestServer::start(&[]).await;
    let id = budget(&server, 1.0).await;
    for query in [
        "",
        "?history_limit=",
        "?history_limit=0",
        "?history_limit=20000",
    ] {
        let res = server.get(&format!("/dp/budgets/{id}{query}")).await;
        assert_eq!(res.status(), 200, "{query}");
    }
    for bad in ["99999999999999999999", "-1", "ten", "1.5"] {
        let res = server
            .get(&format!("/dp/budgets/{id}?history_limit={bad}"))
            .await;
        let p = problem(res, 422, "invalid_parameter").await;
        assert_eq!(p["errors"][0]["path"], "/history_limit", "{bad}: {p}");
    }
}

/// A noise multiplier so small that σ² underflows has no finite ε: refused at once (the
/// series once looped a million times per order and answered `null`).
#[tokio::test]
async fn an_unbounded_epsilon_is_refused() {
    let server = TestServer::start(&[]).await;
    let res = server
        .post(
            "/dp/accountant/epsilon",
            json!({"sample_rate": 5e-324, "noise_multiplier": 5e-324, "steps": 1, "delta": 1e-5}),
        )
        .send()
        .await
        .unwrap();
    let p = problem(res, 422, "invalid_parameter").await;
    assert_eq!(p["errors"][0]["path"], "/noise_multiplier");
}

#[tokio::test]
async fn budgets_belong_to_their_tenant() {
    let keys = std::env::temp_dir().join(format!("gpu-ops-dp-keys-{}", std::process::id()));
    std::fs::write(
        &keys,
        "key-alice-0123456789 alice\nkey-bobby-0123456789 bob\n",
    )
    .unwrap();
    let server = TestServer::start(&["--api-keys-file", keys.to_str().unwrap()]).await;
    let as_user = |req: reqwest::RequestBuilder, key: &str| req.bearer_auth(key).send();
    let res = as_user(
        server.post("/dp/budgets", json!({"epsilon_limit": 1.0, "delta": 1e-5})),
        "key-alice-0123456789",
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 201);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let get = |key: &'static str| {
        server
            .client
            .get(format!("{}/dp/budgets/{id}", server.url))
            .bearer_auth(key)
            .send()
    };
    assert_eq!(get("key-alice-0123456789").await.unwrap().status(), 200);
    problem(
        get("key-bobby-0123456789").await.unwrap(),
        404,
        "budget_not_found",
    )
    .await;
    let release = json!({"values": [1.0], "sensitivity": 1.0, "epsilon": 0.1, "budget_id": id});
    let res = as_user(server.post("/dp/laplace", release), "key-bobby-0123456789")
        .await
        .unwrap();
    problem(res, 404, "budget_not_found").await;
    let bobs: Value = server
        .client
        .get(format!("{}/dp/budgets", server.url))
        .bearer_auth("key-bobby-0123456789")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(bobs["budgets"], json!([]));
    let _ = std::fs::remove_file(keys);
}

#[tokio::test]
async fn a_release_that_fails_before_producing_anything_is_refunded() {
    // No device on a CPU-only server: the job fails after the charge, before any output.
    let server = TestServer::start(&[]).await;
    let id = budget(&server, 5.0).await;
    let release = json!({"values": [1.0], "sensitivity": 1.0, "epsilon": 1.0, "budget_id": id, "backend": "cuda"});
    let res = server.post("/dp/laplace", release).send().await.unwrap();
    problem(res, 503, "device_unavailable").await;
    let detail: Value = server
        .get(&format!("/dp/budgets/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(detail["charges"], 0, "{detail}");
    assert_eq!(detail["epsilon_spent"], 0.0);
    assert_eq!(detail["history"][0]["status"], "refunded");
    assert_eq!(
        server
            .metric("gpu_ops_dp_budget_charges_total{outcome=\"refunded\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn oversized_inputs_get_413() {
    let server = TestServer::start(&["--max-elements", "2", "--max-tensor-elements", "4"]).await;
    let res = server
        .post(
            "/dp/laplace",
            json!({"values": [1.0, 2.0, 3.0], "sensitivity": 1.0, "epsilon": 1.0}),
        )
        .send()
        .await
        .unwrap();
    problem(res, 413, "payload_too_large").await;
    let res = server
        .post(
            "/dp/privatize",
            json!({"per_example_gradients": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], "clip_norm": 1.0, "noise_multiplier": 1.0}),
        )
        .send()
        .await
        .unwrap();
    let p = problem(res, 413, "payload_too_large").await;
    assert_eq!(p["errors"][0]["path"], "/per_example_gradients");
}
