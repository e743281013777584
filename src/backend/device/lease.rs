//! Leases: how jobs share a device. A lease is one stream of the device's engine and a
//! share of its job memory, so up to `--gpu-jobs-per-device` jobs run on a device at once,
//! each in its own order, while their copies and kernels interleave on the device.
//!
//! Memory: the device's job memory (`GpuDevice::memory_budget`, read when a job starts on
//! the idle device and kept while any job runs) is shared by reservation. A job asks for
//! what it expects to use; it is given that, clamped between a fair share (the job memory
//! over the jobs per device) and all of it, and never more than is unreserved. A job that
//! cannot have at least its fair share (or what it asked, if less) waits for a lease to
//! end. Launchers size their passes to their lease's share (`memory_budget`,
//! `items_per_pass`), so jobs side by side never ask the device for more than it has.

use super::engine::{DeviceEngine, EngineEvent, EngineStream, LaunchConfig};
use super::{DeviceError, DeviceErrorKind, Engine, GpuDevice};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard, OnceLock, RwLockReadGuard};
use std::time::{Duration, Instant};

/// `--gpu-jobs-per-device`'s default: enough streams that one job's copies overlap
/// another's kernels, few enough that each keeps a large share of the memory.
pub const DEFAULT_JOBS_PER_DEVICE: usize = 4;

/// A device's leases now.
#[derive(Default)]
pub(super) struct Slots {
    /// Leases held.
    active: usize,
    /// Jobs waiting for a lease.
    waiting: usize,
    /// Bytes the held leases reserved.
    reserved: usize,
    /// The job memory they share: read when a lease starts on the idle device.
    pool: usize,
    /// Streams of the current engine no lease holds, kept for the next.
    pub(super) idle_streams: Vec<Box<dyn EngineStream>>,
}

/// Held while a job uses the device: its stream and its share of the memory.
pub struct DeviceLease<'a> {
    pub device: &'a GpuDevice,
    engine: RwLockReadGuard<'a, Engine>,
    /// Taken back into the device's idle streams when the lease ends.
    stream: Option<Box<dyn EngineStream>>,
    /// A second stream, for a chunked job's other lane (`pipeline.rs`); made on first use.
    second: OnceLock<Box<dyn EngineStream>>,
    /// Which stream the lease's work goes to now: 0 its own, 1 the second (`on_lane`).
    lane: AtomicUsize,
    /// The host bytes its copies moved, by kind.
    pub(super) copies: CopyCounts,
    reserved: usize,
    /// When the job stops being wanted: its deadline, and its caller leaving.
    stop: Option<Stop>,
    waited: bool,
    /// The device as the pool shares it, when the lease was given one (`set_handle`):
    /// what a result kept on the device (`keep_table`) holds on to.
    handle: Option<Arc<GpuDevice>>,
}

/// What ends a job's claim on the device before it finishes.
#[derive(Clone)]
pub struct Stop {
    pub deadline: Instant,
    /// Set when the caller has gone (its request dropped).
    pub abandoned: Arc<AtomicBool>,
}

/// The host bytes a lease's copies moved: through page-locked staging, straight from a
/// request body already in page-locked memory, or straight from pageable memory; and the
/// chunked jobs that found no staging buffer.
#[derive(Default, Debug)]
pub struct CopyCounts {
    pub staged_to_device: AtomicU64,
    pub body_to_device: AtomicU64,
    pub staged_from_device: AtomicU64,
    pub pageable_to_device: AtomicU64,
    pub pageable_from_device: AtomicU64,
    pub staging_fallbacks: AtomicU64,
}

impl CopyCounts {
    pub(super) fn add(counter: &AtomicU64, bytes: usize) {
        counter.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// A point in one lease's work another lease (or a later use) can wait for.
pub struct Event(pub(super) Box<dyn EngineEvent>);

/// How often a job waiting for a lease looks at its deadline and its caller.
const WAIT_CHECK: Duration = Duration::from_millis(20);

impl GpuDevice {
    /// A lease for work that wants the whole job memory (the check, calibration, tests):
    /// blocks until no other lease holds more than its fair share. Call from a blocking
    /// thread, not the runtime.
    pub fn lease(&self) -> Result<DeviceLease<'_>, DeviceError> {
        self.lease_for(None, usize::MAX)
    }

    /// As `lease`, for a job that `stop` may end: refused as `Abandoned` if it ended
    /// while the job waited.
    pub fn lease_until(&self, stop: Option<Stop>) -> Result<DeviceLease<'_>, DeviceError> {
        self.lease_for(stop, usize::MAX)
    }

