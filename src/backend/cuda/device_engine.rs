//! The CUDA engine behind the device interface: driver calls on the lease's stream (a
//! non-blocking CUDA stream), ordered across streams by events. cudarc's cross-stream
//! event tracking is off for these contexts (`open_device`): our own events order what
//! crosses streams, and the emulated device checks that they do (`backend::emulated`).
//!
//! Memory is allocated and freed synchronously (`cuMemAlloc`, `cuMemFree`), not on a
//! stream: a buffer's last use may be queued on any lease's stream (a cached table is
//! used by many), and `cuMemFree` waits for the device's work on it where a stream-ordered
//! free would wait only for its own stream's. Each allocation keeps its device address,
//! the address a launch's argument points at, and a cudarc view of it that cuDNN's typed
//! calls take.

use super::CudaEngine;
use crate::backend::device::engine::{
    own, own_event, own_mut, own_pinned, own_stream, room_from, DeviceEngine, EngineEvent,
    EngineId, EngineMemory, EngineStream, KernelArgs, LaunchConfig, PinnedHost, Timestamp,
};
use crate::backend::device::{DeviceError, KernelLimits, ModuleLoad};
use cudarc::driver::{
    result, sys, sys::CUevent_flags, CudaContext, CudaEvent, CudaSlice, CudaStream, PinnedHostSlice,
};
use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

/// One allocation on a CUDA device.
pub(crate) struct CudaMemory {
    /// Kernels receive a pointer to this field: the allocation's device address.
    address: sys::CUdeviceptr,
    bytes: usize,
    engine: EngineId,
    /// cudarc's view of the allocation, which never frees it (taken back in `drop`).
    slice: Option<CudaSlice<u8>>,
    ctx: Arc<CudaContext>,
}

impl CudaMemory {
    pub(crate) fn address(&self) -> sys::CUdeviceptr {
        self.address
    }

    /// The allocation as cudarc views it (cuDNN's typed views are made from it).
    pub(crate) fn slice(&self) -> &CudaSlice<u8> {
        self.slice
            .as_ref()
            .expect("held until the allocation is freed")
    }

    pub(crate) fn slice_mut(&mut self) -> &mut CudaSlice<u8> {
        self.slice
            .as_mut()
            .expect("held until the allocation is freed")
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if let Some(view) = self.slice.take() {
            // The view gives the address back without freeing it; cuMemFree waits for
            // the work queued on it, on any stream.
            let address = view.leak();
            // The context made current directly, as `CudaPinned`'s drop does:
            // `bind_to_thread` would first return (and clear) an error some other call
            // left, and the memory would leak. SAFETY: the context is alive (held by
            // `ctx`); the address was allocated by cuMemAlloc in `alloc`, freed once, here.
            let freed = unsafe {
                result::ctx::set_current(self.ctx.cu_ctx())
                    .and_then(|()| result::free_sync(address))
            };
            if let Err(e) = freed {
                tracing::warn!(error = %e, "cuMemFree failed; the context is likely lost");
            }
        }
    }
}

/// One lease's stream on a CUDA device.
pub(crate) struct CudaLeaseStream {
    engine: EngineId,
    pub(crate) stream: Arc<CudaStream>,
}

impl EngineStream for CudaLeaseStream {
    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// An event without timing, for ordering one stream after another.
struct CudaOrderEvent {
    engine: EngineId,
    event: CudaEvent,
}

impl EngineEvent for CudaOrderEvent {
    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CudaEngine {
    fn lease_stream<'s>(
        &self,
        stream: &'s dyn EngineStream,
    ) -> Result<&'s CudaStream, DeviceError> {
        Ok(&own_stream::<CudaLeaseStream>(self.id, stream)?.stream)
    }

    /// Held around each use of a vendor library's handle (descriptors, queries, calls):
    /// the handles and workspaces are the engine's, shared by every lease, and a handle
    /// is not to be used by two threads at once.
    pub(crate) fn library_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.library_calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `call` (a cuBLASLt or cuDNN call, under `library_lock`) on the engine's
    /// library stream, after the work queued on `lease` so far and before the work queued
    /// there next.
    pub(crate) fn on_library_stream<T>(
        &self,
        lease: &dyn EngineStream,
        call: impl FnOnce(&Arc<CudaStream>) -> T,
    ) -> Result<T, DeviceError> {
        let lease = self.lease_stream(lease)?;
        self.stream.join(lease)?;
        let out = call(&self.stream);
        lease.join(&self.stream)?;
        Ok(out)
    }
}

