//! AMD devices found and opened: the runtime initialised, each device's architecture
//! read, every kernel module compiled for it by hipRTC and loaded (`engine::HipEngine`).
//! Discovery looks here when no CUDA device is usable (`App::start`).
//!
//! hipRTC runs LLVM in the process that calls it, and LLVM aborts that process on some
//! internal errors rather than returning one (ROCm 5.2's did so on a u128 division). So
//! the server never compiles in its own process: each module is compiled by a child,
//! `gpu-ops hip-compile` (this same binary), whose crash is one module's error. Code
//! objects are cached in the kernel cache as the CUDA path caches cubins, keyed by the
//! expanded source, the options, the architecture and hipRTC's version: only the first
//! start on a host compiles (about 35 s for every module, serially, on the development
//! VM, 2026-11-29).

use super::engine::{Api, HipEngine};
use super::{libraries, rtc, Loaded};
use crate::backend::cuda::kernels::{source_key, write_atomically, KernelLibrary, KernelModule};
use crate::backend::cuda::DeviceSelection;
use crate::backend::device::ModuleLoad;
use crate::backend::device::{GpuDevice, GpuInfo, GpuVendor};
use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest one module's compile may take in its child process.
const COMPILE_TIMEOUT: Duration = Duration::from_secs(600);

/// Where code objects are cached, and the binary whose `hip-compile` makes them.
#[derive(Clone, Debug)]
pub struct Compiler {
    pub cache_dir: PathBuf,
    /// `gpu-ops` itself (`std::env::current_exe`), in the server and `gpu-ops check`.
    pub exe: PathBuf,
}

impl Compiler {
    /// The kernel cache under `data_dir`, compiled by this process's own binary.
    pub fn for_this_binary(cache_dir: PathBuf) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("no path to this binary: {e}"))?;
        Ok(Compiler { cache_dir, exe })
    }
}

/// `discover`, with a panic in the runtime's bindings turned into no devices and the
/// reason, never a discovery that does not end.
pub fn discover_guarded(
    selection: &DeviceSelection,
    library: &KernelLibrary,
    compiler: &Compiler,
) -> (Vec<Arc<GpuDevice>>, String) {
    crate::backend::guarded("HIP device discovery", || {
        Ok(discover(selection, library, compiler))
    })
    .unwrap_or_else(|why| (Vec::new(), format!("{why}; using the CPU")))
}

