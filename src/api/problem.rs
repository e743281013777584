//! RFC 9457 problem details. Every error the service returns goes through `Problem`,
//! and every `code` is in the one table below, so docs, SDKs and code agree.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;

macro_rules! error_codes {
    ($($variant:ident = ($code:literal, $status:expr, $title:literal),)*) => {
        /// Stable, snake_case error codes.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum ErrorCode { $($variant,)* }

        /// (code, HTTP status, title) for every code; the README table is made from it.
        pub const ERROR_CODES: &[(&str, u16, &str)] = &[$(($code, $status, $title),)*];

        impl ErrorCode {
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$variant,)*];

            pub fn as_str(self) -> &'static str { match self { $(ErrorCode::$variant => $code,)* } }
            pub fn status(self) -> StatusCode {
                match self { $(ErrorCode::$variant => StatusCode::from_u16($status).expect("valid status"),)* }
            }
            pub fn title(self) -> &'static str { match self { $(ErrorCode::$variant => $title,)* } }
        }
    };
}

error_codes! {
    MalformedJson = ("malformed_json", 400, "The body is not valid JSON"),
    MalformedBulkBody = ("malformed_bulk_body", 400, "The bulk body's framing is broken: its header length or header (docs/WIRE.md)"),
    Unauthorized = ("unauthorized", 401, "A valid API key is required"),
    HeDealerModeOff = ("he_dealer_mode_off", 403, "Key generation and decryption are served only with --he-dealer-mode"),
    SeedNotAllowed = ("seed_not_allowed", 403, "Client-chosen noise seeds are refused on this server"),
    SecaggTokenInvalid = ("secagg_token_invalid", 403, "The x-secagg-token header does not name a client, or the coordinator, of this round"),
    NotFound = ("not_found", 404, "No such resource"),
    SecaggRoundNotFound = ("secagg_round_not_found", 404, "No such secure-aggregation round"),
    BudgetNotFound = ("budget_not_found", 404, "No such privacy budget for this tenant"),
    DatasetNotFound = ("dataset_not_found", 404, "No such dataset for this tenant"),
    EmbeddingTableNotFound = ("embedding_table_not_found", 404, "No such embedding table for this tenant"),
    ArrayNotFound = ("array_not_found", 404, "No such resident array for this tenant (or it has expired)"),
    SampleNotFound = ("sample_not_found", 404, "No such sample or receiver recording in this dataset"),
    MethodNotAllowed = ("method_not_allowed", 405, "Method not allowed on this resource"),
    BudgetExhausted = ("budget_exhausted", 409, "The release would exceed the privacy budget; nothing was released"),
    DatasetNotReady = ("dataset_not_ready", 409, "The dataset job has not completed"),
    DatasetFinished = ("dataset_finished", 409, "The dataset job has already ended"),
    DatasetNotResumable = ("dataset_not_resumable", 409, "Only an interrupted dataset job can be resumed"),
    SecaggWrongStage = ("secagg_wrong_stage", 409, "The round is not at the stage this request belongs to"),
    SecaggAlreadySubmitted = ("secagg_already_submitted", 409, "This client already submitted at this stage"),
    SecaggRoundFull = ("secagg_round_full", 409, "Every client of the round has registered"),
    SecaggTooFewClients = ("secagg_too_few_clients", 409, "Closing the stage now would sum fewer clients than the threshold, or leave a client's secrets unrecoverable"),
    BodyTooSlow = ("body_too_slow", 408, "The body arrived slower than --min-body-rate; the connection is closed"),
    PayloadTooLarge = ("payload_too_large", 413, "The request is larger than the server accepts"),
    UnsupportedMediaType = ("unsupported_media_type", 415, "The body must be application/json, or application/vnd.gpu-ops.bulk where the operation takes it"),
    InvalidRequest = ("invalid_request", 422, "The request does not match the schema"),
    InvalidFieldElement = ("invalid_field_element", 422, "A field element is malformed or not canonical"),
    LengthMismatch = ("length_mismatch", 422, "Input vectors have incompatible lengths"),
    InvalidPoint = ("invalid_point", 422, "A point is malformed, not on the curve, or outside the prime-order subgroup"),
    NotInvertible = ("not_invertible", 422, "Zero has no inverse"),
    InvalidParameter = ("invalid_parameter", 422, "A parameter is out of range"),
    InsufficientShares = ("insufficient_shares", 422, "Fewer shares than the threshold: the secrets cannot be recovered"),
    InconsistentShares = ("inconsistent_shares", 422, "The shares do not lie on one set of polynomials of the threshold's degree"),
    InvalidCiphertext = ("invalid_ciphertext", 422, "A ciphertext does not decode under the parameter set, or is not a fresh 2-polynomial ciphertext"),
    InvalidBuffer = ("invalid_buffer", 422, "A bulk body's buffer descriptor disagrees with its dtype, its shape or the data section (docs/WIRE.md)"),
    InvalidTensor = ("invalid_tensor", 422, "A numeric array is empty, ragged, non-finite or mis-shaped"),
    ResultNotFinite = ("result_not_finite", 422, "The result overflows the requested output dtype"),
    DatasetTooLarge = ("dataset_too_large", 422, "The dataset would exceed --max-dataset-bytes"),
    DatasetQuotaExceeded = ("dataset_quota_exceeded", 422, "The tenant's datasets would exceed --max-tenant-dataset-bytes"),
    DatasetSampleTooLarge = ("dataset_sample_too_large", 422, "One sample of the dataset would not fit --dataset-memory-mib"),
    DatasetWorkTooLarge = ("dataset_work_too_large", 422, "The dataset alone asks for more than --max-tenant-dataset-work"),
    EmbeddingQuotaExceeded = ("embedding_quota_exceeded", 422, "The tenant's embedding tables would exceed --max-tenant-embedding-mib"),
    ArrayQuotaExceeded = ("array_quota_exceeded", 422, "The tenant's resident arrays would exceed --max-tenant-array-mib or --max-tenant-arrays"),
    UnknownArray = ("unknown_array", 422, "An operand names no resident array of this tenant (or one that has expired)"),
    ArrayMismatch = ("array_mismatch", 422, "An operand names a resident array of another kind, field, curve, dtype or rank than the operand takes"),
    TenantRateLimited = ("tenant_rate_limited", 429, "The tenant's requests are over --tenant-requests-per-second; retry after Retry-After"),
    TenantConcurrencyLimited = ("tenant_concurrency_limited", 429, "The tenant has --tenant-max-concurrent-requests requests in flight; retry after Retry-After"),
    TenantDatasetQueueFull = ("tenant_dataset_queue_full", 429, "The tenant has --max-tenant-queued-datasets dataset jobs waiting; retry after Retry-After"),
    TenantDatasetWorkPending = ("tenant_dataset_work_pending", 429, "The tenant's queued and running dataset jobs would pass --max-tenant-dataset-work; retry after Retry-After"),
    TooManyStreams = ("too_many_streams", 429, "The tenant has --max-tenant-event-streams progress streams open"),
    Internal = ("internal", 500, "Internal error"),
    QueueFull = ("queue_full", 503, "The job queue is full"),
    BodyBudgetExhausted = ("body_budget_exhausted", 503, "The request bodies in flight would pass --max-inflight-body-bytes; retry after Retry-After"),
    DeviceUnavailable = ("device_unavailable", 503, "No usable CUDA device"),
    DeviceError = ("device_error", 503, "The device failed and CPU fallback is off"),
    StorageUnavailable = ("storage_unavailable", 503, "The shared database cannot be reached; nothing was released"),
    NotReady = ("not_ready", 503, "The service is not ready"),
    ShuttingDown = ("shutting_down", 503, "The service is shutting down"),
    DeadlineExceeded = ("deadline_exceeded", 504, "The job's deadline passed"),
    InsufficientStorage = ("insufficient_storage", 507, "Not enough free disk space under --data-dir for the dataset"),
    EmbeddingTablesFull = ("embedding_tables_full", 507, "All embedding tables together would exceed --max-embedding-tables-mib"),
    ArrayLost = ("array_lost", 410, "A resident array kept only on a device is gone: the device lost it (its context was rebuilt after a fault) before its values were read back"),
    ArraysFull = ("arrays_full", 507, "All resident arrays together would exceed --max-arrays-mib or --max-arrays"),
    HttpError = ("http_error", 400, "The request was refused"),
}

