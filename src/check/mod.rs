//! `gpu-ops check`: the service proves itself on a GPU in one short run, as `dcgmi diag`
//! does for DCGM. On every device `auto` would use (or the emulated device), in order,
//! each phase timed and each op guarded so one failure names itself and the run goes on:
//! the environment (libraries, versions, files), compiling and loading every kernel
//! module, every op's start-up self-test, parity at the level's sizes through
//! `Job::run_device` against `Job::run_cpu`, and the timings of those runs against the
//! CPU twin and the device's copy bandwidth. The self-test code is shared with start-up
//! (`backend::verify`); the check adds sizes and timing (`backend::measure`).

mod compile_only;
mod environment;
pub mod report;

use crate::backend::cuda::kernels::KernelLibrary;
use crate::backend::cuda::{self, DeviceSelection};
use crate::backend::measure::{case_seed, set_case_seed, set_msm_log2, CheckLevel, Repeats};
use crate::backend::verify::SelfTest;
use crate::backend::GpuDevice;
use report::{CopyRates, DeviceReport, OpEntry, Phase, Report};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `gpu-ops check`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// quick: small sizes (every op's parity in under a minute on the emulated device);
    /// standard: production sizes (minutes on a GPU).
    #[arg(long, env = "GPU_OPS_CHECK_LEVEL", value_enum, default_value = "quick")]
    pub level: CheckLevel,
    /// Only these ops (comma-separated names as /device lists them, e.g. ntt,msm).
    #[arg(long, value_delimiter = ',')]
    pub ops: Vec<String>,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the markdown report here (it is also printed).
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Where the kernel cache lives (`<data-dir>/kernel-cache`), as for `serve`.
    #[arg(long, env = "GPU_OPS_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// Check the emulated device (our kernels compiled for the host) instead of CUDA's.
    #[arg(long, env = "GPU_OPS_EMULATE_DEVICE", default_value_t = false)]
    pub emulate_device: bool,
    /// wgpu adapters that are the CPU (lavapipe, llvmpipe, WARP): off (not checked), or
    /// forced / auto (checked like any adapter), as for `serve`.
    #[arg(
        long,
        env = "GPU_OPS_WGPU_SOFTWARE_ADAPTERS",
        value_enum,
        default_value = "off"
    )]
    pub wgpu_software_adapters: crate::backend::wgpu::SoftwareAdapters,
    /// GPUs to check: "all" or ordinals such as "0,1".
    #[arg(long, env = "GPU_OPS_DEVICES", default_value = "all")]
    pub devices: DeviceSelection,
    /// Only compile every kernel module to cubins for --arch into the kernel cache (no
    /// GPU needed; NVRTC must load), so a device later loads them without compiling.
    #[arg(long, default_value_t = false)]
    pub compile_only: bool,
    /// Architectures for --compile-only, e.g. sm_90 or sm_80,sm_90.
    #[arg(long, value_delimiter = ',', default_value = "sm_90")]
    pub arch: Vec<String>,
    /// MSM sizes as log2 of the points, e.g. 16,18,20,22 (each 1 to 24), in place of the
    /// level's one size (2^10 quick, 2^20 standard): each on both curves, points sent and
    /// resident.
    #[arg(long, env = "GPU_OPS_CHECK_MSM_LOG2", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=24))]
    pub msm_log2: Vec<u32>,
    /// Timed device runs per case (after warm-up): default 1 at quick, 10 at standard.
    #[arg(long)]
    pub runs: Option<usize>,
    /// Seed of the cases' random inputs (default: from the clock; the report names it).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep products and convolutions on our kernels (cuBLASLt and cuDNN not checked).
    #[arg(long, default_value_t = false)]
    pub no_cuda_libraries: bool,
    /// The most device memory one job may use, MiB (0: half of what is free), as for
    /// `serve`.
    #[arg(long, env = "GPU_OPS_GPU_MEMORY_LIMIT_MIB", default_value_t = 0)]
    pub gpu_memory_limit_mib: u64,
}