/// Every AMD device of `selection` (`--devices`) that opens, and why there are none (or
/// which were skipped). The runtime is first probed on a thread of its own, bounded
/// (`hip::status`): a runtime that hangs in hipInit (a broken kernel driver) costs
/// discovery ten seconds, never readiness.
pub fn discover(
    selection: &DeviceSelection,
    library: &KernelLibrary,
    compiler: &Compiler,
) -> (Vec<Arc<GpuDevice>>, String) {
    let status = super::status(Duration::from_secs(10));
    let count = status.devices as usize;
    if count == 0 {
        return (Vec::new(), status.reason);
    }
    let ordinals = selection.ordinals(count);
    let mut devices = Vec::new();
    let mut problems = Vec::new();
    for ordinal in ordinals {
        if ordinal >= count {
            problems.push(format!(
                "AMD device {ordinal} does not exist ({count} present)"
            ));
            continue;
        }
        match open_device(ordinal, library, compiler) {
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

/// Resets AMD device `ordinal` (a re-probe's fresh start; `Api::reset_device`).
pub fn reset_device(ordinal: usize) -> Result<(), String> {
    let libs = libraries().map_err(str::to_string)?;
    Api::load(&libs.runtime)?.reset_device(ordinal)
}

/// Opens AMD device `ordinal`: its architecture, the library's modules compiled for it
/// (or read from the cache) and loaded.
pub fn open_device(
    ordinal: usize,
    library: &KernelLibrary,
    compiler: &Compiler,
) -> Result<GpuDevice, String> {
    let libs = libraries().map_err(str::to_string)?;
    let api = Api::load(&libs.runtime)?;
    let arch = device_arch(&libs.runtime, ordinal as c_int)
        .map_err(|e| format!("AMD device {ordinal}: {e}"))?;
    let mut modules = Vec::new();
    let mut cache = Vec::new();
    for m in library.amd_modules() {
        let started = Instant::now();
        let (code, hit) = code_object(library, m, &arch, compiler)
            .map_err(|e| format!("AMD device {ordinal}: {e}"))?;
        cache.push(if hit { "hit" } else { "miss" });
        modules.push((
            m.name,
            code,
            &m.entry_points[..],
            started.elapsed().as_secs_f64(),
        ));
    }
    let mut opened = HipEngine::open(api, ordinal, modules)?;
    for (load, cache) in opened.engine.module_loads.iter_mut().zip(cache) {
        *load = ModuleLoad {
            cache,
            ..load.clone()
        };
    }
    let info = GpuInfo {
        ordinal,
        vendor: GpuVendor::Amd,
        name: opened.name,
        uuid: format!("HIP-{}", opened.pci_bus_id),
        compute_capability: arch.clone(),
        sm_count: opened.compute_units,
        memory_total_bytes: opened.memory_total,
        cuda_version: String::new(),
        nvrtc_version: String::new(),
        hiprtc_version: rtc::hiprtc_version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_default(),
        kernel_arch: arch,
        emulated: false,
        adapter: None,
    };
    Ok(GpuDevice::new(info, Box::new(opened.engine)))
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

/// Module `m`'s code object for `arch`: from the cache, or compiled by a child process
/// (`gpu-ops hip-compile`) and cached; and whether it was a cache hit.
pub fn code_object(
    library: &KernelLibrary,
    m: &KernelModule,
    arch: &str,
    compiler: &Compiler,
) -> Result<(Vec<u8>, bool), String> {
    let (major, minor) = rtc::hiprtc_version().unwrap_or((0, 0));
    let key = source_key(&library.expand(m.source), &m.options());
    let path = compiler.cache_dir.join(format!(
        "{}-{key}-{arch}-hiprtc{major}.{minor}.hsaco",
        m.name
    ));
    if let Ok(bytes) = std::fs::read(&path) {
        return Ok((bytes, true));
    }
    let out = path.with_extension(format!("{}.out", std::process::id()));
    std::fs::create_dir_all(&compiler.cache_dir)
        .map_err(|e| format!("{}: {e}", compiler.cache_dir.display()))?;
    let compiled = compile_in_child(&compiler.exe, m.name, arch, &out);
    let bytes = compiled
        .and_then(|()| std::fs::read(&out).map_err(|e| format!("reading {}: {e}", out.display())));
    let _ = std::fs::remove_file(&out);
    let bytes = bytes.map_err(|e| format!("compiling {} for {arch}: {e}", m.name))?;
    write_atomically(&compiler.cache_dir, &path, &bytes);
    Ok((bytes, false))
}

/// Runs `exe hip-compile` for one module, bounded by `COMPILE_TIMEOUT`: its exit status
/// and last words as the error when it fails, a crash included.
fn compile_in_child(exe: &Path, module: &str, arch: &str, out: &Path) -> Result<(), String> {
    let mut child = std::process::Command::new(exe)
        .args(["hip-compile", "--module", module, "--arch", arch, "--out"])
        .arg(out)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {} hip-compile: {e}", exe.display()))?;
    // Read as it comes, so a long log cannot fill the pipe and stall the child.
    let stderr = child.stderr.take();
    let said = std::thread::spawn(move || {
        let mut said = String::new();
        if let Some(mut err) = stderr {
            use std::io::Read;
            let _ = err.read_to_string(&mut said);
        }
        said
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) => break status,
            None if started.elapsed() > COMPILE_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "hipRTC took over {} s; stopped",
                    COMPILE_TIMEOUT.as_secs()
                ));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    if status.success() {
        return Ok(());
    }
    let said = said.join().unwrap_or_default();
    let said = said.trim();
    // Its last 2,000 characters: where a compile log says what failed.
    let from = said.char_indices().rev().nth(2000).map_or(0, |(i, _)| i);
    Err(format!(
        "the compiler process ended with {status}: {}",
        &said[from..]
    ))
}

/// `gpu-ops hip-compile`: module `name` of `library` compiled for `arch` by hipRTC in
/// this process, its code object written to `out`.
pub fn compile_to_file(
    library: &KernelLibrary,
    name: &str,
    arch: &str,
    out: &Path,
) -> Result<(), String> {
    let m = library
        .amd_modules()
        .find(|m| m.name == name)
        .ok_or_else(|| format!("no kernel module named {name}"))?;
    let code = rtc::compile(&library.expand(m.source), arch, &m.options())?;
    std::fs::write(out, code).map_err(|e| format!("{}: {e}", out.display()))
}
