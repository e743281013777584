//! The HIP engine behind the device interface: each method the engine's own call of the
//! same name, on the lease's stream.

use super::engine::{HipEngine, HipEvent, HipMemory, HipStream};
use super::pinned::HipPinned;
use crate::backend::device::engine::{
    own, own_event, own_mut, own_pinned, own_stream, room_from, DeviceEngine, EngineEvent,
    EngineId, EngineMemory, EngineStream, KernelArgs, LaunchConfig, PinnedHost,
};
use crate::backend::device::{DeviceError, KernelLimits, ModuleLoad};
use std::any::Any;
use std::ffi::c_void;

impl EngineMemory for HipMemory {
    fn bytes(&self) -> usize {
        HipMemory::bytes(self)
    }

    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn address_slot(&self) -> *mut c_void {
        HipMemory::address_slot(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl EngineStream for HipStream {
    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl EngineEvent for HipEvent {
    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl HipEngine {
    fn stream<'s>(&self, stream: &'s dyn EngineStream) -> Result<&'s HipStream, DeviceError> {
        own_stream::<HipStream>(self.id, stream)
    }
}

impl DeviceEngine for HipEngine {
    fn bind_to_thread(&self) -> Result<(), DeviceError> {
        HipEngine::bind_to_thread(self)
    }

    fn memory(&self) -> Option<(u64, u64)> {
        HipEngine::memory(self)
    }

    fn alloc(&self, bytes: usize) -> Result<Box<dyn EngineMemory>, DeviceError> {
        Ok(Box::new(HipEngine::alloc(self, bytes)?))
    }

    fn id(&self) -> EngineId {
        self.id
    }

    fn new_stream(&self) -> Result<Box<dyn EngineStream>, DeviceError> {
        Ok(Box::new(HipEngine::new_stream(self)?))
    }

    fn record(&self, stream: &dyn EngineStream) -> Result<Box<dyn EngineEvent>, DeviceError> {
        Ok(Box::new(HipEngine::record(self, self.stream(stream)?)?))
    }

    fn wait(&self, stream: &dyn EngineStream, event: &dyn EngineEvent) -> Result<(), DeviceError> {
        let event = own_event::<HipEvent>(self.id, event)?;
        HipEngine::wait(self, self.stream(stream)?, event)
    }

    fn host_wait(&self, event: &dyn EngineEvent) -> Result<(), DeviceError> {
        let event = own_event::<HipEvent>(self.id, event)?;
        HipEngine::host_wait(self, event)
    }

    unsafe fn write(
        &self,
        stream: &dyn EngineStream,
        dst: &mut dyn EngineMemory,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let (stream, dst) = (self.stream(stream)?, own::<HipMemory>(self.id(), dst)?);
        // SAFETY: the caller's contract.
        unsafe { HipEngine::write(self, stream, dst, src.cast(), bytes) }
    }

    unsafe fn read(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let (stream, src) = (self.stream(stream)?, own::<HipMemory>(self.id(), src)?);
        // SAFETY: the caller's contract.
        unsafe { HipEngine::read(self, stream, src, dst.cast(), bytes) }
    }

    unsafe fn upload_pinned(
        &self,
        stream: &dyn EngineStream,
        dst: &mut dyn EngineMemory,
        at: usize,
        src: &dyn PinnedHost,
        range: std::ops::Range<usize>,
    ) -> Result<(), DeviceError> {
        let (stream, dst) = (self.stream(stream)?, own::<HipMemory>(self.id(), dst)?);
        let from = own_pinned::<HipPinned>(self.id, src)?.range_address(&range)?;
        room_from(at, dst.bytes)?;
        // SAFETY: the range is inside the pinned buffer and `at` inside dst (checked); the
        // caller's contract.
        unsafe { HipEngine::upload_queued(self, stream, dst, at, from.cast(), range.len()) }
    }

    unsafe fn download_pinned(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        at: usize,
        dst: &dyn PinnedHost,
        range: std::ops::Range<usize>,
    ) -> Result<(), DeviceError> {
        let (stream, src) = (self.stream(stream)?, own::<HipMemory>(self.id(), src)?);
        let to = own_pinned::<HipPinned>(self.id, dst)?.range_address(&range)?;
        room_from(at, src.bytes)?;
        // SAFETY: as in `upload_pinned`.
        unsafe { HipEngine::download_queued(self, stream, src, at, to.cast(), range.len()) }
    }

    fn zero(
        &self,
        stream: &dyn EngineStream,
        memory: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError> {
        let stream = self.stream(stream)?;
        HipEngine::zero(self, stream, own_mut::<HipMemory>(self.id(), memory)?)
    }

    fn copy(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        dst: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError> {
        HipEngine::copy(
            self,
            self.stream(stream)?,
            own::<HipMemory>(self.id(), src)?,
            own_mut::<HipMemory>(self.id(), dst)?,
        )
    }

    fn synchronize(&self, stream: &dyn EngineStream) -> Result<(), DeviceError> {
        HipEngine::synchronize(self, self.stream(stream)?)
    }

    fn has_kernel(&self, name: &str) -> bool {
        HipEngine::has_kernel(self, name)
    }

    fn kernel_limits(&self, name: &str) -> KernelLimits {
        HipEngine::kernel_limits(self, name)
    }

    unsafe fn launch(
        &self,
        stream: &dyn EngineStream,
        name: &str,
        config: LaunchConfig,
        args: &mut KernelArgs<'_>,
    ) -> Result<(), DeviceError> {
        let stream = self.stream(stream)?;
        // SAFETY: the caller's contract.
        unsafe {
            HipEngine::launch(
                self,
                stream,
                name,
                config.grid_dim,
                config.block_dim,
                config.shared_mem_bytes,
                &mut args.pointers,
            )
        }
    }

    /// `hipHostMalloc`'d memory (`pinned.rs`).
    fn pinned_host(&self, bytes: usize) -> Result<Option<Box<dyn PinnedHost>>, DeviceError> {
        Ok(Some(Box::new(HipEngine::pinned_host(self, bytes)?)))
    }

    /// `hipHostRegister` (`pinned.rs`).
    unsafe fn register_host(
        &self,
        address: *mut u8,
        bytes: usize,
    ) -> Result<Option<Box<dyn PinnedHost>>, DeviceError> {
        // SAFETY: the caller's contract.
        let pinned = unsafe { HipEngine::register_host(self, address.cast(), bytes) }?;
        Ok(Some(Box::new(pinned)))
    }

    fn module_loads(&self) -> Vec<ModuleLoad> {
        self.module_loads.clone()
    }

    fn facts(&self) -> serde_json::Value {
        serde_json::json!({ "vendor": "amd" })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
