//! The round's state machine, as pure functions of its members: who may submit at which
//! stage, what each submission must contain, when a stage closes, and what the server
//! must rebuild to unmask. The store runs these inside one transaction per request.
//!
//! Stages (Bonawitz et al.'s rounds 0, 1, 2 and 4; the consistency check of round 3
//! defends against an actively malicious server and is not run, see `docs/SECURITY.md`):
//! 1. `advertise_keys`: clients register two X25519 public keys; U1 is who registered.
//! 2. `share_keys`: each client of U1 sends every neighbour in U1 its shares of σ and β,
//!    sealed for that neighbour; U2 is who did.
//! 3. `masked_input`: each client of U2 uploads its masked, quantised vector; U3.
//! 4. `unmasking`: each client of U3 reveals, for each neighbour in U2, the share of β
//!    (a survivor, in U3) or of σ (a dropout, in U2 \ U3), never both.
//! 5. `aggregating`, then `finished` (the sum) or `failed` (why).

use super::protocol::Graph;
use crate::ops::invalid::{FieldPath, Invalid};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Most clients in one round.
pub const MAX_CLIENTS: u32 = 1000;
/// Most fractional bits of the fixed-point encoding.
pub const MAX_SCALE_BITS: u32 = 24;
/// Most key-stream words one unmasking may expand (64 GiB of ChaCha20: about half a
/// minute on two cores at the rates of docs/PERFORMANCE.md), in the worst case of
/// dropouts. Round creation refuses parameters beyond it.
pub const MAX_UNMASK_WORDS: u64 = 1 << 34;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    AdvertiseKeys,
    ShareKeys,
    MaskedInput,
    Unmasking,
    Aggregating,
    Finished,
    Failed,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::AdvertiseKeys => "advertise_keys",
            Stage::ShareKeys => "share_keys",
            Stage::MaskedInput => "masked_input",
            Stage::Unmasking => "unmasking",
            Stage::Aggregating => "aggregating",
            Stage::Finished => "finished",
            Stage::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Stage::AdvertiseKeys,
            Stage::ShareKeys,
            Stage::MaskedInput,
            Stage::Unmasking,
            Stage::Aggregating,
            Stage::Finished,
            Stage::Failed,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }
}

/// A round's fixed parameters, as stored and as answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundConfig {
    /// n: the ids are 1..=n.
    pub clients: u32,
    /// t: shares needed to rebuild a client's secret. No client holds a share of its
    /// own, so a sum holds at least t + 1 clients.
    pub threshold: u32,
    /// k: each client's neighbours (n − 1: everyone).
    pub neighbours: u32,
    pub vector_length: usize,
    pub clip: f64,
    pub scale_bits: u32,
    /// 32 bytes, hex: the seed of the neighbourhood graph's ring order.
    pub graph_seed: String,
    /// Where the unmasking runs.
    #[serde(default)]
    pub backend: crate::backend::BackendChoice,
}

