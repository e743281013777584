//! HTTP only: routes, extractors, problem+json, middleware and the OpenAPI document.
//! Knows nothing about devices.

mod array_data;
mod array_operands;
pub mod arrays;
mod auth;
mod backend_choice;
pub mod bandwidth;
pub mod batch_hint;
pub mod beams;
mod body_budget;
mod body_pool;
mod bounded;
pub mod bulk;
mod byte_strings;
pub mod datasets;
mod dense_tensors;
mod domain_errors;
pub mod dp;
mod elements;
pub mod embedding_tables;
pub mod embeddings;
mod extract;
mod float_arrays;
pub mod he;
mod integer_vectors;
mod kept_results;
pub mod linalg;
pub mod mpc;
pub mod msm;
pub mod nn;
mod numbers;
pub mod openapi;
mod packed;
pub mod problem;
pub mod rf;
pub mod secagg;
pub mod system;
mod tenant_counts;
mod tenant_limits;
pub mod zk;

pub use bulk::{AnswerForm, ApiBody};
pub use extract::{ApiJson, ApiPath, ApiQuery, IdParam};
pub use system::Authentication;

use crate::backend::Backends;
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::pool::{Pool, RunInfo};
use crate::store::Store;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use problem::{ErrorCode, Problem};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{
    MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

pub struct AppState {
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    pub pool: Arc<Pool>,
    pub backends: Arc<Backends>,
    pub store: Arc<Store>,
    pub datasets: Arc<crate::datasets::Datasets>,
    /// Resident arrays, embedding tables among them.
    pub arrays: Arc<crate::arrays::Arrays>,
    /// `/device/bandwidth`'s last measurement and the lock of the one in progress.
    bandwidth: bandwidth::BandwidthCache,
    body_budget: body_budget::BodyBudget,
    body_pool: Arc<body_pool::BodyPool>,
    tenant_limits: Arc<tenant_limits::TenantLimits>,
    /// The shared polls behind `/datasets/{id}/events`, and each tenant's streams.
    progress: datasets::progress::ProgressWatch,
    shutting_down: AtomicBool,
}

impl AppState {
    pub fn new(
        settings: Settings,
        metrics: Arc<Metrics>,
        pool: Arc<Pool>,
        backends: Arc<Backends>,
        store: Arc<Store>,
        datasets: Arc<crate::datasets::Datasets>,
        arrays: Arc<crate::arrays::Arrays>,
    ) -> Self {
        Self {
            body_budget: body_budget::BodyBudget::new(
                settings.max_inflight_body_bytes,
                settings.config.max_body_bytes as u64,
                settings.config.max_tenant_inflight_body_percent,
            ),
            body_pool: body_pool::BodyPool::new(
                settings.body_pool_bytes,
                metrics.body_pool_bytes.clone(),
                metrics.body_pool_reused.clone(),
                (settings.config.gpu_pinned_body_mib > 0).then(|| {
                    body_pool::PageLocked::new(
                        backends.clone(),
                        settings.config.gpu_pinned_body_mib.saturating_mul(1 << 20) as usize,
                        metrics.pinned_body_bytes.clone(),
                        metrics.pinned_body_fallbacks.clone(),
                    )
                }),
            ),
            progress: datasets::progress::ProgressWatch::new(
                settings.config.max_tenant_event_streams,
            ),
            tenant_limits: Arc::new(tenant_limits::TenantLimits::new(
                settings.config.tenant_requests_per_second,
                settings.config.tenant_burst,
                settings.config.tenant_max_concurrent_requests,
            )),
            settings,
            metrics,
            pool,
            backends,
            store,
            datasets,
            arrays,
            bandwidth: bandwidth::BandwidthCache::default(),
            shutting_down: AtomicBool::new(false),
        }
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.datasets.shutdown();
    }

    /// Progress streams `tenant` holds open now ("" without keys).
    pub fn progress_streams(&self, tenant: &str) -> usize {
        self.progress.open_streams(tenant)
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

/// The OpenAPI document as committed in `openapi/openapi.json`.
pub fn openapi_json() -> String {
    serde_json::to_string_pretty(&openapi::document()).expect("the OpenAPI document serialises")
        + "\n"
}

/// The whole application: routes plus the middleware stack.
pub fn router(state: Arc<AppState>) -> Router {
    with_middleware(routes(state.clone()), state)
}

/// The routes without middleware; `with_middleware` wraps them (tests add routes between).
pub fn routes(state: Arc<AppState>) -> Router {
    let (system, _) = system_operations().split_for_parts();
    let (keyed, _) = keyed_operations().split_for_parts();
    // The key check runs first (the outer layer) and names the tenant whose limits apply.
    let keyed = keyed
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            tenant_limits::limit,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ));
    Router::new()
        .merge(system)
        .merge(
            SwaggerUi::new("/docs")
                .external_url_unchecked("/api-doc/openapi.json", openapi::document()),
        )
        .merge(keyed)
        .fallback(|| async { Problem::new(ErrorCode::NotFound, "no route matches this path") })
        .method_not_allowed_fallback(|| async {
            Problem::new(
                ErrorCode::MethodNotAllowed,
                "this path does not accept that method",
            )
        })
        .with_state(state)
}

type Operations = OpenApiRouter<Arc<AppState>>;

/// What an API domain registers: the OpenAPI tag its operations carry, and the
/// operations (each route registered once, with its documentation). The router, the
/// OpenAPI document's paths and its list of tags all come from `API_DOMAINS`.
pub(crate) struct ApiDomain {
    pub tag: &'static str,
    pub description: &'static str,
    /// Behind `--api-keys-file` and the tenant's limits: every domain but `system`.
    pub keyed: bool,
    pub operations: fn() -> Operations,
}

/// Every API domain, in the order of the document's tags: a new domain is one line here
/// (and its `mod`).
pub(crate) const API_DOMAINS: &[ApiDomain] = &[
    system::API,
    arrays::API,
    zk::API,
    mpc::API,
    he::API,
    secagg::API,
    dp::API,
    rf::API,
    linalg::API,
    embeddings::API,
    nn::API,
    beams::API,
    datasets::API,
];

/// The operations of the domains open to all (`keyed` false: health, devices, metrics)
/// or of those behind the keys.
fn operations_where(keyed: bool) -> Operations {
    API_DOMAINS
        .iter()
        .filter(|d| d.keyed == keyed)
        .fold(OpenApiRouter::default(), |all, d| {
            all.merge((d.operations)())
        })
}

fn system_operations() -> Operations {
    operations_where(false)
}

fn keyed_operations() -> Operations {
    operations_where(true)
}

/// The operations' OpenAPI paths and schemas, before `openapi::document` finishes them.
pub(crate) fn operations_openapi(base: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    OpenApiRouter::with_openapi(base)
        .merge(system_operations())
        .merge(keyed_operations())
        .into_openapi()
}

pub fn with_middleware(routes: Router, state: Arc<AppState>) -> Router {
    let x_request_id = HeaderName::from_static("x-request-id");
    let limit = state.settings.config.max_body_bytes;
    let budget_state = state.clone();
    let idle = state.settings.config.body_idle_timeout;
    routes.layer(DefaultBodyLimit::max(limit)).layer(
        ServiceBuilder::new()
            .layer(SetRequestIdLayer::new(x_request_id.clone(), MakeRequestUuid))
            .layer(PropagateRequestIdLayer::new(x_request_id))
            .layer(TraceLayer::new_for_http().make_span_with(|req: &Request| {
                let id = req.extensions().get::<RequestId>().and_then(|r| r.header_value().to_str().ok()).unwrap_or("");
                tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
            }))
            .layer(middleware::from_fn_with_state(state, record_http_metrics))
            .layer(middleware::from_fn(render_problems))
            .layer(CatchPanicLayer::custom(|panic: Box<dyn std::any::Any + Send>| {
                tracing::error!(panic = %crate::backend::cpu::panic_message(&panic), "handler panicked");
                Problem::new(ErrorCode::Internal, "the request failed unexpectedly; it has been logged").into_response()
            }))
            .layer(middleware::from_fn_with_state(budget_state, body_budget::admit))
            // Innermost, so the handlers' bodies are the timed ones.
            .layer(RequestBodyTimeoutLayer::new(idle)),
    )
}

async fn record_http_metrics(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("<unmatched>".to_string(), |p| p.as_str().to_string());
    let method = req.method().as_str().to_string();
    let start = Instant::now();
    let res = next.run(req).await;
    let m = &state.metrics;
    m.http_requests
        .with_label_values(&[&route, &method, res.status().as_str()])
        .inc();
    m.http_duration
        .with_label_values(&[&route])
        .observe(start.elapsed().as_secs_f64());
    res
}

/// Gives every error response the problem+json shape with the request id: our own
/// problems are re-rendered with it, and any other error (from a layer or axum itself)
/// is wrapped.
async fn render_problems(req: Request, next: Next) -> Response {
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let res = next.run(req).await;
    if let Some(problem) = res.extensions().get::<Arc<Problem>>().cloned() {
        let mut fresh = problem.to_response(request_id);
        for (k, v) in res.headers() {
            if !fresh.headers().contains_key(k) {
                fresh.headers_mut().insert(k.clone(), v.clone());
            }
        }
        return fresh;
    }
    let status = res.status();
    if status.as_u16() < 400 {
        return res;
    }
    let (parts, body) = res.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .unwrap_or_default();
    let code = match status {
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedMediaType,
        s if s.is_server_error() => ErrorCode::Internal,
        _ => ErrorCode::HttpError,
    };
    let mut problem = Problem::new(code, String::from_utf8_lossy(&text).into_owned());
    problem.status = Some(status);
    let mut fresh = problem.to_response(request_id);
    for (k, v) in &parts.headers {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            fresh.headers_mut().insert(k.clone(), v.clone());
        }
    }
    fresh
}

