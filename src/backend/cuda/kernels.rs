//! The kernel library the domains register, NVRTC compilation, and the on-disk caches:
//! cubins for the device's exact architecture keyed by (source and options hash,
//! architecture, NVRTC version), PTX as the fallback. Knows no op: the modules, their
//! entry points and whether their floats must match the CPU bit for bit come from
//! `ops::kernel_library` at start-up.

use cudarc::nvrtc::{self, CompileOptions, Ptx};
use sha2::{Digest, Sha256};
use std::path::Path;

/// One compilation unit a domain registers: its source (with `#include "x.cuh"` lines
/// the library resolves), the `extern "C"` kernels it must provide, and whether its float
/// arithmetic must round exactly as the CPU twins do.
#[derive(Clone, Debug)]
pub struct KernelModule {
    pub name: &'static str,
    pub source: &'static str,
    pub entry_points: Vec<String>,
    /// Its ops' results are held to the CPU twins bit for bit (`Job::agrees` by
    /// `verify::same_bits` or `exactly`), or its kernels promise bit-identical floats to
    /// the host twins: compiled with `--fmad=false`, so no `a * b + c` outside the `_rn`
    /// intrinsics becomes an FMA on the device alone (the host twins and the emulated
    /// device are built with -ffp-contract=off, so neither would see it). False where
    /// results are held to a tolerance and FMA is the speed (matmul, attention, conv2d).
    pub exact_floats: bool,
    /// Its kernels use what only NVIDIA GPUs have (tensor cores' `mma.sync`, warps of 32
    /// and their shuffles): the sources under `kernels/nvidia/`. Never compiled for AMD
    /// (hipRTC); the emulated device runs them with its warp collectives. Launchers ask
    /// `DeviceLease::has_kernel` before choosing them.
    pub nvidia_only: bool,
}

impl KernelModule {
    /// The NVRTC options this module compiles with, besides the architecture; part of the
    /// cache keys.
    pub fn options(&self) -> Vec<&'static str> {
        let mut options = OPTIONS.to_vec();
        if self.exact_floats {
            // NVRTC contracts a * b + c into one FMA by default (--fmad=true).
            options.push("--fmad=false");
        }
        options
    }
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
    /// The library an NVIDIA GPU of real architecture `sm` (`sm_90`) compiles: every
    /// module, but the NVIDIA-only ones (`mma.sync.m16n8k16`) only from sm_80 on. A
    /// device before that loads the rest, and its launchers fall back (`has_kernel`).
    pub fn for_nvidia_arch(&self, sm: &str) -> KernelLibrary {
        let version: u32 = sm
            .trim_start_matches("sm_")
            .trim_start_matches("compute_")
            .trim_end_matches(|c: char| c.is_ascii_alphabetic())
            .parse()
            .unwrap_or(0);
        KernelLibrary {
            headers: self.headers,
            modules: self
                .modules
                .iter()
                .filter(|m| !m.nvidia_only || version >= NVIDIA_ONLY_FROM)
                .cloned()
                .collect(),
        }
    }

    /// The modules AMD GPUs compile: all but the NVIDIA-only ones.
    pub fn amd_modules(&self) -> impl Iterator<Item = &KernelModule> {
        self.modules.iter().filter(|m| !m.nvidia_only)
    }

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

/// The first architecture (compute capability × 10) the NVIDIA-only modules compile for:
/// `mma.sync` at m16n8k16 with f16 and bf16 needs sm_80.
const NVIDIA_ONLY_FROM: u32 = 80;

/// NVRTC options of every module besides the architecture (`KernelModule::options` adds
/// a module's own). The noise samplers do exact arithmetic in 128-bit integers.
const OPTIONS: &[&str] = &["--std=c++17", "--device-int128"];

