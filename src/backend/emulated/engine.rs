//! The emulated device's engine: memory accounting against a pretend size, host memory
//! for device memory, launches run to completion by the runtime in `mod.rs`, streams and
//! events whose order every operation is checked against (`order.rs`), and the faults
//! tests inject.

use super::super::device::engine::{
    own, own_event, own_mut, own_pinned, own_stream, room_from, DeviceEngine, EngineEvent,
    EngineId, EngineMemory, EngineStream, KernelArgs, LaunchConfig, PinnedHost,
};
use super::super::device::{DeviceError, DeviceErrorKind, KernelLimits, ModuleLoad};
use super::order::{AccessLog, EmulatedEvent, EmulatedStream, HostOrder, Touch};
use super::pinned::EmulatedPinned;
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
    /// its host side.
    busy_ns: AtomicU64,
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
            busy_ns: AtomicU64::new(0),
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

    /// Seconds spent in allocations, copies, memsets and launches since the engine was made.
    pub fn busy_seconds(&self) -> f64 {
        self.busy_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// Runs one copy, memset or launch, its time counted as the engine's.
    fn busy<R>(&self, work: impl FnOnce() -> R) -> R {
        let started = std::time::Instant::now();
        let out = work();
        let ns = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
        out
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
        let ptr = self.busy(|| unsafe { std::alloc::alloc_zeroed(layout) });
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

/// One emulated device allocation: host memory of exactly the requested bytes (plus the
/// allocator's rounding for zero), freed on drop.
pub struct HostMemory {
    /// Kernels receive a pointer to this field: the buffer's device address.
    address: *mut c_void,
    bytes: usize,
    engine: EngineId,
    layout: Layout,
    in_use: Arc<AtomicUsize>,
    /// Which streams touched it last (`order.rs`).
    log: Mutex<AccessLog>,
}

// SAFETY: the memory is owned by this value alone; access is ordered by the streams that
// use it, and that order is checked (`order.rs`).
unsafe impl Send for HostMemory {}
// SAFETY: shared references only read the address; kernels write through it only inside
// a launch of a buffer passed mutably, ordered as above.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    fn touch(&self, writes: bool) -> Touch<'_> {
        Touch {
            log: &self.log,
            writes,
        }
    }

    /// The buffer's device address (a host pointer).
    pub fn address(&self) -> *mut c_void {
        self.address
    }

    /// Where a launch's argument pointer for this buffer points: at its address.
    pub fn address_slot(&self) -> *mut c_void {
        &self.address as *const *mut c_void as *mut c_void
    }

    /// Copies `bytes` (at most what the allocation holds from byte `at`) from `src` in,
    /// from byte `at` on.
    ///
    /// # Safety
    /// `src` must be valid for `bytes` reads, and `at` at most the allocation's bytes.
    pub unsafe fn write(&self, at: usize, src: *const u8, bytes: usize) {
        let n = bytes.min(self.bytes - at);
        // SAFETY: both ranges hold n bytes and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src, self.address.cast::<u8>().add(at), n) };
    }

    /// Copies `bytes` (at most what the allocation holds from byte `at`) out to `dst`,
    /// from byte `at` on.
    ///
    /// # Safety
    /// `dst` must be valid for `bytes` writes, and `at` at most the allocation's bytes.
    pub unsafe fn read(&self, at: usize, dst: *mut u8, bytes: usize) {
        let n = bytes.min(self.bytes - at);
        // SAFETY: both ranges hold n bytes and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.address.cast::<u8>().add(at), dst, n) };
    }

    pub fn zero(&mut self) {
        // SAFETY: the allocation holds `bytes` bytes.
        unsafe { std::ptr::write_bytes(self.address.cast::<u8>(), 0, self.bytes) };
    }

    pub fn copy_from(&mut self, src: &HostMemory) {
        let n = self.bytes.min(src.bytes);
        // SAFETY: both allocations hold at least n bytes; two buffers never overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.address.cast::<u8>(), self.address.cast::<u8>(), n)
        };
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in EmulatedEngine::alloc.
        unsafe { std::alloc::dealloc(self.address.cast(), self.layout) };
        self.in_use.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl EngineMemory for HostMemory {
    fn bytes(&self) -> usize {
        self.bytes
    }

    fn engine_id(&self) -> EngineId {
        self.engine
    }

    fn address_slot(&self) -> *mut c_void {
        HostMemory::address_slot(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
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
        Ok(Box::new(EmulatedStream::new(self.id, number)))
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

    /// Its work runs when queued, so the wait is the order check's: the host has now
    /// seen everything before the event finish.
    fn host_wait(&self, event: &dyn EngineEvent) -> Result<(), DeviceError> {
        let event = own_event::<EmulatedEvent>(self.id, event)?;
        self.order.waited_for_event(event);
        Ok(())
    }

    unsafe fn write(
        &self,
        stream: &dyn EngineStream,
        dst: &mut dyn EngineMemory,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        let dst = own::<HostMemory>(self.id(), dst)?;
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        self.order
            .operation(stream, "an upload", &[dst.touch(true)])?;
        // SAFETY: the caller's contract.
        self.busy(|| unsafe { dst.write(0, src, bytes) });
        Ok(())
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
        self.order.operation(
            stream,
            "an upload from page-locked memory",
            &[dst.touch(true), src.touch(false)],
        )?;
        // SAFETY: the range is inside the pinned buffer, `at` inside dst (checked); `write`
        // copies at most what dst holds from there.
        self.busy(|| unsafe { dst.write(at, from, range.len()) });
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
        self.order.operation(
            stream,
            "a download to page-locked memory",
            &[src.touch(false), dst.touch(true)],
        )?;
        // SAFETY: the range is inside the pinned buffer, `at` inside src (checked); `read`
        // copies at most what src holds from there.
        self.busy(|| unsafe { src.read(at, to, range.len()) });
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
        self.order
            .operation(stream, "a download", &[src.touch(false)])?;
        // SAFETY: the caller's contract.
        self.busy(|| unsafe { src.read(0, dst, bytes) });
        self.order.waited_for(stream);
        Ok(())
    }

    fn zero(
        &self,
        stream: &dyn EngineStream,
        memory: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError> {
        let stream = own_stream::<EmulatedStream>(self.id, stream)?;
        let memory = own_mut::<HostMemory>(self.id(), memory)?;
        self.order
            .operation(stream, "a memset", &[memory.touch(true)])?;
        self.busy(|| memory.zero());
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
        self.order.operation(
            stream,
            "a device copy",
            &[src.touch(false), dst.touch(true)],
        )?;
        self.busy(|| dst.copy_from(src));
        Ok(())
    }

    /// Launches and copies finish before they return; what a GPU would still be running
    /// is now known to the host as finished (`order.rs`).
    fn synchronize(&self, stream: &dyn EngineStream) -> Result<(), DeviceError> {
        self.order
            .waited_for(own_stream::<EmulatedStream>(self.id, stream)?);
        Ok(())
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
        self.order
            .operation(stream, &format!("kernel {name}"), &touches)?;
        let fault = self.take_fault(name);
        if let Some(Fault::Fail(kind)) = fault {
            return Err(DeviceError {
                kind,
                message: format!("emulated device: a fault injected into {name}"),
            });
        }
        let expected = super::kernel_params(name).unwrap_or_default();
        if expected.len() == args.sizes.len() && expected != args.sizes {
            return Err(DeviceError::fatal(format!(
                "emulated device: {name} takes arguments of {expected:?} bytes, the launch passed {:?}",
                args.sizes
            )));
        }
        if let Some(Fault::SlowMs(ms)) = fault {
            std::thread::sleep(std::time::Duration::from_millis(u64::from(ms)));
        }
        // SAFETY: the caller's contract.
        self.busy(|| unsafe { super::launch(name, config, &mut args.pointers) })
            .map_err(|e| DeviceError::fatal(format!("emulated device: {e}")))?;
        if let (Some(Fault::Corrupt), Some(slot)) = (fault, args.last_output) {
            // SAFETY: the slot holds a live buffer's address (the launch borrows it), and a
            // buffer holds at least one byte (the allocator rounds zero up).
            unsafe {
                let out = *slot.cast::<*mut u8>();
                *out ^= 1;
            }
        }
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
