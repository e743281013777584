//! A completed dataset's files: the features as Parquet, and (for `iq_raw`) each
//! receiver's recording as SigMF.

use super::{completed, find, stored_scenario};
use crate::api::auth::{tenant, Tenant};
use crate::api::openapi::Binary;
use crate::api::problem::{ErrorCode, Problem};
use crate::api::{blocking, ApiPath, ApiQuery, AppState, IdParam};
use crate::datasets::artifacts::{LocalFiles, ReadAt};
use crate::datasets::{iq_out, parquet_out, sigmf};
use crate::store::DatasetRow;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

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
        (status = 200, description = "Parquet file", content_type = "application/vnd.apache.parquet", body = inline(Binary)),
        (status = 404, description = "dataset_not_found"),
        (status = 409, description = "dataset_not_ready: the job has not completed"),
    ),
    security((), ("bearer" = []))
)]
pub async fn dataset_features(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<Response, Problem> {
    let row = find(&state, &tenant(&who), &id).await?;
    completed(&row, "features are")?;
    let (len, body) = match state.datasets.artifacts() {
        Some(store) => {
            let (len, stream) = store
                .stream(&id, parquet_out::RESULT_FILE)
                .await
                .map_err(Problem::internal)?
                .ok_or_else(|| {
                    Problem::internal(format!(
                        "{}: the completed dataset's features are missing",
                        store.location()
                    ))
                })?;
            (Some(len), Body::from_stream(stream))
        }
        None => {
            let path = state.datasets.result_path(&id);
            let file = tokio::fs::File::open(&path)
                .await
                .map_err(|e| Problem::internal(format!("{}: {e}", path.display())))?;
            let len = file.metadata().await.map(|m| m.len()).ok();
            (
                len,
                Body::from_stream(tokio_util::io::ReaderStream::new(file)),
            )
        }
    };
    let mut res = Response::new(body);
    attachment(
        &mut res,
        "application/vnd.apache.parquet",
        &format!("{id}.parquet"),
    );
    if let Some(len) = len {
        res.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    Ok(res)
}

/// How a recording is served.
#[derive(Clone, Copy, Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IqFormat {
    /// A `.sigmf` tar of the meta and data files.
    #[default]
    Archive,
    /// The `.sigmf-meta` JSON alone.
    Meta,
    /// The `.sigmf-data` bytes alone (`cf32_le`).
    Data,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct IqQuery {
    /// `archive` (default; also when empty), `meta` or `data`.
    #[param(inline)]
    pub format: Option<IqFormat>,
}

/// `/datasets/{id}/samples/{n}/iq/{rx}`.
#[derive(Deserialize)]
pub struct SamplePath {
    id: String,
    n: u64,
    rx: u32,
}

fn sample_not_found(why: String) -> Problem {
    Problem::new(ErrorCode::SampleNotFound, why)
}

fn attachment(res: &mut Response, content_type: &'static str, filename: &str) {
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{filename}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
}

#[utoipa::path(
    get, path = "/datasets/{id}/samples/{n}/iq/{rx}", tag = "datasets", operation_id = "dataset_sample_iq",
    summary = "One receiver's recording of an iq_raw dataset, as SigMF",
    description = "Sample `n` is the dataset's row n (0-based, the order of the Parquet file); `rx` is the receiver \
        (0-based, the Parquet file's `rx{r}_*` slot). The SigMF 1.2 metadata holds the sample rate, the carrier \
        frequency, the receiver's position as `core:geolocation`, a SHA-512 of the data, and the sample's truth \
        (transmitter, this receiver, quality) under the `gpu_ops` extension namespace. The data is `cf32_le`.",
    params(
        ("id" = String, Path, description = "Dataset id"),
        ("n" = u64, Path, minimum = 0, maximum = 18446744073709551615_u64, description = "Sample row, 0-based"),
        ("rx" = u32, Path, minimum = 0, maximum = 4294967295_u64, description = "Receiver, 0-based"),
        IqQuery,
    ),
    responses(
        (status = 200, description = "By `format`: `archive`, a `.sigmf` tar; `meta`, the SigMF metadata JSON; `data`, the `cf32_le` samples",
            content((inline(Binary) = "application/x-tar"), (Object = "application/json"), (inline(Binary) = "application/octet-stream"))),
        (status = 404, description = "dataset_not_found; sample_not_found (no such row or receiver, or a feature_based dataset)"),
        (status = 409, description = "dataset_not_ready: the job has not completed"),
        (status = 422, description = "invalid_parameter: an unknown format, or `n` / `rx` not a non-negative integer in range"),
    ),
    security((), ("bearer" = []))
)]
pub async fn dataset_sample_iq(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(SamplePath { id, n, rx }): ApiPath<SamplePath>,
    ApiQuery(q): ApiQuery<IqQuery>,
) -> Result<Response, Problem> {
    let format = q.format.unwrap_or_default();
    let row = find(&state, &tenant(&who), &id).await?;
    completed(&row, "recordings are")?;
    if row.dataset_type != "iq_raw" {
        return Err(sample_not_found(
            "a feature_based dataset keeps no recordings; submit it with dataset_type iq_raw"
                .into(),
        ));
    }
    let st = state.clone();
    blocking(move || match st.datasets.artifacts() {
        Some(store) => recording_file(&store.files(&id), &row, n, rx, format),
        None => recording_file(
            &LocalFiles(&st.datasets.dataset_dir(&id)),
            &row,
            n,
            rx,
            format,
        ),
    })
    .await
}

