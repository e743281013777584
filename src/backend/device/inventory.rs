//! What a device says about itself for `gpu-ops check`: how each kernel module was
//! compiled and loaded, each kernel's limits against its declared launch bound, and the
//! clocks, bus and caches the driver reports.

use super::GpuDevice;
use serde::Serialize;

/// One kernel module's compile and load on a device.
#[derive(Clone, Debug, Serialize)]
pub struct ModuleLoad {
    pub module: String,
    /// Compile (or cache read) and load, in seconds; modules compile in parallel.
    pub seconds: f64,
    /// "hit" (a cached cubin), "miss" (compiled now), "ptx" (the driver JIT-compiled PTX:
    /// no cubin could be made), "host" (the emulated device's build).
    pub cache: &'static str,
}

/// One kernel's attributes against what its launchers may ask of it.
#[derive(Clone, Debug, Serialize)]
pub struct KernelLimits {
    pub kernel: String,
    /// The `__launch_bounds__` the source declares: the most threads a launch may ask.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_bound: Option<u32>,
    /// What the loaded kernel allows (CUDA: CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_threads: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registers: Option<u32>,
    /// Per-thread local memory (spills and local arrays), bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_bytes: Option<u32>,
    /// Whether every launch the bound allows can run here: bound ≤ max_threads.
    pub fits: bool,
}

impl KernelLimits {
    /// A kernel whose attributes could not be read (`launch_bound` its declared one, if
    /// known): nothing known to fit.
    pub fn unknown(kernel: &str, launch_bound: Option<u32>) -> Self {
        KernelLimits {
            kernel: kernel.to_string(),
            launch_bound,
            max_threads: None,
            registers: None,
            local_bytes: None,
            fits: false,
        }
    }
}

impl GpuDevice {
    /// Each kernel module's compile and load, in library order.
    pub fn module_loads(&self) -> Vec<ModuleLoad> {
        self.engine().module_loads()
    }

    /// Whether the engine has kernel `name` loaded.
    pub fn has_kernel(&self, name: &str) -> bool {
        self.engine().has_kernel(name)
    }

    /// The limits of each of `kernels` (the library's entry points), in that order.
    pub fn kernel_limits(&self, kernels: &[String]) -> Vec<KernelLimits> {
        let engine = self.engine();
        kernels.iter().map(|k| engine.kernel_limits(k)).collect()
    }

    /// Clocks, bus width, caches and the theoretical memory bandwidth they imply.
    pub fn facts(&self) -> serde_json::Value {
        self.engine().facts()
    }
}
