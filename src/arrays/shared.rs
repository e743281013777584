//! Arrays shared by replicas (`--database-url postgres://…` with `--artifact-store`):
//! each array is a row of the shared catalog (`store::arrays`: its metadata, the bytes it
//! counts, its expiry) and one object in the artifact store (its values, the disk form of
//! `files`). Any replica serves any array of the tenant: on its first use there the
//! values are read from the store and checked again, as a restart checks its files, and
//! then kept parsed in this replica's memory.
//!
//! The catalog is the truth for every replica: the quotas are its sums, a use asks it
//! whether the array still lives (one primary-key read), so an array deleted or expired
//! through one replica is refused by all of them at once, and the sweep of any replica
//! deletes what has expired (the object first, then the row; an object that cannot be
//! deleted yet keeps its row for the next sweep). Each sweep also drops this replica's
//! copies of arrays that are gone, so its memory follows the catalog within one sweep.

use super::{files, now_ms, ArrayError, ArrayLimits, ArrayMeta, Arrays, Listing, ResidentArray};
use crate::datasets::artifacts::ObjectArtifacts;
use crate::store::Store;
use std::sync::Arc;

/// Where shared arrays live.
pub struct Shared {
    pub store: Arc<Store>,
    pub objects: Arc<ObjectArtifacts>,
}

/// How long a reservation holds its room while its values go up: a replica that dies
/// mid-upload frees its room after this, when any sweep removes the lapsed row.
const RESERVATION_MS: u64 = 15 * 60 * 1000;

/// Rows a sweep removes at most (the next sweep takes the rest).
const SWEEP_BATCH: usize = 1000;

/// Runs `f`, which blocks on the database or the artifact store, from any thread: the
/// database client runs a runtime of its own, which may not be started inside another's,
/// so `f` runs on a plain thread; on a worker of the server's runtime the worker first
/// hands its other tasks on (`block_in_place`).
pub(super) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let run = || std::thread::scope(|s| s.spawn(f).join().expect("a shared-array call panicked"));
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(run)
        }
        _ => run(),
    }
}

fn object_error(e: crate::datasets::artifacts::ArtifactError) -> ArrayError {
    ArrayError::Io(e.to_string())
}

impl Arrays {
    pub(super) fn add_shared(
        &self,
        shared: &Shared,
        array: ResidentArray,
        limits: &ArrayLimits,
    ) -> Result<Arc<ResidentArray>, ArrayError> {
        let meta = serde_json::to_string(&array.meta).expect("metadata serializes");
        let (id, need) = (array.meta.id.as_str(), array.bytes());
        off_runtime(|| {
            let now = now_ms();
            let reserved_until = now.saturating_add(RESERVATION_MS);
            let tenant = array.meta.tenant.as_str();
            shared.store.reserve_array(
                id,
                tenant,
                &meta,
                array.meta.role,
                need,
                limits,
                now,
                reserved_until,
            )?;
            let values = bytes::Bytes::from(files::values_bytes(&array.data)?.into_owned());
            if let Err(e) = shared.objects.put_array(id, values) {
                if let Err(undo) = shared.store.drop_array_row(id) {
                    tracing::warn!(array = %id, error = %undo, "a failed array's reservation is left to lapse");
                }
                return Err(object_error(e));
            }
            let committed = shared
                .store
                .commit_array(id, array.meta.expires_at_ms, now_ms());
            if let Err(e) = committed {
                // The row lapsed or is unreachable: its object goes, or the sweep that
                // removes the row takes it.
                let _ = shared.objects.delete_array(id);
                return Err(e.into());
            }
            Ok(())
        })?;
        let array = Arc::new(array);
        let mut catalog = self.write_lock();
        catalog.arrays.insert(array.meta.id.clone(), array.clone());
        self.export(&catalog);
        drop(catalog);
        self.export_shared(shared);
        Ok(array)
    }

    pub(super) fn get_shared(
        &self,
        shared: &Shared,
        tenant: &str,
        id: &str,
    ) -> Result<Option<Arc<ResidentArray>>, ArrayError> {
        let now = now_ms();
        let Some(row) = off_runtime(|| shared.store.array(tenant, id, now))? else {
            self.forget(id);
            return Ok(None);
        };
        if let Some(a) = self.cached(tenant, id, now) {
            return Ok(Some(a));
        }
        let meta: ArrayMeta = serde_json::from_str(&row.meta)
            .map_err(|e| ArrayError::Io(format!("array {id}: its catalog row: {e}")))?;
        let values = off_runtime(|| shared.objects.get_array(id))
            .map_err(object_error)?
            .ok_or_else(|| {
                ArrayError::Io(format!(
                    "array {id}: its values are missing from the artifact store"
                ))
            })?;
        let data = files::decode(&meta, &values)
            .map_err(|e| ArrayError::Io(format!("array {id} from the artifact store: {e}")))?;
        let array = Arc::new(ResidentArray { meta, data });
        let mut catalog = self.write_lock();
        // A use that read it at the same time keeps the first copy.
        let kept = catalog
            .arrays
            .entry(id.to_string())
            .or_insert(array)
            .clone();
        self.export(&catalog);
        Ok(Some(kept))
    }

