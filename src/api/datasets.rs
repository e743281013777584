//! Synthetic RF dataset jobs: submit, follow, list, cancel, delete, download.

use super::auth::{tenant, Tenant};
use super::problem::{ErrorCode, Problem, ProblemDocument};
use super::{blocking, ApiJson, AppState};
use crate::datasets::SubmitError;
use crate::ops::rf::scenario::Scenario;
use crate::store::{Counts, DatasetRow, DatasetStatus, NewDataset};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DatasetType {
    /// One Parquet row per sample: truth, quality and every receiver's features.
    FeatureBased,
    /// Raw IQ per receiver as SigMF (not served yet: refused with 422).
    IqRaw,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "suburban-7rx", "num_samples": 1000, "dataset_type": "feature_based", "seed": 7,
    "config": {"propagation": {"environment": "suburban"}}}))]
pub struct CreateDatasetRequest {
    /// 1 to 200 characters.
    pub name: String,
    /// Accepted samples wanted (1 to --max-dataset-samples, at most 5,000,000).
    #[schema(minimum = 1, maximum = 5000000)]
    pub num_samples: u64,
    pub dataset_type: DatasetType,
    /// The same seed and config give the same dataset. Drawn by the server when absent
    /// (and reported).
    pub seed: Option<u64>,
    /// Every model parameter, each with its default (docs/RF_DATASETS.md).
    #[serde(default)]
    pub config: Scenario,
}

/// Samples accepted, attempted, rejected by reason, and the rate so far.
#[derive(Serialize, ToSchema)]
pub struct DatasetProgress {
    pub valid: u64,
    pub attempted: u64,
    pub target: u64,
    pub rejected: RejectedCounts,
    /// Accepted samples per second since the job started (running jobs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_s: Option<f64>,
    /// Seconds left at that rate (running jobs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_s: Option<f64>,
}

#[derive(Serialize, ToSchema)]
pub struct RejectedCounts {
    pub too_few_receivers: u64,
    pub low_snr: u64,
    pub high_gdop: u64,
}

#[derive(Serialize, ToSchema)]
pub struct DatasetView {
    pub id: String,
    pub name: String,
    pub status: DatasetStatus,
    pub dataset_type: DatasetType,
    pub num_samples: u64,
    pub seed: u64,
    pub progress: DatasetProgress,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    pub status_url: String,
    /// Where the Parquet file is served once completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features_url: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct DatasetList {
    pub datasets: Vec<DatasetView>,
}

fn view(state: &AppState, row: DatasetRow) -> DatasetView {
    let live = state.datasets.progress(&row.id);
    let counts: Counts = match &live {
        Some(p) if row.status == DatasetStatus::Running => p.counts.clone(),
        _ => row.counts.clone(),
    };
    let (rate, eta) = match live.and_then(|p| p.started) {
        Some(t) if row.status == DatasetStatus::Running && counts.valid > 0 => {
            let rate = counts.valid as f64 / t.elapsed().as_secs_f64().max(1e-9);
            (
                Some(rate),
                Some(row.num_samples.saturating_sub(counts.valid) as f64 / rate),
            )
        }
        _ => (None, None),
    };
    let done = row.status == DatasetStatus::Completed;
    DatasetView {
        status_url: format!("/datasets/{}", row.id),
        features_url: done.then(|| format!("/datasets/{}/features", row.id)),
        id: row.id,
        name: row.name,
        status: row.status,
        dataset_type: if row.dataset_type == "iq_raw" {
            DatasetType::IqRaw
        } else {
            DatasetType::FeatureBased
        },
        num_samples: row.num_samples,
        seed: row.seed,
        progress: DatasetProgress {
            valid: counts.valid,
            attempted: counts.attempted,
            target: row.num_samples,
            rejected: RejectedCounts {
                too_few_receivers: counts.rejected_too_few_receivers,
                low_snr: counts.rejected_low_snr,
                high_gdop: counts.rejected_high_gdop,
            },
            rate_per_s: rate,
            eta_s: eta,
        },
        error: row.error,
        created_at: row.created_at,
        started_at: row.started_at,
        finished_at: row.finished_at,
    }
}

fn storage(e: String) -> Problem {
    Problem::new(ErrorCode::Internal, e)
}

