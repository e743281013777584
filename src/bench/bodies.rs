//! Request bodies for the operations `gpu-ops bench` knows by name, from a shape, in the
//! wire form asked for (`--wire`): nested JSON numbers and decimal strings, base64 inside
//! JSON (the default: as a client that cares about speed sent them before the bulk form),
//! or the bulk form (docs/WIRE.md) with its answer asked for in it too. Values are a fixed
//! pseudo-random sequence in [−1, 1) (field elements: small integers), so runs and forms
//! are comparable.

use crate::wire::{self, EnvelopeWriter};
use base64::Engine;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

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
    KnownOp {
        name: "msm",
        path: "/zk/msm",
        shape: "N (BN254 G1)",
    },
    KnownOp {
        name: "dp_privatize",
        path: "/dp/privatize",
        shape: "N,D (examples, parameters)",
    },
];

/// How a body's bulk fields travel (`--wire`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Wire {
    /// Nested JSON numbers, decimal strings; JSON answers.
    Json,
    /// Base64 strings inside JSON; JSON answers, tensors packed.
    Base64,
    /// `application/vnd.gpu-ops.bulk` both ways.
    Binary,
}

/// A body ready to send: its bytes, media type, and the answer form it asks for.
#[derive(Clone, Debug)]
pub struct Rendered {
    pub bytes: Vec<u8>,
    pub content_type: &'static str,
    pub accept: Option<&'static str>,
}

/// How the JSON forms write a bulk field.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// f32 values: nested numbers, or `{encoding, dtype, shape, data}`.
    Tensor,
    /// Field elements of 8 (Goldilocks) or 32 (BN254) bytes: decimal strings, or one
    /// base64 string with `"encoding": "base64"`.
    Elements { width: usize },
    /// BN254 G1 affine points, x then y in 4 words each: `{x, y}` decimal strings, or one
    /// base64 string with `"encoding": "base64"`.
    Points,
}

