//! CUDA through cudarc with dynamic loading: the binary runs where no CUDA is
//! installed, and every driver or NVRTC call is preceded by a presence check, because
//! cudarc panics when the library is missing.

pub mod kernels;

use cudarc::driver::{
    result::DriverError, sys, CudaContext, CudaFunction, CudaStream, LaunchConfig,
};
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use utoipa::ToSchema;

/// What `/device` reports for one GPU.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub uuid: String,
    /// "major.minor"
    pub compute_capability: String,
    pub sm_count: u32,
    pub memory_total_bytes: u64,
    /// Driver API version, e.g. "13.0".
    pub cuda_version: String,
    pub nvrtc_version: String,
    /// PTX target the kernels were compiled for.
    pub kernel_arch: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceErrorKind {
    /// Not enough device memory for this job; the device itself is fine.
    OutOfMemory,
    /// Anything else: the context may be unusable, so the device is taken out of service.
    Fatal,
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

    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            DeviceErrorKind::OutOfMemory => "out_of_memory",
            DeviceErrorKind::Fatal => "device_error",
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

/// One GPU: its context, a stream, the loaded kernels, and its health.
pub struct CudaDevice {
    pub info: GpuInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<String, CudaFunction>,
    healthy: AtomicBool,
    /// One job at a time per device; the stream orders its work.
    busy: Mutex<()>,
}

/// Held while a job uses the device.
pub struct DeviceLease<'a> {
    pub device: &'a CudaDevice,
    _guard: MutexGuard<'a, ()>,
}

impl CudaDevice {
    /// Opens device `ordinal`, compiles (or loads cached) kernels for its architecture.
    pub fn open(ordinal: usize, cache_dir: &Path) -> Result<Self, String> {
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| format!("device {ordinal}: cannot create a context: {e}"))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| e.to_string())?;
        let arch = format!("compute_{major}{minor}");
        let mut functions = HashMap::new();
        for (module_name, source) in kernels::MODULES {
            let ptx = kernels::compile_cached(module_name, source, &arch, cache_dir)?;
            let module = ctx
                .load_module(ptx)
                .map_err(|e| format!("device {ordinal}: loading {module_name}: {e}"))?;
            for name in kernels::kernel_names(module_name) {
                let f = module
                    .load_function(&name)
                    .map_err(|e| format!("device {ordinal}: kernel {name}: {e}"))?;
                functions.insert(name, f);
            }
        }
        let stream = ctx
            .new_stream()
            .map_err(|e| format!("device {ordinal}: cannot create a stream: {e}"))?;
        let info = GpuInfo {
            ordinal,
            name: ctx.name().unwrap_or_else(|e| format!("unknown ({e})")),
            uuid: ctx
                .uuid()
                .map(|u| format_uuid(&u.bytes))
                .unwrap_or_default(),
            compute_capability: format!("{major}.{minor}"),
            sm_count: ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .unwrap_or(0) as u32,
            memory_total_bytes: ctx.total_mem().unwrap_or(0) as u64,
            cuda_version: driver_version().unwrap_or_default(),
            nvrtc_version: kernels::nvrtc_version()
                .map(|(a, b)| format!("{a}.{b}"))
                .unwrap_or_default(),
            kernel_arch: arch,
        };
        Ok(Self {
            info,
            ctx,
            stream,
            functions,
            healthy: AtomicBool::new(true),
            busy: Mutex::new(()),
        })
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
        self.ctx.bind_to_thread()?;
        Ok(DeviceLease {
            device: self,
            _guard: guard,
        })
    }

    /// (free, total) bytes now.
    pub fn memory(&self) -> Option<(u64, u64)> {
        self.ctx
            .mem_get_info()
            .ok()
            .map(|(f, t)| (f as u64, t as u64))
    }
}

impl DeviceLease<'_> {
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.device.stream
    }

    pub fn function(&self, name: &str) -> Result<&CudaFunction, DeviceError> {
        self.device
            .functions
            .get(name)
            .ok_or_else(|| DeviceError::fatal(format!("kernel {name} is not loaded")))
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
}

fn format_uuid(bytes: &[std::ffi::c_char; 16]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{:02x}", *b as u8)).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// Whether libcuda (the driver) can be loaded.
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

fn driver_version() -> Option<String> {
    if !driver_available() {
        return None;
    }
    let mut v = 0;
    // SAFETY: the library is present; the out-pointer is valid.
    let rc = unsafe { sys::cuDriverGetVersion(&mut v) };
    (rc == sys::CUresult::CUDA_SUCCESS).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// Which GPUs to use (`--devices`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSelection {
    All,
    Ordinals(Vec<usize>),
}

impl std::str::FromStr for DeviceSelection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("all") {
            return Ok(Self::All);
        }
        s.split(',')
            .map(|p| {
                p.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("{p:?} is not a device ordinal (use e.g. 0,1 or all)"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self::Ordinals)
    }
}

/// Finds usable GPUs and compiles kernels for them. Returns the devices and, when there
/// are none, why — the reason `auto` fell back to the CPU.
pub fn discover(selection: &DeviceSelection, cache_dir: &Path) -> (Vec<Arc<CudaDevice>>, String) {
    if !driver_available() {
        return (
            Vec::new(),
            "no NVIDIA driver (libcuda not found); using the CPU".into(),
        );
    }
    if let Err(e) = cudarc::driver::result::init() {
        return (
            Vec::new(),
            format!("the CUDA driver failed to initialise ({e}); using the CPU"),
        );
    }
    let count = match CudaContext::device_count() {
        Ok(n) if n > 0 => n as usize,
        Ok(_) => {
            return (
                Vec::new(),
                "the driver reports no CUDA devices; using the CPU".into(),
            )
        }
        Err(e) => {
            return (
                Vec::new(),
                format!("cannot count CUDA devices ({e}); using the CPU"),
            )
        }
    };
    if !kernels::nvrtc_available() {
        return (
            Vec::new(),
            "libnvrtc not found, kernels cannot be compiled; using the CPU".into(),
        );
    }
    let ordinals: Vec<usize> = match selection {
        DeviceSelection::All => (0..count).collect(),
        DeviceSelection::Ordinals(o) => o.clone(),
    };
    let mut devices = Vec::new();
    let mut problems = Vec::new();
    for ordinal in ordinals {
        if ordinal >= count {
            problems.push(format!("device {ordinal} does not exist ({count} present)"));
            continue;
        }
        match CudaDevice::open(ordinal, cache_dir) {
            Ok(d) => devices.push(Arc::new(d)),
            Err(e) => problems.push(e),
        }
    }
    let reason = if devices.is_empty() {
        format!(
            "no usable CUDA device: {}; using the CPU",
            problems.join("; ")
        )
    } else if problems.is_empty() {
        format!("{} CUDA device(s) ready", devices.len())
    } else {
        format!(
            "{} CUDA device(s) ready; skipped: {}",
            devices.len(),
            problems.join("; ")
        )
    };
    (devices, reason)
}
