//! The two databases behind the store, with one way to run a transaction on
//! either: the embedded SQLite file (the default) and PostgreSQL (`--database-url
//! postgres://…`, shared by replicas). Store code writes its SQL once, with SQLite's
//! `?N` placeholders (rewritten to `$N` for PostgreSQL), binds `Param`s and reads
//! `Row`s, so what a charge or a claim means is written once and the databases only lock,
//! read and write.
//!
//! Both clients are synchronous. The store is called from blocking threads (the API's
//! `blocking`, the dataset worker), never from an async task: PostgreSQL's client runs
//! each connection on a runtime of its own, which may not be started or dropped inside
//! another's (hence `open` and `Drop` on plain threads).

use super::StoreError;
use postgres::types::{ToSql, Type};
use r2d2_postgres::{postgres::NoTls, PostgresConnectionManager};
use rusqlite::{Connection, TransactionBehavior};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) type PgPool = r2d2::Pool<PostgresConnectionManager<NoTls>>;

/// How long a request waits for a pooled PostgreSQL connection before it is answered
/// 503 `storage_unavailable`.
const PG_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) enum Database {
    Sqlite(Arc<Mutex<Connection>>),
    /// In an `Option` only so that `Drop` can move it to a plain thread.
    Postgres(Option<PgPool>),
}

/// A value bound to a placeholder.
#[derive(Clone, Copy, Debug)]
pub(super) enum Param<'a> {
    Text(&'a str),
    OptText(Option<&'a str>),
    I64(i64),
    F64(f64),
    OptF64(Option<f64>),
    Blob(&'a [u8]),
}

/// One cell read back; integers and floats as the databases store them.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Cell {
    Null,
    I64(i64),
    F64(f64),
    Text(String),
    Blob(Vec<u8>),
}

#[derive(Debug)]
pub(super) struct Row(Vec<Cell>);

/// A database's error, and whether it means "cannot reach the database" (503, retry)
/// rather than "the statement failed" (500).
#[derive(Debug)]
pub(super) struct DbError {
    pub message: String,
    pub unavailable: bool,
}

impl DbError {
    fn failed(e: impl std::fmt::Display) -> Self {
        Self {
            message: e.to_string(),
            unavailable: false,
        }
    }
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        Self::failed(e)
    }
}

impl From<postgres::Error> for DbError {
    fn from(e: postgres::Error) -> Self {
        // The database went away, not our SQL: a closed connection, an I/O or connect
        // failure (no SQLSTATE, and not a type conversion of ours), or the server saying
        // so: connection exceptions (08), shutdown and failover (57P01-57P03), too many
        // connections (53300), a lock not had in time (55P03).
        let state = e.code().map(|c| c.code().to_string());
        let text = e.to_string();
        let ours = text.contains("conversion") || text.contains("serializ");
        let unavailable = e.is_closed()
            || state.is_none() && e.as_db_error().is_none() && !ours
            || state.as_deref().is_some_and(|c| {
                c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "53300" | "55P03")
            });
        Self {
            message: e.to_string(),
            unavailable,
        }
    }
}

impl Row {
    fn cell(&self, i: usize) -> Result<&Cell, DbError> {
        self.0
            .get(i)
            .ok_or_else(|| DbError::failed(format!("column {i} is missing")))
    }

    fn mismatch(&self, i: usize, want: &str) -> DbError {
        DbError::failed(format!("column {i} is {:?}, expected {want}", self.0[i]))
    }

