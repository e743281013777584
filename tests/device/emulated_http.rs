//! `--emulate-device`: the server serves GPU work on the emulated device, so every GPU
//! operation runs end to end over HTTP with `backend: cuda` (our launchers and kernels,
//! as on a GPU) and must give the CPU's answers: integers and seeded DP noise bit for bit,
//! RF features within their stated tolerances. Dataset jobs take the device too.

use crate::common;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use common::TestServer;
use gpu_ops::ops::zk::msm::Curve;
use gpu_ops::ops::zk::samples::{random_elements, random_points};
use gpu_ops::ops::zk::Field;
use serde_json::{json, Value};

/// One server for every test here: they send requests and read answers, and the metrics
/// they read are moved by no other test here (no test falls back to the CPU; one
/// unmasks a secure-aggregation round). A start runs every op's self-test on the
/// emulated device, which each test would otherwise repeat.
pub(super) fn emulated_server() -> TestServer {
    static SERVER: common::SharedServer = common::SharedServer::new();
    // The emulated device is slow (much slower under AddressSanitizer): a long deadline,
    // so these tests check answers, not speed.
    TestServer::shared(
        &SERVER,
        &[
            "--backend",
            "auto",
            "--emulate-device",
            "--dp-allow-client-seed",
            "--job-timeout",
            "600s",
        ],
    )
}

/// The same request on the emulated device (`backend: gpu`) and on the CPU: both 200,
/// `x-backend` saying where each ran (`emulated`, not `cuda`: the emulated device is not
/// an NVIDIA GPU); returns (device, cpu) bodies.
pub(super) async fn both(s: &TestServer, path: &str, body: Value) -> (Value, Value) {
    let mut out = Vec::new();
    for (backend, ran_on) in [("gpu", "emulated"), ("cpu", "cpu")] {
        let mut b = body.clone();
        b["backend"] = json!(backend);
        let res = s.post(path, b).send().await.unwrap();
        assert_eq!(res.status(), 200, "{path} on {backend}");
        assert_eq!(res.headers()["x-backend"], ran_on, "{path}");
        out.push(res.json::<Value>().await.unwrap());
    }
    let cpu = out.pop().unwrap();
    (out.pop().unwrap(), cpu)
}

/// A nested JSON array's numbers in row-major order.
pub(super) fn flat(v: &Value) -> Vec<f64> {
    let mut out = Vec::new();
    let mut stack = vec![v.clone()];
    while let Some(x) = stack.pop() {
        match x {
            Value::Array(items) => stack.extend(items.into_iter().rev()),
            x => out.push(x.as_f64().unwrap()),
        }
    }
    out
}

pub(super) fn strings(field: Field, n: usize, seed: u64) -> Vec<String> {
    random_elements(field, n, seed)
        .iter()
        .map(|x| x.to_string())
        .collect()
}

#[tokio::test]
async fn device_reports_the_emulated_device() {
    let s = emulated_server();
    let device: Value = s.get("/device").await.json().await.unwrap();
    assert_eq!(device["backend"], "emulated", "{device}");
    assert_eq!(device["gpus"][0]["emulated"], true, "{device}");
    // Neither runtime compiler ran: the kernels are built into the binary.
    assert_eq!(device["gpus"][0]["nvrtc_version"], "", "{device}");
    assert_eq!(device["gpus"][0]["hiprtc_version"], "", "{device}");
    assert!(
        device["reason"].as_str().unwrap().contains("emulated"),
        "{device}"
    );
}

