//! Device gauges from NVML, sampled on an interval on a plain thread (NVML calls block).
//! No NVIDIA driver is not an error: the sampler just does not start.

use crate::metrics::Metrics;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::Nvml;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

static DRIVER_VERSION: OnceLock<String> = OnceLock::new();

/// The NVIDIA driver version ("580.65.06"), once the sampler has started.
pub fn driver_version() -> Option<&'static str> {
    DRIVER_VERSION.get().map(String::as_str)
}

/// Starts sampling if NVML loads; returns why not otherwise.
pub fn spawn_sampler(metrics: Arc<Metrics>, interval: Duration) -> Result<(), String> {
    // Without libcuda there is no NVIDIA driver, and so no NVML to load.
    if !super::cuda::driver_available() {
        return Err("no NVIDIA driver".into());
    }
    let nvml = Nvml::init().map_err(|e| format!("NVML unavailable: {e}"))?;
    if let Ok(v) = nvml.sys_driver_version() {
        let _ = DRIVER_VERSION.set(v);
    }
    std::thread::Builder::new()
        .name("gpu-ops-nvml".into())
        .spawn(move || loop {
            sample(&nvml, &metrics);
            std::thread::sleep(interval);
        })
        .map_err(|e| format!("cannot start the NVML thread: {e}"))?;
    Ok(())
}

fn sample(nvml: &Nvml, m: &Metrics) {
    let Ok(count) = nvml.device_count() else {
        return;
    };
    for index in 0..count {
        let Ok(dev) = nvml.device_by_index(index) else {
            continue;
        };
        let gpu = index.to_string();
        let uuid = dev.uuid().unwrap_or_default();
        let labels = [gpu.as_str(), uuid.as_str()];
        if let Ok(u) = dev.utilization_rates() {
            m.gpu_utilization
                .with_label_values(&labels)
                .set(f64::from(u.gpu) / 100.0);
        }
        if let Ok(mem) = dev.memory_info() {
            m.gpu_memory_used
                .with_label_values(&labels)
                .set(mem.used as f64);
            m.gpu_memory_total
                .with_label_values(&labels)
                .set(mem.total as f64);
        }
        if let Ok(t) = dev.temperature(TemperatureSensor::Gpu) {
            m.gpu_temperature
                .with_label_values(&labels)
                .set(f64::from(t));
        }
        if let Ok(mw) = dev.power_usage() {
            m.gpu_power
                .with_label_values(&labels)
                .set(f64::from(mw) / 1000.0);
        }
        if let Ok(mhz) = dev.clock_info(Clock::SM) {
            m.gpu_sm_clock
                .with_label_values(&labels)
                .set(f64::from(mhz) * 1e6);
        }
    }
}
