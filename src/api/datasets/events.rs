//! `/datasets/{id}/events`: a job's progress as server-sent events.

use super::find;
use super::progress::Polled;
use crate::api::auth::{tenant, Tenant};
use crate::api::problem::Problem;
use crate::api::{ApiPath, AppState, IdParam};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use std::sync::Arc;

#[utoipa::path(
    get, path = "/datasets/{id}/events", tag = "datasets", operation_id = "dataset_events",
    summary = "Progress as server-sent events",
    description = "A `progress` event with the job (as `GET /datasets/{id}`) at once and every 500 ms while it is \
        queued or running, then one `end` event with its final state, and the stream closes. A job deleted \
        meanwhile ends the stream without an `end` event. All streams of one job share one reading of it; \
        a tenant may hold --max-tenant-event-streams streams at once (429 too_many_streams past it).",
    params(("id" = String, Path, description = "Dataset id")),
    responses(
        (status = 200, description = "Server-sent events, each `event: progress` or `event: end` with `data:` one \
            `DatasetView` as JSON (the schema `#/components/schemas/DatasetView`); `:` comment lines keep the connection alive",
            content_type = "text/event-stream"),
        (status = 404, description = "dataset_not_found"),
        (status = 429, description = "too_many_streams"),
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
    let slot = state.progress.open_stream(&t)?;
    let rx = state.progress.subscribe(&state, &t, &id);
    // Each reading of the job's shared poll is one event; the stream ends after the
    // final one, or without an `end` event when the job is deleted.
    let stream =
        futures_util::stream::unfold((rx, slot, false), |(mut rx, slot, ended)| async move {
            if ended {
                return None;
            }
            loop {
                rx.changed().await.ok()?;
                let polled = rx.borrow_and_update().clone();
                match polled {
                    Polled::Pending => continue,
                    Polled::Gone => return None,
                    Polled::Row { json, end } => {
                        let event = Event::default()
                            .event(if end { "end" } else { "progress" })
                            .data(&*json);
                        return Some((Ok::<_, std::convert::Infallible>(event), (rx, slot, end)));
                    }
                }
            }
        });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