#[tokio::test]
async fn field_ops_ntt_and_msm_on_the_emulated_device_equal_the_cpu() {
    let s = emulated_server();
    // 9 000 elements: more than the emulated device's 32 × 256 threads, so every
    // grid-stride loop wraps.
    for field in Field::ALL {
        let (a, b) = (strings(field, 9000, 1), strings(field, 9000, 2));
        for op in ["field_add", "field_sub", "field_mul"] {
            let (dev, cpu) = both(
                &s,
                &format!("/zk/{op}"),
                json!({"field": field.name(), "a": a, "b": b}),
            )
            .await;
            assert_eq!(dev, cpu, "{op} {field:?}");
        }
        let (dev, cpu) = both(
            &s,
            "/zk/field_pow",
            json!({"field": field.name(), "base": a[..500], "exponent": strings(Field::Bn254Fr, 500, 3)}),
        )
        .await;
        assert_eq!(dev, cpu, "field_pow {field:?}");
        let nonzero: Vec<&String> = a.iter().filter(|x| *x != "0").collect();
        let (dev, cpu) = both(
            &s,
            "/zk/field_inv",
            json!({"field": field.name(), "values": nonzero}),
        )
        .await;
        assert_eq!(dev, cpu, "field_inv {field:?}");
        // 2^11 × 2: past the BN254 tile into the stages; a coset, bit-reversed output.
        let values = strings(field, 4096, 4);
        for path in ["/zk/ntt", "/zk/intt"] {
            let (dev, cpu) = both(
                &s,
                path,
                json!({"field": field.name(), "values": values, "batch": 2,
                       "coset_shift": ["3"], "output_order": "bit_reversed"}),
            )
            .await;
            assert_eq!(dev, cpu, "{path} {field:?}");
        }
    }
    for curve in [Curve::Bn254G1, Curve::Bls12_381G1] {
        let points = random_points(curve, 700, 5);
        let json_points: Vec<Value> = (0..points.len())
            .map(|i| {
                let (x, y) = points.coordinates(i).expect("random points are finite");
                json!({"x": x.to_string(), "y": y.to_string()})
            })
            .collect();
        let (dev, cpu) = both(
            &s,
            "/zk/msm",
            json!({"curve": curve.name(), "points": json_points,
                   "scalars": strings(curve.scalar_field(), 700, 6)}),
        )
        .await;
        assert_eq!(dev, cpu, "msm {curve:?}");
    }
}

