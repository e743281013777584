//! The emulated device: every `kernels/*.cu` compiled for the host (build.rs) and run with
//! CUDA's execution model — a grid of blocks one after another, each GPU thread of a
//! block on its own host thread, so `__syncthreads` is a real barrier; `__shared__`
//! memory per block; dynamic shared memory of the launch's size, refused above the 48 KiB
//! a kernel gets without opting in; atomics. Arguments travel as the driver takes them,
//! one pointer per parameter, read with the kernel's own parameter types.
//!
//! What it checks: the kernel exists, the launch passes as many arguments as the kernel
//! has parameters, the grid and block are valid, the block has no more threads than the
//! kernel's `__launch_bounds__`, and every live thread of a block reaches each barrier. What it does not model: timing, warps' lock-step execution, the memory
//! model beyond barriers, and the device's own intrinsics (headers take their host paths,
//! the ones the host parity tests check).

use super::device::LaunchConfig;
use std::ffi::{c_char, c_int, c_long, c_void, CString};
use std::sync::OnceLock;

type LaunchFn = unsafe extern "C" fn(
    *const c_char,
    *const u32,
    *const u32,
    usize,
    *mut *mut c_void,
    usize,
    *mut c_char,
    usize,
) -> c_int;
type ParamsFn = unsafe extern "C" fn(*const c_char, *mut usize, usize) -> c_long;
type MaxThreadsFn = unsafe extern "C" fn(*const c_char) -> c_long;
type CountFn = unsafe extern "C" fn() -> usize;
type NameFn = unsafe extern "C" fn(usize) -> *const c_char;
type SanitizerFn = unsafe extern "C" fn() -> *const c_char;
type SyncFn = unsafe extern "C" fn(*mut c_void);
type CopyFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize);
type ZeroFn = unsafe extern "C" fn(*mut c_void, usize);

// The plain build, linked in (build.rs).
extern "C" {
    fn emu_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        shared_bytes: usize,
        args: *mut *mut c_void,
        nargs: usize,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn emu_kernel_params(name: *const c_char, sizes: *mut usize, cap: usize) -> c_long;
    fn emu_kernel_max_threads(name: *const c_char) -> c_long;
    fn emu_kernel_count() -> usize;
    fn emu_kernel_name(i: usize) -> *const c_char;
    fn emu_sanitizer() -> *const c_char;
    fn emu_sync_release(addr: *mut c_void);
    fn emu_sync_acquire(addr: *mut c_void);
    fn emu_copy(to: *mut c_void, from: *const c_void, bytes: usize);
    fn emu_zero(at: *mut c_void, bytes: usize);
}

/// The emulated device's entry points: the plain build linked in, or the build under a
/// checker that `GPU_OPS_EMU_SANITIZE` names, loaded from the shared library build.rs
/// made when `GPU_OPS_EMU_SANITIZERS` listed it. Choosing at run time lets CI's checked
/// runs reuse the one build of the crate and its tests.
struct Runtime {
    launch: LaunchFn,
    params: ParamsFn,
    max_threads: MaxThreadsFn,
    count: CountFn,
    name: NameFn,
    sanitizer: SanitizerFn,
    sync_release: SyncFn,
    sync_acquire: SyncFn,
    copy: CopyFn,
    zero: ZeroFn,
    /// Kept open for the process's life: the entry points point into it.
    _library: Option<libloading::Library>,
}

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let wanted = std::env::var("GPU_OPS_EMU_SANITIZE").unwrap_or_default();
        match wanted.as_str() {
            "" | "none" => Runtime {
                launch: emu_launch,
                params: emu_kernel_params,
                max_threads: emu_kernel_max_threads,
                count: emu_kernel_count,
                name: emu_kernel_name,
                sanitizer: emu_sanitizer,
                sync_release: emu_sync_release,
                sync_acquire: emu_sync_acquire,
                copy: emu_copy,
                zero: emu_zero,
                _library: None,
            },
            "address" | "thread" => checked_runtime(&wanted).unwrap_or_else(|why| {
                // Only tests and CI set this variable; running them unchecked instead
                // would pass while checking nothing.
                panic!("GPU_OPS_EMU_SANITIZE={wanted}: {why}")
            }),
            other => panic!("GPU_OPS_EMU_SANITIZE={other}: use address, thread or none"),
        }
    })
}

