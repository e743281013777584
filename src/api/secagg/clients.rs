//! A client's side of a round: register its keys, send its sealed shares, fetch the
//! shares sealed to it, upload its masked vector, reveal the shares the unmasking needs.
//! Every call after registration carries the client's token in x-secagg-token.

use super::{
    aggregate_in_background, count, decode_32, new_token, presented_token, x25519_key, RoundView,
    B64,
};
use crate::api::array_operands::ArrayScope;
use crate::api::byte_strings::ByteStringIn;
use crate::api::openapi::Binary;
use crate::api::problem::{ErrorCode, Problem};
use crate::api::{
    blocking, bulk, json_body, AnswerForm, ApiBody, ApiJson, ApiPath, AppState, IdParam,
};
use crate::ops::mpc::secagg::protocol::{fr_from_bytes, SHARE_CIPHERTEXT_BYTES};
use crate::ops::mpc::secagg::round::{Secret, Stage};
use crate::wire::Dtype;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// X25519 public key (32 bytes, standard base64) that neighbours seal shares to.
    #[schema(
        example = "3p7bfXt9wbTTW2HC7OQ1Nz+DQ8hbeGdNrfx+FG+IK08=",
        pattern = r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$"
    )]
    pub share_key: String,
    /// X25519 public key (32 bytes, standard base64) for pair masks; derived from the
    /// client's σ as docs/SECAGG.md says, so the server can check a rebuilt σ.
    #[schema(
        example = "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=",
        pattern = r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$"
    )]
    pub mask_key: String,
}

#[derive(Serialize, ToSchema)]
pub struct RegisterResponse {
    /// This client's id in the round (1..=clients): its Shamir point, and its name in
    /// every message.
    pub client_id: u32,
    /// Send as x-secagg-token on this client's later calls. Shown once.
    pub token: String,
    pub round: RoundView,
}

/// A client's accepted submission, and the round after it.
#[derive(Serialize, ToSchema)]
pub struct SubmissionResponse {
    pub client_id: u32,
    pub round: RoundView,
}

#[utoipa::path(
    post, path = "/secagg/rounds/{id}/keys", tag = "secagg", operation_id = "secagg_register",
    summary = "Register a client and advertise its public keys",
    description = "Stage advertise_keys. The client gets the next id and its token; the stage closes \
        when every client has registered (or the coordinator advances it).",
    params(("id" = String, Path, description = "Round id")),
    request_body = RegisterRequest,
    responses(
        (status = 201, description = "Registered", body = RegisterResponse,
            links(("inbox" = (operation_id = "secagg_inbox", parameters(("id" = "$request.path.id"), ("header.x-secagg-token" = "$response.body#/token")))),
                ("shares" = (operation_id = "secagg_shares", parameters(("id" = "$request.path.id"), ("header.x-secagg-token" = "$response.body#/token")))))),
        (status = 404, description = "secagg_round_not_found"),
        (status = 409, description = "secagg_round_full, secagg_wrong_stage"),
        (status = 422, description = "invalid_request, invalid_parameter (a key that is not 32 bytes of base64, or a low-order X25519 point, whose agreements are all zeros)"),
        (status = 503, description = "storage_unavailable"),
    ),
    security((), ("bearer" = []))
)]
pub async fn secagg_register(
    State(state): State<Arc<AppState>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
    ApiJson(req): ApiJson<RegisterRequest>,
) -> Result<Response, Problem> {
    x25519_key(&req.share_key, "/share_key")?;
    x25519_key(&req.mask_key, "/mask_key")?;
    let (token, hash) = new_token()?;
    let store = state.store.clone();
    let (client_id, round) =
        blocking(move || Ok(store.register_client(&id, &hash, &req.share_key, &req.mask_key)?))
            .await?;
    count(&state, Stage::AdvertiseKeys, &round);
    let body = RegisterResponse {
        client_id,
        token,
        round: round.into(),
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SealedShareIn {
    pub recipient: u32,
    /// ChaCha20-Poly1305 of the 72-byte share message (88 bytes, standard base64).
    #[schema(pattern = r"^[A-Za-z0-9+/]{117}[AQgw]==$")]
    pub ciphertext: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SharesRequest {
    /// SHA-256 commitment to the client's self-mask seed β (32 bytes, standard base64).
    #[schema(pattern = r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$")]
    pub self_mask_commitment: String,
    /// One sealed message to each registered neighbour, no more, no fewer.
    #[schema(max_items = 999)]
    pub messages: Vec<SealedShareIn>,
}

#[utoipa::path(
    post, path = "/secagg/rounds/{id}/shares", tag = "secagg", operation_id = "secagg_shares",
    summary = "Send this client's sealed shares to its neighbours",
    description = "Stage share_keys. One message per registered neighbour (the round's `clients` and \
        graph say which), each sealed for its recipient; the server only routes them.",
    params(("id" = String, Path, description = "Round id"),
        ("x-secagg-token" = String, Header, description = "This client's token")),
    request_body = SharesRequest,
    responses(
        (status = 200, description = "Accepted", body = SubmissionResponse),
        (status = 403, description = "secagg_token_invalid"),
        (status = 404, description = "secagg_round_not_found"),
        (status = 409, description = "secagg_wrong_stage, secagg_already_submitted"),
        (status = 422, description = "invalid_request, invalid_parameter (a recipient that is not a registered neighbour, a missing or repeated one, a ciphertext of the wrong size)"),
        (status = 503, description = "storage_unavailable"),
    ),
    security((), ("bearer" = []))
)]
pub async fn secagg_shares(
    State(state): State<Arc<AppState>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<SharesRequest>,
) -> Result<Json<SubmissionResponse>, Problem> {
    let token = presented_token(&headers)?;
    decode_32(&req.self_mask_commitment, "/self_mask_commitment")?;
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.into_iter().enumerate() {
        let ok = B64
            .decode(&m.ciphertext)
            .is_ok_and(|b| b.len() == SHARE_CIPHERTEXT_BYTES);
        if !ok {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                format!("/messages/{i}/ciphertext"),
                format!("must be {SHARE_CIPHERTEXT_BYTES} bytes in standard base64"),
            ));
        }
        messages.push((m.recipient, m.ciphertext));
    }
    let store = state.store.clone();
    let commitment = req.self_mask_commitment;
    let (client_id, round) =
        blocking(move || Ok(store.submit_shares(&id, &token, &commitment, &messages)?)).await?;
    count(&state, Stage::ShareKeys, &round);
    Ok(Json(SubmissionResponse {
        client_id,
        round: round.into(),
    }))
}

