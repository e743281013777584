//! The check's first phase: which CUDA libraries this process can load, their versions,
//! and the file each was loaded from, or every name and folder tried when one is missing
//! (the usual first-contact failure: a library in a Python venv, off the loader's path).

use crate::backend::cuda::{self, kernels};
use serde::Serialize;

/// One library as this process sees it.
#[derive(Clone, Debug, Serialize)]
pub struct Library {
    pub name: &'static str,
    /// What it is for, in the report's words.
    pub role: &'static str,
    pub loaded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The file mapped into this process (from /proc/self/maps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// When it did not load: the file names tried, and the folders of LD_LIBRARY_PATH
    /// they were looked for in (besides the loader's cache and default folders).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tried_names: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tried_folders: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Environment {
    /// The NVIDIA driver as NVML names it ("580.65.06"), where NVML loads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The CUDA version the driver supports ("13.0").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_driver_api: Option<String>,
    pub libraries: Vec<Library>,
}

/// Loads each library the service may use (a presence check first: cudarc panics on a
/// missing one) and records what it found.
pub fn probe() -> Environment {
    let driver_loaded = cuda::driver_available();
    let libraries = vec![
        library(
            "cuda",
            "the driver API",
            driver_loaded,
            cuda::driver_api_version(),
        ),
        library(
            "nvrtc",
            "compiles our kernels",
            kernels::nvrtc_available(),
            kernels::nvrtc_version().map(|(a, b)| format!("{a}.{b}")),
        ),
        library(
            "cublasLt",
            "matmul's vendor library",
            cuda::blaslt::library_available(),
            cuda::blaslt::library_version(),
        ),
        library(
            "cudnn",
            "conv2d's vendor library",
            cuda::cudnn::library_available(),
            cuda::cudnn::library_version(),
        ),
        library(
            "nvidia-ml",
            "NVML: the device gauges",
            driver_loaded && nvml_driver().is_some(),
            nvml_driver(),
        ),
    ];
    Environment {
        driver: nvml_driver(),
        cuda_driver_api: cuda::driver_api_version(),
        libraries,
    }
}

/// The driver's version through NVML, where it loads (it needs the driver).
fn nvml_driver() -> Option<String> {
    if !cuda::driver_available() {
        return None;
    }
    nvml_wrapper::Nvml::init()
        .ok()
        .and_then(|n| n.sys_driver_version().ok())
}

fn library(
    name: &'static str,
    role: &'static str,
    loaded: bool,
    version: Option<String>,
) -> Library {
    let path = loaded.then(|| mapped_file(name)).flatten();
    let (tried_names, tried_folders) = if loaded {
        (Vec::new(), Vec::new())
    } else {
        (cudarc::get_lib_name_candidates(name), library_path())
    };
    Library {
        name,
        role,
        loaded,
        version,
        path,
        tried_names,
        tried_folders,
    }
}

/// LD_LIBRARY_PATH's folders, in order.
fn library_path() -> Vec<String> {
    std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect()
}

/// The file of `lib<name>.so…` mapped into this process, if any.
fn mapped_file(name: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    find_mapped(&maps, name)
}

fn find_mapped(maps: &str, name: &str) -> Option<String> {
    let prefix = format!("lib{name}.so");
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            path.rsplit('/')
                .next()
                .is_some_and(|file| file.starts_with(&prefix))
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_library_is_found_by_its_file_name_only() {
        let maps = "\
7f00-7f01 r-xp 00000000 08:01 12 /venv/nvidia/cu13/lib/libnvrtc-builtins.so.13.0
7f01-7f02 r-xp 00000000 08:01 13 /venv/nvidia/cu13/lib/libnvrtc.so.13
7f02-7f03 r-xp 00000000 08:01 14 /usr/lib/libcudnn_graph.so.9
7f03-7f04 rw-p 00000000 00:00 0
";
        assert_eq!(
            find_mapped(maps, "nvrtc").as_deref(),
            Some("/venv/nvidia/cu13/lib/libnvrtc.so.13")
        );
        // libcudnn_graph is not libcudnn.so.
        assert_eq!(find_mapped(maps, "cudnn"), None);
        assert_eq!(find_mapped(maps, "cuda"), None);
    }

    #[test]
    fn a_missing_library_lists_what_was_tried() {
        let lib = library("gpu-ops-no-such-library", "test", false, None);
        assert!(!lib.loaded && lib.path.is_none());
        assert!(lib
            .tried_names
            .iter()
            .any(|n| n == "libgpu-ops-no-such-library.so"));
    }
}