/// A request's `timeout_ms`: 1 to 2^63 − 1 when given, the range of the schema's int64
/// (the pool caps it at --job-timeout).
pub(crate) fn job_timeout(ms: Option<u64>) -> Result<Option<std::time::Duration>, Problem> {
    match ms {
        Some(0) => Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/timeout_ms",
            "must be at least 1",
        )),
        Some(ms) if ms > i64::MAX as u64 => Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/timeout_ms",
            format!("must be at most {}", i64::MAX),
        )),
        t => Ok(t.map(std::time::Duration::from_millis)),
    }
}

/// Runs `f` on a blocking thread when the input is `large`, else here: small bodies
/// decode and encode faster than a hop to the blocking pool.
pub(crate) async fn blocking_if<T: Send + 'static>(
    large: bool,
    f: impl FnOnce() -> Result<T, Problem> + Send + 'static,
) -> Result<T, Problem> {
    if large {
        blocking(f).await
    } else {
        f()
    }
}

/// Runs `f` on a blocking thread (decoding, encoding, accounting, storage).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Problem> + Send + 'static,
) -> Result<T, Problem> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(Problem::new(
            ErrorCode::Internal,
            format!("worker thread failed: {e}"),
        ))
    })
}

/// 64 bits of OS entropy: the seed of a request that gave none.
pub(crate) fn entropy_u64() -> Result<u64, Problem> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| Problem::internal(format!("no OS entropy: {e}")))?;
    Ok(u64::from_le_bytes(b))
}

