//! Streaming jobs in chunks on two lanes: a job whose output item depends only on its
//! input items (field ops, and the other streaming kernels as they move here) is cut into
//! chunks, and each chunk is staged into a page-locked buffer, uploaded, run and
//! downloaded on one of two streams while the other lane's chunk does the same. On a GPU
//! one lane's copies then run beside the other's kernel, so a job's round trip tends to
//! the longest of its upload, kernel and download rather than their sum; the host copies
//! each byte once, into staging or out of it, while the device works.
//!
//! Each lane owns its device buffers and its staging buffer for the whole job and reuses
//! them chunk after chunk in its own stream's order; the host touches a lane's staging
//! buffer only after waiting for that lane's stream. The emulated device checks both
//! (`backend::emulated::order`): a lane that skipped its wait fails a test in CI. Where
//! no staging buffer is to be had (`--gpu-staging-mib 0`, the budget spent, page-locked
//! memory refused) the job runs in passes on pageable copies, counted as a fallback.

use super::lease::CopyCounts;
pub use super::operand::Operand;
use super::staging::{StagingBuffer, STAGING_BUFFER_BYTES};
use super::{DeviceBuffer, DeviceError, DeviceLease, Element};
use std::ops::Range;

/// The chunk a streaming job's kernel is called for: its items, and the lane (0 or 1)
/// whose stream it is queued on, so a reduction can keep one partial result per lane.
#[derive(Clone, Debug)]
pub struct Chunk {
    pub items: Range<usize>,
    pub lane: usize,
}

impl Chunk {
    /// Items in the chunk.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Lanes a chunked job overlaps on.
const LANES: usize = 2;

/// Where each region of a staging buffer starts: aligned for any element.
const REGION_ALIGN: usize = 256;

/// One lane: its staging buffer, its device buffers, and the chunk queued on it that the
/// host has not collected (its items, and its output's bytes in staging).
struct Lane<T, U> {
    staging: StagingBuffer,
    inputs: Vec<DeviceBuffer<T>>,
    output: DeviceBuffer<U>,
    pending: Option<(Range<usize>, Range<usize>)>,
}

/// Where a streaming job's output goes: appended to one vector, or handed chunk by chunk
/// (its items, their output elements) to the launcher, which puts them where its answer's
/// layout wants them; either way each byte is copied once out of staging.
enum Sink<'s, U> {
    Append(Vec<U>),
    Each(&'s mut dyn FnMut(Range<usize>, &[U])),
}

impl<U: Element> Sink<'_, U> {
    /// A chunk's output from `range` of its lane's staging buffer (its copy finished).
    fn staged(
        &mut self,
        items: Range<usize>,
        staging: &StagingBuffer,
        range: Range<usize>,
    ) -> Result<(), DeviceError> {
        match self {
            Sink::Append(out) => staging.append_to(range, out),
            Sink::Each(deliver) => staging.read_with(range, |from: &[U]| deliver(items, from)),
        }
    }

    /// A pass's output from pageable device memory.
    fn pageable(
        &mut self,
        lease: &DeviceLease<'_>,
        items: Range<usize>,
        output: &DeviceBuffer<U>,
    ) -> Result<(), DeviceError> {
        match self {
            Sink::Append(out) => lease.download_pageable_into(output, out),
            Sink::Each(deliver) => {
                // The fallback path: one more host copy, through a vector of the pass.
                let mut part = Vec::new();
                lease.download_pageable_into(output, &mut part)?;
                deliver(items, &part);
                Ok(())
            }
        }
    }
}

/// The lanes of one job; on an early return, each lane with work in flight is waited for
/// before its staging buffer goes back for reuse (or, if the wait fails, is freed).
struct Lanes<'l, 'd, T, U> {
    lease: &'l DeviceLease<'d>,
    lanes: Vec<Lane<T, U>>,
}

impl<T: Element, U: Element> Lanes<'_, '_, T, U> {
    /// Waits for lane `i`'s queued chunk and hands its output to `out`.
    fn collect(&mut self, i: usize, out: &mut Sink<'_, U>) -> Result<(), DeviceError> {
        let lane = &mut self.lanes[i];
        let Some((items, range)) = lane.pending.take() else {
            return Ok(());
        };
        if let Err(e) = self.lease.on_lane(i, || self.lease.synchronize())? {
            lane.staging.poison();
            return Err(e);
        }
        let bytes = range.len();
        out.staged(items, &lane.staging, range)?;
        CopyCounts::add(&self.lease.copies.staged_from_device, bytes);
        Ok(())
    }
}

