//! CUDA through cudarc with dynamic loading: the binary runs where no CUDA is
//! installed, and every driver or NVRTC call is preceded by a presence check, because
//! cudarc panics when the library is missing.

pub mod attributes;
pub mod blaslt;
pub mod cudnn;
mod device_engine;
pub mod kernels;
mod measured;

use super::device::engine::EngineId;
use super::device::{
    DeviceError, DeviceErrorKind, GpuDevice, GpuInfo, GpuVendor, KernelLimits, ModuleLoad,
};
use cudarc::driver::{result::DriverError, sys, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// A CUDA device's engine: its context, the loaded kernels, and the vendor libraries with
/// the stream they run on (leases bring their own streams for everything else).
pub struct CudaEngine {
    /// What this context's allocations and streams carry (`DeviceEngine::owns`).
    pub(crate) id: EngineId,
    ctx: Arc<CudaContext>,
    /// cuBLASLt's and cuDNN's stream (`on_library_stream`).
    pub(crate) stream: Arc<CudaStream>,
    /// Held for each library call: one at a time (`library_lock`).
    library_calls: std::sync::Mutex<()>,
    functions: HashMap<String, CudaFunction>,
    /// Each kernel's attributes against its declared launch bound.
    limits: HashMap<String, KernelLimits>,
    /// How each kernel module was compiled and loaded (`gpu-ops check`).
    pub(crate) module_loads: Vec<ModuleLoad>,
    /// cuBLASLt on this device, where the library opened (used once its self-test
    /// passes).
    pub(crate) blaslt: Option<blaslt::BlasLt>,
    /// cuDNN on this device, where the library opened (likewise).
    pub(crate) cudnn: Option<cudnn::CudnnConv>,
}

impl CudaEngine {
    pub(crate) fn bind_to_thread(&self) -> Result<(), DeviceError> {
        Ok(self.ctx.bind_to_thread()?)
    }

    pub(crate) fn function(&self, name: &str) -> Result<&CudaFunction, DeviceError> {
        self.functions
            .get(name)
            .ok_or_else(|| DeviceError::fatal(format!("kernel {name} is not loaded")))
    }

    /// Kernel `name`'s limits, as read after load.
    pub(crate) fn kernel_limits(&self, name: &str) -> KernelLimits {
        self.limits
            .get(name)
            .cloned()
            .unwrap_or_else(|| KernelLimits::unknown(name, None))
    }

    /// Clocks, bus width and caches as the driver reports them, and the theoretical
    /// memory bandwidth they imply (2 transfers per clock × bus width).
    pub(crate) fn facts(&self) -> serde_json::Value {
        use sys::CUdevice_attribute as A;
        let get = |a| self.ctx.attribute(a).ok();
        let (mem_khz, bus_bits) = (
            get(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
            get(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
        );
        let peak_gbps = mem_khz
            .zip(bus_bits)
            .map(|(khz, bits)| 2.0 * f64::from(khz) * 1e3 * f64::from(bits) / 8.0 / 1e9);
        serde_json::json!({
            "sm_clock_mhz": get(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE).map(|k| k / 1000),
            "memory_clock_mhz": mem_khz.map(|k| k / 1000),
            "memory_bus_bits": bus_bits,
            "theoretical_memory_gbps": peak_gbps,
            "l2_bytes": get(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
            "shared_bytes_per_block_optin": get(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            "registers_per_block": get(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK),
        })
    }

    /// (free, total) bytes now.
    pub(crate) fn memory(&self) -> Option<(u64, u64)> {
        self.ctx
            .mem_get_info()
            .ok()
            .map(|(f, t)| (f as u64, t as u64))
    }
}

/// A driver error as a device error: out of memory as such (the device is fine), anything
/// else fatal (the context may be unusable).
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

/// One module's cubin for one architecture: from the cache or compiled now.
pub struct CompiledModule {
    pub module: &'static str,
    pub cubin: Result<kernels::Cubin, String>,
    pub seconds: f64,
}

/// Stack for each NVRTC compile: its optimiser recurses deeply on large unrolled
/// bodies, and a stack overflow aborts the whole process, not the thread (a BLS12-381
/// kernel once needed more than a thread's default 2 MiB, 2026-12-07). The pages are
/// touched only as far as a compile goes.
const COMPILER_STACK_BYTES: usize = 64 << 20;

/// Every module of `library` as a cubin for `sm`, compiled in parallel (NVRTC programs
/// are independent; a cold start of ten modules takes the longest one's time, not the
/// sum), cached in `cache_dir`. In library order.
pub fn cubins_for(
    library: &kernels::KernelLibrary,
    sm: &str,
    cache_dir: &Path,
) -> Vec<CompiledModule> {
    std::thread::scope(|scope| {
        let jobs: Vec<_> = library
            .modules
            .iter()
            .map(|m| {
                let source = library.expand(m.source);
                let options = m.options();
                std::thread::Builder::new()
                    .name(format!("nvrtc-{}", m.name))
                    .stack_size(COMPILER_STACK_BYTES)
                    .spawn_scoped(scope, move || {
                        let started = std::time::Instant::now();
                        let cubin = kernels::cubin_cached(m.name, &source, &options, sm, cache_dir);
                        CompiledModule {
                            module: m.name,
                            cubin,
                            seconds: started.elapsed().as_secs_f64(),
                        }
                    })
            })
            .collect();
        jobs.into_iter()
            .zip(&library.modules)
            .map(|(job, m)| {
                let failed = |why: &str| CompiledModule {
                    module: m.name,
                    cubin: Err(why.to_string()),
                    seconds: 0.0,
                };
                match job {
                    Ok(job) => job
                        .join()
                        .unwrap_or_else(|_| failed("the compiler thread panicked")),
                    Err(e) => failed(&format!("no compiler thread: {e}")),
                }
            })
            .collect()
    })
}

/// Opens device `ordinal`, compiles (or loads cached) the library's kernels for its
/// architecture.
pub fn open_device(
    ordinal: usize,
    cache_dir: &Path,
    library: &kernels::KernelLibrary,
) -> Result<GpuDevice, String> {
    let ctx = CudaContext::new(ordinal)
        .map_err(|e| format!("device {ordinal}: cannot create a context: {e}"))?;
    // Our own events order the work that crosses streams (`device_engine.rs`, checked on
    // the emulated device), so cudarc's tracking (two events per allocation, one per
    // launch argument) would only add cost and skew every timing. SAFETY: every buffer of
    // this context is used by the engine's calls alone, which order streams themselves.
    unsafe { ctx.disable_event_tracking() };
    let (major, minor) = ctx.compute_capability().map_err(|e| e.to_string())?;
    let sm = format!("sm_{major}{minor}");
    let library = &library.for_nvidia_arch(&sm);
    let mut arch = sm.clone();
    let mut functions = HashMap::new();
    let mut module_loads = Vec::new();
    for (compiled, module_def) in cubins_for(library, &sm, cache_dir)
        .into_iter()
        .zip(&library.modules)
    {
        let module_name = module_def.name;
        let started = std::time::Instant::now();
        let mut cache = if compiled.cubin.as_ref().is_ok_and(|c| c.cache_hit) {
            "hit"
        } else {
            "miss"
        };
        // A cubin for this exact architecture (cached: a warm start JITs nothing); PTX,
        // JIT-compiled by the driver, only if that fails (a driver older than NVRTC).
        let cubin = compiled.cubin.and_then(|c| {
            ctx.load_module(Ptx::from_binary(c.bytes))
                .map_err(|e| e.to_string())
        });
        let module = match cubin {
            Ok(m) => m,
            Err(why) => {
                tracing::warn!(device = ordinal, module = module_name, reason = %why, "no cubin; loading PTX");
                arch = format!("compute_{major}{minor}");
                cache = "ptx";
                let source = library.expand(module_def.source);
                let options = module_def.options();
                // On a compiler's stack, as `cubins_for` compiles: this thread's may be a
                // runtime's 2 MiB, and an overflow would abort the process.
                let ptx = std::thread::scope(|scope| {
                    std::thread::Builder::new()
                        .name(format!("nvrtc-{module_name}"))
                        .stack_size(COMPILER_STACK_BYTES)
                        .spawn_scoped(scope, || {
                            kernels::compile_cached(
                                module_name,
                                &source,
                                &options,
                                &arch,
                                cache_dir,
                            )
                        })
                        .map_err(|e| format!("a thread for NVRTC: {e}"))?
                        .join()
                        .map_err(|_| format!("NVRTC panicked compiling {module_name}"))?
                })?;
                ctx.load_module(ptx)
                    .map_err(|e| format!("device {ordinal}: loading {module_name}: {e}"))?
            }
        };
        for name in &module_def.entry_points {
            let f = module
                .load_function(name)
                .map_err(|e| format!("device {ordinal}: kernel {name}: {e}"))?;
            functions.insert(name.clone(), f);
        }
        module_loads.push(ModuleLoad {
            module: module_name.to_string(),
            seconds: compiled.seconds + started.elapsed().as_secs_f64(),
            cache,
        });
    }
    let limits = read_limits(&functions);
    let stream = ctx
        .new_stream()
        .map_err(|e| format!("device {ordinal}: cannot create a stream: {e}"))?;
    let info = GpuInfo {
        ordinal,
        vendor: GpuVendor::Nvidia,
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
        hiprtc_version: String::new(),
        kernel_arch: arch,
        emulated: false,
        adapter: None,
    };
    let mut engine = CudaEngine {
        id: EngineId::fresh(),
        ctx,
        stream,
        library_calls: Default::default(),
        functions,
        limits,
        module_loads,
        blaslt: None,
        cudnn: None,
    };
    match blaslt::BlasLt::open(&engine, major) {
        Ok(b) => engine.blaslt = Some(b),
        Err(why) => {
            tracing::warn!(device = ordinal, reason = %why, "no cuBLASLt; matmul runs on our kernel")
        }
    }
    match cudnn::CudnnConv::open(&engine) {
        Ok(c) => engine.cudnn = Some(c),
        Err(why) => {
            tracing::warn!(device = ordinal, reason = %why, "no cuDNN; conv2d runs on im2col")
        }
    }
    Ok(GpuDevice::new(info, Box::new(engine)))
}

/// Each loaded kernel's limits, read once after load: a launch above a kernel's limit is
/// refused as that job's error (`Launch::launch`), never sent to the driver to come back
/// as LAUNCH_OUT_OF_RESOURCES, which would retire the device.
fn read_limits(functions: &HashMap<String, CudaFunction>) -> HashMap<String, KernelLimits> {
    functions
        .iter()
        .map(|(name, f)| {
            let bound = crate::backend::emulated::kernel_max_threads(name);
            let limits = match attributes::read(f) {
                Ok(a) => KernelLimits {
                    kernel: name.clone(),
                    launch_bound: bound,
                    max_threads: Some(a.max_threads),
                    registers: Some(a.registers),
                    local_bytes: Some(a.local_bytes),
                    fits: bound.is_some_and(|b| b <= a.max_threads),
                },
                Err(e) => {
                    tracing::warn!(kernel = %name, error = %e, "cannot read the kernel's attributes");
                    KernelLimits::unknown(name, bound)
                }
            };
            if !limits.fits {
                tracing::warn!(kernel = %name, ?limits, "a launch within the kernel's declared bound would be refused on this device");
            }
            (name.clone(), limits)
        })
        .collect()
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

/// The CUDA version the driver supports ("13.0"), where it loads.
pub fn driver_api_version() -> Option<String> {
    driver_version()
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

/// Resets device `ordinal`'s primary context: every allocation and module in it is gone,
/// and a sticky error with them, so the next context on the ordinal starts clean.
pub fn reset_primary_context(ordinal: usize) -> Result<(), String> {
    if !driver_available() {
        return Err("no NVIDIA driver".into());
    }
    cudarc::driver::result::init().map_err(|e| e.to_string())?;
    let mut device = 0;
    // SAFETY: the driver is initialised; the out-pointer is valid.
    let rc = unsafe { sys::cuDeviceGet(&mut device, ordinal as std::ffi::c_int) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("device {ordinal}: cuDeviceGet: {rc:?}"));
    }
    // SAFETY: `device` is a valid handle from cuDeviceGet.
    let rc = unsafe { sys::cuDevicePrimaryCtxReset_v2(device) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("device {ordinal}: resetting its context: {rc:?}"));
    }
    Ok(())
}

/// `discover`, with a panic inside the driver bindings or a library's handle turned into
/// no devices and the reason (the CPU serves), never a discovery that does not end.
pub fn discover_guarded(
    selection: &DeviceSelection,
    cache_dir: &Path,
    library: &kernels::KernelLibrary,
) -> (Vec<Arc<GpuDevice>>, String) {
    super::guarded("CUDA device discovery", || {
        Ok(discover(selection, cache_dir, library))
    })
    .unwrap_or_else(|why| (Vec::new(), format!("{why}; using the CPU")))
}

/// Which GPUs to use (`--devices`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSelection {
    All,
    Ordinals(Vec<usize>),
}

impl DeviceSelection {
    /// The ordinals selected of `count` devices (those past it are the caller's to
    /// refuse by name).
    pub fn ordinals(&self, count: usize) -> Vec<usize> {
        match self {
            Self::All => (0..count).collect(),
            Self::Ordinals(o) => o.clone(),
        }
    }
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
) -> (Vec<Arc<GpuDevice>>, String) {
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
    let ordinals = selection.ordinals(count);
    let mut devices = Vec::new();
    let mut problems = Vec::new();
    for ordinal in ordinals {
        if ordinal >= count {
            problems.push(format!("device {ordinal} does not exist ({count} present)"));
            continue;
        }
        match open_device(ordinal, cache_dir, library) {
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
