//! A lease's view of its device's table cache (`tables.rs`): copies kept between jobs
//! (twiddles, resident arrays' uploads and their derived data) and kept results held
//! only there, each with the event that ends its writing; and the claims that keep two
//! jobs from building the same derived data at once.

use super::lease::{DeviceLease, Event};
use super::tables::TableCache;
use super::{DeviceBuffer, DeviceError, Element, GpuDevice};
use std::sync::{Arc, MutexGuard};

/// A table kept on the device, with the event that ends its upload: a job on another
/// stream waits for it before its first use.
struct Cached<T> {
    table: Arc<DeviceBuffer<T>>,
    ready: Event,
}

/// A job's claim to build the table under `key` on its device (`claim_build`), given up
/// when dropped.
pub struct BuildClaim<'a> {
    device: &'a GpuDevice,
    key: String,
}

impl Drop for BuildClaim<'_> {
    fn drop(&mut self) {
        self.device.table_cache().end_build(&self.key);
    }
}

impl GpuDevice {
    /// The claim to build derived data to be cached under `key` (an MSM's precomputed
    /// multiples), unless another job on this device holds it now. That job caches what
    /// it builds, so a job refused here does without it this once rather than build
    /// the same again beside it (or wait for it).
    pub fn claim_build(&self, key: &str) -> Option<BuildClaim<'_>> {
        self.table_cache().start_build(key).then(|| BuildClaim {
            device: self,
            key: key.to_string(),
        })
    }
}

impl DeviceLease<'_> {
    /// The cached device table under `key`, or the one `make` uploads (then cached). A
    /// table another job uploaded is used only after its upload (an event), which may
    /// still be in flight on that job's stream.
    pub fn cached_table<T: Element>(
        &self,
        key: &str,
        make: impl FnOnce() -> Result<DeviceBuffer<T>, DeviceError>,
    ) -> Result<Arc<DeviceBuffer<T>>, DeviceError> {
        if let Some(table) = self.table(key)? {
            return Ok(table);
        }
        let table = Arc::new(make()?);
        self.cache_table(key, table.clone())?;
        Ok(table)
    }

    /// The table cached under `key`, if any, without making one: a kept result's only
    /// copy (`keep_table`), or an array's copy another job uploaded.
    pub fn table<T: Element>(
        &self,
        key: &str,
    ) -> Result<Option<Arc<DeviceBuffer<T>>>, DeviceError> {
        let found = self.tables().get(key);
        let Some(t) = found.and_then(|t| t.downcast::<Cached<T>>().ok()) else {
            return Ok(None);
        };
        self.wait(&t.ready)?;
        Ok(Some(t.table.clone()))
    }

    /// `table`, but a look that finds nothing counts no miss: a second look after one
    /// that missed, or at a copy that may serve but is not this job's to make.
    pub fn held_table<T: Element>(
        &self,
        key: &str,
    ) -> Result<Option<Arc<DeviceBuffer<T>>>, DeviceError> {
        if !self.device.holds_table(key) {
            return Ok(None);
        }
        self.table(key)
    }

    /// Keeps `table`, written by this lease's work so far, under `key` as a kept
    /// result's only copy: pinned, so never evicted until `GpuDevice::release_table` or
    /// `forget_table`. False (nothing kept) when the cache cannot make room for it among
    /// its evictable entries.
    pub fn keep_table<T: Element>(
        &self,
        key: &str,
        table: Arc<DeviceBuffer<T>>,
    ) -> Result<bool, DeviceError> {
        let (cached, bytes) = self.entry(table)?;
        Ok(self.tables().insert_pinned(key.to_string(), cached, bytes))
    }

    /// Caches `table`, written by this lease's work so far, under `key` (evictable, as
    /// `cached_table` keeps what it makes): for a table whose lookup already missed.
    pub fn cache_table<T: Element>(
        &self,
        key: &str,
        table: Arc<DeviceBuffer<T>>,
    ) -> Result<(), DeviceError> {
        let (cached, bytes) = self.entry(table)?;
        self.tables().insert(key.to_string(), cached, bytes);
        Ok(())
    }

    /// Bytes the device's table cache can hold beside the results pinned in it (of
    /// `--gpu-table-cache-mib`): a table larger than that is used once and not kept.
    pub fn table_cache_room(&self) -> usize {
        self.tables().room()
    }

    /// Drops the cached table under `key`, if any, from the cache (not for good: a later
    /// job may cache it again); jobs using it keep their copy until they end.
    pub fn uncache(&self, key: &str) {
        self.tables().remove(key);
    }

    /// `table` as a cache entry, ready once this lease's work so far is done, and its
    /// bytes.
    fn entry<T: Element>(
        &self,
        table: Arc<DeviceBuffer<T>>,
    ) -> Result<(Arc<Cached<T>>, usize), DeviceError> {
        let bytes = table.len() * std::mem::size_of::<T>();
        let ready = self.record()?;
        Ok((Arc::new(Cached { table, ready }), bytes))
    }

    fn tables(&self) -> MutexGuard<'_, TableCache> {
        self.device.table_cache()
    }
}
