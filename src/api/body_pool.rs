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

use prometheus::{IntCounter, IntGauge};
use std::sync::{Arc, Mutex, Weak};
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
}

#[derive(Default)]
struct Free {
    buffers: Vec<(Vec<u8>, Instant)>,
    bytes: usize,
    /// Whether the thread that frees idle buffers runs (started with the first one kept).
    trimming: bool,
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
    /// `reused` counts the bodies read into a kept buffer.
    pub fn new(max_bytes: usize, held: IntGauge, reused: IntCounter) -> Arc<Self> {
        Arc::new(BodyPool {
            max_bytes,
            free: Mutex::new(Free::default()),
            held,
            reused,
        })
    }

    /// An empty buffer of at least `capacity` bytes: the smallest kept one that fits and
    /// is at most twice that, else a new one. Either way it comes back to the pool when
    /// the body is dropped.
    pub fn take(self: &Arc<Self>, capacity: usize) -> BodyBuf {
        let kept = (capacity >= POOLED_FROM).then(|| self.take_kept(capacity));
        BodyBuf {
            buf: kept
                .flatten()
                .unwrap_or_else(|| Vec::with_capacity(capacity)),
            pool: Some(self.clone()),
        }
    }

    fn take_kept(&self, capacity: usize) -> Option<Vec<u8>> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let best = free
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, (b, _))| (capacity..=capacity.saturating_mul(2)).contains(&b.capacity()))
            .min_by_key(|(_, (b, _))| b.capacity())
            .map(|(i, _)| i)?;
        let (buf, _) = free.buffers.swap_remove(best);
        free.bytes -= buf.capacity();
        self.held.set(free.bytes as i64);
        self.reused.inc();
        Some(buf)
    }

    /// Keeps `buf` if it is large and fits under the limit; otherwise it is freed.
    fn give_back(self: &Arc<Self>, mut buf: Vec<u8>) {
        let size = buf.capacity();
        if size < POOLED_FROM {
            return;
        }
        buf.clear();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.bytes + size > self.max_bytes {
            drop(free);
            return; // freed here, outside the lock
        }
        free.buffers.push((buf, Instant::now()));
        free.bytes += size;
        self.held.set(free.bytes as i64);
        if !free.trimming {
            free.trimming = true;
            start_trimming(Arc::downgrade(self));
        }
    }

    /// Frees the buffers unused since before `now - IDLE`; how many.
    pub fn trim(&self, now: Instant) -> usize {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let (old, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut free.buffers)
            .into_iter()
            .partition(|(_, since)| now.duration_since(*since) >= IDLE);
        free.buffers = kept;
        free.bytes = free.buffers.iter().map(|(b, _)| b.capacity()).sum();
        self.held.set(free.bytes as i64);
        drop(free);
        old.len() // freed here, outside the lock
    }

    /// Bytes kept now.
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).bytes
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

/// A request body's buffer; back to its pool (if any) when dropped.
pub struct BodyBuf {
    buf: Vec<u8>,
    pool: Option<Arc<BodyPool>>,
}

impl BodyBuf {
    /// A buffer of no pool.
    pub fn unpooled(capacity: usize) -> Self {
        BodyBuf {
            buf: Vec::with_capacity(capacity),
            pool: None,
        }
    }

    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The body as `Bytes` whose slices keep the buffer until the last one is dropped.
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl std::ops::Deref for BodyBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl AsRef<[u8]> for BodyBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for BodyBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back(std::mem::take(&mut self.buf));
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
        let caps: Vec<usize> = bufs.iter().map(|b| b.buf.capacity()).collect();
        drop(bufs);
        let got = p.take(POOLED_FROM + 1);
        assert_eq!(got.buf.capacity(), caps[2]);
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
