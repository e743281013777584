//! The check's report: JSON for tools (`--json`; `devices` and `ops` at the top level,
//! each op entry with `op`, `device`, `parity` and its timings) and a markdown table for
//! people.

use super::environment::Environment;
use crate::backend::device::{KernelLimits, ModuleLoad};
use crate::backend::measure::{CaseInfo, CaseRun, CheckLevel};
use crate::backend::GpuInfo;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Parity {
    Ok,
    Failed,
    /// Not run: the device lacks what it needs (a vendor library), or no device ran.
    Skipped,
}

/// Median, minimum and count of a series of runs, in milliseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub runs: usize,
}

impl Stats {
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut xs: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if xs.is_empty() {
            return None;
        }
        xs.sort_by(f64::total_cmp);
        let mid = xs.len() / 2;
        let median = if xs.len() % 2 == 1 {
            xs[mid]
        } else {
            (xs[mid - 1] + xs[mid]) / 2.0
        };
        Some(Self {
            median,
            min: xs[0],
            runs: xs.len(),
        })
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    /// Each device run, uploads and downloads included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_ms: Option<Stats>,
    /// The kernels' and libraries' own time (CUDA events; launch wall time emulated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_ms: Option<Stats>,
    /// The CPU twin's one run on this host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<f64>,
    /// `bytes` over the median kernel (else device) time, in 10^9 bytes/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    /// `flops` over the same time, in 10^9 operations/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gflops: Option<f64>,
    /// That rate as a fraction of the device's measured device-to-device copy rate
    /// (traffic: a copy reads and writes each byte): how near the memory roofline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub of_copy_roofline: Option<f64>,
}

/// One case of one op on one device.
#[derive(Clone, Debug, Serialize)]
pub struct OpEntry {
    pub op: String,
    /// "self_test" (the start-up self-test's cases) or "parity" (the level's sizes).
    pub phase: &'static str,
    pub case: String,
    pub device: String,
    pub parity: Parity,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub size: usize,
    pub input_bytes: usize,
    /// `Job::placement_lane` (the field, dtype or shape class; "" for one lane).
    pub lane: String,
    /// The op a server's placement records the case under (`Job::name`): the case's op,
    /// or for a library's case the op it serves (`conv2d_cudnn` runs `conv2d` jobs).
    pub job: String,
    /// A parity case: the side `auto` would pick for it from the report's other cases
    /// (as if they were what the server had measured), and whether that was the faster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoPick>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compare: Option<serde_json::Value>,
    pub timings: Timings,
}

impl OpEntry {
    /// A measured case; `copy_gbps` is the device's device-to-device copy rate, if known.
    pub fn measured(
        op: &str,
        phase: &'static str,
        device: &str,
        run: CaseRun,
        copy_gbps: Option<f64>,
    ) -> Self {
        let device_ms = Stats::of(&run.device_ms);
        let kernel_ms = Stats::of(&run.kernel_ms);
        let seconds = kernel_ms
            .as_ref()
            .or(device_ms.as_ref())
            .map(|s| s.median / 1e3)
            .filter(|s| *s > 0.0);
        let rate = |work: Option<f64>| work.zip(seconds).map(|(w, s)| w / s / 1e9);
        let gbps = rate(run.info.bytes);
        let timings = Timings {
            gflops: rate(run.info.flops),
            of_copy_roofline: gbps.zip(copy_gbps).map(|(g, c)| g / (2.0 * c)),
            gbps,
            device_ms,
            kernel_ms,
            cpu_ms: run.cpu_ms,
        };
        let CaseInfo {
            label,
            bytes,
            flops,
            compare,
        } = run.info;
        let (parity, reason) = match run.outcome {
            Ok(()) => (Parity::Ok, None),
            Err(why) => (Parity::Failed, Some(why)),
        };
        Self {
            op: op.to_string(),
            phase,
            case: label,
            device: device.to_string(),
            parity,
            reason,
            size: run.size,
            input_bytes: run.input_bytes,
            lane: run.lane,
            job: if run.job.is_empty() { op } else { run.job }.to_string(),
            auto: None,
            bytes,
            flops,
            compare,
            timings,
        }
    }

    /// An op not run on `device`, and why.
    pub fn skipped(op: &str, phase: &'static str, device: &str, why: String) -> Self {
        Self {
            op: op.to_string(),
            phase,
            case: String::new(),
            device: device.to_string(),
            parity: Parity::Skipped,
            reason: Some(why),
            size: 0,
            input_bytes: 0,
            lane: String::new(),
            job: op.to_string(),
            auto: None,
            bytes: None,
            flops: None,
            compare: None,
            timings: Timings::default(),
        }
    }
}

/// What placement would pick for a case (`pool::placement::replay`).
#[derive(Clone, Debug, Serialize)]
pub struct AutoPick {
    /// "device" or "cpu".
    pub picks: &'static str,
    /// The side that was faster here.
    pub faster: &'static str,
    /// The slower side's time over the faster's.
    pub ratio: f64,
    /// What the pick rests on (None: nothing else of the op was measured, so the old
    /// threshold rule's pick).
    pub basis: Option<crate::pool::placement::Basis>,
}

