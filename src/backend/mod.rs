//! Devices and the two executors. Owns CUDA contexts and the CPU thread pool; knows
//! nothing about HTTP or encodings.

pub mod cpu;
pub mod cuda;
pub mod device;
pub mod emulated;
pub mod hip;
mod job;
pub mod measure;
mod nvml;
pub mod verify;
pub mod wgpu;

use crate::metrics::Metrics;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

pub use cpu::CpuExecutor;
pub use device::{
    best_rate, CopyBandwidth, DeviceBuffer, DeviceError, DeviceErrorKind, DeviceLease, Element,
    GpuDevice, GpuInfo, GpuVendor, Stop,
};
pub use job::{Batchable, Job};
pub use nvml::{driver_version as nvml_driver_version, spawn_sampler as spawn_nvml_sampler};

/// Where a job may run, as the server is configured (`--backend`) or a request asks.
/// Its schema is written by hand (`api::backend_choice`): it lists `cuda`, the name `gpu`
/// had before AMD devices had an engine, which is still accepted.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// Where the job is predicted to finish first on this host: a healthy device or the
    /// CPU, from times measured here (`pool::placement`).
    #[default]
    Auto,
    /// A GPU of any vendor (NVIDIA through CUDA, AMD through HIP, Apple, Vulkan and DX12
    /// GPUs through wgpu, or the emulated device); refused where none is usable. `cuda`
    /// is the same choice.
    #[serde(alias = "cuda")]
    #[value(alias = "cuda")]
    Gpu,
    Cpu,
}

/// The executor a job ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Cpu,
    /// An NVIDIA GPU, through CUDA.
    Cuda,
    /// An AMD GPU, through HIP.
    Hip,
    /// The emulated device: the kernels compiled for the host and run on its CPU under
    /// an emulation of CUDA's streams and blocks (CI's stand-in for a GPU, docs/GPU.md).
    Emulated,
    /// A GPU reached through wgpu (Vulkan, Apple's Metal, DX12), its kernels WGSL.
    Wgpu,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Hip => "hip",
            BackendKind::Emulated => "emulated",
            BackendKind::Wgpu => "wgpu",
        }
    }
}

/// Device failures in a row (of any kind but a dropped job) that take a device out of
/// service even when none was fatal.
pub const FAILURES_TO_RETIRE: u32 = 3;
/// The longest wait between re-probes of a retired device.
const MAX_REPROBE_BACKOFF: Duration = Duration::from_secs(600);

/// How a retired device is re-probed: its engine rebuilt (`reopen`), the self-test rerun,
/// first after `backoff`, then at doubling intervals up to `MAX_REPROBE_BACKOFF`.
#[derive(Clone)]
pub struct Probe {
    pub reopen: Reopen,
    pub tests: Arc<Vec<Box<dyn verify::SelfTest>>>,
    pub backoff: Duration,
}

/// Builds a fresh engine for a device being re-probed.
pub type Reopen = Arc<dyn Fn(&GpuDevice) -> Result<device::Engine, String> + Send + Sync>;

/// CUDA: the device's primary context reset, then a new context on the same ordinal,
/// kernels from the cache. Without the reset a sticky error (an illegal address, say)
/// outlives the re-probe: the driver hands the same broken primary context back. The old
/// engine's buffers then free into nothing when it is replaced (cudarc records those
/// errors; it does not panic). A panic in the driver bindings or a library's handle is a
/// failed re-probe, retried later, not a dead re-probe thread.
pub fn reopen_cuda(cache: std::path::PathBuf, library: cuda::kernels::KernelLibrary) -> Reopen {
    Arc::new(move |dev: &GpuDevice| {
        guarded("re-opening the device", || {
            // Page-locked buffers are freed while their context exists.
            dev.release_staging();
            cuda::reset_primary_context(dev.info.ordinal)?;
            cuda::open_device(dev.info.ordinal, &cache, &library).map(GpuDevice::into_engine)
        })
    })
}

