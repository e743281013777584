//! Persistence. Privacy budgets and their ledger live in the *shared* database: the embedded
//! SQLite file under `--data-dir` by default (WAL, full synchronous commits, so what a
//! response reports as written survives a crash), or PostgreSQL with `--database-url`,
//! so that every replica charges one budget. The dataset catalog and its queue are in the
//! embedded file, per replica, unless finished files are shared too (`--artifact-store`):
//! then they are in PostgreSQL with the budgets.

mod arrays;
mod budgets;
mod database;
mod datasets;
mod migrations;
mod secagg;
pub use secagg::spawn_round_expiry;

pub use arrays::ArrayRow;
pub use budgets::{Budget, BudgetError, Charge, ChargeRecord, NewBudget};
pub use datasets::{
    ClaimedDataset, Counts, DatasetRow, DatasetStatus, Lease, NewDataset, QueueCaps, QueueRefusal,
    Requeue,
};
pub use secagg::{AggregationInputs, MemberRecord, Reveal, RoundError, RoundRecord};

use database::{Database, DbError};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub struct Store {
    /// Where budgets live: `local` again, or PostgreSQL.
    shared: Database,
    /// Where the dataset catalog and its queue live: the embedded file, or the shared
    /// database (`with_catalog_in_shared_database`).
    catalog: Database,
    path: PathBuf,
}

/// Where the shared state lives (`--database-url`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// The SQLite file in `--data-dir`.
    Embedded,
    /// A PostgreSQL server, as a `postgres://` URL, with at most this many connections.
    Postgres { url: String, max_connections: u32 },
}

impl DatabaseUrl {
    /// `""` or `sqlite:` for the embedded file; `postgres://…` or `postgresql://…`.
    pub fn parse(s: &str, max_connections: u32) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() || s == "sqlite:" {
            Ok(Self::Embedded)
        } else if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            s.parse::<postgres::Config>()
                .map_err(|e| format!("--database-url: {e}"))?;
            Ok(Self::Postgres {
                url: s.to_string(),
                max_connections,
            })
        } else {
            Err(
                "--database-url must be empty (the embedded SQLite file in --data-dir) or a \
                 postgres:// URL"
                    .into(),
            )
        }
    }

    /// The URL without its password, for logs and `/device`.
    pub fn redacted(&self) -> String {
        match self {
            Self::Embedded => "embedded SQLite".into(),
            Self::Postgres { url, .. } => redact_password(url),
        }
    }
}

fn redact_password(url: &str) -> String {
    // postgres://user:secret@host/db → postgres://user:***@host/db
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.into();
    };
    let Some((auth, host)) = rest.rsplit_once('@') else {
        return url.into();
    };
    let user = auth.split_once(':').map_or(auth, |(u, _)| u);
    let masked = if auth.contains(':') { ":***" } else { "" };
    format!("{scheme}://{user}{masked}@{host}")
}

impl Store {
    /// Opens (creating if needed) `gpu-ops.sqlite3` in `dir`, with budgets there too.
    pub fn open(dir: &Path) -> Result<Self, String> {
        Self::open_with(dir, &DatabaseUrl::Embedded)
    }

    /// Opens the embedded file in `dir` and the shared database `db` names, migrating both.
    pub fn open_with(dir: &Path, db: &DatabaseUrl) -> Result<Self, String> {
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
        let local = Arc::new(Mutex::new(conn));
        let shared = match db {
            DatabaseUrl::Embedded => Database::Sqlite(local.clone()),
            DatabaseUrl::Postgres {
                url,
                max_connections,
            } => {
                let postgres = Database::connect_postgres(url, *max_connections)?;
                postgres
                    .migrate_postgres()
                    .map_err(|e| format!("{}: {e}", db.redacted()))?;
                postgres
            }
        };
        Ok(Self {
            catalog: Database::Sqlite(local),
            shared,
            path,
        })
    }

    /// Moves the dataset catalog and its queue into the shared database, for replicas whose
    /// finished files are shared too (`--artifact-store`): any replica's worker may then
    /// run any job, and any replica serve it.
    pub fn with_catalog_in_shared_database(mut self) -> Self {
        self.catalog = self.shared.share();
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether budgets live in PostgreSQL (shared by replicas).
    pub fn is_shared(&self) -> bool {
        self.shared.is_postgres()
    }

    /// Whether the dataset catalog and queue live in PostgreSQL (shared by replicas).
    pub fn is_catalog_shared(&self) -> bool {
        self.catalog.is_postgres()
    }

    /// The schema version this build keeps the database at.
    pub fn schema_version() -> u32 {
        migrations::latest()
    }
}

/// Storage that could not be read or written: which part, and the database's message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{part}: {message}")]
pub struct StoreError {
    part: &'static str,
    message: String,
    unavailable: bool,
}

impl StoreError {
    pub fn new(part: &'static str, message: impl std::fmt::Display) -> Self {
        Self {
            part,
            message: message.to_string(),
            unavailable: false,
        }
    }

    fn from_db(part: &'static str, e: DbError) -> Self {
        Self {
            part,
            message: e.message,
            unavailable: e.unavailable,
        }
    }

    /// The database could not be reached (a retry may succeed), as opposed to a failed
    /// statement.
    pub fn is_unavailable(&self) -> bool {
        self.unavailable
    }
}

impl From<DbError> for StoreError {
    fn from(e: DbError) -> Self {
        Self::from_db("store", e)
    }
}

/// Now, as RFC 3339 UTC with milliseconds.
fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}
