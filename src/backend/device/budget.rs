//! How much device memory a device's jobs may use together: `--gpu-memory-limit-mib`,
//! or a share of what the engine says is free, or (an engine that cannot tell, wgpu's)
//! what the engine allows.

use super::GpuDevice;
use std::sync::atomic::Ordering;

impl GpuDevice {
    /// The device memory its jobs may use together (`--gpu-memory-limit-mib`, 0 for half
    /// of the memory free when a job starts on the idle device).
    pub fn set_memory_limit(&self, bytes: u64) {
        self.memory_limit.store(bytes, Ordering::Relaxed);
    }

    /// Bytes the device's jobs may allocate together, as the idle device would give them
    /// now: `--gpu-memory-limit-mib` but never more than is free, or without a limit half
    /// of what is free (the other half is headroom for the driver and the table cache).
    pub fn memory_budget(&self) -> usize {
        let limit = self.memory_limit.load(Ordering::Relaxed) as usize;
        let Some((free, _)) = self.memory() else {
            // The engine cannot tell (wgpu): the limit, else what its engine allows.
            return match limit {
                0 => self.unknown_memory_budget.load(Ordering::Relaxed) as usize,
                limit => limit,
            };
        };
        match limit {
            0 => free as usize / 2,
            limit => limit.min(free as usize),
        }
    }

    /// The budget of a device whose engine reports no memory sizes, without
    /// `--gpu-memory-limit-mib` (a wgpu adapter: its largest storage binding, so a job
    /// larger than one binding runs in passes).
    pub fn set_unknown_memory_budget(&self, bytes: u64) {
        self.unknown_memory_budget.store(bytes, Ordering::Relaxed);
    }

    /// (free, total) bytes now.
    pub fn memory(&self) -> Option<(u64, u64)> {
        self.engine().memory()
    }
}
