//! `/beams` over HTTP. Channels: reproducible by seed and channel index whatever the
//! batch split, the paths they report rebuild them, base64 and f64 answers. Sweeps: an
//! uploaded single-path channel whose best pair is known, generated channels agreeing
//! with the channels endpoint, noise reproducible by its seed, and each refusal with its
//! code and path.

use crate::common;

use base64::Engine;
use common::{problem, TestServer};
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(items) => items.iter().flat_map(flat).collect(),
        x => vec![x.as_f64().expect("a number")],
    }
}

async fn post(s: &TestServer, path: &str, body: Value) -> reqwest::Response {
    s.post(path, body).send().await.unwrap()
}

async fn ok(s: &TestServer, path: &str, body: Value) -> Value {
    let res = post(s, path, body.clone()).await;
    assert_eq!(res.status(), 200, "{body}");
    res.json().await.unwrap()
}

fn model(batch: usize, first: u64) -> Value {
    json!({"batch": batch, "tx_array": {"columns": 8}, "rx_array": {"rows": 2, "columns": 2},
           "paths": 2, "seed": 42, "first_channel": first,
           "azimuth_deg": [-60, 60], "elevation_deg": [-10, 10]})
}

#[tokio::test]
async fn channels_are_reproducible_by_index_and_rebuilt_from_their_paths() {
    let s = TestServer::start(&[]).await;
    let whole = ok(
        &s,
        "/beams/channels",
        json!({"model": model(5, 0), "return_paths": true, "out_dtype": "f64"}),
    )
    .await;
    assert_eq!(whole["shape"], json!([5, 4, 8, 2]));
    assert_eq!(whole["seed"], 42);
    assert_eq!(whole["dtype"], "f64");
    let part = ok(
        &s,
        "/beams/channels",
        json!({"model": model(2, 3), "out_dtype": "f64"}),
    )
    .await;
    let (w, p) = (flat(&whole["channels"]), flat(&part["channels"]));
    assert_eq!(p, w[3 * 64..5 * 64]);
    // Rebuild channel 1 from its reported paths by the definition.
    let gains = flat(&whole["paths"]["gain"]);
    let dep = flat(&whole["paths"]["departure_deg"]);
    let arr = flat(&whole["paths"]["arrival_deg"]);
    let phase = |rows_cols: (usize, usize), e: usize, az: f64, el: f64| {
        let (az, el) = (az.to_radians(), el.to_radians());
        let (row, col) = (e / rows_cols.1, e % rows_cols.1);
        std::f64::consts::PI * (col as f64 * az.sin() * el.cos() + row as f64 * el.sin())
    };
    for i in 0..4 {
        for j in 0..8 {
            let (mut re, mut im) = (0.0, 0.0);
            for l in 2..4 {
                let x = phase((2, 2), i, arr[2 * l], arr[2 * l + 1])
                    - phase((1, 8), j, dep[2 * l], dep[2 * l + 1]);
                let (g0, g1) = (gains[2 * l] / 2f64.sqrt(), gains[2 * l + 1] / 2f64.sqrt());
                re += g0 * x.cos() - g1 * x.sin();
                im += g0 * x.sin() + g1 * x.cos();
            }
            let k = 2 * (64 / 2 + i * 8 + j);
            assert!(
                (w[k] - re).abs() < 1e-12 && (w[k + 1] - im).abs() < 1e-12,
                "({i}, {j})"
            );
        }
    }
    for a in arr.chunks(2).chain(dep.chunks(2)) {
        assert!(
            (-60.0..=60.0).contains(&a[0]) && (-10.0..=10.0).contains(&a[1]),
            "{a:?}"
        );
    }
    // Packed f32: the same values rounded.
    let packed = ok(
        &s,
        "/beams/channels",
        json!({"model": model(5, 0), "encoding": "base64"}),
    )
    .await;
    assert_eq!(packed["channels"]["dtype"], "f32");
    let bytes = B64
        .decode(packed["channels"]["data"].as_str().unwrap())
        .unwrap();
    let values: Vec<f64> = bytes
        .chunks(4)
        .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
        .collect();
    assert_eq!(
        values,
        w.iter().map(|&x| f64::from(x as f32)).collect::<Vec<_>>()
    );
    // No seed: one is drawn and reported, and it gives the same channels back.
    let mut m = model(1, 0);
    m.as_object_mut().unwrap().remove("seed");
    let drawn = ok(&s, "/beams/channels", json!({"model": m})).await;
    m["seed"] = drawn["seed"].clone();
    let again = ok(&s, "/beams/channels", json!({"model": m})).await;
    assert_eq!(drawn["channels"], again["channels"]);
}