fn not_found() -> Problem {
    Problem::new(ErrorCode::DatasetNotFound, "no such dataset")
}

/// The tenant's job `id`, or 404 `dataset_not_found`.
async fn find(state: &Arc<AppState>, tenant: &str, id: &str) -> Result<DatasetRow, Problem> {
    let (st, t, i) = (state.clone(), tenant.to_string(), id.to_string());
    blocking(move || st.store.dataset(&t, &i).map_err(storage))
        .await?
        .ok_or_else(not_found)
}

fn new_id() -> Result<String, Problem> {
    let mut b = [0u8; 12];
    getrandom::fill(&mut b).map_err(|e| storage(format!("no OS entropy: {e}")))?;
    Ok(format!(
        "ds_{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    ))
}

#[utoipa::path(
    post, path = "/datasets/synthetic", tag = "datasets", operation_id = "dataset_create",
    summary = "Start a synthetic RF dataset job",
    description = "Queues a job that generates samples (one transmitter, several receivers, one IQ recording each; \
        docs/RF_DATASETS.md), extracts every receiver's features, and keeps the first `num_samples` that pass \
        `config.quality`, in sample-index order: the same seed and config give the same dataset whatever the \
        thread count. Answers 202 at once; follow `status_url`. Only `feature_based` is served so far.",
    request_body = CreateDatasetRequest,
    responses(
        (status = 202, description = "Queued", body = DatasetView),
        (status = 422, description = "invalid_request, invalid_parameter (with the JSON pointer of the bad field)", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 503, description = "queue_full: --max-dataset-jobs jobs already wait", body = ProblemDocument, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn create_dataset(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiJson(req): ApiJson<CreateDatasetRequest>,
) -> Result<Response, Problem> {
    let name = req.name.trim().to_string();
    if name.is_empty() || name.chars().count() > 200 {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/name",
            "1 to 200 characters",
        ));
    }
    let max = state.settings.config.max_dataset_samples;
    if req.num_samples == 0 || req.num_samples > max {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/num_samples",
            format!("must be 1 to {max} (--max-dataset-samples)"),
        ));
    }
    if req.dataset_type == DatasetType::IqRaw {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/dataset_type",
            "iq_raw datasets (SigMF per receiver) are not served yet; use feature_based",
        ));
    }
    req.config
        .validate()
        .map_err(|(path, why)| Problem::at(ErrorCode::InvalidParameter, path, why))?;
    let seed = match req.seed {
        Some(s) => s,
        None => {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).map_err(|e| storage(format!("no OS entropy: {e}")))?;
            u64::from_le_bytes(b) >> 1 // SQLite integers are signed
        }
    };
    if seed > i64::MAX as u64 {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/seed",
            "must be below 2^63",
        ));
    }
    let config = serde_json::to_string(&req.config).map_err(|e| storage(e.to_string()))?;
    let new = NewDataset {
        tenant: tenant(&who),
        name,
        dataset_type: "feature_based".into(),
        num_samples: req.num_samples,
        seed,
        config,
    };
    let id = new_id()?;
    let st = state.clone();
    let row = blocking(move || {
        st.datasets.submit(&id, new).map_err(|e| match e {
            SubmitError::QueueFull(_) => Problem {
                retry_after_secs: Some(60),
                ..Problem::new(ErrorCode::QueueFull, e.to_string())
            },
            SubmitError::Storage(m) => storage(m),
        })
    })
    .await?;
    let v = view(&state, row);
    let location = HeaderValue::from_str(&v.status_url).expect("ascii id");
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(v),
    )
        .into_response())
}

#[utoipa::path(
    get, path = "/datasets/{id}", tag = "datasets", operation_id = "dataset_get",
    summary = "A dataset job's status and progress",
    params(("id" = String, Path, description = "Dataset id")),
    responses(
        (status = 200, description = "The job", body = DatasetView),
        (status = 404, description = "dataset_not_found (also for another tenant's dataset)", body = ProblemDocument, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn get_dataset(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    Path(id): Path<String>,
) -> Result<Json<DatasetView>, Problem> {
    let row = find(&state, &tenant(&who), &id).await?;
    Ok(Json(view(&state, row)))
}

#[utoipa::path(
    get, path = "/datasets", tag = "datasets", operation_id = "dataset_list",
    summary = "This tenant's dataset jobs, oldest first",
    responses((status = 200, description = "The jobs", body = DatasetList)),
    security((), ("bearer" = []))
)]
pub async fn list_datasets(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
) -> Result<Json<DatasetList>, Problem> {
    let (st, t) = (state.clone(), tenant(&who));
    let rows = blocking(move || st.store.datasets(&t).map_err(storage)).await?;
    Ok(Json(DatasetList {
        datasets: rows.into_iter().map(|r| view(&state, r)).collect(),
    }))
}

