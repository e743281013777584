//! Resident arrays: operands a tenant uploaded once (`POST /arrays`) and names from any
//! op by id instead of sending them again. Each is validated once, when it is made (a
//! point on its curve and, for BLS12-381, in the prime-order subgroup; a field element
//! canonical; a tensor's values finite in its dtype), and kept parsed in host memory, so
//! a use costs neither a parse nor a check.
//! A copy on disk under `<data-dir>/arrays/` (`<id>.bin`, the values' little-endian
//! bytes, then `<id>.json`, whose presence commits the array) survives a restart.
//!
//! Bounded like everything a tenant stores: its arrays' bytes (`--max-tenant-array-mib`)
//! and count (`--max-tenant-arrays`), all arrays' bytes (`--max-arrays-mib`) and count
//! (`--max-arrays`), and a time
//! to live (`--array-ttl` by default, at most `--max-array-ttl`), after which an array is
//! gone: refused at once, its memory and files freed by the next sweep. Embedding tables
//! are arrays too (`ArrayRole::EmbeddingTable`), held to the tables' own limits as well,
//! and kept until deleted (`NEVER`) unless their upload gave a time to live.

mod accounting;
mod errors;
mod files;
mod held;
mod meta;
mod recording;
mod shared;
mod tensor;

use accounting::Catalog;
pub use accounting::{check_room, ArrayLimits, ArrayMetrics, TableLimits};
pub use errors::ArrayError;
pub use held::HeldArray;
pub use meta::{ArrayKind, ArrayMeta, ArrayRole, NEVER};
pub use recording::{Recording, RecordingDefect};
pub use shared::Shared;
pub use tensor::Tensor;

use crate::ops::linalg::Dtype;
use crate::ops::zk::msm::{Curve, Points};
use crate::ops::zk::{Field, FieldVec};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

/// An array's values, parsed and checked.
#[derive(Clone, Debug)]
pub enum ArrayData {
    FieldElements(Arc<FieldVec>),
    Points(Arc<Points>),
    Tensor(Arc<Tensor>),
    Recording(Arc<Recording>),
    Bytes(bytes::Bytes),
    /// Field elements or a tensor a device made and holds, not read back yet (a kept
    /// result, `held.rs`); of kind `field_elements` or `tensor`, and read back on their
    /// first use on the host.
    Held(HeldArray),
}