impl AutoPick {
    fn cell(&self) -> String {
        if self.picks == self.faster {
            format!("{} ✓", self.picks)
        } else {
            format!("{} ✗ ({:.2}× slower)", self.picks, self.ratio)
        }
    }
}

/// The device's copy rates (`DeviceLease::measure_bandwidth`), 10^9 bytes/s.
#[derive(Clone, Debug, Serialize)]
pub struct CopyRates {
    pub bytes: usize,
    pub h2d_pinned_gbps: f64,
    pub d2h_pinned_gbps: f64,
    pub h2d_pageable_gbps: f64,
    pub d2h_pageable_gbps: f64,
    /// Bytes copied per second; the memory traffic is twice this.
    pub d2d_gbps: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceReport {
    pub label: String,
    pub emulated: bool,
    pub info: GpuInfo,
    /// Clocks, bus and caches, as the driver reports them.
    pub facts: serde_json::Value,
    pub modules: Vec<ModuleLoad>,
    pub functions: Vec<KernelLimits>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy: Option<CopyRates>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_error: Option<String>,
}

/// One phase's wall time.
#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    pub phase: String,
    pub seconds: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub ok: usize,
    pub failed: usize,
    pub skipped: usize,
    /// The ops whose parity failed on some device, each once.
    pub failed_ops: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub gpu_ops_version: &'static str,
    pub level: CheckLevel,
    /// The seed of every case's random inputs (`--seed` replays them).
    pub seed: u64,
    /// Seconds since the Unix epoch when the check started.
    pub started_unix: u64,
    pub host_threads: usize,
    /// Why devices were or were not found (discovery's words).
    pub discovery: String,
    pub environment: Environment,
    pub devices: Vec<DeviceReport>,
    /// Every op with a device path, as the self-tests name them.
    pub registered_ops: Vec<String>,
    pub ops: Vec<OpEntry>,
    pub phases: Vec<Phase>,
    pub summary: Summary,
}

impl Report {
    pub fn summarize(&mut self) {
        let mut s = Summary::default();
        for e in &self.ops {
            match e.parity {
                Parity::Ok => s.ok += 1,
                Parity::Skipped => s.skipped += 1,
                Parity::Failed => {
                    s.failed += 1;
                    if !s.failed_ops.contains(&e.op) {
                        s.failed_ops.push(e.op.clone());
                    }
                }
            }
        }
        self.summary = s;
        self.place();
    }

    /// Fills each parity case's `auto`: per device, every timed case teaches a model of
    /// placement, each parity case held out in turn.
    fn place(&mut self) {
        use crate::pool::placement::replay::{leave_one_out, ratio, Row};
        let devices: Vec<String> = self.devices.iter().map(|d| d.label.clone()).collect();
        for device in devices {
            let timed: Vec<(usize, Row)> = self
                .ops
                .iter()
                .enumerate()
                .filter(|(_, e)| e.device == device && e.parity == Parity::Ok && e.size > 0)
                .filter_map(|(i, e)| {
                    let dev = e.timings.device_ms.as_ref()?.median;
                    let cpu = e.timings.cpu_ms?;
                    Some((
                        i,
                        Row {
                            op: e.job.clone(),
                            lane: e.lane.clone(),
                            size: e.size,
                            input_bytes: e.input_bytes,
                            device_seconds: dev / 1e3,
                            cpu_seconds: cpu.max(1e-4) / 1e3,
                            held_out: e.phase == "parity",
                        },
                    ))
                })
                .collect();
            let rows: Vec<Row> = timed.iter().map(|(_, r)| r.clone()).collect();
            for pick in leave_one_out(&rows) {
                let row = &rows[pick.row];
                let side = |device: bool| if device { "device" } else { "cpu" };
                self.ops[timed[pick.row].0].auto = Some(AutoPick {
                    picks: side(pick.device),
                    faster: side(row.device_seconds < row.cpu_seconds),
                    ratio: ratio(row),
                    basis: pick.basis,
                });
            }
        }
    }

    /// Of the parity cases whose sides differ by more than 1.25×: how many `auto` would
    /// have placed on the faster side, of how many.
    pub fn placement_score(&self) -> (usize, usize) {
        let decided: Vec<&AutoPick> = self
            .ops
            .iter()
            .filter_map(|e| e.auto.as_ref())
            .filter(|a| a.ratio > 1.25)
            .collect();
        let right = decided.iter().filter(|a| a.picks == a.faster).count();
        (right, decided.len())
    }

