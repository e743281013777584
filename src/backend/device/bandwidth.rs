//! Copy bandwidth of a leased device, measured as NVIDIA's bandwidthTest does: one buffer
//! of `bytes` copied host→device and device→host from pageable memory (a `Vec`) and from
//! pinned memory (page-locked, what the DMA engines read directly), and device→device;
//! each the best of a few timed copies after one untimed, each timed to its completion.
//! On the emulated device every copy is a host memcpy: its figures describe this host.

use super::engine::EngineMemory;
use super::{DeviceError, DeviceLease};
use std::time::Instant;

/// Bytes per second (10^9 bytes = 1 GB) of each copy.
#[derive(Clone, Debug, PartialEq)]
pub struct CopyBandwidth {
    pub bytes: usize,
    pub h2d_pageable: f64,
    pub d2h_pageable: f64,
    pub h2d_pinned: f64,
    pub d2h_pinned: f64,
    /// Bytes copied per second; the memory traffic is twice this (each byte is read
    /// and written).
    pub d2d: f64,
}

impl CopyBandwidth {
    /// Rates from pageable copies only, which the pinned fields repeat: the engine has
    /// no page-locked memory.
    fn pageable_only(bytes: usize, h2d: f64, d2h: f64, d2d: f64) -> Self {
        CopyBandwidth {
            bytes,
            h2d_pageable: h2d,
            d2h_pageable: d2h,
            h2d_pinned: h2d,
            d2h_pinned: d2h,
            d2d,
        }
    }
}

/// The best rate of `repeats` timed runs of `copy` (after one untimed) moving `bytes`.
pub fn best_rate(
    bytes: usize,
    repeats: usize,
    mut copy: impl FnMut() -> Result<(), DeviceError>,
) -> Result<f64, DeviceError> {
    copy()?;
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        copy()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(bytes as f64 / best.max(1e-9))
}

impl DeviceLease<'_> {
    /// Measures each copy of `bytes` bytes (rounded down to whole 4-byte words), best of
    /// `repeats`.
    pub fn measure_bandwidth(
        &self,
        bytes: usize,
        repeats: usize,
    ) -> Result<CopyBandwidth, DeviceError> {
        let len = (bytes / 4).max(1);
        let bytes = len * 4;
        let mut pageable = vec![1u32; len];
        let mut a = self.alloc_zeros::<u32>(len)?;
        let mut b = self.alloc_zeros::<u32>(len)?;
        let (a, b) = (&mut *a.memory, &mut *b.memory);
        let (engine, stream) = (self.engine(), self.stream());
        let (h2d, d2h) = copy_rates(self, a, pageable.as_mut_ptr().cast(), bytes, repeats)?;
        let d2d = best_rate(bytes, repeats, || {
            engine.copy(stream, a, b)?;
            engine.synchronize(stream)
        })?;
        let Some(pinned) = engine.pinned_host(bytes)? else {
            // An engine without page-locked memory.
            return Ok(CopyBandwidth::pageable_only(bytes, h2d, d2h, d2d));
        };
        let (h2d_pinned, d2h_pinned) = copy_rates(self, a, pinned.as_mut_ptr(), bytes, repeats)?;
        Ok(CopyBandwidth {
            bytes,
            h2d_pageable: h2d,
            d2h_pageable: d2h,
            h2d_pinned,
            d2h_pinned,
            d2d,
        })
    }
}

/// The best host→device and device→host rates between `host` and `device`, each copy
/// timed to its completion.
fn copy_rates(
    lease: &DeviceLease<'_>,
    device: &mut dyn EngineMemory,
    host: *mut u8,
    bytes: usize,
    repeats: usize,
) -> Result<(f64, f64), DeviceError> {
    let (engine, stream) = (lease.engine(), lease.stream());
    let h2d = best_rate(bytes, repeats, || {
        // SAFETY: `host` and `device` each hold `bytes` bytes; `device` is the engine's.
        unsafe { engine.write(stream, device, host, bytes)? };
        engine.synchronize(stream)
    })?;
    // SAFETY: as above; a read returns when the bytes are on the host.
    let d2h = best_rate(bytes, repeats, || unsafe {
        engine.read(stream, device, host, bytes)
    })?;
    Ok((h2d, d2h))
}
