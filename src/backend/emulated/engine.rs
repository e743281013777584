//! The emulated device's engine: memory accounting against a pretend size, host memory
//! for device memory, launches run by the runtime in `mod.rs` on their stream's thread,
//! streams and events whose order every operation is checked against (`order.rs`) and
//! that run beside the host and each other (`queue.rs`), and the faults tests inject.

use super::super::device::engine::{
    own, own_event, own_mut, own_pinned, own_stream, room_from, DeviceEngine, EngineEvent,
    EngineId, EngineMemory, EngineStream, KernelArgs, LaunchConfig, PinnedHost,
};
use super::super::device::{DeviceError, DeviceErrorKind, KernelLimits, ModuleLoad};
use super::memory::HostMemory;
use super::order::{AccessLog, EmulatedEvent, EmulatedStream, HostOrder};
use super::pinned::EmulatedPinned;
use super::queue::{Address, Work};
use std::alloc::Layout;
use std::any::Any;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The emulated device's memory accounting: allocations past its pretend size fail as
/// out of memory, so launchers' passes and chunks run as they would on a small GPU.
pub struct EmulatedEngine {
    /// What this engine's allocations carry (`DeviceEngine::owns`).
    id: EngineId,
    total: usize,
    in_use: Arc<AtomicUsize>,
    faults: Mutex<Vec<Injected>>,
    /// Streams made so far: the next one's number.
    streams: AtomicU64,
    /// Shared with its page-locked buffers, whose host touches it checks.
    order: Arc<HostOrder>,
    /// Nanoseconds spent in its allocations, copies, memsets and launches: what a GPU's
    /// allocator, copy engines and SMs would do, so the rest of a device job's time is
    /// its host side. Shared with the work queued on its streams' threads.
    busy_ns: Arc<AtomicU64>,
    /// Nanoseconds callers spent in it waiting: in allocations and host waits. With
    /// streams on threads of their own, a job's time less this is its host side.
    waiting_ns: AtomicU64,
}

/// A fault the emulated device injects into launches: how tests show that the
/// self-test, the shadow checks and the fault policy catch a device gone wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The launch fails with this kind of error (`Fatal`: as a lost device would).
    Fail(DeviceErrorKind),
    /// The launch runs, then the lowest bit of the first byte of the last buffer it was
    /// passed mutably (an output) flips: a silently wrong answer.
    Corrupt,
    /// The launch runs correctly after this many milliseconds: a device slowed by another
    /// tenant or by throttling, for the placement tests.
    SlowMs(u32),
}

struct Injected {
    kernel_prefix: String,
    fault: Fault,
    remaining: u32,
}

impl EmulatedEngine {
    /// Multiprocessors the emulated device reports: launches that fill the device
    /// (`DeviceLease::launch_config`) get 32 blocks, so grid-stride loops wrap at small
    /// sizes.
    pub const SM_COUNT: u32 = 1;

    pub fn new(total_bytes: u64) -> Self {
        Self {
            id: EngineId::fresh(),
            total: total_bytes as usize,
            in_use: Arc::new(AtomicUsize::new(0)),
            faults: Mutex::new(Vec::new()),
            streams: AtomicU64::new(0),
            order: Arc::new(HostOrder::default()),
            busy_ns: Arc::new(AtomicU64::new(0)),
            waiting_ns: AtomicU64::new(0),
        }
    }

    /// A fresh engine of the same size (a re-probe's rebuilt context) that keeps the
    /// faults still to inject, so tests can make a re-probe fail.
    pub fn rebuilt(&self) -> Self {
        let engine = Self::new(self.total as u64);
        *engine.fault_list() = std::mem::take(&mut *self.fault_list());
        engine
    }

    /// Injects `fault` into the next `times` launches of kernels whose names start with
    /// `kernel_prefix` ("" for every kernel).
    pub fn inject(&self, kernel_prefix: &str, fault: Fault, times: u32) {
        self.fault_list().push(Injected {
            kernel_prefix: kernel_prefix.to_string(),
            fault,
            remaining: times,
        });
    }

    /// The fault this launch of `kernel` gets, if any (counted off).
    pub(crate) fn take_fault(&self, kernel: &str) -> Option<Fault> {
        let mut faults = self.fault_list();
        let i = faults
            .iter()
            .position(|f| f.remaining > 0 && kernel.starts_with(&f.kernel_prefix))?;
        faults[i].remaining -= 1;
        let fault = faults[i].fault;
        faults.retain(|f| f.remaining > 0);
        Some(fault)
    }

