//! `/zk/*`: prime-field vector operations.

use super::elements::{Elements, ElementsDoc, ElementsOut, Encoding};
use super::problem::{ErrorCode, Problem, ProblemDocument};
use super::{blocking, job_response, AppState};
use crate::backend::BackendChoice;
use crate::ops::zk::{Field, FieldBinaryJob, FieldOp};
use crate::pool::{Output, Work};
use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use utoipa::ToSchema;

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
    /// A deadline shorter than the server's `--job-timeout`, in milliseconds.
    #[schema(minimum = 1)]
    pub timeout_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
#[schema(example = json!({"field": "goldilocks", "encoding": "decimal", "length": 3, "result": ["6", "7", "4294967300"]}))]
pub struct FieldVectorResponse {
    pub field: Field,
    pub encoding: Encoding,
    pub length: usize,
    /// Canonical results, in `encoding`.
    #[schema(value_type = ElementsDoc)]
    pub result: ElementsOut,
}

macro_rules! field_route {
    ($fn:ident, $op:expr, $path:literal, $summary:literal) => {
        #[utoipa::path(
            post, path = $path, tag = "zk", operation_id = stringify!($fn), summary = $summary,
            description = "Element-wise over two equal-length vectors, or a length-1 `b` broadcast over `a`. \
                Elements are canonical integers (< p). Bit-identical on the CPU and CUDA backends.",
            request_body = FieldBinaryRequest,
            responses(
                (status = 200, description = "The result vector", body = FieldVectorResponse, headers(
                    ("x-backend" = String, description = "cpu or cuda"),
                    ("x-device" = Option<String>, description = "GPU ordinal, when cuda"),
                    ("x-queue-time-ms" = f64, description = "Time queued"),
                    ("x-compute-time-ms" = f64, description = "Time computing"),
                    ("x-request-id" = String, description = "Request id (echoed or generated)"))),
                (status = 400, description = "Malformed JSON", body = ProblemDocument, content_type = "application/problem+json"),
                (status = 401, description = "Missing or wrong API key", body = ProblemDocument, content_type = "application/problem+json"),
                (status = 413, description = "Body or vector too large", body = ProblemDocument, content_type = "application/problem+json"),
                (status = 415, description = "Not JSON", body = ProblemDocument, content_type = "application/problem+json"),
                (status = 422, description = "Invalid input: invalid_request, invalid_field_element, length_mismatch, invalid_parameter", body = ProblemDocument, content_type = "application/problem+json",
                    example = json!({"type": "urn:gpu-ops:problem:invalid_field_element", "title": "A field element is malformed or not canonical",
                        "status": 422, "detail": "/a/1: not a canonical goldilocks element: it must be less than the modulus 18446744069414584321",
                        "code": "invalid_field_element", "request_id": "0d9f4b52-8c1e-4c39-9d5a-3b1f0e2a7c44",
                        "errors": [{"path": "/a/1", "message": "not a canonical goldilocks element: it must be less than the modulus 18446744069414584321"}]})),
                (status = 500, description = "Internal error", body = ProblemDocument, content_type = "application/problem+json"),
                (status = 503, description = "queue_full (with Retry-After), device_unavailable, device_error, shutting_down", body = ProblemDocument, content_type = "application/problem+json"),
                (status = 504, description = "deadline_exceeded", body = ProblemDocument, content_type = "application/problem+json"),
            ),
            security((), ("bearer" = []))
        )]
        pub async fn $fn(
            State(state): State<Arc<AppState>>,
            super::ApiJson(req): super::ApiJson<FieldBinaryRequest>,
        ) -> Result<Response, Problem> {
            field_binary(state, $op, req).await
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
    req: FieldBinaryRequest,
) -> Result<Response, Problem> {
    let timeout = match req.timeout_ms {
        Some(0) => {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/timeout_ms",
                "must be at least 1",
            ))
        }
        t => t.map(Duration::from_millis),
    };
    let (field, encoding, backend) = (req.field, req.encoding, req.backend);
    let max = state.settings.config.max_elements;
    let large = req.a.approx_len() > INLINE_ELEMENTS;
    let build = move || -> Result<FieldBinaryJob, Problem> {
        let a = req.a.decode(field, encoding, "/a", max)?;
        let b = req.b.decode(field, encoding, "/b", max)?;
        FieldBinaryJob::new(op, a, b)
            .map_err(|e| Problem::at(ErrorCode::LengthMismatch, "/b", e.to_string()))
    };
    let job = if large {
        blocking(build).await?
    } else {
        build()?
    };
    let done = state
        .pool
        .submit(Work::FieldBinary(job), backend, timeout)
        .await?;
    let run = done.run;
    let Output::Field(values) = done.output else {
        return Err(Problem::new(
            ErrorCode::Internal,
            "the job returned another op's output",
        ));
    };
    let length = values.len();
    let body = FieldVectorResponse {
        field,
        encoding,
        length,
        result: ElementsOut { values, encoding },
    };
    let encode = move || {
        serde_json::to_vec(&body).map_err(|e| Problem::new(ErrorCode::Internal, e.to_string()))
    };
    let bytes = if large {
        blocking(encode).await?
    } else {
        encode()?
    };
    Ok(job_response(bytes, &run))
}
