//! Request bodies for the operations `gpu-ops bench` knows by name, from a shape. Tensors
//! go packed (base64 f32), as a client that cares about speed sends them; values are a
//! fixed pseudo-random sequence in [−1, 1), so runs are comparable.

use base64::Engine;
use serde_json::{json, Value};

/// An operation the bench can build bodies for: its name, route, and what its shape is.
pub struct KnownOp {
    pub name: &'static str,
    pub path: &'static str,
    pub shape: &'static str,
}

pub const KNOWN_OPS: &[KnownOp] = &[
    KnownOp {
        name: "matmul",
        path: "/linalg/matmul",
        shape: "M,N,K or B,M,N,K",
    },
    KnownOp {
        name: "attention",
        path: "/nn/attention",
        shape: "B,H,S,D",
    },
    KnownOp {
        name: "conv2d",
        path: "/nn/conv2d",
        shape: "N,C,H,W,O,KH,KW",
    },
    KnownOp {
        name: "embeddings_sinusoidal",
        path: "/embeddings/sinusoidal",
        shape: "P,DIM",
    },
    KnownOp {
        name: "beam_channels",
        path: "/beams/channels",
        shape: "B,N_T,N_R",
    },
    KnownOp {
        name: "beam_sweep",
        path: "/beams/sweep",
        shape: "B,N_T,N_R",
    },
    KnownOp {
        name: "field_add",
        path: "/zk/field_add",
        shape: "N (Goldilocks)",
    },
    KnownOp {
        name: "ntt",
        path: "/zk/ntt",
        shape: "N, a power of two (Goldilocks)",
    },
];

fn packed(shape: &[usize], salt: u64) -> Value {
    let n: usize = shape.iter().product();
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ salt;
    let mut bytes = Vec::with_capacity(4 * n);
    for _ in 0..n {
        // xorshift64*: fast, and the same values every run.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let u = (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32;
        bytes.extend_from_slice(&(2.0 * u - 1.0).to_le_bytes());
    }
    json!({"encoding": "base64", "dtype": "f32", "shape": shape,
           "data": base64::engine::general_purpose::STANDARD.encode(bytes)})
}

fn dims(shape: &[usize], want: &[usize], op: &KnownOp) -> Result<(), String> {
    if want.contains(&shape.len()) && shape.iter().all(|&d| d > 0) {
        Ok(())
    } else {
        Err(format!(
            "{}: the shape is {} (positive integers)",
            op.name, op.shape
        ))
    }
}

/// The operation's route and a body of `shape`, with `backend`.
pub fn body(name: &str, shape: &[usize], backend: &str) -> Result<(&'static str, Value), String> {
    let op = KNOWN_OPS.iter().find(|o| o.name == name).ok_or_else(|| {
        let names: Vec<&str> = KNOWN_OPS.iter().map(|o| o.name).collect();
        format!(
            "unknown op {name:?}: one of {}, or give --path and --body",
            names.join(", ")
        )
    })?;
    let mut body = match name {
        "matmul" => {
            dims(shape, &[3, 4], op)?;
            let (b, m, n, k) = match shape {
                [m, n, k] => (None, *m, *n, *k),
                [b, m, n, k] => (Some(*b), *m, *n, *k),
                _ => unreachable!(),
            };
            let with_batch = |r: usize, c: usize| match b {
                Some(b) => vec![b, r, c],
                None => vec![r, c],
            };
            json!({"a": packed(&with_batch(m, k), 1), "b": packed(&with_batch(k, n), 2)})
        }
        "attention" => {
            dims(shape, &[4], op)?;
            json!({"q": packed(shape, 1), "k": packed(shape, 2), "v": packed(shape, 3)})
        }
        "conv2d" => {
            dims(shape, &[7], op)?;
            let (input, weight) = (&shape[..4], [shape[4], shape[1], shape[5], shape[6]]);
            json!({"input": packed(input, 1), "weight": packed(&weight, 2)})
        }
        "embeddings_sinusoidal" => {
            dims(shape, &[2], op)?;
            json!({"num_positions": shape[0], "dim": shape[1], "encoding": "base64"})
        }
        "beam_channels" | "beam_sweep" => {
            dims(shape, &[3], op)?;
            let model = json!({"batch": shape[0], "tx_array": {"columns": shape[1]},
                               "rx_array": {"columns": shape[2]}, "seed": 1});
            json!({"model": model, "encoding": "base64"})
        }
        "field_add" | "ntt" => {
            dims(shape, &[1], op)?;
            let values: Vec<String> = (0..shape[0])
                .map(|i| (i * 7919 % 1_000_003).to_string())
                .collect();
            if name == "ntt" {
                json!({"field": "goldilocks", "values": values})
            } else {
                json!({"field": "goldilocks", "a": values, "b": values})
            }
        }
        _ => unreachable!("every known op has a body"),
    };
    body["backend"] = json!(backend);
    Ok((op.path, body))
}
