//! Health, device report, metrics.

use super::problem::{ErrorCode, Problem};
use super::AppState;
use crate::backend::cpu::CpuInfo;
use crate::backend::verify::OpStatus;
use crate::backend::GpuInfo;
use crate::backend::{BackendChoice, BackendKind};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

#[derive(Serialize, ToSchema)]
pub struct HealthStatus {
    #[schema(example = "ready")]
    pub status: &'static str,
}

#[utoipa::path(get, path = "/health/live", tag = "system", operation_id = "health_live",
    summary = "Liveness: the process is up and serving HTTP",
    responses((status = 200, body = HealthStatus)))]
pub async fn live() -> Json<HealthStatus> {
    Json(HealthStatus { status: "live" })
}

#[utoipa::path(get, path = "/health/ready", tag = "system", operation_id = "health_ready",
    summary = "Readiness: backends discovered, kernels compiled, not shutting down",
    responses(
        (status = 200, body = HealthStatus),
        (status = 503, description = "not_ready or shutting_down")))]
pub async fn ready(State(state): State<Arc<AppState>>) -> Result<Json<HealthStatus>, Problem> {
    if state.is_shutting_down() {
        return Err(Problem::new(
            ErrorCode::ShuttingDown,
            "draining before exit",
        ));
    }
    if !state.backends.discovery_done() {
        return Err(Problem::new(
            ErrorCode::NotReady,
            "device discovery and kernel compilation are still running",
        ));
    }
    Ok(Json(HealthStatus { status: "ready" }))
}

#[derive(Serialize, ToSchema)]
pub struct GpuReport {
    #[serde(flatten)]
    pub info: GpuInfo,
    pub memory_free_bytes: Option<u64>,
    /// NVIDIA driver version from NVML, when available.
    pub driver_version: Option<String>,
    /// False after a device error took it out of service.
    pub healthy: bool,
    /// Each op's state on this device after its self-test and shadow checks; a
    /// quarantined op's work goes to the CPU or another device.
    pub operations: Vec<OpStatus>,
}

#[derive(Serialize, ToSchema)]
pub struct DeviceReport {
    /// The backend `auto` work goes to now.
    pub backend: BackendKind,
    /// `--backend` as configured.
    pub mode: BackendChoice,
    /// Why this backend: what discovery found, or why CUDA is not in use.
    #[schema(example = "no NVIDIA driver (libcuda not found); using the CPU")]
    pub reason: String,
    /// Whether a failed device job reruns on the CPU.
    pub fallback: bool,
    pub gpus: Vec<GpuReport>,
    /// AMD GPUs: the HIP runtime found, its devices, and whether the HIP engine opens
    /// them (those it opened are in `gpus`, `vendor: amd`).
    pub hip: crate::backend::hip::HipStatus,
    pub cpu: CpuInfo,
    /// How `auto` places jobs: per op and lane, what was measured on each side and the
    /// crossover the model implies against each device.
    pub placement: crate::pool::placement::PlacementReport,
    /// Whether API routes need a key.
    pub authentication: Authentication,
    /// What the operator should act on, such as a server open to the network.
    pub warnings: Vec<String>,
}

/// How API routes are protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Authentication {
    /// `--api-keys-file`: every API route needs a bearer key.
    ApiKeys,
    /// No keys, bound to a loopback address only: reachable from this host alone.
    LoopbackOnly,
    /// No keys on an address reachable from the network (`--allow-unauthenticated`).
    Unauthenticated,
}

impl Authentication {
    pub fn of(settings: &crate::config::Settings) -> Self {
        if settings.api_keys.is_some() {
            Self::ApiKeys
        } else if settings.config.bind.ip().is_loopback() {
            Self::LoopbackOnly
        } else {
            Self::Unauthenticated
        }
    }

    /// The warning an unauthenticated server gives at start and on `/device`.
    pub fn warning(self, settings: &crate::config::Settings) -> Option<String> {
        (self == Self::Unauthenticated).then(|| {
            format!(
                "serving {} without API keys (--allow-unauthenticated): every API route is open \
                 to whoever reaches this address unless something in front authenticates",
                settings.config.bind
            )
        })
    }
}

#[utoipa::path(get, path = "/device", tag = "system", operation_id = "device_info",
    summary = "The backend in use and why, every GPU, and the CPU pool",
    responses((status = 200, body = DeviceReport)))]
pub async fn device(State(state): State<Arc<AppState>>) -> Json<DeviceReport> {
    let b = &state.backends;
    let authentication = Authentication::of(&state.settings);
    let gpus = b
        .gpus()
        .iter()
        .map(|d| GpuReport {
            info: d.info.clone(),
            memory_free_bytes: d.memory().map(|(free, _)| free),
            driver_version: crate::backend::nvml_driver_version().map(str::to_string),
            healthy: d.is_healthy(),
            operations: d.op_states(),
        })
        .collect();
    Json(DeviceReport {
        backend: b.active(),
        mode: b.mode,
        reason: b.reason(),
        fallback: state.settings.config.fallback,
        gpus,
        hip: b.hip(),
        cpu: b.cpu.info.clone(),
        placement: state.pool.placement().report(),
        authentication,
        warnings: authentication
            .warning(&state.settings)
            .into_iter()
            .collect(),
    })
}

#[utoipa::path(get, path = "/metrics", tag = "system", operation_id = "metrics",
    summary = "Prometheus metrics (text exposition format)",
    responses((status = 200, content_type = "text/plain; version=0.0.4", body = String)))]
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// The system domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "system",
    description: "Health, devices and metrics",
    keyed: false,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(live))
        .routes(routes!(ready))
        .routes(routes!(device))
        .routes(routes!(super::bandwidth::bandwidth))
        .routes(routes!(super::batch_hint::batch_hint))
        .routes(routes!(metrics))
}
