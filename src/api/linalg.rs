//! `/linalg/matmul`: batched matrix multiply on the CPU (`gemm` crate) or the device.

use super::array_operands::ArrayScope;
use super::arrays::ArrayView;
use super::dense_tensors::{DenseDoc, DenseIn, DenseOut, DenseOutDoc, DenseValues, TensorDtype};
use super::extract::ObjectOnly;
use super::kept_results::{self, Keep, KeepPlan, TensorStep};
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::zk::steps::{devices_may_hold, Step};
use super::{blocking, blocking_if, bulk, job_timeout, json_body, AnswerForm, ApiBody, AppState};
use crate::backend::BackendChoice;
use crate::ops::linalg::kept::{KeepOnDevice, KeptMatmulJob};
use crate::ops::linalg::{Compute, Dtype, MatmulJob, MatmulShape, Operands, Values};
use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

/// The most work one request may ask for: 2^40 flops (2·B·M·N·K), about 10 s on two
/// CPU cores.
pub const MAX_MATMUL_FLOPS: f64 = (1u64 << 40) as f64;

/// The precision products are formed in; sums are f32 (f64 for f64).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ComputeType {
    F32,
    Tf32,
    F16,
    Bf16,
    F64,
}

impl From<ComputeType> for Compute {
    fn from(c: ComputeType) -> Self {
        match c {
            ComputeType::F32 => Compute::F32,
            ComputeType::Tf32 => Compute::Tf32,
            ComputeType::F16 => Compute::F16,
            ComputeType::Bf16 => Compute::Bf16,
            ComputeType::F64 => Compute::F64,
        }
    }
}

fn one() -> f64 {
    1.0
}

