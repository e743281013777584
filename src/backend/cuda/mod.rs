//! CUDA through cudarc with dynamic loading: the binary runs where no CUDA is
//! installed, and every driver or NVRTC call is preceded by a presence check, because
//! cudarc panics when the library is missing.

pub mod blaslt;
pub mod cudnn;
pub mod kernels;

use super::device::{DeviceError, Engine, GpuDevice, GpuInfo};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// A CUDA device's engine: its context, one stream, and the loaded kernels.
pub struct CudaEngine {
    ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    functions: HashMap<String, CudaFunction>,
    /// cuBLASLt on this device, where the library opened (used once its self-test
    /// passes).
    pub(crate) blaslt: Option<blaslt::BlasLt>,
    /// cuDNN on this device, where the library opened (likewise).
    pub(crate) cudnn: Option<cudnn::CudnnConv>,
}

impl CudaEngine {
    /// `len` elements of page-locked host memory (default flags, as bandwidthTest uses).
    pub(crate) fn pinned_host<T: cudarc::driver::DeviceRepr>(
        &self,
        len: usize,
    ) -> Result<cudarc::driver::PinnedHostSlice<T>, DeviceError> {
        // SAFETY: the memory is written (by a copy) before anything reads it.
        Ok(unsafe { self.ctx.alloc_pinned_with_flags::<T>(len, 0) }?)
    }

    pub(crate) fn bind_to_thread(&self) -> Result<(), DeviceError> {
        Ok(self.ctx.bind_to_thread()?)
    }

    pub(crate) fn function(&self, name: &str) -> Result<&CudaFunction, DeviceError> {
        self.functions
            .get(name)
            .ok_or_else(|| DeviceError::fatal(format!("kernel {name} is not loaded")))
    }

    /// (free, total) bytes now.
    pub(crate) fn memory(&self) -> Option<(u64, u64)> {
        self.ctx
            .mem_get_info()
            .ok()
            .map(|(f, t)| (f as u64, t as u64))
    }
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
    let (major, minor) = ctx.compute_capability().map_err(|e| e.to_string())?;
    let sm = format!("sm_{major}{minor}");
    let driver = driver_version().unwrap_or_default();
    let mut arch = sm.clone();
    let mut functions = HashMap::new();
    for module_def in &library.modules {
        let module_name = module_def.name;
        let source = library.expand(module_def.source);
        // A cubin for this exact architecture (cached: a warm start JITs nothing); PTX,
        // JIT-compiled by the driver, only if that fails.
        let cubin =
            kernels::cubin_cached(module_name, &source, &sm, &driver, cache_dir).and_then(|bin| {
                ctx.load_module(Ptx::from_binary(bin))
                    .map_err(|e| e.to_string())
            });
        let module = match cubin {
            Ok(m) => m,
            Err(why) => {
                tracing::warn!(device = ordinal, module = module_name, reason = %why, "no cubin; loading PTX");
                arch = format!("compute_{major}{minor}");
                let ptx = kernels::compile_cached(module_name, &source, &arch, cache_dir)?;
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
        emulated: false,
    };
    let mut engine = CudaEngine {
        ctx,
        stream,
        functions,
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
    Ok(GpuDevice::new(info, Engine::Cuda(engine)))
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
