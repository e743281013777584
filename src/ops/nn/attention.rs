//! Scaled dot-product attention: the job, its fused CPU twin, and the tolerance a device's
//! answer is held to.
//!
//! `O[b, h, i] = Σ_j softmax_j(scale · Q[b, h, i] · K[b, g, j]) · V[b, g, j]` with
//! `g = h / (H / H_kv)` (grouped heads). Query `i` of sequence `b` sees the keys
//! `j < end(b, i)`: `L_b` (its key length) without a causal mask, and with one
//! `min(L_b, i + L_b − S + 1)`, the mask aligned to the bottom right as in decoding with
//! a key cache (the last query sees every key; `S = L_b` is the usual lower triangle).
//! A query that sees no key gets zeros, and weights of zero.
//!
//! The CPU twin never holds more than a 64 × 128 block of scores per task: it walks key
//! blocks with an online softmax (running max and sum, rescaling the partial output),
//! the block products on the `gemm` crate, tasks (batch, head, query block) over rayon.

use super::gpu;
use super::real::Real;
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::ops::invalid::{FieldPath, Invalid};
use crate::ops::linalg::{Dtype, Values};
use rayon::prelude::*;

/// The largest head dimension (of queries and keys, or of values): what the device
/// kernel's tiles hold, as in FlashAttention.
pub const MAX_HEAD_DIM: usize = 256;

/// Query rows and key columns of one CPU block.
const CPU_QUERY_BLOCK: usize = 64;
const CPU_KEY_BLOCK: usize = 128;

/// The fewest keys one step of either backend takes (the device's smallest key tile):
/// it bounds how often a partial output is rescaled, which the tolerance counts.
const SMALLEST_KEY_BLOCK: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// S: queries per sequence.
    pub queries: usize,
    /// S_kv: keys per sequence.
    pub keys: usize,
    /// D: of queries and keys.
    pub head_dim: usize,
    /// D_v: of values and outputs.
    pub value_dim: usize,
}

impl AttentionShape {
    pub fn q_len(&self) -> usize {
        self.batch * self.heads * self.queries * self.head_dim
    }

    pub fn k_len(&self) -> usize {
        self.batch * self.kv_heads * self.keys * self.head_dim
    }

    pub fn v_len(&self) -> usize {
        self.batch * self.kv_heads * self.keys * self.value_dim
    }

    pub fn out_len(&self) -> usize {
        self.batch * self.heads * self.queries * self.value_dim
    }

    /// Query rows over the batch and heads.
    pub fn rows(&self) -> usize {
        self.batch * self.heads * self.queries
    }

    pub fn weights_len(&self) -> usize {
        self.rows() * self.keys
    }

    /// Device bytes of one sequence (all its heads) in the f32 launcher's pass: Q, K, V,
    /// the output, the log-sum-exps, the key length, and the weights when asked.
    pub fn device_bytes_per_sequence(&self, weights: bool) -> usize {
        let per_q = self.heads * self.queries;
        let per_kv = self.kv_heads * self.keys;
        let w = if weights { per_q * self.keys } else { 0 };
        4 * (per_q * (self.head_dim + self.value_dim + 1)
            + per_kv * (self.head_dim + self.value_dim)
            + w)
            + 4
    }

    /// 2·B·H·S·S_kv·(D + D_v): the two products, as if nothing were masked.
    pub fn flops(&self) -> f64 {
        2.0 * self.weights_len() as f64 * (self.head_dim + self.value_dim) as f64
    }

    /// The key/value head that query head `h` reads.
    pub fn kv_head(&self, h: usize) -> usize {
        h / (self.heads / self.kv_heads)
    }
}

/// Q, K and V: f32 (already rounded to the input dtype) or f64.
#[derive(Clone, Debug)]
pub enum Tensors {
    F32 {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
    },
    F64 {
        q: Vec<f64>,
        k: Vec<f64>,
        v: Vec<f64>,
    },
}

/// The output `[B, H, S, D_v]` and, when asked, the weights `[B, H, S, S_kv]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Attended {
    pub output: Values,
    pub weights: Option<Values>,
}

#[derive(Clone, Debug)]
pub struct AttentionJob {
    pub shape: AttentionShape,
    pub tensors: Tensors,
    pub scale: f64,
    pub causal: bool,
    /// L_b per sequence, each at most S_kv.
    pub key_lengths: Vec<usize>,
    pub input: Dtype,
    pub output: Dtype,
    pub weights: bool,
    /// Q, K and V's keys in a device's cache when they are resident arrays' (with the
    /// input dtype, which fixes their rounded values): uploaded once per device, kept
    /// between jobs (`with_device_keys`).
    pub device_keys: [Option<String>; 3],
}

