//! Bulk bodies in page-locked memory (`--gpu-pinned-body-mib`). On a host with a GPU, a
//! body in the bulk form of at least `PAGE_LOCKED_FROM` bytes is read from the socket
//! into a block registered with a device's engine (`backend::device::PinnedBlock`), so
//! the operands a device job reads in place from it (f32 gradients and tensors) are
//! copied to the device straight from there, at the bus's speed, without a second pass
//! through a staging buffer. Bodies are read before placement picks a device, so the
//! block is the first healthy GPU's; a job placed on another device, or on the CPU, reads
//! it as any memory.
//!
//! Page-locked memory is taken from the kernel's unswappable pages, so every block, in
//! use or kept for the next body, counts against one limit (`gpu_ops_pinned_body_bytes`);
//! a body that finds no room (after freeing the blocks kept longest) or whose
//! registration fails is read into pageable memory and counted
//! (`gpu_ops_pinned_body_fallbacks_total`). Kept blocks are reused, as the pageable
//! buffers are, since pinning pages costs far more than writing them; one unused for
//! `IDLE` is freed.

use super::{BodyBuf, BodyPool, Memory};
use crate::backend::device::{PinnedBlock, STAGED_COPY_MIN_BYTES};
use crate::backend::Backends;
use prometheus::{IntCounter, IntGauge};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The smallest body read into page-locked memory: below it a device copy is pageable
/// anyway (`STAGED_COPY_MIN_BYTES`).
pub const PAGE_LOCKED_FROM: usize = STAGED_COPY_MIN_BYTES;

/// The page-locked side of the pool: whose devices register its blocks, and its limit.
pub struct PageLocked {
    backends: Arc<Backends>,
    limit: usize,
    /// Bytes of blocks in use or kept.
    held: AtomicUsize,
    gauge: IntGauge,
    fallbacks: IntCounter,
}

impl PageLocked {
    /// At most `limit` bytes of page-locked bodies, registered with `backends`' first
    /// healthy GPU; `gauge` shows what is held, `fallbacks` counts the bodies that found
    /// no room.
    pub fn new(
        backends: Arc<Backends>,
        limit: usize,
        gauge: IntGauge,
        fallbacks: IntCounter,
    ) -> Self {
        Self {
            backends,
            limit,
            held: AtomicUsize::new(0),
            gauge,
            fallbacks,
        }
    }

    /// Room for `bytes` more, if the limit has it.
    fn claim(&self, bytes: usize) -> bool {
        let claimed = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held + bytes <= self.limit).then_some(held + bytes)
            });
        self.show();
        claimed.is_ok()
    }

    fn unclaim(&self, bytes: usize) {
        let _ = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                Some(held.saturating_sub(bytes))
            });
        self.show();
    }

    /// Frees `blocks` and their room.
    pub(super) fn release(&self, blocks: impl IntoIterator<Item = PinnedBlock>) {
        for block in blocks {
            let bytes = block.capacity();
            drop(block);
            self.unclaim(bytes);
        }
    }

    fn show(&self) {
        self.gauge.set(self.held.load(Ordering::Relaxed) as i64);
    }
}

impl BodyPool {
    /// An empty buffer of at least `capacity` bytes for a body a device job may read in
    /// place: page-locked where this host has a GPU whose engine registers host memory
    /// and the limit has room, else as `take`. Call from a blocking thread: registering a
    /// new block pins its pages.
    pub fn take_page_locked(self: &Arc<Self>, capacity: usize) -> BodyBuf {
        match self.page_locked_block(capacity) {
            Some(block) => BodyBuf {
                memory: Memory::PageLocked { block, len: 0 },
                pool: Some(self.clone()),
            },
            None => self.take(capacity),
        }
    }

