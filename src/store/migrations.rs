//! Versioned schema changes, applied in order when the store opens; the version is
//! SQLite's `user_version`. Version 1 is the schema every data directory had before
//! versions existed (written with `CREATE … IF NOT EXISTS`, version 0): such a directory
//! gains nothing it lacks and is marked 1, its rows untouched. A database from a newer
//! build, at a version this build does not know, is refused rather than guessed at.
//!
//! A schema change is a new entry at the end, never an edit of a shipped one.

use rusqlite::{Connection, TransactionBehavior};

pub(super) struct Migration {
    pub version: u32,
    pub name: &'static str,
    /// The change on the embedded SQLite file.
    pub sql: &'static str,
    /// The same change on PostgreSQL: the same tables, columns and meaning, in its types.
    pub postgres: &'static str,
}

pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "privacy budgets, their ledger, the dataset catalog",
        sql: concat!(
            "
CREATE TABLE IF NOT EXISTS budgets (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT,
    accountant TEXT NOT NULL,
    epsilon_limit REAL NOT NULL,
    delta REAL NOT NULL,
    orders TEXT NOT NULL,
    rdp TEXT NOT NULL,
    epsilon_spent REAL NOT NULL,
    optimal_order REAL,
    charges INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS budgets_by_tenant ON budgets (tenant, created_at);
CREATE TABLE IF NOT EXISTS budget_charges (
    budget_id TEXT NOT NULL REFERENCES budgets (id),
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    params TEXT NOT NULL,
    rdp TEXT NOT NULL,
    epsilon_after REAL NOT NULL,
    status TEXT NOT NULL,
    at TEXT NOT NULL,
    PRIMARY KEY (budget_id, seq)
);
",
            "
CREATE TABLE IF NOT EXISTS datasets (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    dataset_type TEXT NOT NULL,
    num_samples INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    valid INTEGER NOT NULL DEFAULT 0,
    attempted INTEGER NOT NULL DEFAULT 0,
    rejected_too_few_receivers INTEGER NOT NULL DEFAULT 0,
    rejected_low_snr INTEGER NOT NULL DEFAULT 0,
    rejected_high_gdop INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    created_at TEXT NOT NULL,
    started_at TEXT,
    finished_at TEXT
);
CREATE INDEX IF NOT EXISTS datasets_by_tenant ON datasets (tenant, created_at);
"
        ),
        postgres: "
CREATE TABLE budgets (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT,
    accountant TEXT NOT NULL,
    epsilon_limit DOUBLE PRECISION NOT NULL,
    delta DOUBLE PRECISION NOT NULL,
    orders TEXT NOT NULL,
    rdp TEXT NOT NULL,
    epsilon_spent DOUBLE PRECISION NOT NULL,
    optimal_order DOUBLE PRECISION,
    charges BIGINT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX budgets_by_tenant ON budgets (tenant, created_at);
CREATE TABLE budget_charges (
    budget_id TEXT NOT NULL REFERENCES budgets (id),
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    params TEXT NOT NULL,
    rdp TEXT NOT NULL,
    epsilon_after DOUBLE PRECISION NOT NULL,
    status TEXT NOT NULL,
    at TEXT NOT NULL,
    PRIMARY KEY (budget_id, seq)
);
CREATE TABLE datasets (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    dataset_type TEXT NOT NULL,
    num_samples BIGINT NOT NULL,
    seed BIGINT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    valid BIGINT NOT NULL DEFAULT 0,
    attempted BIGINT NOT NULL DEFAULT 0,
    rejected_too_few_receivers BIGINT NOT NULL DEFAULT 0,
    rejected_low_snr BIGINT NOT NULL DEFAULT 0,
    rejected_high_gdop BIGINT NOT NULL DEFAULT 0,
    error TEXT,
    created_at TEXT NOT NULL,
    started_at TEXT,
    finished_at TEXT
);
CREATE INDEX datasets_by_tenant ON datasets (tenant, created_at);
",
    },
    Migration {
        version: 2,
        name: "the dataset queue: order, worker leases, cancellation requests",
        sql: "
ALTER TABLE datasets ADD COLUMN queue_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE datasets ADD COLUMN lease_owner TEXT;
ALTER TABLE datasets ADD COLUMN lease_until INTEGER NOT NULL DEFAULT 0;
ALTER TABLE datasets ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE datasets ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
UPDATE datasets SET queue_seq = rowid;
CREATE INDEX datasets_queue ON datasets (status, queue_seq);
",
        postgres: "
ALTER TABLE datasets ADD COLUMN queue_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE datasets ADD COLUMN lease_owner TEXT;
ALTER TABLE datasets ADD COLUMN lease_until BIGINT NOT NULL DEFAULT 0;
ALTER TABLE datasets ADD COLUMN attempt BIGINT NOT NULL DEFAULT 0;
ALTER TABLE datasets ADD COLUMN cancel_requested BIGINT NOT NULL DEFAULT 0;
CREATE INDEX datasets_queue ON datasets (status, queue_seq);
",
    },
    Migration {
        version: 3,
        name: "secure-aggregation rounds: members, sealed share messages, revealed shares",
        sql: "
CREATE TABLE secagg_rounds (
    id TEXT PRIMARY KEY,
    coordinator_token TEXT NOT NULL,
    config TEXT NOT NULL,
    stage TEXT NOT NULL,
    failure TEXT,
    sum BLOB,
    result BLOB,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE secagg_members (
    round_id TEXT NOT NULL REFERENCES secagg_rounds (id),
    client_id INTEGER NOT NULL,
    token TEXT NOT NULL,
    share_key TEXT NOT NULL,
    mask_key TEXT NOT NULL,
    self_mask_commitment TEXT,
    shared INTEGER NOT NULL DEFAULT 0,
    uploaded INTEGER NOT NULL DEFAULT 0,
    unmasked INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (round_id, client_id)
);
CREATE UNIQUE INDEX secagg_members_by_token ON secagg_members (round_id, token);
CREATE TABLE secagg_messages (
    round_id TEXT NOT NULL REFERENCES secagg_rounds (id),
    recipient INTEGER NOT NULL,
    sender INTEGER NOT NULL,
    ciphertext TEXT NOT NULL,
    PRIMARY KEY (round_id, recipient, sender)
);
CREATE TABLE secagg_reveals (
    round_id TEXT NOT NULL REFERENCES secagg_rounds (id),
    owner INTEGER NOT NULL,
    holder INTEGER NOT NULL,
    secret TEXT NOT NULL,
    share TEXT NOT NULL,
    PRIMARY KEY (round_id, owner, holder)
);
",
        postgres: "
CREATE TABLE secagg_rounds (
    id TEXT PRIMARY KEY,
    coordinator_token TEXT NOT NULL,
    config TEXT NOT NULL,
    stage TEXT NOT NULL,
    failure TEXT,
    sum BYTEA,
    result BYTEA,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE secagg_members (
    round_id TEXT NOT NULL REFERENCES secagg_rounds (id),
    client_id BIGINT NOT NULL,
    token TEXT NOT NULL,
    share_key TEXT NOT NULL,
    mask_key TEXT NOT NULL,
    self_mask_commitment TEXT,
    shared BIGINT NOT NULL DEFAULT 0,
    uploaded BIGINT NOT NULL DEFAULT 0,
    unmasked BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (round_id, client_id)
);
CREATE UNIQUE INDEX secagg_members_by_token ON secagg_members (round_id, token);
CREATE TABLE secagg_messages (
    round_id TEXT NOT NULL REFERENCES secagg_rounds (id),
    recipient BIGINT NOT NULL,
    sender BIGINT NOT NULL,
    ciphertext TEXT NOT NULL,
    PRIMARY KEY (round_id, recipient, sender)
);
CREATE TABLE secagg_reveals (
    round_id TEXT NOT NULL REFERENCES secagg_rounds (id),
    owner BIGINT NOT NULL,
    holder BIGINT NOT NULL,
    secret TEXT NOT NULL,
    share TEXT NOT NULL,
    PRIMARY KEY (round_id, owner, holder)
);
",
    },
    Migration {
        version: 4,
        name: "the work each dataset job asks for, counted against its tenant's limit",
        sql: "
ALTER TABLE datasets ADD COLUMN work INTEGER NOT NULL DEFAULT 0;
CREATE INDEX datasets_by_tenant_status ON datasets (tenant, status, queue_seq);
",
        postgres: "
ALTER TABLE datasets ADD COLUMN work BIGINT NOT NULL DEFAULT 0;
CREATE INDEX datasets_by_tenant_status ON datasets (tenant, status, queue_seq);
",
    },
    Migration {
        version: 5,
        name: "the catalog of resident arrays shared by replicas",
        sql: "
CREATE TABLE arrays (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    meta TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    committed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX arrays_by_tenant ON arrays (tenant, expires_at_ms);
CREATE INDEX arrays_by_expiry ON arrays (expires_at_ms);
",
        postgres: "
CREATE TABLE arrays (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    meta TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    committed BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX arrays_by_tenant ON arrays (tenant, expires_at_ms);
CREATE INDEX arrays_by_expiry ON arrays (expires_at_ms);
",
    },
    Migration {
        version: 6,
        name: "embedding tables among the shared arrays, held to their own limits too",
        sql: "
ALTER TABLE arrays ADD COLUMN role TEXT NOT NULL DEFAULT '';
",
        postgres: "
ALTER TABLE arrays ADD COLUMN role TEXT NOT NULL DEFAULT '';
",
    },
];

/// The version this build writes.
pub(super) fn latest() -> u32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Brings `conn`'s schema to `latest()`, each step in its own transaction with its
/// version, under a write lock taken first (two processes opening one directory migrate
/// once). Returns the version it found.
pub(super) fn migrate(conn: &mut Connection) -> Result<u32, String> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| e.to_string())?;
    let found: u32 = tx
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if found > latest() {
        return Err(newer_than_this_build(found));
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > found) {
        tx.execute_batch(m.sql)
            .and_then(|_| tx.pragma_update(None, "user_version", m.version))
            .map_err(|e| format!("schema version {} ({}): {e}", m.version, m.name))?;
        tracing::info!(version = m.version, name = m.name, "store schema migrated");
    }
    tx.commit().map_err(|e| e.to_string())?;
    Ok(found)
}

/// The key of the advisory lock replicas take while migrating a PostgreSQL database, so
/// that replicas starting together migrate it once ("gpu-ops" in ASCII).
const PG_MIGRATION_LOCK: i64 = 0x0067_7075_2d6f_7073;

/// Brings a PostgreSQL database to `latest()`: one transaction under an advisory lock,
/// the applied versions in `gpu_ops_schema`. Returns the version it found.
pub(super) fn migrate_postgres(client: &mut postgres::Client) -> Result<u32, String> {
    let mut tx = client.transaction().map_err(|e| e.to_string())?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PG_MIGRATION_LOCK])
        .map_err(|e| e.to_string())?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS gpu_ops_schema (version BIGINT PRIMARY KEY, \
         name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .map_err(|e| e.to_string())?;
    let found: i64 = tx
        .query_one("SELECT COALESCE(MAX(version), 0) FROM gpu_ops_schema", &[])
        .and_then(|r| r.try_get(0))
        .map_err(|e| e.to_string())?;
    let found = u32::try_from(found).map_err(|_| format!("schema version {found} is corrupt"))?;
    if found > latest() {
        return Err(newer_than_this_build(found));
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > found) {
        tx.batch_execute(m.postgres)
            .and_then(|_| {
                tx.execute(
                    "INSERT INTO gpu_ops_schema (version, name) VALUES ($1, $2)",
                    &[&i64::from(m.version), &m.name],
                )
            })
            .map_err(|e| format!("schema version {} ({}): {e}", m.version, m.name))?;
        tracing::info!(
            version = m.version,
            name = m.name,
            "shared store schema migrated"
        );
    }
    tx.commit().map_err(|e| e.to_string())?;
    Ok(found)
}

fn newer_than_this_build(found: u32) -> String {
    format!(
        "the database is at schema version {found}, and this build knows versions up to {}: \
         run the build that wrote it (or a newer one), or restore a backup",
        latest()
    )
}

#[cfg(test)]
mod tests {
    use super::super::Store;
    use super::*;

    fn fresh_dir(tag: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpu-ops-migrate-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn version(dir: &std::path::Path) -> u32 {
        Connection::open(dir.join("gpu-ops.sqlite3"))
            .unwrap()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn a_new_directory_is_created_at_the_latest_version() {
        let dir = fresh_dir("new");
        Store::open(&dir).unwrap();
        assert_eq!(version(&dir), latest());
        // Opening again changes nothing.
        Store::open(&dir).unwrap();
        assert_eq!(version(&dir), latest());
    }

    #[test]
    fn a_directory_from_before_versions_keeps_its_rows() {
        // What builds before versions wrote: the same tables, user_version 0, and rows.
        let dir = fresh_dir("unversioned");
        {
            let conn = Connection::open(dir.join("gpu-ops.sqlite3")).unwrap();
            conn.execute_batch(MIGRATIONS[0].sql).unwrap();
            conn.execute(
                "INSERT INTO budgets VALUES ('b1', 't', 'old', 'rdp', 3.0, 1e-5, '[2.0]', '[0.5]', \
                 1.25, 2.0, 1, '2026-11-01T00:00:00Z', '2026-11-01T00:00:00Z')",
                [],
            )
            .unwrap();
            assert_eq!(version(&dir), 0);
        }
        {
            let conn = Connection::open(dir.join("gpu-ops.sqlite3")).unwrap();
            conn.execute(
                "INSERT INTO datasets (id, tenant, name, dataset_type, num_samples, seed, config, \
                 status, valid, created_at, finished_at) VALUES ('ds_old', 't', 'old', 'features', \
                 5, -1, '{}', 'interrupted', 2, '2026-11-01T00:00:00Z', '2026-11-01T00:01:00Z')",
                [],
            )
            .unwrap();
        }
        let store = Store::open(&dir).unwrap();
        assert_eq!(version(&dir), latest());
        let b = store.budget("t", "b1").unwrap();
        assert_eq!((b.epsilon_spent, b.charges), (1.25, 1));
        // Version 2 put the old job in the queue's order: it can be resumed and claimed.
        let d = store.dataset("t", "ds_old").unwrap().unwrap();
        assert_eq!((d.seed, d.counts.valid), (u64::MAX, 2));
        assert_eq!(
            store
                .requeue_dataset("ds_old", crate::store::QueueCaps::total(4))
                .unwrap(),
            super::super::Requeue::Queued
        );
        let job = store
            .claim_dataset("w", std::time::Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!((job.row.id.as_str(), job.attempt), ("ds_old", 1));
    }

    #[test]
    fn a_database_from_a_newer_build_is_refused() {
        let dir = fresh_dir("newer");
        Store::open(&dir).unwrap();
        Connection::open(dir.join("gpu-ops.sqlite3"))
            .unwrap()
            .pragma_update(None, "user_version", latest() + 1)
            .unwrap();
        let e = Store::open(&dir).err().expect("refused");
        assert!(
            e.contains(&format!("schema version {}", latest() + 1)),
            "{e}"
        );
    }
}