impl ArrayData {
    pub fn kind(&self) -> ArrayKind {
        match self {
            ArrayData::FieldElements(_) => ArrayKind::FieldElements,
            ArrayData::Points(_) => ArrayKind::Points,
            ArrayData::Tensor(_) => ArrayKind::Tensor,
            ArrayData::Recording(_) => ArrayKind::Recording,
            ArrayData::Bytes(_) => ArrayKind::Bytes,
            ArrayData::Held(h) => h.kind(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            ArrayData::FieldElements(v) => v.len(),
            ArrayData::Points(p) => p.len(),
            ArrayData::Tensor(t) => t.values.len(),
            ArrayData::Recording(r) => r.len(),
            ArrayData::Bytes(b) => b.len(),
            ArrayData::Held(h) => h.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The field of its elements; `None` for other kinds.
    pub fn field(&self) -> Option<Field> {
        match self {
            ArrayData::FieldElements(v) => Some(v.field()),
            ArrayData::Held(h) => h.field(),
            _ => None,
        }
    }

    pub fn curve(&self) -> Option<Curve> {
        match self {
            ArrayData::Points(p) => Some(p.curve()),
            _ => None,
        }
    }

    /// A tensor's dtype.
    pub fn dtype(&self) -> Option<Dtype> {
        match self {
            ArrayData::Tensor(t) => Some(t.dtype),
            ArrayData::Held(h) => h.dtype(),
            _ => None,
        }
    }

    /// A tensor's shape.
    pub fn shape(&self) -> Option<Vec<usize>> {
        match self {
            ArrayData::Tensor(t) => Some(t.shape.clone()),
            ArrayData::Held(h) => h.shape(),
            _ => None,
        }
    }

    /// The same values in memory of their own, none lent from a request body's (see
    /// `wire::Array::detached`; tensors are detached as they are made): what an array
    /// keeps.
    fn detached(self) -> Self {
        match self {
            ArrayData::Recording(r) => ArrayData::Recording(r.detached()),
            ArrayData::Bytes(b) => ArrayData::Bytes(crate::wire::owned_bytes(b)),
            other => other,
        }
    }

    /// The bytes the quotas count: a field element's fixed width, x ‖ y of a point (the
    /// wire and disk form), a tensor's values as held in memory (`Tensor::held_bytes`),
    /// 8 per complex sample of a recording, bytes as they are.
    pub fn bytes(&self) -> u64 {
        match self {
            ArrayData::FieldElements(v) => v.byte_len() as u64,
            ArrayData::Points(p) => (2 * p.curve().coordinate_bytes() * p.len()) as u64,
            ArrayData::Tensor(t) => t.held_bytes(),
            ArrayData::Recording(r) => 8 * r.len() as u64,
            ArrayData::Bytes(b) => b.len() as u64,
            ArrayData::Held(h) => h.byte_len() as u64,
        }
    }
}

#[derive(Debug)]
pub struct ResidentArray {
    pub meta: ArrayMeta,
    pub data: ArrayData,
}

impl ResidentArray {
    pub fn bytes(&self) -> u64 {
        self.data.bytes()
    }

    pub fn expired(&self, now_ms: u64) -> bool {
        now_ms >= self.meta.expires_at_ms
    }

    /// When it expires, RFC 3339 with milliseconds; `None` when it is kept until deleted.
    pub fn expires_at(&self) -> Option<String> {
        self.meta.expires_at()
    }
}

/// An array as a listing shows it: its description, the bytes it counts, and where
/// copies of it are held (`host`: parsed in this replica's memory; `disk`: under
/// `--data-dir`; `object_store`: in the shared artifact store).
#[derive(Clone, Debug)]
pub struct Listing {
    pub meta: ArrayMeta,
    pub bytes: u64,
    pub held: &'static [&'static str],
}

/// The key under which a device keeps its copy of array `id` (`GpuDevice::forget_table`
/// drops it when the array goes). Array ids are never reused, so a copy cannot outlive
/// its array's values under the same key.
pub fn device_key(id: &str) -> String {
    format!("array/{id}")
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Every tenant's arrays.
pub struct Arrays {
    dir: PathBuf,
    limits: ArrayLimits,
    metrics: ArrayMetrics,
    catalog: RwLock<Catalog>,
    /// Called with each array's id once it is deleted or expired (`on_removed`).
    removed: std::sync::OnceLock<RemovalHook>,
    /// Set when replicas share the arrays: `catalog` is then this replica's cache of
    /// arrays read or made here, and the shared catalog and the artifact store hold them.
    shared: Option<Shared>,
}

/// What else must go when an array goes: its copies on the devices.
type RemovalHook = Box<dyn Fn(&str) + Send + Sync>;

impl Arrays {
    /// The arrays under `dir` (created if missing). Expired arrays' files are deleted; an
    /// array whose files do not agree, or whose values no longer pass their checks, is
    /// skipped with a warning, never served.
    pub fn open(dir: PathBuf, limits: ArrayLimits, metrics: ArrayMetrics) -> Result<Self, String> {
        let loaded = files::load_all(&dir, now_ms())?;
        let mut catalog = Catalog::default();
        for a in loaded {
            catalog.arrays.insert(a.meta.id.clone(), Arc::new(a));
        }
        let arrays = Self {
            dir,
            limits,
            metrics,
            catalog: RwLock::new(catalog),
            removed: std::sync::OnceLock::new(),
            shared: None,
        };
        arrays.export(&arrays.read());
        Ok(arrays)
    }

    /// Arrays shared by replicas: the catalog in the shared database, the values in the
    /// artifact store, read into this replica's memory on first use. Arrays a replica
    /// kept under `dir` before sharing was turned on are not served (a warning says so).
    pub fn open_shared(
        dir: PathBuf,
        limits: ArrayLimits,
        metrics: ArrayMetrics,
        shared: Shared,
    ) -> Self {
        let unshared = std::fs::read_dir(&dir).map_or(0, |d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .count()
        });
        if unshared > 0 {
            tracing::warn!(
                arrays = unshared,
                dir = %dir.display(),
                "resident arrays kept on this replica's disk are not served while arrays are shared"
            );
        }
        let arrays = Self {
            dir,
            limits,
            metrics,
            catalog: RwLock::new(Catalog::default()),
            removed: std::sync::OnceLock::new(),
            shared: Some(shared),
        };
        arrays.export(&arrays.read());
        if let Some(shared) = &arrays.shared {
            arrays.export_shared(shared);
        }
        arrays
    }

    /// Whether replicas share the arrays (then results are never left on a device).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Where copies of `a` are held.
    pub fn listing(&self, a: &ResidentArray) -> Listing {
        Listing {
            meta: a.meta.clone(),
            bytes: a.bytes(),
            held: if matches!(a.data, ArrayData::Held(_)) {
                &["device"]
            } else if self.shared.is_some() {
                &["host", "object_store"]
            } else {
                &["host", "disk"]
            },
        }
    }

    /// Calls `hook` with the id of every array deleted or expired from now on (set once;
    /// a second hook is ignored): how the devices drop their copies.
    pub fn on_removed(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.removed.set(Box::new(hook));
    }

    fn removed(&self, id: &str) {
        if let Some(hook) = self.removed.get() {
            hook(id);
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Catalog> {
        self.catalog.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(&self) -> std::sync::RwLockWriteGuard<'_, Catalog> {
        self.catalog.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the gauges from the catalog (host and disk hold the same committed arrays;
    /// shared, the host holds what this replica has read, and `export_shared` sets the
    /// rest).
    fn export(&self, catalog: &Catalog) {
        let on_device = |a: &&Arc<ResidentArray>| matches!(a.data, ArrayData::Held(_));
        let arrays = || catalog.arrays.values();
        let held: u64 = arrays().filter(on_device).map(|a| a.bytes()).sum();
        let bytes: u64 = arrays().map(|a| a.bytes()).sum::<u64>() - held;
        let gauge = |tier: &str| self.metrics.bytes.with_label_values(&[tier]);
        gauge("host").set(bytes as i64);
        gauge("device").set(held as i64);
        if self.shared.is_none() {
            gauge("disk").set(bytes as i64);
            self.metrics.count.set(catalog.arrays.len() as i64);
        }
    }

    /// Stores an array under `meta.id`, within the tenant's quotas and the server's cap.
    pub fn add(&self, meta: ArrayMeta, data: ArrayData) -> Result<Arc<ResidentArray>, ArrayError> {
        self.add_within(meta, data, &self.limits)
    }

    /// Stores an array admitted before it was one (an embedding table the store kept
    /// before tables were arrays, `tables::import_legacy`): counted from now on like any
    /// other, but not refused for quotas it was never held to.
    pub fn admit(
        &self,
        meta: ArrayMeta,
        data: ArrayData,
    ) -> Result<Arc<ResidentArray>, ArrayError> {
        let unbounded = ArrayLimits {
            tenant_bytes: u64::MAX,
            tenant_count: usize::MAX,
            server_bytes: u64::MAX,
            server_count: usize::MAX,
            tables: TableLimits::NONE,
            ..self.limits
        };
        self.add_within(meta, data, &unbounded)
    }

    fn add_within(
        &self,
        meta: ArrayMeta,
        data: ArrayData,
        limits: &ArrayLimits,
    ) -> Result<Arc<ResidentArray>, ArrayError> {
        // Replicas read arrays from the artifact store: a device's copy is of no use to
        // them, so it is read back before it is shared.
        let data = match data {
            ArrayData::Held(h) if self.shared.is_some() => {
                let values =
                    shared::off_runtime(|| h.read_back(None)).map_err(|e| ArrayError::Lost {
                        id: meta.id.clone(),
                        why: e.message,
                    })?;
                h.release();
                values
            }
            data => data,
        };
        let array = ResidentArray {
            meta,
            data: data.detached(),
        };
        let result = match &self.shared {
            Some(shared) => self.add_shared(shared, array, limits),
            None => self.reserve_and_write(array, limits),
        };
        if let Err(e) = &result {
            self.metrics.refused.with_label_values(&[e.reason()]).inc();
        }
        result
    }

    fn reserve_and_write(
        &self,
        array: ResidentArray,
        limits: &ArrayLimits,
    ) -> Result<Arc<ResidentArray>, ArrayError> {
        let need = array.bytes();
        let (id, tenant) = (array.meta.id.clone(), array.meta.tenant.clone());
        let table = array.meta.is_table();
        // Reserve the room first, so two uploads cannot both fit in the room of one; write
        // the files without the lock, so uses never wait for a disk.
        {
            let mut catalog = self.write_lock();
            self.drop_expired(&mut catalog, now_ms());
            check_room(limits, &tenant, table, need, |t, tables| {
                Ok(catalog.held(t, tables))
            })?;
            catalog.writing.insert(id.clone(), (tenant, need, table));
        }
        // A result held on a device has no values here to write until it is read back
        // (`materialised`).
        let written = match array.data {
            ArrayData::Held(_) => Ok(()),
            _ => files::write(&self.dir, &array),
        };
        let mut catalog = self.write_lock();
        catalog.writing.remove(&id);
        written?;
        let array = Arc::new(array);
        catalog.arrays.insert(id, array.clone());
        self.export(&catalog);
        Ok(array)
    }

    /// The tenant's array `id`, unless it has expired. Shared, the shared catalog is
    /// asked each time (an array deleted through another replica is gone here too), and
    /// the values are read from the artifact store on this replica's first use; this
    /// blocks, and may be called from an async task (`shared::off_runtime`).
    pub fn get(&self, tenant: &str, id: &str) -> Result<Option<Arc<ResidentArray>>, ArrayError> {
        if let Some(shared) = &self.shared {
            return self.get_shared(shared, tenant, id);
        }
        Ok(self.cached(tenant, id, now_ms()))
    }

    fn cached(&self, tenant: &str, id: &str, now: u64) -> Option<Arc<ResidentArray>> {
        self.read()
            .arrays
            .get(id)
            .filter(|a| a.meta.tenant == tenant && !a.expired(now))
            .cloned()
    }

    /// The tenant's array `id` as an operand on the host: counted in
    /// `gpu_ops_array_uses_total`; values held on a device are read back first.
    pub fn use_operand(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<Arc<ResidentArray>>, ArrayError> {
        self.use_operand_where_held(tenant, id)?
            .map(|a| self.materialised(a))
            .transpose()
    }

    /// As `use_operand`, leaving values held on a device there: for a job that can read
    /// them where they are (`ops::zk::held`).
    pub fn use_operand_where_held(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<Arc<ResidentArray>>, ArrayError> {
        let found = self.get(tenant, id)?;
        if let Some(a) = &found {
            self.metrics
                .uses
                .with_label_values(&[a.meta.kind.name()])
                .inc();
        }
        Ok(found)
    }

    /// The tenant's array `id` as a listing shows it, unless it has expired: its
    /// description without its values (shared, one catalog row; nothing is fetched).
    pub fn listing_of(&self, tenant: &str, id: &str) -> Result<Option<Listing>, ArrayError> {
        if let Some(shared) = &self.shared {
            return self.listing_shared(shared, tenant, id);
        }
        Ok(self.cached(tenant, id, now_ms()).map(|a| self.listing(&a)))
    }

    /// The tenant's arrays that have not expired, by id.
    pub fn list(&self, tenant: &str) -> Result<Vec<Listing>, ArrayError> {
        if let Some(shared) = &self.shared {
            return self.list_shared(shared, tenant);
        }
        let now = now_ms();
        Ok(self
            .read()
            .arrays
            .values()
            .filter(|a| a.meta.tenant == tenant && !a.expired(now))
            .map(|a| self.listing(a))
            .collect())
    }

    /// Removes the tenant's array `id` and its files; false when there is none.
    pub fn remove(&self, tenant: &str, id: &str) -> Result<bool, ArrayError> {
        if let Some(shared) = &self.shared {
            return self.remove_shared(shared, tenant, id);
        }
        let mut catalog = self.write_lock();
        let now = now_ms();
        if catalog
            .arrays
            .get(id)
            .is_none_or(|a| a.meta.tenant != tenant || a.expired(now))
        {
            return Ok(false);
        }
        files::remove(&self.dir, id)?;
        catalog.arrays.remove(id);
        self.export(&catalog);
        self.removed(id);
        Ok(true)
    }

    /// Deletes every array expired at `now_ms` with its files; how many.
    pub fn sweep(&self, now_ms: u64) -> usize {
        if let Some(shared) = &self.shared {
            return self.sweep_shared(shared, now_ms);
        }
        let mut catalog = self.write_lock();
        self.drop_expired(&mut catalog, now_ms)
    }

    fn drop_expired(&self, catalog: &mut Catalog, now_ms: u64) -> usize {
        let expired: Vec<String> = catalog
            .arrays
            .values()
            .filter(|a| a.expired(now_ms))
            .map(|a| a.meta.id.clone())
            .collect();
        let mut dropped = 0;
        for id in expired {
            // Files that cannot be removed now keep their entry for the next sweep; the
            // array is refused meanwhile (expired), and on a restart deleted at load.
            match files::remove(&self.dir, &id) {
                Ok(()) => {
                    catalog.arrays.remove(&id);
                    self.removed(&id);
                    dropped += 1;
                }
                Err(e) => {
                    tracing::warn!(array = %id, error = %e, "expired array kept until its files can be removed")
                }
            }
        }
        if dropped > 0 {
            self.metrics.expired.inc_by(dropped as u64);
            self.export(catalog);
        }
        dropped
    }
}

/// Sweeps expired arrays every `every` while `arrays` lives.
pub fn spawn_expiry(arrays: &Arc<Arrays>, every: std::time::Duration) {
    let arrays = Arc::downgrade(arrays);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(arrays) = arrays.upgrade() else {
                return;
            };
            match tokio::task::spawn_blocking(move || arrays.sweep(now_ms())).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(arrays = n, "expired resident arrays deleted"),
                Err(e) => tracing::warn!(error = %e, "array expiry task failed"),
            }
        }
    });
}

#[cfg(test)]
mod tests;