impl EngineMemory for CudaMemory {
    fn bytes(&self) -> usize {
        self.bytes
    }

    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn address_slot(&self) -> *mut c_void {
        (&self.address as *const sys::CUdeviceptr).cast_mut().cast()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// A CUDA event recorded with timing on the engine's stream.
struct CudaStamp(CudaEvent);

impl Timestamp for CudaStamp {
    fn ms_since(&self, start: &dyn Timestamp) -> Option<f64> {
        let start = start.as_any().downcast_ref::<CudaStamp>()?;
        start.0.elapsed_ms(&self.0).ok().map(f64::from)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Page-locked host memory of the engine's context: allocated by it (`pinned_host`), or
/// the caller's registered in it (`register_host`). Its address is read once: cudarc's
/// accessors wait for an event of its own copies, which we never make (ours are ordered
/// by the lease's streams).
struct CudaPinned {
    memory: HostMemory,
    address: *mut u8,
    bytes: usize,
    engine: EngineId,
}

enum HostMemory {
    /// `cuMemHostAlloc`'d: freed with the slice.
    Allocated(#[allow(dead_code)] PinnedHostSlice<u8>),
    /// The caller's, registered in this context: unregistered on drop, never freed here.
    Registered(Arc<CudaContext>),
}

// SAFETY: the address is of memory this value owns or the caller keeps alive for it
// (`register_host`); who may touch it when is the streams' order, as for any pinned
// buffer.
unsafe impl Send for CudaPinned {}

impl Drop for CudaPinned {
    fn drop(&mut self) {
        let HostMemory::Registered(ctx) = &self.memory else {
            return;
        };
        // The context made current directly: `bind_to_thread` would first return (and
        // clear) an error some other call left, and skip the unregister. SAFETY: the
        // context is alive (held by `ctx`); the address was registered in it by
        // `register_host`.
        let rc = unsafe {
            result::ctx::set_current(ctx.cu_ctx())
                .and_then(|()| sys::cuMemHostUnregister(self.address.cast()).result())
        };
        // After a reset of the context the registration is gone already: the bytes are
        // the caller's either way, and no later copy can reach them through it.
        if let Err(e) = rc {
            if e.0 != sys::CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED {
                tracing::error!(error = %e, "unregistering page-locked host memory failed");
            }
        }
    }
}

impl PinnedHost for CudaPinned {
    fn as_mut_ptr(&self) -> *mut u8 {
        self.address
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

impl DeviceEngine for CudaEngine {
    fn bind_to_thread(&self) -> Result<(), DeviceError> {
        Ok(self.ctx.bind_to_thread()?)
    }

    fn memory(&self) -> Option<(u64, u64)> {
        CudaEngine::memory(self)
    }

    fn alloc(&self, bytes: usize) -> Result<Box<dyn EngineMemory>, DeviceError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the contents are unspecified until written, as the trait says; a byte
        // allocation has no invalid values. Never zero bytes: every buffer has an address.
        let address = unsafe { result::malloc_sync(bytes.max(1)) }?;
        // SAFETY: `address` is a live allocation of that many bytes; the view never frees
        // it (`CudaMemory::drop` takes it back first).
        let slice = unsafe { self.stream.upgrade_device_ptr::<u8>(address, bytes.max(1)) };
        Ok(Box::new(CudaMemory {
            address,
            bytes,
            engine: self.id,
            slice: Some(slice),
            ctx: self.ctx.clone(),
        }))
    }

    fn id(&self) -> EngineId {
        self.id
    }

    fn new_stream(&self) -> Result<Box<dyn EngineStream>, DeviceError> {
        Ok(Box::new(CudaLeaseStream {
            engine: self.id,
            stream: self.ctx.new_stream()?,
        }))
    }

    fn record(&self, stream: &dyn EngineStream) -> Result<Box<dyn EngineEvent>, DeviceError> {
        let event = self
            .lease_stream(stream)?
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        Ok(Box::new(CudaOrderEvent {
            engine: self.id,
            event,
        }))
    }

    fn wait(&self, stream: &dyn EngineStream, event: &dyn EngineEvent) -> Result<(), DeviceError> {
        let event = own_event::<CudaOrderEvent>(self.id, event)?;
        Ok(self.lease_stream(stream)?.wait(&event.event)?)
    }

    fn host_wait(&self, event: &dyn EngineEvent) -> Result<(), DeviceError> {
        let event = own_event::<CudaOrderEvent>(self.id, event)?;
        self.ctx.bind_to_thread()?;
        Ok(event.event.synchronize()?)
    }

    unsafe fn write(
        &self,
        stream: &dyn EngineStream,
        dst: &mut dyn EngineMemory,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let (stream, dst) = (
            self.lease_stream(stream)?,
            own::<CudaMemory>(self.id(), dst)?,
        );
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller's contract: `src` holds `bytes` bytes, `dst` at least as many.
        unsafe {
            let src = std::slice::from_raw_parts(src, bytes.min(dst.bytes));
            result::memcpy_htod_async(dst.address, src, stream.cu_stream())?;
        }
        Ok(())
    }

    unsafe fn read(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let (stream, src) = (
            self.lease_stream(stream)?,
            own::<CudaMemory>(self.id(), src)?,
        );
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller's contract: `dst` has room for `bytes` bytes, `src` holds them.
        // A raw pointer, not a slice: `dst` may be a vector's spare (uninitialised) room.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                dst.cast(),
                src.address,
                bytes.min(src.bytes),
                stream.cu_stream(),
            )
            .result()?
        };
        Ok(stream.synchronize()?)
    }

    unsafe fn upload_pinned(
        &self,
        stream: &dyn EngineStream,
        dst: &mut dyn EngineMemory,
        at: usize,
        src: &dyn PinnedHost,
        range: std::ops::Range<usize>,
    ) -> Result<(), DeviceError> {
        let (stream, dst) = (
            self.lease_stream(stream)?,
            own::<CudaMemory>(self.id(), dst)?,
        );
        let from = own_pinned::<CudaPinned>(self.id, src)?.range_address(&range)?;
        let room = room_from(at, dst.bytes)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the range is inside the pinned buffer (checked), `dst` holds at least as
        // many bytes from `at` (min); the caller keeps the host off the range until the
        // stream passes.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.address + at as u64,
                from.cast(),
                range.len().min(room),
                stream.cu_stream(),
            )
            .result()?
        };
        Ok(())
    }

    unsafe fn download_pinned(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        at: usize,
        dst: &dyn PinnedHost,
        range: std::ops::Range<usize>,
    ) -> Result<(), DeviceError> {
        let (stream, src) = (
            self.lease_stream(stream)?,
            own::<CudaMemory>(self.id(), src)?,
        );
        let to = own_pinned::<CudaPinned>(self.id, dst)?.range_address(&range)?;
        let room = room_from(at, src.bytes)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: as in `upload_pinned`; queued, not waited for.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                to.cast(),
                src.address + at as u64,
                range.len().min(room),
                stream.cu_stream(),
            )
            .result()?
        };
        Ok(())
    }

