//! Page-locked staging buffers: where a device job's chunks wait for the bus. A copy
//! from pageable memory runs at a fraction of the bus's speed (the driver stages it
//! through page-locked memory of its own, a chunk at a time, and waits), while one from
//! page-locked memory is queued and runs at full speed beside the kernels
//! (`pipeline.rs`). Page-locked memory is taken from the kernel's pool of unswappable
//! pages, so it is bounded: every device's buffers count against one budget
//! (`--gpu-staging-mib`), buffers are kept for reuse once made (making one costs about
//! a millisecond on CUDA), and a job that finds none runs on pageable copies instead,
//! counted (`gpu_ops_staging_fallbacks_total`).
//!
//! Buffers are of one size, so a kept one serves any job of the engine that made it (its
//! context's); a device short of room frees another engine's idle one, and a re-probe
//! frees its device's before the reset.

use super::engine::{DeviceEngine, EngineId, PinnedHost};
use super::{DeviceError, Element, GpuDevice};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes of one staging buffer: large enough that a chunk's copy runs at the bus's
/// speed (tens of microseconds at 55 GB/s, against a few of a copy's fixed cost), small
/// enough that two per job leave room for many jobs within the budget.
pub const STAGING_BUFFER_BYTES: usize = 8 << 20;

/// `--gpu-staging-mib`'s default: 32 buffers, two each for sixteen jobs at once.
pub const DEFAULT_STAGING_MIB: u64 = 256;

/// The page-locked bytes all devices may hold together, what they hold now, and the
/// buffers no job holds, kept for reuse by the engine that made them. Kept buffers are
/// shared: a device that finds the budget spent frees another engine's idle one, so no
/// device keeps staging the others need.
pub struct StagingBudget {
    limit: usize,
    held: AtomicUsize,
    kept: Mutex<Vec<Box<dyn PinnedHost>>>,
}

impl StagingBudget {
    pub fn new(limit_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit_bytes,
            held: AtomicUsize::new(0),
            kept: Mutex::new(Vec::new()),
        })
    }

    /// Page-locked bytes allocated now (in use or kept for reuse).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Room for one more buffer, if the budget has it.
    fn claim(&self) -> bool {
        self.held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held + STAGING_BUFFER_BYTES <= self.limit).then_some(held + STAGING_BUFFER_BYTES)
            })
            .is_ok()
    }

    fn release(&self) {
        let _ = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                Some(held.saturating_sub(STAGING_BUFFER_BYTES))
            });
    }

    /// A kept buffer of `engine`'s.
    fn take_kept(&self, engine: EngineId) -> Option<Box<dyn PinnedHost>> {
        let mut kept = lock(&self.kept);
        let i = kept.iter().position(|b| b.engine_id() == engine)?;
        Some(kept.swap_remove(i))
    }

    /// Room for a new buffer for `engine`: claimed, or made by freeing another engine's
    /// idle buffer.
    fn claim_for(&self, engine: EngineId) -> bool {
        loop {
            if self.claim() {
                return true;
            }
            let evicted = {
                let mut kept = lock(&self.kept);
                match kept.iter().position(|b| b.engine_id() != engine) {
                    Some(i) => kept.swap_remove(i),
                    None => return false,
                }
            };
            drop(evicted);
            self.release();
        }
    }

    /// Frees `engine`'s kept buffers (its context is about to go).
    fn forget(&self, engine: EngineId) {
        let theirs: Vec<_> = {
            let mut kept = lock(&self.kept);
            let (theirs, others) = std::mem::take(&mut *kept)
                .into_iter()
                .partition(|b| b.engine_id() == engine);
            *kept = others;
            theirs
        };
        for buffer in theirs {
            drop(buffer);
            self.release();
        }
    }
}

/// A device's staging: the budget its buffers count against.
pub(super) struct Staging {
    budget: Mutex<Arc<StagingBudget>>,
}

impl Default for Staging {
    fn default() -> Self {
        Self {
            budget: Mutex::new(StagingBudget::new(DEFAULT_STAGING_MIB as usize * (1 << 20))),
        }
    }
}

/// One staging buffer, lent to a job; kept for the next when dropped, unless a copy may
/// still be using it.
pub struct StagingBuffer {
    pinned: Option<Box<dyn PinnedHost>>,
    /// The budget it was claimed from, and is given back to.
    budget: Arc<StagingBudget>,
    /// A copy on it may still be in flight (its stream's wait failed): never reused.
    poisoned: bool,
}

impl GpuDevice {
    /// `--gpu-staging-mib`: the budget this device's staging buffers count against,
    /// shared with every other device given the same one. Buffers kept under the old
    /// budget for this device are freed; a buffer lent meanwhile goes back to the budget
    /// it came from.
    pub fn share_staging(&self, budget: Arc<StagingBudget>) {
        let old = std::mem::replace(&mut *lock(&self.staging.budget), budget);
        old.forget(self.engine().id());
    }

    /// Page-locked bytes held now by every device sharing this one's budget.
    pub fn staging_bytes(&self) -> usize {
        lock(&self.staging.budget).held()
    }

