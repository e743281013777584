//! A job and the place its output lands. The queue carries jobs of every type as
//! `Arc<dyn Runnable>`; the submitter keeps the typed `Slot` and takes the output from
//! it once the worker replies, so no output is ever cast back from an untyped value.

use super::{Completed, JobError, RunInfo};
use crate::backend::{DeviceError, DeviceLease, Job};
use std::sync::{Arc, Mutex};

/// A shadow check: the CPU twin's output compared with a kept copy of the device's, and
/// the seconds the twin took (a CPU sample for placement).
pub(super) type ShadowCheck = Box<dyn FnOnce() -> (Result<(), String>, f64) + Send>;

/// What the workers need of a job, whatever its type.
pub(super) trait Runnable: Send + Sync {
    fn name(&self) -> &'static str;
    fn size(&self) -> usize;
    fn input_bytes(&self) -> usize;
    fn gpu_threshold(&self) -> usize;
    fn placement_lane(&self) -> std::borrow::Cow<'static, str>;
    fn device_refusal(&self) -> Option<String>;
    fn runs_inline(&self) -> bool;
    fn resident_on(&self) -> Option<usize>;
    fn run_cpu(&self);
    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<(), DeviceError>;
    /// After `run_device`: a copy of its output and the check against the CPU twin, to
    /// run off the request path. None if the output was already taken.
    fn shadow(self: Arc<Self>) -> Option<ShadowCheck>;
}

pub(super) struct Slot<J: Job> {
    job: J,
    output: Mutex<Option<J::Output>>,
}

impl<J: Job> Slot<J> {
    pub(super) fn new(job: J) -> Self {
        Self {
            job,
            output: Mutex::new(None),
        }
    }

    fn put(&self, output: J::Output) {
        *self.output.lock().unwrap_or_else(|e| e.into_inner()) = Some(output);
    }

    /// The output of a job whose run was reported by `run`.
    pub(super) fn completed(&self, run: RunInfo) -> Result<Completed<J::Output>, JobError> {
        let output = self
            .output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| JobError::Internal("the job reported success without output".into()))?;
        Ok(Completed { output, run })
    }
}

impl<J: Job> Runnable for Slot<J> {
    fn name(&self) -> &'static str {
        self.job.name()
    }

    fn size(&self) -> usize {
        self.job.size()
    }

    fn input_bytes(&self) -> usize {
        self.job.input_bytes()
    }

    fn gpu_threshold(&self) -> usize {
        self.job.gpu_threshold()
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.job.placement_lane()
    }

    fn device_refusal(&self) -> Option<String> {
        self.job.device_refusal()
    }

    fn runs_inline(&self) -> bool {
        self.job.runs_inline()
    }

    fn resident_on(&self) -> Option<usize> {
        self.job.resident_on()
    }

    fn run_cpu(&self) {
        self.put(self.job.run_cpu());
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<(), DeviceError> {
        self.put(self.job.run_device(dev)?);
        Ok(())
    }

    fn shadow(self: Arc<Self>) -> Option<ShadowCheck> {
        let device = self
            .output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        Some(Box::new(move || {
            let started = std::time::Instant::now();
            let cpu = self.job.run_cpu();
            let seconds = started.elapsed().as_secs_f64();
            (self.job.agrees(&device, &cpu), seconds)
        }))
    }
}
