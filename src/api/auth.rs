//! Optional bearer-key auth (`--api-keys-file`). Health, metrics and docs stay open.

use super::problem::{ErrorCode, Problem};
use super::AppState;
use axum::extract::{Request, State};
use axum::http::header;
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
    let Some(keys) = &state.settings.api_keys else {
        return next.run(req).await;
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match presented.and_then(|k| keys.get(k)) {
        Some(tenant) => {
            req.extensions_mut().insert(Tenant(tenant.clone()));
            next.run(req).await
        }
        None if presented.is_none() => {
            Problem::new(ErrorCode::Unauthorized, "send Authorization: Bearer <key>")
                .into_response()
        }
        None => {
            Problem::new(ErrorCode::Unauthorized, "the API key is not recognised").into_response()
        }
    }
}

/// The request's tenant: its API key's, or "" on a server without keys.
pub(crate) fn tenant(t: &Option<axum::Extension<Tenant>>) -> String {
    t.as_ref()
        .map_or_else(String::new, |axum::Extension(Tenant(t))| t.clone())
}
