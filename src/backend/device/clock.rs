//! The kernel clock of `gpu-ops check`: while it runs, every launch (and every vendor
//! library call) is bracketed by a pair of CUDA events on the device's stream, so the
//! check reports the kernels' own time apart from uploads and downloads. On the emulated
//! device a launch runs to completion before it returns, so its wall time is its time.
//! Off (the server's case), a launch pays one uncontended lock and nothing else.

use super::{DeviceLease, Engine, GpuDevice};
use cudarc::driver::{sys::CUevent_flags, CudaEvent, CudaStream};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// What one clocked stretch of work recorded.
#[derive(Default)]
pub(crate) struct KernelClock {
    /// (start, end) of each clocked CUDA call, read when the clock stops.
    events: Vec<(CudaEvent, CudaEvent)>,
    /// Emulated launches' wall time, in milliseconds.
    host_ms: f64,
}

/// A device's clock: `None` while it is off.
pub(crate) type ClockSlot = Mutex<Option<KernelClock>>;

impl GpuDevice {
    /// Starts clocking this device's launches (the check runs one job at a time).
    pub fn start_kernel_clock(&self) {
        *self.clock() = Some(KernelClock::default());
    }

    /// Stops the clock: the clocked work's total in milliseconds, waiting for the device
    /// to finish it; `None` when it was off or an event could not be read.
    pub fn stop_kernel_clock(&self) -> Option<f64> {
        let clock = self.clock().take()?;
        let mut total = clock.host_ms;
        for (start, end) in &clock.events {
            total += f64::from(start.elapsed_ms(end).ok()?);
        }
        Some(total)
    }

    /// Whether the clock is on (an engine without events synchronises its launches then).
    pub(crate) fn kernel_clock_running(&self) -> bool {
        self.clock().is_some()
    }

    fn clock(&self) -> MutexGuard<'_, Option<KernelClock>> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl GpuDevice {
    /// Runs `work` (one launch or one library call, on `stream` for CUDA; `None` on the
    /// emulated device, whose launches finish before they return), clocked when the
    /// clock is on.
    pub(crate) fn clocked<T>(&self, stream: Option<&CudaStream>, work: impl FnOnce() -> T) -> T {
        if self.clock().is_none() {
            return work();
        }
        match stream {
            Some(stream) => {
                let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
                let start = stream.record_event(timing).ok();
                let out = work();
                let end = stream.record_event(timing).ok();
                if let (Some(start), Some(end), Some(clock)) = (start, end, self.clock().as_mut()) {
                    clock.events.push((start, end));
                }
                out
            }
            None => {
                let started = Instant::now();
                let out = work();
                if let Some(clock) = self.clock().as_mut() {
                    clock.host_ms += started.elapsed().as_secs_f64() * 1e3;
                }
                out
            }
        }
    }
}

impl DeviceLease<'_> {
    /// Runs `work` (one library call on the device's stream), clocked when the device's
    /// clock is on.
    pub(crate) fn clocked<T>(&self, work: impl FnOnce() -> T) -> T {
        let stream = match self.engine() {
            Engine::Cuda(c) => Some(&*c.stream),
            // Host timing, the work synchronised inside (`HipEngine` waits for reads).
            Engine::Hip(_) | Engine::Emulated(_) => None,
        };
        self.device.clocked(stream, work)
    }
}