/// HIP: the device reset (its allocations, modules and any sticky error gone, as CUDA's
/// primary context is reset), then a new engine on the same ordinal, its kernels from
/// the cache.
pub fn reopen_hip(
    compiler: hip::discover::Compiler,
    library: cuda::kernels::KernelLibrary,
) -> Reopen {
    Arc::new(move |dev: &GpuDevice| {
        guarded("re-opening the device", || {
            dev.release_staging();
            hip::discover::reset_device(dev.info.ordinal)?;
            hip::discover::open_device(dev.info.ordinal, &library, &compiler)
                .map(GpuDevice::into_engine)
        })
    })
}

/// `work`, with a panic turned into an error that says what was being done: device
/// discovery and re-probes call into the driver, cuDNN and cuBLASLt bindings, which
/// unwrap and may panic (in `Drop`, too); such a panic must leave the device retired with
/// a reason, never readiness stuck or a re-probe thread gone.
pub fn guarded<T>(what: &str, work: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "no message".into());
        Err(format!("{what} panicked: {message}"))
    })
}

/// The emulated device: a fresh engine (faults still to inject carried over).
pub fn reopen_emulated() -> Reopen {
    Arc::new(|dev: &GpuDevice| {
        dev.rebuilt_emulated()
            .ok_or_else(|| "not an emulated device".to_string())
    })
}

/// The executors, and why CUDA is or is not in use. The one owner of devices: request
/// jobs (the pool) and dataset batches take their device from `pick_gpu` and report a
/// failure through `device_failed`.
pub struct Backends {
    pub mode: BackendChoice,
    pub cpu: Arc<CpuExecutor>,
    metrics: Arc<Metrics>,
    gpus: OnceLock<Vec<Arc<GpuDevice>>>,
    reason: RwLock<String>,
    next_gpu: AtomicUsize,
    probe: OnceLock<Probe>,
    /// What discovery found for AMD GPUs (`hip::status`).
    hip: OnceLock<hip::HipStatus>,
}

impl Backends {
    pub fn new(mode: BackendChoice, cpu: CpuExecutor, metrics: Arc<Metrics>) -> Self {
        Self {
            mode,
            cpu: Arc::new(cpu),
            metrics,
            gpus: OnceLock::new(),
            reason: RwLock::new("device discovery has not finished".into()),
            next_gpu: AtomicUsize::new(0),
            probe: OnceLock::new(),
            hip: OnceLock::new(),
        }
    }

    /// What discovery found for AMD GPUs; set once.
    pub fn set_hip(&self, status: hip::HipStatus) {
        let _ = self.hip.set(status);
    }

    pub fn hip(&self) -> hip::HipStatus {
        self.hip.get().cloned().unwrap_or_else(|| hip::HipStatus {
            runtime: None,
            devices: 0,
            reason: "device discovery has not finished".into(),
        })
    }

    /// How retired devices are re-probed; set once, before `set_gpus`.
    pub fn set_probe(&self, probe: Probe) {
        let _ = self.probe.set(probe);
    }

    /// Called once, when discovery and kernel compilation are done.
    pub fn set_gpus(&self, gpus: Vec<Arc<GpuDevice>>, reason: String) {
        for g in &gpus {
            self.health_gauge(g).set(1);
        }
        let _ = self.gpus.set(gpus);
        *self.reason.write().unwrap_or_else(|e| e.into_inner()) = reason;
    }

    /// The healthy GPUs where `op` is not quarantined, in turn, so concurrent work
    /// spreads over them.
    pub fn pick_gpu(&self, op: &str) -> Option<Arc<GpuDevice>> {
        let usable: Vec<_> = self.gpus_for(op).collect();
        if usable.is_empty() {
            return None;
        }
        Some(usable[self.next_gpu.fetch_add(1, Ordering::Relaxed) % usable.len()].clone())
    }

    /// The healthy GPUs where `op` may run.
    pub fn gpus_for<'a>(&'a self, op: &'a str) -> impl Iterator<Item = &'a Arc<GpuDevice>> {
        self.healthy_gpus().filter(move |d| d.op_usable(op))
    }

