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
    /// `Job::placement_lane` of the case ("" where not known).
    pub lane: String,
    /// `Job::name` of the case's job: what a server's placement records it under. A
    /// library's case (`conv2d_cudnn`) runs the job of the op it serves (`conv2d`). ""
    /// where not known: the case's op.
    pub job: &'static str,
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

impl CaseRun {
    /// A case not yet run: agreeing, with no timings.
    pub fn new(info: CaseInfo, size: usize, input_bytes: usize) -> Self {
        Self {
            info,
            size,
            input_bytes,
            lane: String::new(),
            job: "",
            outcome: Ok(()),
            device_ms: Vec::new(),
            kernel_ms: Vec::new(),
            cpu_ms: None,
        }
    }
}

/// Runs `job` through `run` (its device path, or a vendor library's) as the check does:
/// `measure_runs` with the job's size, its CPU twin and `Job::agrees`. A device failure
/// ends the case with the error as its outcome.
pub fn measure_job<J: Job>(
    job: &J,
    info: CaseInfo,
    dev: &DeviceLease<'_>,
    repeats: Repeats,
    run: impl Fn(&J, &DeviceLease<'_>) -> Result<J::Output, DeviceError>,
) -> CaseRun {
    let mut case = CaseRun::new(info, job.size(), job.input_bytes());
    case.lane = job.placement_lane().into_owned();
    case.job = job.name();
    measure_runs(
        case,
        dev,
        repeats,
        |dev| {
            run(job, dev)
                .and_then(|out| dev.synchronize().map(|()| out))
                .map_err(|e| format!("the device failed: {e}"))
        },
        || job.run_cpu(),
        |device, cpu| job.agrees(device, cpu),
    )
}

/// The check's measurement of any device path: warm-up, timed runs of `on_device` with
/// the kernel clock on, then `on_cpu` once, held to `agree` against the first timed
/// output. A failed device run ends the case with its error as the outcome.
pub fn measure_runs<O>(
    mut case: CaseRun,
    dev: &DeviceLease<'_>,
    repeats: Repeats,
    on_device: impl Fn(&DeviceLease<'_>) -> Result<O, String>,
    on_cpu: impl FnOnce() -> O,
    agree: impl FnOnce(&O, &O) -> Result<(), String>,
) -> CaseRun {
    let mut first = None;
    for i in 0..repeats.warmup + repeats.timed.max(1) {
        dev.device.start_kernel_clock();
        let started = Instant::now();
        let out = on_device(dev);
        let elapsed = started.elapsed().as_secs_f64() * 1e3;
        let kernels = dev.device.stop_kernel_clock();
        match out {
            Ok(out) if i >= repeats.warmup => {
                case.device_ms.push(elapsed);
                case.kernel_ms.extend(kernels);
                first.get_or_insert(out);
            }
            Ok(_) => {}
            Err(why) => {
                case.outcome = Err(why);
                return case;
            }
        }
    }
    let started = Instant::now();
    let cpu = on_cpu();
    case.cpu_ms = Some(started.elapsed().as_secs_f64() * 1e3);
    if let Some(device) = first {
        case.outcome = agree(&device, &cpu);
    }
    case
}

/// "2^20", "2^18 + 2", "9000": a size as the check's labels write it (a power of two
/// plus a few as such).
pub fn size_label(n: usize) -> String {
    if n >= 1 << 10 {
        let k = usize::BITS - 1 - n.leading_zeros();
        let rest = n - (1 << k);
        if rest == 0 {
            return format!("2^{k}");
        }
        if rest <= 16 {
            return format!("2^{k} + {rest}");
        }
    }
    n.to_string()
}

/// `len` values uniform in (−1, 1), about one in 32 of them (and the first six) edge
/// values instead: ±0, ±`big`, ±`tiny`. Drawn in parallel, in chunks seeded from `seed`,
/// so a seed gives the same values on any machine. The tensor ops' check inputs.
pub fn mixed_values(len: usize, seed: u64, big: f32, tiny: f32) -> Vec<f32> {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let edges = [0.0, -0.0, big, -big, tiny, -tiny];
    let mut v = vec![0f32; len];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        let mut rng = StdRng::seed_from_u64(seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for x in chunk {
            *x = if rng.random_ratio(1, 32) {
                edges[rng.random_range(0..edges.len())]
            } else {
                rng.random_range(-1.0..1.0)
            };
        }
    });
    let first = edges.len().min(len);
    v[..first].copy_from_slice(&edges[..first]);
    v
}

static CASE_SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Fixes the seed of the check's random inputs (`gpu-ops check --seed`); the first call
/// wins.
pub fn set_case_seed(seed: u64) {
    let _ = CASE_SEED.set(seed);
}

static MSM_LOG2: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();

/// Sets the check's MSM sizes, as log2 of the points (`gpu-ops check --msm-log2`), in
/// place of the level's one size; the first call wins.
pub fn set_msm_log2(sizes: Vec<u32>) {
    let _ = MSM_LOG2.set(sizes);
}

/// The MSM sizes `--msm-log2` asked for, if it did.
pub fn msm_log2() -> Option<&'static [u32]> {
    MSM_LOG2.get().map(Vec::as_slice).filter(|s| !s.is_empty())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels() {
        assert_eq!(size_label(1 << 20), "2^20");
        assert_eq!(size_label((1 << 18) + 2), "2^18 + 2");
        assert_eq!(size_label(9_000), "9000");
        assert_eq!(size_label(13), "13");
    }
}