/// One bad field: a JSON pointer into the request body and what is wrong there.
#[derive(Clone, Debug, Serialize, ToSchema, PartialEq, Eq)]
pub struct FieldIssue {
    #[schema(example = "/a/3")]
    pub path: String,
    #[schema(example = "invalid digit 'x'")]
    pub message: String,
}

/// The body of every error response (`application/problem+json`, RFC 9457).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ProblemDocument {
    #[serde(rename = "type")]
    #[schema(example = "urn:gpu-ops:problem:invalid_field_element")]
    pub type_: String,
    #[schema(example = "A field element is malformed or not canonical")]
    pub title: String,
    #[schema(example = 422)]
    pub status: u16,
    pub detail: String,
    /// Stable error code; see the README's table.
    #[schema(example = "invalid_field_element")]
    pub code: String,
    #[schema(example = "0d9f4b52-8c1e-4c39-9d5a-3b1f0e2a7c44")]
    pub request_id: Option<String>,
    pub errors: Vec<FieldIssue>,
}

#[derive(Clone, Debug)]
pub struct Problem {
    pub code: ErrorCode,
    /// Overrides the code's status where one code covers several (http_error).
    pub status: Option<StatusCode>,
    pub detail: String,
    pub errors: Vec<FieldIssue>,
    pub retry_after_secs: Option<u64>,
}

