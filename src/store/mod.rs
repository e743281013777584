//! Embedded persistence: one SQLite database under `--data-dir`, in WAL mode with full
//! synchronous commits, so what a response reports as written survives a crash.

mod budgets;
mod datasets;
mod migrations;

pub use budgets::{Budget, BudgetError, Charge, ChargeRecord, NewBudget};
pub use datasets::{Counts, DatasetRow, DatasetStatus, NewDataset};

use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
}

impl Store {
    /// Opens (creating if needed) `gpu-ops.sqlite3` in `dir`.
    pub fn open(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("--data-dir {}: {e}", dir.display()))?;
        let path = dir.join("gpu-ops.sqlite3");
        let conn = Connection::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .and_then(|_| conn.pragma_update(None, "synchronous", "FULL"))
            .and_then(|_| conn.pragma_update(None, "foreign_keys", "ON"))
            .and_then(|_| conn.busy_timeout(std::time::Duration::from_secs(10)))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut conn = conn;
        migrations::migrate(&mut conn).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self {
            conn: Mutex::new(conn),
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version this build keeps the database at.
    pub fn schema_version() -> u32 {
        migrations::latest()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> T {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut conn)
    }
}

/// Storage that could not be read or written: which part, and the engine's message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{part}: {message}")]
pub struct StoreError {
    part: &'static str,
    message: String,
}

impl StoreError {
    pub fn new(part: &'static str, message: impl std::fmt::Display) -> Self {
        Self {
            part,
            message: message.to_string(),
        }
    }

    fn catalog(e: rusqlite::Error) -> Self {
        Self::new("dataset catalog", e)
    }
}

/// The dataset worker reports a failed job with text (its `error` column).
impl From<StoreError> for String {
    fn from(e: StoreError) -> String {
        e.to_string()
    }
}

/// Now, as RFC 3339 UTC with milliseconds.
fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}
