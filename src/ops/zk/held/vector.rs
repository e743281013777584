//! A field vector held on a device: its handle, and its reading back.

use super::super::gpu;
use super::super::{Field, FieldVec};
use crate::backend::{DeviceError, DeviceLease, Element, GpuDevice, Stop};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

/// A field vector whose only copy is on a device, under `key` in its cache of copies.
/// Dropped before anything adopted it (its request gone before its array was stored),
/// it takes that copy with it: a pinned copy nobody can name would never be evicted.
pub struct HeldVector {
    device: Arc<GpuDevice>,
    key: String,
    field: Field,
    len: usize,
    adopted: std::sync::atomic::AtomicBool,
    /// The values on the host, once read back (`set_host`): a step that finds the
    /// device's copy evicted after that uploads them instead of failing.
    host: std::sync::OnceLock<Arc<FieldVec>>,
    /// Taken while the values are read back, so two readers do not both download them
    /// and write the same files at once (`arrays::Arrays::materialised`).
    turn: std::sync::Mutex<()>,
}

impl Drop for HeldVector {
    fn drop(&mut self) {
        if !self.adopted.load(std::sync::atomic::Ordering::Acquire) {
            self.discard();
        }
    }
}

impl std::fmt::Debug for HeldVector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldVector")
            .field("device", &self.device.info.ordinal)
            .field("key", &self.key)
            .field("field", &self.field)
            .field("len", &self.len)
            .finish()
    }
}

impl HeldVector {
    pub fn field(&self) -> Field {
        self.field
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device that holds it.
    pub fn ordinal(&self) -> usize {
        self.device.info.ordinal
    }

    pub fn byte_len(&self) -> usize {
        self.len * self.field.byte_width()
    }

    /// Reads the values back: the host copy if they were read back before, else a lease
    /// on the device (this blocks, possibly behind the jobs holding it) and one download.
    /// Fails (`DeviceErrorKind::Unsupported`) when the device no longer has them (its
    /// context was rebuilt after a fault, or the array was deleted meanwhile).
    pub fn download(&self) -> Result<FieldVec, DeviceError> {
        self.download_by(None)
    }

    /// `download`, giving up (`DeviceErrorKind::Abandoned`) if no lease on the device is
    /// free by `deadline`: a read from the API waits no longer than a job would.
    pub fn download_by(&self, deadline: Option<Instant>) -> Result<FieldVec, DeviceError> {
        if let Some(v) = self.host_copy() {
            return Ok(FieldVec::clone(&v));
        }
        let stop = deadline.map(|deadline| Stop {
            deadline,
            abandoned: Arc::new(AtomicBool::new(false)),
        });
        read_field(&self.device.lease_for(stop, 0)?, self)
    }

    /// The values on the host, if they were read back.
    pub fn host_copy(&self) -> Option<Arc<FieldVec>> {
        self.host.get().cloned()
    }

    /// Records the values read back, for steps that still name the device's copy.
    pub fn set_host(&self, values: Arc<FieldVec>) {
        let _ = self.host.set(values);
    }

    /// Held while its values are read back: one reader at a time; `None` if the reader
    /// before still holds it at `deadline`.
    pub fn read_back_turn_by(&self, deadline: Instant) -> Option<std::sync::MutexGuard<'_, ()>> {
        loop {
            match self.turn.try_lock() {
                Ok(turn) => return Some(turn),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() >= deadline => {
                    return None
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
            }
        }
    }

    /// Its array is stored: from now on the array's deletion or expiry, or its reading
    /// back, decides what becomes of the device's copy, not this handle's drop.
    pub fn adopt(&self) {
        self.adopted
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Nobody keeps it (its array was refused): the device's copy goes.
    pub fn discard(&self) {
        self.device.forget_table(&self.key);
    }

    /// The values are on the host now: the device's copy may be evicted like any other.
    pub fn release(&self) {
        self.device.release_table(&self.key);
    }
}

/// `held`'s values, read on `dev` (its device's lease).
pub(super) fn read_field(
    dev: &DeviceLease<'_>,
    held: &HeldVector,
) -> Result<FieldVec, DeviceError> {
    if held.field == Field::BabyBear {
        return Ok(FieldVec::BabyBear(read::<u32>(dev, &held.key)?));
    }
    Ok(gpu::from_u64(held.field, read::<u64>(dev, &held.key)?))
}

fn read<T: Element>(dev: &DeviceLease<'_>, key: &str) -> Result<Vec<T>, DeviceError> {
    let table = dev.table::<T>(key)?.ok_or_else(|| lost(key))?;
    dev.download(&table)
}

/// Not a fault of the device (it neither retires it nor counts towards doing so).
pub(super) fn lost(key: &str) -> DeviceError {
    DeviceError::unsupported(format!(
        "the device no longer holds {key} (its context was rebuilt, or the array was deleted)"
    ))
}

impl HeldVector {
    /// The handle of a result kept on `device` under `key`, adopted by nothing yet.
    pub(super) fn new(device: Arc<GpuDevice>, key: String, field: Field, len: usize) -> Self {
        Self {
            device,
            key,
            field,
            len,
            adopted: Default::default(),
            host: Default::default(),
            turn: Default::default(),
        }
    }

    pub(super) fn key(&self) -> &str {
        &self.key
    }
}
