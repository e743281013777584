//! Warm buffers for large request bodies (`--body-pool-bytes`).
//!
//! A body is read into one buffer sized by its declared length (`extract::read_body`). A
//! fresh large buffer is fresh pages, which the kernel zeroes as they are first touched:
//! on the development VM at about 2 GB/s, so a 1 GiB DP batch spent about 0.46 s zeroing
//! its buffer, against about 13 GB/s for a copy into warm memory (docs/PERFORMANCE.md).
//! The pool keeps the buffers of finished large bodies, up to `--body-pool-bytes` in all,
//! and gives the next large body the smallest one that fits, if it is at most twice the
//! body's size: a small body never holds a warm gigabyte that the in-flight budget
//! (charged by declared length) does not see. A buffer unused for `IDLE` goes back to the
//! system (checked every half `IDLE`, so within 1.5 × `IDLE`), so a server left idle does
//! not keep them.
//!
//! A reused buffer is emptied before it is handed out, and a body is read only up to the
//! bytes it wrote, so no request can read another's bytes; those bytes stay in memory
//! until overwritten or given back, as any freed allocation's do.
//!
//! On a host with a GPU a large body in the bulk form is read into page-locked memory
//! instead (`page_locked.rs`, `--gpu-pinned-body-mib`), so a device job copies its
//! operands straight from it.

mod page_locked;

pub use page_locked::{PageLocked, PAGE_LOCKED_FROM};

use crate::backend::device::PinnedBlock;
use prometheus::{IntCounter, IntGauge};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// Buffers from this size up are pooled. Below it glibc's own free lists keep and reuse
/// memory (its mmap threshold rises to 32 MiB as large blocks are freed).
pub const POOLED_FROM: usize = 8 << 20;
/// A pooled buffer unused this long is freed.
pub const IDLE: Duration = Duration::from_secs(10);

pub struct BodyPool {
    max_bytes: usize,
    free: Mutex<Free>,
    held: IntGauge,
    reused: IntCounter,
    /// Where bulk bodies bound for a device are read, on a host with a GPU.
    page_locked: Option<PageLocked>,
}

#[derive(Default)]
struct Free {
    pageable: Kept<Vec<u8>>,
    page_locked: Kept<PinnedBlock>,
    /// Whether the thread that frees idle buffers runs (started with the first one kept).
    trimming: bool,
}

/// A buffer the pool can keep, by its size in bytes.
trait Buffer {
    fn size(&self) -> usize;
}

impl Buffer for Vec<u8> {
    fn size(&self) -> usize {
        self.capacity()
    }
}

impl Buffer for PinnedBlock {
    fn size(&self) -> usize {
        self.capacity()
    }
}

/// Buffers kept for reuse, each with when it was given back.
struct Kept<B> {
    buffers: Vec<(B, Instant)>,
    bytes: usize,
}

impl<B> Default for Kept<B> {
    fn default() -> Self {
        Self {
            buffers: Vec::new(),
            bytes: 0,
        }
    }
}

impl<B: Buffer> Kept<B> {
    /// The smallest kept buffer among the `usable` that fits `capacity` and is at most
    /// twice that: a small body never holds a large warm buffer.
    fn take(&mut self, capacity: usize, usable: impl Fn(&B) -> bool) -> Option<B> {
        let best = self
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, (b, _))| usable(b))
            .filter(|(_, (b, _))| (capacity..=capacity.saturating_mul(2)).contains(&b.size()))
            .min_by_key(|(_, (b, _))| b.size())
            .map(|(i, _)| i)?;
        let (buf, _) = self.buffers.swap_remove(best);
        self.bytes -= buf.size();
        Some(buf)
    }

    /// The buffer kept longest, to free for room.
    fn take_oldest(&mut self) -> Option<B> {
        let oldest = (self.buffers.iter().enumerate())
            .min_by_key(|(_, (_, since))| *since)
            .map(|(i, _)| i)?;
        let (buf, _) = self.buffers.swap_remove(oldest);
        self.bytes -= buf.size();
        Some(buf)
    }

    fn keep(&mut self, buf: B) {
        self.bytes += buf.size();
        self.buffers.push((buf, Instant::now()));
    }

    /// The buffers unused since before `now - IDLE`, taken out.
    fn trim(&mut self, now: Instant) -> Vec<B> {
        let (old, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.buffers)
            .into_iter()
            .partition(|(_, since)| now.duration_since(*since) >= IDLE);
        self.buffers = kept;
        self.bytes = self.buffers.iter().map(|(b, _)| b.size()).sum();
        old.into_iter().map(|(b, _)| b).collect()
    }
}

