//! The synthetic dataset catalog and its job queue: one row per job, its status and
//! progress, and while it runs the worker's lease. Workers claim the front of the queue
//! (or a job whose worker's lease expired) and renew the lease as they write progress;
//! every write a worker makes is fenced by its owner id and attempt number, so a worker
//! that lost its lease changes nothing.

use super::database::{Param, Row, Tx};
use super::{now, Store, StoreError};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DatasetStatus {
    Queued,
    Running,
    Completed,
    Failed,
    Cancelled,
    /// The server stopped while the job was queued or running; nothing partial is kept.
    Interrupted,
}

impl DatasetStatus {
    pub fn name(self) -> &'static str {
        match self {
            DatasetStatus::Queued => "queued",
            DatasetStatus::Running => "running",
            DatasetStatus::Completed => "completed",
            DatasetStatus::Failed => "failed",
            DatasetStatus::Cancelled => "cancelled",
            DatasetStatus::Interrupted => "interrupted",
        }
    }

    fn parse(s: &str) -> DatasetStatus {
        match s {
            "queued" => DatasetStatus::Queued,
            "running" => DatasetStatus::Running,
            "completed" => DatasetStatus::Completed,
            "cancelled" => DatasetStatus::Cancelled,
            "interrupted" => DatasetStatus::Interrupted,
            _ => DatasetStatus::Failed,
        }
    }

    pub fn is_final(self) -> bool {
        !matches!(self, DatasetStatus::Queued | DatasetStatus::Running)
    }
}

/// Samples accepted, attempted and rejected by reason.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Counts {
    pub valid: u64,
    pub attempted: u64,
    pub rejected_too_few_receivers: u64,
    pub rejected_low_snr: u64,
    pub rejected_high_gdop: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DatasetRow {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub dataset_type: String,
    pub num_samples: u64,
    pub seed: u64,
    /// The scenario as JSON, defaults filled in.
    pub config: String,
    pub status: DatasetStatus,
    pub counts: Counts,
    pub error: Option<String>,
    pub created_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

const COLUMNS: &str = "id, tenant, name, dataset_type, num_samples, seed, config, status, valid, \
    attempted, rejected_too_few_receivers, rejected_low_snr, rejected_high_gdop, error, \
    created_at, started_at, finished_at";

const PART: &str = "dataset catalog";

/// Submissions and requeues count the queue and take its next place under this lock, so
/// concurrent ones cannot pass the cap together.
const QUEUE_LOCK: i64 = 0x0067_7075_2d71_7565;

/// Refuses a job of `tenant` asking for `work` that `caps` do not admit now (under
/// `QUEUE_LOCK`). `requeued` is the job itself when it goes back in the queue: its own
/// row does not count against it.
fn admits(
    tx: &mut Tx<'_>,
    caps: QueueCaps,
    tenant: &str,
    work: u64,
    requeued: Option<&str>,
) -> Result<Option<QueueRefusal>, StoreError> {
    let total = queued(tx)?;
    if total >= caps.queued as u64 {
        return Ok(Some(QueueRefusal::Full {
            queued: total as usize,
        }));
    }
    let (waiting, pending) = tx
        .query_opt(
            "SELECT CAST(COALESCE(SUM(CASE WHEN status = 'queued' THEN 1 ELSE 0 END), 0) AS BIGINT), \
             CAST(COALESCE(SUM(work), 0) AS BIGINT) FROM datasets \
             WHERE tenant = ?1 AND status IN ('queued', 'running') AND id <> ?2",
            &[Param::Text(tenant), Param::Text(requeued.unwrap_or(""))],
        )?
        .map(|r| Ok::<_, StoreError>((r.u64(0)?, r.u64(1)?)))
        .transpose()?
        .unwrap_or((0, 0));
    if waiting >= caps.tenant_queued as u64 {
        return Ok(Some(QueueRefusal::TenantFull {
            queued: waiting as usize,
        }));
    }
    if pending.saturating_add(work) > caps.tenant_work {
        return Ok(Some(QueueRefusal::TenantWork {
            work,
            pending,
            limit: caps.tenant_work,
        }));
    }
    Ok(None)
}

fn row(r: &Row) -> Result<DatasetRow, StoreError> {
    Ok(DatasetRow {
        id: r.text(0)?,
        tenant: r.text(1)?,
        name: r.text(2)?,
        dataset_type: r.text(3)?,
        num_samples: r.u64(4)?,
        // Seeds are u64 stored in a signed column: the same bits back.
        seed: r.i64(5)? as u64,
        config: r.text(6)?,
        status: DatasetStatus::parse(&r.text(7)?),
        counts: Counts {
            valid: r.u64(8)?,
            attempted: r.u64(9)?,
            rejected_too_few_receivers: r.u64(10)?,
            rejected_low_snr: r.u64(11)?,
            rejected_high_gdop: r.u64(12)?,
        },
        error: r.opt_text(13)?,
        created_at: r.text(14)?,
        started_at: r.opt_text(15)?,
        finished_at: r.opt_text(16)?,
    })
}

pub struct NewDataset {
    pub tenant: String,
    pub name: String,
    pub dataset_type: String,
    pub num_samples: u64,
    pub seed: u64,
    pub config: String,
    /// What the job asks of the worker, in complex samples to synthesise (samples ×
    /// receivers × samples per recording): counted against its tenant's
    /// `QueueCaps::tenant_work` while it is queued or running.
    pub work: u64,
}

/// What the queue admits: jobs waiting in all (`--max-dataset-jobs`), jobs waiting per
/// tenant (`--max-tenant-queued-datasets`), and the work a tenant's queued and running
/// jobs may ask for together (`--max-tenant-dataset-work`). One tenant can thus neither
/// fill the queue nor hold the worker with a backlog the others wait behind.
#[derive(Clone, Copy, Debug)]
pub struct QueueCaps {
    pub queued: usize,
    pub tenant_queued: usize,
    pub tenant_work: u64,
}

impl QueueCaps {
    /// Only the queue's own length is capped.
    pub fn total(queued: usize) -> Self {
        Self {
            queued,
            tenant_queued: usize::MAX,
            tenant_work: u64::MAX,
        }
    }
}

/// Why the queue did not take a job (`QueueCaps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueRefusal {
    /// `queued` jobs wait already.
    Full { queued: usize },
    /// The tenant has `queued` jobs waiting already.
    TenantFull { queued: usize },
    /// The tenant's queued and running jobs ask for `pending` work; with this job's
    /// `work` that passes `limit`.
    TenantWork { work: u64, pending: u64, limit: u64 },
}