fn checked_runtime(sanitizer: &str) -> Result<Runtime, String> {
    let path = std::path::Path::new(env!("GPU_OPS_EMU_LIBRARY_DIR"))
        .join(format!("libgpu_ops_emu_{sanitizer}.so"));
    // SAFETY: the library is our own emulated device, built by build.rs; its
    // initialisers only set up static tables.
    let library = unsafe { libloading::Library::new(&path) }.map_err(|e| {
        format!(
            "cannot load {}: {e}; build with GPU_OPS_EMU_SANITIZERS={sanitizer} and preload \
             the checker's runtime (docs/GPU.md, \"The checkers\")",
            path.display()
        )
    })?;
    Ok(Runtime {
        launch: entry_point(&library, &path, "emu_launch")?,
        params: entry_point(&library, &path, "emu_kernel_params")?,
        max_threads: entry_point(&library, &path, "emu_kernel_max_threads")?,
        count: entry_point(&library, &path, "emu_kernel_count")?,
        name: entry_point(&library, &path, "emu_kernel_name")?,
        sanitizer: entry_point(&library, &path, "emu_sanitizer")?,
        sync_release: entry_point(&library, &path, "emu_sync_release")?,
        sync_acquire: entry_point(&library, &path, "emu_sync_acquire")?,
        copy: entry_point(&library, &path, "emu_copy")?,
        zero: entry_point(&library, &path, "emu_zero")?,
        _library: Some(library),
    })
}

/// The function `name` of the checked library, as the `F` its caller declares.
fn entry_point<F: Copy>(
    library: &libloading::Library,
    path: &std::path::Path,
    name: &str,
) -> Result<F, String> {
    // SAFETY: the caller's `F` is the C signature `name` has in kernels/emu/runtime.cpp;
    // the library outlives the pointer (kept open in `Runtime`).
    unsafe { library.get::<F>(name.as_bytes()) }
        .map(|f| *f)
        .map_err(|e| format!("{}: {name}: {e}", path.display()))
}

/// The checker the emulated device runs under (`GPU_OPS_EMU_SANITIZE`): "address",
/// "thread" or "none".
pub fn sanitizer() -> &'static str {
    // SAFETY: emu_sanitizer returns a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr((runtime().sanitizer)()) }
        .to_str()
        .unwrap_or("none")
}

/// Tells ThreadSanitizer (in its checked build; a no-op otherwise) that what this thread
/// did so far happens before what any thread does after `sync_acquire(addr)`: the order
/// the streams' queues make with Rust's futex-based locks, which it cannot see.
pub(super) fn sync_release<T>(addr: &T) {
    // SAFETY: the function only reads the address as a key.
    unsafe { (runtime().sync_release)(addr as *const T as *mut c_void) }
}

/// The other half of `sync_release`.
pub(super) fn sync_acquire<T>(addr: &T) {
    // SAFETY: as above.
    unsafe { (runtime().sync_acquire)(addr as *const T as *mut c_void) }
}

/// Copies `bytes` bytes from `from` to `to` in the emulated device's library, where the
/// checkers see the copy: a stream's copy that overlaps a kernel of another stream is a
/// race ThreadSanitizer reports. The streams' copies are made with it (public for the
/// race checker's test).
///
/// # Safety
/// Both ranges hold `bytes` bytes and do not overlap.
pub unsafe fn copy_bytes(to: *mut u8, from: *const u8, bytes: usize) {
    // SAFETY: the caller's contract.
    unsafe { (runtime().copy)(to.cast(), from.cast(), bytes) }
}

/// Zeroes `bytes` bytes at `at`, where the checkers see it (as `copy_bytes`).
///
/// # Safety
/// The range holds `bytes` bytes.
pub(super) unsafe fn zero_bytes(at: *mut u8, bytes: usize) {
    // SAFETY: the caller's contract.
    unsafe { (runtime().zero)(at.cast(), bytes) }
}

