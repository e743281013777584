//! Secure-aggregation rounds in the shared database, so a restart (or another replica)
//! resumes a round where it stood. Each request is one transaction that locks the
//! round's row, checks the request against the state machine of
//! `ops::mpc::secagg::round`, writes it, and closes the stage when every client expected
//! at it has submitted. The masked uploads are folded into the round's running sum in
//! the same transaction that records the upload, so the sum holds each survivor exactly
//! once; no upload is kept on its own (the first is the sum until the second arrives).

use super::database::{DbError, Param, Row, Tx};
use super::{now, Store, StoreError};
use crate::ops::invalid::Invalid;
use crate::ops::mpc::secagg::masks::add_into;
use crate::ops::mpc::secagg::round::{
    self, check_recipients, check_reveals, everyone_submitted, expect_stage, Member, Refusal,
    RoundConfig, Secret, Sets, Stage,
};

const PART: &str = "secure-aggregation storage";

#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    #[error("no such round")]
    NotFound,
    #[error("the x-secagg-token header does not name a client of this round, or its coordinator")]
    BadToken,
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Storage(#[from] StoreError),
}

impl From<DbError> for RoundError {
    fn from(e: DbError) -> Self {
        RoundError::Storage(StoreError::from_db(PART, e))
    }
}

impl From<Invalid> for RoundError {
    fn from(e: Invalid) -> Self {
        RoundError::Refused(Refusal::Invalid(e))
    }
}

/// A registered client's public record.
#[derive(Clone, Debug)]
pub struct MemberRecord {
    pub member: Member,
    /// Base64 of its X25519 keys: for sealing shares to it, and for its pair masks.
    pub share_key: String,
    pub mask_key: String,
    /// Base64 of SHA-256 over its β (set with its shares).
    pub self_mask_commitment: Option<String>,
}

#[derive(Clone, Debug)]
pub struct RoundRecord {
    pub id: String,
    pub config: RoundConfig,
    pub stage: Stage,
    pub failure: Option<String>,
    pub members: Vec<MemberRecord>,
    pub created_at: String,
    pub updated_at: String,
}

impl RoundRecord {
    pub fn sets(&self) -> Sets {
        Sets::of(&self.members.iter().map(|m| m.member).collect::<Vec<_>>())
    }
}

/// A revealed share: whose secret, which, from whom, and the value (base64).
#[derive(Clone, Debug)]
pub struct Reveal {
    pub owner: u32,
    pub holder: u32,
    pub secret: Secret,
    pub share: String,
}

/// What the unmasking needs, read in one snapshot.
pub struct AggregationInputs {
    pub round: RoundRecord,
    pub sum: Vec<u32>,
    pub reveals: Vec<Reveal>,
}