    fn page_locked_block(&self, capacity: usize) -> Option<PinnedBlock> {
        let p = self.page_locked.as_ref()?;
        if capacity < PAGE_LOCKED_FROM {
            return None;
        }
        let device = p.backends.healthy_gpus().next()?.clone();
        let engine = device.engine_id();
        let kept = (self.lock_free().page_locked).take(capacity, |b| b.engine_id() == engine);
        if let Some(block) = kept {
            // The uploads from it waited for their copies; the emulated device checks.
            match block.host_may_write() {
                Ok(()) => {
                    self.reused.inc();
                    return Some(block);
                }
                Err(e) => {
                    tracing::error!(error = %e, "a kept page-locked body had a copy in flight; freed");
                    p.release([block]);
                }
            }
        }
        let size = PinnedBlock::size_for(capacity);
        if size > p.limit {
            p.fallbacks.inc(); // no room even with every kept block freed
            return None;
        }
        while !p.claim(size) {
            let oldest = self.lock_free().page_locked.take_oldest();
            match oldest {
                Some(block) => p.release([block]),
                None => {
                    p.fallbacks.inc();
                    return None;
                }
            }
        }
        match PinnedBlock::new(&device, capacity) {
            Ok(Some(block)) => Some(block),
            // The engine registers no host memory: pageable, as on a host without a GPU.
            Ok(None) => {
                p.unclaim(size);
                None
            }
            Err(e) => {
                p.unclaim(size);
                p.fallbacks.inc();
                tracing::warn!(device = device.info.ordinal, error = %e,
                    "page-locked memory for a request body refused; read into pageable memory");
                None
            }
        }
    }

    /// Keeps a page-locked block for the next body. Runs where a body is dropped, often
    /// on the runtime, so it asks no device anything (its engine's lock waits out a
    /// re-probe): a block of a replaced engine is kept too, never lent again (lending
    /// matches the engine) and freed within `IDLE`, or sooner for room.
    pub(super) fn give_back_page_locked(self: &Arc<Self>, block: PinnedBlock) {
        if self.page_locked.is_none() {
            return;
        }
        let mut free = self.lock_free();
        free.page_locked.keep(block);
        self.start_trimming(&mut free);
    }
}

#[cfg(test)]
mod tests {
    use super::super::IDLE;
    use super::*;
    use crate::backend::{cpu::CpuExecutor, BackendChoice, GpuDevice};
    use crate::metrics::Metrics;
    use std::time::Instant;

    /// A pool whose page-locked side may hold `limit` bytes, on a host with an emulated
    /// GPU (or none).
    fn pool(limit: usize, with_gpu: bool) -> Arc<BodyPool> {
        let backends = Arc::new(Backends::new(
            BackendChoice::Auto,
            CpuExecutor::new(1).unwrap(),
            Arc::new(Metrics::new()),
        ));
        let gpus = match with_gpu {
            true => vec![Arc::new(GpuDevice::emulated(0, 1 << 30))],
            false => Vec::new(),
        };
        backends.set_gpus(gpus, String::new());
        let page_locked = PageLocked::new(
            backends,
            limit,
            IntGauge::new("pinned", "pinned").unwrap(),
            IntCounter::new("fallbacks", "fallbacks").unwrap(),
        );
        BodyPool::new(
            0,
            IntGauge::new("held", "held").unwrap(),
            IntCounter::new("reused", "reused").unwrap(),
            Some(page_locked),
        )
    }

    fn side(pool: &BodyPool) -> &PageLocked {
        pool.page_locked.as_ref().unwrap()
    }

    fn filled(pool: &Arc<BodyPool>, n: usize, byte: u8) -> BodyBuf {
        let mut b = pool.take_page_locked(n);
        b.extend_from_slice(&vec![byte; n / 2]);
        b.extend_from_slice(&vec![byte; n - n / 2]);
        b
    }

