//! Page-locked host memory on AMD: `hipHostMalloc`'d for a HIP device's staging buffers
//! (`backend::device::staging`), so its chunked jobs' copies are queued on their lanes and
//! run at the bus's speed, as on CUDA; and the caller's memory `hipHostRegister`ed for
//! request bodies (`backend::device::pinned_body`). Only the stand-in runtime of
//! `tests.rs` has run these calls; no AMD GPU has.

use super::engine::{HipEngine, HipMemory, HipStream, Ptr};
use crate::backend::device::engine::{EngineId, PinnedHost};
use crate::backend::device::DeviceError;
use std::any::Any;
use std::ffi::c_int;

pub struct HipPinned {
    address: Ptr,
    bytes: usize,
    engine: EngineId,
    /// `hipHostFree` for memory HIP allocated, `hipHostUnregister` for the caller's.
    free: unsafe extern "C" fn(Ptr) -> c_int,
}

// SAFETY: host memory this value owns; who touches it when is the streams' order.
unsafe impl Send for HipPinned {}

impl Drop for HipPinned {
    fn drop(&mut self) {
        // SAFETY: allocated by hipHostMalloc and freed once, or registered by
        // hipHostRegister and unregistered once, here (an error after a reset is moot).
        unsafe { (self.free)(self.address) };
    }
}

impl PinnedHost for HipPinned {
    fn as_mut_ptr(&self) -> *mut u8 {
        self.address.cast()
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl HipEngine {
    /// The caller's `bytes` at `address` registered as page-locked (default flags);
    /// unregistered, never freed, when the value drops. A device reset drops the
    /// registration and leaves the bytes, which are the caller's.
    ///
    /// # Safety
    /// `address` must be valid for `bytes` bytes and outlive the value.
    pub unsafe fn register_host(
        &self,
        address: Ptr,
        bytes: usize,
    ) -> Result<HipPinned, DeviceError> {
        self.bind_to_thread()?;
        // SAFETY: HIP's signature; the caller's contract for the range.
        let rc = unsafe { (self.api.host_register)(address, bytes.max(1), 0) };
        self.api.check(rc, "hipHostRegister")?;
        Ok(HipPinned {
            address,
            bytes,
            engine: self.id,
            free: self.api.host_unregister,
        })
    }

    /// `bytes` of page-locked host memory (default flags: usable by every device).
    pub fn pinned_host(&self, bytes: usize) -> Result<HipPinned, DeviceError> {
        self.bind_to_thread()?;
        let mut address: Ptr = std::ptr::null_mut();
        // SAFETY: HIP's signature; the out-pointer is valid; never zero bytes.
        let rc = unsafe { (self.api.host_malloc)(&mut address, bytes.max(1), 0) };
        self.api.check(rc, "hipHostMalloc")?;
        Ok(HipPinned {
            address,
            bytes,
            engine: self.id,
            free: self.api.host_free,
        })
    }

    /// Queues a copy of `bytes` from page-locked `src` into `dst` from byte `at` on (as
    /// many as fit); returns at once.
    ///
    /// # Safety
    /// `src` must be page-locked host memory of `bytes` bytes left alone until the stream
    /// has passed the copy; `at` at most `dst.bytes`.
    pub unsafe fn upload_queued(
        &self,
        stream: &HipStream,
        dst: &HipMemory,
        at: usize,
        src: Ptr,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let bytes = bytes.min(dst.bytes - at);
        // SAFETY: the caller's contract; HIP's signature; `at` is inside the allocation.
        let to = unsafe { dst.address.cast::<u8>().add(at) }.cast();
        // SAFETY: as above.
        let rc = unsafe { (self.api.htod)(to, src, bytes, stream.handle) };
        self.api.check(rc, "hipMemcpyHtoDAsync")
    }

    /// Queues a copy of `bytes` of `src` from byte `at` on (as many as remain) into
    /// page-locked `dst`; returns at once.
    ///
    /// # Safety
    /// As `upload_queued`, with `dst` the page-locked side, untouched until the stream has
    /// passed the copy.
    pub unsafe fn download_queued(
        &self,
        stream: &HipStream,
        src: &HipMemory,
        at: usize,
        dst: Ptr,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let bytes = bytes.min(src.bytes - at);
        // SAFETY: the caller's contract; HIP's signature; `at` is inside the allocation.
        let from = unsafe { src.address.cast::<u8>().add(at) }.cast();
        // SAFETY: as above.
        let rc = unsafe { (self.api.dtoh)(dst, from, bytes, stream.handle) };
        self.api.check(rc, "hipMemcpyDtoHAsync")
    }
}