    pub fn text(&self, i: usize) -> Result<String, DbError> {
        self.opt_text(i)?.ok_or_else(|| self.mismatch(i, "text"))
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, DbError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Text(s) => Ok(Some(s.clone())),
            _ => Err(self.mismatch(i, "text")),
        }
    }

    pub fn i64(&self, i: usize) -> Result<i64, DbError> {
        match self.cell(i)? {
            Cell::I64(v) => Ok(*v),
            _ => Err(self.mismatch(i, "an integer")),
        }
    }

    pub fn u64(&self, i: usize) -> Result<u64, DbError> {
        let v = self.i64(i)?;
        u64::try_from(v).map_err(|_| self.mismatch(i, "a non-negative integer"))
    }

    pub fn f64(&self, i: usize) -> Result<f64, DbError> {
        self.opt_f64(i)?.ok_or_else(|| self.mismatch(i, "a number"))
    }

    pub fn opt_f64(&self, i: usize) -> Result<Option<f64>, DbError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::F64(v) => Ok(Some(*v)),
            // SQLite hands back a REAL column's integral value as written by an
            // expression; PostgreSQL's columns are typed.
            Cell::I64(v) => Ok(Some(*v as f64)),
            Cell::Text(_) | Cell::Blob(_) => Err(self.mismatch(i, "a number")),
        }
    }

    pub fn opt_blob(&self, i: usize) -> Result<Option<Vec<u8>>, DbError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Blob(b) => Ok(Some(b.clone())),
            _ => Err(self.mismatch(i, "bytes")),
        }
    }
}

/// An open transaction on either database. Dropped without `commit`, it rolls back.
pub(super) enum Tx<'c> {
    Sqlite(rusqlite::Transaction<'c>),
    Postgres(postgres::Transaction<'c>),
}

impl Tx<'_> {
    /// `FOR UPDATE` where the database locks rows; SQLite's write transaction already holds
    /// the database's one write lock from its first statement.
    pub fn lock_rows(&self) -> &'static str {
        match self {
            Tx::Sqlite(_) => "",
            Tx::Postgres(_) => " FOR UPDATE",
        }
    }

    /// `FOR UPDATE SKIP LOCKED` where the database has it: claimers at once take different
    /// rows instead of queueing on one.
    pub fn skip_locked(&self) -> &'static str {
        match self {
            Tx::Sqlite(_) => "",
            Tx::Postgres(_) => " FOR UPDATE SKIP LOCKED",
        }
    }

    /// Serialises this transaction with every other that takes `key`, until it ends
    /// (PostgreSQL: a transaction-level advisory lock; SQLite's write transaction already
    /// excludes every other writer).
    pub fn serialize_on(&mut self, key: i64) -> Result<(), DbError> {
        match self {
            Tx::Sqlite(_) => Ok(()),
            Tx::Postgres(tx) => {
                tx.execute("SELECT pg_advisory_xact_lock($1)", &[&key])?;
                Ok(())
            }
        }
    }

    pub fn exec(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, DbError> {
        match self {
            Tx::Sqlite(tx) => Ok(tx.execute(sql, rusqlite::params_from_iter(params))? as u64),
            Tx::Postgres(tx) => Ok(tx.execute(&postgres_sql(sql), &pg_params(params))?),
        }
    }

    pub fn query(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, DbError> {
        match self {
            Tx::Sqlite(tx) => {
                let mut stmt = tx.prepare(sql)?;
                let width = stmt.column_count();
                let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    out.push(Row((0..width)
                        .map(|i| sqlite_cell(r.get_ref(i)?))
                        .collect::<Result<_, _>>()?));
                }
                Ok(out)
            }
            Tx::Postgres(tx) => tx
                .query(&postgres_sql(sql), &pg_params(params))?
                .iter()
                .map(pg_row)
                .collect(),
        }
    }

    /// At most one row (the first).
    pub fn query_opt(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Row>, DbError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    pub fn commit(self) -> Result<(), DbError> {
        match self {
            Tx::Sqlite(tx) => Ok(tx.commit()?),
            Tx::Postgres(tx) => Ok(tx.commit()?),
        }
    }
}

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, Value, ValueRef};
        Ok(match *self {
            Param::Text(s) | Param::OptText(Some(s)) => {
                ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes()))
            }
            Param::OptText(None) | Param::OptF64(None) => ToSqlOutput::Owned(Value::Null),
            Param::I64(v) => ToSqlOutput::Owned(Value::Integer(v)),
            Param::F64(v) | Param::OptF64(Some(v)) => ToSqlOutput::Owned(Value::Real(v)),
            Param::Blob(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
        })
    }
}

fn pg_params<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| -> &(dyn ToSql + Sync) {
            match p {
                Param::Text(s) => s,
                Param::OptText(s) => s,
                Param::I64(v) => v,
                Param::F64(v) => v,
                Param::OptF64(v) => v,
                Param::Blob(b) => b,
            }
        })
        .collect()
}