/// Compiles one module, its headers already inlined (`KernelLibrary::expand`), to PTX
/// for a virtual architecture such as `compute_90`, with the module's `options`.
pub fn compile(source: &str, arch: &str, options: &[&str]) -> Result<Ptx, String> {
    if !nvrtc_available() {
        return Err("libnvrtc not found".into());
    }
    let mut options: Vec<String> = options.iter().map(|o| o.to_string()).collect();
    options.insert(0, format!("--gpu-architecture={arch}"));
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
/// older than this NVRTC still loads (PTX from a newer NVRTC is refused by it). With the
/// module's `options`.
pub fn compile_cubin(source: &str, sm: &str, options: &[&str]) -> Result<Vec<u8>, String> {
    use nvrtc::{result, sys};
    if !nvrtc_available() {
        return Err("libnvrtc not found".into());
    }
    let src = std::ffi::CString::new(source).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, None).map_err(|e| format!("NVRTC: {e:?}"))?;
    let mut options: Vec<String> = options.iter().map(|o| o.to_string()).collect();
    options.insert(0, format!("--gpu-architecture={sm}"));
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

/// A module's cubin, and whether it came from the cache.
pub struct Cubin {
    pub bytes: Vec<u8>,
    pub cache_hit: bool,
}

/// Compiles, or loads the cubin cached by an earlier run with the same (expanded) source
/// and options, architecture and NVRTC version, so a warm start compiles and JITs
/// nothing; the cache may be filled on a machine without a GPU (`gpu-ops check
/// --compile-only`). A driver that cannot load it gets PTX instead (`open_device`). A
/// cache that cannot be written only costs a recompilation next time.
pub fn cubin_cached(
    module: &str,
    source: &str,
    options: &[&str],
    sm: &str,
    cache_dir: &Path,
) -> Result<Cubin, String> {
    let (major, minor) = nvrtc_version().ok_or("libnvrtc not found")?;
    let path = cache_dir.join(format!(
        "{module}-{}-{sm}-nvrtc{major}.{minor}.cubin",
        source_key(source, options)
    ));
    if let Ok(bytes) = std::fs::read(&path) {
        tracing::debug!(path = %path.display(), "cubin cache hit");
        return Ok(Cubin {
            bytes,
            cache_hit: true,
        });
    }
    let bytes = compile_cubin(source, sm, options)?;
    write_atomically(cache_dir, &path, &bytes);
    Ok(Cubin {
        bytes,
        cache_hit: false,
    })
}

/// The first 8 bytes of SHA-256 over the source and the options, in hex: a module
/// compiled with other options (`--fmad=false`) is another entry.
pub(crate) fn source_key(source: &str, options: &[&str]) -> String {
    let hash = Sha256::digest((source.to_string() + &options.join(" ")).as_bytes());
    hash[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `path` through a temporary file (a reader never sees half a file);
/// a failure is logged, not fatal.
pub(crate) fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    let written = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&tmp, bytes))
        .and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "could not cache compiled kernels");
    }
}

/// Compiles, or loads the PTX cached by an earlier start with the same (expanded) source
/// and options, arch and NVRTC version. A cache that cannot be written only costs a
/// recompilation next time.
pub fn compile_cached(
    module: &str,
    source: &str,
    options: &[&str],
    arch: &str,
    cache_dir: &Path,
) -> Result<Ptx, String> {
    let (major, minor) = nvrtc_version().ok_or("libnvrtc not found")?;
    let path = cache_dir.join(format!(
        "{module}-{}-{arch}-nvrtc{major}.{minor}.ptx",
        source_key(source, options)
    ));
    if let Ok(text) = std::fs::read_to_string(&path) {
        tracing::debug!(path = %path.display(), "kernel cache hit");
        return Ok(Ptx::from_src(text));
    }
    let ptx = compile(source, arch, options)?;
    write_atomically(cache_dir, &path, ptx.to_src().as_bytes());
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_only_modules_are_left_out_before_sm_80_and_for_amd() {
        let mut tensor = module(false);
        tensor.name = "tc";
        tensor.nvidia_only = true;
        let library = KernelLibrary {
            headers: &[],
            modules: vec![module(true), tensor],
        };
        let names = |l: KernelLibrary| l.modules.iter().map(|m| m.name).collect::<Vec<_>>();
        assert_eq!(names(library.for_nvidia_arch("sm_75")), ["m"]);
        assert_eq!(names(library.for_nvidia_arch("sm_80")), ["m", "tc"]);
        assert_eq!(names(library.for_nvidia_arch("sm_90a")), ["m", "tc"]);
        assert_eq!(names(library.for_nvidia_arch("sm_120")), ["m", "tc"]);
        assert_eq!(
            library.amd_modules().map(|m| m.name).collect::<Vec<_>>(),
            ["m"]
        );
    }

    fn module(exact_floats: bool) -> KernelModule {
        KernelModule {
            name: "m",
            source: "extern \"C\" __global__ void k() {}",
            entry_points: vec!["k".into()],
            exact_floats,
            nvidia_only: false,
        }
    }

    /// An exact module turns FMA contraction off, and that is part of its cache key, so a
    /// cubin compiled before the flag existed is never loaded for it.
    #[test]
    fn exact_floats_compile_without_fma_under_their_own_cache_key() {
        let (exact, fused) = (module(true), module(false));
        assert!(exact.options().contains(&"--fmad=false"));
        assert!(!fused.options().iter().any(|o| o.starts_with("--fmad")));
        for o in OPTIONS {
            assert!(exact.options().contains(o) && fused.options().contains(o));
        }
        let source = exact.source;
        assert_ne!(
            source_key(source, &exact.options()),
            source_key(source, &fused.options())
        );
        assert_eq!(
            source_key(source, &fused.options()),
            source_key(source, &module(false).options())
        );
    }
}
