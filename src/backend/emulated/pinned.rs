//! The emulated device's page-locked host memory: plain host memory that its copies
//! touch as a GPU's DMA engines would, queued on a stream and finished only once the host
//! has waited for it. Every copy to or from it is recorded in its access log, and every
//! host touch (`PinnedHost::host_access`) is checked against what the host has waited for
//! (`order.rs`), so staging that reads a download before synchronising fails here. The
//! copies run on the streams' threads (`queue.rs`), so such a read would also race with
//! the copy still writing.

use super::order::{wait_for_users, AccessLog, HostOrder, Touch};
use crate::backend::device::engine::{EngineId, PinnedHost};
use crate::backend::device::DeviceError;
use std::alloc::Layout;
use std::any::Any;
use std::sync::{Arc, Mutex};

pub struct EmulatedPinned {
    address: *mut u8,
    /// How it was allocated, where this value owns it; `None` for the caller's memory
    /// registered with the device (`register_host`), which it never frees.
    layout: Option<Layout>,
    bytes: usize,
    engine: EngineId,
    log: Mutex<AccessLog>,
    order: Arc<HostOrder>,
}

// SAFETY: the memory is owned by this value alone; who touches it when is checked
// (`order.rs`).
unsafe impl Send for EmulatedPinned {}

impl EmulatedPinned {
    pub(super) fn new(
        engine: EngineId,
        order: Arc<HostOrder>,
        bytes: usize,
    ) -> Result<Self, DeviceError> {
        // Page-aligned, as cuMemHostAlloc's; never zero-sized.
        let layout = Layout::from_size_align(bytes.max(1), 4096)
            .map_err(|e| DeviceError::out_of_memory(format!("emulated device: {e}")))?;
        // SAFETY: the layout's size is nonzero. Zeroed, so a read before any write is
        // defined here (a GPU's would read whatever the pages held).
        let address = unsafe { std::alloc::alloc_zeroed(layout) };
        if address.is_null() {
            return Err(DeviceError::out_of_memory(format!(
                "emulated device: the host refused {bytes} page-locked bytes"
            )));
        }
        Ok(Self {
            address,
            layout: Some(layout),
            bytes,
            engine,
            log: Mutex::new(AccessLog::default()),
            order,
        })
    }

    /// The caller's `bytes` at `address`, registered as page-locked: copies from and to
    /// it are queued and checked as for the device's own.
    ///
    /// # Safety
    /// `address` must be valid for `bytes` bytes and outlive the value.
    pub(super) unsafe fn registered(
        engine: EngineId,
        order: Arc<HostOrder>,
        address: *mut u8,
        bytes: usize,
    ) -> Self {
        Self {
            address,
            layout: None,
            bytes,
            engine,
            log: Mutex::new(AccessLog::default()),
            order,
        }
    }

    pub(super) fn touch(&self, writes: bool) -> Touch<'_> {
        Touch {
            log: &self.log,
            writes,
        }
    }
}

impl Drop for EmulatedPinned {
    /// Waits for the copies queued on it first, as `cuMemFreeHost` and
    /// `cuMemHostUnregister` do.
    fn drop(&mut self) {
        wait_for_users(&mut self.log);
        if let Some(layout) = self.layout {
            // SAFETY: allocated with this layout in `new`.
            unsafe { std::alloc::dealloc(self.address, layout) };
        }
    }
}

impl PinnedHost for EmulatedPinned {
    fn as_mut_ptr(&self) -> *mut u8 {
        self.address
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn host_access(&self, writes: bool) -> Result<(), DeviceError> {
        self.order.host_access(&self.log, writes)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