    fn zero(
        &self,
        stream: &dyn EngineStream,
        memory: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError> {
        let stream = self.lease_stream(stream)?;
        let m = own_mut::<CudaMemory>(self.id(), memory)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the allocation holds `bytes` bytes (at least one).
        unsafe { result::memset_d8_async(m.address, 0, m.bytes, stream.cu_stream())? };
        Ok(())
    }

    fn copy(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        dst: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError> {
        let stream = self.lease_stream(stream)?;
        let (src, dst) = (
            own::<CudaMemory>(self.id(), src)?,
            own_mut::<CudaMemory>(self.id(), dst)?,
        );
        self.ctx.bind_to_thread()?;
        let bytes = src.bytes.min(dst.bytes);
        // SAFETY: both allocations hold at least `bytes` bytes; two never overlap.
        unsafe { result::memcpy_dtod_async(dst.address, src.address, bytes, stream.cu_stream())? };
        Ok(())
    }

    fn synchronize(&self, stream: &dyn EngineStream) -> Result<(), DeviceError> {
        Ok(self.lease_stream(stream)?.synchronize()?)
    }

    fn has_kernel(&self, name: &str) -> bool {
        self.function(name).is_ok()
    }

    fn kernel_limits(&self, name: &str) -> KernelLimits {
        CudaEngine::kernel_limits(self, name)
    }

    unsafe fn launch(
        &self,
        stream: &dyn EngineStream,
        name: &str,
        config: LaunchConfig,
        args: &mut KernelArgs<'_>,
    ) -> Result<(), DeviceError> {
        let stream = self.lease_stream(stream)?;
        let function = self.function(name)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller's contract; the function belongs to this context.
        unsafe {
            result::launch_kernel(
                function.cu_function(),
                config.grid_dim,
                config.block_dim,
                config.shared_mem_bytes,
                stream.cu_stream(),
                &mut args.pointers,
            )?
        };
        Ok(())
    }

    fn timestamp(&self, stream: &dyn EngineStream) -> Option<Box<dyn Timestamp>> {
        let event = self
            .lease_stream(stream)
            .ok()?
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .ok()?;
        Some(Box::new(CudaStamp(event)))
    }

    fn pinned_host(&self, bytes: usize) -> Result<Option<Box<dyn PinnedHost>>, DeviceError> {
        // Default flags, as bandwidthTest uses. SAFETY: the memory is written (by a copy)
        // before anything reads it.
        let mut slice = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(bytes.max(1), 0) }?;
        let address = slice.as_mut_ptr()?;
        Ok(Some(Box::new(CudaPinned {
            bytes: slice.num_bytes(),
            memory: HostMemory::Allocated(slice),
            address,
            engine: self.id,
        })))
    }

    unsafe fn register_host(
        &self,
        address: *mut u8,
        bytes: usize,
    ) -> Result<Option<Box<dyn PinnedHost>>, DeviceError> {
        self.ctx.bind_to_thread()?;
        // Default flags: copies of this context only (the lease's engine is checked on
        // every copy). SAFETY: the caller's contract; the range is unregistered on drop.
        unsafe { sys::cuMemHostRegister_v2(address.cast(), bytes.max(1), 0) }.result()?;
        Ok(Some(Box::new(CudaPinned {
            memory: HostMemory::Registered(self.ctx.clone()),
            address,
            bytes,
            engine: self.id,
        })))
    }

    fn module_loads(&self) -> Vec<ModuleLoad> {
        self.module_loads.clone()
    }

    fn facts(&self) -> serde_json::Value {
        CudaEngine::facts(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