impl Problem {
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self {
            code,
            status: None,
            detail: detail.into(),
            errors: Vec::new(),
            retry_after_secs: None,
        }
    }

    /// 500 `internal`: a failure of the server's own, not of the request.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self::new(ErrorCode::Internal, detail.to_string())
    }

    /// A problem about one field of the request, at its JSON pointer.
    pub fn at(code: ErrorCode, path: impl Into<String>, message: impl Into<String>) -> Self {
        let message = message.into();
        let path = path.into();
        Self::new(code, format!("{path}: {message}"))
            .with_errors(vec![FieldIssue { path, message }])
    }

    pub fn with_errors(mut self, errors: Vec<FieldIssue>) -> Self {
        self.errors = errors;
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status.unwrap_or_else(|| self.code.status())
    }

    pub fn document(&self, request_id: Option<String>) -> ProblemDocument {
        ProblemDocument {
            type_: format!("urn:gpu-ops:problem:{}", self.code.as_str()),
            title: self.code.title().to_string(),
            status: self.status().as_u16(),
            detail: self.detail.clone(),
            code: self.code.as_str().to_string(),
            request_id,
            errors: self.errors.clone(),
        }
    }

    /// The response, with the request id filled in when it is known.
    pub fn to_response(&self, request_id: Option<String>) -> Response {
        let body = serde_json::to_vec(&self.document(request_id)).unwrap_or_default();
        let mut res = (self.status(), body).into_response();
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after_secs {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.code == ErrorCode::Unauthorized {
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if matches!(
            self.code,
            ErrorCode::BodyTooSlow | ErrorCode::PayloadTooLarge
        ) {
            // The rest of the body may be unread (a 413 is answered by the declared length,
            // before the body is read): the connection cannot carry another request, and
            // a client told so does not send its next one on a connection being closed.
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        res.extensions_mut().insert(Arc::new(self.clone()));
        res
    }
}

impl IntoResponse for Problem {
    /// The request id is added by the `render_problems` middleware, which sees the
    /// request; this body is complete but for that.
    fn into_response(self) -> Response {
        self.to_response(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_snake_case_and_statuses_are_errors() {
        let mut seen = std::collections::HashSet::new();
        for (code, status, _) in ERROR_CODES {
            assert!(seen.insert(*code), "duplicate code {code}");
            assert!(
                code.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{code}"
            );
            assert!((400..600).contains(status));
        }
    }
}
