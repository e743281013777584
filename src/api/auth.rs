//! Bearer-key auth (`--api-keys-file`), required on a server reachable from the network
//! unless `--allow-unauthenticated`. Health, metrics and docs stay open; so does
//! `/device/bandwidth`, except a `refresh=true` that would lease every device.

use super::problem::{ErrorCode, Problem};
use super::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The tenant an authenticated request acts for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant(pub String);

pub async fn require_key(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    if state.settings.api_keys.is_none() {
        return next.run(req).await;
    }
    match authenticate(&state, req.headers()) {
        Ok(tenant) => {
            req.extensions_mut().insert(tenant);
            next.run(req).await
        }
        Err(problem) => problem.into_response(),
    }
}

/// The tenant of a request's bearer key, when the server has keys; 401 without one or
/// with a key it does not know. On a server without keys, the tenant "".
pub(crate) fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Tenant, Problem> {
    let Some(keys) = &state.settings.api_keys else {
        return Ok(Tenant(String::new()));
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match presented.and_then(|k| keys.get(k)) {
        Some(tenant) => Ok(Tenant(tenant.clone())),
        None if presented.is_none() => Err(Problem::new(
            ErrorCode::Unauthorized,
            "send Authorization: Bearer <key>",
        )),
        None => Err(Problem::new(
            ErrorCode::Unauthorized,
            "the API key is not recognised",
        )),
    }
}

/// The request's tenant: its API key's, or "" on a server without keys.
pub(crate) fn tenant(t: &Option<axum::Extension<Tenant>>) -> String {
    t.as_ref()
        .map_or_else(String::new, |axum::Extension(Tenant(t))| t.clone())
}