/// Receiver `receiver`'s recording of row `sample` in `format`, as an attachment.
fn recording_file(
    dir: &dyn ReadAt,
    row: &DatasetRow,
    sample: u64,
    receiver: u32,
    format: IqFormat,
) -> Result<Response, Problem> {
    let scenario = stored_scenario(row)?;
    let entry = iq_out::entry(dir, sample)
        .map_err(Problem::internal)?
        .ok_or_else(|| {
            sample_not_found(format!(
                "the dataset has {} samples (rows 0 to {})",
                row.num_samples,
                row.num_samples.saturating_sub(1)
            ))
        })?;
    if receiver >= entry.receivers {
        return Err(sample_not_found(format!(
            "sample {sample} has {} receivers (0 to {})",
            entry.receivers,
            entry.receivers - 1
        )));
    }
    let len = crate::ops::rf::generate::samples_per_recording(&scenario);
    let data = iq_out::recording(dir, &entry, receiver, len).map_err(Problem::internal)?;
    let truth = iq_out::truth(dir, &entry).map_err(Problem::internal)?;
    let id = sigmf::RecordingId {
        origin: sigmf::Origin::Dataset {
            dataset_id: &row.id,
            sample,
        },
        seed: row.seed,
        sample_index: truth["sample_index"].as_u64().unwrap_or_default(),
        receiver,
    };
    let stem = id.stem();
    let (body, content_type, filename) = match format {
        IqFormat::Data => (
            data,
            "application/octet-stream",
            format!("{stem}.sigmf-data"),
        ),
        IqFormat::Meta | IqFormat::Archive => {
            let meta = serde_json::to_vec_pretty(&sigmf::meta(&id, &scenario, &truth, &data))
                .map_err(Problem::internal)?;
            if let IqFormat::Meta = format {
                (meta, "application/json", format!("{stem}.sigmf-meta"))
            } else {
                let tar = sigmf::archive(&stem, &meta, &data).map_err(Problem::internal)?;
                (tar, "application/x-tar", format!("{stem}.sigmf"))
            }
        }
    };
    let mut res = Response::new(Body::from(body));
    attachment(&mut res, content_type, &filename);
    res.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=86400"),
    );
    Ok(res)
}
