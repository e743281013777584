//! Per-tenant request limits on the API routes: a token bucket of requests per second
//! with a burst (`--tenant-requests-per-second`, `--tenant-burst`) and a cap on requests
//! in flight (`--tenant-max-concurrent-requests`). One tenant flooding the server is
//! answered 429 with `Retry-After` while the others keep their share. Tenants come from
//! the key file (or are one, `anonymous`, without keys), so the metrics' label set is
//! bounded. A request counts as in flight until its answer's head is sent.

use super::auth::Tenant;
use super::problem::{ErrorCode, Problem};
use super::AppState;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The metrics' name for requests on a server without keys.
pub const ANONYMOUS: &str = "anonymous";

/// The limits, and each tenant's bucket and count in flight.
pub struct TenantLimits {
    /// Tokens added per second; 0: no rate limit.
    rate: f64,
    /// The bucket's size: requests a quiet tenant may send at once.
    burst: f64,
    /// 0: no limit.
    max_concurrent: usize,
    tenants: Mutex<HashMap<String, TenantState>>,
}

struct TenantState {
    tokens: f64,
    refilled: Instant,
    in_flight: usize,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refusal {
    /// Over the rate: a token is back after this long.
    Rate { retry_after: Duration },
    /// As many requests in flight as allowed.
    Concurrency,
}

impl Refusal {
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Rate { .. } => "rate",
            Refusal::Concurrency => "concurrency",
        }
    }
}

/// A request admitted: its place among the tenant's requests in flight, given back on
/// drop.
pub struct Admitted {
    limits: Arc<TenantLimits>,
    tenant: String,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut tenants = self.limits.lock();
        if let Some(t) = tenants.get_mut(&self.tenant) {
            t.in_flight = t.in_flight.saturating_sub(1);
        }
    }
}

impl TenantLimits {
    /// `burst` 0 means one second's worth of `rate` (at least 1).
    pub fn new(rate: f64, burst: u32, max_concurrent: usize) -> Self {
        let burst = if burst == 0 {
            rate.ceil().max(1.0)
        } else {
            f64::from(burst)
        };
        TenantLimits {
            rate,
            burst,
            max_concurrent,
            tenants: Mutex::new(HashMap::new()),
        }
    }

    pub fn is_off(&self) -> bool {
        self.rate == 0.0 && self.max_concurrent == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TenantState>> {
        // A panic while the lock is held leaves counts, not broken invariants.
        self.tenants.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a token and a place in flight for `tenant` at `now`, or says why not. A
    /// refused request takes neither.
    pub fn admit(self: &Arc<Self>, tenant: &str, now: Instant) -> Result<Admitted, Refusal> {
        let mut tenants = self.lock();
        let t = tenants
            .entry(tenant.to_string())
            .or_insert_with(|| TenantState {
                tokens: self.burst,
                refilled: now,
                in_flight: 0,
            });
        if self.max_concurrent > 0 && t.in_flight >= self.max_concurrent {
            return Err(Refusal::Concurrency);
        }
        if self.rate > 0.0 {
            let elapsed = now.saturating_duration_since(t.refilled).as_secs_f64();
            t.tokens = (t.tokens + elapsed * self.rate).min(self.burst);
            t.refilled = now;
            if t.tokens < 1.0 {
                let wait = (1.0 - t.tokens) / self.rate;
                return Err(Refusal::Rate {
                    retry_after: Duration::from_secs_f64(wait),
                });
            }
            t.tokens -= 1.0;
        }
        t.in_flight += 1;
        Ok(Admitted {
            limits: self.clone(),
            tenant: tenant.to_string(),
        })
    }
}

/// The middleware of the API routes, after the key check (which names the tenant).
pub(super) async fn limit(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let limits = &state.tenant_limits;
    if limits.is_off() {
        return next.run(req).await;
    }
    let tenant = match req.extensions().get::<Tenant>() {
        Some(Tenant(t)) if !t.is_empty() => t.clone(),
        _ => ANONYMOUS.to_string(),
    };
    let admitted = match limits.admit(&tenant, Instant::now()) {
        Ok(a) => a,
        Err(refusal) => {
            state
                .metrics
                .tenant_requests_refused
                .with_label_values(&[&tenant, refusal.reason()])
                .inc();
            return refused(refusal).into_response();
        }
    };
    let res = next.run(req).await;
    drop(admitted);
    res
}

fn refused(refusal: Refusal) -> Problem {
    match refusal {
        Refusal::Rate { retry_after } => Problem {
            retry_after_secs: Some(retry_after.as_secs_f64().ceil().max(1.0) as u64),
            ..Problem::new(
                ErrorCode::TenantRateLimited,
                "this tenant's requests are over --tenant-requests-per-second; retry after Retry-After",
            )
        },
        Refusal::Concurrency => Problem {
            retry_after_secs: Some(1),
            ..Problem::new(
                ErrorCode::TenantConcurrencyLimited,
                "this tenant has --tenant-max-concurrent-requests requests in flight; retry when one is answered",
            )
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let limits = Arc::new(TenantLimits::new(2.0, 3, 0));
        let t0 = Instant::now();
        let held: Vec<_> = (0..3).map(|_| limits.admit("a", t0).unwrap()).collect();
        match limits.admit("a", t0) {
            Err(Refusal::Rate { retry_after }) => {
                assert!(
                    (retry_after.as_secs_f64() - 0.5).abs() < 1e-9,
                    "{retry_after:?}"
                )
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        // Another tenant has its own bucket.
        assert!(limits.admit("b", t0).is_ok());
        // Half a second later one token is back, and only one.
        let t1 = t0 + Duration::from_millis(500);
        assert!(limits.admit("a", t1).is_ok());
        assert!(limits.admit("a", t1).is_err());
        drop(held);
        // A long pause refills to the burst, no further.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(limits.admit("a", t2).is_ok());
        }
        assert!(limits.admit("a", t2).is_err());
    }

    #[test]
    fn requests_in_flight_are_capped_per_tenant_and_given_back() {
        let limits = Arc::new(TenantLimits::new(0.0, 0, 2));
        let now = Instant::now();
        let first = limits.admit("a", now).unwrap();
        let _second = limits.admit("a", now).unwrap();
        assert_eq!(
            limits.admit("a", now).err(),
            Some(Refusal::Concurrency),
            "a third in flight"
        );
        assert!(limits.admit("b", now).is_ok(), "another tenant's own count");
        drop(first);
        assert!(limits.admit("a", now).is_ok(), "a place given back");
    }

    #[test]
    fn refusals_are_429_with_retry_after() {
        let p = refused(Refusal::Rate {
            retry_after: Duration::from_millis(1200),
        });
        assert_eq!((p.status().as_u16(), p.retry_after_secs), (429, Some(2)));
        let p = refused(Refusal::Concurrency);
        assert_eq!(p.code, ErrorCode::TenantConcurrencyLimited);
        assert_eq!(p.status().as_u16(), 429);
    }
}