/// A request's seed: the given one, below 2^63 (int64 in the spec, as clients and SQLite
/// hold it; 422 at `path` otherwise), or one drawn from OS entropy.
pub(crate) fn seed_or_drawn(seed: Option<u64>, path: &str) -> Result<u64, Problem> {
    match seed {
        Some(s) if s > i64::MAX as u64 => Err(Problem::at(
            ErrorCode::InvalidParameter,
            path,
            "must be below 2^63",
        )),
        Some(s) => Ok(s),
        None => Ok(entropy_u64()? >> 1),
    }
}

/// The answer's JSON, in a buffer sized up front: a large tensor's answer would otherwise
/// be copied at every doubling of the buffer.
pub(crate) fn json_body<T: serde::Serialize>(
    body: &T,
    size_hint: usize,
) -> Result<Vec<u8>, Problem> {
    let mut out = Vec::with_capacity(size_hint);
    serde_json::to_writer(&mut out, body)
        .map_err(|e| Problem::new(ErrorCode::Internal, e.to_string()))?;
    Ok(out)
}

/// Where and how long a job ran, on its answer (every job's answer is written by
/// `bulk::answer`, as JSON or in the bulk form).
pub(crate) fn add_run_headers(h: &mut HeaderMap, done: &RunInfo) {
    h.insert("x-backend", HeaderValue::from_static(done.backend.name()));
    if let Some(d) = done.device {
        h.insert("x-device", HeaderValue::from(d));
    }
    let ms = |d: std::time::Duration| {
        HeaderValue::from_str(&format!("{:.3}", d.as_secs_f64() * 1e3)).expect("ascii")
    };
    h.insert("x-queue-time-ms", ms(done.queue_time));
    h.insert("x-compute-time-ms", ms(done.compute_time));
}