impl AttentionJob {
    /// Checks the shape, the lengths, the scale and that no logit can overflow. Paths are
    /// the request's: `q`, `k`, `v`, `key_lengths`, `scale`, `out_dtype`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shape: AttentionShape,
        tensors: Tensors,
        scale: f64,
        causal: bool,
        key_lengths: Option<Vec<usize>>,
        input: Dtype,
        output: Dtype,
        weights: bool,
    ) -> Result<Self, Invalid> {
        let root = FieldPath::root();
        let s = shape;
        if s.kv_heads == 0 || s.heads % s.kv_heads != 0 {
            return Err(Invalid::new(
                root.field("k"),
                format!(
                    "{} key/value heads do not divide {} query heads",
                    s.kv_heads, s.heads
                ),
            ));
        }
        for (name, dim) in [("q", s.head_dim), ("v", s.value_dim)] {
            if dim > MAX_HEAD_DIM {
                return Err(Invalid::new(
                    root.field(name),
                    format!("head dimension {dim}; at most {MAX_HEAD_DIM}"),
                ));
            }
        }
        let (q, k, v) = match &tensors {
            Tensors::F32 { q, k, v } => (q.len(), k.len(), v.len()),
            Tensors::F64 { q, k, v } => (q.len(), k.len(), v.len()),
        };
        for (name, got, want) in [
            ("q", q, s.q_len()),
            ("k", k, s.k_len()),
            ("v", v, s.v_len()),
        ] {
            if got != want {
                return Err(Invalid::new(
                    root.field(name),
                    format!("{got} values where the shape needs {want}"),
                ));
            }
        }
        let key_lengths = match key_lengths {
            None => vec![s.keys; s.batch],
            Some(lengths) => {
                if lengths.len() != s.batch {
                    return Err(Invalid::new(
                        root.field("key_lengths"),
                        format!("{} lengths for a batch of {}", lengths.len(), s.batch),
                    ));
                }
                if let Some(i) = lengths.iter().position(|&l| l > s.keys) {
                    return Err(Invalid::new(
                        root.field("key_lengths").index(i),
                        format!("{} keys, but the sequences have {}", lengths[i], s.keys),
                    ));
                }
                lengths
            }
        };
        let wide = input == Dtype::F64;
        if wide != (output == Dtype::F64) {
            return Err(Invalid::new(
                root.field("out_dtype"),
                "f64 inputs answer in f64; other inputs in f32, f16 or bf16",
            ));
        }
        // f32 work scales in f32: the scale must be 0 or a normal f32.
        let normal = wide
            || scale == 0.0
            || (f64::from(f32::MIN_POSITIVE)..=f64::from(f32::MAX)).contains(&scale.abs());
        if !scale.is_finite() || !normal {
            return Err(Invalid::new(
                root.field("scale"),
                "must be finite, and 0 or a normal f32 (1.2e-38 to 3.4e38 in magnitude) unless the inputs are f64",
            ));
        }
        let (q_max, k_max, v_max) = match &tensors {
            Tensors::F32 { q, k, v } => (max_abs(q), max_abs(k), max_abs(v)),
            Tensors::F64 { q, k, v } => (max_abs(q), max_abs(k), max_abs(v)),
        };
        let largest = if wide { f64::MAX } else { f64::from(f32::MAX) };
        let kind = if wide { "f64" } else { "f32" };
        // Both backends sum q·k before scaling, then scale: the dot itself and the
        // logit are each at most max(1, |scale|)·D·max|q|·max|k|, kept far enough below
        // the largest value that no logit, partial sum or difference of two overflows.
        let logit_bound = scale.abs().max(1.0) * s.head_dim as f64 * q_max * k_max;
        if logit_bound > largest / 8.0 {
            return Err(Invalid::new(
                root.field("q"),
                format!("max(1, |scale|)·D·max|q|·max|k| = {logit_bound:e}: logits could overflow {kind}"),
            ));
        }
        // The partial output sums up to S_kv weights of at most 1 times |v| before the
        // final division.
        let value_bound = s.keys as f64 * v_max;
        if value_bound > largest / 8.0 {
            return Err(Invalid::new(
                root.field("v"),
                format!(
                    "S_kv·max|v| = {value_bound:e}: the running weighted sum could overflow {kind}"
                ),
            ));
        }
        Ok(Self {
            shape,
            tensors,
            scale,
            causal,
            key_lengths,
            input,
            output,
            weights,
            device_keys: Default::default(),
        })
    }

    /// Marks Q, K and V (those `Some`) as resident arrays' (`arrays::device_key`): a
    /// device keeps each one's upload, when one pass reads it whole, and a later job over
    /// the same array (a model's keys and values, say) uploads only the rest. The key
    /// names the input dtype, as matmul's name the compute precision; each launcher adds
    /// the form it uploads. f64 attention runs on the CPU.
    pub fn with_device_keys(mut self, keys: [Option<String>; 3]) -> Self {
        let dtype = self.input.name();
        self.device_keys = keys.map(|k| k.map(|k| format!("{k}/{dtype}")));
        self
    }

    /// How many keys query `i` of sequence `b` sees (a prefix of the keys).
    pub fn visible_keys(&self, b: usize, i: usize) -> usize {
        visible_keys(self.key_lengths[b], i, self.shape.queries, self.causal)
    }

    /// The fused CPU twin, then the output dtype's rounding.
    pub fn run_cpu(&self) -> Attended {
        match &self.tensors {
            Tensors::F32 { q, k, v } => {
                let (mut out, lse) = self.fused(q, k, v);
                let mut weights = self.weights.then(|| self.weights_from(q, k, &lse));
                if self.output != Dtype::F32 {
                    let output = self.output;
                    let round = |x: &mut f32| *x = output.round(*x);
                    out.par_iter_mut().with_min_len(1 << 14).for_each(round);
                    if let Some(w) = &mut weights {
                        w.par_iter_mut().with_min_len(1 << 14).for_each(round);
                    }
                }
                Attended {
                    output: Values::F32(out.into()),
                    weights: weights.map(|w| Values::F32(w.into())),
                }
            }
            Tensors::F64 { q, k, v } => {
                let (out, lse) = self.fused(q, k, v);
                let weights = self.weights.then(|| self.weights_from(q, k, &lse));
                Attended {
                    output: Values::F64(out),
                    weights: weights.map(Values::F64),
                }
            }
        }
    }

    /// The output and each row's log-sum-exp of its visible logits (−∞ where it sees
    /// none), one task per (batch, head, query block).
    fn fused<T: Real>(&self, q: &[T], k: &[T], v: &[T]) -> (Vec<T>, Vec<T>) {
        let s = self.shape;
        let (d, dv) = (s.head_dim, s.value_dim);
        let mut out = vec![T::ZERO; s.out_len()];
        let mut lse = vec![T::NEG_INFINITY; s.rows()];
        let scale = T::from_f64(self.scale);
        // Tasks are cut per (batch, head) first so that a query block never straddles
        // two heads; each owns its slice of the output and of the log-sum-exps.
        let tasks: Vec<_> = out
            .chunks_mut(s.queries * dv)
            .zip(lse.chunks_mut(s.queries))
            .enumerate()
            .flat_map(|(bh, (out, lse))| {
                out.chunks_mut(CPU_QUERY_BLOCK * dv)
                    .zip(lse.chunks_mut(CPU_QUERY_BLOCK))
                    .enumerate()
                    .map(move |(qb, (out, lse))| (bh, qb * CPU_QUERY_BLOCK, out, lse))
            })
            .collect();
        tasks.into_par_iter().for_each(|(bh, first, out, lse)| {
            let (b, h) = (bh / s.heads, bh % s.heads);
            let g = b * s.kv_heads + s.kv_head(h);
            let rows = lse.len();
            let q = &q[(bh * s.queries + first) * d..][..rows * d];
            let k = &k[g * s.keys * d..][..s.keys * d];
            let v = &v[g * s.keys * dv..][..s.keys * dv];
            let ends: Vec<usize> = (0..rows).map(|r| self.visible_keys(b, first + r)).collect();
            online_softmax_block(q, k, v, (d, dv), scale, &ends, out, lse);
        });
        (out, lse)
    }

    /// The weights `exp(scale·q·k − lse)` over the visible keys, zero elsewhere.
    fn weights_from<T: Real>(&self, q: &[T], k: &[T], lse: &[T]) -> Vec<T> {
        let s = self.shape;
        let d = s.head_dim;
        let scale = T::from_f64(self.scale);
        let mut w = vec![T::ZERO; s.weights_len()];
        w.par_chunks_mut(s.queries * s.keys)
            .enumerate()
            .for_each(|(bh, w)| {
                let (b, h) = (bh / s.heads, bh % s.heads);
                let g = b * s.kv_heads + s.kv_head(h);
                let q = &q[bh * s.queries * d..][..s.queries * d];
                let k = &k[g * s.keys * d..][..s.keys * d];
                block_logits(q, k, d, scale, s.queries, s.keys, w, false);
                for (i, row) in w.chunks_mut(s.keys).enumerate() {
                    let end = self.visible_keys(b, i);
                    let lse = lse[bh * s.queries + i];
                    for (j, x) in row.iter_mut().enumerate() {
                        *x = if j < end { (*x - lse).exp() } else { T::ZERO };
                    }
                }
            });
        w
    }

    /// Per output value (and per weight), a bound on |backend − exact| for each of two
    /// backends, so on their difference. From the exact softmax `p` of the rounded inputs:
    /// the logits' rounding `E_i` (dot products of D terms, the scale) perturbs `p` by a
    /// factor within `e^{±2E_i}`; the exponentials, up to one rescale per key block, the
    /// sums of S_kv terms and the division add `n·u` relative to `Σ_j p_ij·|v_j|`; then
    /// each side rounds once to the output dtype, so the two may sit a whole unit in the
    /// last place apart: 2·u_out of the value (a value near a rounding boundary of bf16
    /// went one way on each side; `gpu-ops check`'s fresh seeds found it, 2026-11-27).
    /// Where the tensor cores' kernel may run (`tensor_cores::kernel_for`), its own
    /// rounding is allowed for: f32 sums at twice f32's unit roundoff (tensor cores
    /// align and may truncate rather than round: Fasi et al., 2021), and P rounded to the
    /// input dtype before P·V, `u_in` relative to `Σ_j p_ij·|v_j|`, plus half the dtype's
    /// smallest subnormal step per visible key where a weight underflows.
    /// Computed in f64 a block of 64 rows at a time, the block's logits, their
    /// magnitudes and the weighted values as products (`bound.rs`), blocks in parallel.
    pub fn tolerance(&self) -> (Vec<f64>, Option<Vec<f64>>) {
        bound::tolerance(self)
    }
}

