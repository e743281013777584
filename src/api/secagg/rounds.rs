//! The coordinator's side of a round: create it, read it, close a stage early, read the
//! sum.

use super::{aggregate, new_token, presented_token, RoundView};
use crate::api::byte_strings::ByteStringOut;
use crate::api::float_arrays::VectorOut;
use crate::api::openapi::Binary;
use crate::api::problem::{ErrorCode, Problem};
use crate::api::{blocking, bulk, json_body, AnswerForm, ApiJson, ApiPath, AppState, IdParam};
use crate::backend::BackendChoice;
use crate::ops::mpc::secagg::protocol::dequantise;
use crate::ops::mpc::secagg::round::{RoundConfig, Stage};
use crate::wire::Dtype;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"clients": 5, "threshold": 3, "vector_length": 4, "clip": 1.0, "scale_bits": 16}))]
pub struct CreateRoundRequest {
    /// n: how many clients may register (ids 1..=n).
    #[schema(minimum = 3, maximum = 1000)]
    pub clients: u32,
    /// t: shares that rebuild a client's secret. A client holds no share of its own, so
    /// each survivor needs t other survivors among its neighbours: a sum holds at least
    /// t + 1 clients. More than half of `neighbours`, at most all of them.
    #[schema(minimum = 2, maximum = 999)]
    pub threshold: u32,
    /// k: each client's neighbours (SecAgg+). clients − 1 (the default) is the original
    /// protocol, everyone with everyone; otherwise an even number, each client joined to
    /// the k/2 nearest on either side of a random ring.
    #[schema(minimum = 2, maximum = 999)]
    pub neighbours: Option<u32>,
    /// Values per client vector: at most --max-elements.
    #[schema(minimum = 1)]
    pub vector_length: usize,
    /// Clients clip each value to ±clip before quantising.
    #[schema(exclusive_minimum = 0.0)]
    pub clip: f64,
    /// Fixed-point fraction bits f: a value x is sent as round(x · 2^f) on Z/2^32.
    /// clients × round(clip · 2^f) must stay below 2^31.
    #[serde(default = "default_scale_bits")]
    #[schema(minimum = 0, maximum = 24, default = 16)]
    pub scale_bits: u32,
    /// Where the unmasking runs.
    #[serde(default)]
    pub backend: BackendChoice,
}

fn default_scale_bits() -> u32 {
    16
}

#[derive(Serialize, ToSchema)]
pub struct CreateRoundResponse {
    #[serde(flatten)]
    pub round: RoundView,
    /// The coordinator's token (send it as x-secagg-token to advance the round and read
    /// its sum). Shown once.
    pub coordinator_token: String,
}

