//! The kernel clock of `gpu-ops check`: while it runs, every launch (and every vendor
//! library call) is bracketed by a pair of device timestamps (CUDA events) on the device's
//! stream, so the check reports the kernels' own time apart from uploads and downloads.
//! An engine without device clocks (HIP, the emulated device) is timed on the host, its
//! stream synchronised after each clocked call. Off (the server's case), a launch pays one
//! uncontended lock and nothing else.

use super::engine::{DeviceEngine, EngineStream, Timestamp};
use super::{DeviceLease, GpuDevice};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// What one clocked stretch of work recorded.
#[derive(Default)]
pub(crate) struct KernelClock {
    /// (start, end) of each clocked call on an engine with device clocks, read when the
    /// clock stops.
    stamps: Vec<(Box<dyn Timestamp>, Box<dyn Timestamp>)>,
    /// Host-timed work (engines without device clocks), in milliseconds.
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
    /// to finish it; `None` when it was off or a timestamp could not be read.
    pub fn stop_kernel_clock(&self) -> Option<f64> {
        let clock = self.clock().take()?;
        let mut total = clock.host_ms;
        for (start, end) in &clock.stamps {
            total += end.ms_since(&**start)?;
        }
        Some(total)
    }

    fn clock(&self) -> MutexGuard<'_, Option<KernelClock>> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `work` (one launch or one library call on `engine`'s `stream`), clocked when
    /// the clock is on: between two device timestamps where the engine has them, else on
    /// the host with the stream synchronised after it, so the time is the work's own.
    fn clocked<T>(
        &self,
        engine: &dyn DeviceEngine,
        stream: &dyn EngineStream,
        work: impl FnOnce() -> T,
    ) -> T {
        if self.clock().is_none() {
            return work();
        }
        match engine.timestamp(stream) {
            Some(start) => {
                let out = work();
                let end = engine.timestamp(stream);
                if let (Some(end), Some(clock)) = (end, self.clock().as_mut()) {
                    clock.stamps.push((start, end));
                }
                out
            }
            None => {
                // Work queued before (copies, zeroing) is not this stretch's.
                if let Err(e) = engine.synchronize(stream) {
                    tracing::warn!(error = %e, "kernel clock: the device failed before a clocked call");
                }
                let started = Instant::now();
                let out = work();
                // A failure here shows again in the job's next copy, where it is handled as
                // the job's error; the clock only loses this stretch.
                if let Err(e) = engine.synchronize(stream) {
                    tracing::warn!(error = %e, "kernel clock: the device failed in a clocked call");
                }
                if let Some(clock) = self.clock().as_mut() {
                    clock.host_ms += started.elapsed().as_secs_f64() * 1e3;
                }
                out
            }
        }
    }
}

impl DeviceLease<'_> {
    /// Runs `work` (one launch or one library call on the lease's stream), clocked when
    /// the device's clock is on.
    pub(crate) fn clocked<T>(&self, work: impl FnOnce() -> T) -> T {
        self.device.clocked(self.engine(), self.stream(), work)
    }
}
