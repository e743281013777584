//! Rounds left behind: every round not changed for `--secagg-round-ttl` is deleted with
//! its members, sealed messages and revealed shares, by a sweep on a timer.

use super::super::database::{DbError, Param};
use super::{RoundError, PART};
use crate::store::Store;

impl Store {
    /// Deletes every round last changed before `updated_before` (RFC 3339 UTC, as the
    /// rows are stamped), finished or abandoned alike, with its members, sealed
    /// messages and revealed shares; how many rounds went.
    pub fn expire_rounds(&self, updated_before: &str) -> Result<u64, RoundError> {
        self.shared.write(PART, |tx| {
            // The stale rounds locked first (on PostgreSQL), so a submission racing the
            // sweep either lands before it (and the round is no longer stale) or finds
            // the round gone: never a round kept with its members deleted.
            let stale: Vec<String> = tx
                .query(
                    &format!(
                        "SELECT id FROM secagg_rounds WHERE updated_at < ?1{}",
                        tx.lock_rows()
                    ),
                    &[Param::Text(updated_before)],
                )?
                .iter()
                .map(|r| r.text(0))
                .collect::<Result<_, DbError>>()?;
            for id in &stale {
                for table in ["secagg_reveals", "secagg_messages", "secagg_members"] {
                    tx.exec(
                        &format!("DELETE FROM {table} WHERE round_id = ?1"),
                        &[Param::Text(id)],
                    )?;
                }
                tx.exec(
                    "DELETE FROM secagg_rounds WHERE id = ?1",
                    &[Param::Text(id)],
                )?;
            }
            Ok(stale.len() as u64)
        })
    }

    /// Rows of the secure-aggregation tables, for tests of what expiry leaves.
    #[cfg(test)]
    pub(crate) fn secagg_row_counts(&self) -> [i64; 4] {
        self.shared
            .read::<_, RoundError>(PART, |tx| {
                let mut counts = [0; 4];
                for (c, table) in counts.iter_mut().zip([
                    "secagg_rounds",
                    "secagg_members",
                    "secagg_messages",
                    "secagg_reveals",
                ]) {
                    let row = tx.query(&format!("SELECT COUNT(*) FROM {table}"), &[])?;
                    *c = row[0].i64(0)?;
                }
                Ok(counts)
            })
            .expect("counts")
    }
}

/// Every `ttl / 4` (at least each second, at most each minute), deletes the rounds not
/// changed for `ttl` (`--secagg-round-ttl`). Ends with the store.
pub fn spawn_round_expiry(
    store: &std::sync::Arc<Store>,
    ttl: std::time::Duration,
    expired: prometheus::IntCounter,
) {
    use std::time::{Duration, SystemTime};
    let store = std::sync::Arc::downgrade(store);
    let every = (ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(store) = store.upgrade() else { return };
            let Some(cutoff) = SystemTime::now().checked_sub(ttl) else {
                continue;
            };
            let cutoff = humantime::format_rfc3339_millis(cutoff).to_string();
            match tokio::task::spawn_blocking(move || store.expire_rounds(&cutoff)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => {
                    expired.inc_by(n);
                    tracing::info!(rounds = n, "expired secure-aggregation rounds deleted");
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "secure-aggregation expiry failed; retried")
                }
                Err(e) => tracing::warn!(error = %e, "secure-aggregation expiry task failed"),
            }
        }
    });
}
