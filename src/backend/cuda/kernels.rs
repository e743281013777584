//! The kernel library the domains register, NVRTC compilation, and the on-disk caches:
//! cubins for the device's exact architecture keyed by (source hash, architecture, NVRTC
//! and driver versions), PTX as the fallback. Knows no op: the modules and their entry
//! points come from `ops::kernel_library` at start-up.

use cudarc::nvrtc::{self, CompileOptions, Ptx};
use sha2::{Digest, Sha256};
use std::path::Path;

/// One compilation unit a domain registers: its source (with `#include "x.cuh"` lines
/// the library resolves) and the `extern "C"` kernels it must provide.
#[derive(Clone, Debug)]
pub struct KernelModule {
    pub name: &'static str,
    pub source: &'static str,
    pub entry_points: Vec<String>,
}

/// Every kernel module of every domain and the headers they include, handed to the
/// backend at start-up (`ops::kernel_library`). Headers are inlined, so a deployed binary
/// needs no kernel files on disk.
#[derive(Clone, Debug)]
pub struct KernelLibrary {
    pub headers: &'static [(&'static str, &'static str)],
    pub modules: Vec<KernelModule>,
}

impl KernelLibrary {
    /// `source` with every `#include "x.cuh"` replaced by the header's text (once each;
    /// the headers also carry include guards).
    pub fn expand(&self, source: &str) -> String {
        let mut seen = Vec::new();
        self.expand_into(source, &mut seen)
    }

    fn expand_into(&self, source: &str, seen: &mut Vec<&'static str>) -> String {
        let mut out = String::with_capacity(source.len() * 2);
        for line in source.lines() {
            let include = line
                .trim()
                .strip_prefix("#include \"")
                .and_then(|r| r.strip_suffix('"'));
            match include.and_then(|name| self.headers.iter().find(|(h, _)| *h == name)) {
                Some((name, text)) => {
                    if !seen.contains(name) {
                        seen.push(name);
                        out.push_str(&self.expand_into(text, seen));
                    }
                }
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }
}

/// Whether libnvrtc can be loaded. cudarc panics on first use without it, so every
/// NVRTC call is behind this check.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { nvrtc::sys::is_culib_present() }
}

pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_available() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the out-pointers are valid.
    let rc = unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (rc == nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// NVRTC options besides the architecture; part of the PTX cache key. The noise
/// samplers do exact arithmetic in 128-bit integers.
const OPTIONS: &[&str] = &["--std=c++17", "--device-int128"];

/// Compiles one module, its headers already inlined (`KernelLibrary::expand`), to PTX
/// for a virtual architecture such as `compute_90`.
pub fn compile(source: &str, arch: &str) -> Result<Ptx, String> {
    if !nvrtc_available() {
        return Err("libnvrtc not found".into());
    }
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(OPTIONS.iter().map(|o| o.to_string()));
    let opts = CompileOptions {
        options,
        ..Default::default()
    };
    nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| match e {
        nvrtc::CompileError::CompileError { log, .. } => {
            format!("NVRTC failed for {arch}: {}", log.to_string_lossy())
        }
        other => format!("NVRTC failed for {arch}: {other:?}"),
    })
}

/// Compiles one module, its headers inlined, to a cubin for a real architecture such as
/// `sm_90`: machine code the driver loads without JIT compilation, and which a driver
/// older than this NVRTC still loads (PTX from a newer NVRTC is refused by it).
pub fn compile_cubin(source: &str, sm: &str) -> Result<Vec<u8>, String> {
    use nvrtc::{result, sys};
    if !nvrtc_available() {
        return Err("libnvrtc not found".into());
    }
    let src = std::ffi::CString::new(source).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, None).map_err(|e| format!("NVRTC: {e:?}"))?;
    let mut options = vec![format!("--gpu-architecture={sm}")];
    options.extend(OPTIONS.iter().map(|o| o.to_string()));
    // SAFETY: `prog` is a live program; every call below checks its result; the buffer
    // has the size NVRTC reported.
    let out = unsafe {
        match result::compile_program(prog, &options) {
            Ok(()) => {
                let mut size = 0usize;
                let mut cubin = Vec::new();
                let rc = sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .and_then(|_| {
                        cubin = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()).result()
                    });
                rc.map(|_| cubin)
                    .map_err(|e| format!("NVRTC gave no cubin for {sm}: {e:?}"))
            }
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        std::ffi::CStr::from_ptr(l.as_ptr())
                            .to_string_lossy()
                            .into_owned()
                    })
                    .unwrap_or_default();
                Err(format!("NVRTC failed for {sm} ({e:?}): {log}"))
            }
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// Compiles, or loads the cubin cached by an earlier start with the same (expanded)
/// source, architecture, NVRTC version and driver version, so a warm start compiles and
/// JITs nothing. A cache that cannot be written only costs a recompilation next time.
pub fn cubin_cached(
    module: &str,
    source: &str,
    sm: &str,
    driver: &str,
    cache_dir: &Path,
) -> Result<Vec<u8>, String> {
    let (major, minor) = nvrtc_version().ok_or("libnvrtc not found")?;
    let path = cache_dir.join(format!(
        "{module}-{}-{sm}-nvrtc{major}.{minor}-driver{driver}.cubin",
        source_key(source)
    ));
    if let Ok(bytes) = std::fs::read(&path) {
        tracing::debug!(path = %path.display(), "cubin cache hit");
        return Ok(bytes);
    }
    let cubin = compile_cubin(source, sm)?;
    write_atomically(cache_dir, &path, &cubin);
    Ok(cubin)
}

/// The first 8 bytes of SHA-256 over the source and the options, in hex.
fn source_key(source: &str) -> String {
    let hash = Sha256::digest((source.to_string() + &OPTIONS.join(" ")).as_bytes());
    hash[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `path` through a temporary file (a reader never sees half a file);
/// a failure is logged, not fatal.
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    let written = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&tmp, bytes))
        .and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "could not cache compiled kernels");
    }
}

/// Compiles, or loads the PTX cached by an earlier start with the same (expanded) source,
/// arch and NVRTC version. A cache that cannot be written only costs a recompilation
/// next time.
pub fn compile_cached(
    module: &str,
    source: &str,
    arch: &str,
    cache_dir: &Path,
) -> Result<Ptx, String> {
    let (major, minor) = nvrtc_version().ok_or("libnvrtc not found")?;
    let path = cache_dir.join(format!(
        "{module}-{}-{arch}-nvrtc{major}.{minor}.ptx",
        source_key(source)
    ));
    if let Ok(text) = std::fs::read_to_string(&path) {
        tracing::debug!(path = %path.display(), "kernel cache hit");
        return Ok(Ptx::from_src(text));
    }
    let ptx = compile(source, arch)?;
    write_atomically(cache_dir, &path, ptx.to_src().as_bytes());
    Ok(ptx)
}