/// Why an emulated launch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LaunchError {
    pub kind: LaunchErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchErrorKind {
    UnknownKernel,
    ArgumentCount,
    InvalidLaunch,
    /// A `__syncthreads()` that not every live thread of a block reached.
    BarrierDivergence,
    /// A block of more threads than the kernel's `__launch_bounds__`, which a device
    /// refuses too.
    AboveLaunchBounds,
    /// A warp collective (`mma.sync`, a shuffle) that not every live lane of a warp
    /// reached, or lanes of one warp at different ones.
    WarpDivergence,
}

/// The byte size of each parameter of kernel `name`, or None when no module defines it.
pub fn kernel_params(name: &str) -> Option<Vec<usize>> {
    let name = CString::new(name).ok()?;
    let mut sizes = [0usize; 64];
    // SAFETY: `sizes` has room for `cap` entries; `name` is NUL-terminated.
    let n = unsafe { (runtime().params)(name.as_ptr(), sizes.as_mut_ptr(), sizes.len()) };
    (n >= 0).then(|| sizes[..(n as usize).min(sizes.len())].to_vec())
}

/// The most threads a block of kernel `name` may have: the first argument of its
/// `__launch_bounds__` (build.rs fails a kernel without one). None when no module defines
/// it.
pub fn kernel_max_threads(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    // SAFETY: `name` is NUL-terminated.
    let n = unsafe { (runtime().max_threads)(name.as_ptr()) };
    u32::try_from(n).ok()
}

/// Every kernel the emulated device runs, by name, sorted: the shipped modules'
/// (`kernels/*.cu`) and its own check kernels (`kernels/emu/*.cu`, named `emu_check_*`).
pub fn kernel_names() -> Vec<String> {
    // SAFETY: emu_kernel_count reads the static table.
    let count = unsafe { (runtime().count)() };
    let mut names: Vec<String> = (0..count)
        .filter_map(|i| {
            // SAFETY: i is below the count, so the name is a static NUL-terminated string.
            let name = unsafe { (runtime().name)(i) };
            (!name.is_null()).then(|| {
                // SAFETY: as above.
                unsafe { std::ffi::CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned()
            })
        })
        .collect();
    names.sort();
    names
}

/// Runs kernel `name` on the emulated device and returns when every block has finished.
///
/// # Safety
/// `args` must hold one pointer per kernel parameter, each to a value of the parameter's
/// type, and every device pointer among them must point to host memory large enough for
/// what the kernel reads and writes — as for `cuLaunchKernel`.
pub unsafe fn launch(
    name: &str,
    cfg: LaunchConfig,
    args: &mut [*mut c_void],
) -> Result<(), LaunchError> {
    let cname = CString::new(name).map_err(|_| LaunchError {
        kind: LaunchErrorKind::UnknownKernel,
        message: format!("{name:?} is not a kernel name"),
    })?;
    let grid = [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2];
    let block = [cfg.block_dim.0, cfg.block_dim.1, cfg.block_dim.2];
    let mut err = [0 as c_char; 512];
    // SAFETY: the caller's contract covers `args`; the other pointers are valid locals.
    let rc = unsafe {
        (runtime().launch)(
            cname.as_ptr(),
            grid.as_ptr(),
            block.as_ptr(),
            cfg.shared_mem_bytes as usize,
            args.as_mut_ptr(),
            args.len(),
            err.as_mut_ptr(),
            err.len(),
        )
    };
    let kind = match rc {
        0 => return Ok(()),
        1 => LaunchErrorKind::UnknownKernel,
        2 => LaunchErrorKind::ArgumentCount,
        4 => LaunchErrorKind::BarrierDivergence,
        6 => LaunchErrorKind::WarpDivergence,
        5 => LaunchErrorKind::AboveLaunchBounds,
        _ => LaunchErrorKind::InvalidLaunch,
    };
    // SAFETY: emu_launch wrote a NUL-terminated message into `err`.
    let message = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Err(LaunchError { kind, message })
}

mod engine;
mod memory;
mod order;
mod pinned;
mod queue;
#[cfg(test)]
mod tests;
pub use engine::{EmulatedEngine, Fault};
pub use memory::HostMemory;
