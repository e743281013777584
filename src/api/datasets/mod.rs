//! Synthetic RF dataset jobs: submit, follow, list, cancel, resume, delete (here), their
//! files (`files`) and their progress as server-sent events (`events`).

pub mod events;
pub mod files;
pub mod progress;

use super::auth::{tenant, Tenant};
use super::domain_errors::submit_refused;
use super::problem::{ErrorCode, Problem};
use super::{blocking, ApiJson, ApiPath, AppState, IdParam};
use crate::config::Config;
use crate::datasets::{estimate_bytes, memory};
use crate::ops::rf::generate::samples_per_recording;
use crate::ops::rf::scenario::Scenario;
use crate::store::{Counts, DatasetRow, DatasetStatus, NewDataset};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DatasetType {
    /// One Parquet row per sample: truth, quality and every receiver's features.
    FeatureBased,
    /// The same Parquet file, and every accepted sample's recordings, one SigMF
    /// recording per receiver (`/datasets/{id}/samples/{n}/iq/{rx}`).
    IqRaw,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "suburban-7rx", "num_samples": 1000, "dataset_type": "feature_based", "seed": 7,
    "config": {"propagation": {"environment": "suburban"}}}))]
pub struct CreateDatasetRequest {
    /// 1 to 200 characters once leading and trailing whitespace is trimmed.
    #[schema(pattern = r"^\s*\S([\s\S]{0,198}\S)?\s*$")]
    pub name: String,
    /// Accepted samples wanted (1 to --max-dataset-samples, at most 5,000,000).
    #[schema(minimum = 1, maximum = 5000000)]
    pub num_samples: u64,
    pub dataset_type: DatasetType,
    /// The same seed and config give the same dataset. Drawn by the server when absent
    /// (and reported).
    #[schema(minimum = 0, maximum = 9223372036854775807_u64)]
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
    /// Accepted samples recovered from the checkpoint (a resumed job, while it runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<u64>,
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
    /// For completed `iq_raw` datasets: where each recording is served, with `{n}` the
    /// sample's row (0-based) and `{rx}` its receiver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iq_url: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct DatasetList {
    pub datasets: Vec<DatasetView>,
}

