//! `/nn/attention`: fused scaled dot-product attention on the CPU or the device.

use crate::api::array_operands::ArrayScope;
use crate::api::arrays::ArrayView;
use crate::api::dense_tensors::{
    Dense4Doc, Dense4OutDoc, DenseIn, DenseOut, DenseValues, TensorDtype,
};
use crate::api::extract::ObjectOnly;
use crate::api::kept_results::{self, Keep};
use crate::api::linalg::{gflops_per_second, operand, MAX_MATMUL_FLOPS};
use crate::api::openapi::Binary;
use crate::api::problem::{ErrorCode, Problem};
use crate::api::{
    blocking, blocking_if, bulk, job_timeout, json_body, AnswerForm, ApiBody, AppState,
};
use crate::backend::BackendChoice;
use crate::ops::linalg::Dtype;
use crate::ops::nn::{AttentionJob, AttentionShape, Tensors, MAX_HEAD_DIM};
use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// The most weights one request may ask for (B·H·S·S_kv): 2^22, 16 MiB of f32. Weights
/// are what the fused path never holds, so only small shapes return them.
pub const MAX_ATTENTION_WEIGHTS: usize = 1 << 22;

/// `softmax(scale·Q·Kᵀ + mask)·V` per batch entry and head.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "q": [[[[1, 0], [0, 1]]]],
    "k": [[[[1, 0], [0, 1], [1, 1]]]],
    "v": [[[[1, 2], [3, 4], [5, 6]]]],
    "causal": true
}))]
pub struct AttentionRequest {
    /// Queries `[B, H, S, D]`, D at most 256. At most --max-tensor-elements values.
    #[schema(value_type = Dense4Doc)]
    pub q: DenseIn,
    /// Keys `[B, H_kv, S_kv, D]`; H_kv divides H, and query head h reads key/value head
    /// h / (H / H_kv) (grouped-query attention; H_kv = H is plain multi-head).
    #[schema(value_type = Dense4Doc)]
    pub k: DenseIn,
    /// Values `[B, H_kv, S_kv, D_v]`, D_v at most 256.
    #[schema(value_type = Dense4Doc)]
    pub v: DenseIn,
    /// Query i sees key j only if j ≤ i + L_b − S (L_b: the sequence's key length),
    /// aligned to the bottom right: the last query sees every key.
    #[serde(default)]
    #[schema(default = false)]
    pub causal: bool,
    /// Keys per sequence (B of them, each at most S_kv): keys from L_b on are padding,
    /// never attended. A query that sees no key gets zeros. Default: S_kv each.
    #[schema(min_items = 1)]
    pub key_lengths: Option<Vec<usize>>,
    /// Multiplies the logits. Default 1/√D. 0, or a normal f32 in magnitude unless the
    /// inputs are f64. max(1, |scale|)·D·max|q|·max|k| and S_kv·max|v| must stay below
    /// an eighth of the compute type's largest value.
    pub scale: Option<f64>,
    /// Also answer the weights `[B, H, S, S_kv]` (at most 2^22 of them).
    #[serde(default)]
    #[schema(default = false)]
    pub return_weights: bool,
    /// The inputs' dtype. Packed inputs state theirs, and all must agree; nested JSON
    /// numbers are rounded to it. Default: packed `q`'s dtype, else f32.
    pub dtype: Option<TensorDtype>,
    /// Default: the inputs' dtype. f64 inputs answer in f64 (on the CPU).
    pub out_dtype: Option<TensorDtype>,
    #[serde(default)]
    pub backend: BackendChoice,
    /// Keep the output (not the weights) as a resident tensor (`kept` in the answer), for
    /// the next op to name as `{"array": id}`.
    #[schema(value_type = Option<Keep>)]
    pub keep: Option<ObjectOnly<Keep>>,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct AttentionResponse {
    /// `[B, H, S, D_v]`, in the form of `q` (nested numbers, also for a
    /// resident `q`, or packed in `dtype`);
    /// absent when `keep.with_data` was false.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Dense4OutDoc>)]
    pub output: Option<DenseOut>,
    pub shape: Vec<usize>,
    /// `[B, H, S, S_kv]`, rows summing to 1 (0 for a query that sees no key); only with
    /// `return_weights`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Dense4OutDoc>)]
    pub weights: Option<DenseOut>,
    pub dtype: TensorDtype,
    /// 2·B·H·S·S_kv·(D + D_v), as if nothing were masked.
    pub flops: f64,
    /// `flops` over the compute time (`x-compute-time-ms`).
    pub gflops_per_second: f64,
    /// The resident tensor the output was kept as, when the request asked to `keep` it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<ArrayView>,
}

#[utoipa::path(
    post, path = "/nn/attention", tag = "nn", operation_id = "attention",
    summary = "Scaled dot-product attention",
    description = "softmax(scale·Q·Kᵀ + mask)·V with grouped heads, an optional causal mask and \
        per-sequence key lengths, fused (tiled, online softmax: no S × S_kv matrix is held) on both \
        backends. Inputs f16, bf16, f32 (f64 on the CPU), rounded to their dtype; every sum in f32 \
        (f64 for f64). Error bound and mask: docs/TENSORS.md.",
    request_body(content((AttentionRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The attention output", body = AttentionResponse),
        (status = 413, description = "An input or the output over --max-tensor-elements, more than 2^40 \
            flops, or more than 2^22 weights"),
        (status = 422, description = "invalid_tensor (rank, ragged, non-finite, base64, shapes that do not \
            agree, heads that do not divide, a head dimension over 256), invalid_parameter (dtype, scale, \
            key_lengths, logits or weighted sums that could overflow, backend gpu with f64), result_not_finite (the output \
            overflows out_dtype)"),
        (status = 503, description = "queue_full, shutting_down, device_unavailable (backend gpu without a device)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn attention(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<AttentionRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let device_keys = [
        req.q.resolve(&arrays, "/q")?,
        req.k.resolve(&arrays, "/k")?,
        req.v.resolve(&arrays, "/v")?,
    ];
    let keep = kept_results::plan(req.keep.take().map(|k| k.0), &state, &arrays)?;
    let max = state.settings.config.max_tensor_elements;
    let backend = req.backend;
    let packed = req.q.answers_packed();
    let job = blocking(move || Ok(build_job(req, max)?.with_device_keys(device_keys))).await?;
    let (shape, out_dtype) = (job.shape, job.output);
    let done = state.pool.submit(job, backend, timeout).await?;
    if let Some(i) = done.output.output.first_non_finite() {
        return Err(Problem::at(
            ErrorCode::ResultNotFinite,
            "/out_dtype",
            format!(
                "value {i} of the output (row-major) overflows {}",
                out_dtype.name()
            ),
        ));
    }
    let dtype = TensorDtype::from(out_dtype);
    let s = shape;
    let out_shape = vec![s.batch, s.heads, s.queries, s.value_dim];
    let weights_shape = vec![s.batch, s.heads, s.queries, s.keys];
    let rate = gflops_per_second(s.flops(), done.run.compute_time);
    let keeping = keep.is_some();
    let encode = move || {
        let (output, weights) = (done.output.output, done.output.weights);
        let (output, kept) = kept_results::keep_tensor(keep, out_dtype, &out_shape, output)?;
        let body = AttentionResponse {
            output: output.map(|o| DenseOut::new(out_shape.clone(), o, dtype, packed)),
            shape: out_shape,
            weights: weights.map(|w| DenseOut::new(weights_shape, w, dtype, packed)),
            dtype,
            flops: s.flops(),
            gflops_per_second: rate,
            kept,
        };
        let hint = [&body.output, &body.weights]
            .iter()
            .filter_map(|t| t.as_ref().map(DenseOut::json_bytes_hint))
            .sum();
        bulk::answer(form, &body, |b| json_body(b, hint), &done.run)
    };
    // Keeping writes the tensor's files: never on the runtime's threads.
    blocking_if(keeping, encode).await
}

fn mismatch(path: &str, message: String) -> Problem {
    Problem::at(ErrorCode::InvalidTensor, path, message)
}

/// The shape, from the inputs' shapes (each rank 4).
fn shape_of(q: &DenseValues, k: &DenseValues, v: &DenseValues) -> Result<AttentionShape, Problem> {
    let (&[b, h, s, d], &[kb, hk, sk, kd], &[vb, vh, vs, dv]) =
        (&q.shape[..], &k.shape[..], &v.shape[..])
    else {
        unreachable!("decode checked the ranks")
    };
    if kb != b {
        return Err(mismatch(
            "/k/shape",
            format!("batch of {kb} where q has {b}"),
        ));
    }
    if kd != d {
        return Err(mismatch(
            "/k/shape",
            format!("head dimension {kd} where q has {d}"),
        ));
    }
    if hk == 0 || h % hk != 0 {
        return Err(mismatch(
            "/k/shape",
            format!("{hk} key/value heads do not divide the {h} query heads"),
        ));
    }
    for (path, dim) in [("/q/shape", d), ("/v/shape", dv)] {
        if dim > MAX_HEAD_DIM {
            return Err(mismatch(
                path,
                format!("head dimension {dim}; at most {MAX_HEAD_DIM}"),
            ));
        }
    }
    if (vb, vh, vs) != (kb, hk, sk) {
        return Err(mismatch(
            "/v/shape",
            format!("[{vb}, {vh}, {vs}, …] where k is [{kb}, {hk}, {sk}, …]"),
        ));
    }
    Ok(AttentionShape {
        batch: b,
        heads: h,
        kv_heads: hk,
        queries: s,
        keys: sk,
        head_dim: d,
        value_dim: dv,
    })
}

/// Decodes the inputs and checks everything the job needs (on a blocking thread: the
/// inputs may be large).
fn build_job(req: AttentionRequest, max: usize) -> Result<AttentionJob, Problem> {
    let dtype = req
        .dtype
        .or(req.q.packed_dtype())
        .unwrap_or(TensorDtype::F32);
    let q = operand(req.q, "/q", dtype, 4..=4, max)?;
    let k = operand(req.k, "/k", dtype, 4..=4, max)?;
    let v = operand(req.v, "/v", dtype, 4..=4, max)?;
    let shape = shape_of(&q, &k, &v)?;
    let too_large =
        |path: &str, message: String| Err(Problem::at(ErrorCode::PayloadTooLarge, path, message));
    if shape.out_len() > max {
        return too_large(
            "/v/shape",
            format!(
                "the output would hold {} values; the server answers at most {max} (--max-tensor-elements)",
                shape.out_len()
            ),
        );
    }
    if shape.flops() > MAX_MATMUL_FLOPS {
        return too_large(
            "/k/shape",
            format!(
                "{:e} flops; the server takes at most 2^40 per request",
                shape.flops()
            ),
        );
    }
    if req.return_weights && shape.weights_len() > MAX_ATTENTION_WEIGHTS {
        return too_large(
            "/return_weights",
            format!(
                "{} weights; the server returns at most 2^22 (the fused path holds none)",
                shape.weights_len()
            ),
        );
    }
    let input = Dtype::from(dtype);
    let output = req.out_dtype.map_or(input, Dtype::from);
    let tensors = if input == Dtype::F64 {
        Tensors::F64 {
            q: q.values.into_f64(),
            k: k.values.into_f64(),
            v: v.values.into_f64(),
        }
    } else {
        Tensors::F32 {
            q: q.values.into_f32(),
            k: k.values.into_f32(),
            v: v.values.into_f32(),
        }
    };
    let scale = req.scale.unwrap_or(1.0 / (shape.head_dim as f64).sqrt());
    Ok(AttentionJob::new(
        shape,
        tensors,
        scale,
        req.causal,
        req.key_lengths,
        input,
        output,
        req.return_weights,
    )?)
}
