//! The server-wide budget of request bodies in flight (`--max-inflight-body-bytes`).
//! `--max-body-bytes` bounds one body; this bounds all of them together, so a burst of
//! large requests cannot take the process's memory with it. A request is charged its
//! declared body length, or `--max-body-bytes` when it streams a body of unknown length
//! (HTTP/1.1 chunked, HTTP/2 without content-length), before its body is read, and the
//! charge is returned when its answer is ready, when the client leaves, or when the
//! upload stalls past `--body-idle-timeout`. A request that would pass the budget is not
//! read at all: 503 `body_budget_exhausted` with `Retry-After`. With keys, one tenant
//! may hold at most `--max-tenant-inflight-body-percent` of the budget, so its uploads
//! cannot refuse every other tenant's. An admitted request
//! carries its body limits (`extract::BodyLimits`): bytes, numbers its JSON parse may
//! store, and the charge its parsed values add (`DecodedCharge`).

use super::auth::{authenticate, Tenant};
use super::extract::{BodyLimits, BodyRate};
use super::problem::{ErrorCode, Problem};
use super::tenant_counts::TenantCounts;
use super::AppState;
use axum::body::HttpBody;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus::IntGauge;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Permits are KiB, so a budget of terabytes fits the semaphore's u32 requests.
const UNIT: u64 = 1024;

pub struct BodyBudget {
    permits: Arc<Semaphore>,
    max_body_bytes: u64,
    budget_bytes: u64,
    /// The most one tenant may hold, bytes (`--max-tenant-inflight-body-percent` of the
    /// budget); applied when keys name tenants.
    tenant_bytes: u64,
    /// Bytes each tenant holds now.
    held: TenantCounts,
}

impl BodyBudget {
    pub fn new(budget_bytes: u64, max_body_bytes: u64, tenant_percent: u8) -> Self {
        let units = budget_bytes
            .div_ceil(UNIT)
            .min(Semaphore::MAX_PERMITS as u64);
        Self {
            permits: Arc::new(Semaphore::new(units as usize)),
            max_body_bytes,
            budget_bytes,
            // At least one largest body, so a share below it refuses nothing for ever.
            tenant_bytes: ((budget_bytes as u128 * u128::from(tenant_percent) / 100) as u64)
                .max(max_body_bytes),
            held: TenantCounts::default(),
        }
    }

    /// What a request is charged, in bytes: its declared length (HTTP/1.1
    /// Content-Length, or HTTP/2's when sent), or `--max-body-bytes` when the length is
    /// unknown (chunked, or HTTP/2 without one). Nothing when it has no body, or when the
    /// declared length is over `--max-body-bytes`: that request gets its 413 uncharged.
    fn charge(&self, req: &Request) -> u64 {
        let body = req.body();
        if body.is_end_stream() {
            return 0;
        }
        match body.size_hint().exact() {
            Some(n) if n > self.max_body_bytes => 0,
            Some(n) => n,
            None => self.max_body_bytes,
        }
    }
}

/// What a JSON body's parsed values are charged against the in-flight budget, on top of
/// the body: the bytes of the numbers and field elements it stored
/// (`numbers::with_number_cap`), taken once it is parsed and given back with the body's
/// charge when the answer is ready. A body is charged by what it becomes: a body of
/// one-number rows decodes to twice its size, flat numbers up to four times. The
/// tenant's share (`--max-tenant-inflight-body-percent`) counts the body only: the
/// largest body that share admits may decode to more than the share.
#[derive(Clone)]
pub struct DecodedCharge {
    state: Arc<AppState>,
    body_bytes: u64,
    taken: Arc<std::sync::Mutex<Vec<OwnedSemaphorePermit>>>,
    in_flight: Arc<InFlight>,
}

impl std::fmt::Debug for DecodedCharge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodedCharge")
            .field("body_bytes", &self.body_bytes)
            .finish_non_exhaustive()
    }
}

