//! The CUDA engine behind the device interface: driver calls on the engine's one stream.
//! Memory is a byte allocation (`CudaSlice<u8>`, freed by cudarc on its stream) with its
//! device address kept beside it, the address a launch's argument points at. cudarc's
//! cross-stream event tracking is off for these contexts (`open_device`), so raw launches
//! and copies are ordered by the stream alone, exactly as cudarc's own calls were.

use super::CudaEngine;
use crate::backend::device::engine::{
    own, own_mut, DeviceEngine, EngineId, EngineMemory, KernelArgs, LaunchConfig, PinnedHost,
    Timestamp,
};
use crate::backend::device::{DeviceError, KernelLimits, ModuleLoad};
use cudarc::driver::{
    result, sys, sys::CUevent_flags, CudaEvent, CudaSlice, DevicePtr, PinnedHostSlice,
};
use std::any::Any;
use std::ffi::c_void;

/// One allocation on a CUDA device.
pub(crate) struct CudaMemory {
    /// Kernels receive a pointer to this field: the allocation's device address.
    address: sys::CUdeviceptr,
    bytes: usize,
    engine: EngineId,
    /// Never replaced: `address` is its address.
    slice: CudaSlice<u8>,
}

impl CudaMemory {
    pub(crate) fn address(&self) -> sys::CUdeviceptr {
        self.address
    }

    /// The allocation as cudarc holds it (cuDNN's typed views are made from it).
    pub(crate) fn slice(&self) -> &CudaSlice<u8> {
        &self.slice
    }

    pub(crate) fn slice_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.slice
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

/// Page-locked host memory of the engine's context.
struct CudaPinned(PinnedHostSlice<u8>);

impl PinnedHost for CudaPinned {
    fn as_mut_ptr(&mut self) -> Result<*mut u8, DeviceError> {
        Ok(self.0.as_mut_ptr()?)
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
        // SAFETY: the contents are unspecified until written, as the trait says; a byte
        // allocation has no invalid values.
        let slice = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }?;
        let address = slice.device_ptr(&self.stream).0;
        Ok(Box::new(CudaMemory {
            address,
            bytes,
            engine: self.id,
            slice,
        }))
    }

    fn id(&self) -> EngineId {
        self.id
    }

    unsafe fn write(
        &self,
        dst: &mut dyn EngineMemory,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let dst = own::<CudaMemory>(self.id(), dst)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller's contract: `src` holds `bytes` bytes, `dst` at least as many.
        unsafe {
            let src = std::slice::from_raw_parts(src, bytes.min(dst.bytes));
            result::memcpy_htod_async(dst.address, src, self.stream.cu_stream())?;
        }
        Ok(())
    }

    unsafe fn read(
        &self,
        src: &dyn EngineMemory,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let src = own::<CudaMemory>(self.id(), src)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller's contract: `dst` has room for `bytes` bytes, `src` holds them.
        // A raw pointer, not a slice: `dst` may be a vector's spare (uninitialised) room.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                dst.cast(),
                src.address,
                bytes.min(src.bytes),
                self.stream.cu_stream(),
            )
            .result()?
        };
        Ok(self.stream.synchronize()?)
    }

    fn zero(&self, memory: &mut dyn EngineMemory) -> Result<(), DeviceError> {
        let m = own_mut::<CudaMemory>(self.id(), memory)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the allocation holds `bytes` bytes (at least one).
        unsafe { result::memset_d8_async(m.address, 0, m.bytes, self.stream.cu_stream())? };
        Ok(())
    }

    fn copy(&self, src: &dyn EngineMemory, dst: &mut dyn EngineMemory) -> Result<(), DeviceError> {
        let (src, dst) = (
            own::<CudaMemory>(self.id(), src)?,
            own_mut::<CudaMemory>(self.id(), dst)?,
        );
        self.ctx.bind_to_thread()?;
        let bytes = src.bytes.min(dst.bytes);
        // SAFETY: both allocations hold at least `bytes` bytes; two never overlap.
        unsafe {
            result::memcpy_dtod_async(dst.address, src.address, bytes, self.stream.cu_stream())?
        };
        Ok(())
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        Ok(self.stream.synchronize()?)
    }

    fn has_kernel(&self, name: &str) -> bool {
        self.function(name).is_ok()
    }

    fn kernel_limits(&self, name: &str) -> KernelLimits {
        CudaEngine::kernel_limits(self, name)
    }

    unsafe fn launch(
        &self,
        name: &str,
        config: LaunchConfig,
        args: &mut KernelArgs,
    ) -> Result<(), DeviceError> {
        let function = self.function(name)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller's contract; the function belongs to this context.
        unsafe {
            result::launch_kernel(
                function.cu_function(),
                config.grid_dim,
                config.block_dim,
                config.shared_mem_bytes,
                self.stream.cu_stream(),
                &mut args.pointers,
            )?
        };
        Ok(())
    }

    fn timestamp(&self) -> Option<Box<dyn Timestamp>> {
        let event = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .ok()?;
        Some(Box::new(CudaStamp(event)))
    }

    fn pinned_host(&self, bytes: usize) -> Result<Option<Box<dyn PinnedHost>>, DeviceError> {
        // Default flags, as bandwidthTest uses. SAFETY: the memory is written (by a copy)
        // before anything reads it.
        let slice = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(bytes.max(1), 0) }?;
        Ok(Some(Box::new(CudaPinned(slice))))
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
