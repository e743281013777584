//! Resident arrays on the emulated device: an MSM over a resident array's points, a
//! product over a resident weight matrix, a convolution over resident weights and
//! attention over resident keys and values upload the array on their first run there and
//! reuse the device's copy after (a cache hit, no upload), with the CPU's answers every
//! time; deleting the array drops the copy.

use super::emulated_http::{both, emulated_server, flat, strings};
use gpu_ops::ops::zk::msm::Curve;
use gpu_ops::ops::zk::samples::random_points;
use serde_json::{json, Value};

/// `gpu_ops_device_cache_total` for resident arrays on the emulated device (`gpu` 0):
/// only this test makes array copies there.
fn array_lookups(s: &crate::common::TestServer, result: &str) -> u64 {
    s.state
        .metrics
        .device_cache_lookups
        .with_label_values(&["0", "array", result])
        .get()
}

/// One test, so the counters of array copies move for one use at a time.
#[tokio::test]
async fn resident_arrays_stay_on_the_emulated_device() {
    let s = emulated_server();
    msm_points_stay(&s).await;
    matmul_weights_stay(&s).await;
    conv2d_weights_stay(&s).await;
    attention_keys_and_values_stay(&s).await;
}

async fn created(s: &crate::common::TestServer, body: Value) -> String {
    let res = s.post("/arrays", body).send().await.unwrap();
    assert_eq!(res.status(), 201);
    let made: Value = res.json().await.unwrap();
    made["id"].as_str().unwrap().to_string()
}