#[tokio::test]
async fn dp_releases_on_the_emulated_device_equal_the_cpu_bit_for_bit() {
    let s = emulated_server();
    let rows: Vec<Vec<f64>> = (0..6)
        .map(|r| {
            (0..3000)
                .map(|c| ((r * 3000 + c) as f64 * 0.37).sin() * (1.0 + r as f64))
                .collect()
        })
        .collect();
    let (dev, cpu) = both(
        &s,
        "/dp/privatize",
        json!({"per_example_gradients": rows, "clip_norm": 20.0, "noise_multiplier": 1.1, "seed": 9}),
    )
    .await;
    assert_eq!(dev, cpu, "privatize");
    let values: Vec<f64> = (0..9000).map(|i| (i as f64).sqrt()).collect();
    let (dev, cpu) = both(
        &s,
        "/dp/gaussian",
        json!({"values": values, "sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-6, "seed": 4}),
    )
    .await;
    assert_eq!(dev, cpu, "gaussian");
    let (dev, cpu) = both(
        &s,
        "/dp/laplace",
        json!({"values": values, "sensitivity": 1.0, "epsilon": 0.5, "seed": 4}),
    )
    .await;
    assert_eq!(dev, cpu, "laplace");
}

/// Numbers within the RF features' stated tolerances (0.1 Hz for frequencies, 1e-3
/// otherwise, or 1e-6 relative); everything else equal.
fn assert_close(dev: &Value, cpu: &Value, at: &str) {
    match (dev, cpu) {
        (Value::Object(a), Value::Object(b)) => {
            assert_eq!(a.len(), b.len(), "{at}");
            for (k, v) in a {
                assert_close(v, &b[k], &format!("{at}/{k}"));
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{at}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_close(x, y, &format!("{at}/{i}"));
            }
        }
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            let tol = if at.contains("_hz") { 0.1 } else { 1e-3 };
            let d = (a - b).abs();
            assert!(d <= tol || d <= 1e-6 * b.abs(), "{at}: {a} vs {b}");
        }
        _ => assert_eq!(dev, cpu, "{at}"),
    }
}

#[tokio::test]
async fn rf_features_and_dataset_jobs_run_on_the_emulated_device() {
    use gpu_ops::ops::rf::generate::generate;
    use gpu_ops::ops::rf::rng::dataset_key;
    use gpu_ops::ops::rf::scenario::Scenario;
    let s = emulated_server();
    let scenario = Scenario::default();
    let sample = generate(&scenario, dataset_key(8), 0);
    let bytes: Vec<u8> = sample.iq[0]
        .iter()
        .flat_map(|c| c.re.to_le_bytes().into_iter().chain(c.im.to_le_bytes()))
        .collect();
    let (dev, cpu) = both(
        &s,
        "/rf/features",
        json!({"sample_rate_hz": scenario.signal.sample_rate_hz, "encoding": "base64",
               "iq": B64.encode(&bytes), "chunk_ms": 150.0, "per_chunk": true}),
    )
    .await;
    assert_close(&dev, &cpu, "");

    // A dataset job: its batches on the device, the first checked against the CPU.
    let res = s
        .post("/datasets/synthetic", common::small_dataset(3, 6))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut state = Value::Null;
    for _ in 0..6000 {
        state = s
            .get(&format!("/datasets/{id}"))
            .await
            .json()
            .await
            .unwrap();
        if state["status"] != "queued" && state["status"] != "running" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(state["status"], "completed", "{state}");
    assert!(
        s.metric("gpu_ops_dataset_batches_total{backend=\"emulated\"}")
            .await
            >= 1.0,
        "the dataset ran on the device"
    );
    assert_eq!(
        s.metric("gpu_ops_fallbacks_total").await,
        0.0,
        "no fallback"
    );
}

/// `POST /rf/iq` on the emulated device (`rf_waveform`, `rf_receive`): the same truth as
/// the CPU's and every recording within 1e-5 of the CPU recording's RMS.
#[tokio::test]
async fn rf_iq_recordings_on_the_emulated_device_match_the_cpu() {
    let s = emulated_server();
    let request = json!({"seed": 5, "sample_index": 2, "config": {
        "signal": {"duration_ms": 60}, "chunk_ms": 60,
        "geometry": {"receivers_min": 3, "receivers_max": 3}}});
    let (dev, cpu) = both(&s, "/rf/iq", request).await;
    assert_eq!(dev["transmitter"], cpu["transmitter"]);
    let floats = |v: &Value| -> Vec<f32> {
        B64.decode(v.as_str().unwrap())
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    let (d_rx, c_rx) = (
        dev["receivers"].as_array().unwrap(),
        cpu["receivers"].as_array().unwrap(),
    );
    assert_eq!(d_rx.len(), 3);
    for (r, (d, c)) in d_rx.iter().zip(c_rx).enumerate() {
        assert_eq!(d["truth"], c["truth"], "receiver {r}");
        let (d, c) = (floats(&d["iq"]), floats(&c["iq"]));
        assert_eq!(d.len(), 2 * 12_000, "receiver {r}");
        let rms =
            (c.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / (c.len() / 2) as f64).sqrt();
        for (i, (a, b)) in d.chunks(2).zip(c.chunks(2)).enumerate() {
            let err = (f64::from(a[0] - b[0]).powi(2) + f64::from(a[1] - b[1]).powi(2)).sqrt();
            assert!(err <= 1e-5 * rms, "receiver {r} sample {i}: {a:?} vs {b:?}");
        }
    }
}

/// Matmul through the emulated device's kernel, across its 64 × 64 tiles: small integers,
/// so every sum is exact in f32 and the answers are equal to the bit.
#[tokio::test]
async fn matmul_runs_on_the_emulated_device() {
    let s = emulated_server();
    let matrix = |rows: usize, cols: usize, salt: usize| -> Vec<Vec<f64>> {
        (0..rows)
            .map(|i| {
                (0..cols)
                    .map(|j| ((i * 7 + j * 3 + salt) % 11) as f64 - 5.0)
                    .collect()
            })
            .collect()
    };
    let body = json!({"a": [matrix(70, 33, 1), matrix(70, 33, 2)], "b": matrix(65, 33, 3),
                      "transpose_b": true, "c": matrix(70, 65, 4), "beta": 2, "out_dtype": "bf16"});
    let (dev, cpu) = both(&s, "/linalg/matmul", body).await;
    assert_eq!(dev["shape"], json!([2, 70, 65]));
    assert_eq!(dev["result"], cpu["result"]);
}

/// Sinusoidal embeddings through the emulated device: the host's sin and cos, so equal to
/// the CPU's to the bit.
#[tokio::test]
async fn sinusoidal_embeddings_run_on_the_emulated_device() {
    let s = emulated_server();
    let body = json!({"positions": [[0, 5, 9], [100, 2000, 30000]], "dim": 16, "layout": "split",
                      "out_dtype": "f16", "encoding": "base64"});
    let (dev, cpu) = both(&s, "/embeddings/sinusoidal", body).await;
    assert_eq!(dev["shape"], json!([2, 3, 16]));
    assert_eq!(dev, cpu);
}

/// Attention through the emulated device's fused kernel (grouped heads, a causal mask,
/// a padded sequence, weights), against the CPU within the bound docs/TENSORS.md states:
/// the two sum in different orders, so the answers agree closely, not to the bit.
#[tokio::test]
async fn attention_runs_on_the_emulated_device() {
    let s = emulated_server();
    let tensor = |heads: usize, len: usize, dim: usize, salt: usize| -> Value {
        let rows = |h: usize, b: usize| -> Vec<Vec<f64>> {
            (0..len)
                .map(|i| {
                    (0..dim)
                        .map(|j| (((i * 7 + j * 3 + h * 5 + b + salt) % 13) as f64 - 6.0) / 4.0)
                        .collect()
                })
                .collect()
        };
        json!((0..2)
            .map(|b| (0..heads).map(|h| rows(h, b)).collect::<Vec<_>>())
            .collect::<Vec<_>>())
    };
    let body = json!({"q": tensor(4, 21, 16, 1), "k": tensor(2, 40, 16, 2), "v": tensor(2, 40, 8, 3),
                      "causal": true, "key_lengths": [40, 17], "return_weights": true});
    let (dev, cpu) = both(&s, "/nn/attention", body).await;
    assert_eq!(dev["shape"], json!([2, 4, 21, 8]));
    for field in ["output", "weights"] {
        let (d, c) = (flat(&dev[field]), flat(&cpu[field]));
        assert_eq!(d.len(), c.len(), "{field}");
        for (i, (x, y)) in d.iter().zip(&c).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "{field} {i}: {x} against {y}"
            );
        }
    }
}

/// A convolution through the emulated device (im2col, the matmul kernel, bias and ReLU):
/// small integers, so every sum is exact in f32 and the answers are equal to the bit.
#[tokio::test]
async fn conv2d_runs_on_the_emulated_device() {
    let s = emulated_server();
    let grid = |a: usize, b: usize, c: usize, d: usize, salt: usize| -> Value {
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
    let body = json!({"input": grid(2, 4, 9, 10, 1), "weight": grid(6, 2, 3, 2, 2), "groups": 2,
                      "stride": [2, 1], "padding": [1, 2, 0, 1], "dilation": [1, 2],
                      "bias": [1, -2, 3, 0, 0.5, -0.5], "relu": true});
    let (dev, cpu) = both(&s, "/nn/conv2d", body).await;
    assert_eq!(dev["shape"], json!([2, 6, 5, 9]));
    assert_eq!(dev["result"], cpu["result"]);
}

/// Beam channels and a noisy sweep on the emulated device and on the CPU: the channels
/// within f64's rounding of each other's, the same best pairs, the powers within 1e-9.
#[tokio::test]
async fn beams_run_on_the_emulated_device() {
    let s = emulated_server();
    let model = json!({"batch": 6, "tx_array": {"rows": 2, "columns": 4},
                       "rx_array": {"columns": 4}, "paths": 3, "seed": 9,
                       "elevation_deg": [-20, 20]});
    let close = |a: &Value, b: &Value, tol: f64| {
        let flat = |v: &Value| -> Vec<f64> {
            let mut out = Vec::new();
            let mut stack = vec![v.clone()];
            while let Some(x) = stack.pop() {
                match x {
                    Value::Array(items) => stack.extend(items),
                    n => out.push(n.as_f64().unwrap()),
                }
            }
            out
        };
        let (a, b) = (flat(a), flat(b));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= tol * y.abs().max(1.0), "{x} against {y}");
        }
    };
    let (dev, cpu) = both(
        &s,
        "/beams/channels",
        json!({"model": model, "out_dtype": "f64"}),
    )
    .await;
    assert_eq!(dev["shape"], json!([6, 4, 8, 2]));
    close(&dev["channels"], &cpu["channels"], 1e-12);
    let body = json!({"model": model, "tx_codebook": {"oversampling": 2}, "snr_db": 10,
                      "noise_seed": 4, "return_grid": true, "out_dtype": "f64"});
    let (dev, cpu) = both(&s, "/beams/sweep", body.clone()).await;
    close(&dev["grid"], &cpu["grid"], 1e-9);
    assert_eq!(dev["best"]["rx"], cpu["best"]["rx"]);
    assert_eq!(dev["best"]["tx"], cpu["best"]["tx"]);
    let mut reduced = body;
    reduced["return_grid"] = json!(false);
    let (dev, _) = both(&s, "/beams/sweep", reduced).await;
    assert_eq!(dev["best"]["rx"], cpu["best"]["rx"]);
    assert_eq!(dev["best"]["tx"], cpu["best"]["tx"]);
}