impl RoundConfig {
    /// The bounds of `docs/SECAGG.md`; paths are the create request's fields.
    pub fn validate(&self, max_elements: usize) -> Result<(), Invalid> {
        let (n, t, k) = (self.clients, self.threshold, self.neighbours);
        if !(3..=MAX_CLIENTS).contains(&n) {
            return Err(Invalid::field(
                "clients",
                format!("must be between 3 and {MAX_CLIENTS}"),
            ));
        }
        if k < 2 || k > n - 1 || (k < n - 1 && k % 2 == 1) {
            return Err(Invalid::field(
                "neighbours",
                format!(
                    "must be clients − 1 ({}) or an even number from 2 below it",
                    n - 1
                ),
            ));
        }
        if t < 2 || t > k || 2 * t <= k {
            return Err(Invalid::field(
                "threshold",
                format!(
                    "must be more than half the neighbours and at most all of them: {} to {k}",
                    k / 2 + 1
                ),
            ));
        }
        if self.vector_length == 0 || self.vector_length > max_elements {
            return Err(Invalid::field(
                "vector_length",
                format!("must be between 1 and {max_elements} (--max-elements)"),
            ));
        }
        if !(self.clip.is_finite() && self.clip > 0.0) {
            return Err(Invalid::field("clip", "must be a positive finite number"));
        }
        if self.scale_bits > MAX_SCALE_BITS {
            return Err(Invalid::field(
                "scale_bits",
                format!("must be at most {MAX_SCALE_BITS}"),
            ));
        }
        let bound = super::protocol::quantised_bound(self.clip, self.scale_bits);
        if bound < 1.0 {
            return Err(Invalid::field(
                "clip",
                "rounds to zero at this scale: raise clip or scale_bits",
            ));
        }
        if bound * f64::from(n) > f64::from(i32::MAX) {
            return Err(Invalid::field(
                "clip",
                format!(
                    "clients × round(clip · 2^scale_bits) = {n} × {bound} must stay below 2^31, \
                     so the sum cannot wrap the ring Z/2^32"
                ),
            ));
        }
        let worst = self.worst_case_masks();
        if worst.saturating_mul(self.vector_length as u64) > MAX_UNMASK_WORDS {
            return Err(Invalid::field(
                "vector_length",
                format!(
                    "the unmasking could expand up to {worst} masks (every survivor's self-mask, \
                     and the pair masks of up to clients − threshold − 1 dropouts with each \
                     neighbour) of vector_length words: at most 2^34 words in all, so at most \
                     {} values for these clients, neighbours and threshold",
                    MAX_UNMASK_WORDS / worst
                ),
            ));
        }
        Ok(())
    }

    /// The most masks an unmasking can take: n self-masks, and k pair masks for each of
    /// the most clients that can drop before uploading while t + 1 survive.
    pub fn worst_case_masks(&self) -> u64 {
        let (n, t, k) = (
            u64::from(self.clients),
            u64::from(self.threshold),
            u64::from(self.neighbours),
        );
        n + n.saturating_sub(t + 1) * k
    }

    pub fn graph(&self) -> Graph {
        // The server writes the seed at creation; a stored one is always well formed.
        let seed = super::protocol::graph_seed_bytes(&self.graph_seed).unwrap_or([0; 32]);
        Graph::new(self.clients, self.neighbours, &seed)
    }
}

/// One registered client: what it has done so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Member {
    pub id: u32,
    pub shared: bool,
    pub uploaded: bool,
    pub unmasked: bool,
}

/// Why a request does not fit the round as it stands.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Refusal {
    #[error("the round is at stage {stage}; this request belongs to {expected}")]
    WrongStage {
        stage: &'static str,
        expected: &'static str,
    },
    #[error("client {client} already submitted at stage {stage}")]
    AlreadySubmitted { client: u32, stage: &'static str },
    #[error("all {clients} clients have registered")]
    Full { clients: u32 },
    #[error("{0}")]
    TooFew(String),
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// Which secret of an owner a holder reveals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Secret {
    /// σ: rebuilds a dropout's mask key, to remove its pair masks.
    MaskKey,
    /// β: rebuilds a survivor's self-mask.
    SelfMask,
}

impl Secret {
    pub fn as_str(self) -> &'static str {
        match self {
            Secret::MaskKey => "mask_key",
            Secret::SelfMask => "self_mask",
        }
    }
}

/// The members by stage: U1 (registered), U2 (shared), U3 (uploaded), U4 (unmasked).
pub struct Sets {
    pub registered: BTreeSet<u32>,
    pub shared: BTreeSet<u32>,
    pub uploaded: BTreeSet<u32>,
    pub unmasked: BTreeSet<u32>,
}

impl Sets {
    pub fn of(members: &[Member]) -> Self {
        let pick = |f: fn(&Member) -> bool| members.iter().filter(|m| f(m)).map(|m| m.id).collect();
        Self {
            registered: members.iter().map(|m| m.id).collect(),
            shared: pick(|m| m.shared),
            uploaded: pick(|m| m.uploaded),
            unmasked: pick(|m| m.unmasked),
        }
    }