/// How the check ended, for the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every case that ran agreed with its CPU twin.
    Passed,
    /// At least one parity failed (the report names the ops).
    Failed,
    /// No device to check: the report says why.
    NoDevice,
}

/// Runs the check and writes the report where asked.
pub fn run_cli(args: &CheckArgs) -> Result<Verdict, String> {
    if args.compile_only {
        return compile_only::run(args).map(|()| Verdict::Passed);
    }
    let report = run(args)?;
    let markdown = report.markdown();
    print!("{markdown}");
    write_report(args, &report, &markdown)?;
    Ok(verdict(&report))
}

/// The report (and its markdown) to the files `args` names.
fn write_report(args: &CheckArgs, report: &Report, markdown: &str) -> Result<(), String> {
    if let Some(path) = &args.markdown {
        std::fs::write(path, markdown).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// The report so far, written after each op's cases, so a check stopped by a timeout
/// (a GPU session's prepared run has minutes) still leaves what it measured. The final
/// report overwrites it; this one's last phase says where it stopped.
fn write_partial(args: &CheckArgs, report: &Report, phases: &[Phase], after: &str) {
    if args.markdown.is_none() && args.json.is_none() {
        return;
    }
    let mut partial = report.clone();
    partial.phases = phases.to_vec();
    partial.phases.push(Phase {
        phase: format!("partial report, written after {after}: the check did not finish"),
        seconds: 0.0,
    });
    partial.summarize();
    if let Err(e) = write_report(args, &partial, &partial.markdown()) {
        tracing::warn!(error = %e, "check: the partial report was not written");
    }
}

pub fn verdict(report: &Report) -> Verdict {
    if report.devices.is_empty() {
        Verdict::NoDevice
    } else if report.summary.failed > 0 {
        Verdict::Failed
    } else {
        Verdict::Passed
    }
}

/// Every phase on every device `args` selects; the report.
pub fn run(args: &CheckArgs) -> Result<Report, String> {
    let library = crate::ops::kernel_library();
    let started = Instant::now();
    let (devices, discovery) = open_devices(args, &library);
    let opened = Phase {
        phase: "compile and load".into(),
        seconds: started.elapsed().as_secs_f64(),
    };
    run_on(args, &devices, discovery, opened)
}

/// Every phase on `devices` (already opened: `opened` says how long that took); the
/// report. Tests hand it an emulated device with injected faults.
pub fn run_on(
    args: &CheckArgs,
    devices: &[Arc<GpuDevice>],
    discovery: String,
    opened: Phase,
) -> Result<Report, String> {
    if let Some(seed) = args.seed {
        set_case_seed(seed);
    }
    if !args.msm_log2.is_empty() {
        set_msm_log2(args.msm_log2.clone());
    }
    let level = args.level;
    let self_tests = crate::ops::self_tests();
    let registered: Vec<String> = self_tests.iter().map(|t| t.op().to_string()).collect();
    if let Some(unknown) = args.ops.iter().find(|o| !registered.contains(o)) {
        return Err(format!(
            "--ops: no op {unknown:?}; the ops are {}",
            registered.join(", ")
        ));
    }
    let wanted = |t: &dyn SelfTest| args.ops.is_empty() || args.ops.iter().any(|o| o == t.op());
    let mut phases = Vec::new();
    let timed = |phases: &mut Vec<Phase>, name: &str, started: Instant| {
        phases.push(Phase {
            phase: name.to_string(),
            seconds: started.elapsed().as_secs_f64(),
        })
    };
    timed(
        &mut phases,
        &opened.phase,
        Instant::now() - Duration::from_secs_f64(opened.seconds),
    );

    let started = Instant::now();
    let environment = environment::probe();
    timed(&mut phases, "environment", started);

    let kernels: Vec<String> = crate::ops::kernel_library()
        .modules
        .iter()
        .flat_map(|m| m.entry_points.iter().cloned())
        .collect();

    let mut report = Report {
        gpu_ops_version: env!("CARGO_PKG_VERSION"),
        level,
        seed: case_seed(),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        host_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        discovery,
        environment,
        devices: Vec::new(),
        registered_ops: registered.clone(),
        ops: Vec::new(),
        phases: Vec::new(),
        summary: Default::default(),
    };
    if devices.is_empty() {
        report.ops = registered
            .iter()
            .map(|op| OpEntry::skipped(op, "parity", "", report.discovery.clone()))
            .collect();
    }
    let repeats = Repeats {
        warmup: level.pick(0, 2),
        timed: args.runs.unwrap_or(level.pick(1, 10)).max(1),
    };
    for dev in devices {
        dev.set_memory_limit(args.gpu_memory_limit_mib << 20);
        dev.set_vendor_libraries_allowed(!args.no_cuda_libraries);

        let started = Instant::now();
        let copy = measure_copies(dev, level);
        timed(
            &mut phases,
            &format!("{} copy bandwidth", dev.label()),
            started,
        );
        let copy_gbps = copy.as_ref().ok().map(|c| c.d2d_gbps);

        let started = Instant::now();
        let one = Repeats {
            warmup: 0,
            timed: 1,
        };
        for t in self_tests.iter().filter(|t| wanted(t.as_ref())) {
            report
                .ops
                .extend(check_one(dev, t.as_ref(), "self_test", one, copy_gbps));
        }
        timed(&mut phases, &format!("{} self-test", dev.label()), started);
        write_partial(args, &report, &phases, "the self-tests");

        let started = Instant::now();
        for t in crate::ops::check_cases(level)
            .iter()
            .filter(|t| wanted(t.as_ref()))
        {
            report
                .ops
                .extend(check_one(dev, t.as_ref(), "parity", repeats, copy_gbps));
            write_partial(args, &report, &phases, t.op());
        }
        timed(
            &mut phases,
            &format!("{} parity at {level:?} sizes", dev.label()),
            started,
        );
        report.devices.push(device_report(dev, copy, &kernels));
    }
    report.phases = phases;
    report.summarize();
    Ok(report)
}

/// The devices to check and discovery's words about them.
fn open_devices(args: &CheckArgs, library: &KernelLibrary) -> (Vec<Arc<GpuDevice>>, String) {
    if args.emulate_device {
        let dev = GpuDevice::emulated(0, crate::EMULATED_DEVICE_BYTES);
        return (
            vec![Arc::new(dev)],
            "the emulated device (--emulate-device): our kernels compiled for the host; its timings describe this CPU, not a GPU".into(),
        );
    }
    let cache = args.data_dir.join("kernel-cache");
    let (devices, why) = cuda::discover_guarded(&args.devices, &cache, library);
    if !devices.is_empty() {
        return (devices, why);
    }
    // No usable CUDA device: AMD's, as the server would use them.
    use crate::backend::hip::discover::{discover_guarded, Compiler};
    let (amd, hip_why) = match Compiler::for_this_binary(cache) {
        Ok(c) => discover_guarded(&args.devices, library, &c),
        Err(e) => (Vec::new(), format!("AMD GPUs are not used: {e}")),
    };
    if !amd.is_empty() {
        return (amd, format!("{why}; {hip_why}"));
    }
    // Neither: any GPU wgpu reaches, as the server would use them.
    // Only the kernels of the ops checked (`--ops`): the others' would compile for nothing.
    let all = crate::ops::wgsl_library();
    let checked: Vec<String> = if args.ops.is_empty() {
        vec!["all".into()]
    } else {
        (all.ops.iter().map(|op| op.to_string()))
            .filter(|op| args.ops.contains(op))
            .collect()
    };
    let library = all.select(&checked).unwrap_or(all);
    let (adapters, wgpu_why) =
        crate::backend::wgpu::discover(&args.devices, args.wgpu_software_adapters, &library);
    (adapters, format!("{why}; {hip_why}; {wgpu_why}"))
}

/// Copy rates with ≥ 1 GiB copies on a GPU (anything smaller sits in an H100's 50 MiB L2
/// for device-to-device copies and reads high); 64 MiB on the emulated device.
fn measure_copies(dev: &GpuDevice, level: CheckLevel) -> Result<CopyRates, String> {
    let bytes = if dev.is_emulated() {
        64 << 20
    } else {
        level.pick(256 << 20, 1 << 30)
    };
    let lease = dev.lease().map_err(|e| e.to_string())?;
    let b = catch_unwind(AssertUnwindSafe(|| lease.measure_bandwidth(bytes, 5)))
        .map_err(|_| "the copy measurement panicked".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(CopyRates {
        bytes: b.bytes,
        h2d_pinned_gbps: b.h2d_pinned / 1e9,
        d2h_pinned_gbps: b.d2h_pinned / 1e9,
        h2d_pageable_gbps: b.h2d_pageable / 1e9,
        d2h_pageable_gbps: b.d2h_pageable / 1e9,
        d2d_gbps: b.d2d / 1e9,
    })
}

/// One test's cases on `dev`, each failure (a mismatch, a device error, a panic) kept
/// as that op's row.
fn check_one(
    dev: &GpuDevice,
    test: &dyn SelfTest,
    phase: &'static str,
    repeats: Repeats,
    copy_gbps: Option<f64>,
) -> Vec<OpEntry> {
    let (op, label) = (test.op(), dev.label());
    if !dev.serves(op) {
        let why = dev.why_not_served(op);
        return vec![OpEntry::skipped(op, phase, &label, why.into())];
    }
    let lease = match dev.lease() {
        Ok(l) => l,
        Err(e) => {
            return vec![OpEntry::skipped(
                op,
                phase,
                &label,
                format!("no lease: {e}"),
            )]
        }
    };
    if !test.applies(&lease) {
        let why = "does not apply to this device (its library did not open, or is not allowed)";
        return vec![OpEntry::skipped(op, phase, &label, why.into())];
    }
    let started = Instant::now();
    let runs = catch_unwind(AssertUnwindSafe(|| test.measure(&lease, repeats)));
    drop(lease);
    let entries = match runs {
        Ok(runs) => runs
            .into_iter()
            .map(|r| OpEntry::measured(op, phase, &label, r, copy_gbps))
            .collect(),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let mut e = OpEntry::skipped(op, phase, &label, format!("panicked: {msg}"));
            e.parity = report::Parity::Failed;
            vec![e]
        }
    };
    tracing::info!(
        op,
        phase,
        device = %label,
        seconds = started.elapsed().as_secs_f64(),
        failed = entries.iter().filter(|e| e.parity == report::Parity::Failed).count(),
        "checked"
    );
    entries
}

fn device_report(
    dev: &GpuDevice,
    copy: Result<CopyRates, String>,
    kernels: &[String],
) -> DeviceReport {
    let (copy, copy_error) = match copy {
        Ok(c) => (Some(c), None),
        Err(e) => (None, Some(e)),
    };
    DeviceReport {
        label: dev.label(),
        emulated: dev.is_emulated(),
        info: dev.info.clone(),
        facts: dev.facts(),
        modules: dev.module_loads(),
        // A wgpu adapter has the WGSL kernels of some ops only: those are its functions.
        functions: if dev.backend_kind() == crate::backend::BackendKind::Wgpu {
            let own: Vec<String> = kernels
                .iter()
                .filter(|k| dev.has_kernel(k))
                .cloned()
                .collect();
            dev.kernel_limits(&own)
        } else {
            dev.kernel_limits(kernels)
        },
        copy,
        copy_error,
    }
}
