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
//! Buffers are of one size, so a kept one serves any job; each belongs to the engine
//! that made it (its context's), so a device keeps its own and a re-probe drops them.

use super::engine::{DeviceEngine, PinnedHost};
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

/// The page-locked bytes all devices may hold together, and what they hold now.
pub struct StagingBudget {
    limit: usize,
    held: AtomicUsize,
}

impl StagingBudget {
    pub fn new(limit_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit_bytes,
            held: AtomicUsize::new(0),
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
        self.held.fetch_sub(STAGING_BUFFER_BYTES, Ordering::Relaxed);
    }
}

/// A device's staging: the budget it shares, and the buffers it keeps for reuse.
pub(super) struct Staging {
    budget: Mutex<Arc<StagingBudget>>,
    kept: Mutex<Vec<Box<dyn PinnedHost>>>,
}

impl Default for Staging {
    fn default() -> Self {
        Self {
            budget: Mutex::new(StagingBudget::new(DEFAULT_STAGING_MIB as usize * (1 << 20))),
            kept: Mutex::new(Vec::new()),
        }
    }
}

/// One staging buffer, lent to a job; kept for the next when dropped, unless a copy may
/// still be using it.
pub struct StagingBuffer<'a> {
    pinned: Option<Box<dyn PinnedHost>>,
    device: &'a GpuDevice,
    budget: Arc<StagingBudget>,
    /// A copy on it may still be in flight (its stream's wait failed): never reused.
    poisoned: bool,
}

impl GpuDevice {
    /// `--gpu-staging-mib`: the budget this device's staging buffers count against,
    /// shared with every other device given the same one. Buffers kept under the old
    /// budget are freed.
    pub fn share_staging(&self, budget: Arc<StagingBudget>) {
        self.clear_staging();
        *lock(&self.staging.budget) = budget;
    }

    /// Page-locked bytes held now by every device sharing this one's budget.
    pub fn staging_bytes(&self) -> usize {
        lock(&self.staging.budget).held()
    }

    /// Frees the kept buffers (a re-probe's new engine cannot use the old one's).
    pub(super) fn clear_staging(&self) {
        let kept = std::mem::take(&mut *lock(&self.staging.kept));
        let budget = lock(&self.staging.budget).clone();
        for _ in kept {
            budget.release();
        }
    }

    /// A staging buffer for `engine`'s copies: a kept one, or a new one if the budget has
    /// room and the engine has page-locked memory; `None` otherwise.
    pub(super) fn take_staging(&self, engine: &dyn DeviceEngine) -> Option<StagingBuffer<'_>> {
        let budget = lock(&self.staging.budget).clone();
        let lend = |pinned| StagingBuffer {
            pinned: Some(pinned),
            device: self,
            budget: budget.clone(),
            poisoned: false,
        };
        loop {
            let Some(kept) = lock(&self.staging.kept).pop() else {
                break;
            };
            if kept.engine_id() == engine.id() {
                return Some(lend(kept));
            }
            budget.release();
        }
        if !budget.claim() {
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

impl StagingBuffer<'_> {
    pub(super) fn pinned(&self) -> &dyn PinnedHost {
        self.pinned.as_deref().expect("held until dropped")
    }

    /// Never to be reused: a copy on it may still be in flight.
    pub(super) fn poison(&mut self) {
        self.poisoned = true;
    }

    /// `range`, refused unless it lies inside the buffer and starts aligned for `T`.
    fn checked<T>(&self, range: &Range<usize>) -> Result<*mut u8, DeviceError> {
        let inside = range.start <= range.end && range.end <= self.pinned().bytes();
        if !inside || range.start % std::mem::align_of::<T>() != 0 {
            return Err(DeviceError::fatal(format!(
                "staging bytes {range:?} of a buffer of {}",
                self.pinned().bytes()
            )));
        }
        // SAFETY: inside the allocation (checked above).
        Ok(unsafe { self.pinned().as_mut_ptr().add(range.start) })
    }

    /// Copies `src` in at byte `at`: the range it now fills. The host may write only once
    /// the copies that read the buffer before have finished (the emulated device checks).
    pub(super) fn fill<T: Element>(
        &mut self,
        at: usize,
        src: &[T],
    ) -> Result<Range<usize>, DeviceError> {
        let range = at..at + std::mem::size_of_val(src);
        let to = self.checked::<T>(&range)?;
        self.pinned().host_access(true)?;
        // SAFETY: the range is inside the buffer and no copy uses it (checked above, or
        // the caller synchronised); `src` is plain data of exactly that many bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().cast::<u8>(), to, range.len()) };
        Ok(range)
    }

    /// Appends the elements of `T` in `range` to `out`, once the download into them has
    /// finished (the host waited for its stream; the emulated device checks).
    pub(super) fn append_to<T: Element>(
        &self,
        range: Range<usize>,
        out: &mut Vec<T>,
    ) -> Result<(), DeviceError> {
        let from = self.checked::<T>(&range)?;
        self.pinned().host_access(false)?;
        let len = range.len() / std::mem::size_of::<T>().max(1);
        // SAFETY: the range is inside the buffer, aligned for T and finished (above);
        // every bit pattern is a T (`Element`).
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(from.cast::<T>(), len) });
        Ok(())
    }
}

impl Drop for StagingBuffer<'_> {
    fn drop(&mut self) {
        let Some(pinned) = self.pinned.take() else {
            return;
        };
        // One the host may not touch yet would be lent to a job that writes it at once.
        if self.poisoned || pinned.host_access(true).is_err() {
            tracing::warn!(
                device = self.device.info.ordinal,
                "a staging buffer was given back with a copy possibly in flight; freed, not kept"
            );
            self.budget.release();
            return;
        }
        let same_budget = Arc::ptr_eq(&lock(&self.device.staging.budget), &self.budget);
        if same_budget {
            lock(&self.device.staging.kept).push(pinned);
        } else {
            self.budget.release();
        }
    }
}
