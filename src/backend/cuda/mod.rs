//! CUDA through cudarc with dynamic loading: the binary runs where no CUDA is
//! installed, and every driver or NVRTC call is preceded by a presence check, because
//! cudarc panics when the library is missing.

pub mod kernels;

use cudarc::driver::{
    result::DriverError, sys, CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig,
};
use serde::Serialize;
use std::any::Any;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// One GPU: its context, a stream, the loaded kernels, and its health.
pub struct CudaDevice {
    pub info: GpuInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<String, CudaFunction>,
    healthy: AtomicBool,
    /// One job at a time per device; the stream orders its work.
    busy: Mutex<()>,
    /// `--gpu-memory-limit-mib` in bytes; 0: half the memory free when a job starts.
    memory_limit: AtomicU64,
    /// Constant tables (NTT twiddles, scale factors) kept on the device between jobs.
    tables: Mutex<TableCache>,
}

/// Device-resident constant tables by key, least recently used first out once their
/// bytes pass the cap. Values are `Arc<CudaSlice<T>>` behind `Any`.
struct TableCache {
    cap_bytes: usize,
    bytes: usize,
    tick: u64,
    entries: HashMap<String, (Arc<dyn Any + Send + Sync>, usize, u64)>,
}

impl TableCache {
    fn get(&mut self, key: &str) -> Option<Arc<dyn Any + Send + Sync>> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|e| {
            e.2 = tick;
            e.0.clone()
        })
    }

    fn insert(&mut self, key: String, value: Arc<dyn Any + Send + Sync>, bytes: usize) {
        if let Some((_, old, _)) = self.entries.remove(&key) {
            self.bytes -= old;
        }
        if bytes > self.cap_bytes {
            return;
        }
        while self.bytes + bytes > self.cap_bytes {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.2)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((_, b, _)) = self.entries.remove(&oldest) {
                self.bytes -= b;
            }
        }
        self.tick += 1;
        self.bytes += bytes;
        self.entries.insert(key, (value, bytes, self.tick));
    }
}

/// Held while a job uses the device.
pub struct DeviceLease<'a> {
    pub device: &'a CudaDevice,
    _guard: MutexGuard<'a, ()>,
}

impl CudaDevice {
    /// Opens device `ordinal`, compiles (or loads cached) the library's kernels for its
    /// architecture.
    pub fn open(
        ordinal: usize,
        cache_dir: &Path,
        library: &kernels::KernelLibrary,
    ) -> Result<Self, String> {
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| format!("device {ordinal}: cannot create a context: {e}"))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| e.to_string())?;
        let arch = format!("compute_{major}{minor}");
        let mut functions = HashMap::new();
        for module_def in &library.modules {
            let module_name = module_def.name;
            let source = library.expand(module_def.source);
            let ptx = kernels::compile_cached(module_name, &source, &arch, cache_dir)?;
            let module = ctx
                .load_module(ptx)
                .map_err(|e| format!("device {ordinal}: loading {module_name}: {e}"))?;
            for name in &module_def.entry_points {
                let f = module
                    .load_function(name)
                    .map_err(|e| format!("device {ordinal}: kernel {name}: {e}"))?;
                functions.insert(name.clone(), f);
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
            memory_limit: AtomicU64::new(0),
            tables: Mutex::new(TableCache {
                cap_bytes: TABLE_CACHE_BYTES,
                bytes: 0,
                tick: 0,
                entries: HashMap::new(),
            }),
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

    /// The most device memory one job may use (`--gpu-memory-limit-mib`, 0 for half of
    /// the memory free when the job starts).
    pub fn set_memory_limit(&self, bytes: u64) {
        self.memory_limit.store(bytes, Ordering::Relaxed);
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
    pub fn cached_table<T: Send + Sync + 'static>(
        &self,
        key: &str,
        make: impl FnOnce() -> Result<CudaSlice<T>, DeviceError>,
    ) -> Result<Arc<CudaSlice<T>>, DeviceError> {
        let found = self
            .device
            .tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key);
        if let Some(t) = found.and_then(|t| t.downcast::<CudaSlice<T>>().ok()) {
            return Ok(t);
        }
        let table = Arc::new(make()?);
        let bytes = table.len() * std::mem::size_of::<T>();
        self.device
            .tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), table.clone(), bytes);
        Ok(table)
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
pub fn discover(
    selection: &DeviceSelection,
    cache_dir: &Path,
    library: &kernels::KernelLibrary,
) -> (Vec<Arc<CudaDevice>>, String) {
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
        match CudaDevice::open(ordinal, cache_dir, library) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(cap_bytes: usize) -> TableCache {
        TableCache {
            cap_bytes,
            bytes: 0,
            tick: 0,
            entries: HashMap::new(),
        }
    }

    fn value(v: u32) -> Arc<dyn Any + Send + Sync> {
        Arc::new(v)
    }

    #[test]
    fn table_cache_evicts_the_least_recently_used_and_keeps_its_byte_count() {
        let mut c = cache(100);
        c.insert("a".into(), value(1), 40);
        c.insert("b".into(), value(2), 40);
        assert!(c.get("a").is_some()); // b is now the oldest
        c.insert("c".into(), value(3), 40);
        assert!(c.get("b").is_none());
        assert_eq!(
            c.get("a").and_then(|v| v.downcast::<u32>().ok()).as_deref(),
            Some(&1)
        );
        assert!(c.get("c").is_some());
        assert_eq!(c.bytes, 80);
        // Replacing a key does not count it twice; an oversized table is not kept.
        c.insert("c".into(), value(4), 50);
        assert_eq!(c.bytes, 90);
        c.insert("huge".into(), value(5), 101);
        assert!(c.get("huge").is_none());
        assert_eq!(c.bytes, 90);
    }
}
