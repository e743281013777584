//! `/zk/*`: prime-field vector operations.

use super::array_operands::ArrayScope;
use super::arrays::ArrayView;
use super::elements::{Elements, ElementsDoc, ElementsOut, ElementsOutDoc, Encoding};
use super::extract::ObjectOnly;
use super::kept_results::{self, Keep, KeepPlan};
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::{blocking_if, bulk, job_timeout, AnswerForm, ApiBody, AppState};
use crate::backend::BackendChoice;
use crate::ops::zk::held::{FieldStep, KeptFieldJob};
use crate::ops::zk::ntt::{Direction, NttJob, Order};
use crate::ops::zk::FieldVec;
use crate::ops::zk::{Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob};
use crate::pool::Completed;
use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

pub(super) mod steps;
use steps::{answer_step, devices_may_hold, Step};

/// `a (op) b` element-wise over one prime field.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"field": "goldilocks", "a": ["1", "2", "0xffffffff00000000"], "b": ["5"]}))]
pub struct FieldBinaryRequest {
    pub field: Field,
    /// Left operands.
    #[schema(value_type = ElementsDoc)]
    pub a: Elements,
    /// Right operands: as many as `a`, or one to apply to every element of `a`.
    #[schema(value_type = ElementsDoc)]
    pub b: Elements,
    /// How `a` and `b` are written, and how `result` will be.
    #[serde(default)]
    pub encoding: Encoding,
    /// Force a backend; `auto` picks by input size and device health.
    #[serde(default)]
    pub backend: BackendChoice,
    /// Keep the result as a resident array (`kept` in the answer), for the next op to
    /// name as `{"array": id}`.
    #[schema(value_type = Option<Keep>)]
    pub keep: Option<ObjectOnly<Keep>>,
    /// A deadline shorter than the server's `--job-timeout`, in milliseconds.
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
#[schema(example = json!({"field": "goldilocks", "encoding": "decimal", "length": 3, "result": ["6", "7", "4294967300"]}))]
pub struct FieldVectorResponse {
    pub field: Field,
    pub encoding: Encoding,
    pub length: usize,
    /// Canonical results, in `encoding`; absent when `keep.with_data` was false.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<ElementsOutDoc>)]
    pub result: Option<ElementsOut>,
    /// The resident array the result was kept as, when the request asked to `keep` it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<ArrayView>,
}

impl FieldVectorResponse {
    /// What `Serialize` writes, with the vector written straight into a buffer sized up
    /// front (`ElementsOut::write_json`).
    fn to_json(&self) -> Vec<u8> {
        let hint = self.result.as_ref().map_or(0, ElementsOut::json_size_hint);
        let mut out = Vec::with_capacity(512 + hint);
        let field = serde_json::to_string(&self.field).expect("an enum");
        let encoding = serde_json::to_string(&self.encoding).expect("an enum");
        out.extend_from_slice(
            format!(
                "{{\"field\":{field},\"encoding\":{encoding},\"length\":{}",
                self.length
            )
            .as_bytes(),
        );
        if let Some(result) = &self.result {
            out.extend_from_slice(b",\"result\":");
            result.write_json(&mut out);
        }
        if let Some(kept) = &self.kept {
            out.extend_from_slice(b",\"kept\":");
            serde_json::to_writer(&mut out, kept).expect("a view serializes");
        }
        out.push(b'}');
        out
    }
}

macro_rules! field_route {
    ($fn:ident, $op:expr, $path:literal, $summary:literal) => {
        #[utoipa::path(
            post, path = $path, tag = "zk", operation_id = stringify!($fn), summary = $summary,
            description = "Element-wise over two equal-length vectors, or a length-1 `b` broadcast over `a`. \
                Elements are canonical integers (< p). Bit-identical on the CPU and CUDA backends.",
            request_body(content((FieldBinaryRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
            responses(
                (status = 200, description = "The result vector", body = FieldVectorResponse),
                (status = 410, description = "array_lost: an operand names a result held only on a device, which lost it"),
                (status = 413, description = "Body or vector too large"),
                (status = 422, description = "Invalid input: invalid_request, invalid_field_element, length_mismatch, invalid_parameter"),
            ),
            security((), ("bearer" = []))
        )]
        pub async fn $fn(
            State(state): State<Arc<AppState>>,
            form: AnswerForm,
            arrays: ArrayScope,
            ApiBody(req): ApiBody<FieldBinaryRequest>,
        ) -> Result<Response, Problem> {
            field_binary(state, $op, req, form, arrays).await
        }
    };
}

field_route!(field_add, FieldOp::Add, "/zk/field_add", "a + b mod p");
field_route!(field_sub, FieldOp::Sub, "/zk/field_sub", "a - b mod p");
field_route!(field_mul, FieldOp::Mul, "/zk/field_mul", "a * b mod p");

/// Decoding above this many elements runs on a blocking thread.
const INLINE_ELEMENTS: usize = 16 * 1024;

async fn field_binary(
    state: Arc<AppState>,
    op: FieldOp,
    mut req: FieldBinaryRequest,
    form: AnswerForm,
    arrays: ArrayScope,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let keep = kept_results::plan(req.keep.take().map(|k| k.0), &state, &arrays)?;
    let (field, encoding, backend) = (req.field, req.encoding, req.backend);
    let max = state.settings.config.max_elements;
    let large = req.a.approx_len() > INLINE_ELEMENTS;
    let named = [req.a.array_id(), req.b.array_id()].map(|id| id.map(str::to_string));
    if (keep.is_some() || named.iter().any(Option::is_some)) && devices_may_hold(&state, backend) {
        let step = Step {
            scope: arrays.clone(),
            named: named.to_vec(),
            paths: &["/a", "/b"],
        };
        let key = keep.as_ref().and_then(KeepPlan::device_key);
        let build = move || -> Result<KeptFieldJob, Problem> {
            let a = req.a.decode_source(field, encoding, "/a", max, &arrays)?;
            let b = req.b.decode_source(field, encoding, "/b", max, &arrays)?;
            Ok(KeptFieldJob::binary(op, a, b, key)?)
        };
        let job = blocking_if(large, build).await?;
        let done = state.pool.submit(job, backend, timeout).await?;
        return answer_step(done, (field, encoding), large, form, keep, step).await;
    }
    let build = move || -> Result<FieldBinaryJob, Problem> {
        let a = req.a.decode(field, encoding, "/a", max, &arrays)?;
        let b = req.b.decode(field, encoding, "/b", max, &arrays)?;
        Ok(FieldBinaryJob::new(op, a, b)?)
    };
    let job = blocking_if(large, build).await?;
    let done = state.pool.submit_batched(job, backend, timeout).await?;
    answer(done, (field, encoding), large, form, keep).await
}

/// `base[i] ^ exponent[i]` over one prime field.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"field": "bn254_fr", "base": ["2", "3"], "exponent": ["10"]}))]
pub struct FieldPowRequest {
    pub field: Field,
    /// Canonical elements (< p).
    #[schema(value_type = ElementsDoc)]
    pub base: Elements,
    /// Non-negative integers below 2^256 (not reduced mod p), as many as `base` or one for
    /// all; in base64 each is 32 little-endian bytes. 0^0 = 1.
    #[schema(value_type = ElementsDoc)]
    pub exponent: Elements,
    #[serde(default)]
    pub encoding: Encoding,
    #[serde(default)]
    pub backend: BackendChoice,
    /// Keep the result as a resident array (`kept` in the answer), for the next op to
    /// name as `{"array": id}`.
    #[schema(value_type = Option<Keep>)]
    pub keep: Option<ObjectOnly<Keep>>,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

/// Element-wise inverses.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"field": "goldilocks", "values": ["2", "3"]}))]
pub struct FieldInvRequest {
    pub field: Field,
    /// Canonical, nonzero elements.
    #[schema(value_type = ElementsDoc)]
    pub values: Elements,
    #[serde(default)]
    pub encoding: Encoding,
    #[serde(default)]
    pub backend: BackendChoice,
    /// Keep the result as a resident array (`kept` in the answer), for the next op to
    /// name as `{"array": id}`.
    #[schema(value_type = Option<Keep>)]
    pub keep: Option<ObjectOnly<Keep>>,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

#[utoipa::path(
    post, path = "/zk/field_pow", tag = "zk", operation_id = "field_pow", summary = "base ^ exponent mod p",
    description = "Element-wise exponentiation by square-and-multiply over all 256 exponent bits. \
        Bit-identical on the CPU (arkworks for BN254) and CUDA backends.",
    request_body(content((FieldPowRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The result vector", body = FieldVectorResponse),
        (status = 410, description = "array_lost: an operand names a result held only on a device, which lost it"),
                (status = 413, description = "Body or vector too large"),
        (status = 422, description = "invalid_request, invalid_field_element, length_mismatch, invalid_parameter"),
    ),
    security((), ("bearer" = []))
)]
pub async fn field_pow(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<FieldPowRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let keep = kept_results::plan(req.keep.take().map(|k| k.0), &state, &arrays)?;
    let (field, encoding, backend) = (req.field, req.encoding, req.backend);
    let max = state.settings.config.max_elements;
    let large = req.base.approx_len() > INLINE_ELEMENTS;
    let named = req.base.array_id().map(str::to_string);
    if (keep.is_some() || named.is_some()) && devices_may_hold(&state, backend) {
        // The base may be held on a device and the result kept there (`KeptFieldJob`).
        let step = Step {
            scope: arrays.clone(),
            named: vec![named],
            paths: &["/base"],
        };
        let key = keep.as_ref().and_then(KeepPlan::device_key);
        let build = move || -> Result<KeptFieldJob, Problem> {
            let base = req
                .base
                .decode_source(field, encoding, "/base", max, &arrays)?;
            let exponents = req
                .exponent
                .decode_integers(encoding, "/exponent", max, &arrays)?;
            Ok(KeptFieldJob::pow(base, exponents, key)?)
        };
        let job = blocking_if(large, build).await?;
        let done = state.pool.submit(job, backend, timeout).await?;
        return answer_step(done, (field, encoding), large, form, keep, step).await;
    }
    let build = move || -> Result<FieldPowJob, Problem> {
        let base = req.base.decode(field, encoding, "/base", max, &arrays)?;
        let exponents = req
            .exponent
            .decode_integers(encoding, "/exponent", max, &arrays)?;
        FieldPowJob::new(base, exponents).map_err(Problem::from)
    };
    let job = blocking_if(large, build).await?;
    let done = state.pool.submit(job, backend, timeout).await?;
    answer(done, (field, encoding), large, form, keep).await
}

#[utoipa::path(
    post, path = "/zk/field_inv", tag = "zk", operation_id = "field_inv", summary = "1 / x mod p, batched",
    description = "Batch inversion by Montgomery's trick (prefix products, one inversion per chunk, back \
        substitution). A zero element is refused with 422 not_invertible naming its index (up to 16 listed); \
        values that name a result held on a device are inverted there, their zeros counted where they lie. \
        Bit-identical on the CPU and CUDA backends.",
    request_body(content((FieldInvRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The inverses", body = FieldVectorResponse),
        (status = 410, description = "array_lost: an operand names a result held only on a device, which lost it"),
                (status = 413, description = "Body or vector too large"),
        (status = 422, description = "invalid_request, invalid_field_element, not_invertible, length_mismatch"),
    ),
    security((), ("bearer" = []))
)]
pub async fn field_inv(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<FieldInvRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let keep = kept_results::plan(req.keep.take().map(|k| k.0), &state, &arrays)?;
    let (field, encoding, backend) = (req.field, req.encoding, req.backend);
    let max = state.settings.config.max_elements;
    let large = req.values.approx_len() > INLINE_ELEMENTS;
    let named = req.values.array_id().map(str::to_string);
    if (keep.is_some() || named.is_some()) && devices_may_hold(&state, backend) {
        // The values may be held on a device and the inverses kept there.
        let step = Step {
            scope: arrays.clone(),
            named: vec![named],
            paths: &["/values"],
        };
        let key = keep.as_ref().and_then(KeepPlan::device_key);
        let build = move || -> Result<KeptFieldJob, Problem> {
            let values = (req.values).decode_source(field, encoding, "/values", max, &arrays)?;
            Ok(KeptFieldJob::inv(values, key)?)
        };
        let job = blocking_if(large, build).await?;
        let done = state.pool.submit(job, backend, timeout).await?;
        return answer_step(done, (field, encoding), large, form, keep, step).await;
    }
    let build = move || -> Result<FieldInvJob, Problem> {
        let values = req
            .values
            .decode(field, encoding, "/values", max, &arrays)?;
        Ok(FieldInvJob::new(values)?)
    };
    let job = blocking_if(large, build).await?;
    let done = state.pool.submit(job, backend, timeout).await?;
    answer(done, (field, encoding), large, form, keep).await
}

/// Answers a job's field vector in `encoding`, or as a buffer in the bulk form; kept as
/// a resident array first when the request asked (`keep`).
pub(super) async fn answer(
    done: Completed<FieldVec>,
    (field, encoding): (Field, Encoding),
    large: bool,
    form: AnswerForm,
    keep: Option<KeepPlan>,
) -> Result<Response, Problem> {
    let (values, run) = (done.output, done.run);
    let length = values.len();
    let keeping = keep.is_some();
    let encode = move || {
        let (result, kept) = match keep {
            None => (Some(ElementsOut { values, encoding }), None),
            Some(plan) => {
                let with_data = plan.with_data;
                let values = Arc::new(values);
                let kept = plan.keep_elements(values.clone())?;
                // The answer's copy, only when asked for.
                let result = with_data.then(|| ElementsOut {
                    values: Arc::unwrap_or_clone(values),
                    encoding,
                });
                (result, Some(kept))
            }
        };
        let body = FieldVectorResponse {
            field,
            encoding,
            length,
            result,
            kept,
        };
        bulk::answer(form, &body, |b| Ok(b.to_json()), &run)
    };
    // Keeping writes the array's files: never on the runtime's threads.
    blocking_if(large || keeping, encode).await
}

/// A batch of equal-size polynomials to transform.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"field": "goldilocks", "values": ["1", "2", "3", "4"]}))]
pub struct NttRequest {
    pub field: Field,
    /// `batch` polynomials of n = len/batch values each, one after the other; n a power
    /// of two up to 2^min(two-adicity, --max-ntt-log2).
    #[schema(value_type = ElementsDoc)]
    pub values: Elements,
    /// How many polynomials `values` holds (default 1).
    #[schema(minimum = 1)]
    pub batch: Option<usize>,
    #[serde(default)]
    pub input_order: Order,
    #[serde(default)]
    pub output_order: Order,
    /// Transform over the coset shift·⟨ω⟩ instead of ⟨ω⟩: one nonzero element, written in
    /// `encoding` (a one-element array, or base64 of one element).
    #[schema(value_type = Option<ElementsDoc>)]
    pub coset_shift: Option<Elements>,
    #[serde(default)]
    pub encoding: Encoding,
    #[serde(default)]
    pub backend: BackendChoice,
    /// Keep the result as a resident array (`kept` in the answer), for the next op to
    /// name as `{"array": id}`.
    #[schema(value_type = Option<Keep>)]
    pub keep: Option<ObjectOnly<Keep>>,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

macro_rules! ntt_route {
    ($fn:ident, $dir:expr, $path:literal, $summary:literal, $description:literal) => {
        #[utoipa::path(
            post, path = $path, tag = "zk", operation_id = stringify!($fn), summary = $summary,
            description = $description,
            request_body(content((NttRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
            responses(
                (status = 200, description = "The transformed values, batch after batch", body = FieldVectorResponse),
                (status = 410, description = "array_lost: an operand names a result held only on a device, which lost it"),
                (status = 413, description = "Body or vector too large"),
                (status = 422, description = "invalid_request, invalid_field_element, invalid_parameter (size, batch, coset)"),
            ),
            security((), ("bearer" = []))
        )]
        pub async fn $fn(
            State(state): State<Arc<AppState>>,
            form: AnswerForm,
            arrays: ArrayScope,
            ApiBody(req): ApiBody<NttRequest>,
        ) -> Result<Response, Problem> {
            transform(state, $dir, req, form, arrays).await
        }
    };
}

ntt_route!(
    ntt,
    Direction::Forward,
    "/zk/ntt",
    "Number-theoretic transform (evaluate on the domain)",
    "X_k = Σ_j x_j (s·ω^k)^j with ω = g^((p−1)/n) for the field's generator g (bn254_fr 5, bls12_381_fr 7, \
     goldilocks 7, babybear 31) and s = coset_shift (1 by default) — arkworks' radix-2 domain. \
     Bit-identical on the CPU and CUDA backends."
);
ntt_route!(
    intt,
    Direction::Inverse,
    "/zk/intt",
    "Inverse NTT (interpolate from the domain)",
    "x_j = s^(−j) n^(−1) Σ_k X_k ω^(−jk): the inverse of /zk/ntt with the same field, size, orders (swapped) \
     and coset_shift. Bit-identical on the CPU and CUDA backends."
);

async fn transform(
    state: Arc<AppState>,
    direction: Direction,
    mut req: NttRequest,
    form: AnswerForm,
    arrays: ArrayScope,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let keep = kept_results::plan(req.keep.take().map(|k| k.0), &state, &arrays)?;
    let (field, encoding, backend) = (req.field, req.encoding, req.backend);
    let max = state.settings.config.max_elements;
    let max_log2 = state.settings.config.max_ntt_log2;
    let large = req.values.approx_len() > INLINE_ELEMENTS;
    let named = vec![req.values.array_id().map(str::to_string)];
    let held = (keep.is_some() || named[0].is_some()) && devices_may_hold(&state, backend);
    let step = Step {
        scope: arrays.clone(),
        named,
        paths: &["/values"],
    };
    let key = keep.as_ref().and_then(KeepPlan::device_key);
    let build = move || -> Result<Transform, Problem> {
        let shift = match req.coset_shift {
            None => None,
            Some(s) => {
                let v = s.decode(field, encoding, "/coset_shift", 16, &arrays)?;
                if v.len() != 1 {
                    return Err(Problem::at(
                        ErrorCode::InvalidParameter,
                        "/coset_shift",
                        "give exactly one element",
                    ));
                }
                Some(v.get(0))
            }
        };
        let (batch, input_order, output_order) =
            (req.batch.unwrap_or(1), req.input_order, req.output_order);
        if held {
            let values = req
                .values
                .decode_source(field, encoding, "/values", max, &arrays)?;
            let step = FieldStep::Ntt {
                direction,
                batch,
                input_order,
                output_order,
                coset_shift: shift,
            };
            return Ok(Transform::Kept(KeptFieldJob::ntt(
                values, step, max_log2, key,
            )?));
        }
        let values = req
            .values
            .decode(field, encoding, "/values", max, &arrays)?;
        let job = NttJob::new(
            direction,
            values,
            batch,
            input_order,
            output_order,
            shift,
            max_log2,
        )?;
        Ok(Transform::Plain(job))
    };
    match blocking_if(large, build).await? {
        Transform::Kept(job) => {
            let done = state.pool.submit(job, backend, timeout).await?;
            answer_step(done, (field, encoding), large, form, keep, step).await
        }
        Transform::Plain(job) => {
            let done = state.pool.submit(job, backend, timeout).await?;
            answer(done, (field, encoding), large, form, keep).await
        }
    }
}

/// An NTT request's job: one that may read or leave values on a device, or the plain one.
enum Transform {
    Kept(KeptFieldJob),
    Plain(NttJob),
}

/// The zk domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "zk",
    description: "Zero-knowledge primitives: prime-field vector ops",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(field_add))
        .routes(routes!(field_sub))
        .routes(routes!(field_mul))
        .routes(routes!(field_pow))
        .routes(routes!(field_inv))
        .routes(routes!(ntt))
        .routes(routes!(intt))
        .routes(routes!(super::msm::msm))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::zk::U256;

    #[test]
    fn the_written_answer_is_what_serde_writes() {
        for encoding in [Encoding::Decimal, Encoding::Hex, Encoding::Base64] {
            let values =
                FieldVec::from_integers(Field::BabyBear, &[U256::from_u64(3), U256::ZERO]).unwrap();
            let kept = || ArrayView {
                id: "arr_1".into(),
                name: Some("a \"name\"".into()),
                kind: crate::arrays::ArrayKind::FieldElements,
                field: Some(Field::BabyBear),
                curve: None,
                dtype: None,
                shape: None,
                length: 2,
                size_bytes: 8,
                created_at: "2026-12-03T00:00:00Z".into(),
                expires_at: Some("2026-12-04T00:00:00.000Z".into()),
                role: None,
                held: vec!["host", "disk"],
                data_url: "/arrays/arr_1/data".into(),
            };
            // Without keep; kept with the values; kept without them.
            for (with_values, keep) in [(true, false), (true, true), (false, true)] {
                let body = FieldVectorResponse {
                    field: Field::BabyBear,
                    encoding,
                    length: values.len(),
                    result: with_values.then(|| ElementsOut {
                        values: values.clone(),
                        encoding,
                    }),
                    kept: keep.then(kept),
                };
                assert_eq!(
                    String::from_utf8(body.to_json()).unwrap(),
                    serde_json::to_string(&body).unwrap()
                );
            }
        }
    }
}
