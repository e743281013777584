//! Results kept where a device made them. An op asked to keep its result, whose answer
//! does not carry the values, leaves the result in the device's cache of copies, pinned,
//! instead of downloading it (`DeviceLease::keep_table`); a `HeldCopy` is the handle.
//! The next step of a chain that names it runs on that device and reads it there. The
//! values come back to the host when they are read (`download`), after which the device's
//! copy is an ordinary cached copy (`release`). The ops say what their values are
//! (`HeldValues`): field vectors (`ops::zk::held`), tensors (`ops::linalg::held`).

use super::{DeviceBuffer, DeviceError, DeviceLease, Element, GpuDevice, Stop};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// Values a device may hold as a kept result.
pub trait HeldValues: Clone + Send + Sync + 'static {
    /// What the handle knows of them without reading them: a field and a length, a dtype
    /// and a shape.
    type Meta: Clone + Send + Sync + std::fmt::Debug + 'static;

    /// The values under `key` in `dev`'s cache, read back on `dev`. `lost(key)` when the
    /// cache no longer has them.
    fn read(dev: &DeviceLease<'_>, key: &str, meta: &Self::Meta) -> Result<Self, DeviceError>;
}

/// Values whose only copy is on a device, under `key` in its cache of copies. Dropped
/// before anything adopted it (its request gone before its array was stored), it takes
/// that copy with it: a pinned copy nobody can name would never be evicted.
pub struct HeldCopy<V: HeldValues> {
    device: Arc<GpuDevice>,
    key: String,
    meta: V::Meta,
    adopted: AtomicBool,
    /// The values on the host, once read back (`set_host`): a step that finds the
    /// device's copy evicted after that uploads them instead of failing.
    host: OnceLock<Arc<V>>,
    /// Taken while the values are read back, so two readers do not both download them
    /// and write the same files at once (`arrays::Arrays::materialised`).
    turn: Mutex<()>,
}

impl<V: HeldValues> Drop for HeldCopy<V> {
    fn drop(&mut self) {
        if !self.adopted.load(Ordering::Acquire) {
            self.discard();
        }
    }
}

impl<V: HeldValues> std::fmt::Debug for HeldCopy<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldCopy")
            .field("device", &self.device.info.ordinal)
            .field("key", &self.key)
            .field("meta", &self.meta)
            .finish()
    }
}

impl<V: HeldValues> HeldCopy<V> {
    /// The handle of a result kept on `device` under `key`, adopted by nothing yet.
    pub fn new(device: Arc<GpuDevice>, key: String, meta: V::Meta) -> Self {
        Self {
            device,
            key,
            meta,
            adopted: AtomicBool::new(false),
            host: OnceLock::new(),
            turn: Mutex::new(()),
        }
    }

    pub fn meta(&self) -> &V::Meta {
        &self.meta
    }

    /// Its key in the device's cache.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The device that holds it.
    pub fn ordinal(&self) -> usize {
        self.device.info.ordinal
    }

    /// Reads the values back: the host copy if they were read back before, else a lease
    /// on the device (this blocks, possibly behind the jobs holding it) and one download.
    /// Fails (`DeviceErrorKind::Unsupported`) when the device no longer has them (its
    /// context was rebuilt after a fault, or the array was deleted meanwhile).
    pub fn download(&self) -> Result<V, DeviceError> {
        self.download_by(None)
    }

    /// `download`, giving up (`DeviceErrorKind::Abandoned`) if no lease on the device is
    /// free by `deadline`: a read from the API waits no longer than a job would.
    pub fn download_by(&self, deadline: Option<Instant>) -> Result<V, DeviceError> {
        if let Some(v) = self.host_copy() {
            return Ok(V::clone(&v));
        }
        let stop = deadline.map(|deadline| Stop {
            deadline,
            abandoned: Arc::new(AtomicBool::new(false)),
        });
        self.read_on(&self.device.lease_for(stop, 0)?)
    }

    /// The values read on `dev`, a lease on the device that holds them (a job's own: a
    /// second lease would wait for it).
    pub fn read_on(&self, dev: &DeviceLease<'_>) -> Result<V, DeviceError> {
        V::read(dev, &self.key, &self.meta)
    }

    /// Its copy on `dev` (its device's lease): the held one, or, read back and evicted
    /// since, the host's copy uploaded again (`words`: the values as the kernels' words).
    pub fn buffer_on<T: Element>(
        &self,
        dev: &DeviceLease<'_>,
        words: impl Fn(&V) -> Result<&[T], DeviceError>,
    ) -> Result<Arc<DeviceBuffer<T>>, DeviceError> {
        match (dev.table::<T>(&self.key)?, self.host_copy()) {
            (Some(table), _) => Ok(table),
            (None, Some(values)) => Ok(Arc::new(dev.upload(words(&values)?)?)),
            (None, None) => Err(lost(&self.key)),
        }
    }

    /// The values on the host, if they were read back.
    pub fn host_copy(&self) -> Option<Arc<V>> {
        self.host.get().cloned()
    }

    /// Records the values read back, for steps that still name the device's copy.
    pub fn set_host(&self, values: Arc<V>) {
        let _ = self.host.set(values);
    }

    /// Held while its values are read back: one reader at a time; `None` if the reader
    /// before still holds it at `deadline`.
    pub fn read_back_turn_by(&self, deadline: Instant) -> Option<MutexGuard<'_, ()>> {
        loop {
            match self.turn.try_lock() {
                Ok(turn) => return Some(turn),
                Err(TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(TryLockError::WouldBlock) if Instant::now() >= deadline => return None,
                Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// Its array is stored: from now on the array's deletion or expiry, or its reading
    /// back, decides what becomes of the device's copy, not this handle's drop.
    pub fn adopt(&self) {
        self.adopted.store(true, Ordering::Release);
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

/// Why a held copy cannot be read: not a fault of the device (it neither retires it nor
/// counts towards doing so).
pub fn lost(key: &str) -> DeviceError {
    DeviceError::unsupported(format!(
        "the device no longer holds {key} (its context was rebuilt, or the array was deleted)"
    ))
}
