//! The parity harness: each domain's module below builds its jobs (edge values, sizes
//! that cross the launchers' branches: grid-stride wraps, tiles, stages, passes and
//! chunks), and the harness runs every one on every usable CUDA device, on every wgpu
//! adapter (software ones included: lavapipe in CI) for the ops its WGSL kernels serve,
//! and on the emulated device, through `Job::run_device` — the path the service takes —
//! holding it to its CPU twin with `Job::agrees` (integers bit for bit, floats within the
//! op's stated tolerance). Without a GPU nothing is skipped: the emulated device runs it
//! all. On a GPU host: `scripts/gpu-check.sh run`.
//!
//! A disagreement does not stop the test: every case runs, and the test fails listing
//! each case that parted from its twin, by device.

mod beams;
mod dp;
mod he;
mod linalg;
mod mpc;
mod nn;
mod rf;
mod zk;

use gpu_ops::backend::cuda::{discover, DeviceSelection};
use gpu_ops::backend::wgpu::SoftwareAdapters;
use gpu_ops::backend::{DeviceError, DeviceLease, GpuDevice, Job};
use std::cell::RefCell;
use std::fmt::Display;
use std::sync::{Arc, OnceLock};

/// One device a parity test runs on, and what its cases found.
pub struct Device {
    dev: Arc<GpuDevice>,
    failures: RefCell<Vec<String>>,
}

/// Every wgpu adapter, software ones included, opened once for the whole test binary
/// (each opening compiles every WGSL kernel). None found fails the test where
/// `REQUIRE_WGPU=1` (CI, which installs lavapipe). None in a run under a checker of the
/// emulated device (AddressSanitizer, ThreadSanitizer): those check our `.cu` kernels,
/// and a Vulkan driver's JIT under their preloaded runtimes checks nothing of ours.
pub fn wgpu_devices() -> &'static [Arc<GpuDevice>] {
    static DEVICES: OnceLock<Vec<Arc<GpuDevice>>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        if checked_run() {
            eprintln!("wgpu adapters are left out of a checked run");
            return Vec::new();
        }
        let (devices, reason) = gpu_ops::backend::wgpu::discover(
            &DeviceSelection::All,
            SoftwareAdapters::Forced,
            &gpu_ops::ops::wgsl_library(),
        );
        eprintln!("{reason}");
        assert!(
            !devices.is_empty() || std::env::var("REQUIRE_WGPU").as_deref() != Ok("1"),
            "REQUIRE_WGPU=1 but no wgpu adapter opened: {reason}"
        );
        devices
    })
}

/// Whether the emulated device runs its build checked by a sanitizer.
pub fn checked_run() -> bool {
    !matches!(gpu_ops::backend::emulated::sanitizer(), "none" | "")
}

/// Runs `body` on every usable CUDA device, then on the emulated device (256 MiB of
/// pretend memory), and fails listing every case that disagreed anywhere.
pub fn on_every_device(test: &str, body: impl FnMut(&Device)) {
    on_devices_serving(&[], test, body)
}

