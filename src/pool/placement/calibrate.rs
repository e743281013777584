//! The calibration a device gets when it comes up, after its self-test and after the
//! server is ready: the op's self-test and quick check cases run once on the device and
//! once on the CPU (`SelfTest::measure`, the check's own timing), each run a sample of
//! the model. Bounded by a time budget (`--placement-calibration-budget`): a case starts
//! only while the budget lasts, so it ends within the budget and one case. A case that
//! fails is left out and logged: calibration retires and quarantines nothing, that is
//! the self-test's and the shadow checks' work.

use super::{CalibrationRecord, Placement, Shape, Side};
use crate::backend::measure::{CaseRun, Repeats};
use crate::backend::verify::SelfTest;
use crate::backend::GpuDevice;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// Runs `tests` on `dev` and the CPU within `budget`, recording every agreeing case;
/// returns what it did (also kept for `/device`). Call from a blocking thread.
pub fn calibrate(
    placement: &Placement,
    dev: &GpuDevice,
    tests: &[Box<dyn SelfTest>],
    budget: Duration,
) -> CalibrationRecord {
    let started = Instant::now();
    let device = dev.info.ordinal;
    let (mut cases, mut over_budget, mut failed, mut error) = (0, 0, 0, None::<String>);
    let mut longest = 0f64;
    let once = Repeats {
        warmup: 0,
        timed: 1,
    };
    for test in tests {
        // A vendor library's check runs under its own name, which no job has: the op's
        // own cases already time whatever path its jobs take.
        if !test.library_for().is_empty() || !dev.op_usable(test.op()) {
            continue;
        }
        if started.elapsed() >= budget {
            over_budget += 1;
            continue;
        }
        let test_started = Instant::now();
        let runs = match dev.lease() {
            Ok(lease) if !test.applies(&lease) => continue,
            Ok(lease) => catch_unwind(AssertUnwindSafe(|| test.measure(&lease, once)))
                .map_err(|_| format!("{}: the calibration run panicked", test.op())),
            Err(e) => Err(format!("{}: no lease: {e}", test.op())),
        };
        let runs = match runs {
            Ok(runs) => runs,
            Err(why) => {
                failed += 1;
                error.get_or_insert(why);
                continue;
            }
        };
        longest = longest.max(test_started.elapsed().as_secs_f64());
        // A test timed as a whole (no size, no CPU twin of its own) teaches nothing.
        for run in runs.iter().filter(|r| r.size > 0) {
            match record(placement, test.op(), device, run) {
                Ok(()) => cases += 1,
                Err(why) => {
                    failed += 1;
                    tracing::warn!(device, op = test.op(), reason = %why, "calibration case left out");
                    error.get_or_insert(format!("{}: {why}", test.op()));
                }
            }
        }
    }
    let record = CalibrationRecord {
        device,
        finished_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        seconds: started.elapsed().as_secs_f64(),
        cases,
        over_budget,
        failed,
        longest_test_seconds: longest,
        error,
    };
    tracing::info!(
        device,
        cases = record.cases,
        over_budget = record.over_budget,
        failed = record.failed,
        seconds = record.seconds,
        "placement calibration finished"
    );
    placement.calibrated(record.clone());
    record
}

/// One measured case as a device sample and a CPU sample.
fn record(
    placement: &Placement,
    op: &'static str,
    device: usize,
    run: &CaseRun,
) -> Result<(), String> {
    run.outcome.clone()?;
    let (Some(dev_ms), Some(cpu_ms)) = (run.device_ms.iter().copied().reduce(f64::min), run.cpu_ms)
    else {
        return Err("the case was not timed on both sides".into());
    };
    let job = Shape {
        op,
        lane: &run.lane,
        size: run.size,
        bytes: run.input_bytes,
    };
    placement.observed(job, Side::Device(device), dev_ms / 1e3);
    placement.observed(job, Side::Cpu, cpu_ms / 1e3);
    Ok(())
}