/// Keys visible to query `i` of `queries` in a sequence of `len` keys.
pub fn visible_keys(len: usize, i: usize, queries: usize, causal: bool) -> usize {
    if causal {
        (i + len + 1).saturating_sub(queries).min(len)
    } else {
        len
    }
}

fn max_abs<T: Real>(x: &[T]) -> f64 {
    x.iter().fold(0.0, |m, &x| m.max(x.to_f64().abs()))
}

mod blocks;
mod bound;
pub mod tensor_cores;
use blocks::{block_logits, online_softmax_block};
pub use tensor_cores::tensor_core_module;

impl Job for AttentionJob {
    type Output = Attended;

    fn name(&self) -> &'static str {
        "attention"
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.input.name().into()
    }

    /// Logits, as if none were masked.
    fn size(&self) -> usize {
        self.shape.weights_len()
    }

    fn input_bytes(&self) -> usize {
        let s = self.shape;
        (s.q_len() + s.k_len() + s.v_len()) * self.input.bytes()
    }

    /// At least 2^16 logits (one head of 256 × 256) go to the device on `auto`.
    fn gpu_threshold(&self) -> usize {
        1 << 16
    }

    fn device_refusal(&self) -> Option<String> {
        (self.input == Dtype::F64)
            .then(|| "f64 attention runs on the CPU only; use backend auto or cpu".into())
    }

    fn run_cpu(&self) -> Attended {
        AttentionJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Attended, DeviceError> {
        gpu::launch_attention(self, dev)
    }

    fn agrees(&self, device: &Attended, cpu: &Attended) -> Result<(), String> {
        let (out_tol, w_tol) = self.tolerance();
        super::within(&device.output, &cpu.output, &out_tol, self.output, "output")?;
        match (&device.weights, &cpu.weights, &w_tol) {
            (Some(d), Some(c), Some(t)) => super::within(d, c, t, self.output, "weight"),
            (None, None, _) => Ok(()),
            _ => Err("one side returned weights, the other not".into()),
        }
    }
}
