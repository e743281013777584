//! The one trait every device engine implements: CUDA (`backend::cuda`), HIP
//! (`backend::hip`) and the emulated device (`backend::emulated`), each in its own folder.
//! Launchers never see an engine: they speak to a `DeviceLease` (buffers, copies,
//! launches), which speaks to its device's engine through this trait only. A fourth engine
//! implements it and nothing else changes.
//!
//! The interface is bytes and addresses, as a driver's is: memory of a length, copies of
//! byte ranges, launches of a kernel by name with one pointer per parameter. Typing
//! (`DeviceBuffer<T>`, `Element`) lives above it, once, in `buffer.rs` and `launch.rs`.
//!
//! Work is queued on streams (`EngineStream`): each lease of a device holds one, so
//! several jobs run on a device at once, each in its own order. Work of two streams is
//! ordered only by an event one records and the other waits for (`record`, `wait`), or
//! by the host having waited for the first (`synchronize`, `read`). The emulated device
//! checks exactly that on every buffer each queued operation touches
//! (`backend::emulated::order`), so a missing event fails a test in CI.

use super::{DeviceError, KernelLimits, ModuleLoad};
use std::any::Any;
use std::ffi::c_void;

/// A grid of blocks: how many blocks in each dimension, threads per block, and dynamic
/// shared memory per block, as `cuLaunchKernel` and `hipModuleLaunchKernel` take them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid_dim: (u32, u32, u32),
    pub block_dim: (u32, u32, u32),
    pub shared_mem_bytes: u32,
}

/// Which engine an allocation belongs to: one number per engine made in this process, so
/// two devices of the same kind (or a device and its rebuilt context) are told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineId(u64);

impl EngineId {
    pub fn fresh() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        EngineId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// One allocation of an engine: `bytes()` bytes at a device address, freed when dropped.
pub trait EngineMemory: Send + Sync + 'static {
    fn bytes(&self) -> usize;

    /// The engine that allocated it.
    fn engine_id(&self) -> EngineId;

    /// Where the device address is kept: a launch's argument for this buffer is a pointer
    /// to it (the address is pointer-sized on every engine).
    fn address_slot(&self) -> *mut c_void;

    fn as_any(&self) -> &dyn Any;

    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A kernel launch's arguments as drivers take them: one pointer per parameter, to the
/// parameter's value (for a buffer, to its device address), with each value's size.
#[derive(Default)]
pub struct KernelArgs<'a> {
    pub pointers: Vec<*mut c_void>,
    pub sizes: Vec<usize>,
    /// The address slot of the last buffer passed mutably (an output), where the emulated
    /// device's `Fault::Corrupt` lands.
    pub last_output: Option<*mut c_void>,
    /// Each buffer argument and whether the kernel may write it (passed mutably): what
    /// the emulated device's order check reads.
    pub buffers: Vec<(&'a dyn EngineMemory, bool)>,
}

/// One of an engine's queues of work (a CUDA or HIP stream, the emulated device's
/// ordered stream): what a lease runs its work on. Destroyed when dropped.
pub trait EngineStream: Send + Sync + 'static {
    /// The engine that made it: a stream of another engine is refused.
    fn engine_id(&self) -> EngineId;

    fn as_any(&self) -> &dyn Any;
}

/// A point in one stream's work (an event without timing) that another stream can wait
/// for.
pub trait EngineEvent: Send + Sync + 'static {
    /// The engine that recorded it: an event of another engine is refused.
    fn engine_id(&self) -> EngineId;

    fn as_any(&self) -> &dyn Any;
}

/// A point in a device's work queue that the device stamps with its clock when it gets
/// there (a CUDA event): `gpu-ops check` times kernels apart from copies with pairs.
pub trait Timestamp: Send + 'static {
    /// Milliseconds from `start` to this one, once the device has reached both.
    fn ms_since(&self, start: &dyn Timestamp) -> Option<f64>;

    fn as_any(&self) -> &dyn Any;
}