impl CreateDatasetRequest {
    /// The catalog row to submit and the most bytes its files may take, or the first
    /// field the server refuses.
    fn admit(self, cfg: &Config, tenant: String) -> Result<(NewDataset, u64), Problem> {
        let name = self.name.trim().to_string();
        if name.is_empty() || name.chars().count() > 200 {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/name",
                "1 to 200 characters",
            ));
        }
        let max = cfg.max_dataset_samples;
        if self.num_samples == 0 || self.num_samples > max {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/num_samples",
                format!("must be 1 to {max} (--max-dataset-samples)"),
            ));
        }
        self.config.validate().map_err(|e| e.under("config"))?;
        let iq_raw = self.dataset_type == DatasetType::IqRaw;
        let estimate = self.estimate(cfg.max_dataset_bytes)?;
        self.fits_memory(cfg.dataset_memory_mib << 20)?;
        let work = self.work(cfg.max_tenant_dataset_work)?;
        let new = NewDataset {
            tenant,
            name,
            dataset_type: if iq_raw { "iq_raw" } else { "feature_based" }.into(),
            num_samples: self.num_samples,
            seed: self.seed()?,
            config: serde_json::to_string(&self.config).map_err(Problem::internal)?,
            work,
        };
        Ok((new, estimate))
    }

    /// Refuses a job whose one sample would not fit `budget` bytes of host memory
    /// (`--dataset-memory-mib`): no batch could hold it.
    fn fits_memory(&self, budget: u64) -> Result<(), Problem> {
        let iq_raw = self.dataset_type == DatasetType::IqRaw;
        let per_sample = memory::sample_bytes(&self.config, iq_raw);
        if memory::batch_within(per_sample, budget).is_some() {
            return Ok(());
        }
        let receivers = self.config.receiver_slots();
        let kept = if iq_raw {
            format!("{receivers} recordings kept per sample")
        } else {
            "one recording at a time".to_string()
        };
        let fits_ms = self.config.signal.duration_ms * budget as f64 / per_sample as f64;
        Err(Problem::at(
            ErrorCode::DatasetSampleTooLarge,
            "/config/signal/duration_ms",
            format!(
                "one sample holds up to {} MiB in memory ({} complex samples per recording, \
                 {kept}) and --dataset-memory-mib is {}; recordings of at most {fits_ms:.3} ms \
                 fit at this sample rate",
                memory::mib(per_sample),
                samples_per_recording(&self.config),
                memory::mib(budget)
            ),
        ))
    }

    /// `memory::work` of the job, within `limit` (`--max-tenant-dataset-work`).
    fn work(&self, limit: u64) -> Result<u64, Problem> {
        let work = memory::work(&self.config, self.num_samples);
        if work > limit {
            let fits = limit / memory::work(&self.config, 1).max(1);
            return Err(Problem::at(
                ErrorCode::DatasetWorkTooLarge,
                "/num_samples",
                format!(
                    "the job asks for {work} complex samples of synthesis and \
                     --max-tenant-dataset-work allows a tenant {limit} at once; with this config \
                     at most {fits} samples fit"
                ),
            ));
        }
        Ok(work)
    }

    /// `estimate_bytes`, within `--max-dataset-bytes`.
    fn estimate(&self, max_bytes: u64) -> Result<u64, Problem> {
        let iq_raw = self.dataset_type == DatasetType::IqRaw;
        let estimate = estimate_bytes(&self.config, iq_raw, self.num_samples);
        if estimate > max_bytes {
            let fits = max_bytes / estimate_bytes(&self.config, iq_raw, 1).max(1);
            return Err(Problem::at(
                ErrorCode::DatasetTooLarge,
                "/num_samples",
                format!(
                    "the dataset may take up to {estimate} bytes and --max-dataset-bytes allows {max_bytes}; \
                     with this config at most {fits} samples fit"
                ),
            ));
        }
        Ok(estimate)
    }

    /// The given seed, or one from OS entropy; below 2^63, as SQLite integers are signed.
    fn seed(&self) -> Result<u64, Problem> {
        crate::api::seed_or_drawn(self.seed, "/seed")
    }
}

fn view(state: &AppState, row: DatasetRow) -> DatasetView {
    let live = state.datasets.progress(&row.id);
    let counts: Counts = match &live {
        Some(p) if row.status == DatasetStatus::Running => p.counts.clone(),
        _ => row.counts.clone(),
    };
    let resumed_from = live
        .as_ref()
        .map(|p| p.resumed_from)
        .filter(|&v| v > 0 && row.status == DatasetStatus::Running);
    let (rate, eta) = match live.and_then(|p| p.started.map(|t| (t, p.resumed_from))) {
        Some((t, from)) if row.status == DatasetStatus::Running && counts.valid > from => {
            let rate = (counts.valid - from) as f64 / t.elapsed().as_secs_f64().max(1e-9);
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
        iq_url: (done && row.dataset_type == "iq_raw")
            .then(|| format!("/datasets/{}/samples/{{n}}/iq/{{rx}}", row.id)),
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
            resumed_from,
        },
        error: row.error,
        created_at: row.created_at,
        started_at: row.started_at,
        finished_at: row.finished_at,
    }
}

/// The job's scenario as the catalog stored it.
fn stored_scenario(row: &DatasetRow) -> Result<Scenario, Problem> {
    serde_json::from_str(&row.config).map_err(|e| Problem::internal(format!("stored config: {e}")))
}

/// 409 `dataset_not_ready` unless the job has completed; `what` is what it would serve.
fn completed(row: &DatasetRow, what: &str) -> Result<(), Problem> {
    if row.status == DatasetStatus::Completed {
        return Ok(());
    }
    let next = match row.status {
        DatasetStatus::Interrupted => {
            format!("POST /datasets/{}/resume continues it", row.id)
        }
        s if s.is_final() => format!("{what} never served for it: submit the job again"),
        _ => format!("{what} served once it completes"),
    };
    Err(Problem::new(
        ErrorCode::DatasetNotReady,
        format!("the job is {}; {next}", row.status.name()),
    ))
}