impl<T, U> Drop for Lanes<'_, '_, T, U> {
    fn drop(&mut self) {
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            if lane.pending.take().is_some() {
                let waited = self.lease.on_lane(i, || self.lease.synchronize());
                if !matches!(waited, Ok(Ok(()))) {
                    lane.staging.poison();
                }
            }
        }
    }
}

fn align_up(bytes: usize) -> usize {
    bytes.div_ceil(REGION_ALIGN) * REGION_ALIGN
}

impl DeviceLease<'_> {
    /// Runs a streaming job over `items` items: `kernel(inputs, output, chunk)` computes
    /// the chunk's `m` items from device buffers holding each operand's `m * per_item`
    /// elements into `m * out_per_item` of output (the buffers may be longer). `fixed` is
    /// what the job keeps on the device besides (a broadcast operand, tables, a
    /// reduction's partial results), for the memory budget. The kernel is queued on the
    /// chunk's lane's stream, current when it is called (`launch` uses it), and must not
    /// wait on the host. A reduction passes `out_per_item` 0 and accumulates into its own
    /// buffer per lane: nothing is downloaded per chunk, and its lanes' work has all
    /// finished when this returns.
    pub fn stream_items<T: Element, U: Element>(
        &self,
        items: usize,
        inputs: &[Operand<'_, T>],
        out_per_item: usize,
        fixed: usize,
        kernel: impl FnMut(
            &mut [DeviceBuffer<T>],
            &mut DeviceBuffer<U>,
            Chunk,
        ) -> Result<(), DeviceError>,
    ) -> Result<Vec<U>, DeviceError> {
        let out = Sink::Append(Vec::with_capacity(items * out_per_item));
        match self.stream_into(items, inputs, out_per_item, fixed, kernel, out)? {
            Sink::Append(out) => Ok(out),
            Sink::Each(_) => unreachable!("the sink it was given"),
        }
    }

    /// `stream_items` with each chunk's output handed to `deliver(items, elements)`, in
    /// the items' order, straight from staging: for an answer laid out otherwise than one
    /// vector item after item (rows of items, as Shamir's shares are).
    pub fn stream_items_to<T: Element, U: Element>(
        &self,
        items: usize,
        inputs: &[Operand<'_, T>],
        out_per_item: usize,
        fixed: usize,
        kernel: impl FnMut(
            &mut [DeviceBuffer<T>],
            &mut DeviceBuffer<U>,
            Chunk,
        ) -> Result<(), DeviceError>,
        deliver: &mut dyn FnMut(Range<usize>, &[U]),
    ) -> Result<(), DeviceError> {
        self.stream_into(
            items,
            inputs,
            out_per_item,
            fixed,
            kernel,
            Sink::Each(deliver),
        )?;
        Ok(())
    }

    fn stream_into<'s, T: Element, U: Element>(
        &self,
        items: usize,
        inputs: &[Operand<'_, T>],
        out_per_item: usize,
        fixed: usize,
        mut kernel: impl FnMut(
            &mut [DeviceBuffer<T>],
            &mut DeviceBuffer<U>,
            Chunk,
        ) -> Result<(), DeviceError>,
        mut out: Sink<'s, U>,
    ) -> Result<Sink<'s, U>, DeviceError> {
        let (t, u) = (std::mem::size_of::<T>(), std::mem::size_of::<U>());
        let bytes = |staged_only: bool| {
            let ins = inputs.iter().filter(|o| !staged_only || o.is_staged());
            ins.map(|o| o.per_item * t).sum::<usize>() + out_per_item * u
        };
        let per_pass = self.items_per_pass(items, bytes(false), fixed);
        let room = STAGING_BUFFER_BYTES.saturating_sub((inputs.len() + 1) * REGION_ALIGN);
        let chunk = (per_pass / LANES).min(room / bytes(true).max(1));
        if items == 0 {
            return Ok(out);
        }
        let staging: Vec<_> = if chunk == 0 {
            Vec::new()
        } else {
            (0..LANES)
                .map_while(|_| self.device.take_staging(self.engine()))
                .collect()
        };
        if staging.is_empty() {
            if chunk > 0 {
                CopyCounts::add(&self.copies.staging_fallbacks, 1);
            }
            return self.pageable_passes(items, inputs, out_per_item, per_pass, kernel, out);
        }
        let mut lanes = Lanes {
            lease: self,
            lanes: Vec::new(),
        };
        // What the caller queued before (a broadcast operand's upload) comes before the
        // second lane's work.
        let before = self.record()?;
        for (i, staging) in staging.into_iter().enumerate() {
            let lane = self.on_lane(i, || -> Result<_, DeviceError> {
                if i > 0 {
                    self.wait(&before)?;
                }
                Ok(Lane {
                    staging,
                    inputs: inputs
                        .iter()
                        .map(|o| self.alloc_zeros::<T>(chunk * o.per_item))
                        .collect::<Result<_, _>>()?,
                    // One element at least: an allocation of none is refused by some
                    // drivers; a reduction's is never read.
                    output: self.alloc_zeros::<U>((chunk * out_per_item).max(1))?,
                    pending: None,
                })
            })??;
            lanes.lanes.push(lane);
        }
        let n_lanes = lanes.lanes.len();
        let chunks = items.div_ceil(chunk);
        for k in 0..chunks {
            self.still_wanted()?;
            let i = k % n_lanes;
            lanes.collect(i, &mut out)?;
            let (first, m) = (k * chunk, chunk.min(items - k * chunk));
            let lane = &mut lanes.lanes[i];
            let mut at = 0;
            let mut staged = Vec::with_capacity(inputs.len());
            for o in inputs {
                if !o.is_staged() {
                    staged.push(None);
                    continue;
                }
                let range = lane
                    .staging
                    .fill_with(at, m * o.per_item, |into: &mut [T]| {
                        o.write(first..first + m, into)
                    })?;
                at = align_up(range.end);
                CopyCounts::add(&self.copies.staged_to_device, range.len());
                staged.push(Some(range));
            }
            let result = at..at + m * out_per_item * u;
            // Pending from here: whatever is queued below is waited for before the
            // staging buffer is touched or lent again.
            lane.pending = Some((first..first + m, result.clone()));
            self.on_lane(i, || -> Result<(), DeviceError> {
                let (engine, stream) = (self.engine(), self.stream());
                for (buf, range) in lane.inputs.iter_mut().zip(&staged) {
                    let Some(range) = range else { continue };
                    // SAFETY: the range is inside the staging buffer and no longer than
                    // the device buffer (chunk * per_item elements); the host leaves it
                    // until this lane is waited for (`collect`, `Lanes::drop`).
                    unsafe {
                        engine.upload_pinned(
                            stream,
                            &mut *buf.memory,
                            0,
                            lane.staging.pinned(),
                            range.clone(),
                        )?
                    };
                }
                let items = first..first + m;
                kernel(&mut lane.inputs, &mut lane.output, Chunk { items, lane: i })?;
                if result.is_empty() {
                    return Ok(());
                }
                // SAFETY: as above; the output buffer holds at least m * out_per_item.
                unsafe {
                    engine.download_pinned(
                        stream,
                        &*lane.output.memory,
                        0,
                        lane.staging.pinned(),
                        result.clone(),
                    )
                }
            })??;
        }
        for k in chunks..chunks + n_lanes {
            lanes.collect(k % n_lanes, &mut out)?;
        }
        Ok(out)
    }

    /// The job in passes of `per_pass` items on pageable copies, one lane.
    fn pageable_passes<'s, T: Element, U: Element>(
        &self,
        items: usize,
        inputs: &[Operand<'_, T>],
        out_per_item: usize,
        per_pass: usize,
        mut kernel: impl FnMut(
            &mut [DeviceBuffer<T>],
            &mut DeviceBuffer<U>,
            Chunk,
        ) -> Result<(), DeviceError>,
        mut out: Sink<'s, U>,
    ) -> Result<Sink<'s, U>, DeviceError> {
        for first in (0..items).step_by(per_pass.max(1)) {
            self.still_wanted()?;
            let m = per_pass.min(items - first);
            let items = first..first + m;
            let mut device_inputs = inputs
                .iter()
                .map(|o| o.to_device(self, items.clone()))
                .collect::<Result<Vec<_>, _>>()?;
            let mut output = self.alloc_zeros::<U>((m * out_per_item).max(1))?;
            kernel(
                &mut device_inputs,
                &mut output,
                Chunk {
                    items: items.clone(),
                    lane: 0,
                },
            )?;
            if out_per_item > 0 {
                out.pageable(self, items, &output)?;
            } else {
                // A reduction downloads nothing: wait as a download would, before this
                // pass's buffers are freed, so its work has finished when the job returns.
                self.synchronize()?;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::device::{GpuDevice, StagingBudget};

    const ITEMS: usize = 1000;

    fn operands() -> (Vec<u64>, Vec<u64>) {
        (
            (0..ITEMS as u64).collect(),
            (0..ITEMS as u64).map(|i| 3 * i + 1).collect(),
        )
    }

    /// x + y over Goldilocks on `lease`, streamed (values far below the modulus, so the
    /// sum is the integers').
    fn add(lease: &DeviceLease<'_>, x: &[u64], y: &[u64]) -> Result<Vec<u64>, DeviceError> {
        let inputs = [Operand::slice(x, 1), Operand::slice(y, 1)];
        lease.stream_items(x.len(), &inputs, 1, 0, |ins, out, chunk| {
            let (m, stride) = (chunk.len(), 1u32);
            let n = m as u64;
            let mut launch = lease.launch("goldilocks_add")?;
            launch
                .arg(&ins[0])
                .arg(&ins[1])
                .arg(out)
                .arg(&n)
                .arg(&stride);
            // SAFETY: goldilocks_add's parameters in order; each buffer holds at least m.
            unsafe { launch.launch(lease.launch_config(m)) }
        })
    }

    fn count(c: &std::sync::atomic::AtomicU64) -> u64 {
        CopyCounts::get(c)
    }

    /// The copy-counting check: a streamed job over several chunks on two lanes moves
    /// every input byte into staging once and every output byte out of it once, with no
    /// pageable copy, and its answer is exact.
    #[test]
    fn a_streamed_job_stages_each_byte_once_on_two_lanes() {
        let dev = GpuDevice::emulated(0, 1 << 20);
        // 24 bytes an item (two inputs, one output): passes of 200, chunks of 100, ten.
        dev.set_memory_limit(24 * 200);
        let lease = dev.lease().unwrap();
        let (x, y) = operands();
        let sum = add(&lease, &x, &y).unwrap();
        assert_eq!(
            sum,
            (0..ITEMS as u64).map(|i| 4 * i + 1).collect::<Vec<_>>()
        );
        let c = lease.copies();
        assert_eq!(count(&c.staged_to_device), 2 * 8 * ITEMS as u64);
        assert_eq!(count(&c.staged_from_device), 8 * ITEMS as u64);
        assert_eq!(
            count(&c.pageable_to_device) + count(&c.pageable_from_device),
            0
        );
        assert_eq!(count(&c.staging_fallbacks), 0);
        assert!(lease.used_second_lane(), "the second lane was used");
        drop(lease);
        assert_eq!(dev.staging_bytes(), 2 * STAGING_BUFFER_BYTES, "both kept");
        // The next job reuses them: no more page-locked memory.
        let lease = dev.lease().unwrap();
        add(&lease, &x, &y).unwrap();
        assert_eq!(dev.staging_bytes(), 2 * STAGING_BUFFER_BYTES);
    }

    /// A scratch operand takes device room but is never copied, and `stream_items_to`
    /// hands the chunks over in order, each with its items: x + scratch (zeros) is x.
    #[test]
    fn scratch_is_not_copied_and_chunks_are_delivered_in_order() {
        let dev = GpuDevice::emulated(0, 1 << 20);
        // 24 bytes an item (input, scratch, output): passes of 200, chunks of 100.
        dev.set_memory_limit(24 * 200);
        let lease = dev.lease().unwrap();
        let (x, _) = operands();
        let inputs = [Operand::slice(&x, 1), Operand::scratch(1)];
        let (mut got, mut chunks) = (Vec::new(), Vec::new());
        let kernel = |ins: &mut [DeviceBuffer<u64>], out: &mut DeviceBuffer<u64>, c: Chunk| {
            let (n, stride) = (c.len() as u64, 1u32);
            let mut launch = lease.launch("goldilocks_add")?;
            launch
                .arg(&ins[0])
                .arg(&ins[1])
                .arg(out)
                .arg(&n)
                .arg(&stride);
            // SAFETY: goldilocks_add's parameters in order; each buffer holds at least n.
            unsafe { launch.launch(lease.launch_config(c.len())) }
        };
        lease
            .stream_items_to(ITEMS, &inputs, 1, 0, kernel, &mut |items, out: &[u64]| {
                assert_eq!(out.len(), items.len());
                chunks.push(items);
                got.extend_from_slice(out);
            })
            .unwrap();
        assert_eq!(got, x);
        let starts: Vec<usize> = chunks.iter().map(|c| c.start).collect();
        assert_eq!(starts, (0..ITEMS).step_by(100).collect::<Vec<_>>());
        assert!(chunks.iter().all(|c| c.len() == 100));
        let c = lease.copies();
        assert_eq!(count(&c.staged_to_device), 8 * ITEMS as u64, "x only");
        assert_eq!(count(&c.staged_from_device), 8 * ITEMS as u64);
        assert!(lease.used_second_lane());
    }

    /// With no staging budget the same job runs on pageable copies, each byte copied
    /// once, counted as a fallback, and gives the same answer; with room for one buffer
    /// it runs on one lane.
    #[test]
    fn without_staging_a_streamed_job_runs_pageable_and_is_counted() {
        let dev = GpuDevice::emulated(0, 1 << 20);
        dev.set_memory_limit(24 * 200);
        dev.share_staging(StagingBudget::new(0));
        let (x, y) = operands();
        let lease = dev.lease().unwrap();
        let sum = add(&lease, &x, &y).unwrap();
        let c = lease.copies();
        assert_eq!(count(&c.pageable_to_device), 2 * 8 * ITEMS as u64);
        assert_eq!(count(&c.pageable_from_device), 8 * ITEMS as u64);
        assert_eq!(count(&c.staged_to_device), 0);
        assert_eq!(count(&c.staging_fallbacks), 1);
        drop(lease);

        dev.share_staging(StagingBudget::new(STAGING_BUFFER_BYTES));
        let lease = dev.lease().unwrap();
        assert_eq!(add(&lease, &x, &y).unwrap(), sum);
        assert!(!lease.used_second_lane(), "one buffer, one lane");
        assert_eq!(count(&lease.copies().staged_from_device), 8 * ITEMS as u64);
    }

    /// Devices share one budget: a device that finds it spent frees another's idle
    /// buffers rather than run on pageable copies, and the budget is never passed.
    #[test]
    fn a_device_short_of_staging_frees_another_devices_idle_buffers() {
        let budget = StagingBudget::new(2 * STAGING_BUFFER_BYTES);
        let devices = [
            GpuDevice::emulated(0, 1 << 20),
            GpuDevice::emulated(1, 1 << 20),
        ];
        let (x, y) = operands();
        for dev in &devices {
            dev.set_memory_limit(24 * 200);
            dev.share_staging(budget.clone());
        }
        for dev in devices.iter().chain(&devices) {
            let lease = dev.lease().unwrap();
            add(&lease, &x, &y).unwrap();
            assert!(lease.used_second_lane(), "two buffers, two lanes");
            assert_eq!(count(&lease.copies().staging_fallbacks), 0);
            assert_eq!(budget.held(), 2 * STAGING_BUFFER_BYTES);
        }
    }

    /// The emulated device refuses a host read of a staging buffer that a download may
    /// still be writing, and a rewrite that an upload may still be reading: what a
    /// forgotten wait would do on a GPU.
    #[test]
    fn staging_touched_before_its_copies_finish_is_refused() {
        let dev = GpuDevice::emulated(0, 1 << 20);
        let lease = dev.lease().unwrap();
        let mut staging = dev.take_staging(lease.engine()).unwrap();
        let range = staging.fill(0, &[7u64, 8, 9]).unwrap();
        let mut buf = lease.alloc_zeros::<u64>(3).unwrap();
        let (engine, stream) = (lease.engine(), lease.stream());
        // SAFETY: 24 bytes inside the staging buffer and the device buffer.
        unsafe {
            engine.upload_pinned(stream, &mut *buf.memory, 0, staging.pinned(), range.clone())
        }
        .unwrap();
        let refused = staging.fill(0, &[1u64]).unwrap_err();
        assert!(refused.message.contains("no host wait"), "{refused}");
        let back = 64..88;
        // SAFETY: as above.
        unsafe { engine.download_pinned(stream, &*buf.memory, 0, staging.pinned(), back.clone()) }
            .unwrap();
        let mut out = Vec::<u64>::new();
        let refused = staging.append_to(back.clone(), &mut out).unwrap_err();
        assert!(refused.message.contains("a download"), "{refused}");
        lease.synchronize().unwrap();
        staging.append_to(back, &mut out).unwrap();
        assert_eq!(out, [7, 8, 9]);
    }
}