    /// The report for people: environment, devices, then one row per case.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "# gpu-ops check ({:?} level, seed {})\n\n{}\n\n",
            self.level, self.seed, self.discovery
        );
        out.push_str("| library | loaded | version | file |\n|---|---|---|---|\n");
        for l in &self.environment.libraries {
            let file = match (&l.path, l.loaded) {
                (Some(p), _) => p.clone(),
                (None, true) => "?".into(),
                (None, false) => format!(
                    "not found; tried {} in LD_LIBRARY_PATH [{}] and the loader's defaults",
                    l.tried_names.first().map_or("", String::as_str),
                    l.tried_folders.join(":")
                ),
            };
            let version = l.version.as_deref().unwrap_or("");
            out.push_str(&format!(
                "| {} ({}) | {} | {version} | {file} |\n",
                l.name, l.role, l.loaded
            ));
        }
        for d in &self.devices {
            out.push_str(&format!(
                "\n## {} — {} (compute {}, {} SMs, {:.1} GiB)\n\n",
                d.label,
                d.info.name,
                d.info.compute_capability,
                d.info.sm_count,
                d.info.memory_total_bytes as f64 / f64::from(1u32 << 30)
            ));
            if let Some(c) = &d.copy {
                out.push_str(&format!(
                    "Copies of {} MiB: host→device {:.1} GB/s pinned ({:.1} pageable), device→host {:.1} pinned ({:.1} pageable), device→device {:.1} GB/s.\n\n",
                    c.bytes >> 20, c.h2d_pinned_gbps, c.h2d_pageable_gbps, c.d2h_pinned_gbps, c.d2h_pageable_gbps, c.d2d_gbps
                ));
            }
            let compiled: f64 = d.modules.iter().map(|m| m.seconds).sum();
            let misfits: Vec<&str> = d
                .functions
                .iter()
                .filter(|f| !f.fits)
                .map(|f| f.kernel.as_str())
                .collect();
            out.push_str(&format!(
                "{} kernel modules loaded in {compiled:.1} s ({}); {} kernels, {}.\n",
                d.modules.len(),
                d.modules
                    .iter()
                    .map(|m| format!("{} {:.2} s {}", m.module, m.seconds, m.cache))
                    .collect::<Vec<_>>()
                    .join(", "),
                d.functions.len(),
                if misfits.is_empty() {
                    "every launch bound within the kernel's limit".to_string()
                } else {
                    format!("launch bound over the limit: {}", misfits.join(", "))
                }
            ));
        }
        out.push_str("\n| op | phase | case | device | parity | device ms | kernel ms | CPU ms | GB/s | GFLOP/s | of copy roofline | auto picks | note |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        let num =
            |x: Option<f64>, digits: usize| x.map_or(String::new(), |v| format!("{v:.digits$}"));
        for e in &self.ops {
            let t = &e.timings;
            let note = e.reason.as_deref().unwrap_or("").replace('|', "/");
            let note: String = note.chars().take(160).collect();
            out.push_str(&format!(
                "| {} | {} | {} | {} | {:?} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                e.op,
                e.phase,
                e.case,
                e.device,
                e.parity,
                num(t.device_ms.as_ref().map(|s| s.median), 3),
                num(t.kernel_ms.as_ref().map(|s| s.median), 3),
                num(t.cpu_ms, 1),
                num(t.gbps, 1),
                num(t.gflops, 1),
                num(t.of_copy_roofline.map(|r| r * 100.0), 0)
                    + if t.of_copy_roofline.is_some() {
                        " %"
                    } else {
                        ""
                    },
                e.auto.as_ref().map_or(String::new(), AutoPick::cell),
                note
            ));
        }
        out.push_str(&format!(
            "\n{} ok, {} failed, {} skipped{}. Phases: {}.\n",
            self.summary.ok,
            self.summary.failed,
            self.summary.skipped,
            if self.summary.failed_ops.is_empty() {
                String::new()
            } else {
                format!(" (failed: {})", self.summary.failed_ops.join(", "))
            },
            self.phases
                .iter()
                .map(|p| format!("{} {:.1} s", p.phase, p.seconds))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let (right, of) = self.placement_score();
        if of > 0 {
            out.push_str(&format!(
                "\nPlacement: of the {of} parity cases whose sides differ by more than 1.25×, `auto` (each predicted from the other cases) picks the faster side in {right} ({:.0} %).\n",
                100.0 * right as f64 / of as f64
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_take_the_median_of_finite_runs() {
        let s = Stats::of(&[3.0, 1.0, f64::NAN, 2.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.runs), (2.5, 1.0, 4));
        assert_eq!(Stats::of(&[5.0]).unwrap().median, 5.0);
        assert!(Stats::of(&[]).is_none());
    }

    #[test]
    fn rates_come_from_the_kernel_time_and_a_failure_keeps_its_reason() {
        let run = CaseRun {
            info: CaseInfo::labelled("x").with_bytes(2e9).with_flops(4e9),
            size: 10,
            input_bytes: 80,
            lane: String::new(),
            job: "",
            outcome: Err("value 3 differs".into()),
            device_ms: vec![4000.0],
            kernel_ms: vec![1000.0, 1000.0],
            cpu_ms: Some(5.0),
        };
        let e = OpEntry::measured("field_add", "parity", "cuda:0", run, Some(1.0));
        assert_eq!(e.parity, Parity::Failed);
        assert_eq!(e.reason.as_deref(), Some("value 3 differs"));
        assert_eq!(e.timings.gbps, Some(2.0));
        assert_eq!(e.timings.gflops, Some(4.0));
        assert_eq!(e.timings.of_copy_roofline, Some(1.0));
    }
}
