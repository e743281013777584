//! Whole buffers through page-locked staging: an operand a kernel needs all at once (an
//! NTT's vector, an MSM's points and scalars, DP's gradients, Shamir's coefficient rows)
//! is uploaded, and a result downloaded, in staging-buffer-sized pieces that alternate
//! between two page-locked buffers on the lease's stream. The host fills (or empties)
//! one buffer while the engine copies the other at the bus's page-locked speed; before
//! reusing a buffer the host waits for the event recorded after its last copy, not for
//! the whole stream, so the two overlap. The emulated device checks both waits: a
//! buffer touched before its copy has finished is refused there.
//!
//! A copy below `STAGED_COPY_MIN_BYTES` stays pageable (a buffer's round of waits costs
//! more than it saves); one that finds no staging buffer runs pageable and is counted
//! as a fallback, as a streamed job's is.

use super::engine::EngineEvent;
use super::lease::CopyCounts;
use super::pinned_body::{self, Registration};
use super::staging::{StagingBuffer, STAGING_BUFFER_BYTES};
use super::{DeviceBuffer, DeviceError, DeviceLease, Element};
use std::ops::Range;

/// The smallest copy that goes through staging: 1 MiB.
pub const STAGED_COPY_MIN_BYTES: usize = 1 << 20;

/// Staging buffers a whole-buffer copy alternates between.
const BUFFERS: usize = 2;

/// One staging buffer of a copy, and the copy queued on it that the host has not seen
/// finish: the event after it, and for a download the bytes to collect.
struct Slot {
    staging: StagingBuffer,
    in_flight: bool,
    done: Option<Box<dyn EngineEvent>>,
    to_collect: Option<Range<usize>>,
}

/// The slots of one copy; on an early return, each with a copy in flight is waited for
/// before its buffer goes back for reuse (or, if the wait fails, is freed).
struct Slots<'l, 'd> {
    lease: &'l DeviceLease<'d>,
    slots: Vec<Slot>,
}

impl Slots<'_, '_> {
    /// Waits until slot `i`'s last copy has finished: for its event, or, if recording
    /// the event failed, for the stream.
    fn settle(&mut self, i: usize) -> Result<(), DeviceError> {
        let slot = &mut self.slots[i];
        if !slot.in_flight {
            return Ok(());
        }
        let waited = match slot.done.take() {
            Some(event) => self.lease.engine().host_wait(&*event),
            None => self.lease.synchronize(),
        };
        if let Err(e) = waited {
            slot.staging.poison();
            return Err(e);
        }
        slot.in_flight = false;
        Ok(())
    }

    /// Marks slot `i`'s copy queued and records the event after it.
    fn queued(&mut self, i: usize) -> Result<(), DeviceError> {
        let slot = &mut self.slots[i];
        slot.in_flight = true;
        slot.done = Some(self.lease.engine().record(self.lease.stream())?);
        Ok(())
    }

    /// Waits for slot `i`'s download and appends its elements to `out`.
    fn collect<T: Element>(&mut self, i: usize, out: &mut Vec<T>) -> Result<(), DeviceError> {
        self.settle(i)?;
        let slot = &mut self.slots[i];
        let Some(range) = slot.to_collect.take() else {
            return Ok(());
        };
        let bytes = range.len();
        slot.staging.append_to(range, out)?;
        CopyCounts::add(&self.lease.copies.staged_from_device, bytes);
        Ok(())
    }
}

impl Drop for Slots<'_, '_> {
    fn drop(&mut self) {
        for i in 0..self.slots.len() {
            let _ = self.settle(i);
        }
    }
}

