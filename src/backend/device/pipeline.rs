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
//!
//! An input that already lies in a page-locked request body (`pinned_body.rs`: a bulk
//! body on a host with a GPU, its f32 or f64 buffer read in place) is not staged: each
//! chunk is uploaded straight from the body, and the host touches none of its bytes.

use super::engine::PinnedHost;
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
        // An operand already in a page-locked request body is uploaded from the body,
        // chunk by chunk: the host never touches its bytes.
        let bodies: Vec<_> = inputs.iter().map(|o| o.in_pinned_body(self)).collect();
        let needs_staging = |j: usize| inputs[j].is_staged() && bodies[j].is_none();
        let input_bytes = |keep: &dyn Fn(usize) -> bool| -> usize {
            let kept = (0..inputs.len()).filter(|&j| keep(j));
            kept.map(|j| inputs[j].per_item * t).sum()
        };
        let per_pass = self.items_per_pass(items, input_bytes(&|_| true) + out_per_item * u, fixed);
        let room = STAGING_BUFFER_BYTES.saturating_sub((inputs.len() + 1) * REGION_ALIGN);
        let staged_bytes = input_bytes(&needs_staging) + out_per_item * u;
        // Chunks read from a body are kept to a staging buffer's size as well, so there
        // are enough of them for one lane's copies to overlap the other's kernels.
        let body_bytes = input_bytes(&|j| bodies[j].is_some());
        let chunk = (per_pass / LANES)
            .min(room / staged_bytes.max(1))
            .min((STAGING_BUFFER_BYTES / body_bytes.max(1)).max(1));
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
            for (j, o) in inputs.iter().enumerate() {
                if !needs_staging(j) {
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
                for (j, (buf, range)) in lane.inputs.iter_mut().zip(&staged).enumerate() {
                    // Its chunk's bytes: in the lane's staging buffer, or in the request
                    // body (whose registration stays locked while the copy is queued).
                    let body;
                    let (from, bytes, from_body) = match (range, &bodies[j]) {
                        (Some(range), _) => (lane.staging.pinned(), range.clone(), 0),
                        (None, Some((registration, at))) => {
                            let per_item = inputs[j].per_item * t;
                            let bytes =
                                at.start + first * per_item..at.start + (first + m) * per_item;
                            body = registration.lock().unwrap_or_else(|e| e.into_inner());
                            let from: &dyn PinnedHost = &**body;
                            (from, bytes.clone(), bytes.len())
                        }
                        (None, None) => continue,
                    };
                    // SAFETY: the bytes lie inside the staging buffer or the operand's
                    // range of the registered block (which the caller's slice keeps alive
                    // past this call), and are no more than the device buffer holds
                    // (chunk * per_item elements); the host leaves them until this lane
                    // is waited for (`collect`, `Lanes::drop`).
                    unsafe { engine.upload_pinned(stream, &mut *buf.memory, 0, from, bytes)? };
                    CopyCounts::add(&self.copies.body_to_device, from_body);
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
mod tests;
