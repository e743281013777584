//! Kept results held on a device (`ArrayData::Held`): counted in the quotas like any
//! array and listed as held on `device`, with no copy in host memory or on disk. They are
//! read back (`materialised`) on their first read or use on the host; from then on they
//! are ordinary arrays, in memory and on disk, and the device's copy is an ordinary
//! cached copy that may be evicted. Until then a restart loses them, as does a fault
//! that rebuilds the device's context: the array is then gone (`ArrayError::Lost`).

use super::shared::off_runtime;
use super::{files, ArrayData, ArrayError, Arrays, ResidentArray};
use std::sync::Arc;

impl Arrays {
    /// `a` with its values on the host: `a` itself, or, when a device holds them, read
    /// back, written to disk, and put in the catalog in its place. Blocks on the device
    /// (a lease, one download) and the disk; may be called from an async task.
    pub fn materialised(&self, a: Arc<ResidentArray>) -> Result<Arc<ResidentArray>, ArrayError> {
        let ArrayData::Held(held) = &a.data else {
            return Ok(a);
        };
        let values = match off_runtime(|| held.download()) {
            Ok(v) => v,
            Err(e) => {
                self.lose(&a);
                return Err(ArrayError::Lost {
                    id: a.meta.id.clone(),
                    why: e.message,
                });
            }
        };
        self.metrics.reads_back.with_label_values(&["read"]).inc();
        let array = Arc::new(ResidentArray {
            meta: a.meta.clone(),
            data: ArrayData::FieldElements(Arc::new(values)),
        });
        let id = &a.meta.id;
        off_runtime(|| files::write(&self.dir, &array))?;
        let mut catalog = self.write_lock();
        match catalog.arrays.get(id) {
            Some(now) if Arc::ptr_eq(now, &a) => {
                catalog.arrays.insert(id.clone(), array.clone());
                held.release();
                self.export(&catalog);
            }
            // Another use read it back first: the same values, in the same files.
            Some(now) => return Ok(now.clone()),
            // Deleted or expired meanwhile: the files just written belong to nothing.
            None => {
                drop(catalog);
                if let Err(e) = files::remove(&self.dir, id) {
                    tracing::warn!(array = %id, error = %e, "a deleted array's files, written as it was read back, not removed");
                }
            }
        }
        Ok(array)
    }

    /// Drops `a`, whose device no longer holds it, unless it changed meanwhile.
    fn lose(&self, a: &Arc<ResidentArray>) {
        let id = &a.meta.id;
        let mut catalog = self.write_lock();
        if !catalog
            .arrays
            .get(id)
            .is_some_and(|now| Arc::ptr_eq(now, a))
        {
            return;
        }
        catalog.arrays.remove(id);
        self.metrics.reads_back.with_label_values(&["lost"]).inc();
        self.export(&catalog);
        drop(catalog);
        tracing::warn!(array = %id, "a kept result held only on a device was lost with the device's copies");
        self.removed(id);
    }
}
