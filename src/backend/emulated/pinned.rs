//! The emulated device's page-locked host memory: plain host memory that its copies
//! touch as a GPU's DMA engines would, queued on a stream and finished only once the host
//! has waited for it. Every copy to or from it is recorded in its access log, and every
//! host touch (`PinnedHost::host_access`) is checked against what the host has waited for
//! (`order.rs`), so staging that reads a download before synchronising fails here.

use super::order::{AccessLog, HostOrder, Touch};
use crate::backend::device::engine::{EngineId, PinnedHost};
use crate::backend::device::DeviceError;
use std::alloc::Layout;
use std::any::Any;
use std::sync::{Arc, Mutex};

pub struct EmulatedPinned {
    address: *mut u8,
    layout: Layout,
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
            layout,
            bytes,
            engine,
            log: Mutex::new(AccessLog::default()),
            order,
        })
    }

    pub(super) fn touch(&self, writes: bool) -> Touch<'_> {
        Touch {
            log: &self.log,
            writes,
        }
    }
}

impl Drop for EmulatedPinned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.address, self.layout) };
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
