//! What `gpu-ops check` measures of one case: its device runs timed after a warm-up (wall
//! time with transfers, and the kernels' own time where the engine can clock them), the
//! CPU twin timed once, and whether the two agree. The self-test at start-up runs the same
//! cases once, untimed (`verify::SelfTest::run`); the check adds sizes and timing.

use super::device::{DeviceError, DeviceLease};
use super::Job;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// How big the check's cases are (`gpu-ops check --level`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum CheckLevel {
    /// Small sizes: every op's parity in under a minute on the emulated device.
    #[default]
    Quick,
    /// Production sizes (NTT 2^22, matmul 4096³, attention S = 4096, …): minutes on a GPU.
    Standard,
}

impl CheckLevel {
    /// `quick` at the quick level, `standard` at the standard one.
    pub fn pick<T>(self, quick: T, standard: T) -> T {
        match self {
            Self::Quick => quick,
            Self::Standard => standard,
        }
    }
}

/// How often each case runs on the device.
#[derive(Clone, Copy, Debug)]
pub struct Repeats {
    /// Untimed runs first (kernel loading, table caches, clocks ramping up).
    pub warmup: usize,
    /// Timed runs; the first one's output is the one held to the CPU twin.
    pub timed: usize,
}

/// What a case is, for the report: a label, the work it does (for GB/s and FLOP/s), and
/// the shape a library on the same GPU can run for comparison
/// (`scripts/torch_compare.py` reads `compare`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct CaseInfo {
    pub label: String,
    /// Bytes a perfect kernel must move through device memory (inputs read once, output
    /// written once): the roofline against the device's copy bandwidth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<f64>,
    /// Floating-point operations, for FLOP/s (products, attention, convolutions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops: Option<f64>,
    /// The same work in a library's terms: `{"kind": "matmul", "m": …}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compare: Option<serde_json::Value>,
}

impl CaseInfo {
    pub fn labelled(label: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            ..Self::default()
        }
    }

    pub fn with_bytes(mut self, bytes: f64) -> Self {
        self.bytes = Some(bytes);
        self
    }

    pub fn with_flops(mut self, flops: f64) -> Self {
        self.flops = Some(flops);
        self
    }

    pub fn with_compare(mut self, compare: serde_json::Value) -> Self {
        self.compare = Some(compare);
        self
    }
}

/// One case's outcome under the check.
#[derive(Clone, Debug)]
pub struct CaseRun {
    pub info: CaseInfo,
    /// `Job::size` of the case.
    pub size: usize,
    pub input_bytes: usize,
    /// Agreement with the CPU twin, or where they part (or why the device failed).
    pub outcome: Result<(), String>,
    /// Each timed device run, transfers included, in milliseconds.
    pub device_ms: Vec<f64>,
    /// The kernels' and vendor libraries' own time in each timed run (CUDA events on a
    /// GPU; the launches' wall time on the emulated device); empty where not clocked.
    pub kernel_ms: Vec<f64>,
    /// The CPU twin's one run, in milliseconds.
    pub cpu_ms: Option<f64>,
}

/// Runs `job` through `run` (its device path, or a vendor library's) as the check does:
/// warm-up, timed runs with the kernel clock on, then the CPU twin once, held to
/// `Job::agrees` against the first timed output. A device failure ends the case with the
/// error as its outcome.
pub fn measure_job<J: Job>(
    job: &J,
    info: CaseInfo,
    dev: &DeviceLease<'_>,
    repeats: Repeats,
    run: impl Fn(&J, &DeviceLease<'_>) -> Result<J::Output, DeviceError>,
) -> CaseRun {
    let mut case = CaseRun {
        info,
        size: job.size(),
        input_bytes: job.input_bytes(),
        outcome: Ok(()),
        device_ms: Vec::new(),
        kernel_ms: Vec::new(),
        cpu_ms: None,
    };
    let mut first = None;
    for i in 0..repeats.warmup + repeats.timed.max(1) {
        let timed = i >= repeats.warmup;
        dev.device.start_kernel_clock();
        let started = Instant::now();
        let out = run(job, dev).and_then(|out| dev.synchronize().map(|()| out));
        let elapsed = started.elapsed().as_secs_f64() * 1e3;
        let kernels = dev.device.stop_kernel_clock();
        match out {
            Ok(out) => {
                if timed {
                    case.device_ms.push(elapsed);
                    case.kernel_ms.extend(kernels);
                    first.get_or_insert(out);
                }
            }
            Err(e) => {
                case.outcome = Err(format!("the device failed: {e}"));
                return case;
            }
        }
    }
    let started = Instant::now();
    let cpu = job.run_cpu();
    case.cpu_ms = Some(started.elapsed().as_secs_f64() * 1e3);
    if let Some(device) = first {
        case.outcome = job.agrees(&device, &cpu);
    }
    case
}

static CASE_SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Fixes the seed of the check's random inputs (`gpu-ops check --seed`); the first call
/// wins.
pub fn set_case_seed(seed: u64) {
    let _ = CASE_SEED.set(seed);
}

/// The seed the check's cases draw their inputs from: `--seed`, else fresh from the clock
/// (the report names it, so a failure can be replayed).
pub fn case_seed() -> u64 {
    *CASE_SEED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    })
}
