//! The emulated device's streams and events, and the order check they exist for.
//!
//! Each emulated stream runs its work on a thread of its own (`queue.rs`), so a launcher
//! that forgets an event can race here as on a GPU, but only when the timing is unlucky.
//! A GPU runs two streams' work in any order the events allow; this module refuses every
//! operation whose order the streams do not promise, on every run: each
//! stream keeps a vector clock (one counter per stream: how much of that stream's work is
//! known to come before its next operation), every operation ticks its stream's counter
//! and is recorded on each buffer it touches, and an operation that touches a buffer
//! another stream wrote (or, to write it, read) without an event or a host wait between
//! them is refused as a device error: the race a GPU could run. Recording an event takes
//! a copy of its stream's clock; waiting for it joins that copy into the waiting stream's.
//!
//! The host counts as well. When the host has waited for a stream (`synchronize`, a
//! download), that stream's work up to then is finished, and so ordered before anything
//! any thread queues afterwards: the engine's host clock joins the stream's, and every
//! later operation of any stream starts from it.
//!
//! An operation that passes is queued on its stream's thread (`queue.rs`), where it runs
//! beside the host and the other streams; each buffer's log keeps the queued work still
//! using it, which the buffer waits for when it is freed.

use super::queue::{Queue, Users, Work, Worker};
use crate::backend::device::engine::{EngineEvent, EngineId, EngineStream};
use crate::backend::device::DeviceError;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// How much of each stream's work (by stream number) is ordered before a point.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VectorClock(BTreeMap<u64, u64>);

impl VectorClock {
    fn get(&self, stream: u64) -> u64 {
        self.0.get(&stream).copied().unwrap_or(0)
    }

    fn join(&mut self, other: &VectorClock) {
        for (&s, &t) in &other.0 {
            let mine = self.0.entry(s).or_insert(0);
            *mine = (*mine).max(t);
        }
    }

    /// Whether operation `at` is ordered before this point.
    fn covers(&self, at: Stamp) -> bool {
        self.get(at.stream) >= at.tick
    }
}

/// One operation: the `tick`-th of stream `stream`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    stream: u64,
    tick: u64,
}

/// An emulated stream: its number, its clock, and the thread its work runs on.
pub struct EmulatedStream {
    engine: EngineId,
    number: u64,
    clock: Mutex<VectorClock>,
    worker: Worker,
}

impl EmulatedStream {
    pub(super) fn new(engine: EngineId, number: u64) -> Result<Self, DeviceError> {
        Ok(Self {
            engine,
            number,
            clock: Mutex::new(VectorClock::default()),
            worker: Worker::start(format!("emu-stream-{number}"))?,
        })
    }

    pub(super) fn queue(&self) -> &Arc<Queue> {
        &self.worker.queue
    }