    /// Seconds spent in allocations, copies, memsets and launches since the engine was
    /// made, summed over its streams' threads (work of two streams that ran at once
    /// counts twice).
    pub fn busy_seconds(&self) -> f64 {
        self.busy_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// Seconds callers spent waiting for it (allocations, host waits) since it was made.
    pub fn waiting_seconds(&self) -> f64 {
        self.waiting_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// Queued work that runs `run` on the stream's thread, its time counted as the
    /// engine's.
    fn timed_work(&self, run: impl FnOnce() + Send + 'static) -> Work {
        let busy = self.busy_ns.clone();
        Box::new(move || {
            timed(&busy, run);
            Ok(())
        })
    }

    /// Queued work that copies `bytes` from `from` to `to`.
    fn copy_work(&self, from: Address, to: Address, bytes: usize) -> Work {
        // SAFETY: the caller checked both ranges hold `bytes` bytes, and the engine's
        // contracts keep them alive and untouched by the host until this has run.
        self.timed_work(move || unsafe { super::copy_bytes(to.ptr(), from.ptr(), bytes) })
    }

    fn fault_list(&self) -> std::sync::MutexGuard<'_, Vec<Injected>> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (free, total) bytes.
    pub fn memory(&self) -> (u64, u64) {
        let used = self.in_use.load(Ordering::Relaxed);
        (self.total.saturating_sub(used) as u64, self.total as u64)
    }

    /// `bytes` of zeroed device memory, or out of memory past the device's size.
    pub fn alloc(&self, bytes: usize) -> Result<HostMemory, DeviceError> {
        let before = self.in_use.fetch_add(bytes, Ordering::Relaxed);
        if before + bytes > self.total {
            self.in_use.fetch_sub(bytes, Ordering::Relaxed);
            return Err(DeviceError::out_of_memory(format!(
                "emulated device: {bytes} bytes requested, {} of {} free",
                self.total.saturating_sub(before),
                self.total
            )));
        }
        // 256-byte aligned as cudaMalloc's; never zero-sized, as the allocator needs.
        let layout = Layout::from_size_align(bytes.max(1), 256)
            .map_err(|e| DeviceError::out_of_memory(format!("emulated device: {e}")))?;
        // SAFETY: the layout's size is nonzero. Counted as the engine's time: zeroing
        // (and faulting in) the host pages that stand for device memory is the emulated
        // device's own work, which a GPU's allocator does not do.
        let ptr = timed(&self.waiting_ns, || {
            timed(&self.busy_ns, || unsafe {
                std::alloc::alloc_zeroed(layout)
            })
        });
        if ptr.is_null() {
            self.in_use.fetch_sub(bytes, Ordering::Relaxed);
            return Err(DeviceError::out_of_memory(format!(
                "emulated device: the host refused {bytes} bytes"
            )));
        }
        Ok(HostMemory {
            address: ptr.cast(),
            bytes,
            engine: self.id,
            layout,
            in_use: self.in_use.clone(),
            log: Mutex::new(AccessLog::default()),
        })
    }
}

impl DeviceEngine for EmulatedEngine {
    fn memory(&self) -> Option<(u64, u64)> {
        Some(EmulatedEngine::memory(self))
    }

    fn alloc(&self, bytes: usize) -> Result<Box<dyn EngineMemory>, DeviceError> {
        Ok(Box::new(EmulatedEngine::alloc(self, bytes)?))
    }

    /// Its allocations come zeroed (`alloc_zeroed` of the host allocator).
    fn alloc_zeroed(
        &self,
        _stream: &dyn EngineStream,
        bytes: usize,
    ) -> Result<Box<dyn EngineMemory>, DeviceError> {
        DeviceEngine::alloc(self, bytes)
    }

    fn id(&self) -> EngineId {
        self.id
    }

    fn new_stream(&self) -> Result<Box<dyn EngineStream>, DeviceError> {
        let number = self.streams.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(Box::new(EmulatedStream::new(self.id, number)?))
    }

    fn record(&self, stream: &dyn EngineStream) -> Result<Box<dyn EngineEvent>, DeviceError> {
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        Ok(Box::new(self.order.record(self.id, stream)))
    }

    fn wait(&self, stream: &dyn EngineStream, event: &dyn EngineEvent) -> Result<(), DeviceError> {
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        let event = own_event::<EmulatedEvent>(self.id, event)?;
        self.order.wait(stream, event);
        Ok(())
    }

    /// Blocks until the event's stream has run everything before it; the host has then
    /// seen it finish, for the order check too.
    fn host_wait(&self, event: &dyn EngineEvent) -> Result<(), DeviceError> {
        let event = own_event::<EmulatedEvent>(self.id, event)?;
        // Failed or not, the work before the event has finished (a failure skips the rest).
        let waited = timed(&self.waiting_ns, || event.host_wait());
        self.order.waited_for_event(event);
        waited
    }

    /// Returns once the stream has copied `src` (a pageable source may be reused then):
    /// the wait a driver's pageable copy makes.
    unsafe fn write(
        &self,
        stream: &dyn EngineStream,
        dst: &mut dyn EngineMemory,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let dst = own::<HostMemory>(self.id(), dst)?;
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        let (to, n) = dst.span(0, bytes);
        let work = self.copy_work(Address(src.cast_mut()), to, n);
        let ticket = self
            .order
            .operation(stream, "an upload", &[dst.touch(true)], work)?;
        timed(&self.waiting_ns, || stream.queue().host_wait(ticket))
    }

    /// Queued as on a GPU: the source counts as read by the stream until the host waits.
    unsafe fn upload_pinned(
        &self,
        stream: &dyn EngineStream,
        dst: &mut dyn EngineMemory,
        at: usize,
        src: &dyn PinnedHost,
        range: std::ops::Range<usize>,
    ) -> Result<(), DeviceError> {
        let dst = own::<HostMemory>(self.id(), dst)?;
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        let src = own_pinned::<EmulatedPinned>(self.id, src)?;
        let from = src.range_address(&range)?;
        room_from(at, dst.bytes)?;
        // The range is inside the pinned buffer, `at` inside dst (checked); at most what
        // dst holds from there is copied.
        let (to, n) = dst.span(at, range.len());
        let work = self.copy_work(Address(from), to, n);
        self.order.operation(
            stream,
            "an upload from page-locked memory",
            &[dst.touch(true), src.touch(false)],
            work,
        )?;
        Ok(())
    }

    /// Queued as on a GPU: the bytes count as in flight until the host waits for the
    /// stream, and reading them before is refused (`PinnedHost::host_access`).
    unsafe fn download_pinned(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        at: usize,
        dst: &dyn PinnedHost,
        range: std::ops::Range<usize>,
    ) -> Result<(), DeviceError> {
        let src = own::<HostMemory>(self.id(), src)?;
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        let dst = own_pinned::<EmulatedPinned>(self.id, dst)?;
        let to = dst.range_address(&range)?;
        room_from(at, src.bytes)?;
        // The range is inside the pinned buffer, `at` inside src (checked); at most what
        // src holds from there is copied.
        let (from, n) = src.span(at, range.len());
        let work = self.copy_work(from, Address(to), n);
        self.order.operation(
            stream,
            "a download to page-locked memory",
            &[src.touch(false), dst.touch(true)],
            work,
        )?;
        Ok(())
    }

    /// Waits for the stream, as a download does on a GPU.
    unsafe fn read(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let src = own::<HostMemory>(self.id(), src)?;
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        let (from, n) = src.span(0, bytes);
        let work = self.copy_work(from, Address(dst), n);
        self.order
            .operation(stream, "a download", &[src.touch(false)], work)?;
        let waited = timed(&self.waiting_ns, || stream.host_wait());
        self.order.waited_for(stream);
        waited
    }

    fn zero(
        &self,
        stream: &dyn EngineStream,
        memory: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError> {
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        let memory = own_mut::<HostMemory>(self.id(), memory)?;
        let (at, n) = memory.span(0, memory.bytes);
        // SAFETY: the allocation holds n bytes from `at`, alive until this has run.
        let work = self.timed_work(move || unsafe { super::zero_bytes(at.ptr(), n) });
        self.order
            .operation(stream, "a memset", &[memory.touch(true)], work)?;
        Ok(())
    }

    fn copy(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        dst: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError> {
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        let src = own::<HostMemory>(self.id(), src)?;
        let dst = own_mut::<HostMemory>(self.id(), dst)?;
        let (from, n) = src.span(0, dst.bytes);
        // Two allocations never overlap.
        let work = self.copy_work(from, dst.span(0, n).0, n);
        self.order.operation(
            stream,
            "a device copy",
            &[src.touch(false), dst.touch(true)],
            work,
        )?;
        Ok(())
    }

    /// Blocks until the stream's thread has run everything queued on it; the host has
    /// then seen it finish, for the order check too.
    fn synchronize(&self, stream: &dyn EngineStream) -> Result<(), DeviceError> {
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        let waited = timed(&self.waiting_ns, || stream.host_wait());
        self.order.waited_for(stream);
        waited
    }

    fn has_kernel(&self, name: &str) -> bool {
        super::kernel_params(name).is_some()
    }

    /// The source's `__launch_bounds__`, which the runtime enforces itself.
    fn kernel_limits(&self, name: &str) -> KernelLimits {
        let bound = super::kernel_max_threads(name);
        KernelLimits {
            kernel: name.to_string(),
            launch_bound: bound,
            max_threads: bound,
            registers: None,
            local_bytes: None,
            fits: bound.is_some(),
        }
    }

    unsafe fn launch(
        &self,
        stream: &dyn EngineStream,
        name: &str,
        config: LaunchConfig,
        args: &mut KernelArgs<'_>,
    ) -> Result<(), DeviceError> {
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        let touches = args
            .buffers
            .iter()
            .map(|&(memory, writes)| Ok(own::<HostMemory>(self.id, memory)?.touch(writes)))
            .collect::<Result<Vec<_>, DeviceError>>()?;
        // What a driver checks when the launch is queued, refused then; what goes wrong
        // while it runs (a barrier not every thread reached) reaches the stream's next
        // host wait.
        let expected = super::kernel_params(name).unwrap_or_default();
        if expected.len() == args.sizes.len() && expected != args.sizes {
            return Err(DeviceError::fatal(format!(
                "emulated device: {name} takes arguments of {expected:?} bytes, the launch passed {:?}",
                args.sizes
            )));
        }
        if args.pointers.len() != args.sizes.len() {
            return Err(DeviceError::fatal(format!(
                "emulated device: {name}'s launch passed {} arguments and {} sizes",
                args.pointers.len(),
                args.sizes.len()
            )));
        }
        let fault = self.take_fault(name);
        if let Some(Fault::Fail(kind)) = fault {
            return Err(DeviceError {
                kind,
                message: format!("emulated device: a fault injected into {name}"),
            });
        }
        // The arguments' values are taken now, as the driver takes them: the caller's
        // may be gone by the time the stream runs the kernel.
        let mut values: Vec<Vec<u128>> = Vec::with_capacity(args.sizes.len());
        for (&pointer, &size) in args.pointers.iter().zip(&args.sizes) {
            let mut value = vec![0u128; size.div_ceil(16).max(1)];
            // SAFETY: the caller's contract: each pointer is to a value of its size.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    pointer.cast::<u8>(),
                    value.as_mut_ptr().cast::<u8>(),
                    size,
                )
            };
            values.push(value);
        }
        let corrupt = match (fault, args.last_output) {
            // SAFETY: the slot holds a live buffer's address (the launch borrows it), and
            // a buffer holds at least one byte (the allocator rounds zero up).
            (Some(Fault::Corrupt), Some(slot)) => Some(Address(unsafe { *slot.cast::<*mut u8>() })),
            _ => None,
        };
        let slow_ms = match fault {
            Some(Fault::SlowMs(ms)) => u64::from(ms),
            _ => 0,
        };
        let (kernel, busy) = (name.to_string(), self.busy_ns.clone());
        let work: Work = Box::new(move || {
            let mut values = values;
            if slow_ms > 0 {
                std::thread::sleep(std::time::Duration::from_millis(slow_ms));
            }
            let mut pointers: Vec<*mut c_void> =
                values.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
            // SAFETY: the caller's contract; the buffers the arguments name wait for this
            // work before they are freed (`queue::Users`).
            timed(&busy, || unsafe {
                super::launch(&kernel, config, &mut pointers)
            })
            .map_err(|e| DeviceError::fatal(format!("emulated device: {e}")))?;
            if let Some(out) = corrupt {
                // SAFETY: as above: a live buffer of at least one byte.
                unsafe { *out.ptr() ^= 1 };
            }
            Ok(())
        });
        self.order
            .operation(stream, &format!("kernel {name}"), &touches, work)?;
        Ok(())
    }

    /// Host memory whose copies are queued and checked like a GPU's (`pinned.rs`).
    fn pinned_host(&self, bytes: usize) -> Result<Option<Box<dyn PinnedHost>>, DeviceError> {
        let pinned = EmulatedPinned::new(self.id, self.order.clone(), bytes)?;
        Ok(Some(Box::new(pinned)))
    }

    unsafe fn register_host(
        &self,
        address: *mut u8,
        bytes: usize,
    ) -> Result<Option<Box<dyn PinnedHost>>, DeviceError> {
        // SAFETY: the caller's contract.
        let pinned =
            unsafe { EmulatedPinned::registered(self.id, self.order.clone(), address, bytes) };
        Ok(Some(Box::new(pinned)))
    }

    fn module_loads(&self) -> Vec<ModuleLoad> {
        vec![ModuleLoad {
            module: "all (built into this binary)".into(),
            seconds: 0.0,
            cache: "host",
        }]
    }

    fn facts(&self) -> serde_json::Value {
        serde_json::json!({ "emulated": true })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Runs `work`, its time added to `busy`'s nanoseconds.
fn timed<R>(busy: &AtomicU64, work: impl FnOnce() -> R) -> R {
    let started = std::time::Instant::now();
    let out = work();
    let ns = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
    busy.fetch_add(ns, Ordering::Relaxed);
    out
}
