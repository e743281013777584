//! `GET /device/bandwidth`: copy bandwidth of every healthy device and of host memory,
//! measured on first request (or `refresh=true`) and cached with its time.

use super::problem::Problem;
use super::{blocking, ApiQuery, AppState};
use crate::backend::{best_rate, DeviceError};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;
use utoipa::{IntoParams, ToSchema};

/// Bytes each host copy moves: large enough that a copy's fixed cost is noise
/// (bandwidthTest's default is 32 MiB).
const COPY_BYTES: usize = 64 << 20;
/// Bytes each GPU copy moves: 1 GiB, because a device-to-device copy of less sits largely
/// in the L2 of a recent GPU (50 MiB on an H100, 60 MiB on an H200) and reads high. The
/// emulated device copies host memory in its 1 GiB of pretend memory: 64 MiB there.
const GPU_COPY_BYTES: usize = 1 << 30;
const REPEATS: usize = 5;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BandwidthQuery {
    /// Measure again instead of answering the cached figures (unless the last measurement
    /// is younger than the server's `--bandwidth-min-refresh`, 5 s by default). Each device
    /// is leased for the measurement (well under a second on a GPU): jobs wait for it.
    #[serde(default)]
    pub refresh: bool,
}

/// GB/s are 10^9 bytes per second.
#[derive(Clone, Serialize, ToSchema)]
pub struct BandwidthReport {
    /// When the figures were measured (RFC 3339, UTC, to the microsecond).
    pub measured_at: String,
    /// Host memory to host memory (one thread's memcpy between two buffers).
    pub host_memcpy_gb_per_s: f64,
    /// Bytes the host copy moved.
    pub host_bytes: u64,
    pub gpus: Vec<GpuBandwidth>,
}

#[derive(Clone, Serialize, ToSchema)]
pub struct GpuBandwidth {
    /// `cuda:N`, or `emulated:N` (whose copies are host memcpys).
    pub device: String,
    /// Bytes each copy moved: 1 GiB on a GPU (64 MiB on the emulated device), or less to
    /// fit the device's job budget.
    pub bytes: u64,
    pub h2d_pageable_gb_per_s: f64,
    pub d2h_pageable_gb_per_s: f64,
    pub h2d_pinned_gb_per_s: f64,
    pub d2h_pinned_gb_per_s: f64,
    /// Bytes copied per second; the memory traffic is twice this.
    pub d2d_gb_per_s: f64,
}

#[utoipa::path(get, path = "/device/bandwidth", tag = "system", operation_id = "device_bandwidth",
    summary = "Copy bandwidth of every device (pageable and pinned host memory, device to device) and of host memory",
    params(BandwidthQuery),
    responses(
        (status = 200, body = BandwidthReport),
        (status = 401, description = "unauthorized: `refresh=true` on a server with API keys, without a recognised bearer key (a measurement leases every device)"),
        (status = 500, description = "internal: a device failed while copying"),
    ))]
pub async fn bandwidth(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<BandwidthQuery>,
) -> Result<Json<BandwidthReport>, Problem> {
    if q.refresh {
        super::auth::authenticate(&state, &headers)?;
    }
    let cache = &state.bandwidth;
    // A plain read never waits for a measurement in progress.
    if let Some((report, _)) = cache.last().filter(|_| !q.refresh) {
        return Ok(Json(report));
    }
    // One measurement at a time: who waited for one gets its result, and a refresh within
    // --bandwidth-min-refresh of the last measurement gets that one, so refreshes cannot
    // keep the devices leased.
    let _measuring = cache.measuring.lock().await;
    if let Some((report, at)) = cache.last() {
        if !q.refresh || at.elapsed() < state.settings.config.bandwidth_min_refresh {
            return Ok(Json(report));
        }
    }
    let measuring = state.clone();
    let report = blocking(move || measure(&measuring)).await?;
    *cache.last.write().unwrap_or_else(|e| e.into_inner()) = Some((report.clone(), Instant::now()));
    Ok(Json(report))
}

/// The last report, readable while the next is measured.
#[derive(Default)]
pub struct BandwidthCache {
    last: std::sync::RwLock<Option<(BandwidthReport, Instant)>>,
    measuring: tokio::sync::Mutex<()>,
}

impl BandwidthCache {
    fn last(&self) -> Option<(BandwidthReport, Instant)> {
        self.last.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn measure(state: &AppState) -> Result<BandwidthReport, Problem> {
    let failed = |e: DeviceError| Problem::new(super::problem::ErrorCode::Internal, e.to_string());
    let gpus = state
        .backends
        .healthy_gpus()
        .map(|gpu| {
            let lease = gpu.lease().map_err(failed)?;
            // Two buffers of the copy size must fit the job budget.
            let wanted = if gpu.is_emulated() {
                COPY_BYTES
            } else {
                GPU_COPY_BYTES
            };
            let bytes = wanted.min(lease.memory_budget() / 2).max(4);
            let b = lease.measure_bandwidth(bytes, REPEATS).map_err(failed)?;
            let gb = |x: f64| x / 1e9;
            Ok(GpuBandwidth {
                device: gpu.label(),
                bytes: b.bytes as u64,
                h2d_pageable_gb_per_s: gb(b.h2d_pageable),
                d2h_pageable_gb_per_s: gb(b.d2h_pageable),
                h2d_pinned_gb_per_s: gb(b.h2d_pinned),
                d2h_pinned_gb_per_s: gb(b.d2h_pinned),
                d2d_gb_per_s: gb(b.d2d),
            })
        })
        .collect::<Result<Vec<_>, Problem>>()?;
    let src = vec![1u8; COPY_BYTES];
    let mut dst = vec![0u8; COPY_BYTES];
    let host = best_rate(COPY_BYTES, REPEATS, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        Ok(())
    })
    .map_err(failed)?;
    Ok(BandwidthReport {
        // Microseconds: two measurements (each many copies long) never share a time.
        measured_at: humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
        host_memcpy_gb_per_s: host / 1e9,
        host_bytes: COPY_BYTES as u64,
        gpus,
    })
}