fn not_found() -> Problem {
    Problem::new(ErrorCode::DatasetNotFound, "no such dataset")
}

/// The tenant's job `id`, or 404 `dataset_not_found`.
async fn find(state: &Arc<AppState>, tenant: &str, id: &str) -> Result<DatasetRow, Problem> {
    let (st, t, i) = (state.clone(), tenant.to_string(), id.to_string());
    blocking(move || st.store.dataset(&t, &i).map_err(Problem::from))
        .await?
        .ok_or_else(not_found)
}

fn new_id() -> Result<String, Problem> {
    let mut b = [0u8; 12];
    getrandom::fill(&mut b).map_err(|e| Problem::internal(format!("no OS entropy: {e}")))?;
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
        thread count. Answers 202 at once; follow `status_url`. `iq_raw` also keeps every accepted sample's \
        recordings (8 bytes per complex sample per receiver). A job whose files could exceed \
        --max-dataset-bytes (422), the tenant's --max-tenant-dataset-bytes with its other datasets (422) or the \
        free disk space (507) is refused up front; the estimate is an upper bound.",
    request_body = CreateDatasetRequest,
    responses(
        (status = 202, description = "Queued", body = DatasetView, links(
            ("get" = (operation_id = "dataset_get", parameters(("id" = "$response.body#/id")))),
            ("cancel" = (operation_id = "dataset_cancel", parameters(("id" = "$response.body#/id")))),
            ("resume" = (operation_id = "dataset_resume", parameters(("id" = "$response.body#/id")))),
            ("features" = (operation_id = "dataset_features", parameters(("id" = "$response.body#/id")))),
            ("delete" = (operation_id = "dataset_delete", parameters(("id" = "$response.body#/id")))),
            ("sample_iq" = (operation_id = "dataset_sample_iq", parameters(("id" = "$response.body#/id"), ("n" = "0"), ("rx" = "0")))),
        )),
        (status = 422, description = "invalid_request, invalid_parameter (with the JSON pointer of the bad field), dataset_too_large, dataset_quota_exceeded (the tenant's datasets together would exceed --max-tenant-dataset-bytes), dataset_sample_too_large (one sample would not fit --dataset-memory-mib), dataset_work_too_large (the job alone asks for more than --max-tenant-dataset-work)"),
        (status = 429, description = "tenant_dataset_queue_full (--max-tenant-queued-datasets of the tenant's jobs wait), tenant_dataset_work_pending (the tenant's queued and running jobs would pass --max-tenant-dataset-work); Retry-After says when to try again"),
        (status = 503, description = "queue_full: --max-dataset-jobs jobs already wait"),
        (status = 507, description = "insufficient_storage: the files could outgrow the free space under --data-dir"),
    ),
    security((), ("bearer" = []))
)]
pub async fn create_dataset(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiJson(req): ApiJson<CreateDatasetRequest>,
) -> Result<Response, Problem> {
    let cfg = &state.settings.config;
    let (new, estimate) = req
        .admit(cfg, tenant(&who))
        .map_err(|p| refused(&state, p))?;
    let id = new_id()?;
    let st = state.clone();
    let row = blocking(move || {
        st.datasets
            .submit(
                &id,
                new,
                estimate,
                st.settings.config.max_tenant_dataset_bytes,
            )
            .map_err(|e| submit_refused(e, Some("/num_samples")))
    })
    .await
    .map_err(|p| refused(&state, p))?;
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
        (status = 404, description = "dataset_not_found (also for another tenant's dataset)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn get_dataset(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
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
    let rows = blocking(move || st.store.datasets(&t).map_err(Problem::from)).await?;
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
        (status = 404, description = "dataset_not_found"),
        (status = 409, description = "dataset_finished: the job has already ended"),
    ),
    security((), ("bearer" = []))
)]
pub async fn cancel_dataset(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<Response, Problem> {
    let t = tenant(&who);
    let row = find(&state, &t, &id).await?;
    let st = state.clone();
    let cancelled = !row.status.is_final()
        && blocking(move || st.datasets.cancel(&id).map_err(Problem::from)).await?;
    if !cancelled {
        return Err(Problem::new(
            ErrorCode::DatasetFinished,
            format!("the job has already ended ({})", row.status.name()),
        ));
    }
    // A queued job is cancelled already; a running one stops within a second.
    let row = find(&state, &t, &row.id).await?;
    Ok((StatusCode::ACCEPTED, Json(view(&state, row))).into_response())
}

/// Counts a submission or resume the server refused, by its code (internal errors too:
/// the job was not queued).
fn refused(state: &AppState, p: Problem) -> Problem {
    state
        .metrics
        .dataset_submissions_refused
        .with_label_values(&[p.code.as_str()])
        .inc();
    p
}

#[utoipa::path(
    post, path = "/datasets/{id}/resume", tag = "datasets", operation_id = "dataset_resume",
    summary = "Continue an interrupted job from its last checkpoint",
    description = "A job the server stopped (shutdown or crash) is `interrupted` and keeps its sealed Parquet parts, \
        recordings and checkpoint. Resuming queues it again; it continues after the last checkpoint and produces \
        the same files as an uninterrupted run. Only `interrupted` jobs can be resumed (409 otherwise).",
    params(("id" = String, Path, description = "Dataset id")),
    responses(
        (status = 202, description = "Queued again", body = DatasetView),
        (status = 404, description = "dataset_not_found"),
        (status = 409, description = "dataset_not_resumable: the job is not interrupted, or its checkpoint was written by another generator version"),
        (status = 429, description = "tenant_dataset_queue_full, tenant_dataset_work_pending: the tenant's queue share is taken; Retry-After says when to try again"),
        (status = 503, description = "queue_full"),
        (status = 507, description = "insufficient_storage: what is left of the job could outgrow the free disk"),
    ),
    security((), ("bearer" = []))
)]
pub async fn resume_dataset(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<Response, Problem> {
    let row = find(&state, &tenant(&who), &id).await?;
    let not_resumable = |status: DatasetStatus| {
        Problem::new(
            ErrorCode::DatasetNotResumable,
            format!(
                "the job is {}; only an interrupted job can be resumed",
                status.name()
            ),
        )
    };
    if row.status != DatasetStatus::Interrupted {
        return Err(not_resumable(row.status));
    }
    let scenario = stored_scenario(&row)?;
    let estimate = estimate_bytes(&scenario, row.dataset_type == "iq_raw", row.num_samples);
    let st = state.clone();
    let resumed = blocking(move || {
        st.datasets
            .resume(&row, estimate)
            .map_err(|e| submit_refused(e, None))
    })
    .await
    .map_err(|p| refused(&state, p))?;
    let row = find(&state, &tenant(&who), &id).await?;
    if !resumed {
        return Err(not_resumable(row.status));
    }
    Ok((StatusCode::ACCEPTED, Json(view(&state, row))).into_response())
}

#[utoipa::path(
    delete, path = "/datasets/{id}", tag = "datasets", operation_id = "dataset_delete",
    summary = "Delete a job and its files (cancelling it if it runs)",
    params(("id" = String, Path, description = "Dataset id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "dataset_not_found"),
    ),
    security((), ("bearer" = []))
)]
pub async fn delete_dataset(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<StatusCode, Problem> {
    let (st, t) = (state.clone(), tenant(&who));
    blocking(move || {
        if st.store.dataset(&t, &id).map_err(Problem::from)?.is_none() {
            return Err(not_found());
        }
        // Files first: a deletion that fails half-way keeps the row, so it can be retried.
        st.datasets.remove_files(&id).map_err(Problem::internal)?;
        if !st.store.delete_dataset(&t, &id).map_err(Problem::from)? {
            return Err(not_found());
        }
        Ok(StatusCode::NO_CONTENT)
    })
    .await
}

/// The datasets domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "datasets",
    description: "Synthetic RF datasets as asynchronous jobs",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(create_dataset))
        .routes(routes!(list_datasets))
        .routes(routes!(get_dataset, delete_dataset))
        .routes(routes!(cancel_dataset))
        .routes(routes!(resume_dataset))
        .routes(routes!(files::dataset_features))
        .routes(routes!(events::dataset_events))
        .routes(routes!(files::dataset_sample_iq))
}
