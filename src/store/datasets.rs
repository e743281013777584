//! The synthetic dataset catalog: one row per job, its status and progress.

use super::{now, Store, StoreError};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
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
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize, ToSchema)]
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

fn row(r: &Row<'_>) -> rusqlite::Result<DatasetRow> {
    let status: String = r.get(7)?;
    Ok(DatasetRow {
        id: r.get(0)?,
        tenant: r.get(1)?,
        name: r.get(2)?,
        dataset_type: r.get(3)?,
        num_samples: r.get::<_, i64>(4)? as u64,
        seed: r.get::<_, i64>(5)? as u64,
        config: r.get(6)?,
        status: DatasetStatus::parse(&status),
        counts: Counts {
            valid: r.get::<_, i64>(8)? as u64,
            attempted: r.get::<_, i64>(9)? as u64,
            rejected_too_few_receivers: r.get::<_, i64>(10)? as u64,
            rejected_low_snr: r.get::<_, i64>(11)? as u64,
            rejected_high_gdop: r.get::<_, i64>(12)? as u64,
        },
        error: r.get(13)?,
        created_at: r.get(14)?,
        started_at: r.get(15)?,
        finished_at: r.get(16)?,
    })
}

pub struct NewDataset {
    pub tenant: String,
    pub name: String,
    pub dataset_type: String,
    pub num_samples: u64,
    pub seed: u64,
    pub config: String,
}

fn find(conn: &Connection, tenant: &str, id: &str) -> rusqlite::Result<Option<DatasetRow>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM datasets WHERE id = ?1 AND tenant = ?2"),
        params![id, tenant],
        row,
    )
    .optional()
}

impl Store {
    pub fn create_dataset(&self, id: &str, d: NewDataset) -> Result<DatasetRow, StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO datasets (id, tenant, name, dataset_type, num_samples, seed, config, status, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'queued', ?8)",
                params![id, d.tenant, d.name, d.dataset_type, d.num_samples as i64, d.seed as i64, d.config, now()],
            )?;
            find(c, &d.tenant, id).map(|r| r.expect("just inserted"))
        })
        .map_err(StoreError::catalog)
    }

    pub fn dataset(&self, tenant: &str, id: &str) -> Result<Option<DatasetRow>, StoreError> {
        self.with(|c| find(c, tenant, id))
            .map_err(StoreError::catalog)
    }

    /// A job by id whatever its tenant (the worker's view).
    pub fn dataset_any(&self, id: &str) -> Result<Option<DatasetRow>, StoreError> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM datasets WHERE id = ?1"),
                params![id],
                row,
            )
            .optional()
        })
        .map_err(StoreError::catalog)
    }

    pub fn datasets(&self, tenant: &str) -> Result<Vec<DatasetRow>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {COLUMNS} FROM datasets WHERE tenant = ?1 ORDER BY created_at, id"
            ))?;
            let rows = st.query_map(params![tenant], row)?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(StoreError::catalog)
    }

    /// Moves a job to `status` (stamping start or finish) with its counts and error.
    pub fn update_dataset(
        &self,
        id: &str,
        status: DatasetStatus,
        counts: &Counts,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        let t = now();
        self.with(|c| {
            c.execute(
                "UPDATE datasets SET status = ?2, valid = ?3, attempted = ?4, \
                 rejected_too_few_receivers = ?5, rejected_low_snr = ?6, rejected_high_gdop = ?7, \
                 error = ?8, \
                 started_at = CASE WHEN ?2 = 'running' AND started_at IS NULL THEN ?9 ELSE started_at END, \
                 finished_at = CASE WHEN ?2 IN ('completed', 'failed', 'cancelled', 'interrupted') THEN ?9 ELSE finished_at END \
                 WHERE id = ?1",
                params![
                    id,
                    status.name(),
                    counts.valid as i64,
                    counts.attempted as i64,
                    counts.rejected_too_few_receivers as i64,
                    counts.rejected_low_snr as i64,
                    counts.rejected_high_gdop as i64,
                    error,
                    t
                ],
            )
        })
        .map(|_| ())
        .map_err(StoreError::catalog)
    }

    /// Puts an interrupted job back in the queue; false when it is not interrupted.
    pub fn requeue_dataset(&self, id: &str) -> Result<bool, StoreError> {
        self.with(|c| {
            c.execute(
                "UPDATE datasets SET status = 'queued', error = NULL, finished_at = NULL \
                 WHERE id = ?1 AND status = 'interrupted'",
                params![id],
            )
        })
        .map(|n| n > 0)
        .map_err(StoreError::catalog)
    }

    pub fn delete_dataset(&self, tenant: &str, id: &str) -> Result<bool, StoreError> {
        self.with(|c| {
            c.execute(
                "DELETE FROM datasets WHERE id = ?1 AND tenant = ?2",
                params![id, tenant],
            )
        })
        .map(|n| n > 0)
        .map_err(StoreError::catalog)
    }

    /// At start-up: jobs a previous process left queued or running are marked
    /// interrupted (their partial files are removed by the caller). Returns their ids.
    pub fn interrupt_unfinished_datasets(&self) -> Result<Vec<String>, StoreError> {
        self.with(|c| {
            let ids: Vec<String> = {
                let mut st =
                    c.prepare("SELECT id FROM datasets WHERE status IN ('queued', 'running')")?;
                let rows = st.query_map([], |r| r.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            c.execute(
                "UPDATE datasets SET status = 'interrupted', finished_at = ?1, \
                 error = 'the server stopped before the job finished; POST /datasets/{id}/resume continues it from its last checkpoint' \
                 WHERE status IN ('queued', 'running')",
                params![now()],
            )?;
            Ok(ids)
        })
        .map_err(StoreError::catalog)
    }
}