#[utoipa::path(
    post, path = "/secagg/rounds", tag = "secagg", operation_id = "secagg_round_create",
    summary = "Open a secure-aggregation round",
    description = "Creates a round for `clients` clients at stage advertise_keys. The answer carries the \
        coordinator's token, shown once. The protocol and its wire format: docs/SECAGG.md.",
    request_body = CreateRoundRequest,
    responses(
        (status = 201, description = "Created", body = CreateRoundResponse, headers(("location" = String, description = "/secagg/rounds/{id}")),
            links(("get" = (operation_id = "secagg_round_get", parameters(("id" = "$response.body#/id")))),
                ("register" = (operation_id = "secagg_register", parameters(("id" = "$response.body#/id")))),
                ("advance" = (operation_id = "secagg_round_advance", parameters(("id" = "$response.body#/id"), ("header.x-secagg-token" = "$response.body#/coordinator_token")))),
                ("result" = (operation_id = "secagg_round_result", parameters(("id" = "$response.body#/id"), ("header.x-secagg-token" = "$response.body#/coordinator_token")))))),
        (status = 422, description = "invalid_request, invalid_parameter (clients, threshold, neighbours, vector_length, clip or scale_bits out of range, or an unmasking beyond 2^34 key-stream words)"),
        (status = 503, description = "storage_unavailable; device_unavailable (backend gpu and no usable GPU)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn secagg_round_create(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<CreateRoundRequest>,
) -> Result<Response, Problem> {
    let seed = crate::ops::mpc::secagg::protocol::random_bytes()
        .map_err(|e| Problem::new(ErrorCode::Internal, e))?;
    let config = RoundConfig {
        clients: req.clients,
        threshold: req.threshold,
        neighbours: req.neighbours.unwrap_or(req.clients.saturating_sub(1)),
        vector_length: req.vector_length,
        clip: req.clip,
        scale_bits: req.scale_bits,
        graph_seed: seed.iter().map(|b| format!("{b:02x}")).collect(),
        backend: req.backend,
    };
    config.validate(state.settings.config.max_elements)?;
    // A round outlives requests: one that could never be unmasked is refused now.
    if req.backend == BackendChoice::Gpu
        && state.backends.gpus_for("secagg_unmask").next().is_none()
    {
        return Err(Problem::new(
            ErrorCode::DeviceUnavailable,
            format!(
                "backend gpu: no usable GPU for the unmasking ({})",
                state.backends.reason()
            ),
        ));
    }
    let id_bytes = crate::ops::mpc::secagg::protocol::random_bytes()
        .map_err(|e| Problem::new(ErrorCode::Internal, e))?;
    let id = format!(
        "sar_{}",
        id_bytes[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let (token, hash) = new_token()?;
    let store = state.store.clone();
    let round = blocking(move || Ok(store.create_round(&id, &hash, &config)?)).await?;
    state
        .metrics
        .secagg_rounds
        .with_label_values(&["created"])
        .inc();
    let location =
        HeaderValue::from_str(&format!("/secagg/rounds/{}", round.id)).expect("ascii id");
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(CreateRoundResponse {
            round: round.into(),
            coordinator_token: token,
        }),
    )
        .into_response())
}

#[utoipa::path(
    get, path = "/secagg/rounds/{id}", tag = "secagg", operation_id = "secagg_round_get",
    summary = "A round's stage and its clients' public keys",
    description = "What every participant may know: the stage, the parameters, and each registered \
        client's public keys, commitment and progress. Clients poll it to learn when a stage closed.",
    params(("id" = String, Path, description = "Round id")),
    responses(
        (status = 200, description = "The round", body = RoundView),
        (status = 404, description = "secagg_round_not_found"),
        (status = 503, description = "storage_unavailable"),
    ),
    security((), ("bearer" = []))
)]
pub async fn secagg_round_get(
    State(state): State<Arc<AppState>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<Json<RoundView>, Problem> {
    let store = state.store.clone();
    blocking(move || Ok(Json(store.round(&id)?.into()))).await
}

#[utoipa::path(
    post, path = "/secagg/rounds/{id}/advance", tag = "secagg", operation_id = "secagg_round_advance",
    summary = "Close the current stage with the clients that have submitted",
    description = "A stage closes by itself once every client expected at it has submitted; the \
        coordinator closes it earlier, treating the rest as dropped. Refused (409 secagg_too_few_clients, \
        the round unchanged) when fewer than the threshold would remain, or a client's secrets could not \
        be rebuilt. Closing the unmasking starts computing the sum (stage aggregating); read it with \
        secagg_round_result.",
    params(("id" = String, Path, description = "Round id"),
        ("x-secagg-token" = String, Header, description = "The coordinator's token")),
    responses(
        (status = 200, description = "The round after the stage closed", body = RoundView),
        (status = 403, description = "secagg_token_invalid"),
        (status = 404, description = "secagg_round_not_found"),
        (status = 409, description = "secagg_too_few_clients, secagg_wrong_stage (the round has ended)"),
        (status = 503, description = "storage_unavailable"),
    ),
    security((), ("bearer" = []))
)]
pub async fn secagg_round_advance(
    State(state): State<Arc<AppState>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
    headers: HeaderMap,
) -> Result<Json<RoundView>, Problem> {
    let token = presented_token(&headers)?;
    let store = state.store.clone();
    let round_id = id.clone();
    let round = blocking(move || Ok(store.advance_round(&round_id, &token)?)).await?;
    super::aggregate_in_background(&state, &round);
    super::count_failure(&state, &round);
    Ok(Json(round.into()))
}

#[derive(Serialize, ToSchema)]
#[schema(example = json!({"id": "sar_3f1c9a0d2b7e4f6a8c5d1e0f9a8b7c6d", "clients": [1, 2, 3, 5], "dropped": [4],
    "scale_bits": 16, "sum": [0.5, -1.25], "ring_sum": "AIAAAADA//8="}))]