/// A bulk field of a body: its top-level name and little-endian values.
struct Field {
    name: &'static str,
    kind: Kind,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

/// A body before its wire form: the plain fields, the bulk ones, and whether the op's
/// `encoding` field chooses its answer's form (the tensor ops without one answer in the
/// form of their first operand).
struct Built {
    header: Value,
    fields: Vec<Field>,
    answer_encoding: bool,
}

impl Built {
    fn render(self, wire: Wire) -> Result<Rendered, String> {
        let mut header = self.header;
        let elements = self.fields.iter().any(|f| f.kind != Kind::Tensor);
        if wire != Wire::Json && (self.answer_encoding || elements) {
            header["encoding"] = json!("base64");
        }
        if wire == Wire::Binary {
            let mut writer = EnvelopeWriter::new();
            for f in self.fields {
                let dtype = match f.kind {
                    Kind::Tensor => wire::Dtype::F32,
                    Kind::Elements { width: 32 } => wire::Dtype::U256,
                    Kind::Elements { .. } | Kind::Points => wire::Dtype::U64,
                };
                let shape = f.shape.iter().map(|&d| d as u64).collect();
                let r = writer.push(dtype, shape, bytes::Bytes::from(f.bytes));
                header[f.name] = serde_json::to_value(r).map_err(|e| e.to_string())?;
            }
            return Ok(Rendered {
                bytes: writer.finish_to_vec(&header).map_err(|e| e.to_string())?,
                content_type: wire::MEDIA_TYPE,
                accept: Some(wire::MEDIA_TYPE),
            });
        }
        for f in self.fields {
            header[f.name] = match (f.kind, wire) {
                (Kind::Tensor, Wire::Json) => nested(&f.shape, &f32_values(&f.bytes)),
                (Kind::Tensor, _) => json!({"encoding": "base64", "dtype": "f32",
                                            "shape": f.shape, "data": B64.encode(&f.bytes)}),
                (Kind::Elements { width }, Wire::Json) => {
                    f.bytes.chunks_exact(width).map(decimal).collect()
                }
                (Kind::Points, Wire::Json) => f
                    .bytes
                    .chunks_exact(64)
                    .map(|p| json!({"x": decimal(&p[..32]), "y": decimal(&p[32..])}))
                    .collect(),
                (Kind::Elements { .. } | Kind::Points, _) => json!(B64.encode(&f.bytes)),
            };
        }
        Ok(Rendered {
            bytes: serde_json::to_vec(&header).map_err(|e| e.to_string())?,
            content_type: "application/json",
            accept: None,
        })
    }
}

/// A little-endian unsigned integer in decimal.
fn decimal(le: &[u8]) -> Value {
    json!(num_bigint::BigUint::from_bytes_le(le).to_string())
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

/// `values` as nested arrays of `shape`.
fn nested(shape: &[usize], values: &[f32]) -> Value {
    match shape {
        [] | [_] => values.iter().map(|&x| json!(x)).collect(),
        [_, inner @ ..] => {
            let step: usize = inner.iter().product();
            values
                .chunks(step)
                .map(|part| nested(inner, part))
                .collect()
        }
    }
}

/// `shape`'s product of f32 values in [−1, 1), the same every run for a `salt`.
fn tensor(name: &'static str, shape: &[usize], salt: u64) -> Field {
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
    Field {
        name,
        kind: Kind::Tensor,
        shape: shape.to_vec(),
        bytes,
    }
}

/// `n` Goldilocks elements below 10^6.
fn elements(name: &'static str, n: usize) -> Field {
    Field {
        name,
        kind: Kind::Elements { width: 8 },
        shape: vec![n],
        bytes: (0..n as u64)
            .flat_map(|i| (i * 7919 % 1_000_003).to_le_bytes())
            .collect(),
    }
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

/// The operation's route and a body of `shape`, with `backend`, in the `wire` form.
pub fn body(
    name: &str,
    shape: &[usize],
    backend: &str,
    wire: Wire,
) -> Result<(&'static str, Rendered), String> {
    let op = KNOWN_OPS.iter().find(|o| o.name == name).ok_or_else(|| {
        let names: Vec<&str> = KNOWN_OPS.iter().map(|o| o.name).collect();
        format!(
            "unknown op {name:?}: one of {}, or give --path and --body",
            names.join(", ")
        )
    })?;
    let mut built = match name {
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
            Built {
                header: json!({}),
                fields: vec![
                    tensor("a", &with_batch(m, k), 1),
                    tensor("b", &with_batch(k, n), 2),
                ],
                answer_encoding: false,
            }
        }
        "attention" => {
            dims(shape, &[4], op)?;
            Built {
                header: json!({}),
                fields: vec![
                    tensor("q", shape, 1),
                    tensor("k", shape, 2),
                    tensor("v", shape, 3),
                ],
                answer_encoding: false,
            }
        }
        "conv2d" => {
            dims(shape, &[7], op)?;
            let (input, weight) = (&shape[..4], [shape[4], shape[1], shape[5], shape[6]]);
            Built {
                header: json!({}),
                fields: vec![tensor("input", input, 1), tensor("weight", &weight, 2)],
                answer_encoding: false,
            }
        }
        "embeddings_sinusoidal" => {
            dims(shape, &[2], op)?;
            Built {
                header: json!({"num_positions": shape[0], "dim": shape[1]}),
                fields: vec![],
                answer_encoding: true,
            }
        }
        "beam_channels" | "beam_sweep" => {
            dims(shape, &[3], op)?;
            let model = json!({"batch": shape[0], "tx_array": {"columns": shape[1]},
                               "rx_array": {"columns": shape[2]}, "seed": 1});
            Built {
                header: json!({"model": model}),
                fields: vec![],
                answer_encoding: true,
            }
        }
        "field_add" | "ntt" => {
            dims(shape, &[1], op)?;
            let fields = if name == "ntt" {
                vec![elements("values", shape[0])]
            } else {
                vec![elements("a", shape[0]), elements("b", shape[0])]
            };
            Built {
                header: json!({"field": "goldilocks"}),
                fields,
                answer_encoding: true,
            }
        }
        "msm" => {
            dims(shape, &[1], op)?;
            use crate::ops::zk::{msm::Curve, samples, Field as Zk};
            let n = shape[0];
            let scalars = samples::random_elements(Zk::Bn254Fr, n, 1);
            let points = samples::random_points(Curve::Bn254G1, n, 2);
            Built {
                header: json!({"curve": "bn254_g1"}),
                fields: vec![
                    Field {
                        name: "scalars",
                        kind: Kind::Elements { width: 32 },
                        shape: vec![n],
                        bytes: scalars.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    },
                    Field {
                        name: "points",
                        kind: Kind::Points,
                        shape: vec![n, 2, 4],
                        bytes: points.to_le_bytes(),
                    },
                ],
                answer_encoding: true,
            }
        }
        "dp_privatize" => {
            dims(shape, &[2], op)?;
            Built {
                header: json!({"clip_norm": 1.0, "noise_multiplier": 1.0}),
                fields: vec![tensor("per_example_gradients", shape, 1)],
                answer_encoding: false,
            }
        }
        _ => unreachable!("every known op has a body"),
    };
    built.header["backend"] = json!(backend);
    Ok((op.path, built.render(wire)?))
}
