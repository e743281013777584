//! `/datasets/{id}/events`: a job's progress as server-sent events.

use super::{find, view};
use crate::api::auth::{tenant, Tenant};
use crate::api::problem::Problem;
use crate::api::{ApiPath, AppState, IdParam};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use std::sync::Arc;

/// How often `/datasets/{id}/events` reports.
const EVENT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

#[utoipa::path(
    get, path = "/datasets/{id}/events", tag = "datasets", operation_id = "dataset_events",
    summary = "Progress as server-sent events",
    description = "A `progress` event with the job (as `GET /datasets/{id}`) at once and every 500 ms while it is \
        queued or running, then one `end` event with its final state, and the stream closes. A job deleted \
        meanwhile ends the stream without an `end` event.",
    params(("id" = String, Path, description = "Dataset id")),
    responses(
        (status = 200, description = "Server-sent events, each `event: progress` or `event: end` with `data:` one \
            `DatasetView` as JSON (the schema `#/components/schemas/DatasetView`); `:` comment lines keep the connection alive",
            content_type = "text/event-stream"),
        (status = 404, description = "dataset_not_found"),
    ),
    security((), ("bearer" = []))
)]
pub async fn dataset_events(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<Response, Problem> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let t = tenant(&who);
    find(&state, &t, &id).await?;
    let stream = futures_util::stream::unfold(
        (state, t, id, true, false),
        |(state, t, id, first, ended)| async move {
            if ended {
                return None;
            }
            if !first {
                tokio::time::sleep(EVENT_INTERVAL).await;
            }
            // A job deleted meanwhile ends the stream.
            let row = find(&state, &t, &id).await.ok()?;
            let end = row.status.is_final();
            let event = Event::default()
                .event(if end { "end" } else { "progress" })
                .json_data(view(&state, row))
                .ok()?;
            Some((
                Ok::<_, std::convert::Infallible>(event),
                (state, t, id, false, end),
            ))
        },
    );
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
