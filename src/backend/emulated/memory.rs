//! The emulated device's memory: each allocation is host memory of exactly its size,
//! which kernels and the streams' copies reach by address, and which waits for the work
//! queued on it before it is freed.

use super::order::{wait_for_users, AccessLog, Touch};
use super::queue::Address;
use crate::backend::device::engine::{EngineId, EngineMemory};
use std::alloc::Layout;
use std::any::Any;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One emulated device allocation: host memory of exactly the requested bytes (plus the
/// allocator's rounding for zero), freed on drop.
pub struct HostMemory {
    /// Kernels receive a pointer to this field: the buffer's device address.
    pub(super) address: *mut c_void,
    pub(super) bytes: usize,
    pub(super) engine: EngineId,
    pub(super) layout: Layout,
    pub(super) in_use: Arc<AtomicUsize>,
    /// Which streams touched it last, and the queued work still using it (`order.rs`).
    pub(super) log: Mutex<AccessLog>,
}

// SAFETY: the memory is owned by this value alone; access is ordered by the streams that
// use it, and that order is checked (`order.rs`).
unsafe impl Send for HostMemory {}
// SAFETY: shared references only read the address; kernels write through it only inside
// a launch of a buffer passed mutably, ordered as above.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    pub(super) fn touch(&self, writes: bool) -> Touch<'_> {
        Touch {
            log: &self.log,
            writes,
        }
    }

    /// The buffer's device address (a host pointer).
    pub fn address(&self) -> *mut c_void {
        self.address
    }

    /// Where a launch's argument pointer for this buffer points: at its address.
    pub fn address_slot(&self) -> *mut c_void {
        &self.address as *const *mut c_void as *mut c_void
    }

    /// Where byte `at` is (at most the allocation's bytes), and how many bytes of up to
    /// `bytes` fit from there.
    pub(super) fn span(&self, at: usize, bytes: usize) -> (Address, usize) {
        let at = at.min(self.bytes);
        // SAFETY: `at` is at most the allocation's length.
        let address = unsafe { self.address.cast::<u8>().add(at) };
        (Address(address), bytes.min(self.bytes - at))
    }
}

impl Drop for HostMemory {
    /// Waits for the work queued on it first, as `cuMemFree` does.
    fn drop(&mut self) {
        wait_for_users(&mut self.log);
        // SAFETY: allocated with this layout in EmulatedEngine::alloc.
        unsafe { std::alloc::dealloc(self.address.cast(), self.layout) };
        self.in_use.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl EngineMemory for HostMemory {
    fn bytes(&self) -> usize {
        self.bytes
    }

    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn address_slot(&self) -> *mut c_void {
        HostMemory::address_slot(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