impl std::fmt::Debug for BodyPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyPool")
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl BodyPool {
    /// A pool of at most `max_bytes` (0: none kept); `held` shows the bytes it keeps and
    /// `reused` counts the bodies read into a kept buffer. `page_locked`: where bulk
    /// bodies for a device go, if anywhere.
    pub fn new(
        max_bytes: usize,
        held: IntGauge,
        reused: IntCounter,
        page_locked: Option<PageLocked>,
    ) -> Arc<Self> {
        Arc::new(BodyPool {
            max_bytes,
            free: Mutex::new(Free::default()),
            held,
            reused,
            page_locked,
        })
    }

    /// An empty buffer of at least `capacity` bytes: the smallest kept one that fits and
    /// is at most twice that, else a new one. Either way it comes back to the pool when
    /// the body is dropped.
    pub fn take(self: &Arc<Self>, capacity: usize) -> BodyBuf {
        let kept = (capacity >= POOLED_FROM).then(|| {
            let mut free = self.lock_free();
            let buf = free.pageable.take(capacity, |_| true)?;
            self.held.set(free.pageable.bytes as i64);
            self.reused.inc();
            Some(buf)
        });
        BodyBuf {
            memory: Memory::Pageable(
                kept.flatten()
                    .unwrap_or_else(|| Vec::with_capacity(capacity)),
            ),
            pool: Some(self.clone()),
        }
    }

    fn lock_free(&self) -> MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `buf` if it is large and fits under the limit; otherwise it is freed.
    fn give_back(self: &Arc<Self>, memory: Memory) {
        let mut buf = match memory {
            Memory::Pageable(buf) => buf,
            Memory::PageLocked { block, .. } => return self.give_back_page_locked(block),
        };
        let size = buf.capacity();
        if size < POOLED_FROM {
            return;
        }
        buf.clear();
        let mut free = self.lock_free();
        if free.pageable.bytes + size > self.max_bytes {
            drop(free);
            return; // freed here, outside the lock
        }
        free.pageable.keep(buf);
        self.held.set(free.pageable.bytes as i64);
        self.start_trimming(&mut free);
    }

    /// Starts the thread that frees idle buffers, once.
    fn start_trimming(self: &Arc<Self>, free: &mut Free) {
        if !free.trimming {
            free.trimming = true;
            start_trimming(Arc::downgrade(self));
        }
    }

    /// Frees the buffers unused since before `now - IDLE`; how many.
    pub fn trim(&self, now: Instant) -> usize {
        let mut free = self.lock_free();
        let old = free.pageable.trim(now);
        self.held.set(free.pageable.bytes as i64);
        let old_blocks = free.page_locked.trim(now);
        drop(free);
        let freed = old.len() + old_blocks.len();
        if let Some(p) = &self.page_locked {
            p.release(old_blocks); // freed here, outside the lock
        }
        freed
    }

    /// Bytes kept now.
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.lock_free().pageable.bytes
    }
}

/// A thread that frees idle buffers every half `IDLE`, for as long as the pool lives.
fn start_trimming(pool: Weak<BodyPool>) {
    let started = std::thread::Builder::new()
        .name("body-pool-trim".into())
        .spawn(move || loop {
            std::thread::sleep(IDLE / 2);
            match pool.upgrade() {
                Some(p) => {
                    p.trim(Instant::now());
                }
                None => return,
            }
        });
    if let Err(e) = started {
        tracing::warn!(error = %e, "could not start the body pool's trimming thread; idle buffers are freed only as bodies come and go");
    }
}

/// Where a body's bytes are.
enum Memory {
    Pageable(Vec<u8>),
    /// A registered block and the bytes written to it so far.
    PageLocked {
        block: PinnedBlock,
        len: usize,
    },
}

/// A request body's buffer; back to its pool (if any) when dropped.
pub struct BodyBuf {
    memory: Memory,
    pool: Option<Arc<BodyPool>>,
}

impl BodyBuf {
    /// A buffer of no pool.
    pub fn unpooled(capacity: usize) -> Self {
        BodyBuf {
            memory: Memory::Pageable(Vec::with_capacity(capacity)),
            pool: None,
        }
    }

    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        match &mut self.memory {
            Memory::Pageable(buf) => buf.extend_from_slice(bytes),
            Memory::PageLocked { block, len } if *len + bytes.len() <= block.capacity() => {
                // SAFETY: inside the block (checked); its owner writes it before any
                // copy reads it (`take_page_locked` checked the last one finished).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        block.as_mut_ptr().add(*len),
                        bytes.len(),
                    )
                };
                *len += bytes.len();
            }
            Memory::PageLocked { .. } => {
                // More than the declared length (which hyper enforces): pageable.
                let mut buf = Vec::with_capacity(self.len() + bytes.len());
                buf.extend_from_slice(self);
                buf.extend_from_slice(bytes);
                let old = std::mem::replace(&mut self.memory, Memory::Pageable(buf));
                if let Some(pool) = &self.pool {
                    pool.give_back(old);
                }
            }
        }
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        match &self.memory {
            Memory::Pageable(buf) => buf.capacity(),
            Memory::PageLocked { block, .. } => block.capacity(),
        }
    }

    /// Whether the bytes are in page-locked memory.
    #[cfg(test)]
    pub fn is_page_locked(&self) -> bool {
        matches!(self.memory, Memory::PageLocked { .. })
    }

    /// The body as `Bytes` whose slices keep the buffer until the last one is dropped.
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl std::ops::Deref for BodyBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.memory {
            Memory::Pageable(buf) => buf,
            // SAFETY: the first `len` bytes of the block, written by `extend_from_slice`;
            // the block lives as long as `self`.
            Memory::PageLocked { block, len } => unsafe {
                std::slice::from_raw_parts(block.as_ptr(), *len)
            },
        }
    }
}