/// Deletes array `id`; its copy under `key` leaves the device.
/// The device holds a copy under the array's key, or derived data under it (an MSM's
/// precomputed multiples, in place of the points), and none once the array is deleted.
async fn delete_drops_the_copy(s: &crate::common::TestServer, id: &str, key: &str) {
    let gpus = s.state.backends.gpus();
    let held =
        |g: &gpu_ops::backend::GpuDevice| g.holds_table(key) || !g.tables_under(key).is_empty();
    assert!(held(&gpus[0]), "{key}");
    let text = s.metrics().await;
    assert!(
        text.contains(r#"gpu_ops_device_cache_bytes{gpu="0",kind="array"}"#),
        "{text}"
    );
    let deleted = s.delete(&format!("/arrays/{id}")).send().await.unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(!held(&gpus[0]), "{key}");
    let held = s
        .state
        .metrics
        .device_cache_bytes
        .with_label_values(&["0", "array"])
        .get();
    assert_eq!(held, 0, "{key}: the deleted array's copy is gone");
}

async fn msm_points_stay(s: &crate::common::TestServer) {
    for (i, curve) in [Curve::Bn254G1, Curve::Bls12_381G1].into_iter().enumerate() {
        let points = random_points(curve, 600, 21 + i as u64);
        // An identity among them: the launcher leaves it out of the upload it keeps.
        let mut json_points: Vec<Value> = (0..points.len())
            .map(|i| {
                let (x, y) = points.coordinates(i).expect("random points are finite");
                json!({"x": x.to_string(), "y": y.to_string()})
            })
            .collect();
        json_points[17] = Value::Null;
        let id = created(
            s,
            json!({"kind": "points", "curve": curve.name(), "points": json_points}),
        )
        .await;
        let key = gpu_ops::arrays::device_key(&id);
        let (misses, hits) = (array_lookups(s, "miss"), array_lookups(s, "hit"));
        for (round, seed) in [31u64, 32].into_iter().enumerate() {
            let scalars = strings(curve.scalar_field(), 600, seed + 10 * i as u64);
            let (dev, cpu) = both(
                s,
                "/zk/msm",
                json!({"curve": curve.name(), "points": {"array": id}, "scalars": scalars}),
            )
            .await;
            assert_eq!(dev, cpu, "msm {curve:?} round {round}");
            if round == 0 {
                // The inline points give the same sum: the kept copy is these points.
                let inline = both(
                    s,
                    "/zk/msm",
                    json!({"curve": curve.name(), "points": json_points, "scalars": scalars}),
                )
                .await
                .0;
                assert_eq!(dev, inline, "msm {curve:?}");
            }
            // One upload, on the first device run; every later one a hit.
            assert_eq!(array_lookups(s, "miss"), misses + 1, "round {round}");
            assert_eq!(array_lookups(s, "hit"), hits + round as u64);
        }
        // Kept as its precomputed multiples (--msm-precompute-factor's default 4), in
        // place of the points' plain copy.
        let under = s.state.backends.gpus()[0].tables_under(&key);
        assert!(
            under.len() == 1 && under[0].starts_with(&format!("{key}/multiples/")),
            "{under:?}"
        );
        assert!(!s.state.backends.gpus()[0].holds_table(&key));
        delete_drops_the_copy(s, &id, &key).await;
    }
}

/// B `[K, N]` resident, A sent each time: the product on the device equals the CPU's,
/// and only the first upload of B happens.
async fn matmul_weights_stay(s: &crate::common::TestServer) {
    let (m, k, n) = (5, 40, 24);
    let matrix = |rows: usize, cols: usize, seed: usize| -> Vec<Vec<f64>> {
        (0..rows)
            .map(|r| {
                let at = |c: usize| ((r * 31 + c * 7 + seed) % 97) as f64 / 16.0 - 3.0;
                (0..cols).map(at).collect()
            })
            .collect()
    };
    let weights = matrix(k, n, 1);
    let id = created(s, json!({"kind": "tensor", "tensor": weights})).await;
    let key = format!("{}/f32", gpu_ops::arrays::device_key(&id));
    let (misses, hits) = (array_lookups(s, "miss"), array_lookups(s, "hit"));
    for round in 0..2u64 {
        let a = matrix(m, k, 2 + round as usize);
        let (dev, cpu) = both(s, "/linalg/matmul", json!({"a": a, "b": {"array": id}})).await;
        assert_eq!(dev["result"], cpu["result"], "round {round}");
        let inline = both(s, "/linalg/matmul", json!({"a": a, "b": weights}))
            .await
            .0;
        assert_eq!(dev["result"], inline["result"], "round {round}");
        assert_eq!(array_lookups(s, "miss"), misses + 1, "round {round}");
        assert_eq!(array_lookups(s, "hit"), hits + round);
    }
    delete_drops_the_copy(s, &id, &key).await;
}

/// Convolution weights `[O, C/g, KH, KW]` resident, images sent each time: equal to the
/// CPU's and to the same weights sent inline; one upload of the weights, then hits.
async fn conv2d_weights_stay(s: &crate::common::TestServer) {
    let grid = |dims: [usize; 4], salt: usize| -> Value {
        let [a, b, c, d] = dims;
        json!((0..a)
            .map(|i| (0..b)
                .map(|j| (0..c)
                    .map(|k| (0..d)
                        .map(|l| ((i * 7 + j * 5 + k * 3 + l + salt) % 9) as f64 - 4.0)
                        .collect::<Vec<_>>())
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>())
            .collect::<Vec<_>>())
    };
    let weights = grid([6, 2, 3, 2], 2);
    let id = created(s, json!({"kind": "tensor", "tensor": weights})).await;
    let (misses, hits) = (array_lookups(s, "miss"), array_lookups(s, "hit"));
    for round in 0..2 {
        let body = |weight: Value| {
            json!({"input": grid([2, 4, 9, 10], round), "weight": weight, "groups": 2,
                   "padding": [1, 1, 0, 0], "bias": [1, -2, 3, 0, 0.5, -0.5],
                   "relu": true})
        };
        let (dev, cpu) = both(s, "/nn/conv2d", body(json!({"array": id}))).await;
        assert_eq!(dev["result"], cpu["result"], "round {round}");
        let inline = both(s, "/nn/conv2d", body(weights.clone())).await.0;
        assert_eq!(dev["result"], inline["result"], "round {round}");
        assert_eq!(array_lookups(s, "miss"), misses + 1, "round {round}");
        assert_eq!(
            array_lookups(s, "hit"),
            hits + round as u64,
            "round {round}"
        );
    }
    let key = format!("{}/f32", gpu_ops::arrays::device_key(&id));
    delete_drops_the_copy(s, &id, &key).await;
}

/// Attention's keys and values resident `[1, H_kv, S_kv, D]`, queries sent each time, in
/// f32 (the f32 kernel, which keeps f32 copies) and bf16 (the tensor cores' kernel, which
/// keeps the 16-bit form: `…/bf16/bits`): the same output as with K and V sent inline,
/// within the dtype's rounding of the CPU's; one upload of each, then hits.
async fn attention_keys_and_values_stay(s: &crate::common::TestServer) {
    let tensor = |heads: usize, len: usize, dim: usize, salt: usize| -> Value {
        let rows = |h: usize| -> Vec<Vec<f64>> {
            let at = |i: usize, j: usize| ((i * 7 + j * 3 + h * 5 + salt) % 13) as f64 / 4.0 - 1.5;
            (0..len)
                .map(|i| (0..dim).map(|j| at(i, j)).collect())
                .collect()
        };
        json!([(0..heads).map(rows).collect::<Vec<_>>()])
    };
    for (dtype, form, tolerance) in [("f32", "", 1e-5), ("bf16", "/bits", 1.0 / 64.0)] {
        let (k, v) = (tensor(2, 40, 16, 2), tensor(2, 40, 8, 3));
        let make = |t: &Value| json!({"kind": "tensor", "tensor": t, "dtype": dtype});
        let (k_id, v_id) = (created(s, make(&k)).await, created(s, make(&v)).await);
        let (misses, hits) = (array_lookups(s, "miss"), array_lookups(s, "hit"));
        for round in 0..2u64 {
            let body = |k: Value, v: Value| {
                json!({"q": tensor(4, 21, 16, round as usize), "k": k, "v": v,
                       "dtype": dtype, "causal": true, "key_lengths": [33]})
            };
            let resident = body(json!({"array": k_id}), json!({"array": v_id}));
            let (dev, cpu) = both(s, "/nn/attention", resident).await;
            let (d, c) = (flat(&dev["output"]), flat(&cpu["output"]));
            assert_eq!(d.len(), 4 * 21 * 8, "{dtype}");
            for (i, (x, y)) in d.iter().zip(&c).enumerate() {
                let close = (x - y).abs() <= tolerance * (1.0 + y.abs());
                assert!(close, "{dtype} round {round}, value {i}: {x} against {y}");
            }
            let inline = both(s, "/nn/attention", body(k.clone(), v.clone())).await.0;
            assert_eq!(dev["output"], inline["output"], "{dtype} round {round}");
            assert_eq!(
                array_lookups(s, "miss"),
                misses + 2,
                "{dtype} round {round}"
            );
            assert_eq!(array_lookups(s, "hit"), hits + 2 * round, "{dtype}");
        }
        let key = |id: &str| format!("{}/{dtype}{form}", gpu_ops::arrays::device_key(id));
        let gpu = &s.state.backends.gpus()[0];
        assert!(gpu.holds_table(&key(&k_id)), "{dtype}");
        let deleted = s.delete(&format!("/arrays/{k_id}")).send().await.unwrap();
        assert_eq!(deleted.status(), 204);
        assert!(!gpu.holds_table(&key(&k_id)), "{dtype}");
        delete_drops_the_copy(s, &v_id, &key(&v_id)).await;
    }
}
