//! Kernel sources (embedded), NVRTC compilation, and the on-disk PTX cache keyed by
//! (source hash, architecture, NVRTC version).

use cudarc::nvrtc::{self, CompileOptions, Ptx};
use sha2::{Digest, Sha256};
use std::path::Path;

/// Headers the `.cu` files include; NVRTC gets them inlined so a deployed binary needs
/// no kernel files on disk.
const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../../kernels/common.cuh")),
    ("fp.cuh", include_str!("../../../kernels/fp.cuh")),
    (
        "bn254_fr.cuh",
        include_str!("../../../kernels/bn254_fr.cuh"),
    ),
    (
        "bls12_381_fr.cuh",
        include_str!("../../../kernels/bls12_381_fr.cuh"),
    ),
    (
        "babybear.cuh",
        include_str!("../../../kernels/babybear.cuh"),
    ),
    (
        "goldilocks.cuh",
        include_str!("../../../kernels/goldilocks.cuh"),
    ),
    (
        "bn254_fq.cuh",
        include_str!("../../../kernels/bn254_fq.cuh"),
    ),
    (
        "bls12_381_fq.cuh",
        include_str!("../../../kernels/bls12_381_fq.cuh"),
    ),
    ("curve.cuh", include_str!("../../../kernels/curve.cuh")),
    ("msm.cuh", include_str!("../../../kernels/msm.cuh")),
    ("ntt.cuh", include_str!("../../../kernels/ntt.cuh")),
    (
        "dp_noise.cuh",
        include_str!("../../../kernels/dp_noise.cuh"),
    ),
    ("rf.cuh", include_str!("../../../kernels/rf.cuh")),
    (
        "rf_features.cuh",
        include_str!("../../../kernels/rf_features.cuh"),
    ),
    (
        "rf_waveform.cuh",
        include_str!("../../../kernels/rf_waveform.cuh"),
    ),
];

/// Every compilation unit: (module name, source).
pub const MODULES: &[(&str, &str)] = &[
    ("field_ops", include_str!("../../../kernels/field_ops.cu")),
    ("dp", include_str!("../../../kernels/dp.cu")),
    ("ntt", include_str!("../../../kernels/ntt.cu")),
    ("msm", include_str!("../../../kernels/msm.cu")),
    ("rf", include_str!("../../../kernels/rf.cu")),
];

/// The `extern "C"` kernels each module must provide.
pub fn kernel_names(module: &str) -> Vec<String> {
    match module {
        "field_ops" => crate::ops::zk::field_kernel_names(),
        "dp" => crate::ops::dp::KERNEL_NAMES
            .iter()
            .map(|s| s.to_string())
            .collect(),
        "ntt" => crate::ops::zk::ntt_kernel_names(),
        "msm" => crate::ops::zk::msm_kernel_names(),
        "rf" => crate::ops::rf::gpu::KERNEL_NAMES
            .iter()
            .map(|s| s.to_string())
            .collect(),
        _ => Vec::new(),
    }
}

/// The source with every `#include "x.cuh"` replaced by the header's text (once each;
/// the headers also carry include guards).
pub fn expand(source: &str) -> String {
    let mut seen = Vec::new();
    expand_into(source, &mut seen)
}

fn expand_into(source: &str, seen: &mut Vec<&'static str>) -> String {
    let mut out = String::with_capacity(source.len() * 2);
    for line in source.lines() {
        let include = line
            .trim()
            .strip_prefix("#include \"")
            .and_then(|r| r.strip_suffix('"'));
        match include.and_then(|name| HEADERS.iter().find(|(h, _)| *h == name)) {
            Some((name, text)) => {
                if !seen.contains(name) {
                    seen.push(name);
                    out.push_str(&expand_into(text, seen));
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

/// Compiles one module to PTX for a virtual architecture such as `compute_90`.
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
    nvrtc::compile_ptx_with_opts(expand(source), opts).map_err(|e| match e {
        nvrtc::CompileError::CompileError { log, .. } => {
            format!("NVRTC failed for {arch}: {}", log.to_string_lossy())
        }
        other => format!("NVRTC failed for {arch}: {other:?}"),
    })
}

/// Compiles, or loads the PTX cached by an earlier start with the same source, arch and
/// NVRTC version. A cache that cannot be written only costs a recompilation next time.
pub fn compile_cached(
    module: &str,
    source: &str,
    arch: &str,
    cache_dir: &Path,
) -> Result<Ptx, String> {
    let (major, minor) = nvrtc_version().ok_or("libnvrtc not found")?;
    let hash = Sha256::digest((expand(source) + &OPTIONS.join(" ")).as_bytes());
    let key: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let path = cache_dir.join(format!("{module}-{key}-{arch}-nvrtc{major}.{minor}.ptx"));
    if let Ok(text) = std::fs::read_to_string(&path) {
        tracing::debug!(path = %path.display(), "kernel cache hit");
        return Ok(Ptx::from_src(text));
    }
    let ptx = compile(source, arch)?;
    let tmp = path.with_extension("ptx.tmp");
    let written = std::fs::create_dir_all(cache_dir)
        .and_then(|_| std::fs::write(&tmp, ptx.to_src()))
        .and_then(|_| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "could not cache compiled kernels");
    }
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_inlines_each_header_once_and_leaves_no_includes() {
        for (module, source) in MODULES {
            let src = expand(source);
            assert!(!src.contains("#include"));
            assert_eq!(src.matches("#define GPU_OPS_COMMON_CUH").count(), 1);
            let names = kernel_names(module);
            assert!(!names.is_empty(), "{module} lists no kernels");
            for name in names {
                // Written out, or stamped by a macro: KERNEL(name, ...).
                assert!(
                    src.contains(&format!("({name},"))
                        || src.contains(&format!("({name})"))
                        || src.contains(&format!(" {name}("))
                        || src.contains(&format!(" {name},")),
                    "{name} missing from {module}"
                );
            }
        }
    }
}