impl AsRef<[u8]> for BodyBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for BodyBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            let memory = std::mem::replace(&mut self.memory, Memory::Pageable(Vec::new()));
            pool.give_back(memory);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(max: usize) -> Arc<BodyPool> {
        BodyPool::new(
            max,
            IntGauge::new("held", "held").unwrap(),
            IntCounter::new("reused", "reused").unwrap(),
            None,
        )
    }

    fn filled(pool: &Arc<BodyPool>, n: usize, byte: u8) -> BodyBuf {
        let mut b = pool.take(n);
        b.extend_from_slice(&vec![byte; n]);
        b
    }

    #[test]
    fn a_large_body_reuses_the_buffer_of_the_last_and_sees_only_its_own_bytes() {
        let p = pool(64 << 20);
        let first = filled(&p, POOLED_FROM + 100, 7);
        let at = first.as_ptr();
        drop(first);
        assert_eq!(p.kept_bytes(), POOLED_FROM + 100);
        assert_eq!(p.held.get(), (POOLED_FROM + 100) as i64);
        let second = p.take(POOLED_FROM);
        assert_eq!(second.as_ptr(), at, "the kept buffer");
        assert!(
            second.is_empty(),
            "emptied: nothing of the last body is readable"
        );
        assert_eq!((p.reused.get(), p.kept_bytes()), (1, 0));
        let bytes = filled(&p, 10, 1);
        assert_eq!(&*bytes, &[1; 10]);
    }

    #[test]
    fn small_buffers_and_those_past_the_limit_are_freed() {
        let p = pool(POOLED_FROM * 3);
        drop(filled(&p, 1024, 0));
        assert_eq!(p.kept_bytes(), 0, "below POOLED_FROM: glibc's");
        let (a, b) = (
            filled(&p, POOLED_FROM * 2, 0),
            filled(&p, POOLED_FROM * 2, 0),
        );
        drop(a);
        drop(b);
        assert_eq!(
            p.kept_bytes(),
            POOLED_FROM * 2,
            "the second would pass the limit"
        );
        let none = pool(0);
        drop(filled(&none, POOLED_FROM, 0));
        assert_eq!(none.kept_bytes(), 0, "0 keeps nothing");
    }

    #[test]
    fn the_smallest_buffer_that_fits_is_taken() {
        let p = pool(1 << 30);
        let sizes = [POOLED_FROM * 4, POOLED_FROM, POOLED_FROM * 2];
        let bufs: Vec<BodyBuf> = sizes.iter().map(|&n| p.take(n)).collect();
        let caps: Vec<usize> = bufs.iter().map(|b| b.capacity()).collect();
        drop(bufs);
        let got = p.take(POOLED_FROM + 1);
        assert_eq!(got.capacity(), caps[2]);
        let bigger = p.take(POOLED_FROM * 5);
        assert_eq!(p.reused.get(), 1, "none fits: a new buffer");
        // Left: 4× and 1×. One byte over 1× fits only the 4×, more than twice its size.
        let small = p.take(POOLED_FROM + 1);
        assert_eq!(
            p.reused.get(),
            1,
            "a warm buffer over twice the body is not lent"
        );
        drop((bigger, small));
    }

    #[test]
    fn buffers_unused_for_the_idle_time_are_freed() {
        let p = pool(1 << 30);
        drop(filled(&p, POOLED_FROM, 0));
        assert_eq!(p.trim(Instant::now()), 0);
        assert_eq!(p.trim(Instant::now() + IDLE), 1);
        assert_eq!((p.kept_bytes(), p.held.get()), (0, 0));
    }

    #[test]
    fn slices_of_the_body_keep_its_buffer_until_the_last_is_dropped() {
        let p = pool(1 << 30);
        let body = filled(&p, POOLED_FROM, 3).into_bytes();
        let part = body.slice(10..20);
        drop(body);
        assert_eq!(p.kept_bytes(), 0, "still lent");
        assert_eq!(&part[..], &[3; 10]);
        drop(part);
        assert_eq!(p.kept_bytes(), POOLED_FROM);
    }
}
