//! The device interface every launcher speaks: a leased device allocates, copies in and
//! out, launches a kernel by name (grid, block, shared bytes, arguments as the driver takes
//! them), synchronises, and frees what it allocated when the buffer drops. Two engines
//! implement it: CUDA through cudarc (`backend::cuda`) and the emulated device
//! (`backend::emulated`), which runs the same `kernels/*.cu` compiled for the host. So
//! every launcher, pass and cache runs in CI without a GPU, exactly as it would on one.

mod buffer;
mod launch;
mod tables;

pub use buffer::{DeviceBuffer, Element};
pub use launch::Launch;

use super::cuda::CudaEngine;
use super::emulated::EmulatedEngine;
use cudarc::driver::{result::DriverError, sys, LaunchConfig};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tables::TableCache;
use utoipa::ToSchema;

/// What `/device` reports for one device.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub uuid: String,
    /// "major.minor"; "emulated" for the emulated device.
    pub compute_capability: String,
    pub sm_count: u32,
    pub memory_total_bytes: u64,
    /// Driver API version, e.g. "13.0"; empty for the emulated device.
    pub cuda_version: String,
    pub nvrtc_version: String,
    /// PTX target the kernels were compiled for; "host" for the emulated device.
    pub kernel_arch: String,
    /// True for the emulated device (`--emulate-device`): the kernels run on the CPU
    /// under CUDA's execution model, for testing; nothing about its speed means anything.
    pub emulated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceErrorKind {
    /// Not enough device memory for this job; the device itself is fine.
    OutOfMemory,
    /// Anything else: the context may be unusable, so the device is taken out of service.
    Fatal,
    /// The op has no kernel; the pool never sends it (`Job::device_refusal`).
    Unsupported,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct DeviceError {
    pub kind: DeviceErrorKind,
    pub message: String,
}

impl DeviceError {
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            kind: DeviceErrorKind::Fatal,
            message: message.into(),
        }
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self {
            kind: DeviceErrorKind::Unsupported,
            message: message.into(),
        }
    }

    pub fn out_of_memory(message: impl Into<String>) -> Self {
        Self {
            kind: DeviceErrorKind::OutOfMemory,
            message: message.into(),
        }
    }

    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            DeviceErrorKind::OutOfMemory => "out_of_memory",
            DeviceErrorKind::Fatal => "device_error",
            DeviceErrorKind::Unsupported => "unsupported",
        }
    }
}

impl From<DriverError> for DeviceError {
    fn from(e: DriverError) -> Self {
        let kind = if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            DeviceErrorKind::OutOfMemory
        } else {
            DeviceErrorKind::Fatal
        };
        Self {
            kind,
            message: format!("CUDA: {e}"),
        }
    }
}

/// Device memory kept for cached constant tables: the twiddles of a few large NTT
/// sizes per field (2^24 BN254 elements' twiddles are 256 MiB).
const TABLE_CACHE_BYTES: usize = 512 << 20;

/// What runs a device's work.
pub(crate) enum Engine {
    Cuda(CudaEngine),
    Emulated(EmulatedEngine),
}

/// One device: its engine, its health, the lock that gives it to one job at a time, and
/// the constant tables kept on it between jobs.
pub struct GpuDevice {
    pub info: GpuInfo,
    pub(crate) engine: Engine,
    healthy: AtomicBool,
    /// One job at a time per device; the stream orders its work.
    busy: Mutex<()>,
    /// `--gpu-memory-limit-mib` in bytes; 0: half the memory free when a job starts.
    memory_limit: AtomicU64,
    tables: Mutex<TableCache>,
}

/// Held while a job uses the device.
pub struct DeviceLease<'a> {
    pub device: &'a GpuDevice,
    _guard: MutexGuard<'a, ()>,
}

impl GpuDevice {
    pub(crate) fn new(info: GpuInfo, engine: Engine) -> Self {
        Self {
            info,
            engine,
            healthy: AtomicBool::new(true),
            busy: Mutex::new(()),
            memory_limit: AtomicU64::new(0),
            tables: Mutex::new(TableCache::new(TABLE_CACHE_BYTES)),
        }
    }