/// A single path along DFT beams 5 (transmit) and 2 (receive): that pair wins with the
/// whole array gain N_r·N_t·|g|².
#[tokio::test]
async fn the_best_pair_of_an_on_grid_path_is_found() {
    let s = TestServer::start(&[]).await;
    let (nr, nt) = (4usize, 16usize);
    let h_t = -1.0 + 2.0 * 5.0 / 16.0;
    let h_r = -1.0 + 2.0 * 2.0 / 4.0;
    let mut h = vec![vec![vec![0.0; 2]; nt]; nr];
    for (i, row) in h.iter_mut().enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            let x = std::f64::consts::PI * (i as f64 * h_r - j as f64 * h_t);
            *v = vec![0.5 * x.cos(), 0.5 * x.sin()];
        }
    }
    let body = ok(
        &s,
        "/beams/sweep",
        json!({"channels": [h], "return_grid": true, "out_dtype": "f64"}),
    )
    .await;
    assert_eq!(body["best"]["tx"], json!([5]));
    assert_eq!(body["best"]["rx"], json!([2]));
    let power = body["best"]["power"][0].as_f64().unwrap();
    assert!((power - 0.25 * (nr * nt) as f64).abs() < 1e-9, "{power}");
    assert_eq!(
        (body["tx_beams"].as_u64(), body["rx_beams"].as_u64()),
        (Some(16), Some(4))
    );
    let grid = flat(&body["grid"]);
    assert_eq!(grid.len(), 64);
    assert_eq!(grid[2 * 16 + 5], power);
    assert!(
        body.get("seed").is_none() && body.get("noise_seed").is_none(),
        "{body}"
    );
}

#[tokio::test]
async fn generated_sweeps_match_uploaded_channels_and_noise_follows_its_seed() {
    let s = TestServer::start(&[]).await;
    let channels = ok(
        &s,
        "/beams/channels",
        json!({"model": model(3, 7), "out_dtype": "f64"}),
    )
    .await;
    let books = json!({"tx_codebook": {"oversampling": 2}, "rx_codebook": {"oversampling": 1},
                       "return_grid": true, "out_dtype": "f64"});
    let mut generated = books.clone();
    generated["model"] = model(3, 7);
    let a = ok(&s, "/beams/sweep", generated.clone()).await;
    assert_eq!(a["seed"], 42);
    let mut uploaded = books.clone();
    uploaded["channels"] = channels["channels"].clone();
    uploaded["tx_array"] = json!({"columns": 8});
    uploaded["rx_array"] = json!({"rows": 2, "columns": 2});
    let b = ok(&s, "/beams/sweep", uploaded).await;
    assert_eq!(a["best"], b["best"]);
    assert_eq!(
        (a["tx_beams"].as_u64(), a["rx_beams"].as_u64()),
        (Some(16), Some(4))
    );
    for (x, y) in flat(&a["grid"]).iter().zip(flat(&b["grid"])) {
        assert!((x - y).abs() <= 1e-12 * y.abs().max(1.0));
    }
    // Noise: the same seed, the same powers; another seed, others.
    generated["snr_db"] = json!(0);
    generated["noise_seed"] = json!(5);
    let n1 = ok(&s, "/beams/sweep", generated.clone()).await;
    let n2 = ok(&s, "/beams/sweep", generated.clone()).await;
    assert_eq!(n1["grid"], n2["grid"]);
    assert_eq!(n1["noise_seed"], 5);
    assert_ne!(n1["grid"], a["grid"]);
    generated["noise_seed"] = json!(6);
    let n3 = ok(&s, "/beams/sweep", generated.clone()).await;
    assert_ne!(n1["grid"], n3["grid"]);
    // Without the grid, the best pairs alone; packed grid in f32.
    generated["return_grid"] = json!(false);
    let best = ok(&s, "/beams/sweep", generated.clone()).await;
    assert!(best.get("grid").is_none());
    assert_eq!(best["best"], n3["best"]);
    generated["return_grid"] = json!(true);
    generated["encoding"] = json!("base64");
    generated["out_dtype"] = json!("f32");
    let packed = ok(&s, "/beams/sweep", generated).await;
    assert_eq!(packed["grid"]["shape"], json!([3, 4, 16]));
}

