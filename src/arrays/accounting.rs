//! What the arrays are held to and what they export: the limits from the flags, the
//! metrics, and the catalog of committed arrays and of those being written, whose sums
//! the quotas check.

use super::ResidentArray;
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

/// The committed arrays, and the bytes of arrays being written (by id: tenant, bytes),
/// which count against the quotas until they commit or fail.
#[derive(Default)]
pub(super) struct Catalog {
    pub(super) arrays: BTreeMap<String, Arc<ResidentArray>>,
    pub(super) writing: BTreeMap<String, (String, u64)>,
}

impl Catalog {
    /// Bytes held or being written: the tenant's, or everyone's.
    pub(super) fn used(&self, tenant: Option<&str>) -> u64 {
        let mine = |t: &str| tenant.is_none_or(|want| want == t);
        let kept: u64 = self
            .arrays
            .values()
            .filter(|a| mine(&a.meta.tenant))
            .map(|a| a.bytes())
            .sum();
        let writing: u64 = self
            .writing
            .values()
            .filter(|(t, _)| mine(t))
            .map(|(_, b)| b)
            .sum();
        kept + writing
    }

    pub(super) fn count(&self, tenant: &str) -> usize {
        let kept = self.arrays.values().filter(|a| a.meta.tenant == tenant);
        let writing = self.writing.values().filter(|(t, _)| t == tenant);
        kept.count() + writing.count()
    }

    /// Arrays held or being written, everyone's.
    pub(super) fn count_all(&self) -> usize {
        self.arrays.len() + self.writing.len()
    }
}
