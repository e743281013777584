//! AMD GPUs through HIP (issue "AMD GPUs"): the ROCm libraries found and loaded at run
//! time, as CUDA's are, so the binary runs where no ROCm is installed; and hipRTC, which
//! compiles the same `kernels/*.cu` for an AMD architecture (`rtc`). CI compiles every
//! module for gfx90a and gfx1030 through it (tests/device/hip_compile.rs).
//!
//! `engine` allocates, copies and launches on an AMD device; `discover` opens the devices
//! when no CUDA device is usable. No AMD GPU has run this engine or these kernels yet:
//! the self-tests that gate every device gate these too (docs/GPU.md).

mod device_engine;
pub mod discover;
pub mod engine;
mod pinned;
mod rtc;
pub mod smi;

pub use rtc::{compile, hiprtc_options, hiprtc_version};

use serde::Serialize;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The HIP runtime's names: unversioned (a development install), ROCm 6 and later, ROCm 5.
const RUNTIME_NAMES: &[&str] = &["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"];
/// hipRTC's own library from ROCm 6; on ROCm 5 the runtime exports its functions.
const RTC_NAMES: &[&str] = &["libhiprtc.so", "libhiprtc.so.6"];

/// Runtime functions the start-up probe calls.
const RUNTIME_SYMBOLS: &[&str] = &["hipInit", "hipGetDeviceCount", "hipRuntimeGetVersion"];
/// hipRTC functions the compile path calls (`rtc::compile`).
const RTC_SYMBOLS: &[&str] = &[
    "hiprtcVersion",
    "hiprtcCreateProgram",
    "hiprtcCompileProgram",
    "hiprtcGetProgramLogSize",
    "hiprtcGetProgramLog",
    "hiprtcGetCodeSize",
    "hiprtcGetCode",
    "hiprtcDestroyProgram",
];

/// What `/device` reports about AMD GPUs.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HipStatus {
    /// The HIP runtime library loaded, with its version; null when none was found.
    pub runtime: Option<String>,
    /// AMD GPUs the runtime reports (0 without the runtime).
    pub devices: u32,
    /// Why no AMD GPU runs work here: a library missing or incomplete, no device, or no
    /// HIP engine in this build yet.
    #[cfg_attr(
        feature = "openapi",
        schema(
            example = "no HIP runtime (libamdhip64.so not found in /opt/rocm/lib or the loader's path): AMD GPUs are not used"
        )
    )]
    pub reason: String,
}

/// A loaded library and the path it was found at.
pub struct Loaded {
    pub path: String,
    pub library: libloading::Library,
}

/// Where the ROCm libraries are looked for before the loader's own path: `$ROCM_PATH/lib`,
/// then `/opt/rocm/lib`.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(root) = std::env::var_os("ROCM_PATH") {
        dirs.push(PathBuf::from(root).join("lib"));
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    dirs
}

/// Where libraries are looked for: these folders, then (unless a test says not to) the
/// loader's own path.
pub(crate) struct Search {
    pub dirs: Vec<PathBuf>,
    pub loader_path: bool,
}

/// The first of `names` that loads, from `search`; or what was tried.
pub(crate) fn open_first(names: &[&str], search: &Search) -> Result<Loaded, String> {
    let from_loader = names
        .iter()
        .filter(|_| search.loader_path)
        .map(PathBuf::from);
    let candidates = search
        .dirs
        .iter()
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .chain(from_loader);
    for path in candidates {
        // SAFETY: loading runs the library's initialisers; these are the vendor's ROCm
        // libraries, loaded as any HIP program loads them.
        if let Ok(library) = unsafe { libloading::Library::new(&path) } {
            return Ok(Loaded {
                path: path.display().to_string(),
                library,
            });
        }
    }
    let mut places: Vec<String> = search
        .dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    if search.loader_path {
        places.push("the loader's path".into());
    }
    Err(format!(
        "{} not found in {}",
        names.join(" or "),
        places.join(", ")
    ))
}

/// The first of `symbols` that `loaded` lacks.
pub(crate) fn missing_symbol(loaded: &Loaded, symbols: &[&str]) -> Option<String> {
    symbols.iter().find_map(|s| {
        // SAFETY: only looked up, never called through this type.
        let found = unsafe { loaded.library.get::<unsafe extern "C" fn()>(s.as_bytes()) };
        found.is_err().then(|| s.to_string())
    })
}

/// The HIP runtime and hipRTC, each with every function this build calls.
pub(crate) struct Libraries {
    pub runtime: Loaded,
    /// hipRTC's library: its own on ROCm 6 and later, the runtime's on ROCm 5 (`None`).
    pub rtc: Option<Loaded>,
}

impl Libraries {
    pub fn rtc(&self) -> &Loaded {
        self.rtc.as_ref().unwrap_or(&self.runtime)
    }
}

