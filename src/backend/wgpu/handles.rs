//! The wgpu engine's handles: a buffer, a stream (the device's one queue), an event (a
//! submission of it).

use crate::backend::device::engine::{EngineEvent, EngineId, EngineMemory, EngineStream};
use std::any::Any;
use std::ffi::c_void;

pub(super) struct WgpuMemory {
    pub(super) engine: EngineId,
    pub(super) buffer: wgpu::Buffer,
    pub(super) bytes: usize,
    /// What a launch's argument for this buffer points to: a number no other live
    /// buffer has (the engine finds the buffer by this slot's address).
    pub(super) slot: Box<u64>,
}

impl EngineMemory for WgpuMemory {
    fn bytes(&self) -> usize {
        self.bytes
    }

    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn address_slot(&self) -> *mut c_void {
        &*self.slot as *const u64 as *mut c_void
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

pub(super) struct WgpuStream {
    pub(super) engine: EngineId,
}

impl EngineStream for WgpuStream {
    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

pub(super) struct WgpuEvent {
    pub(super) engine: EngineId,
    /// None: nothing had been submitted, so nothing to wait for.
    pub(super) submission: Option<wgpu::SubmissionIndex>,
}

impl EngineEvent for WgpuEvent {
    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
