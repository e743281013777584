//! The fourth engine: any GPU wgpu reaches (Vulkan, Apple's Metal, DX12), its kernels
//! hand-written WGSL (docs/GPU.md, "Vulkan and Apple GPUs"). It implements
//! `DeviceEngine` like CUDA, HIP and the emulated device, so the launchers run on it
//! unchanged: a kernel is launched by the CUDA kernel's name, with the same arguments,
//! grid and block, and the WGSL kernel reads them as CUDA's does (`kernels/wgsl/`).
//!
//! An engine serves only the ops whose kernels it has (`WgslLibrary::ops`); the others
//! stay on the CPU or another device (`DeviceEngine::serves`). Adapters are looked for
//! when no CUDA or HIP device is usable; a software adapter (lavapipe, llvmpipe, WARP) is
//! opened only when the operator asks (`--wgpu-software-adapters`), and `auto` places
//! work on it only under `auto` there.

mod compile;
mod engine;
mod handles;
mod open;

pub use engine::WgpuEngine;
pub use open::{discover, reopen, AdapterFacts, SoftwareAdapters};

/// How a kernel's launch argument is read: a buffer (a storage binding, read-only or
/// written), or a scalar of so many bytes (4 or 8), packed into the launch's `params`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    Read,
    Write,
    Scalar(usize),
}

/// One WGSL kernel: a whole module with one entry point, `main`.
#[derive(Clone, Debug)]
pub struct WgslKernel {
    /// The launchers' name for it (the CUDA kernel's).
    pub name: String,
    /// The group it is reported under (`/device`'s module loads): the CUDA module's name.
    pub module: &'static str,
    /// The ops whose device paths launch it (`WgslLibrary::select` keeps it for these).
    pub ops: Vec<&'static str>,
    pub source: String,
    /// Its parameters in the launchers' order: buffer bindings 1, 2, … in that order,
    /// scalars packed into `params` after the launch geometry.
    pub params: Vec<Param>,
    /// Bytes of its `var<workgroup>` array that stand for CUDA's dynamic shared memory:
    /// the most a launch may ask (0: none).
    pub shared_bytes: u32,
}

/// What the domains give the engine: their WGSL kernels, and the ops those serve whole
/// (every kernel each op's device path launches is among them).
#[derive(Clone, Debug, Default)]
pub struct WgslLibrary {
    pub kernels: Vec<WgslKernel>,
    pub ops: Vec<&'static str>,
    /// Ops it has kernels for that the operator left off (`--wgpu-ops`): `unavailable`
    /// on an adapter, with that reason.
    pub left_off: Vec<&'static str>,
}

/// Why an op is `unavailable` on an adapter that `--wgpu-ops` kept it off.
pub const LEFT_OFF: &str = "left off the wgpu adapters by --wgpu-ops";

impl WgslLibrary {
    /// Only the ops of `wanted` (`--wgpu-ops`; `all`: every op) and the kernels they
    /// launch: an adapter then compiles no kernel of the ops left off (the MSM's take a
    /// minute on a CPU driver) and serves those ops nowhere. A name the library has no
    /// kernels for is an error listing the ones it has.
    pub fn select(&self, wanted: &[String]) -> Result<Self, String> {
        let wanted: Vec<&str> = wanted.iter().map(|w| w.trim()).collect();
        if wanted.contains(&"all") {
            return Ok(self.clone());
        }
        if let Some(unknown) = wanted.iter().find(|w| !self.ops.contains(w)) {
            return Err(format!(
                "--wgpu-ops: the wgpu engine has no kernels for {unknown:?}; its ops are all, {}",
                self.ops.join(", ")
            ));
        }
        let (ops, left_off) = self.ops.iter().copied().partition(|op| wanted.contains(op));
        let kernels = self
            .kernels
            .iter()
            .filter(|k| k.ops.iter().any(|op| wanted.contains(op)))
            .cloned()
            .collect();
        Ok(Self {
            kernels,
            ops,
            left_off: self.left_off.iter().copied().chain(left_off).collect(),
        })
    }
}

/// The threads of every kernel's workgroup (`@workgroup_size` in `kernels/wgsl/`): a
/// launch's block may have at most this many.
pub const BLOCK_THREADS: u32 = 256;

/// The words of every launch's `params` uniform (`kernels/wgsl/prelude.wgsl`): the grid
/// and the block (6), then the scalar arguments.
pub const PARAM_WORDS: usize = 32;

/// The storage buffers every WebGPU adapter binds in one shader stage: no kernel takes
/// more buffers (the launch's `params` is a uniform, counted apart).
pub const MAX_BUFFERS: usize = 8;