fn words_to_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn bytes_to_words(b: &[u8]) -> Result<Vec<u32>, RoundError> {
    if b.len() % 4 != 0 {
        return Err(StoreError::new(PART, "a stored vector is not whole words").into());
    }
    Ok(b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

/// The round, locked until the transaction ends when `lock`. Every write locks the round
/// this way, so it also stamps `updated_at` here: a round is "changed" by any submission,
/// and `--secagg-round-ttl` counts from the last one.
fn load(tx: &mut Tx<'_>, id: &str, lock: bool) -> Result<(RoundRecord, String), RoundError> {
    if lock {
        tx.exec(
            "UPDATE secagg_rounds SET updated_at = ?2 WHERE id = ?1",
            &[Param::Text(id), Param::Text(&now())],
        )?;
    }
    let lock = if lock { tx.lock_rows() } else { "" };
    let row = tx
        .query_opt(
            &format!(
                "SELECT config, stage, failure, created_at, updated_at, coordinator_token \
                 FROM secagg_rounds WHERE id = ?1{lock}"
            ),
            &[Param::Text(id)],
        )?
        .ok_or(RoundError::NotFound)?;
    let config: RoundConfig = serde_json::from_str(&row.text(0)?)
        .map_err(|e| StoreError::new(PART, format!("corrupt round config: {e}")))?;
    let stage =
        Stage::parse(&row.text(1)?).ok_or_else(|| StoreError::new(PART, "corrupt round stage"))?;
    let members = tx
        .query(
            "SELECT client_id, shared, uploaded, unmasked, share_key, mask_key, \
             self_mask_commitment FROM secagg_members WHERE round_id = ?1 ORDER BY client_id",
            &[Param::Text(id)],
        )?
        .iter()
        .map(member)
        .collect::<Result<_, DbError>>()?;
    Ok((
        RoundRecord {
            id: id.to_string(),
            config,
            stage,
            failure: row.opt_text(2)?,
            members,
            created_at: row.text(3)?,
            updated_at: row.text(4)?,
        },
        row.text(5)?,
    ))
}

fn member(r: &Row) -> Result<MemberRecord, DbError> {
    Ok(MemberRecord {
        member: Member {
            id: r.u64(0)? as u32,
            shared: r.i64(1)? != 0,
            uploaded: r.i64(2)? != 0,
            unmasked: r.i64(3)? != 0,
        },
        share_key: r.text(4)?,
        mask_key: r.text(5)?,
        self_mask_commitment: r.opt_text(6)?,
    })
}

/// The client whose token hash this is.
fn client_of(tx: &mut Tx<'_>, id: &str, token: &str) -> Result<u32, RoundError> {
    let row = tx
        .query_opt(
            "SELECT client_id FROM secagg_members WHERE round_id = ?1 AND token = ?2",
            &[Param::Text(id), Param::Text(token)],
        )?
        .ok_or(RoundError::BadToken)?;
    Ok(row.u64(0)? as u32)
}

fn set_stage(
    tx: &mut Tx<'_>,
    id: &str,
    stage: Stage,
    failure: Option<&str>,
) -> Result<(), RoundError> {
    tx.exec(
        "UPDATE secagg_rounds SET stage = ?2, failure = ?3, updated_at = ?4 WHERE id = ?1",
        &[
            Param::Text(id),
            Param::Text(stage.as_str()),
            Param::OptText(failure),
            Param::Text(&now()),
        ],
    )?;
    Ok(())
}

/// After a submission: closes the stage if everyone expected at it has submitted; a
/// shortfall that can no longer be made up fails the round.
fn close_if_complete(tx: &mut Tx<'_>, id: &str) -> Result<RoundRecord, RoundError> {
    let (round, _) = load(tx, id, false)?;
    let sets = round.sets();
    if !everyone_submitted(&round.config, round.stage, &sets) {
        return Ok(round);
    }
    match round::close(&round.config, round.stage, &sets) {
        Ok(next) => set_stage(tx, id, next, None)?,
        Err(Refusal::TooFew(why)) => set_stage(tx, id, Stage::Failed, Some(&why))?,
        Err(other) => return Err(other.into()),
    }
    Ok(load(tx, id, false)?.0)
}

/// Marks a client's submission at this stage, once.
fn mark(
    tx: &mut Tx<'_>,
    id: &str,
    client: u32,
    column: &str,
    stage: Stage,
) -> Result<(), RoundError> {
    let changed = tx.exec(
        &format!(
            "UPDATE secagg_members SET {column} = 1 WHERE round_id = ?1 AND client_id = ?2 \
             AND {column} = 0"
        ),
        &[Param::Text(id), Param::I64(client.into())],
    )?;
    if changed == 0 {
        return Err(Refusal::AlreadySubmitted {
            client,
            stage: stage.as_str(),
        }
        .into());
    }
    Ok(())
}

impl Store {
    pub fn create_round(
        &self,
        id: &str,
        coordinator_token: &str,
        config: &RoundConfig,
    ) -> Result<RoundRecord, RoundError> {
        let at = now();
        let config = serde_json::to_string(config).expect("a round config serialises");
        self.shared.write(PART, |tx| {
            tx.exec(
                "INSERT INTO secagg_rounds (id, coordinator_token, config, stage, created_at, \
                 updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                &[
                    Param::Text(id),
                    Param::Text(coordinator_token),
                    Param::Text(&config),
                    Param::Text(Stage::AdvertiseKeys.as_str()),
                    Param::Text(&at),
                ],
            )?;
            Ok(load(tx, id, false)?.0)
        })
    }

    pub fn round(&self, id: &str) -> Result<RoundRecord, RoundError> {
        self.shared.read(PART, |tx| Ok(load(tx, id, false)?.0))
    }

    /// Registers a client under the next free id; returns the id.
    pub fn register_client(
        &self,
        id: &str,
        token: &str,
        share_key: &str,
        mask_key: &str,
    ) -> Result<(u32, RoundRecord), RoundError> {
        self.shared.write(PART, |tx| {
            let (round, _) = load(tx, id, true)?;
            let n = round.members.len() as u32;
            if n >= round.config.clients {
                return Err(Refusal::Full {
                    clients: round.config.clients,
                }
                .into());
            }
            expect_stage(round.stage, Stage::AdvertiseKeys)?;
            let client = n + 1;
            tx.exec(
                "INSERT INTO secagg_members (round_id, client_id, token, share_key, mask_key) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                &[
                    Param::Text(id),
                    Param::I64(client.into()),
                    Param::Text(token),
                    Param::Text(share_key),
                    Param::Text(mask_key),
                ],
            )?;
            Ok((client, close_if_complete(tx, id)?))
        })
    }

    /// A client's sealed shares, one per registered neighbour, with its commitment to β.
    pub fn submit_shares(
        &self,
        id: &str,
        token: &str,
        commitment: &str,
        messages: &[(u32, String)],
    ) -> Result<(u32, RoundRecord), RoundError> {
        self.shared.write(PART, |tx| {
            let (round, _) = load(tx, id, true)?;
            let client = client_of(tx, id, token)?;
            expect_stage(round.stage, Stage::ShareKeys)?;
            let expected = round::share_recipients(&round.config.graph(), &round.sets(), client);
            let recipients: Vec<u32> = messages.iter().map(|(r, _)| *r).collect();
            check_recipients(&expected, &recipients)?;
            mark(tx, id, client, "shared", round.stage)?;
            tx.exec(
                "UPDATE secagg_members SET self_mask_commitment = ?3 WHERE round_id = ?1 \
                 AND client_id = ?2",
                &[
                    Param::Text(id),
                    Param::I64(client.into()),
                    Param::Text(commitment),
                ],
            )?;
            for (recipient, sealed) in messages {
                tx.exec(
                    "INSERT INTO secagg_messages (round_id, recipient, sender, ciphertext) \
                     VALUES (?1, ?2, ?3, ?4)",
                    &[
                        Param::Text(id),
                        Param::I64((*recipient).into()),
                        Param::I64(client.into()),
                        Param::Text(sealed),
                    ],
                )?;
            }
            Ok((client, close_if_complete(tx, id)?))
        })
    }

    /// The sealed shares addressed to a client, by sender, once the share stage closed.
    pub fn inbox(&self, id: &str, token: &str) -> Result<(u32, Vec<(u32, String)>), RoundError> {
        self.shared.read(PART, |tx| {
            let (round, _) = load(tx, id, false)?;
            let client = client_of(tx, id, token)?;
            if matches!(round.stage, Stage::AdvertiseKeys | Stage::ShareKeys) {
                return Err(Refusal::WrongStage {
                    stage: round.stage.as_str(),
                    expected: "masked_input or later",
                }
                .into());
            }
            let rows = tx.query(
                "SELECT sender, ciphertext FROM secagg_messages WHERE round_id = ?1 AND \
                 recipient = ?2 ORDER BY sender",
                &[Param::Text(id), Param::I64(client.into())],
            )?;
            let messages = rows
                .iter()
                .map(|r| Ok((r.u64(0)? as u32, r.text(1)?)))
                .collect::<Result<_, DbError>>()?;
            Ok((client, messages))
        })
    }

    /// A client's masked vector, folded into the round's sum.
    pub fn submit_input(
        &self,
        id: &str,
        token: &str,
        masked: &[u32],
    ) -> Result<(u32, RoundRecord), RoundError> {
        self.shared.write(PART, |tx| {
            let (round, _) = load(tx, id, true)?;
            let client = client_of(tx, id, token)?;
            expect_stage(round.stage, Stage::MaskedInput)?;
            if !round.sets().shared.contains(&client) {
                return Err(Refusal::WrongStage {
                    stage: "masked_input, which this client may not join: it sent no shares",
                    expected: "share_keys",
                }
                .into());
            }
            if masked.len() != round.config.vector_length {
                return Err(Invalid::field(
                    "masked",
                    format!(
                        "{} values, and the round's vector_length is {}",
                        masked.len(),
                        round.config.vector_length
                    ),
                )
                .into());
            }
            mark(tx, id, client, "uploaded", round.stage)?;
            let row = tx.query_opt(
                "SELECT sum FROM secagg_rounds WHERE id = ?1",
                &[Param::Text(id)],
            )?;
            let sum = match row.map(|r| r.opt_blob(0)).transpose()?.flatten() {
                Some(bytes) => {
                    let mut sum = bytes_to_words(&bytes)?;
                    add_into(&mut sum, masked);
                    sum
                }
                None => masked.to_vec(),
            };
            tx.exec(
                "UPDATE secagg_rounds SET sum = ?2 WHERE id = ?1",
                &[Param::Text(id), Param::Blob(&words_to_bytes(&sum))],
            )?;
            Ok((client, close_if_complete(tx, id)?))
        })
    }

    /// A survivor's revealed shares: exactly one per neighbour that shared, of the kind
    /// the round's survivors determine.
    pub fn submit_reveals(
        &self,
        id: &str,
        token: &str,
        reveals: &[(u32, Secret, String)],
    ) -> Result<(u32, RoundRecord), RoundError> {
        self.shared.write(PART, |tx| {
            let (round, _) = load(tx, id, true)?;
            let client = client_of(tx, id, token)?;
            expect_stage(round.stage, Stage::Unmasking)?;
            let sets = round.sets();
            if !sets.uploaded.contains(&client) {
                return Err(Refusal::WrongStage {
                    stage: "unmasking, which only clients that uploaded join",
                    expected: "masked_input",
                }
                .into());
            }
            let owed = sets.reveals_of(&round.config.graph(), client);
            let given: Vec<(u32, Secret)> = reveals.iter().map(|(o, s, _)| (*o, *s)).collect();
            check_reveals(&owed, &given)?;
            mark(tx, id, client, "unmasked", round.stage)?;
            for (owner, secret, share) in reveals {
                tx.exec(
                    "INSERT INTO secagg_reveals (round_id, owner, holder, secret, share) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    &[
                        Param::Text(id),
                        Param::I64((*owner).into()),
                        Param::I64(client.into()),
                        Param::Text(secret.as_str()),
                        Param::Text(share),
                    ],
                )?;
            }
            Ok((client, close_if_complete(tx, id)?))
        })
    }

    /// The coordinator closes the current stage with whoever has submitted; refused
    /// (nothing changes) when too few have.
    pub fn advance_round(
        &self,
        id: &str,
        coordinator_token: &str,
    ) -> Result<RoundRecord, RoundError> {
        self.shared.write(PART, |tx| {
            let (round, token) = load(tx, id, true)?;
            if token != coordinator_token {
                return Err(RoundError::BadToken);
            }
            let next = round::close(&round.config, round.stage, &round.sets())?;
            set_stage(tx, id, next, None)?;
            Ok(load(tx, id, false)?.0)
        })
    }

    /// Checks the coordinator's token.
    pub fn check_coordinator(
        &self,
        id: &str,
        coordinator_token: &str,
    ) -> Result<RoundRecord, RoundError> {
        self.shared.read(PART, |tx| {
            let (round, token) = load(tx, id, false)?;
            if token != coordinator_token {
                return Err(RoundError::BadToken);
            }
            Ok(round)
        })
    }

    /// The sum of the uploads and every revealed share, for the unmasking.
    pub fn aggregation_inputs(&self, id: &str) -> Result<AggregationInputs, RoundError> {
        self.shared.read(PART, |tx| {
            let (round, _) = load(tx, id, false)?;
            expect_stage(round.stage, Stage::Aggregating)?;
            let sum = tx
                .query_opt(
                    "SELECT sum FROM secagg_rounds WHERE id = ?1",
                    &[Param::Text(id)],
                )?
                .map(|r| r.opt_blob(0))
                .transpose()?
                .flatten()
                .ok_or_else(|| StoreError::new(PART, "an aggregating round has no sum"))?;
            let reveals = tx
                .query(
                    "SELECT owner, holder, secret, share FROM secagg_reveals WHERE round_id = ?1 \
                     ORDER BY owner, holder",
                    &[Param::Text(id)],
                )?
                .iter()
                .map(|r| {
                    let secret = match r.text(2)?.as_str() {
                        "mask_key" => Secret::MaskKey,
                        _ => Secret::SelfMask,
                    };
                    Ok(Reveal {
                        owner: r.u64(0)? as u32,
                        holder: r.u64(1)? as u32,
                        secret,
                        share: r.text(3)?,
                    })
                })
                .collect::<Result<_, DbError>>()?;
            Ok(AggregationInputs {
                sum: bytes_to_words(&sum)?,
                round,
                reveals,
            })
        })
    }

    /// Records the unmasked sum, or why the round cannot give one. Only an aggregating
    /// round ends here; a second writer (a retry, another replica) finds it ended and
    /// changes nothing. Returns the round and the sum as stored.
    pub fn finish_round(
        &self,
        id: &str,
        outcome: Result<&[u32], &str>,
    ) -> Result<(RoundRecord, Option<Vec<u32>>), RoundError> {
        self.shared.write(PART, |tx| {
            let (round, _) = load(tx, id, true)?;
            if round.stage == Stage::Aggregating {
                match outcome {
                    Ok(sum) => {
                        tx.exec(
                            "UPDATE secagg_rounds SET result = ?2, sum = NULL WHERE id = ?1",
                            &[Param::Text(id), Param::Blob(&words_to_bytes(sum))],
                        )?;
                        set_stage(tx, id, Stage::Finished, None)?;
                    }
                    Err(why) => set_stage(tx, id, Stage::Failed, Some(why))?,
                }
            }
            Ok((load(tx, id, false)?.0, stored_result(tx, id)?))
        })
    }

    /// A round and its unmasked sum, if it has one.
    pub fn round_sum(&self, id: &str) -> Result<(RoundRecord, Option<Vec<u32>>), RoundError> {
        self.shared.read(PART, |tx| {
            Ok((load(tx, id, false)?.0, stored_result(tx, id)?))
        })
    }
}

fn stored_result(tx: &mut Tx<'_>, id: &str) -> Result<Option<Vec<u32>>, RoundError> {
    tx.query_opt(
        "SELECT result FROM secagg_rounds WHERE id = ?1",
        &[Param::Text(id)],
    )?
    .map(|r| r.opt_blob(0))
    .transpose()?
    .flatten()
    .map(|b| bytes_to_words(&b))
    .transpose()
}

mod expiry;
pub use expiry::spawn_round_expiry;

#[cfg(test)]
mod tests;
