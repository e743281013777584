//! Kept results held on a device (`ArrayData::Held`): field vectors a field op or NTT
//! made, tensors a product made. Counted in the quotas like any array and listed as held
//! on `device`, with no copy in host memory or on disk. They are
//! read back (`materialised`) on their first read or use on the host; from then on they
//! are ordinary arrays, in memory and on disk, and the device's copy is an ordinary
//! cached copy that may be evicted. Until then a restart loses them, as does a fault
//! that rebuilds the device's context: the array is then gone (`ArrayError::Lost`).

use super::{files, ArrayData, ArrayError, ArrayKind, Arrays, ResidentArray, Tensor};
use crate::backend::{DeviceError, DeviceErrorKind};
use crate::ops::linalg::held::HeldTensor;
use crate::ops::linalg::Dtype;
use crate::ops::zk::held::HeldVector;
use crate::ops::zk::Field;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

/// A kept result whose only copy is on a device.
#[derive(Clone, Debug)]
pub enum HeldArray {
    Field(Arc<HeldVector>),
    Tensor(Arc<HeldTensor>),
}

impl HeldArray {
    pub fn kind(&self) -> ArrayKind {
        match self {
            HeldArray::Field(_) => ArrayKind::FieldElements,
            HeldArray::Tensor(_) => ArrayKind::Tensor,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            HeldArray::Field(h) => h.len(),
            HeldArray::Tensor(h) => h.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes the quotas count, as for the same values on the host.
    pub fn byte_len(&self) -> usize {
        match self {
            HeldArray::Field(h) => h.byte_len(),
            HeldArray::Tensor(h) => h.byte_len(),
        }
    }

    pub fn field(&self) -> Option<Field> {
        match self {
            HeldArray::Field(h) => Some(h.field()),
            HeldArray::Tensor(_) => None,
        }
    }

    pub fn dtype(&self) -> Option<Dtype> {
        match self {
            HeldArray::Tensor(h) => Some(h.dtype()),
            HeldArray::Field(_) => None,
        }
    }

    pub fn shape(&self) -> Option<Vec<usize>> {
        match self {
            HeldArray::Tensor(h) => Some(h.shape().to_vec()),
            HeldArray::Field(_) => None,
        }
    }

    /// The device that holds it.
    pub fn ordinal(&self) -> usize {
        match self {
            HeldArray::Field(h) => h.ordinal(),
            HeldArray::Tensor(h) => h.ordinal(),
        }
    }

    /// What it holds, in words.
    pub fn describe(&self) -> String {
        match self {
            HeldArray::Field(h) => format!("{} {} elements", h.len(), h.field().name()),
            HeldArray::Tensor(h) => {
                format!("a {} tensor shaped {:?}", h.dtype().name(), h.shape())
            }
        }
    }

    pub fn adopt(&self) {
        match self {
            HeldArray::Field(h) => h.adopt(),
            HeldArray::Tensor(h) => h.adopt(),
        }
    }

    pub fn discard(&self) {
        match self {
            HeldArray::Field(h) => h.discard(),
            HeldArray::Tensor(h) => h.discard(),
        }
    }

    pub fn release(&self) {
        match self {
            HeldArray::Field(h) => h.release(),
            HeldArray::Tensor(h) => h.release(),
        }
    }

    fn read_back_turn_by(&self, deadline: Instant) -> Option<MutexGuard<'_, ()>> {
        match self {
            HeldArray::Field(h) => h.read_back_turn_by(deadline),
            HeldArray::Tensor(h) => h.read_back_turn_by(deadline),
        }
    }

    /// The values read back (`HeldCopy::download_by`), as the array they now are; the
    /// handle records its host copy, for steps that still name the device's.
    pub fn read_back(&self, deadline: Option<Instant>) -> Result<ArrayData, DeviceError> {
        Ok(match self {
            HeldArray::Field(h) => {
                let values = Arc::new(h.download_by(deadline)?);
                h.set_host(values.clone());
                ArrayData::FieldElements(values)
            }
            HeldArray::Tensor(h) => {
                let values = h.download_by(deadline)?;
                let tensor = Tensor::new(h.dtype(), h.shape().to_vec(), values);
                // The tensor's values are shared: the handle's copy is the same memory.
                h.set_host(Arc::new(tensor.values.clone()));
                ArrayData::Tensor(Arc::new(tensor))
            }
        })
    }
}

impl Arrays {
    /// `a` with its values on the host: `a` itself, or, when a device holds them, read
    /// back, written to disk, and put in the catalog in its place. Blocks on the device
    /// (a lease, one download) and the disk; may be called from an async task.
    pub fn materialised(&self, a: Arc<ResidentArray>) -> Result<Arc<ResidentArray>, ArrayError> {
        if !matches!(a.data, ArrayData::Held(_)) {
            return Ok(a);
        }
        // On a worker of the server's runtime, its other tasks are handed on first.
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.read_back(a))
            }
            _ => self.read_back(a),
        }
    }

    fn read_back(&self, a: Arc<ResidentArray>) -> Result<Arc<ResidentArray>, ArrayError> {
        let ArrayData::Held(held) = &a.data else {
            return Ok(a);
        };
        let id = &a.meta.id;
        // One deadline for the turn and the device together: readers queued behind a
        // busy device each wait at most `--job-timeout`, not one more per reader ahead.
        let wait = self.limits.read_back_wait;
        let deadline = std::time::Instant::now() + wait;
        let busy = || {
            self.metrics
                .reads_back
                .with_label_values(&["deadline"])
                .inc();
            ArrayError::DeviceBusy {
                id: id.clone(),
                waited: wait,
            }
        };
        // One reader at a time: the next finds the catalog changed and takes its entry.
        let Some(_turn) = held.read_back_turn_by(deadline) else {
            return Err(busy());
        };
        let now = self.read().arrays.get(id).cloned();
        if let Some(now) = now.filter(|now| !Arc::ptr_eq(now, &a)) {
            return Ok(now);
        }
        let data = match held.read_back(Some(deadline)) {
            Ok(data) => data,
            Err(e) if e.kind == DeviceErrorKind::Abandoned => return Err(busy()),
            Err(e) if e.kind == DeviceErrorKind::Unsupported => {
                self.lose(&a);
                return Err(ArrayError::Lost {
                    id: id.clone(),
                    why: e.message,
                });
            }
            Err(e) => return Err(ArrayError::Io(format!("{id}: reading it back: {e}"))),
        };
        self.metrics.reads_back.with_label_values(&["read"]).inc();
        let array = Arc::new(ResidentArray {
            meta: a.meta.clone(),
            data,
        });
        files::write(&self.dir, &array)?;
        let mut catalog = self.write_lock();
        match catalog.arrays.get(id) {
            Some(now) if Arc::ptr_eq(now, &a) => {
                catalog.arrays.insert(id.clone(), array.clone());
                held.release();
                self.export(&catalog);
            }
            // Replaced some other way meanwhile (no reader could: it holds the turn).
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
