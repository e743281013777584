//! Holding every device to the CPU twins: the self-test a device passes op by op before it
//! is ready, the shadow checks of a fraction of device jobs, and the state of each op on
//! each device. An op that fails either is quarantined on that device (its work goes to
//! the CPU, or to another device) with the reason, until the device is re-probed.

use super::device::DeviceLease;
use super::measure::{measure_job, CaseInfo, CaseRun, Repeats};
use super::Job;
use serde::Serialize;

/// One self-test case: a small job with edge values, run on the device and on the CPU.
/// Domains provide them (`ops::self_tests`); backend/ knows none of them.
pub trait SelfTest: Send + Sync {
    /// The op it vouches for, as `Job::name` says it.
    fn op(&self) -> &'static str;
    fn run(&self, dev: &DeviceLease<'_>) -> Result<(), String>;
    /// Whether the device has what the test checks (a vendor library, say); a test that
    /// does not apply records no state.
    fn applies(&self, _dev: &DeviceLease<'_>) -> bool {
        true
    }

    /// For a vendor library's test: the ops whose device work the library may do. A
    /// shadow-check mismatch of one of them is blamed on the library first.
    fn library_for(&self) -> &'static [&'static str] {
        &[]
    }

    /// `gpu-ops check`: every case run as `run` does, timed (`measure::measure_job`).
    /// This default times the whole test as one case, for tests that are not a list of
    /// jobs.
    fn measure(&self, dev: &DeviceLease<'_>, _repeats: Repeats) -> Vec<CaseRun> {
        let started = std::time::Instant::now();
        let outcome = self.run(dev);
        let mut case = CaseRun::new(
            CaseInfo::labelled("the whole self-test, CPU twin included"),
            0,
            0,
        );
        case.outcome = outcome;
        case.device_ms.push(started.elapsed().as_secs_f64() * 1e3);
        vec![case]
    }
}

/// Jobs of one op as a self-test: each device output held to `Job::agrees` against its
/// CPU twin.
pub struct JobCheck<J: Job> {
    op: &'static str,
    jobs: Vec<J>,
    /// What each job is, for the check's report.
    infos: Vec<CaseInfo>,
}

impl<J: Job> JobCheck<J> {
    /// `jobs` is non-empty and of one op.
    pub fn boxed(jobs: Vec<J>) -> Box<dyn SelfTest> {
        let infos = jobs.iter().map(default_info).collect();
        Self::with_infos(jobs, infos)
    }

    /// Jobs of one op, each with what the check reports of it (the check's cases at
    /// production sizes).
    pub fn described(cases: Vec<(CaseInfo, J)>) -> Box<dyn SelfTest> {
        let (infos, jobs) = cases.into_iter().unzip();
        Self::with_infos(jobs, infos)
    }

    fn with_infos(jobs: Vec<J>, infos: Vec<CaseInfo>) -> Box<dyn SelfTest> {
        let op = jobs.first().map_or("none", Job::name);
        Box::new(Self { op, jobs, infos })
    }
}

/// A self-test case's label: its index and size.
fn default_info<J: Job>(job: &J) -> CaseInfo {
    CaseInfo::labelled(format!("self-test case, size {}", job.size()))
}

impl<J: Job> SelfTest for JobCheck<J> {
    fn op(&self) -> &'static str {
        self.op
    }

    fn run(&self, dev: &DeviceLease<'_>) -> Result<(), String> {
        for (i, job) in self.jobs.iter().enumerate() {
            let device = job
                .run_device(dev)
                .map_err(|e| format!("case {i}: the device failed: {e}"))?;
            job.agrees(&device, &job.run_cpu())
                .map_err(|why| format!("case {i}: {why}"))?;
        }
        Ok(())
    }

    fn measure(&self, dev: &DeviceLease<'_>, repeats: Repeats) -> Vec<CaseRun> {
        self.jobs
            .iter()
            .zip(&self.infos)
            .map(|(job, info)| measure_job(job, info.clone(), dev, repeats, J::run_device))
            .collect()
    }
}

/// Jobs of one op forced through a vendor library (cuBLASLt, cuDNN) and held to the CPU
/// twin: the library is verified under its own op name, and used only where this passed.
/// It applies only where the library opened.
pub struct LibraryCheck<J: Job> {
    pub op: &'static str,
    /// The ops whose device work the library may do (`SelfTest::library_for`).
    pub serves: &'static [&'static str],
    pub jobs: Vec<J>,
    pub opened: fn(&DeviceLease<'_>) -> bool,
    pub run: fn(&J, &DeviceLease<'_>) -> Result<J::Output, super::DeviceError>,
    /// What the check reports of each job (`gpu-ops check`); empty: each job's size.
    pub infos: Vec<CaseInfo>,
}

impl<J: Job> SelfTest for LibraryCheck<J> {
    fn op(&self) -> &'static str {
        self.op
    }

    fn applies(&self, dev: &DeviceLease<'_>) -> bool {
        (self.opened)(dev)
    }

    fn library_for(&self) -> &'static [&'static str] {
        self.serves
    }

    fn run(&self, dev: &DeviceLease<'_>) -> Result<(), String> {
        for (i, job) in self.jobs.iter().enumerate() {
            let device =
                (self.run)(job, dev).map_err(|e| format!("case {i}: the library failed: {e}"))?;
            job.agrees(&device, &job.run_cpu())
                .map_err(|why| format!("case {i}: {why}"))?;
        }
        Ok(())
    }

    fn measure(&self, dev: &DeviceLease<'_>, repeats: Repeats) -> Vec<CaseRun> {
        self.jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                let info = self.infos.get(i).cloned();
                let info = info.unwrap_or_else(|| default_info(job));
                measure_job(job, info, dev, repeats, self.run)
            })
            .collect()
    }
}

/// `Job::agrees` for integer outputs: equal, or where the device differs.
pub fn exactly<T: PartialEq>(device: &T, cpu: &T) -> Result<(), String> {
    if device == cpu {
        Ok(())
    } else {
        Err("the device's output differs from the CPU twin's".into())
    }
}

/// `Job::agrees` for float outputs the device must match bit for bit (exact DP noise):
/// the first index whose bits differ.
pub fn same_bits(device: &[f64], cpu: &[f64]) -> Result<(), String> {
    if device.len() != cpu.len() {
        return Err(format!(
            "{} values from the device, {} from the CPU",
            device.len(),
            cpu.len()
        ));
    }
    match device
        .iter()
        .zip(cpu)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        None => Ok(()),
        Some(i) => Err(format!(
            "value {i}: {} on the device, {} on the CPU",
            device[i], cpu[i]
        )),
    }
}

/// Where an op stands on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    /// Passed the self-test; no shadow check has disagreed since.
    Verified,
    /// Failed the self-test or a shadow check: served elsewhere until a re-probe passes.
    Quarantined,
    /// The device's engine has no kernels for it (a wgpu adapter, for most ops): served
    /// by the CPU or another device.
    Unavailable,
}

/// Why an op is `Unavailable` on a device (`/device`, `gpu-ops check`).
pub const NO_KERNELS: &str = "no kernels for it on this engine";

/// `/device`'s entry for one op on one device.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OpStatus {
    pub op: String,
    pub state: OpState,
    /// Why it is quarantined, or unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
