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
        add_chunk(lease, ins, out, chunk)
    })
}

/// One chunk of `add`: its two inputs' sums into its output.
fn add_chunk(
    lease: &DeviceLease<'_>,
    ins: &mut [DeviceBuffer<u64>],
    out: &mut DeviceBuffer<u64>,
    chunk: Chunk,
) -> Result<(), DeviceError> {
    let (n, stride) = (chunk.len() as u64, 1u32);
    let mut launch = lease.launch("goldilocks_add")?;
    launch
        .arg(&ins[0])
        .arg(&ins[1])
        .arg(out)
        .arg(&n)
        .arg(&stride);
    // SAFETY: goldilocks_add's parameters in order; each buffer holds at least n.
    unsafe { launch.launch(lease.launch_config(chunk.len())) }
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

/// The copy-counting check for request bodies: an operand lying in a page-locked body
/// is uploaded chunk by chunk straight from it (never staged, never pageable) while the
/// other operand is staged as before, and the answer is exact.
#[test]
fn an_operand_in_a_page_locked_body_is_uploaded_from_it_chunk_by_chunk() {
    let dev = GpuDevice::emulated(0, 1 << 20);
    dev.set_memory_limit(24 * 200);
    let (x, y) = operands();
    let mut block = crate::backend::device::PinnedBlock::new(&dev, 8 * (4 + ITEMS))
        .unwrap()
        .expect("the emulated engine registers host memory");
    block.host_may_write().unwrap();
    // SAFETY: the block holds 4 + ITEMS u64 values; x is written 4 values in, as a bulk
    // body's buffer lies after its header.
    let in_body = unsafe {
        let at = block.as_mut_ptr().cast::<u64>().add(4);
        std::ptr::copy_nonoverlapping(x.as_ptr(), at, ITEMS);
        std::slice::from_raw_parts(at.cast_const(), ITEMS)
    };
    let lease = dev.lease().unwrap();
    let sum = add(&lease, in_body, &y).unwrap();
    assert_eq!(
        sum,
        (0..ITEMS as u64).map(|i| 4 * i + 1).collect::<Vec<_>>()
    );
    let c = lease.copies();
    assert_eq!(
        count(&c.body_to_device),
        8 * ITEMS as u64,
        "x, from the body"
    );
    assert_eq!(count(&c.staged_to_device), 8 * ITEMS as u64, "y alone");
    assert_eq!(count(&c.staged_from_device), 8 * ITEMS as u64);
    assert_eq!(
        count(&c.pageable_to_device) + count(&c.pageable_from_device),
        0
    );
    assert!(lease.used_second_lane(), "the second lane was used");
    drop(lease);
    block.host_may_write().unwrap();
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
    // x + scratch: the scratch operand stands in for y.
    let kernel = |ins: &mut [DeviceBuffer<u64>], out: &mut DeviceBuffer<u64>, c: Chunk| {
        add_chunk(&lease, ins, out, c)
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
    unsafe { engine.upload_pinned(stream, &mut *buf.memory, 0, staging.pinned(), range.clone()) }
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