/// A job a worker claimed: its row, and the attempt number that fences the worker's
/// writes (a worker whose lease expired and was claimed again writes nothing more).
#[derive(Clone, Debug)]
pub struct ClaimedDataset {
    pub row: DatasetRow,
    pub attempt: u64,
}

/// What renewing a lease found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lease {
    /// Still ours; `cancel` when a cancellation was requested (through any replica).
    Held { cancel: bool },
    /// Taken by another worker after ours expired, or the job was deleted: stop writing.
    Lost,
}

fn find(tx: &mut Tx<'_>, tenant: Option<&str>, id: &str) -> Result<Option<DatasetRow>, StoreError> {
    let found = match tenant {
        Some(t) => tx.query_opt(
            &format!("SELECT {COLUMNS} FROM datasets WHERE id = ?1 AND tenant = ?2"),
            &[Param::Text(id), Param::Text(t)],
        )?,
        None => tx.query_opt(
            &format!("SELECT {COLUMNS} FROM datasets WHERE id = ?1"),
            &[Param::Text(id)],
        )?,
    };
    found.as_ref().map(row).transpose()
}

fn counts_params(c: &Counts) -> [Param<'static>; 5] {
    [
        Param::I64(c.valid as i64),
        Param::I64(c.attempted as i64),
        Param::I64(c.rejected_too_few_receivers as i64),
        Param::I64(c.rejected_low_snr as i64),
        Param::I64(c.rejected_high_gdop as i64),
    ]
}

/// Milliseconds since the Unix epoch: leases are compared as numbers on both databases.
/// Replicas' clocks must agree to well within a lease (NTP does).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Jobs waiting in the queue.
fn queued(tx: &mut Tx<'_>) -> Result<u64, StoreError> {
    Ok(tx
        .query_opt("SELECT COUNT(*) FROM datasets WHERE status = 'queued'", &[])?
        .map(|r| r.u64(0))
        .transpose()?
        .unwrap_or(0))
}

