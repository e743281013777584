//! The emulated device: every `kernels/*.cu` compiled for the host (build.rs) and run with
//! CUDA's execution model — a grid of blocks one after another, each GPU thread of a
//! block on its own host thread, so `__syncthreads` is a real barrier; `__shared__`
//! memory per block; dynamic shared memory of the launch's size, refused above the 48 KiB
//! a kernel gets without opting in; atomics. Arguments travel as the driver takes them,
//! one pointer per parameter, read with the kernel's own parameter types.
//!
//! What it checks: the kernel exists, the launch passes as many arguments as the kernel
//! has parameters, the grid and block are valid, and every live thread of a block reaches
//! each barrier. What it does not model: timing, warps' lock-step execution, the memory
//! model beyond barriers, and the device's own intrinsics (headers take their host paths,
//! the ones the host parity tests check).

use cudarc::driver::LaunchConfig;
use std::ffi::{c_char, c_int, c_long, c_void, CString};

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
}

/// The byte size of each parameter of kernel `name`, or None when no module defines it.
pub fn kernel_params(name: &str) -> Option<Vec<usize>> {
    let name = CString::new(name).ok()?;
    let mut sizes = [0usize; 64];
    // SAFETY: `sizes` has room for `cap` entries; `name` is NUL-terminated.
    let n = unsafe { emu_kernel_params(name.as_ptr(), sizes.as_mut_ptr(), sizes.len()) };
    (n >= 0).then(|| sizes[..(n as usize).min(sizes.len())].to_vec())
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
        emu_launch(
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
        _ => LaunchErrorKind::InvalidLaunch,
    };
    // SAFETY: emu_launch wrote a NUL-terminated message into `err`.
    let message = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Err(LaunchError { kind, message })
}