    /// A large body on a GPU host is page-locked, reads back what was written, and its
    /// block is kept for the next body (which sees none of the last one's bytes); small
    /// bodies, and hosts without a GPU, stay pageable without counting a fallback.
    #[test]
    fn large_bodies_on_a_gpu_host_are_page_locked_and_their_blocks_reused() {
        let p = pool(64 << 20, true);
        let body = filled(&p, 3 << 20, 9);
        assert!(body.is_page_locked());
        assert_eq!((body.len(), body[0], body[(3 << 20) - 1]), (3 << 20, 9, 9));
        let at = body.as_ptr();
        drop(body);
        assert_eq!(side(&p).gauge.get(), 3 << 20, "kept, still held");
        let next = p.take_page_locked(2 << 20);
        assert_eq!(
            (next.as_ptr(), next.len()),
            (at, 0),
            "the kept block, empty"
        );
        assert_eq!(p.reused.get(), 1);
        drop(next);

        assert!(!filled(&p, PAGE_LOCKED_FROM - 1, 1).is_page_locked());
        let no_gpu = pool(64 << 20, false);
        assert!(!filled(&no_gpu, 3 << 20, 1).is_page_locked());
        assert_eq!(side(&p).fallbacks.get() + side(&no_gpu).fallbacks.get(), 0);
    }

    /// Past the limit the kept blocks are freed for room; a body that still finds none
    /// is pageable and counted. Idle blocks are freed with their room.
    #[test]
    fn the_limit_holds_and_idle_blocks_are_freed() {
        let p = pool(4 << 20, true);
        drop(filled(&p, 3 << 20, 1));
        let second = filled(&p, 4 << 20, 2);
        assert!(second.is_page_locked(), "the kept 3 MiB block freed for it");
        assert_eq!(side(&p).gauge.get(), 4 << 20);
        let third = filled(&p, 1 << 20, 3);
        assert!(!third.is_page_locked());
        assert_eq!(&third[..4], &[3; 4]);
        assert_eq!(side(&p).fallbacks.get(), 1);
        drop((second, third));
        assert_eq!(p.trim(Instant::now()), 0);
        assert_eq!(p.trim(Instant::now() + IDLE), 1);
        assert_eq!(side(&p).gauge.get(), 0);
    }

    /// A block of an engine a re-probe replaced is kept (giving back asks no device) but
    /// never lent again: the next body gets a block of the new engine. A body larger than
    /// the whole limit is pageable at once, the kept blocks left alone.
    #[test]
    fn a_block_of_a_replaced_engine_is_not_lent_again() {
        let p = pool(8 << 20, true);
        let device = side(&p).backends.gpus()[0].clone();
        let old = device.engine_id();
        let body = filled(&p, 2 << 20, 1);
        device.replace_engine(device.rebuilt_emulated().unwrap());
        drop(body);
        assert_eq!(side(&p).gauge.get(), 2 << 20, "kept");
        let next = filled(&p, 2 << 20, 2);
        assert!(next.is_page_locked());
        assert_eq!(p.reused.get(), 0, "not the old engine's block");
        assert_ne!(device.engine_id(), old);
        assert_eq!(side(&p).gauge.get(), 4 << 20);
        drop(next);
        assert!(!filled(&p, 9 << 20, 3).is_page_locked());
        assert_eq!(side(&p).fallbacks.get(), 1);
        assert_eq!(side(&p).gauge.get(), 4 << 20, "the kept blocks stay");
    }

    /// A body longer than its declared length (which hyper refuses before this) moves to
    /// pageable memory whole, and its block goes back.
    #[test]
    fn a_body_past_its_block_moves_to_pageable_memory() {
        let p = pool(64 << 20, true);
        let mut body = p.take_page_locked(PAGE_LOCKED_FROM);
        body.extend_from_slice(&vec![5; PAGE_LOCKED_FROM]);
        body.extend_from_slice(&[6; 3]);
        assert!(!body.is_page_locked());
        assert_eq!(body.len(), PAGE_LOCKED_FROM + 3);
        assert_eq!((body[0], body[PAGE_LOCKED_FROM]), (5, 6));
        assert_eq!(side(&p).gauge.get(), PAGE_LOCKED_FROM as i64, "kept");
    }
}