fn sqlite_cell(v: rusqlite::types::ValueRef<'_>) -> rusqlite::Result<Cell> {
    use rusqlite::types::ValueRef;
    Ok(match v {
        ValueRef::Null => Cell::Null,
        ValueRef::Integer(i) => Cell::I64(i),
        ValueRef::Real(f) => Cell::F64(f),
        ValueRef::Text(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Cell::Blob(b.to_vec()),
    })
}

fn pg_row(r: &postgres::Row) -> Result<Row, DbError> {
    let cells = r
        .columns()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let t = c.type_();
            Ok(if *t == Type::INT8 {
                r.try_get::<_, Option<i64>>(i)?
                    .map_or(Cell::Null, Cell::I64)
            } else if *t == Type::INT4 {
                r.try_get::<_, Option<i32>>(i)?
                    .map_or(Cell::Null, |v| Cell::I64(v.into()))
            } else if *t == Type::FLOAT8 {
                r.try_get::<_, Option<f64>>(i)?
                    .map_or(Cell::Null, Cell::F64)
            } else if *t == Type::TEXT || *t == Type::VARCHAR {
                r.try_get::<_, Option<String>>(i)?
                    .map_or(Cell::Null, Cell::Text)
            } else if *t == Type::BYTEA {
                r.try_get::<_, Option<Vec<u8>>>(i)?
                    .map_or(Cell::Null, Cell::Blob)
            } else if *t == Type::BOOL {
                r.try_get::<_, Option<bool>>(i)?
                    .map_or(Cell::Null, |b| Cell::I64(b.into()))
            } else {
                return Err(DbError::failed(format!(
                    "column {} has type {t}, which the store does not read",
                    c.name()
                )));
            })
        })
        .collect::<Result<_, DbError>>()?;
    Ok(Row(cells))
}

/// SQLite's numbered placeholders (`?1`) as PostgreSQL's (`$1`). The store's SQL has no
/// `?` anywhere else (no string literals carry one).
pub(super) fn postgres_sql(sql: &str) -> String {
    sql.replace('?', "$")
}

impl Database {
    /// Connects a pool to `url` (a `postgres://` or `postgresql://` URL) and checks one
    /// connection out, on a plain thread (see the module's note).
    pub fn connect_postgres(url: &str, max_connections: u32) -> Result<Self, String> {
        let mut config: postgres::Config =
            url.parse().map_err(|e| format!("--database-url: {e}"))?;
        // A replica cut off mid-transaction must not hold a budget's row lock for long:
        // TCP keepalives find a dead peer, and the server ends a transaction left idle.
        // No statement waits on a lock or runs without end.
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .connect_timeout(PG_CHECKOUT_TIMEOUT)
            .options(
                "-c idle_in_transaction_session_timeout=30000 -c lock_timeout=15000 \
                 -c statement_timeout=60000",
            );
        std::thread::scope(|s| {
            s.spawn(|| {
                let manager = PostgresConnectionManager::new(config, NoTls);
                let pool = r2d2::Pool::builder()
                    .max_size(max_connections)
                    .min_idle(Some(1))
                    .connection_timeout(PG_CHECKOUT_TIMEOUT)
                    .build(manager)
                    .map_err(|e| format!("--database-url: cannot connect: {e}"))?;
                Ok(Database::Postgres(Some(pool)))
            })
            .join()
            .unwrap_or_else(|_| Err("--database-url: the connection thread panicked".into()))
        })
    }