/// What putting a job back in the queue did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    Queued,
    /// Only an interrupted job goes back in the queue.
    NotInterrupted,
    Refused(QueueRefusal),
}

/// The next place at the back of the queue.
fn next_queue_seq(tx: &mut Tx<'_>) -> Result<i64, StoreError> {
    Ok(tx
        .query_opt("SELECT COALESCE(MAX(queue_seq), 0) + 1 FROM datasets", &[])?
        .map(|r| r.i64(0))
        .transpose()?
        .unwrap_or(1))
}

impl Store {
    /// Adds a queued job at the back of the queue, unless `max_queued` jobs already wait
    /// (then `None`): counted and inserted in one write transaction, so concurrent
    /// submissions cannot pass the cap together.
    pub fn create_dataset(
        &self,
        id: &str,
        d: NewDataset,
        caps: QueueCaps,
    ) -> Result<Result<DatasetRow, QueueRefusal>, StoreError> {
        self.catalog.write(PART, |tx| {
            tx.serialize_on(QUEUE_LOCK)?;
            if let Some(refused) = admits(tx, caps, &d.tenant, d.work, None)? {
                return Ok(Err(refused));
            }
            let seq = next_queue_seq(tx)?;
            tx.exec(
                "INSERT INTO datasets (id, tenant, name, dataset_type, num_samples, seed, config, \
                 status, created_at, queue_seq, work) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'queued', ?8, ?9, ?10)",
                &[
                    Param::Text(id),
                    Param::Text(&d.tenant),
                    Param::Text(&d.name),
                    Param::Text(&d.dataset_type),
                    Param::I64(d.num_samples as i64),
                    Param::I64(d.seed as i64),
                    Param::Text(&d.config),
                    Param::Text(&now()),
                    Param::I64(seq),
                    Param::I64(d.work.min(i64::MAX as u64) as i64),
                ],
            )?;
            find(tx, Some(&d.tenant), id)?
                .map(Ok)
                .ok_or_else(|| StoreError::new(PART, "the inserted row vanished"))
        })
    }

    pub fn dataset(&self, tenant: &str, id: &str) -> Result<Option<DatasetRow>, StoreError> {
        self.catalog.read(PART, |tx| find(tx, Some(tenant), id))
    }

    /// A job by id whatever its tenant (the worker's view).
    pub fn dataset_any(&self, id: &str) -> Result<Option<DatasetRow>, StoreError> {
        self.catalog.read(PART, |tx| find(tx, None, id))
    }

