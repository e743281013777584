//! Devices and the two executors. Owns CUDA contexts and the CPU thread pool; knows
//! nothing about HTTP or encodings.

pub mod cpu;
pub mod cuda;
pub mod device;
pub mod emulated;
mod job;
mod nvml;

use crate::metrics::Metrics;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use utoipa::ToSchema;

pub use cpu::CpuExecutor;
pub use device::{
    DeviceBuffer, DeviceError, DeviceErrorKind, DeviceLease, Element, GpuDevice, GpuInfo,
};
pub use job::{Batchable, Job};
pub use nvml::{driver_version as nvml_driver_version, spawn_sampler as spawn_nvml_sampler};

/// Where a job may run, as the server is configured (`--backend`) or a request asks.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// CUDA when a healthy device exists and the input is large enough, else the CPU.
    #[default]
    Auto,
    Cuda,
    Cpu,
}

/// The executor a job ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Cpu,
    Cuda,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
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
        }
    }

    /// Called once, when discovery and kernel compilation are done.
    pub fn set_gpus(&self, gpus: Vec<Arc<GpuDevice>>, reason: String) {
        for g in &gpus {
            self.health_gauge(g).set(1);
        }
        let _ = self.gpus.set(gpus);
        *self.reason.write().unwrap_or_else(|e| e.into_inner()) = reason;
    }

    /// The healthy GPUs in turn, so concurrent work spreads over them.
    pub fn pick_gpu(&self) -> Option<Arc<GpuDevice>> {
        let healthy: Vec<_> = self.healthy_gpus().collect();
        if healthy.is_empty() {
            return None;
        }
        Some(healthy[self.next_gpu.fetch_add(1, Ordering::Relaxed) % healthy.len()].clone())
    }

    /// What happens when work fails on a device, for every caller: logged, a fatal
    /// error takes the device out of service (`gpu_ops_device_healthy` 0), and a rerun on
    /// the CPU is counted in `gpu_ops_fallbacks_total{op, reason}`.
    pub fn device_failed(&self, dev: &GpuDevice, op: &str, err: &DeviceError, rerun_on_cpu: bool) {
        tracing::warn!(op, device = dev.info.ordinal, error = %err, fallback = rerun_on_cpu, "device work failed");
        if err.kind == DeviceErrorKind::Fatal {
            dev.mark_unhealthy(&err.message);
            self.health_gauge(dev).set(0);
        }
        if rerun_on_cpu {
            self.count_fallback(op, err.reason());
        }
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
        if self.healthy_gpus().next().is_some() {
            BackendKind::Cuda
        } else {
            BackendKind::Cpu
        }
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