    /// Runs every self-test on `dev` and records each op's state (`/device`,
    /// `gpu_ops_kernel_verified`). A test that fails, or panics, quarantines its op on this
    /// device. Call from a blocking thread before the device serves anything.
    pub fn self_test(&self, dev: &GpuDevice, tests: &[Box<dyn verify::SelfTest>]) {
        let started = std::time::Instant::now();
        let mut failed = 0;
        for t in tests {
            if !dev.serves(t.op()) {
                dev.set_op_unavailable(t.op());
                continue;
            }
            let outcome = match dev.lease() {
                Ok(lease) if !t.applies(&lease) => continue,
                Ok(lease) => {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.run(&lease)))
                        .unwrap_or_else(|_| Err("the self-test panicked".into()))
                }
                Err(e) => Err(format!("no lease: {e}")),
            };
            match outcome {
                Ok(()) => self.set_op_state(dev, t.op(), None),
                Err(why) => {
                    failed += 1;
                    self.quarantine(dev, t.op(), &format!("self-test: {why}"));
                }
            }
        }
        tracing::info!(
            device = dev.info.ordinal,
            tests = tests.len(),
            failed,
            seconds = started.elapsed().as_secs_f64(),
            "device self-test finished"
        );
    }

    /// Takes `op` off `dev` until a re-probe passes: its work goes to the CPU or another
    /// device.
    pub fn quarantine(&self, dev: &GpuDevice, op: &str, why: &str) {
        tracing::error!(
            device = dev.info.ordinal,
            op,
            reason = why,
            "op quarantined on this device; its work moves elsewhere"
        );
        self.set_op_state(dev, op, Some(why.to_string()));
    }

    /// A shadow check's outcome (`gpu_ops_shadow_checks_total`); a mismatch quarantines
    /// the op on the device.
    ///
    /// Where a vendor library that may have done the work is verified on `dev` (cuBLASLt
    /// for matmul and conv2d, cuDNN for conv2d), the library is quarantined instead: the
    /// op goes on, on our kernels, and a second mismatch then quarantines the op.
    pub fn shadow_checked(&self, dev: &GpuDevice, op: &str, outcome: Result<(), String>) {
        let label = if outcome.is_ok() { "agree" } else { "mismatch" };
        self.metrics
            .shadow_checks
            .with_label_values(&[op, label])
            .inc();
        let Err(why) = outcome else {
            return;
        };
        let libraries: Vec<&'static str> = self
            .probe
            .get()
            .map(|p| {
                p.tests
                    .iter()
                    .filter(|t| t.library_for().contains(&op) && dev.op_verified(t.op()))
                    .map(|t| t.op())
                    .collect()
            })
            .unwrap_or_default();
        if libraries.is_empty() {
            self.quarantine(dev, op, &format!("shadow check: {why}"));
        }
        for library in libraries {
            self.quarantine(dev, library, &format!("shadow check of {op}: {why}"));
        }
    }

    fn set_op_state(&self, dev: &GpuDevice, op: &str, reason: Option<String>) {
        self.metrics
            .kernel_verified
            .with_label_values(&[&dev.info.ordinal.to_string(), op])
            .set(i64::from(reason.is_none()));
        dev.set_op_state(op, reason);
    }

    /// The fault policy, for every caller. A job-specific error (out of memory, a shape
    /// without a kernel) moves that job alone to the CPU. A fatal error (a lost device), or
    /// `FAILURES_TO_RETIRE` failures in a row, takes the device out of service
    /// (`gpu_ops_device_healthy` 0) until a re-probe passes. An abandoned job is not a
    /// failure, nor is a launch refused as `Unsupported` (the job's shape, not the
    /// device: it moves that job only, and never counts towards retiring). Reruns on the CPU are counted in `gpu_ops_fallbacks_total{op, reason}`.
    pub fn device_failed(
        self: &Arc<Self>,
        dev: &GpuDevice,
        op: &str,
        err: &DeviceError,
        rerun_on_cpu: bool,
    ) {
        if err.kind == DeviceErrorKind::Abandoned {
            tracing::info!(op, device = dev.info.ordinal, error = %err, "device work dropped");
            return;
        }
        tracing::warn!(op, device = dev.info.ordinal, error = %err, fallback = rerun_on_cpu, "device work failed");
        if err.kind == DeviceErrorKind::Unsupported {
            // The job's own shape (a block over a kernel's launch bound, say): nothing
            // about the device, so it neither retires it nor counts towards doing so.
            if rerun_on_cpu {
                self.count_fallback(op, err.reason());
            }
            return;
        }
        let in_row = dev.count_failure();
        if err.kind == DeviceErrorKind::Fatal || in_row >= FAILURES_TO_RETIRE {
            self.retire(dev, &format!("{err} ({in_row} failure(s) in a row)"));
        }
        if rerun_on_cpu {
            self.count_fallback(op, err.reason());
        }
    }

    /// Device work that succeeded: the failure streak ends.
    pub fn device_succeeded(&self, dev: &GpuDevice) {
        dev.count_success();
    }

    /// Takes `dev` out of service and schedules its re-probe.
    fn retire(self: &Arc<Self>, dev: &GpuDevice, why: &str) {
        dev.mark_unhealthy(why);
        self.health_gauge(dev).set(0);
        let Some(dev) = self.gpus().iter().find(|d| std::ptr::eq(d.as_ref(), dev)) else {
            return;
        };
        let Some(probe) = self.probe.get().cloned() else {
            return;
        };
        if !dev.start_reprobe() {
            return;
        }
        let (backends, dev) = (self.clone(), dev.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("reprobe-gpu{}", dev.info.ordinal))
            .spawn(move || {
                let mut wait = probe.backoff;
                loop {
                    std::thread::sleep(wait);
                    match backends.reprobe(&dev, &probe) {
                        Ok(()) => break,
                        Err(why) => {
                            tracing::warn!(device = dev.info.ordinal, reason = %why, retry_in = ?wait * 2, "re-probe failed");
                            wait = (wait * 2).min(MAX_REPROBE_BACKOFF);
                        }
                    }
                }
                dev.end_reprobe();
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the re-probe thread; the device stays out");
        }
    }

    /// Rebuilds the device's engine (a fresh context) and reruns the self-test: back in
    /// service if any op passes (those that fail stay quarantined, as at start-up).
    fn reprobe(&self, dev: &GpuDevice, probe: &Probe) -> Result<(), String> {
        let engine = guarded("re-opening the device", || (probe.reopen)(dev))?;
        // Dropping the old engine runs the libraries' destructors.
        guarded("replacing the engine", || {
            dev.replace_engine(engine);
            Ok(())
        })?;
        self.self_test(dev, &probe.tests);
        // Ops without kernels on the engine (`unavailable`) say nothing either way.
        let states = dev.op_states();
        let mut tested = states
            .iter()
            .filter(|s| s.state != verify::OpState::Unavailable);
        if tested.all(|s| s.state == verify::OpState::Quarantined) {
            return Err("every op failed its self-test".into());
        }
        dev.mark_healthy();
        self.health_gauge(dev).set(1);
        Ok(())
    }

    /// Counts work moved to the CPU for `reason` (a device error's, or `parity`).
    pub fn count_fallback(&self, op: &str, reason: &str) {
        self.metrics
            .fallbacks
            .with_label_values(&[op, reason])
            .inc();
    }

    fn health_gauge(&self, dev: &GpuDevice) -> prometheus::IntGauge {
        self.metrics
            .device_healthy
            .with_label_values(&[&dev.info.ordinal.to_string(), &dev.info.uuid])
    }

    pub fn discovery_done(&self) -> bool {
        self.gpus.get().is_some()
    }

    pub fn gpus(&self) -> &[Arc<GpuDevice>] {
        self.gpus.get().map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn healthy_gpus(&self) -> impl Iterator<Item = &Arc<GpuDevice>> {
        self.gpus().iter().filter(|d| d.is_healthy())
    }

    /// The backend `auto` work goes to now.
    pub fn active(&self) -> BackendKind {
        self.healthy_gpus()
            .find(|d| d.auto_placement())
            .map_or(BackendKind::Cpu, |d| d.backend_kind())
    }

    pub fn reason(&self) -> String {
        let base = self
            .reason
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let lost: Vec<String> = self
            .gpus()
            .iter()
            .filter(|d| !d.is_healthy())
            .map(|d| d.info.ordinal.to_string())
            .collect();
        if lost.is_empty() {
            base
        } else {
            format!(
                "{base}; device(s) {} marked unhealthy after errors, their work moved to the CPU",
                lost.join(",")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::blaslt::MATMUL_BLASLT_OP;

    /// What the blame reads of cuBLASLt's check (`ops::linalg`'s, which a backend test
    /// may not name): its op, and the ops whose work it may do.
    struct BlasltServesMatmul;

    impl verify::SelfTest for BlasltServesMatmul {
        fn op(&self) -> &'static str {
            MATMUL_BLASLT_OP
        }
        fn library_for(&self) -> &'static [&'static str] {
            &["matmul", "conv2d"]
        }
        fn run(&self, _: &DeviceLease<'_>) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn a_shadow_mismatch_is_blamed_on_a_verified_library_first() {
        let b = Backends::new(
            BackendChoice::Auto,
            CpuExecutor::new(1).unwrap(),
            Arc::new(Metrics::new()),
        );
        b.set_probe(Probe {
            reopen: reopen_emulated(),
            tests: Arc::new(vec![
                Box::new(BlasltServesMatmul) as Box<dyn verify::SelfTest>
            ]),
            backoff: Duration::from_secs(1),
        });
        let dev = GpuDevice::emulated(0, 1 << 30);
        // As if cuBLASLt had passed its self-test on this device.
        dev.set_op_state(MATMUL_BLASLT_OP, None);
        b.shadow_checked(&dev, "matmul", Err("value 3 differs".into()));
        assert!(!dev.op_usable(MATMUL_BLASLT_OP));
        assert!(dev.op_usable("matmul"), "matmul goes on, on our kernel");
        // With the library off, a second mismatch is the kernel's.
        b.shadow_checked(&dev, "matmul", Err("value 3 differs".into()));
        assert!(!dev.op_usable("matmul"));
        // An op no library serves is quarantined at once.
        b.shadow_checked(&dev, "ntt", Err("differs".into()));
        assert!(!dev.op_usable("ntt"));
    }

    #[test]
    fn a_launch_the_device_refuses_as_unsupported_never_retires_it() {
        let b = Arc::new(Backends::new(
            BackendChoice::Auto,
            CpuExecutor::new(1).unwrap(),
            Arc::new(Metrics::new()),
        ));
        let dev = GpuDevice::emulated(0, 1 << 30);
        let refused = DeviceError::unsupported("a block of 512 threads, over the bound of 256");
        for _ in 0..FAILURES_TO_RETIRE + 1 {
            b.device_failed(&dev, "field_add", &refused, true);
        }
        assert!(dev.is_healthy());
        // Out-of-memory errors still count: three in a row retire the device.
        for _ in 0..FAILURES_TO_RETIRE {
            b.device_failed(&dev, "field_add", &DeviceError::out_of_memory("x"), true);
        }
        assert!(!dev.is_healthy());
    }

    #[test]
    fn a_panic_while_opening_a_device_is_an_error_that_says_where() {
        let err = guarded("device discovery", || -> Result<(), String> {
            panic!("cudnnCreate returned CUDNN_STATUS_NOT_INITIALIZED")
        })
        .unwrap_err();
        assert!(
            err.starts_with("device discovery panicked: cudnnCreate"),
            "{err}"
        );
        assert_eq!(guarded("x", || Ok(7)), Ok(7));
    }

    #[test]
    fn a_reprobe_whose_reopen_panics_fails_and_leaves_the_device_retired() {
        let b = Backends::new(
            BackendChoice::Auto,
            CpuExecutor::new(1).unwrap(),
            Arc::new(Metrics::new()),
        );
        let probe = Probe {
            reopen: Arc::new(|_: &GpuDevice| panic!("the context is poisoned")),
            tests: Arc::new(Vec::new()),
            backoff: Duration::from_secs(1),
        };
        let dev = GpuDevice::emulated(0, 1 << 30);
        dev.mark_unhealthy("a sticky error");
        let err = b.reprobe(&dev, &probe).unwrap_err();
        assert!(err.contains("panicked: the context is poisoned"), "{err}");
        assert!(!dev.is_healthy());
    }
}
