//! The emulated device's streams run on threads of their own, as a GPU's streams run
//! beside the host and beside each other: every queued copy, memset and launch is a
//! piece of work on its stream's thread, run in the order queued, while the host goes on.
//! Work of two streams meets only where one waits for the other's event (a wait queued on
//! the waiting stream's thread) or the host waits for both, so what the order check
//! (`order.rs`) refuses is also what would really run at once here: a launcher that reads
//! a download before its host wait reads bytes still being written, on this machine too,
//! and a buffer freed under queued work would be freed under a running thread (device
//! buffers and page-locked memory wait for their queued work when dropped, as
//! `cuMemFree` and `cuMemFreeHost` do, so that the free itself is no race).
//!
//! Errors are a GPU's too: a launch that fails while it runs (a barrier not every thread
//! reached) is reported by the stream's next host wait and every one after, and the
//! stream's later work is skipped, as after a CUDA context's sticky error; the fault
//! policy then retires the device and a re-probe gives it fresh streams.

use super::{sync_acquire, sync_release};
use crate::backend::device::DeviceError;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// One piece of queued work.
pub(super) type Work = Box<dyn FnOnce() -> Result<(), DeviceError> + Send>;

/// A stream's queue, shared by the stream, its thread, its events and the buffers its
/// queued work uses.
#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Work>,
    /// Work queued so far: the number (ticket) of the last piece.
    queued: u64,
    /// Work finished (or skipped) so far, in order: ticket `t` has finished once
    /// `finished >= t`.
    finished: u64,
    /// The stream's first failure: every later host wait reports it.
    failed: Option<DeviceError>,
    /// The stream is gone: its thread finishes what is queued and ends.
    closing: bool,
}

impl Queue {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `work`; its ticket.
    pub(super) fn push(&self, work: Work) -> u64 {
        let mut state = self.state();
        // What the host wrote for the work (a staging buffer's bytes) comes before it.
        sync_release(self);
        state.waiting.push_back(work);
        state.queued += 1;
        self.changed.notify_all();
        state.queued
    }

    /// The ticket of the last piece queued so far (0: none).
    pub(super) fn queued(&self) -> u64 {
        self.state().queued
    }

    /// Whether all the work queued so far has finished.
    #[cfg(test)]
    pub(super) fn is_idle(&self) -> bool {
        let state = self.state();
        state.finished == state.queued
    }