#[derive(Serialize, ToSchema)]
pub struct SealedShareOut {
    pub sender: u32,
    /// As the sender sealed it (standard base64).
    pub ciphertext: String,
}

#[derive(Serialize, ToSchema)]
pub struct InboxResponse {
    pub client_id: u32,
    /// Every message sealed to this client, by sender.
    pub messages: Vec<SealedShareOut>,
}

#[utoipa::path(
    get, path = "/secagg/rounds/{id}/inbox", tag = "secagg", operation_id = "secagg_inbox",
    summary = "The shares sealed to this client",
    description = "From stage masked_input on: the messages this client's neighbours sealed to it. The \
        senders are the neighbours whose masks it must add (their pair masks) and whose shares it may \
        have to reveal.",
    params(("id" = String, Path, description = "Round id"),
        ("x-secagg-token" = String, Header, description = "This client's token")),
    responses(
        (status = 200, description = "The messages", body = InboxResponse),
        (status = 403, description = "secagg_token_invalid"),
        (status = 404, description = "secagg_round_not_found"),
        (status = 409, description = "secagg_wrong_stage: the share stage has not closed"),
        (status = 503, description = "storage_unavailable"),
    ),
    security((), ("bearer" = []))
)]
pub async fn secagg_inbox(
    State(state): State<Arc<AppState>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
    headers: HeaderMap,
) -> Result<Json<InboxResponse>, Problem> {
    let token = presented_token(&headers)?;
    let store = state.store.clone();
    let (client_id, messages) = blocking(move || Ok(store.inbox(&id, &token)?)).await?;
    Ok(Json(InboxResponse {
        client_id,
        messages: messages
            .into_iter()
            .map(|(sender, ciphertext)| SealedShareOut { sender, ciphertext })
            .collect(),
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    /// The masked, quantised vector: `vector_length` little-endian u32 in standard base64;
    /// in the bulk form a `u32` buffer; or a resident array of kind bytes holding them
    /// (`{"array": id}`).
    #[schema(value_type = MaskedVectorDoc)]
    pub masked: ByteStringIn,
}

/// Schema of `masked`: base64 of whole little-endian u32 words, or a resident array of
/// kind bytes holding them.
pub struct MaskedVectorDoc;

impl utoipa::PartialSchema for MaskedVectorDoc {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Ref, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some("Standard base64 of little-endian u32 words"))
                    .pattern(Some(
                        r"^(?:[A-Za-z0-9+/]{16})*(?:[A-Za-z0-9+/]{5}[AQgw]==|[A-Za-z0-9+/]{10}[AEIMQUYcgkosw048]=)?$",
                    )),
            )
            .item(Ref::from_schema_name("ArrayRefDoc"))
            .into()
    }
}

crate::api::array_operands::names_array_ref!(MaskedVectorDoc);

