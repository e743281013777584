//! What the arrays are held to and what they export: the limits from the flags, the
//! metrics, and the catalog of committed arrays and of those being written, whose sums
//! the quotas check.

use super::{ArrayError, ResidentArray};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The limits of `Arrays`, from the flags.
#[derive(Clone, Copy, Debug)]
pub struct ArrayLimits {
    pub tenant_bytes: u64,
    pub tenant_count: usize,
    pub server_bytes: u64,
    pub server_count: usize,
    /// The longest a read of a result held on a device waits for a lease there
    /// (`--job-timeout`): then 504 `deadline_exceeded`, the array still held.
    pub read_back_wait: std::time::Duration,
    /// Embedding tables are held to these as well.
    pub tables: TableLimits,
}

/// The limits embedding tables had before they were arrays, which they keep within the
/// arrays' own (`--max-tenant-embedding-mib`, `--max-tenant-embedding-tables`,
/// `--max-embedding-tables-mib`).
#[derive(Clone, Copy, Debug)]
pub struct TableLimits {
    pub tenant_bytes: u64,
    pub tenant_count: usize,
    pub server_bytes: u64,
}

impl TableLimits {
    /// No limit beyond the arrays' own.
    pub const NONE: TableLimits = TableLimits {
        tenant_bytes: u64::MAX,
        tenant_count: usize::MAX,
        server_bytes: u64::MAX,
    };
}

/// Whether an array of `need` bytes of `tenant`'s (an embedding table when `table`) fits
/// beside what is held: `held(tenant, tables_only)` answers the bytes and count of one
/// tenant's arrays (`Some`) or of everyone's (`None`), of embedding tables only or of all.
/// The same check for arrays kept here and for those in the shared catalog.
pub fn check_room(
    limits: &ArrayLimits,
    tenant: &str,
    table: bool,
    need: u64,
    mut held: impl FnMut(Option<&str>, bool) -> Result<(u64, usize), ArrayError>,
) -> Result<(), ArrayError> {
    if table {
        let t = &limits.tables;
        let (used, count) = held(Some(tenant), true)?;
        if count >= t.tenant_count {
            return Err(ArrayError::TablesTooMany {
                count,
                cap: t.tenant_count,
            });
        }
        if used.saturating_add(need) > t.tenant_bytes {
            return Err(ArrayError::TableQuotaExceeded {
                need,
                used,
                quota: t.tenant_bytes,
            });
        }
        let (all, _) = held(None, true)?;
        if all.saturating_add(need) > t.server_bytes {
            return Err(ArrayError::TablesFull {
                need,
                used: all,
                cap: t.server_bytes,
            });
        }
    }
    let (used, count) = held(Some(tenant), false)?;
    if count >= limits.tenant_count {
        return Err(ArrayError::TooMany {
            count,
            cap: limits.tenant_count,
        });
    }
    if used.saturating_add(need) > limits.tenant_bytes {
        return Err(ArrayError::QuotaExceeded {
            need,
            used,
            quota: limits.tenant_bytes,
        });
    }
    let (all, all_count) = held(None, false)?;
    if all.saturating_add(need) > limits.server_bytes {
        return Err(ArrayError::Full {
            need,
            used: all,
            cap: limits.server_bytes,
        });
    }
    if all_count >= limits.server_count {
        return Err(ArrayError::FullCount {
            count: all_count,
            cap: limits.server_count,
        });
    }
    Ok(())
}

/// What the arrays export (registered by `Metrics`; fresh ones in unit tests).
#[derive(Clone)]
pub struct ArrayMetrics {
    /// Bytes held, by tier (`host`, `disk`).
    pub bytes: prometheus::IntGaugeVec,
    pub count: prometheus::IntGauge,
    /// Refusals by reason (`ArrayError::reason`).
    pub refused: prometheus::IntCounterVec,
    pub expired: prometheus::IntCounter,
    /// Operands that named an array, by kind.
    pub uses: prometheus::IntCounterVec,
    /// Results held on a device read back, by result (`read`, `lost`).
    pub reads_back: prometheus::IntCounterVec,
}

impl ArrayMetrics {
    /// Unregistered metrics, for tests of the store alone.
    pub fn unregistered() -> Self {
        use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
        let opts = |n: &str| Opts::new(n, n);
        Self {
            bytes: IntGaugeVec::new(opts("b"), &["tier"]).expect("metric"),
            count: IntGauge::with_opts(opts("c")).expect("metric"),
            refused: IntCounterVec::new(opts("r"), &["reason"]).expect("metric"),
            expired: IntCounter::with_opts(opts("e")).expect("metric"),
            uses: IntCounterVec::new(opts("u"), &["kind"]).expect("metric"),
            reads_back: IntCounterVec::new(opts("rb"), &["result"]).expect("metric"),
        }
    }
}

/// The committed arrays, and the arrays being written (by id: tenant, bytes, whether an
/// embedding table), which count against the quotas until they commit or fail.
#[derive(Default)]
pub(super) struct Catalog {
    pub(super) arrays: BTreeMap<String, Arc<ResidentArray>>,
    pub(super) writing: BTreeMap<String, (String, u64, bool)>,
}

impl Catalog {
    /// Bytes and count held or being written: the tenant's, or everyone's; of embedding
    /// tables only, or of all arrays.
    pub(super) fn held(&self, tenant: Option<&str>, tables_only: bool) -> (u64, usize) {
        let mine =
            |t: &str, table: bool| tenant.is_none_or(|want| want == t) && (table || !tables_only);
        let kept = self
            .arrays
            .values()
            .filter(|a| mine(&a.meta.tenant, a.meta.is_table()))
            .map(|a| a.bytes());
        let writing = self
            .writing
            .values()
            .filter(|(t, _, table)| mine(t, *table))
            .map(|(_, b, _)| *b);
        kept.chain(writing)
            .fold((0, 0), |(bytes, n), b| (bytes + b, n + 1))
    }
}
