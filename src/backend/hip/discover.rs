//! AMD devices found and opened: the runtime initialised, each device's architecture
//! read, every kernel module compiled for it by hipRTC and loaded (`engine::HipEngine`).
//! Discovery looks here when no CUDA device is usable (`App::start`).
//!
//! hipRTC runs LLVM in this process, and LLVM aborts the process on some internal errors
//! rather than returning one: a module that crashes hipRTC takes the server with it at
//! start-up (the CI compile check, tests/device/hip_compile.rs, runs every module through
//! the same path for gfx90a and gfx1030 so that this is found before a host meets it).
//! Code objects are not cached yet: a start compiles every module (about 35 s serially on
//! the development VM, 2026-11-29).

use super::engine::{Api, HipEngine};
use super::{libraries, rtc, HipGetDeviceCount, HipInit, Loaded};
use crate::backend::cuda::kernels::KernelLibrary;
use crate::backend::device::{Engine, GpuDevice, GpuInfo, GpuVendor};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// `discover`, with a panic in the runtime's bindings turned into no devices and the
/// reason, never a discovery that does not end.
pub fn discover_guarded(library: &KernelLibrary) -> (Vec<Arc<GpuDevice>>, String) {
    crate::backend::guarded("HIP device discovery", || Ok(discover(library)))
        .unwrap_or_else(|why| (Vec::new(), format!("{why}; using the CPU")))
}

/// Every AMD device that opens, and why there are none (or which were skipped).
pub fn discover(library: &KernelLibrary) -> (Vec<Arc<GpuDevice>>, String) {
    let libs = match libraries() {
        Ok(l) => l,
        Err(why) => return (Vec::new(), format!("{why}: AMD GPUs are not used")),
    };
    let count = match device_count(&libs.runtime) {
        Ok(0) => return (Vec::new(), "the HIP runtime reports no AMD GPU".into()),
        Ok(n) => n,
        Err(why) => return (Vec::new(), why),
    };
    let mut devices = Vec::new();
    let mut problems = Vec::new();
    for ordinal in 0..count {
        match open_device(ordinal, library) {
            Ok(d) => devices.push(Arc::new(d)),
            Err(e) => problems.push(e),
        }
    }
    let reason = match (devices.len(), problems.is_empty()) {
        (0, _) => format!("no usable AMD device: {}", problems.join("; ")),
        (n, true) => format!("{n} AMD device(s) ready through HIP"),
        (n, false) => format!(
            "{n} AMD device(s) ready through HIP; skipped: {}",
            problems.join("; ")
        ),
    };
    (devices, reason)
}

fn device_count(runtime: &Loaded) -> Result<usize, String> {
    // SAFETY: both symbols were found at load (`load_from`) and have HIP's signatures.
    unsafe {
        let init = runtime
            .library
            .get::<HipInit>(b"hipInit")
            .map_err(|e| e.to_string())?;
        let rc = init(0);
        if rc != 0 {
            return Err(format!("hipInit returned {rc}: AMD GPUs are not used"));
        }
        let count = runtime
            .library
            .get::<HipGetDeviceCount>(b"hipGetDeviceCount")
            .map_err(|e| e.to_string())?;
        let mut n = 0;
        let rc = count(&mut n);
        if rc != 0 {
            return Err(format!(
                "hipGetDeviceCount returned {rc}: AMD GPUs are not used"
            ));
        }
        Ok(n.max(0) as usize)
    }
}

/// Opens AMD device `ordinal`: its architecture, the library's modules compiled for it
/// and loaded.
pub fn open_device(ordinal: usize, library: &KernelLibrary) -> Result<GpuDevice, String> {
    let libs = libraries().map_err(str::to_string)?;
    let api = Api::load(&libs.runtime)?;
    let arch = device_arch(&libs.runtime, ordinal as c_int)
        .map_err(|e| format!("AMD device {ordinal}: {e}"))?;
    let mut modules = Vec::new();
    for m in &library.modules {
        let started = std::time::Instant::now();
        let code = rtc::compile(&library.expand(m.source), &arch, &m.options())
            .map_err(|e| format!("AMD device {ordinal}: compiling {} for {arch}: {e}", m.name))?;
        modules.push((
            m.name,
            code,
            &m.entry_points[..],
            started.elapsed().as_secs_f64(),
        ));
    }
    let opened = HipEngine::open(api, ordinal, modules)?;
    let info = GpuInfo {
        ordinal,
        vendor: GpuVendor::Amd,
        name: opened.name,
        uuid: format!("HIP-{}", opened.pci_bus_id),
        compute_capability: arch.clone(),
        sm_count: opened.compute_units,
        memory_total_bytes: opened.memory_total,
        cuda_version: String::new(),
        nvrtc_version: rtc::hiprtc_version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_default(),
        kernel_arch: arch,
        emulated: false,
    };
    Ok(GpuDevice::new(info, Engine::Hip(opened.engine)))
}

/// The device's architecture (`gfx90a`), from `hipGetDeviceProperties`' `gcnArchName`.
/// That struct's layout differs between ROCm 5 and ROCm 6 (whose function is
/// `hipGetDevicePropertiesR0600`), so no offset is assumed: the runtime writes into a
/// zeroed buffer larger than either layout, and the name is the first NUL-terminated
/// string there that starts with "gfx".
fn device_arch(runtime: &Loaded, ordinal: c_int) -> Result<String, String> {
    type Properties = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
    let properties = ["hipGetDevicePropertiesR0600", "hipGetDeviceProperties"]
        .iter()
        // SAFETY: both names have this C signature (the struct pointer first).
        .find_map(|n| unsafe { runtime.library.get::<Properties>(n.as_bytes()) }.ok())
        .ok_or("the HIP runtime has no hipGetDeviceProperties")?;
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: the buffer is larger than any hipDeviceProp_t (about 1.5 KiB in ROCm 6).
    let rc = unsafe { properties(buf.as_mut_ptr().cast(), ordinal) };
    if rc != 0 {
        return Err(format!("hipGetDeviceProperties returned {rc}"));
    }
    arch_in(&buf).ok_or_else(|| "no gfx architecture in the device's properties".into())
}

/// The first NUL-terminated string in `bytes` that names an architecture (`gfx` and
/// letters or digits), without the target features after a colon (`gfx90a:xnack-`).
pub(crate) fn arch_in(bytes: &[u8]) -> Option<String> {
    (0..bytes.len().saturating_sub(3)).find_map(|i| {
        let starts = &bytes[i..i + 3] == b"gfx" && (i == 0 || bytes[i - 1] == 0);
        if !starts {
            return None;
        }
        let rest = &bytes[i..];
        let text = std::str::from_utf8(&rest[..rest.iter().position(|&b| b == 0)?]).ok()?;
        let name = text.split(':').next()?;
        let valid = name.len() > 3 && name[3..].bytes().all(|b| b.is_ascii_alphanumeric());
        valid.then(|| name.to_string())
    })
}