#[utoipa::path(
    post, path = "/secagg/rounds/{id}/inputs", tag = "secagg", operation_id = "secagg_input",
    summary = "Upload this client's masked vector",
    description = "Stage masked_input, for clients that sent their shares. The vector is added to the \
        round's running sum in the same transaction that records the upload; it is not kept on its own \
        (the first upload is the sum until the second arrives).",
    params(("id" = String, Path, description = "Round id"),
        ("x-secagg-token" = String, Header, description = "This client's token")),
    request_body(content((InputRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "Accepted", body = SubmissionResponse),
        (status = 403, description = "secagg_token_invalid"),
        (status = 404, description = "secagg_round_not_found"),
        (status = 409, description = "secagg_wrong_stage (also for a client that sent no shares), secagg_already_submitted"),
        (status = 413, description = "payload_too_large"),
        (status = 422, description = "invalid_request, invalid_parameter (not base64 of whole words, or not vector_length of them), \
            unknown_array, array_mismatch (masked naming an array that is not bytes)"),
        (status = 503, description = "storage_unavailable"),
    ),
    security((), ("bearer" = []))
)]
pub async fn secagg_input(
    State(state): State<Arc<AppState>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
    headers: HeaderMap,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<InputRequest>,
) -> Result<Response, Problem> {
    let token = presented_token(&headers)?;
    req.masked.resolve(&arrays, "/masked")?;
    let store = state.store.clone();
    // Always off the async threads: the store's clients block.
    let (client_id, round) = blocking(move || {
        let bytes = req
            .masked
            .bytes(Dtype::U32, ErrorCode::InvalidParameter, "/masked")?;
        // What is wrong with a resident vector is wrong with the array it names.
        let at = match req.masked {
            ByteStringIn::Resident(_) => "/masked/array",
            _ => "/masked",
        };
        if bytes.len() % 4 != 0 {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                at,
                "must be little-endian u32 words in standard base64",
            ));
        }
        let words: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        store.submit_input(&id, &token, &words).map_err(|e| {
            let mut p = Problem::from(e);
            for issue in p.errors.iter_mut().filter(|i| i.path == "/masked") {
                issue.path = at.to_string();
            }
            p
        })
    })
    .await?;
    count(&state, Stage::MaskedInput, &round);
    let body = SubmissionResponse {
        client_id,
        round: round.into(),
    };
    bulk::reply(form, &body, |b| json_body(b, 1024))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevealedShareIn {
    /// Whose secret this is a share of.
    pub owner: u32,
    /// self_mask for a client that uploaded, mask_key for one that did not.
    pub secret: Secret,
    /// The share (a BN254 scalar, 32 bytes little-endian, standard base64), as the owner
    /// sealed it to this client.
    #[schema(pattern = r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$")]
    pub share: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UnmaskRequest {
    /// One share for each neighbour that sent its shares: exactly those, each once.
    #[schema(max_items = 999)]
    pub shares: Vec<RevealedShareIn>,
}

#[utoipa::path(
    post, path = "/secagg/rounds/{id}/unmask", tag = "secagg", operation_id = "secagg_unmask",
    summary = "Reveal the shares that remove the masks",
    description = "Stage unmasking, for clients that uploaded. For each neighbour that sent its shares: \
        its self_mask share if it uploaded, its mask_key share if not; a share of the other kind is \
        refused, so no client's two secrets are both revealed. When every uploader has answered, the sum \
        is computed in the background.",
    params(("id" = String, Path, description = "Round id"),
        ("x-secagg-token" = String, Header, description = "This client's token")),
    request_body = UnmaskRequest,
    responses(
        (status = 200, description = "Accepted", body = SubmissionResponse),
        (status = 403, description = "secagg_token_invalid"),
        (status = 404, description = "secagg_round_not_found"),
        (status = 409, description = "secagg_wrong_stage (also for a client that did not upload), secagg_already_submitted"),
        (status = 422, description = "invalid_request, invalid_parameter (an owner not owed, the wrong secret, a missing or repeated owner, a share that is not a canonical scalar)"),
        (status = 503, description = "storage_unavailable"),
    ),
    security((), ("bearer" = []))
)]
pub async fn secagg_unmask(
    State(state): State<Arc<AppState>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<UnmaskRequest>,
) -> Result<Json<SubmissionResponse>, Problem> {
    let token = presented_token(&headers)?;
    let mut reveals = Vec::with_capacity(req.shares.len());
    for (i, s) in req.shares.into_iter().enumerate() {
        let path = format!("/shares/{i}/share");
        let bytes = decode_32(&s.share, &path)?;
        if fr_from_bytes(&bytes).is_none() {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                path,
                "not a canonical BN254 scalar (little-endian, below r)",
            ));
        }
        reveals.push((s.owner, s.secret, s.share));
    }
    let store = state.store.clone();
    let (client_id, round) =
        blocking(move || Ok(store.submit_reveals(&id, &token, &reveals)?)).await?;
    count(&state, Stage::Unmasking, &round);
    aggregate_in_background(&state, &round);
    Ok(Json(SubmissionResponse {
        client_id,
        round: round.into(),
    }))
}