    /// Frees the buffers kept for `engine`, before its context goes (a re-probe).
    pub(super) fn forget_staging(&self, engine: EngineId) {
        lock(&self.staging.budget).clone().forget(engine);
    }

    /// Frees the buffers kept for the current engine: a re-probe calls it before it
    /// resets the device, while their context still exists.
    pub(crate) fn release_staging(&self) {
        let id = self.engine().id();
        self.forget_staging(id);
    }

    /// A staging buffer for `engine`'s copies: a kept one, or a new one if the budget has
    /// room (freeing another engine's idle one if need be) and the engine has page-locked
    /// memory; `None` otherwise.
    pub(super) fn take_staging(&self, engine: &dyn DeviceEngine) -> Option<StagingBuffer> {
        let budget = lock(&self.staging.budget).clone();
        let lend = |pinned| StagingBuffer {
            pinned: Some(pinned),
            budget: budget.clone(),
            poisoned: false,
        };
        if let Some(kept) = budget.take_kept(engine.id()) {
            return Some(lend(kept));
        }
        if !budget.claim_for(engine.id()) {
            return None;
        }
        match engine.pinned_host(STAGING_BUFFER_BYTES) {
            Ok(Some(pinned)) => Some(lend(pinned)),
            Ok(None) => {
                budget.release();
                None
            }
            Err(e) => {
                budget.release();
                tracing::warn!(device = self.info.ordinal, error = %e,
                    "page-locked memory refused; copies stay pageable");
                None
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StagingBuffer {
    pub(super) fn pinned(&self) -> &dyn PinnedHost {
        self.pinned.as_deref().expect("held until dropped")
    }

    /// Never to be reused: a copy on it may still be in flight.
    pub(super) fn poison(&mut self) {
        self.poisoned = true;
    }

    /// `range`, refused unless it lies inside the buffer and starts aligned for `T`.
    fn checked<T>(&self, range: &Range<usize>) -> Result<*mut u8, DeviceError> {
        if range.start % std::mem::align_of::<T>() != 0 {
            return Err(DeviceError::fatal(format!(
                "staging bytes {range:?} are not aligned for their elements"
            )));
        }
        self.pinned().range_address(range)
    }

    /// Copies `src` in at byte `at`: the range it now fills. The host may write only once
    /// the copies that read the buffer before have finished (the emulated device checks).
    pub(super) fn fill<T: Element>(
        &mut self,
        at: usize,
        src: &[T],
    ) -> Result<Range<usize>, DeviceError> {
        self.fill_with(at, src.len(), |into: &mut [T]| into.copy_from_slice(src))
    }

    /// Lets `write` fill `len` elements of `T` from byte `at`, as `fill` copies them in: the
    /// range they now fill.
    pub(super) fn fill_with<T: Element>(
        &mut self,
        at: usize,
        len: usize,
        write: impl FnOnce(&mut [T]),
    ) -> Result<Range<usize>, DeviceError> {
        let range = at..at + len * std::mem::size_of::<T>();
        let to = self.checked::<T>(&range)?;
        self.pinned().host_access(true)?;
        // SAFETY: the range is inside the buffer, aligned for T, and no copy uses it
        // (checked above, or the caller synchronised); every bit pattern is a T
        // (`Element`), so the slice is valid before `write` fills it.
        write(unsafe { std::slice::from_raw_parts_mut(to.cast::<T>(), len) });
        Ok(range)
    }

    /// Appends the elements of `T` in `range` to `out`, once the download into them has
    /// finished (the host waited for its stream; the emulated device checks).
    pub(super) fn append_to<T: Element>(
        &self,
        range: Range<usize>,
        out: &mut Vec<T>,
    ) -> Result<(), DeviceError> {
        self.read_with(range, |from: &[T]| out.extend_from_slice(from))
    }

    /// Lets `read` see the elements of `T` in `range`, once the download into them has
    /// finished, as `append_to` copies them out.
    pub(super) fn read_with<T: Element, R>(
        &self,
        range: Range<usize>,
        read: impl FnOnce(&[T]) -> R,
    ) -> Result<R, DeviceError> {
        let from = self.checked::<T>(&range)?;
        self.pinned().host_access(false)?;
        let len = range.len() / std::mem::size_of::<T>().max(1);
        // SAFETY: the range is inside the buffer, aligned for T and finished (above);
        // every bit pattern is a T (`Element`).
        Ok(read(unsafe {
            std::slice::from_raw_parts(from.cast::<T>(), len)
        }))
    }
}

impl Drop for StagingBuffer {
    fn drop(&mut self) {
        let Some(pinned) = self.pinned.take() else {
            return;
        };
        if self.poisoned {
            self.budget.release();
            return;
        }
        // One the host may not touch yet would be lent to a job that writes it at once:
        // a launcher's bug, which the emulated device finds (GPU engines cannot tell).
        if let Err(e) = pinned.host_access(true) {
            if cfg!(debug_assertions) && !std::thread::panicking() {
                panic!("a staging buffer was given back with a copy in flight: {e}");
            }
            tracing::error!(error = %e, "a staging buffer was given back with a copy in flight; freed, not kept");
            self.budget.release();
            return;
        }
        lock(&self.budget.kept).push(pinned);
    }
}
