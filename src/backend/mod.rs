//! Devices and the two executors. Owns CUDA contexts and the CPU thread pool; knows
//! nothing about HTTP or encodings.

pub mod cpu;
pub mod cuda;
mod nvml;

use serde::{Deserialize, Serialize};
use std::sync::{Arc, OnceLock, RwLock};
use utoipa::ToSchema;

pub use cpu::CpuExecutor;
pub use cuda::{CudaDevice, DeviceError};
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

/// The executors, and why CUDA is or is not in use.
pub struct Backends {
    pub mode: BackendChoice,
    pub cpu: Arc<CpuExecutor>,
    gpus: OnceLock<Vec<Arc<CudaDevice>>>,
    reason: RwLock<String>,
}

impl Backends {
    pub fn new(mode: BackendChoice, cpu: CpuExecutor) -> Self {
        Self {
            mode,
            cpu: Arc::new(cpu),
            gpus: OnceLock::new(),
            reason: RwLock::new("device discovery has not finished".into()),
        }
    }

    /// Called once, when discovery and kernel compilation are done.
    pub fn set_gpus(&self, gpus: Vec<Arc<CudaDevice>>, reason: String) {
        let _ = self.gpus.set(gpus);
        *self.reason.write().unwrap_or_else(|e| e.into_inner()) = reason;
    }

    pub fn discovery_done(&self) -> bool {
        self.gpus.get().is_some()
    }

    pub fn gpus(&self) -> &[Arc<CudaDevice>] {
        self.gpus.get().map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn healthy_gpus(&self) -> impl Iterator<Item = &Arc<CudaDevice>> {
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