    /// Blocks the host until all the work queued so far has finished; the failure it
    /// has not yet been told of, if any.
    pub(super) fn host_wait(&self) -> Result<(), DeviceError> {
        self.queue().host_wait(self.queue().queued())
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, VectorClock> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl EngineStream for EmulatedStream {
    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// An emulated event: the clock of its stream when it was recorded, and the point in
/// its stream's queue.
pub struct EmulatedEvent {
    pub(super) engine: EngineId,
    clock: VectorClock,
    queue: Arc<Queue>,
    ticket: u64,
}

impl EmulatedEvent {
    /// Blocks the host until the work before the event has finished; the stream's
    /// failure the host has not yet been told of, if any.
    pub(super) fn host_wait(&self) -> Result<(), DeviceError> {
        self.queue.host_wait(self.ticket)
    }
}

impl EngineEvent for EmulatedEvent {
    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The engine's side of the check: what the host has seen finish.
#[derive(Default)]
pub struct HostOrder {
    finished: Mutex<VectorClock>,
}

/// Who last touched a buffer: its last write, and the reads since, one per stream; and
/// the queued work that may still be using it.
#[derive(Default)]
pub struct AccessLog {
    write: Option<Stamp>,
    reads: Vec<Stamp>,
    users: Users,
}

/// Blocks until no queued work uses the buffer whose log this is: before it is freed.
pub fn wait_for_users(log: &mut Mutex<AccessLog>) {
    log.get_mut()
        .unwrap_or_else(|e| e.into_inner())
        .users
        .wait_all();
}

/// One buffer an operation touches, and how.
pub struct Touch<'a> {
    pub log: &'a Mutex<AccessLog>,
    pub writes: bool,
}

impl HostOrder {
    /// Checks one operation (`what`, for the refusal) of `stream` that touches `buffers`,
    /// and queues its `work` on the stream: refused if any touch races with another
    /// stream's. Its ticket in the stream's queue.
    pub fn operation(
        &self,
        stream: &EmulatedStream,
        what: &str,
        buffers: &[Touch<'_>],
        work: Work,
    ) -> Result<u64, DeviceError> {
        let mut clock = stream.clock();
        clock.join(&self.host());
        let tick = clock.get(stream.number) + 1;
        clock.0.insert(stream.number, tick);
        let now = Stamp {
            stream: stream.number,
            tick,
        };
        // One lock per buffer (a buffer passed twice is one touch, a write if either is),
        // taken in address order so two operations never wait for each other; every
        // touch is checked before any is recorded, so a refused operation leaves no trace.
        let mut touches: Vec<(&Mutex<AccessLog>, bool)> =
            buffers.iter().map(|t| (t.log, t.writes)).collect();
        touches.sort_by_key(|(log, _)| *log as *const Mutex<AccessLog> as usize);
        touches.dedup_by(|later, kept| {
            let same = std::ptr::eq(later.0, kept.0);
            kept.1 |= same && later.1;
            same
        });
        let mut logs: Vec<_> = touches
            .into_iter()
            .map(|(log, writes)| (log.lock().unwrap_or_else(|e| e.into_inner()), writes))
            .collect();
        for (log, writes) in &logs {
            let earlier = log
                .write
                .iter()
                .chain(if *writes { &log.reads[..] } else { &[] });
            if let Some(other) = earlier.copied().find(|&e| !clock.covers(e)) {
                let (kind, mine) = match (Some(other) == log.write, *writes) {
                    (true, false) => ("a write", "reads"),
                    (true, true) => ("a write", "writes"),
                    (false, _) => ("a read", "writes"),
                };
                return Err(DeviceError::fatal(format!(
                    "emulated device: {what} on stream {} {mine} a buffer that {kind} on stream {} \
                     may still be using: no event or host wait orders them, so a GPU could run \
                     them in either order",
                    stream.number, other.stream
                )));
            }
        }
        // Queued while the buffers' logs are held, so the work and its record go together.
        let ticket = stream.queue().push(work);
        for (log, writes) in &mut logs {
            log.users.note(stream.queue(), ticket);
            if *writes {
                log.write = Some(now);
                log.reads.clear();
            } else {
                log.reads.retain(|r| r.stream != now.stream);
                log.reads.push(now);
            }
        }
        Ok(ticket)
    }

    /// The host has waited for all of `stream`'s work so far.
    pub fn waited_for(&self, stream: &EmulatedStream) {
        let clock = stream.clock().clone();
        self.host_mut().join(&clock);
    }

    /// The host has waited for `event`: its stream's work up to the event is finished.
    pub fn waited_for_event(&self, event: &EmulatedEvent) {
        self.host_mut().join(&event.clock);
    }

    /// An event at `stream`'s current point.
    pub fn record(&self, engine: EngineId, stream: &EmulatedStream) -> EmulatedEvent {
        EmulatedEvent {
            engine,
            clock: stream.clock().clone(),
            queue: stream.queue().clone(),
            ticket: stream.queue().queued(),
        }
    }

    /// `stream`'s later work comes after `event`'s point: in the check, and on the
    /// stream's thread, which waits there for the event's stream to get to it.
    pub fn wait(&self, stream: &EmulatedStream, event: &EmulatedEvent) {
        stream.clock().join(&event.clock);
        if !Arc::ptr_eq(stream.queue(), &event.queue) {
            let (queue, ticket) = (event.queue.clone(), event.ticket);
            stream.queue().push(Box::new(move || {
                queue.wait_for(ticket);
                Ok(())
            }));
        }
    }

    fn host(&self) -> VectorClock {
        self.host_mut().clone()
    }

    /// Whether the host may read (`writes`: write) page-locked memory whose copies `log`
    /// records: every copy that writes it (and, to write it, every one that reads it)
    /// must be one the host has waited for. Host touches are not recorded: a copy the host
    /// queues afterwards comes after them in the host's own order.
    pub fn host_access(&self, log: &Mutex<AccessLog>, writes: bool) -> Result<(), DeviceError> {
        let log = log.lock().unwrap_or_else(|e| e.into_inner());
        let host = self.host();
        let reads: &[Stamp] = if writes { &log.reads } else { &[] };
        let Some(other) = log
            .write
            .iter()
            .chain(reads)
            .copied()
            .find(|&e| !host.covers(e))
        else {
            return Ok(());
        };
        let (kind, mine) = match (Some(other) == log.write, writes) {
            (true, false) => ("a download", "reads"),
            (true, true) => ("a download", "writes"),
            (false, _) => ("an upload", "writes"),
        };
        Err(DeviceError::fatal(format!(
            "emulated device: the host {mine} page-locked memory that {kind} on stream {} may \
             still be using: no host wait (synchronize) orders them, so on a GPU the bytes \
             could be half copied",
            other.stream
        )))
    }

    fn host_mut(&self) -> std::sync::MutexGuard<'_, VectorClock> {
        self.finished.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nothing() -> Work {
        Box::new(|| Ok(()))
    }

    fn touch(log: &Mutex<AccessLog>, writes: bool) -> [Touch<'_>; 1] {
        [Touch { log, writes }]
    }

    /// The rules on one buffer and two streams: reads after reads never race; a read after
    /// another stream's write races until an event or a host wait orders them; a write
    /// after another stream's read races likewise.
    #[test]
    fn two_streams_are_ordered_only_by_events_and_host_waits() {
        let (order, id) = (HostOrder::default(), EngineId::fresh());
        let (a, b) = (
            EmulatedStream::new(id, 1).unwrap(),
            EmulatedStream::new(id, 2).unwrap(),
        );
        let buffer = Mutex::new(AccessLog::default());
        order
            .operation(&a, "upload", &touch(&buffer, true), nothing())
            .unwrap();
        let refused = order.operation(&b, "kernel", &touch(&buffer, false), nothing());
        assert!(refused.unwrap_err().message.contains("a write on stream 1"));
        let event = order.record(id, &a);
        order.wait(&b, &event);
        order
            .operation(&b, "kernel", &touch(&buffer, false), nothing())
            .unwrap();
        order
            .operation(&a, "kernel", &touch(&buffer, false), nothing())
            .unwrap();
        // A writes while B's read is unordered: refused; after a host wait for B, fine.
        let refused = order.operation(&a, "zero", &touch(&buffer, true), nothing());
        assert!(refused.unwrap_err().message.contains("a read on stream 2"));
        order.waited_for(&b);
        order
            .operation(&a, "zero", &touch(&buffer, true), nothing())
            .unwrap();
        // The same stream is always in order with itself, and one buffer passed twice
        // is one touch.
        order
            .operation(&a, "kernel", &touch(&buffer, true), nothing())
            .unwrap();
        let twice = [
            Touch {
                log: &buffer,
                writes: false,
            },
            Touch {
                log: &buffer,
                writes: true,
            },
        ];
        order.operation(&a, "kernel", &twice, nothing()).unwrap();
        assert!(order
            .operation(&b, "kernel", &touch(&buffer, false), nothing())
            .is_err());
    }

    /// The host touches page-locked memory only after waiting for the copies on it: a
    /// download's bytes are read after a host wait, an upload's source rewritten likewise.
    #[test]
    fn the_host_waits_for_copies_on_page_locked_memory() {
        let (order, id) = (HostOrder::default(), EngineId::fresh());
        let a = EmulatedStream::new(id, 1).unwrap();
        let pinned = Mutex::new(AccessLog::default());
        order.host_access(&pinned, true).unwrap();
        order
            .operation(&a, "upload", &touch(&pinned, false), nothing())
            .unwrap();
        order.host_access(&pinned, false).unwrap();
        let refused = order.host_access(&pinned, true).unwrap_err();
        assert!(
            refused.message.contains("an upload on stream 1"),
            "{refused}"
        );
        order
            .operation(&a, "download", &touch(&pinned, true), nothing())
            .unwrap();
        let refused = order.host_access(&pinned, false).unwrap_err();
        assert!(refused.message.contains("no host wait"), "{refused}");
        order.waited_for(&a);
        order.host_access(&pinned, false).unwrap();
        order.host_access(&pinned, true).unwrap();
    }

    /// A refused operation records nothing: the buffer's log is as before it.
    #[test]
    fn a_refused_operation_leaves_no_trace() {
        let (order, id) = (HostOrder::default(), EngineId::fresh());
        let (a, b) = (
            EmulatedStream::new(id, 1).unwrap(),
            EmulatedStream::new(id, 2).unwrap(),
        );
        let (x, y) = (
            Mutex::new(AccessLog::default()),
            Mutex::new(AccessLog::default()),
        );
        order
            .operation(&a, "upload", &touch(&x, true), nothing())
            .unwrap();
        let both = [
            Touch {
                log: &y,
                writes: true,
            },
            Touch {
                log: &x,
                writes: false,
            },
        ];
        assert!(order.operation(&b, "kernel", &both, nothing()).is_err());
        // y was not recorded as written by B, so A may write it unordered with B.
        order
            .operation(&a, "zero", &touch(&y, true), nothing())
            .unwrap();
    }
}