pub struct RoundResult {
    pub id: String,
    /// The clients whose vectors are in the sum (U3).
    pub clients: Vec<u32>,
    /// Clients that sent shares but no vector: their masks were removed, their data is not
    /// in the sum.
    pub dropped: Vec<u32>,
    pub scale_bits: u32,
    /// The sum, dequantised: each ring value read as a signed 32-bit integer over 2^f;
    /// an `f64` buffer in a bulk answer.
    #[schema(value_type = Vec<f64>)]
    pub sum: VectorOut,
    /// The sum on the ring Z/2^32, as little-endian u32 in standard base64; a `u32`
    /// buffer in a bulk answer.
    #[schema(value_type = String)]
    pub ring_sum: ByteStringOut,
}

#[utoipa::path(
    get, path = "/secagg/rounds/{id}/result", tag = "secagg", operation_id = "secagg_round_result",
    summary = "The round's sum, once unmasked",
    description = "The sum of the surviving clients' vectors and who they are; no single vector is ever \
        stored unmasked. A round still aggregating (say, after a restart) is unmasked first. 409 \
        secagg_wrong_stage before that, or with the reason the round failed.",
    params(("id" = String, Path, description = "Round id"),
        ("x-secagg-token" = String, Header, description = "The coordinator's token")),
    responses(
        (status = 200, description = "The sum", content((RoundResult = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
        (status = 403, description = "secagg_token_invalid"),
        (status = 404, description = "secagg_round_not_found"),
        (status = 409, description = "secagg_wrong_stage: not finished, or failed (the detail says why), or the sum being computed (Retry-After)"),
        (status = 503, description = "storage_unavailable; the unmasking's queue_full, device_unavailable, device_error, shutting_down (the round stays aggregating: ask again)"),
        (status = 504, description = "deadline_exceeded: the unmasking outran --job-timeout (the round stays aggregating: ask again)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn secagg_round_result(
    State(state): State<Arc<AppState>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
    headers: HeaderMap,
    form: AnswerForm,
) -> Result<Response, Problem> {
    let token = presented_token(&headers)?;
    let store = state.store.clone();
    let round_id = id.clone();
    let round = blocking(move || Ok(store.check_coordinator(&round_id, &token)?)).await?;
    let (round, sum) = match round.stage {
        Stage::Aggregating | Stage::Finished => aggregate_or_read(&state, &id, round.stage).await?,
        Stage::Failed => {
            return Err(Problem::new(
                ErrorCode::SecaggWrongStage,
                format!("the round failed: {}", round.failure.unwrap_or_default()),
            ))
        }
        other => {
            return Err(Problem::new(
                ErrorCode::SecaggWrongStage,
                format!(
                    "the round is at stage {}; its sum comes after unmasking",
                    other.as_str()
                ),
            ))
        }
    };
    let Some(sum) = sum.filter(|_| round.stage == Stage::Finished) else {
        return Err(Problem::new(
            ErrorCode::SecaggWrongStage,
            format!("the round failed: {}", round.failure.unwrap_or_default()),
        ));
    };
    let sets = round.sets();
    let f = round.config.scale_bits;
    let encode = move || {
        let hint = sum.len() * 28 + 1024;
        let body = RoundResult {
            id: round.id,
            clients: sets.uploaded.iter().copied().collect(),
            dropped: sets.shared.difference(&sets.uploaded).copied().collect(),
            scale_bits: f,
            sum: VectorOut::new(sum.iter().map(|&v| dequantise(v, f)).collect(), None),
            ring_sum: ByteStringOut {
                dtype: Dtype::U32,
                bytes: sum.iter().flat_map(|w| w.to_le_bytes()).collect(),
            },
        };
        bulk::reply(form, &body, |b| json_body(b, hint))
    };
    blocking(encode).await
}

/// A finished round's stored sum, or an aggregating round's sum computed now.
async fn aggregate_or_read(
    state: &Arc<AppState>,
    id: &str,
    stage: Stage,
) -> Result<(crate::store::RoundRecord, Option<Vec<u32>>), Problem> {
    if stage == Stage::Aggregating {
        return aggregate(state, id).await;
    }
    let store = state.store.clone();
    let id = id.to_string();
    blocking(move || Ok(store.round_sum(&id)?)).await
}
