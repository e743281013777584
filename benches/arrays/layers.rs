//! A model server's stack of layers over HTTP, each layer's output sent back to the client
//! and up again as the next layer's input, against the same stack with the outputs kept
//! (`keep`, `with_data: false`; on a device they stay there, not downloaded until read):
//! three products `x·W1·W2·W3` (tokens × hidden, bf16, packed) and two 3 × 3
//! convolutions (NCHW, bf16, packed). The weights are resident arrays in both, so what
//! differs is the activations' round trips alone.
//! Env: BENCH_LAYERS_TOKENS (default 4096), BENCH_LAYERS_HIDDEN (default 1024),
//! BENCH_LAYERS_IMAGES (default 32), BENCH_LAYERS_CHANNELS (default 64),
//! BENCH_LAYERS_SIDE (default 56: ResNet-50's first stage).

use super::common::{env, ms};
use super::{post, timed};
use serde_json::{json, Value};

/// bf16 values in [−0.5, 0.5) as base64, from a counter hash (no two layers alike).
fn packed_bf16(len: usize, seed: u64) -> String {
    let bytes: Vec<u8> = (0..len as u64)
        .flat_map(|i| {
            let h = (i ^ (seed << 40))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(17);
            let x = (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            ((x.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect();
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn packed(shape: &[usize], seed: u64) -> Value {
    let len = shape.iter().product();
    json!({"dtype": "bf16", "shape": shape, "encoding": "base64", "data": packed_bf16(len, seed)})
}

fn body(v: Value) -> bytes::Bytes {
    bytes::Bytes::from(serde_json::to_vec(&v).unwrap())
}

/// A resident tensor of `shape`; its id.
async fn resident(client: &reqwest::Client, url: &str, shape: &[usize], seed: u64) -> String {
    let res = client
        .post(format!("{url}/arrays"))
        .header("content-type", "application/json")
        .body(body(
            json!({"kind": "tensor", "tensor": packed(shape, seed), "ttl_seconds": 600}),
        ))
        .send()
        .await
        .unwrap();
    let status = res.status();
    let made: Value = res.json().await.unwrap();
    assert_eq!(status, 201, "POST /arrays: {made}");
    made["id"].as_str().unwrap().to_string()
}

/// One layer's request: `input` (a packed tensor, or `{"array": id}`) with `weights`,
/// its output kept on the server when `keep`, else answered packed.
type Layer = dyn Fn(Value, &str, bool) -> Value;

/// `first` through `layers` in turn, each output sent back and up, or kept (the last one
/// then read packed, `GET /arrays/{id}/data?encoding=base64`, as a client reads a kept
/// result); the last output, packed.
async fn stack(
    client: &reqwest::Client,
    (url, op): (&str, &str),
    first: &Value,
    layers: &[Box<Layer>],
    keep: bool,
) -> Value {
    let mut input = first.clone();
    let mut kept = Vec::new();
    for layer in layers {
        let request = body(layer(input, super::backend(), keep));
        let answer = post(client, &format!("{url}{op}"), "application/json", request).await;
        if !keep {
            input = answer["result"].clone();
            continue;
        }
        if super::backend() == "gpu" {
            // On a device the output stayed there: it was not read back.
            assert_eq!(answer["kept"]["held"], json!(["device"]), "{answer}");
        }
        let id = answer["kept"]["id"].as_str().unwrap().to_string();
        input = json!({"array": id});
        kept.push(id);
    }
    if let Some(last) = kept.last() {
        let read = client
            .get(format!("{url}/arrays/{last}/data?encoding=base64"))
            .send()
            .await
            .unwrap();
        let status = read.status();
        let data: Value = read.json().await.unwrap();
        assert_eq!(status, 200, "GET /arrays/{last}/data: {data}");
        input = data["tensor"].clone();
    }
    for id in kept {
        let _ = client.delete(format!("{url}/arrays/{id}")).send().await;
    }
    input
}

/// The stack of `layers` at `op` from `first`, sent and kept, timed.
async fn compare(
    client: &reqwest::Client,
    at: (&str, &str),
    first: Value,
    layers: Vec<Box<Layer>>,
) {
    let runs = env("BENCH_RUNS", 5);
    let (t_sent, want) = timed(runs, || stack(client, at, &first, &layers, false)).await;
    let (t_kept, got) = timed(runs, || stack(client, at, &first, &layers, true)).await;
    assert_eq!(got["shape"], want["shape"], "the same shape");
    // The same kernels on both sides, but a kept product runs as one pass and a sent one
    // in the launcher's passes: a library may sum in another order.
    let bits = match got["data"] == want["data"] {
        true => "the same bits",
        false => "answers that differ in the last bits",
    };
    println!("Both stacks gave {bits}.\n");
    println!("| stack | median | sent / this (above 1: this is faster) |");
    println!("|---|---|---|");
    println!("| every output sent back and up | {} | 1.00 |", ms(t_sent));
    println!(
        "| outputs kept (`keep`, `with_data: false`) | {} | {:.2} |",
        ms(t_kept),
        t_sent.as_secs_f64() / t_kept.as_secs_f64()
    );
}

pub async fn run(client: &reqwest::Client, url: &str) {
    let (tokens, hidden) = (
        env("BENCH_LAYERS_TOKENS", 4096),
        env("BENCH_LAYERS_HIDDEN", 1024),
    );
    println!("\n## Three products, x ({tokens} × {hidden}) · W1 · W2 · W3 ({hidden} × {hidden} each), bf16, resident weights\n");
    let mut layers: Vec<Box<Layer>> = Vec::new();
    for seed in 1..=3 {
        let w = resident(client, url, &[hidden, hidden], seed).await;
        layers.push(Box::new(move |a, on, keep| {
            let mut r = json!({"a": a, "b": {"array": w}, "dtype": "bf16", "backend": on});
            if keep {
                r["keep"] = json!({"ttl_seconds": 60, "with_data": false});
            }
            r
        }));
    }
    compare(
        client,
        (url, "/linalg/matmul"),
        packed(&[tokens, hidden], 9),
        layers,
    )
    .await;

    let (images, channels, side) = (
        env("BENCH_LAYERS_IMAGES", 32),
        env("BENCH_LAYERS_CHANNELS", 64),
        env("BENCH_LAYERS_SIDE", 56),
    );
    println!("\n## Two 3 × 3 convolutions, {images} × {channels} × {side} × {side} (NCHW, padding 1, ReLU), bf16, resident weights\n");
    let mut layers: Vec<Box<Layer>> = Vec::new();
    for seed in 4..=5 {
        let w = resident(client, url, &[channels, channels, 3, 3], seed).await;
        layers.push(Box::new(move |input, on, keep| {
            let mut r = json!({"input": input, "weight": {"array": w}, "padding": [1, 1],
                               "relu": true, "dtype": "bf16", "backend": on});
            if keep {
                r["keep"] = json!({"ttl_seconds": 60, "with_data": false});
            }
            r
        }));
    }
    let first = packed(&[images, channels, side, side], 10);
    compare(client, (url, "/nn/conv2d"), first, layers).await;
}