    /// The secrets the server must rebuild: β of every survivor, σ of every client that
    /// shared and then did not upload.
    pub fn needed(&self) -> Vec<(u32, Secret)> {
        self.shared
            .iter()
            .map(|&id| {
                let kind = if self.uploaded.contains(&id) {
                    Secret::SelfMask
                } else {
                    Secret::MaskKey
                };
                (id, kind)
            })
            .collect()
    }

    /// What `holder` must reveal: one share for each neighbour in U2.
    pub fn reveals_of(&self, graph: &Graph, holder: u32) -> BTreeMap<u32, Secret> {
        self.needed()
            .into_iter()
            .filter(|&(owner, _)| graph.are_neighbours(owner, holder))
            .collect()
    }
}

/// Where the share messages of `sender` must go: its neighbours in U1.
pub fn share_recipients(graph: &Graph, sets: &Sets, sender: u32) -> Vec<u32> {
    graph
        .neighbours(sender)
        .into_iter()
        .filter(|v| sets.registered.contains(v))
        .collect()
}

/// Checks that a stage may close now, and gives the next one. The store closes a stage
/// when every client expected at it has submitted (then a shortfall can no longer be
/// made up, and the round fails), or when the coordinator asks (then a shortfall is
/// refused and the round waits).
pub fn close(config: &RoundConfig, stage: Stage, sets: &Sets) -> Result<Stage, Refusal> {
    let t = config.threshold as usize;
    let graph = config.graph();
    let too_few = |what: &str, have: usize| {
        Refusal::TooFew(format!(
            "{have} clients {what}, and the threshold is {t}: closing now would leave a client's \
             secrets unrecoverable, or reveal a sum of too few clients"
        ))
    };
    match stage {
        Stage::AdvertiseKeys => {
            for &id in &sets.registered {
                let have = share_recipients(&graph, sets, id).len();
                if have < t {
                    return Err(Refusal::TooFew(format!(
                        "client {id} has {have} registered neighbours and the threshold is {t}: \
                         its secrets could not be rebuilt"
                    )));
                }
            }
            if sets.registered.len() < t {
                return Err(too_few("registered", sets.registered.len()));
            }
            Ok(Stage::ShareKeys)
        }
        Stage::ShareKeys => {
            if sets.shared.len() < t {
                return Err(too_few("sent their shares", sets.shared.len()));
            }
            // Only clients that shared can upload and later reveal: each needs t of them
            // among its neighbours, or its secrets could never be rebuilt.
            for &id in &sets.shared {
                let holders = graph
                    .neighbours(id)
                    .into_iter()
                    .filter(|h| sets.shared.contains(h))
                    .count();
                if holders < t {
                    return Err(Refusal::TooFew(format!(
                        "client {id} has {holders} neighbours among the clients that sent their \
                         shares and the threshold is {t}: its secrets could not be rebuilt"
                    )));
                }
            }
            Ok(Stage::MaskedInput)
        }
        Stage::MaskedInput => {
            if sets.uploaded.len() < t {
                return Err(too_few("uploaded", sets.uploaded.len()));
            }
            // Every secret to rebuild needs t holders still present.
            for (owner, kind) in sets.needed() {
                let holders = graph
                    .neighbours(owner)
                    .into_iter()
                    .filter(|h| sets.uploaded.contains(h))
                    .count();
                if holders < t {
                    return Err(Refusal::TooFew(format!(
                        "client {owner}'s {} has {holders} holders among the uploaders and the \
                         threshold is {t}",
                        kind.as_str()
                    )));
                }
            }
            Ok(Stage::Unmasking)
        }
        Stage::Unmasking => {
            for (owner, kind) in sets.needed() {
                let revealed = graph
                    .neighbours(owner)
                    .into_iter()
                    .filter(|h| sets.unmasked.contains(h))
                    .count();
                if revealed < t {
                    return Err(Refusal::TooFew(format!(
                        "{revealed} shares of client {owner}'s {} have been revealed and the \
                         threshold is {t}",
                        kind.as_str()
                    )));
                }
            }
            Ok(Stage::Aggregating)
        }
        other => Err(Refusal::WrongStage {
            stage: other.as_str(),
            expected: "a stage that clients submit to",
        }),
    }
}

