//! The HIP engine behind the device interface: each method the engine's own call of the
//! same name, on its one stream.

use super::engine::{HipEngine, HipMemory};
use crate::backend::device::engine::{
    own, own_mut, DeviceEngine, EngineId, EngineMemory, KernelArgs, LaunchConfig,
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

    unsafe fn write(
        &self,
        dst: &mut dyn EngineMemory,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: the caller's contract.
        unsafe { HipEngine::write(self, own::<HipMemory>(self.id(), dst)?, src.cast(), bytes) }
    }

    unsafe fn read(
        &self,
        src: &dyn EngineMemory,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: the caller's contract.
        unsafe { HipEngine::read(self, own::<HipMemory>(self.id(), src)?, dst.cast(), bytes) }
    }

    fn zero(&self, memory: &mut dyn EngineMemory) -> Result<(), DeviceError> {
        HipEngine::zero(self, own_mut::<HipMemory>(self.id(), memory)?)
    }

    fn copy(&self, src: &dyn EngineMemory, dst: &mut dyn EngineMemory) -> Result<(), DeviceError> {
        HipEngine::copy(
            self,
            own::<HipMemory>(self.id(), src)?,
            own_mut::<HipMemory>(self.id(), dst)?,
        )
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        HipEngine::synchronize(self)
    }

    fn has_kernel(&self, name: &str) -> bool {
        HipEngine::has_kernel(self, name)
    }

    fn kernel_limits(&self, name: &str) -> KernelLimits {
        HipEngine::kernel_limits(self, name)
    }

    unsafe fn launch(
        &self,
        name: &str,
        config: LaunchConfig,
        args: &mut KernelArgs,
    ) -> Result<(), DeviceError> {
        // SAFETY: the caller's contract.
        unsafe {
            HipEngine::launch(
                self,
                name,
                config.grid_dim,
                config.block_dim,
                config.shared_mem_bytes,
                &mut args.pointers,
            )
        }
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