    pub fn datasets(&self, tenant: &str) -> Result<Vec<DatasetRow>, StoreError> {
        self.catalog.read(PART, |tx| {
            tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM datasets WHERE tenant = ?1 ORDER BY created_at, id"
                ),
                &[Param::Text(tenant)],
            )?
            .iter()
            .map(row)
            .collect()
        })
    }

    /// Takes a running job whose worker's lease expired (its worker died), or else the
    /// next job in the queue, for `owner` until `lease` from now. The queue serves tenants
    /// in turn: of each tenant's oldest waiting job, the one whose tenant started a job
    /// least recently (a tenant never served first), so a tenant's backlog waits behind
    /// one job of every other tenant, not behind the whole backlog. Replicas claiming at
    /// once get different jobs (PostgreSQL: `FOR UPDATE SKIP LOCKED`; SQLite: its one
    /// write lock).
    pub fn claim_dataset(
        &self,
        owner: &str,
        lease: std::time::Duration,
    ) -> Result<Option<ClaimedDataset>, StoreError> {
        let at_ms = now_ms();
        self.catalog.write(PART, |tx| {
            let skip = tx.skip_locked();
            let Some(candidate) = tx.query_opt(
                &format!(
                    "SELECT q.id FROM datasets q \
                     WHERE (q.status = 'running' AND q.lease_until < ?1) \
                     OR (q.status = 'queued' AND q.queue_seq = (SELECT MIN(f.queue_seq) \
                         FROM datasets f WHERE f.tenant = q.tenant AND f.status = 'queued')) \
                     ORDER BY CASE WHEN q.status = 'running' THEN 0 ELSE 1 END, \
                     COALESCE((SELECT MAX(s.started_at) FROM datasets s \
                         WHERE s.tenant = q.tenant), ''), \
                     q.queue_seq, q.id LIMIT 1{skip}"
                ),
                &[Param::I64(at_ms)],
            )?
            else {
                return Ok(None);
            };
            let id = candidate.text(0)?;
            tx.exec(
                "UPDATE datasets SET status = 'running', lease_owner = ?2, lease_until = ?3, \
                 attempt = attempt + 1, started_at = COALESCE(started_at, ?4) WHERE id = ?1",
                &[
                    Param::Text(&id),
                    Param::Text(owner),
                    Param::I64(at_ms + lease.as_millis() as i64),
                    Param::Text(&now()),
                ],
            )?;
            let attempt = tx
                .query_opt(
                    "SELECT attempt FROM datasets WHERE id = ?1",
                    &[Param::Text(&id)],
                )?
                .map(|r| r.u64(0))
                .transpose()?
                .unwrap_or(0);
            let row = find(tx, None, &id)?
                .ok_or_else(|| StoreError::new(PART, "claimed row vanished"))?;
            Ok(Some(ClaimedDataset { row, attempt }))
        })
    }

    /// Extends the lease of a job `owner` runs (its `attempt`) and records its counts.
    pub fn renew_dataset_lease(
        &self,
        id: &str,
        owner: &str,
        attempt: u64,
        lease: std::time::Duration,
        counts: &Counts,
    ) -> Result<Lease, StoreError> {
        let until = now_ms() + lease.as_millis() as i64;
        self.catalog.write(PART, |tx| {
            let [v, a, r1, r2, r3] = counts_params(counts);
            let held = tx.exec(
                "UPDATE datasets SET lease_until = ?4, valid = ?5, attempted = ?6, \
                 rejected_too_few_receivers = ?7, rejected_low_snr = ?8, rejected_high_gdop = ?9 \
                 WHERE id = ?1 AND lease_owner = ?2 AND attempt = ?3 AND status = 'running'",
                &[
                    Param::Text(id),
                    Param::Text(owner),
                    Param::I64(attempt as i64),
                    Param::I64(until),
                    v,
                    a,
                    r1,
                    r2,
                    r3,
                ],
            )?;
            if held == 0 {
                return Ok(Lease::Lost);
            }
            let cancel = tx
                .query_opt(
                    "SELECT cancel_requested FROM datasets WHERE id = ?1",
                    &[Param::Text(id)],
                )?
                .map(|r| r.i64(0))
                .transpose()?
                .unwrap_or(0);
            Ok(Lease::Held {
                cancel: cancel != 0,
            })
        })
    }

    /// Ends a job `owner` ran as its `attempt`: `status` with its counts and error, the
    /// lease released. False (nothing written) when the lease was lost.
    pub fn finish_dataset(
        &self,
        id: &str,
        owner: &str,
        attempt: u64,
        status: DatasetStatus,
        counts: &Counts,
        error: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.catalog.write(PART, |tx| {
            let [v, a, r1, r2, r3] = counts_params(counts);
            let n = tx.exec(
                "UPDATE datasets SET status = ?4, valid = ?5, attempted = ?6, \
                 rejected_too_few_receivers = ?7, rejected_low_snr = ?8, rejected_high_gdop = ?9, \
                 error = ?10, finished_at = ?11, lease_owner = NULL, lease_until = 0 \
                 WHERE id = ?1 AND lease_owner = ?2 AND attempt = ?3 AND status = 'running'",
                &[
                    Param::Text(id),
                    Param::Text(owner),
                    Param::I64(attempt as i64),
                    Param::Text(status.name()),
                    v,
                    a,
                    r1,
                    r2,
                    r3,
                    Param::OptText(error),
                    Param::Text(&now()),
                ],
            )?;
            Ok(n > 0)
        })
    }

    /// Gives a job `owner` runs back to the queue, at its old place (a replica shutting
    /// down: another takes it over at once), or ends it cancelled when a cancellation was
    /// requested. False when the lease was lost.
    pub fn release_dataset(
        &self,
        id: &str,
        owner: &str,
        attempt: u64,
        counts: &Counts,
    ) -> Result<bool, StoreError> {
        self.catalog.write(PART, |tx| {
            let [v, a, r1, r2, r3] = counts_params(counts);
            let n = tx.exec(
                "UPDATE datasets SET \
                 status = CASE WHEN cancel_requested = 1 THEN 'cancelled' ELSE 'queued' END, \
                 finished_at = CASE WHEN cancel_requested = 1 THEN ?9 ELSE finished_at END, \
                 valid = ?4, attempted = ?5, \
                 rejected_too_few_receivers = ?6, rejected_low_snr = ?7, rejected_high_gdop = ?8, \
                 lease_owner = NULL, lease_until = 0 \
                 WHERE id = ?1 AND lease_owner = ?2 AND attempt = ?3 AND status = 'running'",
                &[
                    Param::Text(id),
                    Param::Text(owner),
                    Param::I64(attempt as i64),
                    v,
                    a,
                    r1,
                    r2,
                    r3,
                    Param::Text(&now()),
                ],
            )?;
            Ok(n > 0)
        })
    }

    /// Cancels a queued job at once; asks a running one's worker to stop (it sees the
    /// request at its next lease renewal, through whichever replica runs it). Returns the
    /// status the job had, or `None` when it had already ended (or does not exist).
    pub fn request_dataset_cancel(&self, id: &str) -> Result<Option<DatasetStatus>, StoreError> {
        self.catalog.write(PART, |tx| {
            if tx.exec(
                "UPDATE datasets SET status = 'cancelled', finished_at = ?2, cancel_requested = 1 \
                 WHERE id = ?1 AND status = 'queued'",
                &[Param::Text(id), Param::Text(&now())],
            )? > 0
            {
                return Ok(Some(DatasetStatus::Queued));
            }
            let running = tx.exec(
                "UPDATE datasets SET cancel_requested = 1 WHERE id = ?1 AND status = 'running'",
                &[Param::Text(id)],
            )?;
            Ok((running > 0).then_some(DatasetStatus::Running))
        })
    }

    /// Puts an interrupted job at the back of the queue, if `caps` admit it now.
    pub fn requeue_dataset(&self, id: &str, caps: QueueCaps) -> Result<Requeue, StoreError> {
        self.catalog.write(PART, |tx| {
            tx.serialize_on(QUEUE_LOCK)?;
            let Some((tenant, work)) = tx
                .query_opt(
                    "SELECT tenant, work FROM datasets WHERE id = ?1 AND status = 'interrupted'",
                    &[Param::Text(id)],
                )?
                .map(|r| Ok::<_, StoreError>((r.text(0)?, r.u64(1)?)))
                .transpose()?
            else {
                return Ok(Requeue::NotInterrupted);
            };
            if let Some(refused) = admits(tx, caps, &tenant, work, Some(id))? {
                return Ok(Requeue::Refused(refused));
            }
            let seq = next_queue_seq(tx)?;
            let n = tx.exec(
                "UPDATE datasets SET status = 'queued', error = NULL, finished_at = NULL, \
                 cancel_requested = 0, queue_seq = ?2 WHERE id = ?1 AND status = 'interrupted'",
                &[Param::Text(id), Param::I64(seq)],
            )?;
            Ok(if n > 0 {
                Requeue::Queued
            } else {
                Requeue::NotInterrupted
            })
        })
    }

    pub fn delete_dataset(&self, tenant: &str, id: &str) -> Result<bool, StoreError> {
        self.catalog.write(PART, |tx| {
            let n = tx.exec(
                "DELETE FROM datasets WHERE id = ?1 AND tenant = ?2",
                &[Param::Text(id), Param::Text(tenant)],
            )?;
            Ok(n > 0)
        })
    }

    /// At start-up of an embedded store: jobs a previous process left queued or running
    /// are marked interrupted (their files are kept for resume). Returns their ids.
    pub fn interrupt_unfinished_datasets(&self) -> Result<Vec<String>, StoreError> {
        self.catalog.write(PART, |tx| {
            let ids = tx
                .query(
                    "SELECT id FROM datasets WHERE status IN ('queued', 'running')",
                    &[],
                )?
                .iter()
                .map(|r| r.text(0))
                .collect::<Result<Vec<_>, _>>()?;
            tx.exec(
                "UPDATE datasets SET status = 'interrupted', finished_at = ?1, \
                 lease_owner = NULL, lease_until = 0, \
                 error = 'the server stopped before the job finished; POST /datasets/{id}/resume continues it from its last checkpoint' \
                 WHERE status IN ('queued', 'running')",
                &[Param::Text(&now())],
            )?;
            Ok(ids)
        })
    }
}
