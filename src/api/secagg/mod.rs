//! `/secagg/rounds`: the server side of secure aggregation. The server routes sealed
//! shares between clients, folds their masked uploads into one sum, and removes the masks
//! from revealed shares; it never sees a client's vector or a client's secrets. The
//! protocol and its wire format are in `docs/SECAGG.md`; the reference client is
//! `crate::secagg_client`.

pub mod clients;
pub mod rounds;

use super::problem::{ErrorCode, Problem};
use super::{blocking, AppState};
use crate::ops::mpc::secagg::protocol::fr_from_bytes;
use crate::ops::mpc::secagg::round::Refusal;
use crate::ops::mpc::secagg::round::Stage;
use crate::ops::mpc::secagg::unmask::{unmask_terms, PublicMember, RevealedShare};
use crate::ops::mpc::secagg::UnmaskJob;
use crate::store::{AggregationInputs, RoundError, RoundRecord};
use axum::http::HeaderMap;
use base64::Engine;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
/// The header that carries a client's (or the coordinator's) token.
pub const TOKEN_HEADER: &str = "x-secagg-token";

/// A fresh bearer token (32 bytes, base64url) and the hash the store keeps.
fn new_token() -> Result<(String, String), Problem> {
    let bytes = crate::ops::mpc::secagg::protocol::random_bytes()
        .map_err(|e| Problem::new(ErrorCode::Internal, e))?;
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let hash = token_hash(&token);
    Ok((token, hash))
}

fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The hash of the request's token; 403 when it has none.
fn presented_token(headers: &HeaderMap) -> Result<String, Problem> {
    let token = headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Problem::new(
                ErrorCode::SecaggTokenInvalid,
                format!("the {TOKEN_HEADER} header is missing"),
            )
        })?;
    Ok(token_hash(token))
}

/// 32 bytes in standard base64, at `path`.
fn decode_32(s: &str, path: &str) -> Result<[u8; 32], Problem> {
    B64.decode(s)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| {
            Problem::at(
                ErrorCode::InvalidParameter,
                path,
                "must be 32 bytes in standard base64 (44 characters)",
            )
        })
}

/// An X25519 public key: 32 bytes of base64, not one of the small-order points. Agreement
/// with such a key gives the zero secret whatever the other side's secret is, so a client
/// that registered one would make its neighbours' pair masks and sealed shares known to
/// anyone (the attack RFC 7748 §6.1 warns of).
fn x25519_key(s: &str, path: &str) -> Result<[u8; 32], Problem> {
    let key = decode_32(s, path)?;
    if crate::ops::mpc::secagg::protocol::is_low_order(&key) {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            path,
            "is a low-order X25519 point: every agreement with it is zero, so it would expose the masks and shares of its neighbours",
        ));
    }
    Ok(key)
}

/// One registered client, as every client of the round sees it.
#[derive(Serialize, ToSchema)]
pub struct RoundClientView {
    pub id: u32,
    /// X25519 public key (base64) that shares are sealed to.
    pub share_key: String,
    /// X25519 public key (base64) for pair masks.
    pub mask_key: String,
    /// SHA-256 commitment to its self-mask seed (base64), once it sent its shares.
    pub self_mask_commitment: Option<String>,
    pub shared: bool,
    pub uploaded: bool,
    pub unmasked: bool,
}

#[derive(Serialize, ToSchema)]
pub struct RoundConfigView {
    pub clients: u32,
    pub threshold: u32,
    pub neighbours: u32,
    pub vector_length: usize,
    pub clip: f64,
    pub scale_bits: u32,
    /// The ring the masked vectors live in: 32 (Z/2^32).
    pub modulus_bits: u32,
    /// 32 bytes, hex: orders the ring of the neighbourhood graph.
    pub graph_seed: String,
}

