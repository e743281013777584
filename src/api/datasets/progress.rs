//! The progress behind `/datasets/{id}/events`: one catalog poll per job, shared by all
//! of its streams, and a cap on each tenant's open streams
//! (`--max-tenant-event-streams`). A stream used to poll the catalog itself twice a
//! second, each through the embedded store's one lock, so a tenant opening thousands of
//! streams slowed every other tenant's catalog reads.

use super::{find, view};
use crate::api::problem::{ErrorCode, Problem};
use crate::api::tenant_counts::{Taken, TenantCounts};
use crate::api::AppState;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::watch;

/// How often a job's progress is read while it has streams.
pub const EVENT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// What the poll last read: nothing yet, the job's view (JSON) and whether it is final,
/// or gone (deleted).
#[derive(Clone, Debug)]
pub enum Polled {
    Pending,
    Row { json: Arc<str>, end: bool },
    Gone,
}

type Key = (String, String);

/// The jobs being polled and the streams each tenant holds.
pub struct ProgressWatch {
    polls: Mutex<HashMap<Key, Arc<watch::Sender<Polled>>>>,
    streams: TenantCounts,
    max_per_tenant: usize,
}

/// One open stream: its tenant's count, given back on drop (the client left or the
/// stream ended).
pub type StreamSlot = Taken;

impl ProgressWatch {
    pub fn new(max_per_tenant: usize) -> Self {
        ProgressWatch {
            polls: Mutex::default(),
            streams: TenantCounts::default(),
            max_per_tenant,
        }
    }

    /// A place for one more of `tenant`'s streams, or 429 `too_many_streams`.
    pub fn open_stream(&self, tenant: &str) -> Result<StreamSlot, Problem> {
        self.streams
            .take(tenant, 1, self.max_per_tenant as u64)
            .map_err(|n| Problem {
                retry_after_secs: Some(1),
                ..Problem::new(
                    ErrorCode::TooManyStreams,
                    format!(
                        "this tenant has {n} progress streams open, --max-tenant-event-streams; close one first"
                    ),
                )
            })
    }

    /// Streams `tenant` holds now.
    pub fn open_streams(&self, tenant: &str) -> usize {
        self.streams.get(tenant) as usize
    }

    /// A receiver of job `id`'s progress, starting its poll if no stream has.
    pub fn subscribe(
        &self,
        state: &Arc<AppState>,
        tenant: &str,
        id: &str,
    ) -> watch::Receiver<Polled> {
        let key = (tenant.to_string(), id.to_string());
        let mut polls = self.polls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = polls.get(&key) {
            let mut rx = tx.subscribe();
            if !matches!(*rx.borrow(), Polled::Pending) {
                rx.mark_changed(); // the latest reading is this stream's first event
            }
            return rx;
        }
        let tx = Arc::new(watch::Sender::new(Polled::Pending));
        let rx = tx.subscribe();
        polls.insert(key.clone(), tx.clone());
        tokio::spawn(poll(Arc::downgrade(state), key, tx));
        rx
    }

    /// Ends `key`'s poll if `tx` is still its sender and no stream listens; whether it
    /// ended. Under the map's lock, so a stream subscribing now gets a live poll.
    fn stop_if_unheard(&self, key: &Key, tx: &Arc<watch::Sender<Polled>>, last: bool) -> bool {
        let mut polls = self.polls.lock().unwrap_or_else(|e| e.into_inner());
        let ours = polls.get(key).is_some_and(|t| Arc::ptr_eq(t, tx));
        if ours && (last || tx.receiver_count() == 0) {
            polls.remove(key);
        }
        last || tx.receiver_count() == 0
    }
}

/// Reads job `key` every `EVENT_INTERVAL` while it has streams, until it ends or goes.
async fn poll(state: Weak<AppState>, key: Key, tx: Arc<watch::Sender<Polled>>) {
    loop {
        let Some(state) = state.upgrade() else { return };
        let polled = match find(&state, &key.0, &key.1).await {
            Ok(row) => {
                let end = row.status.is_final();
                match serde_json::to_string(&view(&state, row)) {
                    Ok(json) => Polled::Row {
                        json: json.into(),
                        end,
                    },
                    Err(_) => Polled::Gone,
                }
            }
            // Deleted meanwhile (or the catalog out of reach): the streams end.
            Err(_) => Polled::Gone,
        };
        let last = !matches!(polled, Polled::Row { end: false, .. });
        tx.send_replace(polled);
        if state.progress.stop_if_unheard(&key, &tx, last) {
            return;
        }
        drop(state);
        tokio::time::sleep(EVENT_INTERVAL).await;
    }
}