    /// A lease for a job that expects to use `wanted` bytes of device memory (see the
    /// module's note for what it is given).
    pub fn lease_for(
        &self,
        stop: Option<Stop>,
        wanted: usize,
    ) -> Result<DeviceLease<'_>, DeviceError> {
        let mut waited = false;
        let mut slots = self.slot_table();
        let (reserved, stream) = loop {
            if slots.active == 0 {
                slots.pool = self.memory_budget();
            }
            let jobs = self.jobs_per_device();
            let fair = slots.pool / jobs;
            let unreserved = slots.pool.saturating_sub(slots.reserved);
            let least = wanted.min(fair);
            if slots.active == 0 || (slots.active < jobs && unreserved >= least) {
                let share = wanted.clamp(fair, slots.pool).min(unreserved);
                slots.active += 1;
                slots.reserved += share;
                break (share, slots.idle_streams.pop());
            }
            waited = true;
            slots.waiting += 1;
            slots = self
                .slot_freed
                .wait_timeout(slots, WAIT_CHECK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            slots.waiting -= 1;
            if let Some(stop) = &stop {
                if let Err(e) = stop.check() {
                    self.lease_waits.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
            }
        };
        drop(slots);
        if waited {
            self.lease_waits.fetch_add(1, Ordering::Relaxed);
        }
        let mut lease = DeviceLease {
            device: self,
            engine: self.engine(),
            stream: None,
            second: OnceLock::new(),
            lane: AtomicUsize::new(0),
            copies: CopyCounts::default(),
            reserved,
            stop,
            waited,
            handle: None,
        };
        let stream = {
            let engine = lease.engine();
            engine.bind_to_thread()?;
            // A kept stream of an engine a re-probe replaced meanwhile is dropped.
            match stream {
                Some(s) if s.engine_id() == engine.id() => s,
                _ => engine.new_stream()?,
            }
        };
        lease.stream = Some(stream);
        lease.still_wanted()?;
        Ok(lease)
    }

    /// `--gpu-jobs-per-device`: how many jobs may hold this device at once (at least 1).
    pub fn set_jobs_per_device(&self, jobs: usize) {
        self.jobs_per_device.store(jobs.max(1), Ordering::Relaxed);
        self.slot_freed.notify_all();
    }

    pub fn jobs_per_device(&self) -> usize {
        self.jobs_per_device.load(Ordering::Relaxed).max(1)
    }

    /// Leases held now.
    pub fn jobs_running(&self) -> usize {
        self.slot_table().active
    }

    /// Jobs waiting for a lease now.
    pub fn jobs_waiting(&self) -> usize {
        self.slot_table().waiting
    }

    /// Leases that waited for a slot or for memory, since start.
    pub fn lease_waits(&self) -> u64 {
        self.lease_waits.load(Ordering::Relaxed)
    }

    pub(super) fn slot_table(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Stop {
    /// `Abandoned` once the deadline has passed or the caller has gone.
    fn check(&self) -> Result<(), DeviceError> {
        let why = if self.abandoned.load(Ordering::Relaxed) {
            "its caller has gone"
        } else if Instant::now() >= self.deadline {
            "its deadline has passed"
        } else {
            return Ok(());
        };
        Err(DeviceError {
            kind: DeviceErrorKind::Abandoned,
            message: format!("the job was dropped on the device: {why}"),
        })
    }
}

impl Drop for DeviceLease<'_> {
    fn drop(&mut self) {
        let mut slots = self.device.slot_table();
        slots.active -= 1;
        slots.reserved -= self.reserved;
        // The engine is still the current one: this lease holds its read lock.
        slots.idle_streams.extend(self.stream.take());
        slots.idle_streams.extend(self.second.take());
        drop(slots);
        self.device.slot_freed.notify_all();
    }
}

impl DeviceLease<'_> {
    /// `Abandoned` once the job's deadline has passed or its caller has gone: launchers
    /// call it between passes, so work nobody waits for stops holding the device.
    pub fn still_wanted(&self) -> Result<(), DeviceError> {
        self.stop.as_ref().map_or(Ok(()), Stop::check)
    }

    pub(crate) fn engine(&self) -> &dyn DeviceEngine {
        &**self.engine
    }

    /// Whether the device has kernel `name` loaded: how a launcher chooses a kernel that
    /// only some engines have (the NVIDIA-only ones).
    pub fn has_kernel(&self, name: &str) -> bool {
        self.engine().has_kernel(name)
    }

    /// The stream the lease's work is queued on now, in order: its own, or within
    /// `on_lane(1, ..)` its second.
    pub(crate) fn stream(&self) -> &dyn EngineStream {
        match self.second.get() {
            Some(second) if self.lane.load(Ordering::Relaxed) == 1 => &**second,
            _ => self
                .stream
                .as_deref()
                .expect("a lease holds its stream until it ends"),
        }
    }

    /// Runs `work` with the lease's work queued on lane `lane` (0: its own stream, 1: a
    /// second, taken from the device's idle streams or made): what a chunked job's two
    /// lanes overlap on. Work of the two lanes is ordered only by events and host waits.
    pub(crate) fn on_lane<R>(
        &self,
        lane: usize,
        work: impl FnOnce() -> R,
    ) -> Result<R, DeviceError> {
        if lane == 1 && self.second.get().is_none() {
            let engine = self.engine();
            let kept = self.device.slot_table().idle_streams.pop();
            let stream = match kept {
                Some(s) if s.engine_id() == engine.id() => s,
                _ => engine.new_stream()?,
            };
            let _ = self.second.set(stream);
        }
        /// Puts the lane back however `work` ends, a panic included.
        struct Restore<'l>(&'l AtomicUsize, usize);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                self.0.store(self.1, Ordering::Relaxed);
            }
        }
        let _restore = Restore(&self.lane, self.lane.swap(lane.min(1), Ordering::Relaxed));
        Ok(work())
    }

    /// Whether a chunked job used the lease's second lane.
    #[cfg(test)]
    pub(super) fn used_second_lane(&self) -> bool {
        self.second.get().is_some()
    }

    /// The host bytes this lease's copies moved so far.
    pub fn copies(&self) -> &CopyCounts {
        &self.copies
    }

    /// Whether this lease waited for another to end.
    pub fn waited(&self) -> bool {
        self.waited
    }

    /// Bytes this job may allocate: its share of the device's job memory.
    pub fn memory_budget(&self) -> usize {
        self.reserved
    }

    /// How many of `items` items of `per_item` bytes fit in one pass beside `fixed`
    /// bytes, within the budget; at least one.
    pub fn items_per_pass(&self, items: usize, per_item: usize, fixed: usize) -> usize {
        let room = self.memory_budget().saturating_sub(fixed);
        (room / per_item.max(1)).clamp(1, items.max(1))
    }

    /// An event at the end of the work queued on this lease's stream so far.
    pub fn record(&self) -> Result<Event, DeviceError> {
        Ok(Event(self.engine().record(self.stream())?))
    }

    /// Makes this lease's later work wait for `event` (of this device).
    pub fn wait(&self, event: &Event) -> Result<(), DeviceError> {
        self.engine().wait(self.stream(), &*event.0)
    }

    /// Gives the lease the shared handle of its device (the pool's leases have one).
    pub fn set_handle(&mut self, device: Arc<GpuDevice>) {
        self.handle = Some(device);
    }

    /// The shared handle of the device, if the lease was given one.
    pub fn handle(&self) -> Option<&Arc<GpuDevice>> {
        self.handle.as_ref()
    }

    /// A grid-stride launch over `n` items: enough blocks to fill the device, no more.
    pub fn launch_config(&self, n: usize) -> LaunchConfig {
        const THREADS: u32 = 256;
        let wanted = n.div_ceil(THREADS as usize).max(1);
        let cap = (self.device.info.sm_count.max(1) * 32) as usize;
        LaunchConfig {
            grid_dim: (wanted.min(cap) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Waits for the work queued on this lease's stream (copies back are already
    /// synchronous).
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        self.engine().synchronize(self.stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::DeviceBuffer;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;

    const KIB: usize = 1 << 10;

    /// Up to `--gpu-jobs-per-device` leases at once, each on its own stream; one more
    /// waits until a lease ends, and is counted as having waited.
    #[test]
    fn jobs_share_a_device_up_to_its_jobs_per_device() {
        let dev = GpuDevice::emulated(0, 1 << 20);
        dev.set_jobs_per_device(2);
        let (a, b) = (
            dev.lease_for(None, 1).unwrap(),
            dev.lease_for(None, 1).unwrap(),
        );
        assert_eq!(dev.jobs_running(), 2);
        assert!(!a.waited() && !b.waited());
        assert_ne!(
            a.stream() as *const dyn EngineStream as *const u8,
            b.stream() as *const dyn EngineStream as *const u8,
            "each lease has a stream of its own"
        );
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let dev = &dev;
            s.spawn(move || {
                let third = dev.lease_for(None, 1).unwrap();
                tx.send(third.waited()).unwrap();
            });
            assert!(
                rx.recv_timeout(Duration::from_millis(100)).is_err(),
                "a third lease was granted beside two"
            );
            drop(a);
            assert!(rx.recv().unwrap(), "the third lease waited");
        });
        assert_eq!(dev.lease_waits(), 1);
        drop(b);
        assert_eq!(dev.jobs_running(), 0);
    }

    /// The job memory is shared by reservation: a share is what was asked, at least the
    /// fair share and at most what is unreserved, never more than the whole; a job that
    /// cannot have its least waits until enough is released.
    #[test]
    fn memory_is_reserved_in_shares_that_never_pass_the_whole() {
        let dev = GpuDevice::emulated(0, 4 << 20);
        dev.set_memory_limit(1 << 20);
        dev.set_jobs_per_device(4);
        let small = dev.lease_for(None, 100).unwrap();
        assert_eq!(small.memory_budget(), 256 * KIB, "raised to the fair share");
        let large = dev.lease_for(None, 10 << 20).unwrap();
        assert_eq!(large.memory_budget(), 768 * KIB, "what was left");
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let dev = &dev;
            s.spawn(move || {
                let next = dev.lease_for(None, 64 * KIB).unwrap();
                tx.send(next.memory_budget()).unwrap();
            });
            assert!(
                rx.recv_timeout(Duration::from_millis(100)).is_err(),
                "a lease was granted with nothing unreserved"
            );
            drop(small);
            assert_eq!(rx.recv().unwrap(), 256 * KIB);
        });
        drop(large);
        // Alone, a job that asks for everything gets all of it, as before leases shared.
        assert_eq!(dev.lease().unwrap().memory_budget(), 1 << 20);
    }

    /// Two leases' jobs run on one device at the same time: each waits, holding its
    /// lease, until both hold theirs (an exclusive lease would never get there).
    #[test]
    fn two_jobs_hold_one_device_at_the_same_time() {
        let dev = GpuDevice::emulated(0, 1 << 20);
        let holding = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let lease = dev.lease_for(None, 1024).unwrap();
                    let buf = lease.upload(&[1u64, 2, 3]).unwrap();
                    holding.fetch_add(1, Ordering::SeqCst);
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while holding.load(Ordering::SeqCst) < 2 {
                        assert!(
                            Instant::now() < deadline,
                            "the other job never got the device"
                        );
                        std::thread::yield_now();
                    }
                    assert_eq!(lease.download(&buf).unwrap(), [1, 2, 3]);
                });
            }
        });
    }

    /// Adds `a` and `b` into a fresh buffer on `lease`'s stream.
    fn add(
        lease: &DeviceLease<'_>,
        a: &DeviceBuffer<u64>,
        b: &DeviceBuffer<u64>,
    ) -> Result<DeviceBuffer<u64>, DeviceError> {
        let mut out = lease.alloc_zeros::<u64>(a.len())?;
        let (n, stride) = (a.len() as u64, 1u32);
        let mut launch = lease.launch("goldilocks_add")?;
        launch.arg(a).arg(b).arg(&mut out).arg(&n).arg(&stride);
        // SAFETY: goldilocks_add's parameters in order; every buffer holds n values.
        unsafe { launch.launch(lease.launch_config(a.len()))? };
        drop(launch);
        Ok(out)
    }

    /// A buffer one lease uploaded is used on another's stream only after an event (or a
    /// host wait) orders the two: without one the emulated device refuses the launch,
    /// as a GPU could have run it before the upload landed. A cached table carries its
    /// upload's event, so a second job uses it safely.
    #[test]
    fn work_across_two_leases_streams_needs_an_event() {
        let dev = GpuDevice::emulated(0, 1 << 20);
        let (a, b) = (
            dev.lease_for(None, 1).unwrap(),
            dev.lease_for(None, 1).unwrap(),
        );
        let x = a.upload(&[1u64, 2, 3]).unwrap();
        let y = b.upload(&[10u64, 20, 30]).unwrap();
        let refused = add(&b, &x, &y)
            .err()
            .expect("an unordered use was let through");
        assert!(refused.message.contains("no event"), "{refused}");
        b.wait(&a.record().unwrap()).unwrap();
        let sum = add(&b, &x, &y).unwrap();
        assert_eq!(b.download(&sum).unwrap(), [11, 22, 33]);

        // A table made on A and taken from the cache on B.
        let table = a.cached_table("t", || a.upload(&[5u64, 6, 7])).unwrap();
        let again = b
            .cached_table::<u64>("t", || panic!("cached already"))
            .unwrap();
        assert!(Arc::ptr_eq(&table, &again));
        let sum = add(&b, &again, &y).unwrap();
        assert_eq!(b.download(&sum).unwrap(), [15, 26, 37]);
    }
}