    pub(super) fn listing_shared(
        &self,
        shared: &Shared,
        tenant: &str,
        id: &str,
    ) -> Result<Option<Listing>, ArrayError> {
        let Some(row) = off_runtime(|| shared.store.array(tenant, id, now_ms()))? else {
            return Ok(None);
        };
        self.row_listing(row).map(Some)
    }

    /// A catalog row as a listing shows it (held in this replica's memory too once read).
    fn row_listing(&self, row: crate::store::ArrayRow) -> Result<Listing, ArrayError> {
        let meta: ArrayMeta = serde_json::from_str(&row.meta)
            .map_err(|e| ArrayError::Io(format!("a catalog row: {e}")))?;
        let held: &'static [&'static str] = if self.read().arrays.contains_key(&meta.id) {
            &["host", "object_store"]
        } else {
            &["object_store"]
        };
        Ok(Listing {
            meta,
            bytes: row.bytes,
            held,
        })
    }

    pub(super) fn list_shared(
        &self,
        shared: &Shared,
        tenant: &str,
    ) -> Result<Vec<Listing>, ArrayError> {
        let rows = off_runtime(|| shared.store.arrays_of(tenant, now_ms()))?;
        rows.into_iter().map(|row| self.row_listing(row)).collect()
    }

    pub(super) fn remove_shared(
        &self,
        shared: &Shared,
        tenant: &str,
        id: &str,
    ) -> Result<bool, ArrayError> {
        let retired = off_runtime(|| shared.store.retire_array(tenant, id, now_ms()))?;
        if retired.is_none() {
            return Ok(false);
        }
        self.forget(id);
        // Retired, the array is refused everywhere; what fails below the sweep retries.
        off_runtime(|| match shared.objects.delete_array(id) {
            Ok(()) => {
                if let Err(e) = shared.store.drop_array_row(id) {
                    tracing::warn!(array = %id, error = %e, "a deleted array's row is left for the sweep");
                }
            }
            Err(e) => {
                tracing::warn!(array = %id, error = %e, "a deleted array's object is left for the sweep")
            }
        });
        self.export_shared(shared);
        Ok(true)
    }

    /// Removes what is gone from the catalog and the store, and this replica's copies of
    /// arrays that are gone; how many rows it removed.
    pub(super) fn sweep_shared(&self, shared: &Shared, now: u64) -> usize {
        let removed = off_runtime(|| {
            let gone = match shared.store.expired_arrays(now, SWEEP_BATCH) {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::warn!(error = %e, "the array sweep could not read the catalog");
                    return Vec::new();
                }
            };
            gone.into_iter()
                .filter(|id| {
                    let deleted = shared
                        .objects
                        .delete_array(id)
                        .map_err(|e| e.to_string())
                        .and_then(|()| shared.store.drop_array_row(id).map_err(|e| e.to_string()));
                    if let Err(e) = &deleted {
                        tracing::warn!(array = %id, error = %e, "an expired array is left for the next sweep");
                    }
                    deleted.is_ok()
                })
                .collect::<Vec<_>>()
        });
        for id in &removed {
            self.forget(id);
        }
        let cached: Vec<String> = self.read().arrays.keys().cloned().collect();
        if !cached.is_empty() {
            match off_runtime(|| shared.store.live_arrays(&cached, now)) {
                Ok(live) => {
                    for id in cached.iter().filter(|id| !live.contains(id)) {
                        self.forget(id);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the array sweep could not check this replica's copies")
                }
            }
        }
        if !removed.is_empty() {
            self.metrics.expired.inc_by(removed.len() as u64);
        }
        self.export_shared(shared);
        removed.len()
    }

    /// Drops this replica's copy of `id` (and the devices' copies), if it has one.
    fn forget(&self, id: &str) {
        let mut catalog = self.write_lock();
        if catalog.arrays.remove(id).is_some() {
            self.export(&catalog);
            drop(catalog);
            self.removed(id);
        }
    }

    /// The shared catalog's bytes and count, as this replica last read them.
    pub(super) fn export_shared(&self, shared: &Shared) {
        match off_runtime(|| shared.store.arrays_held(now_ms())) {
            Ok((bytes, count)) => {
                self.metrics
                    .bytes
                    .with_label_values(&["object_store"])
                    .set(bytes as i64);
                self.metrics.count.set(count as i64);
            }
            Err(e) => tracing::warn!(error = %e, "the shared array catalog could not be read"),
        }
    }
}