/// Whether every client expected at `stage` has submitted.
pub fn everyone_submitted(config: &RoundConfig, stage: Stage, sets: &Sets) -> bool {
    match stage {
        Stage::AdvertiseKeys => sets.registered.len() == config.clients as usize,
        Stage::ShareKeys => sets.shared == sets.registered,
        Stage::MaskedInput => sets.uploaded == sets.shared,
        Stage::Unmasking => sets.unmasked == sets.uploaded,
        _ => false,
    }
}

/// Refuses a submission outside its stage.
pub fn expect_stage(stage: Stage, expected: Stage) -> Result<(), Refusal> {
    if stage == expected {
        Ok(())
    } else {
        Err(Refusal::WrongStage {
            stage: stage.as_str(),
            expected: expected.as_str(),
        })
    }
}

/// Checks a client's share messages go exactly to its neighbours in U1, once each.
/// `recipients` are in request order; errors point at `/messages/{i}/recipient`.
pub fn check_recipients(expected: &[u32], recipients: &[u32]) -> Result<(), Invalid> {
    let at = |i: usize| {
        FieldPath::root()
            .field("messages")
            .index(i)
            .field("recipient")
    };
    let mut seen = BTreeSet::new();
    for (i, r) in recipients.iter().enumerate() {
        if !expected.contains(r) {
            return Err(Invalid::new(
                at(i),
                format!("client {r} is not a registered neighbour of this client: send to exactly {expected:?}"),
            ));
        }
        if !seen.insert(*r) {
            return Err(Invalid::new(
                at(i),
                format!("a second message to client {r}"),
            ));
        }
    }
    if seen.len() != expected.len() {
        let missing: Vec<u32> = expected
            .iter()
            .filter(|r| !seen.contains(r))
            .copied()
            .collect();
        return Err(Invalid::field(
            "messages",
            format!("no message to clients {missing:?}: send to exactly {expected:?}"),
        ));
    }
    Ok(())
}

/// Checks a holder's reveals are exactly what it owes (`reveals_of`): the right kind for
/// each owner, every owner once. Errors point at `/shares/{i}/...`.
pub fn check_reveals(owed: &BTreeMap<u32, Secret>, given: &[(u32, Secret)]) -> Result<(), Invalid> {
    let at = |i: usize, f: &'static str| FieldPath::root().field("shares").index(i).field(f);
    let mut seen = BTreeSet::new();
    for (i, (owner, kind)) in given.iter().enumerate() {
        match owed.get(owner) {
            None => {
                return Err(Invalid::new(
                    at(i, "owner"),
                    format!("no share of client {owner} is owed by this client"),
                ))
            }
            Some(want) if want != kind => {
                return Err(Invalid::new(
                    at(i, "secret"),
                    format!(
                        "client {owner} needs its {} share, not {}: a client's two secrets are \
                         never both revealed",
                        want.as_str(),
                        kind.as_str()
                    ),
                ))
            }
            _ => {}
        }
        if !seen.insert(*owner) {
            return Err(Invalid::new(
                at(i, "owner"),
                format!("a second share of client {owner}"),
            ));
        }
    }
    if seen.len() != owed.len() {
        let missing: Vec<u32> = owed.keys().filter(|o| !seen.contains(o)).copied().collect();
        return Err(Invalid::field(
            "shares",
            format!("no share for clients {missing:?}"),
        ));
    }
    Ok(())
}