/// A resident table's lookups on the emulated device equal the CPU's; the device keeps
/// the table after its first lookup there and drops it with the table.
#[tokio::test]
async fn embedding_lookups_keep_their_table_on_the_emulated_device() {
    let s = emulated_server();
    let rows: Vec<Vec<f64>> = (0..40)
        .map(|r| (0..12).map(|c| (r * 12 + c) as f64 / 8.0 - 30.0).collect())
        .collect();
    let res = s
        .post("/embeddings/tables", json!({"table": rows}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let t: Value = res.json().await.unwrap();
    let id = t["id"].as_str().unwrap();
    assert_eq!(t["resident_on"], json!([]));
    let ids: Vec<Vec<u32>> = (0..3)
        .map(|b| (0..50).map(|i| (b * 17 + i * 7) % 40).collect())
        .collect();
    let (dev, cpu) = both(
        &s,
        &format!("/embeddings/tables/{id}/lookup"),
        json!({"ids": ids, "out_dtype": "f16"}),
    )
    .await;
    assert_eq!(dev["shape"], json!([3, 50, 12]));
    assert_eq!(dev["result"], cpu["result"]);
    let got: Value = s
        .get(&format!("/embeddings/tables/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(got["resident_on"], json!([0]));
    assert_eq!(
        s.delete(&format!("/embeddings/tables/{id}"))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    let gpus = s.state.backends.gpus();
    // The table's device copy, kept under its array's key, went with it.
    assert!(!gpus[0].holds_table(&gpu_ops::arrays::device_key(id)));
}

#[tokio::test]
async fn shamir_sharing_runs_on_the_emulated_device() {
    let s = emulated_server();
    for field in Field::ALL {
        // Seeded (a test server), so both backends evaluate the same polynomials.
        let (dev, cpu) = both(
            &s,
            "/mpc/shamir/split",
            json!({"field": field.name(), "secrets": strings(field, 9000, 7), "threshold": 3,
                   "share_count": 5, "seed": 11}),
        )
        .await;
        assert_eq!(dev, cpu, "split {field:?}");
        let shares = &dev["shares"];
        let (dev, cpu) = both(
            &s,
            "/mpc/shamir/combine",
            json!({"field": field.name(), "threshold": 3, "shares": shares}),
        )
        .await;
        assert_eq!(dev, cpu, "combine {field:?}");
        assert_eq!(dev["secrets"], json!(strings(field, 9000, 7)));
        assert_eq!(dev["shares_checked"], 2);
    }
    let split: Value = s
        .post(
            "/mpc/shamir/split",
            json!({"field": "bn254_fr", "secrets": strings(Field::Bn254Fr, 300, 8), "threshold": 2,
                   "share_count": 2, "commitments": true}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (dev, cpu) = both(
        &s,
        "/mpc/shamir/verify",
        json!({"field": "bn254_fr", "share": split["shares"][1], "commitments": split["commitments"]["rows"]}),
    )
    .await;
    assert_eq!(dev, cpu);
    assert_eq!(dev["valid"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secure_aggregation_unmasks_on_the_emulated_device() {
    use gpu_ops::secagg_client::{participate, Connection, Coordinator};
    let s = emulated_server();
    let mut conn = Connection::new(&s.url);
    conn.poll = std::time::Duration::from_millis(20);
    let len = 5000;
    let c = Coordinator::create(
        &conn,
        &json!({"clients": 3, "threshold": 2, "vector_length": len, "clip": 4.0, "scale_bits": 8,
               "backend": "cuda"}),
    )
    .await
    .unwrap();
    let inputs: Vec<Vec<f32>> = (0..3)
        .map(|k| {
            (0..len)
                .map(|i| ((i * (k + 3)) % 1000) as f32 / 256.0 - 2.0)
                .collect()
        })
        .collect();
    let clients: Vec<_> = inputs
        .iter()
        .map(|v| {
            let (conn, round, v) = (conn.clone(), c.round.clone(), v.clone());
            tokio::spawn(async move { participate(&conn, &round, &v, None).await.unwrap() })
        })
        .collect();
    for h in clients {
        h.await.unwrap();
    }
    let result = c.result().await.unwrap();
    let sum: Vec<f64> = serde_json::from_value(result["sum"].clone()).unwrap();
    for (i, got) in sum.iter().enumerate() {
        // The values are multiples of 2^-8: quantising is exact.
        let want: f64 = inputs.iter().map(|v| f64::from(v[i])).sum();
        assert_eq!(*got, want, "value {i}");
    }
    let on_device = r#"gpu_ops_jobs_total{backend="emulated",op="secagg_unmask",outcome="ok"}"#;
    assert_eq!(
        s.metric(on_device).await,
        1.0,
        "the unmasking ran on the device"
    );
}

#[tokio::test]
async fn ciphertext_sums_run_on_the_emulated_device() {
    use fhe::bfv::{Encoding, Plaintext, PublicKey, SecretKey};
    use fhe_traits::{FheEncoder, FheEncrypter, Serialize};
    let s = emulated_server();
    let set = gpu_ops::ops::he::ParameterSet::Bfv128N8192;
    let par = set.parameters();
    let mut rng = rand::rng();
    let pk = PublicKey::new(&SecretKey::random(&par, &mut rng), &mut rng);
    let cts: Vec<String> = (0..3u64)
        .map(|k| {
            let v: Vec<u64> = (0..8192u64).map(|i| (i * 31 + k) % 65537).collect();
            let pt = Plaintext::try_encode(&v, Encoding::simd(), &par).unwrap();
            B64.encode(pk.try_encrypt(&pt, &mut rng).unwrap().to_bytes())
        })
        .collect();
    for weights in [None, Some(vec![3u64, 65536, 1])] {
        let mut body = json!({"parameters": set.name(), "ciphertexts": cts});
        if let Some(w) = &weights {
            body["weights"] = json!(w);
        }
        let (dev, cpu) = both(&s, "/he/aggregate", body).await;
        assert_eq!(dev, cpu, "weights {weights:?}");
    }
}