impl DecodedCharge {
    /// Charges `decoded` bytes of parsed values: 413 when the body and its values could
    /// never fit the budget together, 503 with Retry-After when they do not fit now.
    pub fn take(&self, decoded: u64) -> Result<(), Problem> {
        if decoded == 0 {
            return Ok(());
        }
        let budget = &self.state.body_budget;
        let refused = || {
            self.state
                .metrics
                .http_bodies_refused
                .with_label_values(&["decoded"])
                .inc()
        };
        let total = self.body_bytes.saturating_add(decoded);
        if total > budget.budget_bytes {
            refused();
            return Err(Problem::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the body's values take {decoded} bytes once parsed; with its {} bytes that is more than --max-inflight-body-bytes ({} bytes) allows one request",
                    self.body_bytes, budget.budget_bytes
                ),
            ));
        }
        let units = u32::try_from(decoded.div_ceil(UNIT)).unwrap_or(u32::MAX);
        let Ok(permit) = budget.permits.clone().try_acquire_many_owned(units) else {
            refused();
            return Err(Problem {
                retry_after_secs: Some(1),
                ..Problem::new(
                    ErrorCode::BodyBudgetExhausted,
                    format!(
                        "the body's values take {decoded} bytes once parsed, more than is left of --max-inflight-body-bytes ({} bytes) now; retry shortly",
                        budget.budget_bytes
                    ),
                )
            });
        };
        self.taken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(permit);
        self.in_flight.add(decoded);
        Ok(())
    }
}

/// Gives the gauge back its bytes however the request ends (a panic included).
struct InFlight {
    gauge: IntGauge,
    bytes: std::sync::atomic::AtomicI64,
}

impl InFlight {
    fn new(gauge: IntGauge) -> Self {
        Self {
            gauge,
            bytes: 0.into(),
        }
    }

    fn add(&self, bytes: u64) {
        let bytes = bytes as i64;
        self.gauge.add(bytes);
        self.bytes
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge
            .sub(self.bytes.load(std::sync::atomic::Ordering::Relaxed));
    }
}

pub(super) async fn admit(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let config = &state.settings.config;
    let declared = req.body().size_hint().exact();
    let budget = &state.body_budget;
    let bytes = budget.charge(&req);
    let in_flight = Arc::new(InFlight::new(
        state.metrics.http_body_bytes_in_flight.clone(),
    ));
    let decoded = DecodedCharge {
        state: state.clone(),
        body_bytes: bytes,
        taken: Default::default(),
        in_flight: in_flight.clone(),
    };
    req.extensions_mut().insert(BodyLimits {
        declared,
        decoded: Some(decoded.clone()),
        max_bytes: config.max_body_bytes,
        pool: Some(state.body_pool.clone()),
        max_numbers: config.max_tensor_elements.max(config.max_elements),
        min_rate: BodyRate {
            bytes_per_second: config.min_body_rate,
            grace: config.min_body_rate_grace,
        },
        too_slow: Some(
            state
                .metrics
                .http_bodies_refused
                .with_label_values(&["too_slow"]),
        ),
    });
    if bytes == 0 {
        return next.run(req).await;
    }
    let refused = |reason: &str| {
        state
            .metrics
            .http_bodies_refused
            .with_label_values(&[reason])
            .inc()
    };
    // With keys, one tenant holds at most its share, so its uploads cannot refuse
    // every other tenant's. Without keys there is one tenant, and no share to keep.
    let share = match authenticate(&state, req.headers()) {
        Ok(Tenant(tenant)) if state.settings.api_keys.is_some() => {
            match budget.held.take(&tenant, bytes, budget.tenant_bytes) {
                Ok(share) => Some(share),
                Err(_) => {
                    refused("tenant_share");
                    return Problem {
                        retry_after_secs: Some(1),
                        ..Problem::new(
                            ErrorCode::BodyBudgetExhausted,
                            format!(
                                "this {bytes}-byte body would take this tenant's bodies in flight past its share of --max-inflight-body-bytes ({} bytes, --max-tenant-inflight-body-percent); retry shortly",
                                budget.tenant_bytes
                            ),
                        )
                    }
                    .into_response();
                }
            }
        }
        _ => None,
    };
    // At most --max-body-bytes, which the configuration keeps below 4 TiB.
    let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX);
    let Ok(permit) = budget.permits.clone().try_acquire_many_owned(units) else {
        refused("inflight_budget");
        return Problem {
            retry_after_secs: Some(1),
            ..Problem::new(
                ErrorCode::BodyBudgetExhausted,
                format!(
                    "this {bytes}-byte body would take the bodies in flight past --max-inflight-body-bytes ({} bytes); retry shortly",
                    budget.budget_bytes
                ),
            )
        }
        .into_response();
    };
    in_flight.add(bytes);
    let res = next.run(req).await;
    // The values' charge with the body's: the extension's clone went with the request.
    drop((permit, share, decoded));
    res
}