impl DeviceLease<'_> {
    /// Staging buffers for a copy of `bytes`, or `None` (then pageable): none for a
    /// small copy, and none to be had is counted as a fallback.
    fn staging_for(&self, bytes: usize) -> Option<Slots<'_, '_>> {
        if bytes < STAGED_COPY_MIN_BYTES {
            return None;
        }
        let wanted = bytes.div_ceil(STAGING_BUFFER_BYTES).min(BUFFERS);
        let slots: Vec<Slot> = (0..wanted)
            .map_while(|_| self.device.take_staging(self.engine()))
            .map(|staging| Slot {
                staging,
                in_flight: false,
                done: None,
                to_collect: None,
            })
            .collect();
        if slots.is_empty() {
            CopyCounts::add(&self.copies.staging_fallbacks, 1);
            return None;
        }
        Some(Slots { lease: self, slots })
    }

    /// Elements of `T` in one staging buffer's piece.
    fn piece<T>() -> usize {
        (STAGING_BUFFER_BYTES / std::mem::size_of::<T>().max(1)).max(1)
    }

    /// A copy of `host` on the device, through page-locked staging where it is large
    /// enough and staging is to be had (pageable otherwise): `upload`. The copy is queued
    /// on the lease's stream, so later work on it sees the whole buffer, and has finished
    /// reading `host` when this returns.
    pub(super) fn upload_staged<T: Element>(
        &self,
        host: &[T],
    ) -> Result<DeviceBuffer<T>, DeviceError> {
        let bytes = std::mem::size_of_val(host);
        if bytes >= STAGED_COPY_MIN_BYTES {
            let at = host.as_ptr().cast::<u8>();
            if let Some((body, range)) = pinned_body::registered_at(at, bytes, self.engine().id()) {
                return self.upload_in_place(&body, range, host.len());
            }
        }
        let Some(mut slots) = self.staging_for(bytes) else {
            return self.upload_pageable(host);
        };
        let mut memory = self.engine().alloc(bytes)?;
        let piece = Self::piece::<T>();
        for (k, part) in host.chunks(piece).enumerate() {
            let i = k % slots.slots.len();
            slots.settle(i)?;
            let range = slots.slots[i].staging.fill(0, part)?;
            let at = k * piece * std::mem::size_of::<T>();
            // SAFETY: the range is inside the staging buffer and `at` + its length inside
            // the allocation (the pieces tile `host`, whose bytes it holds); the host
            // leaves the buffer until this slot is settled.
            let queued = unsafe {
                self.engine().upload_pinned(
                    self.stream(),
                    &mut *memory,
                    at,
                    slots.slots[i].staging.pinned(),
                    range.clone(),
                )
            };
            if let Err(e) = queued {
                // It may have been queued in part: waited for before reuse.
                slots.slots[i].in_flight = true;
                return Err(e);
            }
            slots.queued(i)?;
            CopyCounts::add(&self.copies.staged_to_device, range.len());
        }
        for i in 0..slots.slots.len() {
            slots.settle(i)?;
        }
        Ok(DeviceBuffer::over(memory, host.len()))
    }

    /// `len` elements uploaded straight from `range` of a request body already in
    /// page-locked memory of this engine's (`pinned_body.rs`): one queued copy at the
    /// bus's speed, no staging. The host waits for it before returning, so the body may
    /// go as soon as the caller's slice of it does.
    fn upload_in_place<T: Element>(
        &self,
        body: &Registration,
        range: Range<usize>,
        len: usize,
    ) -> Result<DeviceBuffer<T>, DeviceError> {
        let bytes = range.len();
        let mut memory = self.engine().alloc(bytes)?;
        let pinned = body.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the range lies inside the registered block (the registry's lookup),
        // which the caller's slice of it keeps alive; the device memory holds `bytes`; the
        // host only reads the block until the copy is waited for, below.
        let queued = unsafe {
            self.engine()
                .upload_pinned(self.stream(), &mut *memory, 0, &**pinned, range)
        };
        let waited =
            (self.engine().record(self.stream())).and_then(|done| self.engine().host_wait(&*done));
        if queued.is_err() || waited.is_err() {
            // Whatever was queued has finished or failed before the body may go.
            let _ = self.synchronize();
        }
        queued?;
        waited?;
        CopyCounts::add(&self.copies.body_to_device, bytes);
        Ok(DeviceBuffer::over(memory, len))
    }

    /// Appends `buf`'s contents to `host` once the work queued before has finished,
    /// through page-locked staging where it is large enough and staging is to be had
    /// (pageable otherwise): `download_into`.
    pub(super) fn download_staged_into<T: Element>(
        &self,
        buf: &DeviceBuffer<T>,
        host: &mut Vec<T>,
    ) -> Result<(), DeviceError> {
        let Some(mut slots) = self.staging_for(buf.bytes()) else {
            return self.download_pageable_into(buf, host);
        };
        host.reserve(buf.len());
        let piece = Self::piece::<T>();
        let n = slots.slots.len();
        let pieces = buf.len().div_ceil(piece);
        for k in 0..pieces {
            let i = k % n;
            slots.collect(i, host)?;
            let len = piece.min(buf.len() - k * piece);
            let range = 0..len * std::mem::size_of::<T>();
            let at = k * piece * std::mem::size_of::<T>();
            // SAFETY: the range is inside the staging buffer and `at` + its length inside
            // the device buffer; the host leaves the staging buffer until this slot is
            // collected.
            let queued = unsafe {
                self.engine().download_pinned(
                    self.stream(),
                    &*buf.memory,
                    at,
                    slots.slots[i].staging.pinned(),
                    range.clone(),
                )
            };
            if let Err(e) = queued {
                slots.slots[i].in_flight = true;
                return Err(e);
            }
            slots.slots[i].to_collect = Some(range);
            slots.queued(i)?;
        }
        for k in pieces..pieces + n {
            slots.collect(k % n, host)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::device::{GpuDevice, StagingBudget};

    fn count(c: &std::sync::atomic::AtomicU64) -> u64 {
        CopyCounts::get(c)
    }

    /// 3.5 staging buffers of u64s: four pieces over two buffers, the last one short.
    fn values() -> Vec<u64> {
        let n = 7 * STAGING_BUFFER_BYTES / 2 / 8;
        (0..n as u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect()
    }

    /// The copy-counting check for whole buffers: a large upload and download go through
    /// staging, every byte once, each piece at its own offset (a piece written or read at
    /// the wrong place fails the comparisons, against the pageable copies too), and both
    /// buffers are kept for the next job.
    #[test]
    fn large_copies_stage_each_byte_once_at_its_offset() {
        let dev = GpuDevice::emulated(0, 1 << 30);
        let x = values();
        let bytes = 8 * x.len() as u64;
        let lease = dev.lease().unwrap();
        let staged = lease.upload(&x).unwrap();
        let mut plain = Vec::new();
        lease.download_pageable_into(&staged, &mut plain).unwrap();
        assert_eq!(plain, x);
        let pageable = lease.upload_pageable(&x).unwrap();
        let mut back = vec![1u64, 2];
        lease.download_into(&pageable, &mut back).unwrap();
        assert_eq!(&back[..2], [1, 2], "appended after what was there");
        assert_eq!(&back[2..], &x[..]);
        let c = lease.copies();
        assert_eq!(count(&c.staged_to_device), bytes);
        assert_eq!(count(&c.staged_from_device), bytes);
        assert_eq!(count(&c.pageable_to_device), bytes);
        assert_eq!(count(&c.pageable_from_device), bytes);
        assert_eq!(count(&c.staging_fallbacks), 0);
        drop(lease);
        assert_eq!(dev.staging_bytes(), BUFFERS * STAGING_BUFFER_BYTES);
    }

    /// A small copy stays pageable without counting a fallback; a large one with no
    /// staging to be had runs pageable and is counted, with the same bytes.
    #[test]
    fn small_copies_and_copies_without_staging_are_pageable() {
        let dev = GpuDevice::emulated(0, 1 << 30);
        let lease = dev.lease().unwrap();
        let small: Vec<u64> = (0..1000).collect();
        let buf = lease.upload(&small).unwrap();
        assert_eq!(lease.download(&buf).unwrap(), small);
        let c = lease.copies();
        assert_eq!(count(&c.pageable_to_device), 8000);
        assert_eq!(count(&c.pageable_from_device), 8000);
        assert_eq!(count(&c.staged_to_device) + count(&c.staging_fallbacks), 0);
        drop(lease);

        dev.share_staging(StagingBudget::new(0));
        let lease = dev.lease().unwrap();
        let x = values();
        let buf = lease.upload(&x).unwrap();
        assert_eq!(lease.download(&buf).unwrap(), x);
        let c = lease.copies();
        assert_eq!(count(&c.pageable_to_device), 8 * x.len() as u64);
        assert_eq!(count(&c.staged_to_device) + count(&c.staged_from_device), 0);
        assert_eq!(
            count(&c.staging_fallbacks),
            2,
            "the upload and the download"
        );
    }

    /// The wait these copies rely on: after the host waits for an event, the copies before
    /// it are done and their staging buffer may be refilled, while one queued after it may
    /// still be reading the other buffer, whose refill the emulated device refuses.
    #[test]
    fn an_event_wait_frees_only_the_copies_before_it() {
        let dev = GpuDevice::emulated(0, 1 << 20);
        let lease = dev.lease().unwrap();
        let (engine, stream) = (lease.engine(), lease.stream());
        let mut a = dev.take_staging(engine).unwrap();
        let mut b = dev.take_staging(engine).unwrap();
        let mut buf = lease.alloc_zeros::<u64>(6).unwrap();
        let first = a.fill(0, &[1u64, 2, 3]).unwrap();
        // SAFETY: 24 bytes of each staging buffer into the 48-byte buffer's two halves.
        unsafe { engine.upload_pinned(stream, &mut *buf.memory, 0, a.pinned(), first) }.unwrap();
        let done = engine.record(stream).unwrap();
        let second = b.fill(0, &[4u64, 5, 6]).unwrap();
        // SAFETY: as above.
        unsafe { engine.upload_pinned(stream, &mut *buf.memory, 24, b.pinned(), second) }.unwrap();
        let refused = a.fill(0, &[9u64]).unwrap_err();
        assert!(refused.message.contains("no host wait"), "{refused}");
        engine.host_wait(&*done).unwrap();
        a.fill(0, &[9u64]).unwrap();
        let refused = b.fill(0, &[9u64]).unwrap_err();
        assert!(refused.message.contains("no host wait"), "{refused}");
        // An offset past the buffer's end is refused, not copied.
        // SAFETY: the engine checks the offset before it copies.
        let past = unsafe { engine.upload_pinned(stream, &mut *buf.memory, 49, a.pinned(), 0..8) };
        assert!(past.is_err());
        lease.synchronize().unwrap();
        assert_eq!(lease.download(&buf).unwrap(), [1, 2, 3, 4, 5, 6]);
    }
}