    /// The emulated device (`--emulate-device`, and the GPU tests without a GPU) with
    /// `memory_bytes` of pretend device memory.
    pub fn emulated(ordinal: usize, memory_bytes: u64) -> Self {
        let info = GpuInfo {
            ordinal,
            name: "emulated device (kernels compiled for the host)".into(),
            uuid: format!("EMU-{ordinal}"),
            compute_capability: "emulated".into(),
            sm_count: EmulatedEngine::SM_COUNT,
            memory_total_bytes: memory_bytes,
            cuda_version: String::new(),
            nvrtc_version: String::new(),
            kernel_arch: "host".into(),
            emulated: true,
        };
        Self::new(info, Engine::Emulated(EmulatedEngine::new(memory_bytes)))
    }

    pub fn is_emulated(&self) -> bool {
        matches!(self.engine, Engine::Emulated(_))
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn mark_unhealthy(&self, why: &str) {
        if self.healthy.swap(false, Ordering::Relaxed) {
            tracing::error!(
                device = self.info.ordinal,
                error = why,
                "GPU marked unhealthy; its work moves to the CPU"
            );
        }
    }

    /// Blocks until the device is free. Call from a blocking thread, not the runtime.
    pub fn lease(&self) -> Result<DeviceLease<'_>, DeviceError> {
        let guard = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if let Engine::Cuda(c) = &self.engine {
            c.bind_to_thread()?;
        }
        Ok(DeviceLease {
            device: self,
            _guard: guard,
        })
    }

    /// The most device memory one job may use (`--gpu-memory-limit-mib`, 0 for half of
    /// the memory free when the job starts).
    pub fn set_memory_limit(&self, bytes: u64) {
        self.memory_limit.store(bytes, Ordering::Relaxed);
    }

    /// (free, total) bytes now.
    pub fn memory(&self) -> Option<(u64, u64)> {
        match &self.engine {
            Engine::Cuda(c) => c.memory(),
            Engine::Emulated(e) => Some(e.memory()),
        }
    }
}

impl DeviceLease<'_> {
    /// Bytes this job may allocate: the configured limit, never more than is free.
    pub fn memory_budget(&self) -> usize {
        let free = self.device.memory().map_or(usize::MAX, |(f, _)| f as usize);
        match self.device.memory_limit.load(Ordering::Relaxed) as usize {
            0 => free / 2,
            limit => limit.min(free),
        }
    }

    /// How many of `items` items of `per_item` bytes fit in one pass beside `fixed`
    /// bytes, within the budget; at least one.
    pub fn items_per_pass(&self, items: usize, per_item: usize, fixed: usize) -> usize {
        let room = self.memory_budget().saturating_sub(fixed);
        (room / per_item.max(1)).clamp(1, items.max(1))
    }

    /// The cached device table under `key`, or the one `make` uploads (then cached).
    pub fn cached_table<T: Element>(
        &self,
        key: &str,
        make: impl FnOnce() -> Result<DeviceBuffer<T>, DeviceError>,
    ) -> Result<Arc<DeviceBuffer<T>>, DeviceError> {
        let found = self.tables().get(key);
        if let Some(t) = found.and_then(|t| t.downcast::<DeviceBuffer<T>>().ok()) {
            return Ok(t);
        }
        let table = Arc::new(make()?);
        let bytes = table.len() * std::mem::size_of::<T>();
        self.tables().insert(key.to_string(), table.clone(), bytes);
        Ok(table)
    }

    fn tables(&self) -> MutexGuard<'_, TableCache> {
        self.device.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A grid-stride launch over `n` items: enough blocks to fill the device, no more.
    pub fn launch_config(&self, n: usize) -> LaunchConfig {
        const THREADS: u32 = 256;
        let wanted = n.div_ceil(THREADS as usize).max(1);
        let cap = (self.device.info.sm_count.max(1) * 32) as usize;
        LaunchConfig {
            grid_dim: (wanted.min(cap) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Waits for the device's queued work (copies back are already synchronous).
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        match &self.device.engine {
            Engine::Cuda(c) => Ok(c.stream.synchronize()?),
            // Emulated launches and copies finish before they return.
            Engine::Emulated(_) => Ok(()),
        }
    }
}