    /// Blocks until the work up to `ticket` has finished.
    pub(super) fn wait_for(&self, ticket: u64) {
        let mut state = self.state();
        while state.finished < ticket {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        drop(state);
        sync_acquire(self);
    }

    /// Blocks until the work up to `ticket` has finished: the stream's failure, if it
    /// has failed (a host wait's answer).
    pub(super) fn host_wait(&self, ticket: u64) -> Result<(), DeviceError> {
        self.wait_for(ticket);
        match &self.state().failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The stream's thread: runs the queued work in order until the stream is gone.
    fn run(&self) {
        loop {
            let (work, skip) = {
                let mut state = self.state();
                loop {
                    if let Some(work) = state.waiting.pop_front() {
                        break (work, state.failed.is_some());
                    }
                    if state.closing {
                        return;
                    }
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            };
            sync_acquire(self);
            let outcome = if skip {
                Ok(())
            } else {
                // A panic in the work is the device's failure, not the thread's end: a
                // host waiting for it would otherwise wait for ever.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|_| {
                    Err(DeviceError::fatal(
                        "emulated device: queued work panicked".to_string(),
                    ))
                })
            };
            // The work's writes (a download's bytes) come before whoever waits for it.
            sync_release(self);
            let mut state = self.state();
            state.finished += 1;
            if let Err(e) = outcome {
                state.failed.get_or_insert(e);
            }
            self.changed.notify_all();
        }
    }
}

/// A stream's thread and its queue; dropping it lets the queued work finish and ends the
/// thread (as destroying a CUDA stream does not cancel its work).
pub(super) struct Worker {
    pub(super) queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    pub(super) fn start(name: String) -> Result<Self, DeviceError> {
        let queue = Arc::new(Queue::default());
        let runs = queue.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || runs.run())
            .map_err(|e| DeviceError::fatal(format!("emulated device: no stream thread: {e}")))?;
        Ok(Self {
            queue,
            thread: Some(thread),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.queue.state().closing = true;
        self.queue.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The queued work that still uses one buffer: the last ticket of each stream that
/// touched it. Dropping the buffer first waits for all of it.
#[derive(Default)]
pub(super) struct Users(Vec<(Arc<Queue>, u64)>);

impl Users {
    pub(super) fn note(&mut self, queue: &Arc<Queue>, ticket: u64) {
        // Finished work needs no waiting: drop it, so a long-lived buffer's list stays
        // as short as the streams still using it.
        self.0
            .retain(|(q, t)| !Arc::ptr_eq(q, queue) && q.state().finished < *t);
        self.0.push((queue.clone(), ticket));
    }

    /// Blocks until every piece of queued work that used the buffer has finished.
    pub(super) fn wait_all(&mut self) {
        for (queue, ticket) in self.0.drain(..) {
            queue.wait_for(ticket);
        }
    }
}

/// A raw address moved into queued work. The engine's contracts (`DeviceEngine`) keep the
/// memory alive and untouched by the host until the work has run; the buffers' own
/// memory waits for it when dropped (`Users`).
#[derive(Clone, Copy)]
pub(super) struct Address(pub(super) *mut u8);

// SAFETY: see above; the work that carries it is the only one using it meanwhile, in the
// order the streams and events give.
unsafe impl Send for Address {}

impl Address {
    /// The address. Queued work calls this rather than reading the field, so the closure
    /// captures the whole `Address` (which is `Send`), not the bare pointer.
    pub(super) fn ptr(self) -> *mut u8 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Work runs in order on the stream's thread while the host goes on; a host wait sees
    /// everything before its ticket, and a failure, after which every host wait reports
    /// it and the stream's later work is skipped.
    #[test]
    fn work_runs_in_order_beside_the_host_and_a_failure_sticks() {
        let worker = Worker::start("test-stream".into()).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (gate, opened) = (Arc::new(Mutex::new(())), Arc::new(AtomicU64::new(0)));
        let held = gate.lock().unwrap();
        let first = {
            let (gate, opened) = (gate.clone(), opened.clone());
            worker.queue.push(Box::new(move || {
                drop(gate.lock().unwrap());
                opened.store(1, Ordering::SeqCst);
                Ok(())
            }))
        };
        for i in 0..3 {
            let seen = seen.clone();
            worker.queue.push(Box::new(move || {
                seen.lock().unwrap().push(i);
                Ok(())
            }));
        }
        // The first piece is blocked on the gate the host holds: nothing after it ran, and
        // queueing did not wait for it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(seen.lock().unwrap().is_empty());
        drop(held);
        worker.queue.host_wait(first).unwrap();
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        worker.queue.host_wait(worker.queue.queued()).unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![0, 1, 2]);

        worker
            .queue
            .push(Box::new(|| Err(DeviceError::fatal("broke".to_string()))));
        let skipped = {
            let seen = seen.clone();
            worker.queue.push(Box::new(move || {
                seen.lock().unwrap().push(9);
                Ok(())
            }))
        };
        let told = worker.queue.host_wait(skipped).unwrap_err();
        assert!(told.message.contains("broke"), "{told}");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![0, 1, 2],
            "skipped after the failure"
        );
        // Sticky, as a CUDA context's: later work is skipped and every wait reports it.
        let again = {
            let seen = seen.clone();
            worker.queue.push(Box::new(move || {
                seen.lock().unwrap().push(3);
                Ok(())
            }))
        };
        assert!(worker.queue.host_wait(again).is_err());
        assert_eq!(*seen.lock().unwrap(), vec![0, 1, 2]);
    }

    /// A buffer's users: dropping waits for the last queued work of each stream that
    /// touched it, and a stream dropped with work queued finishes it first.
    #[test]
    fn a_buffer_waits_for_the_work_that_uses_it() {
        let worker = Worker::start("test-stream".into()).unwrap();
        let done = Arc::new(AtomicU64::new(0));
        let mut users = Users::default();
        for _ in 0..2 {
            let done = done.clone();
            let ticket = worker.queue.push(Box::new(move || {
                std::thread::sleep(std::time::Duration::from_millis(10));
                done.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }));
            users.note(&worker.queue, ticket);
        }
        assert_eq!(users.0.len(), 1, "one entry per stream");
        users.wait_all();
        assert_eq!(done.load(Ordering::SeqCst), 2);

        let done_at_drop = done.clone();
        worker.queue.push(Box::new(move || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            done_at_drop.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }));
        drop(worker);
        assert_eq!(done.load(Ordering::SeqCst), 3);
    }
}