/// Loads the runtime and hipRTC from `runtime_names` and `rtc_names` in `dirs`: an
/// absent or incomplete library is an error that names it, never a panic.
pub(crate) fn load_from(
    runtime_names: &[&str],
    rtc_names: &[&str],
    search: &Search,
) -> Result<Libraries, String> {
    let runtime = open_first(runtime_names, search).map_err(|e| format!("no HIP runtime ({e})"))?;
    if let Some(s) = missing_symbol(&runtime, RUNTIME_SYMBOLS) {
        return Err(format!(
            "the HIP runtime at {} lacks {s}: not a HIP runtime this build can use",
            runtime.path
        ));
    }
    let rtc = match open_first(rtc_names, search) {
        Ok(rtc) => Some(rtc),
        Err(_) if missing_symbol(&runtime, RTC_SYMBOLS).is_none() => None,
        Err(e) => return Err(format!("no hipRTC ({e}, nor in {})", runtime.path)),
    };
    let libraries = Libraries { runtime, rtc };
    if let Some(s) = missing_symbol(libraries.rtc(), RTC_SYMBOLS) {
        return Err(format!(
            "hipRTC at {} lacks {s}: not a hipRTC this build can use",
            libraries.rtc().path
        ));
    }
    Ok(libraries)
}

/// The ROCm libraries of this host, loaded once.
pub(crate) fn libraries() -> Result<&'static Libraries, &'static str> {
    static LOADED: OnceLock<Result<Libraries, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let search = Search {
                dirs: search_dirs(),
                loader_path: true,
            };
            load_from(RUNTIME_NAMES, RTC_NAMES, &search)
        })
        .as_ref()
        .map_err(String::as_str)
}

/// Whether hipRTC loads here (the compile check needs no AMD GPU).
pub fn hiprtc_available() -> bool {
    libraries().is_ok()
}

type HipInit = unsafe extern "C" fn(u32) -> i32;
type HipGetDeviceCount = unsafe extern "C" fn(*mut i32) -> i32;
type HipRuntimeGetVersion = unsafe extern "C" fn(*mut i32) -> i32;

/// What this host has for AMD GPUs, for `/device`. Probes once: loads the libraries and,
/// where they load, initialises the runtime and counts its devices, on a thread of its
/// own: a runtime that hangs in hipInit (a broken kernel driver) costs discovery at most
/// `wait`, and is reported as such.
pub fn status(wait: std::time::Duration) -> HipStatus {
    static STATUS: OnceLock<HipStatus> = OnceLock::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("hip-probe".into())
        .spawn(move || {
            let _ = tx.send(STATUS.get_or_init(|| probe(libraries())).clone());
        });
    if let Err(e) = spawned {
        return not_probed(&format!("no thread to probe it on ({e})"));
    }
    rx.recv_timeout(wait).unwrap_or_else(|_| HipStatus {
        runtime: None,
        devices: 0,
        reason: format!(
            "the HIP runtime did not answer within {} s (hipInit hung?): AMD GPUs are not used",
            wait.as_secs()
        ),
    })
}

/// The status of a server that looks for no AMD GPU (`why`: the flag that says so).
pub fn not_probed(why: &str) -> HipStatus {
    HipStatus {
        runtime: None,
        devices: 0,
        reason: format!("HIP not probed: {why}"),
    }
}

fn probe(libraries: Result<&Libraries, &str>) -> HipStatus {
    let libraries = match libraries {
        Ok(l) => l,
        Err(why) => {
            return HipStatus {
                runtime: None,
                devices: 0,
                reason: format!("{why}: AMD GPUs are not used"),
            }
        }
    };
    let runtime = &libraries.runtime;
    // SAFETY: each symbol was found at load (`load_from`) and has HIP's C signature.
    let (version, init, count) = unsafe {
        let version = runtime
            .library
            .get::<HipRuntimeGetVersion>(b"hipRuntimeGetVersion")
            .map(|f| {
                let mut v = 0;
                (f(&mut v) == 0).then_some(v)
            })
            .ok()
            .flatten();
        let init = runtime
            .library
            .get::<HipInit>(b"hipInit")
            .map(|f| f(0))
            .unwrap_or(-1);
        let mut n = 0;
        let count = runtime
            .library
            .get::<HipGetDeviceCount>(b"hipGetDeviceCount")
            .map(|f| f(&mut n))
            .unwrap_or(-1);
        (version, init, (count, n.max(0) as u32))
    };
    // HIP's version is major * 10^7 + minor * 10^5 + patch.
    let version = version
        .map(|v| format!("HIP {}.{}", v / 10_000_000, v / 100_000 % 100))
        .unwrap_or_else(|| "HIP of unknown version".into());
    let runtime_name = format!("{} ({version})", runtime.path);
    // A device count means nothing from a runtime that did not initialise.
    let (count_rc, count) = count;
    let devices = if init == 0 && count_rc == 0 { count } else { 0 };
    let reason = if devices == 0 {
        format!(
            "the HIP runtime loads but reports no AMD GPU (hipInit returned {init}, hipGetDeviceCount {count_rc})"
        )
    } else {
        format!(
            "{devices} AMD GPU(s) found: the HIP engine opens them when no CUDA device is usable (see gpus); no AMD GPU has run this engine in testing yet"
        )
    };
    HipStatus {
        runtime: Some(runtime_name),
        devices,
        reason,
    }
}

#[cfg(test)]
mod tests;
