//! The catalog of resident arrays that replicas share (`--database-url` with
//! `--artifact-store`, as the dataset catalog is shared): one row per array, its values
//! one object in the artifact store (`arrays::shared`). A row is written first as a
//! reservation (`committed = 0`) that counts against the quotas while the values go up,
//! and lapses at `expires_at_ms` if its replica dies before it commits; committing sets
//! the array's own expiry. Deleting first retires the row (`expires_at_ms = 0`: refused at
//! once by every replica), then removes the object, then the row, so an object that
//! cannot be removed yet keeps a row for the next sweep to retry.
//!
//! An embedding table's row says so (`role`, schema version 6), so the tables' own limits
//! are sums over their rows alone. The quotas are sums over the rows, checked under one advisory lock on PostgreSQL
//! (SQLite's write transaction already excludes every other writer), so two replicas
//! reserving at once cannot both fit in the room of one.

use super::database::DbError;
use super::database::{Param, Row, Tx};
use super::{Store, StoreError};
use crate::arrays::{check_room, ArrayError, ArrayLimits, ArrayRole};

const PART: &str = "array catalog";

/// The advisory lock every reservation takes ("arrays" in ASCII).
const RESERVE_LOCK: i64 = 0x0000_6172_7261_7973;

/// A committed array's row: its metadata (`ArrayMeta` as JSON) and the bytes it counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayRow {
    pub meta: String,
    pub bytes: u64,
}

fn row(r: &Row) -> Result<ArrayRow, StoreError> {
    Ok(ArrayRow {
        meta: r.text(0)?,
        bytes: r.u64(1)?,
    })
}

impl From<DbError> for ArrayError {
    fn from(e: DbError) -> Self {
        StoreError::from_db(PART, e).into()
    }
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Bytes and count of the live rows (committed or reserved) of `tenant`, or of everyone;
/// of embedding tables only (`tables_only`), or of all arrays.
fn held(
    tx: &mut Tx<'_>,
    tenant: Option<&str>,
    tables_only: bool,
    now_ms: u64,
) -> Result<(u64, usize), StoreError> {
    let now = i64_of(now_ms);
    let role = if tables_only {
        " AND role = 'embedding_table'"
    } else {
        ""
    };
    let r = match tenant {
        Some(t) => tx.query_opt(
            &format!(
                "SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT), COUNT(*) FROM arrays \
                 WHERE tenant = ?1 AND expires_at_ms > ?2{role}"
            ),
            &[Param::Text(t), Param::I64(now)],
        )?,
        None => tx.query_opt(
            &format!(
                "SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT), COUNT(*) FROM arrays \
                 WHERE expires_at_ms > ?1{role}"
            ),
            &[Param::I64(now)],
        )?,
    };
    let r = r.ok_or_else(|| StoreError::new(PART, "an aggregate returned no row"))?;
    Ok((r.u64(0)?, r.u64(1)? as usize))
}

impl Store {
    /// Whether arrays are shared by replicas: their catalog is the shared one.
    pub fn arrays_shared(&self) -> bool {
        self.is_catalog_shared()
    }

    /// Reserves room for array `id` of `tenant` (`bytes`, within `limits`; an embedding
    /// table's `role` within the tables' too), held until `reserved_until_ms` unless
    /// committed first.
    #[allow(clippy::too_many_arguments)]
    pub fn reserve_array(
        &self,
        id: &str,
        tenant: &str,
        meta: &str,
        role: Option<ArrayRole>,
        bytes: u64,
        limits: &ArrayLimits,
        now_ms: u64,
        reserved_until_ms: u64,
    ) -> Result<(), ArrayError> {
        let table = role == Some(ArrayRole::EmbeddingTable);
        self.catalog.write(PART, |tx| {
            tx.serialize_on(RESERVE_LOCK)?;
            check_room(limits, tenant, table, bytes, |t, tables_only| {
                Ok(held(tx, t, tables_only, now_ms)?)
            })?;
            tx.exec(
                "INSERT INTO arrays (id, tenant, meta, bytes, expires_at_ms, committed, role) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6)",
                &[
                    Param::Text(id),
                    Param::Text(tenant),
                    Param::Text(meta),
                    Param::I64(i64_of(bytes)),
                    Param::I64(i64_of(reserved_until_ms)),
                    Param::Text(role.map_or("", |r| r.name())),
                ],
            )?;
            Ok(())
        })
    }

    /// Commits a reservation whose values are stored, to expire at `expires_at_ms`; an
    /// error if the reservation lapsed (or was swept) first.
    pub fn commit_array(
        &self,
        id: &str,
        expires_at_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let changed = self.catalog.write(PART, |tx| {
            Ok::<_, StoreError>(tx.exec(
                "UPDATE arrays SET committed = 1, expires_at_ms = ?2 \
                 WHERE id = ?1 AND committed = 0 AND expires_at_ms > ?3",
                &[
                    Param::Text(id),
                    Param::I64(i64_of(expires_at_ms)),
                    Param::I64(i64_of(now_ms)),
                ],
            )?)
        })?;
        if changed != 1 {
            return Err(StoreError::new(
                PART,
                format!("{id}: the reservation lapsed before its values were stored"),
            ));
        }
        Ok(())
    }

