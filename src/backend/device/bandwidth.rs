//! Copy bandwidth of a leased device, measured as NVIDIA's bandwidthTest does: one buffer
//! of `bytes` copied host→device and device→host from pageable memory (a `Vec`) and from
//! pinned memory (page-locked, what the DMA engines read directly), and device→device;
//! each the best of a few timed copies after one untimed, each timed to its completion.
//! On the emulated device every copy is a host memcpy: its figures describe this host.

use super::buffer::Memory;
use super::{DeviceError, DeviceLease, Engine};
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
    /// no page-locked memory (HIP today), or its host memory is all one (emulated).
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
        let rate =
            |copy: &mut dyn FnMut() -> Result<(), DeviceError>| best_rate(bytes, repeats, copy);
        match (self.engine(), &mut a.memory, &mut b.memory) {
            (Engine::Cuda(c), Memory::Cuda(da), Memory::Cuda(db)) => {
                let mut pinned = c.pinned_host::<u32>(len)?;
                let h2d_pageable = rate(&mut || {
                    c.stream.memcpy_htod(&pageable, da)?;
                    Ok(c.stream.synchronize()?)
                })?;
                let d2h_pageable = rate(&mut || {
                    c.stream.memcpy_dtoh(&*da, &mut pageable)?;
                    Ok(c.stream.synchronize()?)
                })?;
                let h2d_pinned = rate(&mut || {
                    c.stream.memcpy_htod(&pinned, da)?;
                    Ok(c.stream.synchronize()?)
                })?;
                let d2h_pinned = rate(&mut || {
                    c.stream.memcpy_dtoh(&*da, &mut pinned)?;
                    Ok(c.stream.synchronize()?)
                })?;
                let d2d = rate(&mut || {
                    c.stream.memcpy_dtod(&*da, db)?;
                    Ok(c.stream.synchronize()?)
                })?;
                Ok(CopyBandwidth {
                    bytes,
                    h2d_pageable,
                    d2h_pageable,
                    h2d_pinned,
                    d2h_pinned,
                    d2d,
                })
            }
            (Engine::Hip(h), Memory::Hip(ma), Memory::Hip(mb)) => {
                // Pageable host memory only: the engine allocates no page-locked memory
                // yet, so the pinned figures repeat the pageable ones (docs/GPU.md).
                let h2d = rate(&mut || {
                    // SAFETY: `pageable` holds `bytes` bytes, as does `ma`.
                    unsafe { h.write(ma, pageable.as_ptr().cast(), bytes) }
                })?;
                let d2h = rate(&mut || {
                    // SAFETY: as above.
                    unsafe { h.read(ma, pageable.as_mut_ptr().cast(), bytes) }
                })?;
                let d2d = rate(&mut || {
                    h.copy(ma, mb)?;
                    h.synchronize()
                })?;
                Ok(CopyBandwidth::pageable_only(bytes, h2d, d2h, d2d))
            }
            (Engine::Emulated(_), Memory::Host(ma), Memory::Host(mb)) => {
                // Host memory is all the emulated device has: pinned and pageable are the
                // same copy.
                let h2d = rate(&mut || {
                    // SAFETY: `pageable` holds `bytes` bytes, as does `ma`.
                    unsafe { ma.write(pageable.as_ptr().cast(), bytes) };
                    Ok(())
                })?;
                let d2h = rate(&mut || {
                    // SAFETY: as above.
                    unsafe { ma.read(pageable.as_mut_ptr().cast(), bytes) };
                    Ok(())
                })?;
                let d2d = rate(&mut || {
                    mb.copy_from(ma);
                    Ok(())
                })?;
                Ok(CopyBandwidth::pageable_only(bytes, h2d, d2h, d2d))
            }
            _ => Err(super::buffer::foreign()),
        }
    }
}