/// `D = alpha·op(A)·op(B) + beta·C`, optionally batched.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"a": [[1, 2], [3, 4]], "b": [[5, 6], [7, 8]]}))]
pub struct MatmulRequest {
    /// `[M, K]` or `[B, M, K]` (`[K, M]` / `[B, K, M]` with `transpose_a`); a rank-2
    /// operand is broadcast over the batch. At most --max-tensor-elements values.
    #[schema(value_type = DenseDoc)]
    pub a: DenseIn,
    /// `[K, N]` or `[B, K, N]` (`[N, K]` / `[B, N, K]` with `transpose_b`).
    #[schema(value_type = DenseDoc)]
    pub b: DenseIn,
    /// `[M, N]` or `[B, M, N]`, added as `beta·C`.
    #[schema(value_type = Option<DenseDoc>)]
    pub c: Option<DenseIn>,
    #[serde(default)]
    #[schema(default = false)]
    pub transpose_a: bool,
    #[serde(default)]
    #[schema(default = false)]
    pub transpose_b: bool,
    /// 0, or from 1.2e-38 to 3.4e38 in magnitude (a normal f32) unless the operands are
    /// f64.
    #[serde(default = "one")]
    #[schema(default = 1.0)]
    pub alpha: f64,
    /// Default 1 with `c`; refused without it. The same range as `alpha`.
    pub beta: Option<f64>,
    /// The operands' dtype. Packed operands state theirs, and all must agree; nested
    /// JSON numbers are rounded to it. Default: packed `a`'s dtype, else f32.
    pub dtype: Option<TensorDtype>,
    /// Default f32, or f64 for f64 operands (which compute only in f64, on the CPU).
    pub compute: Option<ComputeType>,
    /// Default: the operands' dtype.
    pub out_dtype: Option<TensorDtype>,
    #[serde(default)]
    pub backend: BackendChoice,
    /// Keep D as a resident tensor (`kept` in the answer), for the next op to name as
    /// `{"array": id}`.
    #[schema(value_type = Option<Keep>)]
    pub keep: Option<ObjectOnly<Keep>>,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct MatmulResponse {
    /// D, `[M, N]` or `[B, M, N]` (rank 3 when any operand has a batch), in the form of
    /// `a` (nested numbers, also for a resident `a`, or packed in `dtype`); absent when
    /// `keep.with_data` was false.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<DenseOutDoc>)]
    pub result: Option<DenseOut>,
    pub shape: Vec<usize>,
    pub dtype: TensorDtype,
    pub compute: ComputeType,
    /// 2·B·M·N·K.
    pub flops: f64,
    /// `flops` over the compute time (`x-compute-time-ms`).
    pub gflops_per_second: f64,
    /// The resident tensor D was kept as, when the request asked to `keep` it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<ArrayView>,
}

/// Batch (if rank 3) and the two matrix dimensions of an operand's shape.
fn dims(shape: &[usize]) -> (Option<usize>, usize, usize) {
    match shape {
        [b, r, c] => (Some(*b), *r, *c),
        [r, c] => (None, *r, *c),
        _ => unreachable!("decode checked the rank"),
    }
}

fn mismatch(path: &str, message: String) -> Problem {
    Problem::at(ErrorCode::InvalidTensor, path, message)
}

/// The shape of the product, from the operands' shapes and the transposes.
fn shape_of(
    (trans_a, trans_b): (bool, bool),
    a: &DenseValues,
    b: &DenseValues,
    c: Option<&DenseValues>,
) -> Result<MatmulShape, Problem> {
    let (ab, ar, ac) = dims(&a.shape);
    let (bb, br, bc) = dims(&b.shape);
    let (m, k) = if trans_a { (ac, ar) } else { (ar, ac) };
    let (kb, n) = if trans_b { (bc, br) } else { (br, bc) };
    if kb != k {
        return Err(mismatch(
            "/b/shape",
            format!("op(B) has {kb} rows where op(A) has {k} columns"),
        ));
    }
    let cb = match c {
        Some(c) => {
            let (cb, cr, cc) = dims(&c.shape);
            if (cr, cc) != (m, n) {
                return Err(mismatch(
                    "/c/shape",
                    format!("C is {cr} × {cc} where the product is {m} × {n}"),
                ));
            }
            cb
        }
        None => None,
    };
    let batch = ab.or(bb).or(cb).unwrap_or(1);
    for (path, own) in [("/a/shape", ab), ("/b/shape", bb), ("/c/shape", cb)] {
        if own.is_some_and(|own| own != batch) {
            return Err(mismatch(
                path,
                format!(
                    "batch of {} where another operand has {batch}",
                    own.unwrap_or(0)
                ),
            ));
        }
    }
    Ok(MatmulShape {
        batch,
        m,
        n,
        k,
        a_batched: ab.is_some(),
        b_batched: bb.is_some(),
        c_batched: cb.is_some(),
        trans_a,
        trans_b,
    })
}

#[utoipa::path(
    post, path = "/linalg/matmul", tag = "linalg", operation_id = "matmul",
    summary = "Batched matrix multiply",
    description = "D = alpha·op(A)·op(B) + beta·C over a batch (an operand without a batch dimension is \
        broadcast). Operands f16, bf16, f32 (f64 on the CPU); products in the `compute` precision \
        (operands rounded to tf32/f16/bf16 first, as tensor cores take them) with f32 sums; D rounded to \
        `out_dtype`. Error bounds per dtype and K: docs/TENSORS.md.",
    request_body(content(
        (MatmulRequest = "application/json"),
        (inline(Binary) = "application/vnd.gpu-ops.bulk"),
    )),
    responses(
        (status = 200, description = "The product", body = MatmulResponse),
        (status = 413, description = "An operand or D over --max-tensor-elements, or more than 2^40 flops"),
        (status = 422, description = "invalid_tensor (rank, ragged, non-finite, base64, shapes that do not \
            chain), invalid_parameter (dtype, compute, beta without c, backend gpu with f64), \
            result_not_finite (D overflows out_dtype)"),
        (status = 503, description = "queue_full, shutting_down, device_unavailable (backend gpu without a device)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn matmul(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<MatmulRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let backend = req.backend;
    // A product a device holds is read there when every operand may stay on a device
    // (`KeptMatmulJob`), else read back first.
    let holding = devices_may_hold(&state, backend);
    let compute = req.compute.map_or(Compute::F32, Compute::from);
    let named = [
        req.a.array_id(),
        req.b.array_id(),
        req.c.as_ref().and_then(DenseIn::array_id),
    ];
    let resolve = |t: &mut DenseIn, path| match holding {
        true => t.resolve_where_held(&arrays, compute, path),
        false => t.resolve(&arrays, path),
    };
    // Resident operands stay on a device after their first upload there.
    let device_keys = [
        resolve(&mut req.a, "/a")?,
        resolve(&mut req.b, "/b")?,
        req.c.as_mut().map_or(Ok(None), |c| resolve(c, "/c"))?,
    ];
    let mut keep = kept_results::plan(req.keep.take().map(|k| k.0), &state, &arrays)?;
    let max = state.settings.config.max_tensor_elements;
    let packed = req.a.answers_packed();
    let held = [
        req.a.held(),
        req.b.held(),
        req.c.as_ref().and_then(DenseIn::held),
    ];
    let job = blocking(move || Ok(build_job(req, max)?.with_device_keys(device_keys))).await?;
    let (shape, flops) = (job.shape, job.shape.flops());
    let (out_dtype, compute) = (job.output, job.compute);
    let out_shape = if shape.a_batched || shape.b_batched || shape.c_batched {
        vec![shape.batch, shape.m, shape.n]
    } else {
        vec![shape.m, shape.n]
    };
    let stay = keep
        .as_ref()
        .and_then(KeepPlan::device_key)
        .filter(|_| holding);
    let done = if held.iter().any(Option::is_some) || (stay.is_some() && compute != Compute::F64) {
        let keep_on_device = stay.map(|key| KeepOnDevice {
            key,
            shape: out_shape.clone(),
        });
        let kept = KeptMatmulJob::new(job, held, keep_on_device);
        let done = state.pool.submit(kept, backend, timeout).await?;
        let step = Step {
            scope: arrays.clone(),
            named: named.to_vec(),
            paths: &["/a", "/b", "/c"],
        };
        match kept_results::settle_tensor(done, &mut keep, step).await? {
            TensorStep::Host(done) => done,
            TensorStep::Held(kept, run) => {
                let body = MatmulResponse {
                    result: None,
                    shape: out_shape,
                    dtype: TensorDtype::from(out_dtype),
                    compute: compute_type(compute),
                    flops,
                    gflops_per_second: gflops_per_second(flops, run.compute_time),
                    kept: Some(kept),
                };
                return bulk::answer(form, &body, |b| json_body(b, 256), &run);
            }
        }
    } else {
        state.pool.submit(job, backend, timeout).await?
    };
    if let Some(i) = done.output.first_non_finite() {
        return Err(Problem::at(
            ErrorCode::ResultNotFinite,
            "/out_dtype",
            format!("value {i} of D (row-major) overflows {}", out_dtype.name()),
        ));
    }
    let values = done.output;
    let dtype = TensorDtype::from(out_dtype);
    let rate = gflops_per_second(flops, done.run.compute_time);
    let keeping = keep.is_some();
    let encode = move || {
        let (values, kept) = kept_results::keep_tensor(keep, out_dtype, &out_shape, values)?;
        let body = MatmulResponse {
            result: values.map(|v| DenseOut::new(out_shape.clone(), v, dtype, packed)),
            shape: out_shape,
            dtype,
            compute: compute_type(compute),
            flops,
            gflops_per_second: rate,
            kept,
        };
        let hint = body.result.as_ref().map_or(256, DenseOut::json_bytes_hint);
        bulk::answer(form, &body, |b| json_body(b, hint), &done.run)
    };
    // Keeping writes the tensor's files: never on the runtime's threads.
    blocking_if(keeping, encode).await
}

/// Decodes the operands and checks everything the job needs (on a blocking thread: the
/// operands may be large).
/// Operands a device holds (`DenseIn::Held`) are left empty in the job
/// (`MatmulJob::checked`), for `KeptMatmulJob` to read where they are.
fn build_job(req: MatmulRequest, max: usize) -> Result<MatmulJob, Problem> {
    let held = [
        req.a.held(),
        req.b.held(),
        req.c.as_ref().and_then(DenseIn::held),
    ];
    let dtype = req
        .dtype
        .or(req.a.packed_dtype())
        .unwrap_or(TensorDtype::F32);
    let a = operand(req.a, "/a", dtype, 2..=3, max)?;
    let b = operand(req.b, "/b", dtype, 2..=3, max)?;
    let c = req
        .c
        .map(|c| operand(c, "/c", dtype, 2..=3, max))
        .transpose()?;
    let transposes = (req.transpose_a, req.transpose_b);
    let shape = shape_of(transposes, &a, &b, c.as_ref())?;
    if c.is_none() && req.beta.is_some() {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/beta",
            "beta scales c: give c, or leave beta out",
        ));
    }
    let out_len = [shape.batch, shape.m, shape.n]
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .unwrap_or(usize::MAX);
    if out_len > max {
        return Err(Problem::at(
            ErrorCode::PayloadTooLarge,
            "/b/shape",
            format!(
                "D would hold {out_len} values; the server answers at most {max} (--max-tensor-elements)"
            ),
        ));
    }
    if shape.flops() > MAX_MATMUL_FLOPS {
        return Err(Problem::at(
            ErrorCode::PayloadTooLarge,
            "/b/shape",
            format!(
                "{:e} flops; the server takes at most 2^40 per request",
                shape.flops()
            ),
        ));
    }
    let input = Dtype::from(dtype);
    let wide = input == Dtype::F64;
    let compute = req.compute.map_or(
        if wide { Compute::F64 } else { Compute::F32 },
        Compute::from,
    );
    let output = req.out_dtype.map_or(input, Dtype::from);
    let operands = if wide {
        Operands::F64 {
            a: a.values.into_f64(),
            b: b.values.into_f64(),
            c: c.map(|c| c.values.into_f64()),
        }
    } else {
        Operands::F32 {
            a: a.values.into_f32_array(),
            b: b.values.into_f32_array(),
            c: c.map(|c| c.values.into_f32_array()),
        }
    };
    let beta = req.beta.unwrap_or(1.0);
    let placeholders = held.each_ref().map(Option::is_some);
    let precision = (compute, input, output);
    if placeholders.iter().any(|&h| h) && !held.iter().flatten().all(|h| h.serves(compute)) {
        // Resolved for the compute precision the request named; its default follows dtype.
        let why =
            "a tensor held on a device is an operand only in a precision that keeps its values";
        return Err(Problem::new(ErrorCode::Internal, why));
    }
    let job = MatmulJob::checked(shape, operands, placeholders, (req.alpha, beta), precision)?;
    Ok(job)
}