#[utoipa::path(
    post, path = "/datasets/{id}/cancel", tag = "datasets", operation_id = "dataset_cancel",
    summary = "Stop a queued or running job",
    description = "The job ends as `cancelled` and keeps no partial file. Cancelling a finished job is 409.",
    params(("id" = String, Path, description = "Dataset id")),
    responses(
        (status = 202, description = "Cancellation requested; the status turns `cancelled` shortly", body = DatasetView),
        (status = 404, description = "dataset_not_found", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 409, description = "dataset_finished: the job has already ended", body = ProblemDocument, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn cancel_dataset(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let row = find(&state, &tenant(&who), &id).await?;
    if row.status.is_final() || !state.datasets.cancel(&id) {
        return Err(Problem::new(
            ErrorCode::DatasetFinished,
            format!("the job has already ended ({})", row.status.name()),
        ));
    }
    Ok((StatusCode::ACCEPTED, Json(view(&state, row))).into_response())
}

#[utoipa::path(
    delete, path = "/datasets/{id}", tag = "datasets", operation_id = "dataset_delete",
    summary = "Delete a job and its files (cancelling it if it runs)",
    params(("id" = String, Path, description = "Dataset id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "dataset_not_found", body = ProblemDocument, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn delete_dataset(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    Path(id): Path<String>,
) -> Result<StatusCode, Problem> {
    let (st, t) = (state.clone(), tenant(&who));
    blocking(move || {
        if !st.store.delete_dataset(&t, &id).map_err(storage)? {
            return Err(not_found());
        }
        st.datasets.remove_files(&id);
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

#[utoipa::path(
    get, path = "/datasets/{id}/features", tag = "datasets", operation_id = "dataset_features",
    summary = "The completed dataset as Parquet",
    description = "One row per accepted sample, in sample-index order: `sample_index`, transmitter truth \
        (`tx_lat`, `tx_lon`, `tx_alt_m`, `tx_power_dbm`, `tx_modulation`, `tx_inside`), quality (`receivers`, \
        `receivers_detected`, `mean_snr_db`, `gdop`), and per receiver slot r its truth (`rx{r}_lat`, …, \
        `rx{r}_rms_delay_spread_us`) and every feature's statistics (`rx{r}_{feature}_{mean|std|min|max}`), \
        null where a sample has fewer receivers. Snappy-compressed.",
    params(("id" = String, Path, description = "Dataset id")),
    responses(
        (status = 200, description = "Parquet file", content_type = "application/vnd.apache.parquet"),
        (status = 404, description = "dataset_not_found", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 409, description = "dataset_not_ready: the job has not completed", body = ProblemDocument, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn dataset_features(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let row = find(&state, &tenant(&who), &id).await?;
    if row.status != DatasetStatus::Completed {
        return Err(Problem::new(
            ErrorCode::DatasetNotReady,
            format!(
                "the job is {}; features are served once it completes",
                row.status.name()
            ),
        ));
    }
    let path = state.datasets.result_path(&id);
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| storage(format!("{}: {e}", path.display())))?;
    let len = file.metadata().await.map(|m| m.len()).ok();
    let stream = tokio_util::io::ReaderStream::new(file);
    let mut res = Response::new(Body::from_stream(stream));
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.apache.parquet"),
    );
    if let Some(len) = len {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    let disposition = format!("attachment; filename=\"{id}.parquet\"");
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(res)
}

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
        (status = 200, description = "text/event-stream of DatasetView JSON", content_type = "text/event-stream"),
        (status = 404, description = "dataset_not_found", body = ProblemDocument, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn dataset_events(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    Path(id): Path<String>,
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