/// `on_every_device`, and on every wgpu adapter whose kernels serve all of `ops` (the
/// ops `body` runs; none: no adapter).
pub fn on_devices_serving(test_ops: &[&str], test: &str, mut body: impl FnMut(&Device)) {
    let cache = std::env::temp_dir().join("gpu-ops-parity-kernels");
    let (mut devices, reason) = discover(
        &DeviceSelection::All,
        &cache,
        &gpu_ops::ops::kernel_library(),
    );
    eprintln!("{test}: CUDA: {reason}; the emulated device runs it too");
    if !test_ops.is_empty() {
        let serving = wgpu_devices()
            .iter()
            .filter(|d| test_ops.iter().all(|op| d.serves(op)));
        devices.extend(serving.cloned());
    }
    devices.push(Arc::new(GpuDevice::emulated(devices.len(), 256 << 20)));
    let mut failures = Vec::new();
    for dev in devices {
        let info = &dev.info;
        let name = format!(
            "{} ({}, {}, {})",
            dev.label(),
            info.name,
            info.compute_capability,
            info.kernel_arch
        );
        let device = Device {
            dev,
            failures: RefCell::new(Vec::new()),
        };
        body(&device);
        device.dev.set_memory_limit(0);
        failures.extend(
            device
                .failures
                .into_inner()
                .into_iter()
                .map(|f| format!("{name}: {f}")),
        );
    }
    assert!(
        failures.is_empty(),
        "{test}: {} case(s) disagree with the CPU twin:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

impl Device {
    pub fn is_emulated(&self) -> bool {
        self.dev.is_emulated()
    }

    /// The sizes a test runs at here. The emulated device runs every GPU thread as a fiber
    /// on the CPU, so its sizes are smaller, chosen to cross the same branches (more items
    /// than its 32 × 256 threads, passes, chunks, tiles and stages). Under ThreadSanitizer
    /// (CI's race check, many times slower) the largest is left out: races need a block's
    /// threads, not long loops.
    /// A software wgpu adapter (lavapipe) shares the host's cores too: it runs the
    /// emulated sizes.
    pub fn sizes<T: Clone>(&self, real: &[T], emulated: &[T]) -> Vec<T> {
        if !self.dev.on_host_cores() {
            real.to_vec()
        } else if self.race_checked() {
            emulated[..emulated.len() - 1].to_vec()
        } else {
            emulated.to_vec()
        }
    }

    /// Whether this is the emulated device under ThreadSanitizer.
    pub fn race_checked(&self) -> bool {
        self.is_emulated() && gpu_ops::backend::emulated::sanitizer() == "thread"
    }

    /// A lease for checks that are not one job's (kernels compared piece by piece).
    pub fn lease(&self) -> DeviceLease<'_> {
        self.dev.lease().expect("device lease")
    }

    pub fn device(&self) -> &GpuDevice {
        &self.dev
    }

    /// `job` through `Job::run_device`, held to its CPU twin by `Job::agrees`.
    pub fn check<J: Job>(&self, case: impl Display, job: &J) -> Option<J::Output> {
        self.check_with(case, job, J::run_device)
    }

    /// `job` through another launcher of the same op (in chunks, measured), held to the
    /// CPU twin as `check` holds it. The device's output when it agreed, for checks that
    /// go on from it.
    pub fn check_with<J: Job>(
        &self,
        case: impl Display,
        job: &J,
        launch: impl FnOnce(&J, &DeviceLease<'_>) -> Result<J::Output, DeviceError>,
    ) -> Option<J::Output> {
        // A wgpu adapter runs a test only for the ops it serves (`on_devices_serving`):
        // a job of another op means the test's list is wrong.
        if !self.dev.serves(job.name()) {
            self.fail(case, format!("{} is not among the test's ops", job.name()));
            return None;
        }
        let outcome = match self.dev.lease() {
            Ok(lease) => launch(job, &lease).map_err(|e| format!("the device failed: {e}")),
            Err(e) => Err(format!("no lease: {e}")),
        };
        let agreed = outcome.and_then(|device| {
            job.agrees(&device, &job.run_cpu())?;
            Ok(device)
        });
        agreed.map_err(|why| self.fail(case, why)).ok()
    }

    /// Records a failed case: the test goes on and reports it at the end.
    pub fn fail(&self, case: impl Display, why: impl Display) {
        self.failures.borrow_mut().push(format!("{case}: {why}"));
    }

    /// Runs `body` with the device's memory limited to `bytes`, so the launchers work in
    /// passes and chunks; the limit is lifted after.
    pub fn in_passes(&self, bytes: u64, body: impl FnOnce(&Self)) {
        self.dev.set_memory_limit(bytes);
        body(self);
        self.dev.set_memory_limit(0);
    }
}

/// The harness fails a case whose device output parts from the CPU twin's, and one whose
/// launch fails, and goes on to the next: shown with faults injected into the emulated
/// device (a flipped output bit, a failed launch).
#[test]
fn the_harness_reports_every_case_that_disagrees() {
    use gpu_ops::backend::emulated::Fault;
    use gpu_ops::backend::DeviceErrorKind;
    use gpu_ops::ops::zk::{Field, FieldBinaryJob, FieldOp};
    let (xs, ys) = zk::inputs(Field::Goldilocks, 100);
    let job = |op| {
        let (a, b) = (
            zk::vec(Field::Goldilocks, &xs),
            zk::vec(Field::Goldilocks, &ys),
        );
        FieldBinaryJob::new(op, a, b).unwrap()
    };
    let dev = Arc::new(GpuDevice::emulated(0, 256 << 20));
    dev.inject_fault("goldilocks_add", Fault::Corrupt, 1)
        .unwrap();
    dev.inject_fault("goldilocks_mul", Fault::Fail(DeviceErrorKind::Fatal), 1)
        .unwrap();
    let d = Device {
        dev,
        failures: RefCell::new(Vec::new()),
    };
    assert!(d.check("corrupted", &job(FieldOp::Add)).is_none());
    assert!(d.check("sound", &job(FieldOp::Sub)).is_some());
    assert!(d.check("failed", &job(FieldOp::Mul)).is_none());
    let failures = d.failures.into_inner();
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(failures[0].starts_with("corrupted: "), "{failures:?}");
    assert!(
        failures[1].starts_with("failed: the device failed"),
        "{failures:?}"
    );
}