/// Page-locked host memory of an engine: copies from and to it run at the bus's speed,
/// and they are queued like kernels (`upload_pinned`, `download_pinned`), so the host may
/// touch it only once the stream has passed them (a `synchronize`, or an event the host
/// waited for).
pub trait PinnedHost: Send + 'static {
    /// Where it starts; valid for `bytes()` bytes until it is dropped.
    fn as_mut_ptr(&self) -> *mut u8;

    fn bytes(&self) -> usize;

    /// The engine whose copies may use it.
    fn engine_id(&self) -> EngineId;

    /// Whether the host may read (or, `writes`, write) it now: no copy queued on it that
    /// the host has not waited for. The emulated device checks it (`order.rs`); the GPU
    /// engines have no way to and trust the caller, who synchronised.
    fn host_access(&self, _writes: bool) -> Result<(), DeviceError> {
        Ok(())
    }

    /// Where `range` of it starts, refused unless the range lies inside it.
    fn range_address(&self, range: &std::ops::Range<usize>) -> Result<*mut u8, DeviceError> {
        if range.start > range.end || range.end > self.bytes() {
            return Err(DeviceError::fatal(format!(
                "page-locked bytes {range:?} of a buffer of {}",
                self.bytes()
            )));
        }
        // SAFETY: inside the allocation (checked above).
        Ok(unsafe { self.as_mut_ptr().add(range.start) })
    }

    fn as_any(&self) -> &dyn Any;
}