/// One operand of one of `ranks`: decoded, in the request's dtype (packed ones must
/// state it), nested numbers rounded to it; f32 values for every dtype but f64.
pub(super) fn operand(
    t: DenseIn,
    path: &str,
    dtype: TensorDtype,
    ranks: std::ops::RangeInclusive<usize>,
    max: usize,
) -> Result<DenseValues, Problem> {
    if let Some(own) = t.packed_dtype().filter(|&own| own != dtype) {
        let array = match &t {
            DenseIn::Resident(r) => Some((r.dtype, r.shape.clone())),
            DenseIn::Held(h) => Some((h.dtype(), h.shape().to_vec())),
            _ => None,
        };
        if let Some((own, shape)) = array {
            return Err(Problem::at(
                ErrorCode::ArrayMismatch,
                format!("{path}/array"),
                format!(
                    "the array is a {} tensor shaped {shape:?} where the operands are {} (dtype, or a's)",
                    own.name(),
                    Dtype::from(dtype).name()
                ),
            ));
        }
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            format!("{path}/dtype"),
            format!(
                "{} where the operands are {} (dtype, or packed a's): all operands share one dtype",
                Dtype::from(own).name(),
                Dtype::from(dtype).name()
            ),
        ));
    }
    if let DenseIn::Held(h) = &t {
        // Its values stay on the device: only its shape is checked here.
        let shape = h.shape().to_vec();
        if !ranks.contains(&shape.len()) {
            return Err(Problem::at(
                ErrorCode::ArrayMismatch,
                format!("{path}/array"),
                format!(
                    "the array is shaped {shape:?}; this operand takes rank {} to {}",
                    ranks.start(),
                    ranks.end()
                ),
            ));
        }
        let values = Values::F32(Vec::new().into());
        return Ok(DenseValues {
            shape,
            values,
            packed: Some(dtype),
        });
    }
    let mut t = t.decode(path, ranks, max)?;
    let dtype = Dtype::from(dtype);
    if dtype == Dtype::F64 {
        return Ok(t);
    }
    // Packed values arrive as f32 already (exactly their dtype); JSON numbers round here.
    if let Values::F64(values) = &mut t.values {
        for (i, x) in values.iter_mut().enumerate() {
            let r = dtype.round_f64(*x);
            if !r.is_finite() {
                return Err(Problem::at(
                    ErrorCode::InvalidTensor,
                    path,
                    format!("value {i} (row-major) overflows {}", dtype.name()),
                ));
            }
            *x = r;
        }
        t.values = Values::F32(Values::F64(std::mem::take(values)).into_f32_array());
    }
    Ok(t)
}

/// `flops` over the compute time (0 where the clock saw none).
pub(super) fn gflops_per_second(flops: f64, compute: std::time::Duration) -> f64 {
    let seconds = compute.as_secs_f64();
    if seconds > 0.0 {
        flops / seconds / 1e9
    } else {
        0.0
    }
}

fn compute_type(c: Compute) -> ComputeType {
    match c {
        Compute::F32 => ComputeType::F32,
        Compute::Tf32 => ComputeType::Tf32,
        Compute::F16 => ComputeType::F16,
        Compute::Bf16 => ComputeType::Bf16,
        Compute::F64 => ComputeType::F64,
    }
}

/// The linalg domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "linalg",
    description: "Dense linear algebra: batched matrix multiply in f16, bf16, f32 and f64",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default().routes(routes!(matmul))
}