#[tokio::test]
async fn refusals_carry_their_code_and_path() {
    let s = TestServer::start(&["--max-tensor-elements", "4096"]).await;
    let one_channel = json!([[[[1, 0], [0, 1]]]]);
    let cases = [
        (
            "/beams/channels",
            json!({"model": {"batch": 1, "tx_array": {"columns": 0}, "rx_array": {"columns": 2}}}),
            422,
            "invalid_parameter",
            "/model/tx_array",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 1, "tx_array": {"rows": 33, "columns": 32}, "rx_array": {"columns": 2}}}),
            422,
            "invalid_parameter",
            "/model/tx_array",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 1, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}, "paths": 65}}),
            422,
            "invalid_parameter",
            "/model/paths",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 0, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}}}),
            422,
            "invalid_parameter",
            "/model/batch",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 1, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}, "azimuth_deg": [30, 10]}}),
            422,
            "invalid_parameter",
            "/model/azimuth_deg",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 1, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}, "elevation_deg": [-91, 0]}}),
            422,
            "invalid_parameter",
            "/model/elevation_deg",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 2, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}, "first_channel": u64::MAX}}),
            422,
            "invalid_parameter",
            "/model/first_channel",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 1000, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}}}),
            413,
            "payload_too_large",
            "/model/batch",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 300, "tx_array": {"columns": 1}, "rx_array": {"columns": 1}, "paths": 8}, "return_paths": true}),
            413,
            "payload_too_large",
            "/model/paths",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 1, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}, "extra": 1}}),
            422,
            "invalid_request",
            "/model/extra",
        ),
        (
            "/beams/sweep",
            json!({}),
            422,
            "invalid_parameter",
            "/model",
        ),
        (
            "/beams/sweep",
            json!({"channels": one_channel, "model": {"batch": 1, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}}}),
            422,
            "invalid_parameter",
            "/model",
        ),
        (
            "/beams/sweep",
            json!({"channels": [[[1, 0], [0, 1]]]}),
            422,
            "invalid_tensor",
            "/channels",
        ),
        (
            "/beams/sweep",
            json!({"channels": [[[[1, 0, 2], [0, 1, 2]]]]}),
            422,
            "invalid_tensor",
            "/channels",
        ),
        (
            "/beams/sweep",
            json!({"channels": one_channel, "tx_array": {"columns": 3}}),
            422,
            "invalid_parameter",
            "/tx_array",
        ),
        (
            "/beams/sweep",
            json!({"model": {"batch": 1, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}}, "rx_array": {"columns": 2}}),
            422,
            "invalid_parameter",
            "/rx_array",
        ),
        (
            "/beams/sweep",
            json!({"channels": one_channel, "tx_codebook": {"oversampling": 9}}),
            422,
            "invalid_parameter",
            "/tx_codebook/oversampling",
        ),
        (
            "/beams/sweep",
            json!({"channels": one_channel, "tx_codebook": {"oversampling": 2, "beams": [[[1, 0]]]}}),
            422,
            "invalid_parameter",
            "/tx_codebook/oversampling",
        ),
        (
            "/beams/sweep",
            json!({"channels": one_channel, "rx_codebook": {"beams": [[[1, 0], [0, 1], [1, 1]]]}}),
            422,
            "invalid_tensor",
            "/rx_codebook/beams",
        ),
        (
            "/beams/sweep",
            json!({"channels": one_channel, "snr_db": 500}),
            422,
            "invalid_parameter",
            "/snr_db",
        ),
        (
            "/beams/sweep",
            json!({"channels": [[[[1e30, 0], [0, 1]]]]}),
            422,
            "invalid_parameter",
            "/channels/0",
        ),
        (
            "/beams/sweep",
            json!({"model": {"batch": 20, "tx_array": {"columns": 4}, "rx_array": {"columns": 4}}, "tx_codebook": {"oversampling": 4}, "rx_codebook": {"oversampling": 4}}),
            413,
            "payload_too_large",
            "/model/batch",
        ),
        (
            "/beams/sweep",
            json!({"channels": one_channel, "backend": "cuda"}),
            503,
            "device_unavailable",
            "",
        ),
    ];
    let more = [
        (
            "/beams/sweep",
            json!({"channels": one_channel, "rx_codebook": [null, null]}),
            422,
            "invalid_request",
            "/rx_codebook",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 1, "tx_array": [1, 2], "rx_array": {"columns": 2}}}),
            422,
            "invalid_request",
            "/model/tx_array",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": 1, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}, "seed": 1u64 << 63}}),
            422,
            "invalid_parameter",
            "/model/seed",
        ),
        (
            "/beams/sweep",
            json!({"channels": one_channel, "snr_db": 3, "noise_seed": u64::MAX}),
            422,
            "invalid_parameter",
            "/noise_seed",
        ),
    ];
    let later = [
        (
            "/beams/channels",
            json!({"model": {"batch": 200, "tx_array": {"columns": 1}, "rx_array": {"columns": 1}, "paths": 64}}),
            413,
            "payload_too_large",
            "/model/paths",
        ),
        (
            "/beams/channels",
            json!({"model": {"batch": u64::MAX, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}}}),
            413,
            "payload_too_large",
            "/model/batch",
        ),
        (
            "/beams/sweep",
            json!({"channels": one_channel, "noise_seed": 3}),
            422,
            "invalid_parameter",
            "/noise_seed",
        ),
        (
            "/beams/sweep",
            json!({"channels": [[vec![vec![1, 0]; 1025]]]}),
            422,
            "invalid_parameter",
            "/channels",
        ),
        (
            "/beams/sweep",
            json!({"model": {"batch": 1, "tx_array": {"columns": 2}, "rx_array": {"columns": 2}}, "rx_codebook": {"beams": [[[1e200, 0], [0, 1]]]}}),
            422,
            "invalid_parameter",
            "/rx_codebook",
        ),
    ];
    for (path, body, status, code, at) in cases.into_iter().chain(more).chain(later) {
        let p = problem(post(&s, path, body.clone()).await, status, code).await;
        if !at.is_empty() {
            assert_eq!(p["errors"][0]["path"], at, "{path} {body}: {p}");
        }
    }
    // Still serving.
    ok(&s, "/beams/sweep", json!({"channels": one_channel})).await;
}