/// What runs a device's work. Work is queued in order on the stream it is given (a lease's)
/// unless the method says it waits; streams are used by one thread at a time, the engine
/// by many at once.
pub trait DeviceEngine: Send + Sync + 'static {
    /// Makes the device current on the calling thread (CUDA's context, HIP's device).
    fn bind_to_thread(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// (free, total) bytes now, where the engine can tell.
    fn memory(&self) -> Option<(u64, u64)>;

    /// `bytes` of device memory (never a zero-byte allocation: every buffer has an
    /// address). Its contents are unspecified.
    fn alloc(&self, bytes: usize) -> Result<Box<dyn EngineMemory>, DeviceError>;

    /// `bytes` of zeroed device memory: `alloc` then `zero` on `stream`, unless the
    /// engine's allocations come zeroed.
    fn alloc_zeroed(
        &self,
        stream: &dyn EngineStream,
        bytes: usize,
    ) -> Result<Box<dyn EngineMemory>, DeviceError> {
        let mut memory = self.alloc(bytes)?;
        self.zero(stream, &mut *memory)?;
        Ok(memory)
    }

    /// Whether `memory` was allocated by this engine (this device, this context): a
    /// buffer of another device is refused, even one of the same kind.
    fn owns(&self, memory: &dyn EngineMemory) -> bool {
        memory.engine_id() == self.id()
    }

    /// This engine's identity, unique in the process (`EngineId::fresh`): what each of
    /// its allocations and streams carries.
    fn id(&self) -> EngineId;

    /// A new stream, unordered with respect to every other (CUDA's non-blocking kind).
    fn new_stream(&self) -> Result<Box<dyn EngineStream>, DeviceError>;

    /// An event at the end of the work queued on `stream` so far.
    fn record(&self, stream: &dyn EngineStream) -> Result<Box<dyn EngineEvent>, DeviceError>;

    /// Makes the work queued on `stream` from now on wait for `event`.
    fn wait(&self, stream: &dyn EngineStream, event: &dyn EngineEvent) -> Result<(), DeviceError>;

    /// Blocks the host until the work before `event` has finished (`cuEventSynchronize`):
    /// unlike `synchronize`, later work on the stream may still be running, so a job can
    /// refill one staging buffer while the copy from the other is under way.
    fn host_wait(&self, event: &dyn EngineEvent) -> Result<(), DeviceError>;

    /// Copies `bytes` host bytes at `src` into `dst`. Pageable `src` may be reused when this
    /// returns (the driver has staged it); page-locked `src` must live until the engine is
    /// next synchronised.
    ///
    /// # Safety
    /// `src` must be valid for `bytes` reads, `bytes` at most `dst.bytes()`, and `dst` this
    /// engine's (`owns`).
    unsafe fn write(
        &self,
        stream: &dyn EngineStream,
        dst: &mut dyn EngineMemory,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), DeviceError>;

    /// Queues a copy of `src`'s bytes `range` into `dst` from byte `at` on (as many as
    /// fit): unlike `write`, it returns at once and reads `src` while the stream runs.
    /// `at` past the end of `dst` is refused. Where the engine has no page-locked memory
    /// of its own this is `write` (the default), which copies only to the start.
    ///
    /// # Safety
    /// `range` must lie inside `src`, both this engine's; the host must not write `src`'s
    /// range until the stream has passed the copy.
    unsafe fn upload_pinned(
        &self,
        stream: &dyn EngineStream,
        dst: &mut dyn EngineMemory,
        at: usize,
        src: &dyn PinnedHost,
        range: std::ops::Range<usize>,
    ) -> Result<(), DeviceError> {
        if at != 0 {
            return Err(no_offset_copies());
        }
        // SAFETY: the caller's contract; the range is inside the allocation.
        unsafe { self.write(stream, dst, src.as_mut_ptr().add(range.start), range.len()) }
    }

    /// Queues a copy of `src`'s bytes from `at` on (as many as `range` holds, or as
    /// remain) into `dst`'s `range`: it returns at once, and the bytes are there once the
    /// host has waited for the stream. `at` past the end of `src` is refused. The default
    /// is `read`, which waits and copies only from the start.
    ///
    /// # Safety
    /// `range` must lie inside `dst`, both this engine's; the host must not touch `dst`'s
    /// range until the stream has passed the copy.
    unsafe fn download_pinned(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        at: usize,
        dst: &dyn PinnedHost,
        range: std::ops::Range<usize>,
    ) -> Result<(), DeviceError> {
        if at != 0 {
            return Err(no_offset_copies());
        }
        // SAFETY: the caller's contract; the range is inside the allocation.
        unsafe { self.read(stream, src, dst.as_mut_ptr().add(range.start), range.len()) }
    }

    /// Copies `bytes` of `src` out to `dst` once the work queued on `stream` before has
    /// finished, and returns when they are there.
    ///
    /// # Safety
    /// `dst` must be valid for `bytes` writes, `bytes` at most `src.bytes()`, and `src`
    /// this engine's.
    unsafe fn read(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), DeviceError>;

    /// Zeroes all of `memory` (this engine's).
    fn zero(
        &self,
        stream: &dyn EngineStream,
        memory: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError>;

    /// Copies the first `min(src, dst)` bytes of `src` into `dst`, both this engine's.
    fn copy(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        dst: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError>;

    /// Waits for all the work queued on `stream` so far.
    fn synchronize(&self, stream: &dyn EngineStream) -> Result<(), DeviceError>;

    /// Whether kernel `name` is loaded.
    fn has_kernel(&self, name: &str) -> bool;

    /// Whether the engine has every kernel `op`'s device path launches: an engine with
    /// kernels for some ops only (wgpu's) leaves the others to the CPU or another device.
    fn serves(&self, _op: &str) -> bool {
        true
    }

    /// Why `op` is not served here (`serves` is false): `/device`'s reason for an
    /// `unavailable` op, and the 503's.
    fn why_not_served(&self, _op: &str) -> &'static str {
        crate::backend::verify::NO_KERNELS
    }

    /// The most dynamic shared memory a launch of kernel `name` may ask, where the
    /// engine bounds it below what the launchers assume (a WGSL kernel's workgroup
    /// array); `None`: the launcher's own budget holds.
    fn max_shared_bytes(&self, _name: &str) -> Option<u32> {
        None
    }

    /// Kernel `name`'s limits as this engine knows them.
    fn kernel_limits(&self, name: &str) -> KernelLimits;

    /// Queues kernel `name` on `stream`.
    ///
    /// # Safety
    /// `args` must be the kernel's parameters in order and type, every buffer among them
    /// this engine's, and every index the kernel computes for `config` inside its buffers,
    /// as for `cuLaunchKernel`.
    unsafe fn launch(
        &self,
        stream: &dyn EngineStream,
        name: &str,
        config: LaunchConfig,
        args: &mut KernelArgs<'_>,
    ) -> Result<(), DeviceError>;

    /// A timestamp queued on `stream`, where the engine has device clocks (CUDA events);
    /// `None` times the work on the host after synchronising.
    fn timestamp(&self, _stream: &dyn EngineStream) -> Option<Box<dyn Timestamp>> {
        None
    }

    /// `bytes` of page-locked host memory for this engine's copies, where it has it
    /// (`cuMemHostAlloc`, `hipHostMalloc`, the emulated device's checked stand-in).
    fn pinned_host(&self, _bytes: usize) -> Result<Option<Box<dyn PinnedHost>>, DeviceError> {
        Ok(None)
    }

    /// `bytes` of host memory at `address`, which the caller owns, page-locked for this
    /// engine's copies (`cuMemHostRegister`): copies from and to the handle run at the
    /// bus's speed, as from `pinned_host`'s, and dropping it unregisters the range. The
    /// memory stays the caller's whatever becomes of the engine: a re-probe's reset drops
    /// the registration, never the bytes, so a request body read into it stays valid
    /// (`pinned_body.rs`). `None` where the engine cannot: its bodies stay pageable and
    /// are staged.
    ///
    /// # Safety
    /// `address` must be valid for `bytes` bytes and outlive the handle.
    unsafe fn register_host(
        &self,
        _address: *mut u8,
        _bytes: usize,
    ) -> Result<Option<Box<dyn PinnedHost>>, DeviceError> {
        Ok(None)
    }

    /// Each kernel module's compile and load, in library order.
    fn module_loads(&self) -> Vec<ModuleLoad>;

    /// Clocks, bus width, caches as the driver reports them (`gpu-ops check`).
    fn facts(&self) -> serde_json::Value;

    /// The engine itself, for what only one engine has (cuBLASLt and cuDNN on CUDA,
    /// injected faults on the emulated device).
    fn as_any(&self) -> &dyn Any;
}

/// A device's engine, whichever it is.
pub type Engine = Box<dyn DeviceEngine>;

/// `memory` as engine `id`'s own kind `M`, or the refusal of a buffer from another engine
/// (another kind, or another device of the same kind).
pub(crate) fn own<M: EngineMemory>(
    id: EngineId,
    memory: &dyn EngineMemory,
) -> Result<&M, DeviceError> {
    if memory.engine_id() != id {
        return Err(foreign());
    }
    memory.as_any().downcast_ref::<M>().ok_or_else(foreign)
}

/// As `own`, mutably.
pub(crate) fn own_mut<M: EngineMemory>(
    id: EngineId,
    memory: &mut dyn EngineMemory,
) -> Result<&mut M, DeviceError> {
    if memory.engine_id() != id {
        return Err(foreign());
    }
    memory.as_any_mut().downcast_mut::<M>().ok_or_else(foreign)
}

/// `stream` as engine `id`'s own kind `S`, or the refusal of another engine's stream.
pub(crate) fn own_stream<S: EngineStream>(
    id: EngineId,
    stream: &dyn EngineStream,
) -> Result<&S, DeviceError> {
    let refused = || DeviceError::fatal("a stream of another device reached this one");
    if stream.engine_id() != id {
        return Err(refused());
    }
    stream.as_any().downcast_ref::<S>().ok_or_else(refused)
}

/// `pinned` as engine `id`'s own kind `P`, or the refusal of another engine's memory.
pub(crate) fn own_pinned<P: PinnedHost>(
    id: EngineId,
    pinned: &dyn PinnedHost,
) -> Result<&P, DeviceError> {
    if pinned.engine_id() != id {
        return Err(foreign());
    }
    pinned.as_any().downcast_ref::<P>().ok_or_else(foreign)
}

/// `event` as engine `id`'s own kind `E`, or the refusal of another engine's event.
pub(crate) fn own_event<E: EngineEvent>(
    id: EngineId,
    event: &dyn EngineEvent,
) -> Result<&E, DeviceError> {
    let refused = || DeviceError::fatal("an event of another device reached this one");
    if event.engine_id() != id {
        return Err(refused());
    }
    event.as_any().downcast_ref::<E>().ok_or_else(refused)
}

/// A buffer handed to an engine that did not allocate it.
pub(crate) fn foreign() -> DeviceError {
    DeviceError::fatal("a buffer of another device reached this one")
}

/// The bytes a device buffer of `bytes` holds from byte `at` on, or the refusal of an
/// offset past its end: the bound of every copy at an offset.
pub(crate) fn room_from(at: usize, bytes: usize) -> Result<usize, DeviceError> {
    bytes.checked_sub(at).ok_or_else(|| {
        DeviceError::fatal(format!(
            "a copy at byte {at} of a device buffer of {bytes} bytes"
        ))
    })
}

/// The default copies' refusal of an offset.
fn no_offset_copies() -> DeviceError {
    DeviceError::fatal("this engine copies page-locked memory only to a buffer's start")
}