    /// Removes array `id`'s row, whatever its state.
    pub fn drop_array_row(&self, id: &str) -> Result<(), StoreError> {
        self.catalog.write(PART, |tx| {
            tx.exec("DELETE FROM arrays WHERE id = ?1", &[Param::Text(id)])?;
            Ok(())
        })
    }

    /// The tenant's committed array `id`, unless it has expired or been retired.
    pub fn array(
        &self,
        tenant: &str,
        id: &str,
        now_ms: u64,
    ) -> Result<Option<ArrayRow>, StoreError> {
        self.catalog.read(PART, |tx| {
            tx.query_opt(
                "SELECT meta, bytes FROM arrays WHERE id = ?1 AND tenant = ?2 \
                 AND committed = 1 AND expires_at_ms > ?3",
                &[
                    Param::Text(id),
                    Param::Text(tenant),
                    Param::I64(i64_of(now_ms)),
                ],
            )?
            .as_ref()
            .map(row)
            .transpose()
        })
    }

    /// The tenant's committed arrays that have not expired, by id.
    pub fn arrays_of(&self, tenant: &str, now_ms: u64) -> Result<Vec<ArrayRow>, StoreError> {
        self.catalog.read(PART, |tx| {
            tx.query(
                "SELECT meta, bytes FROM arrays WHERE tenant = ?1 AND committed = 1 \
                 AND expires_at_ms > ?2 ORDER BY id",
                &[Param::Text(tenant), Param::I64(i64_of(now_ms))],
            )?
            .iter()
            .map(row)
            .collect()
        })
    }

    /// Retires the tenant's committed array `id` (every replica refuses it from now on);
    /// its row, if it was live.
    pub fn retire_array(
        &self,
        tenant: &str,
        id: &str,
        now_ms: u64,
    ) -> Result<Option<ArrayRow>, StoreError> {
        self.catalog.write(PART, |tx| {
            let live = tx
                .query_opt(
                    &format!(
                        "SELECT meta, bytes FROM arrays WHERE id = ?1 AND tenant = ?2 \
                         AND committed = 1 AND expires_at_ms > ?3{}",
                        tx.lock_rows()
                    ),
                    &[
                        Param::Text(id),
                        Param::Text(tenant),
                        Param::I64(i64_of(now_ms)),
                    ],
                )?
                .as_ref()
                .map(row)
                .transpose()?;
            if live.is_some() {
                tx.exec(
                    "UPDATE arrays SET expires_at_ms = 0 WHERE id = ?1",
                    &[Param::Text(id)],
                )?;
            }
            Ok(live)
        })
    }

    /// Ids of rows that are gone at `now_ms` (expired, retired, or reservations that
    /// lapsed), at most `limit`, oldest expiry first: what a sweep removes.
    pub fn expired_arrays(&self, now_ms: u64, limit: usize) -> Result<Vec<String>, StoreError> {
        self.catalog.read(PART, |tx| {
            tx.query(
                "SELECT id FROM arrays WHERE expires_at_ms <= ?1 ORDER BY expires_at_ms LIMIT ?2",
                &[Param::I64(i64_of(now_ms)), Param::I64(limit as i64)],
            )?
            .iter()
            .map(|r| Ok(r.text(0)?))
            .collect()
        })
    }

    /// Which of `ids` are committed and live at `now_ms`.
    pub fn live_arrays(&self, ids: &[String], now_ms: u64) -> Result<Vec<String>, StoreError> {
        self.catalog.read(PART, |tx| {
            let mut live = Vec::new();
            for id in ids {
                let r = tx.query_opt(
                    "SELECT id FROM arrays WHERE id = ?1 AND committed = 1 AND expires_at_ms > ?2",
                    &[Param::Text(id), Param::I64(i64_of(now_ms))],
                )?;
                if r.is_some() {
                    live.push(id.clone());
                }
            }
            Ok(live)
        })
    }

    /// Bytes and count of every committed array that has not expired.
    pub fn arrays_held(&self, now_ms: u64) -> Result<(u64, usize), StoreError> {
        self.catalog.read(PART, |tx| {
            let r = tx
                .query_opt(
                    "SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT), COUNT(*) FROM arrays \
                     WHERE committed = 1 AND expires_at_ms > ?1",
                    &[Param::I64(i64_of(now_ms))],
                )?
                .ok_or_else(|| StoreError::new(PART, "an aggregate returned no row"))?;
            Ok((r.u64(0)?, r.u64(1)? as usize))
        })
    }
}

#[cfg(test)]
mod tests;