/// A round as every participant sees it: no secret is in it.
#[derive(Serialize, ToSchema)]
pub struct RoundView {
    #[schema(example = "sar_3f1c9a0d2b7e4f6a8c5d1e0f9a8b7c6d")]
    pub id: String,
    pub stage: Stage,
    /// Why the round failed, when it did.
    pub failure: Option<String>,
    pub config: RoundConfigView,
    pub clients: Vec<RoundClientView>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<RoundRecord> for RoundView {
    fn from(r: RoundRecord) -> Self {
        let c = r.config;
        Self {
            id: r.id,
            stage: r.stage,
            failure: r.failure,
            config: RoundConfigView {
                clients: c.clients,
                threshold: c.threshold,
                neighbours: c.neighbours,
                vector_length: c.vector_length,
                clip: c.clip,
                scale_bits: c.scale_bits,
                modulus_bits: 32,
                graph_seed: c.graph_seed,
            },
            clients: r
                .members
                .into_iter()
                .map(|m| RoundClientView {
                    id: m.member.id,
                    share_key: m.share_key,
                    mask_key: m.mask_key,
                    self_mask_commitment: m.self_mask_commitment,
                    shared: m.member.shared,
                    uploaded: m.member.uploaded,
                    unmasked: m.member.unmasked,
                })
                .collect(),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// The masks to remove, from what the store holds; `Err` is why the round fails.
fn terms_of(
    round_id: &str,
    inputs: &AggregationInputs,
) -> Result<Vec<crate::ops::mpc::secagg::MaskTerm>, String> {
    let stored = |what: &str| format!("a stored {what} is corrupt");
    let key = |s: &str| -> Result<[u8; 32], String> {
        B64.decode(s)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| stored("key"))
    };
    let members = inputs
        .round
        .members
        .iter()
        .map(|m| {
            Ok(PublicMember {
                id: m.member.id,
                mask_key: key(&m.mask_key)?,
                self_mask_commitment: m.self_mask_commitment.as_deref().map(key).transpose()?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let reveals = inputs
        .reveals
        .iter()
        .map(|r| {
            Ok(RevealedShare {
                owner: r.owner,
                holder: r.holder,
                secret: r.secret,
                value: fr_from_bytes(&key(&r.share)?).ok_or_else(|| stored("share"))?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    unmask_terms(
        round_id,
        &inputs.round.config,
        &inputs.round.sets(),
        &members,
        &reveals,
    )
}

/// Unmasks an aggregating round's sum and records it (or why it cannot be had). Safe to
/// run twice: only the first record sticks. Returns the round and its sum.
pub(crate) async fn aggregate(
    state: &Arc<AppState>,
    id: &str,
) -> Result<(RoundRecord, Option<Vec<u32>>), Problem> {
    let Some(_running) = Running::claim(id) else {
        return Err(Problem {
            retry_after_secs: Some(1),
            ..Problem::new(
                ErrorCode::SecaggWrongStage,
                "the round's sum is being computed: ask again shortly",
            )
        });
    };
    let store = state.store.clone();
    let round_id = id.to_string();
    let read = blocking(move || {
        match store.aggregation_inputs(&round_id) {
            Ok(inputs) => {
                let terms = terms_of(&round_id, &inputs);
                Ok(Err((inputs, terms)))
            }
            // Another request (or replica) ended the round since the caller looked.
            Err(RoundError::Refused(Refusal::WrongStage { .. })) => {
                Ok(Ok(store.round_sum(&round_id)?))
            }
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    let (inputs, terms) = match read {
        Ok(ended) => return Ok(ended),
        Err(pending) => pending,
    };
    let backend = inputs.round.config.backend;
    let outcome = match terms {
        Ok(terms) => {
            let job = UnmaskJob::new(Arc::new(inputs.sum), terms);
            Ok(state.pool.submit(job, backend, None).await?.output)
        }
        Err(why) => Err(why),
    };
    let store = state.store.clone();
    let round_id = id.to_string();
    let (round, sum) = blocking(move || {
        Ok(store.finish_round(&round_id, outcome.as_deref().map_err(|e| e.as_str()))?)
    })
    .await?;
    let event = if round.stage == Stage::Finished {
        "finished"
    } else {
        "failed"
    };
    state
        .metrics
        .secagg_rounds
        .with_label_values(&[event])
        .inc();
    Ok((round, sum))
}

/// The rounds this process is unmasking now: one computation per round, not one per
/// request that finds it aggregating. (Another replica may compute it too; the store
/// keeps the first answer.)
struct Running(String);

static RUNNING: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<String>>> =
    std::sync::LazyLock::new(Default::default);

impl Running {
    fn claim(id: &str) -> Option<Self> {
        let mut set = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        set.insert(id.to_string()).then(|| Running(id.to_string()))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// After a submission that closed the unmasking: the sum is computed in the background,
/// so the last client is not kept waiting. A failure leaves the round aggregating, and
/// the coordinator's next read of the result runs it again.
pub(super) fn aggregate_in_background(state: &Arc<AppState>, round: &RoundRecord) {
    if round.stage != Stage::Aggregating {
        return;
    }
    let (state, id) = (state.clone(), round.id.clone());
    tokio::spawn(async move {
        if let Err(p) = aggregate(&state, &id).await {
            tracing::warn!(round = %id, problem = ?p.detail, "secure aggregation left for a retry");
        }
    });
}

/// Counts an accepted submission, and the round's failure if it closed a stage short.
fn count(state: &AppState, stage: Stage, after: &RoundRecord) {
    state
        .metrics
        .secagg_submissions
        .with_label_values(&[stage.as_str()])
        .inc();
    count_failure(state, after);
}

/// A stage that closed short fails the round (the store says why).
fn count_failure(state: &AppState, after: &RoundRecord) {
    if after.stage == Stage::Failed {
        state
            .metrics
            .secagg_rounds
            .with_label_values(&["failed"])
            .inc();
    }
}

/// The secagg domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "secagg",
    description: "Secure aggregation (Bonawitz et al. 2017, SecAgg+ neighbourhoods): the server sums client vectors it never sees",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(rounds::secagg_round_create))
        .routes(routes!(rounds::secagg_round_get))
        .routes(routes!(rounds::secagg_round_advance))
        .routes(routes!(rounds::secagg_round_result))
        .routes(routes!(clients::secagg_register))
        .routes(routes!(clients::secagg_shares))
        .routes(routes!(clients::secagg_inbox))
        .routes(routes!(clients::secagg_input))
        .routes(routes!(clients::secagg_unmask))
}