    /// Applies PostgreSQL's migrations (a no-op on SQLite, which `Store::open` migrates),
    /// on a plain thread.
    pub fn migrate_postgres(&self) -> Result<u32, String> {
        let Database::Postgres(Some(pool)) = self else {
            return Ok(super::migrations::latest());
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut client = pool.get().map_err(|e| format!("cannot connect: {e}"))?;
                super::migrations::migrate_postgres(&mut client)
            })
            .join()
            .unwrap_or_else(|_| Err("the migration thread panicked".into()))
        })
    }

    /// Another handle on the same database (the same connection or pool).
    pub fn share(&self) -> Database {
        match self {
            Database::Sqlite(conn) => Database::Sqlite(conn.clone()),
            Database::Postgres(pool) => Database::Postgres(pool.clone()),
        }
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, Database::Postgres(_))
    }

    /// Runs `f` in a transaction that takes the write lock (SQLite: IMMEDIATE; PostgreSQL:
    /// READ COMMITTED, with `FOR UPDATE` on the rows it must serialise on) and commits if
    /// `f` succeeds.
    pub fn write<T, E: From<StoreError>>(
        &self,
        part: &'static str,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.transaction(part, TransactionBehavior::Immediate, f)
    }

    /// Runs `f` in a read transaction (one consistent snapshot).
    pub fn read<T, E: From<StoreError>>(
        &self,
        part: &'static str,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.transaction(part, TransactionBehavior::Deferred, f)
    }

    fn transaction<T, E: From<StoreError>>(
        &self,
        part: &'static str,
        behavior: TransactionBehavior,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let fail = |e: DbError| E::from(StoreError::from_db(part, e));
        match self {
            Database::Sqlite(conn) => {
                let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
                let tx = conn
                    .transaction_with_behavior(behavior)
                    .map_err(|e| fail(e.into()))?;
                let mut tx = Tx::Sqlite(tx);
                let out = f(&mut tx)?;
                tx.commit().map_err(fail)?;
                Ok(out)
            }
            Database::Postgres(pool) => {
                let pool = pool.as_ref().expect("the pool lives until drop");
                let mut client = pool.get().map_err(|e| {
                    fail(DbError {
                        message: format!("no database connection: {e}"),
                        unavailable: true,
                    })
                })?;
                // A read sees one snapshot (REPEATABLE READ), so rows read one after
                // another agree; writes lock what they change and run at READ COMMITTED.
                let tx = match behavior {
                    TransactionBehavior::Deferred => client
                        .build_transaction()
                        .isolation_level(postgres::IsolationLevel::RepeatableRead)
                        .start(),
                    _ => client.transaction(),
                }
                .map_err(|e| fail(e.into()))?;
                let mut tx = Tx::Postgres(tx);
                let out = f(&mut tx)?;
                tx.commit().map_err(fail)?;
                Ok(out)
            }
        }
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if let Database::Postgres(pool) = self {
            if let Some(pool) = pool.take() {
                // Each connection owns a runtime, which may not be dropped on an async
                // thread; a plain one may drop it anywhere.
                let _ = std::thread::spawn(move || drop(pool)).join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_rewritten_for_postgres() {
        assert_eq!(
            postgres_sql("UPDATE t SET a = ?2 WHERE id = ?1 AND b = ?10"),
            "UPDATE t SET a = $2 WHERE id = $1 AND b = $10"
        );
    }

    #[test]
    fn sqlite_rows_read_back_typed_and_a_failed_closure_rolls_back() {
        let db = Database::Sqlite(Arc::new(Mutex::new(Connection::open_in_memory().unwrap())));
        db.write("test", |tx| {
            tx.exec("CREATE TABLE t (a TEXT, b INTEGER, c REAL)", &[])?;
            tx.exec(
                "INSERT INTO t VALUES (?1, ?2, ?3)",
                &[Param::Text("x"), Param::I64(-3), Param::OptF64(None)],
            )?;
            Ok::<_, StoreError>(())
        })
        .unwrap();
        let refused: Result<(), StoreError> = db.write("test", |tx| {
            tx.exec("INSERT INTO t VALUES ('y', 1, 1.5)", &[])?;
            Err(StoreError::new("test", "refused"))
        });
        assert!(refused.is_err());
        let rows = db
            .read("test", |tx| {
                Ok::<_, StoreError>(tx.query("SELECT a, b, c FROM t", &[])?)
            })
            .unwrap();
        assert_eq!(rows.len(), 1, "the refused insert rolled back");
        assert_eq!(rows[0].text(0).unwrap(), "x");
        assert_eq!(rows[0].i64(1).unwrap(), -3);
        assert!(rows[0].u64(1).is_err());
        assert_eq!(rows[0].opt_f64(2).unwrap(), None);
        assert!(rows[0].text(1).is_err());
    }
}
