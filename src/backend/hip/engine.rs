//! The HIP engine: one AMD device as the device interface (`backend::device`) needs it —
//! allocate, copy in and out, zero, copy on the device, launch a kernel by name with its
//! arguments as `void**` (`hipModuleLaunchKernel` takes them as `cuLaunchKernel` does),
//! synchronise. Every call goes through the runtime loaded at run time (`Libraries`),
//! each function looked up once, by name, with the C signature HIP declares; only
//! functions whose signatures ROCm 5 and 6 share are used (no `hipDeviceProp_t` field
//! is read by offset: the struct changed between them).
//!
//! Work is queued on streams, one per lease (`HipStream`), ordered across streams by
//! events, as the CUDA engine's is. No AMD GPU has run this engine yet; the self-tests
//! and shadow checks that stand between any engine and an answer stand between this one
//! and an answer too.

use super::Loaded;
use crate::backend::device::engine::EngineId;
use crate::backend::device::{DeviceError, KernelLimits, ModuleLoad};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

pub(crate) type Ptr = *mut c_void;

/// `hipErrorOutOfMemory` (the same value on ROCm 5 and 6).
const OUT_OF_MEMORY: c_int = 2;
/// `hipDeviceAttributeMultiprocessorCount` (compute units).
const ATTRIBUTE_COMPUTE_UNITS: c_int = 63;
/// `HIP_FUNC_ATTRIBUTE_*`.
const FUNC_MAX_THREADS: c_int = 0;
const FUNC_LOCAL_BYTES: c_int = 3;
const FUNC_REGISTERS: c_int = 4;

type LaunchKernel = unsafe extern "C" fn(
    Ptr,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Ptr,
    *mut Ptr,
    *mut Ptr,
) -> c_int;

/// The runtime's functions, resolved once. The library stays loaded for the process
/// (`libraries()` is a static), so the pointers stay valid.
#[derive(Clone, Copy)]
pub struct Api {
    set_device: unsafe extern "C" fn(c_int) -> c_int,
    device_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int,
    device_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int,
    pci_bus_id: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> c_int,
    malloc: unsafe extern "C" fn(*mut Ptr, usize) -> c_int,
    free: unsafe extern "C" fn(Ptr) -> c_int,
    pub(super) htod: unsafe extern "C" fn(Ptr, Ptr, usize, Ptr) -> c_int,
    pub(super) dtoh: unsafe extern "C" fn(Ptr, Ptr, usize, Ptr) -> c_int,
    pub(super) host_malloc: unsafe extern "C" fn(*mut Ptr, usize, c_uint) -> c_int,
    pub(super) host_free: unsafe extern "C" fn(Ptr) -> c_int,
    pub(super) host_register: unsafe extern "C" fn(Ptr, usize, c_uint) -> c_int,
    pub(super) host_unregister: unsafe extern "C" fn(Ptr) -> c_int,
    dtod: unsafe extern "C" fn(Ptr, Ptr, usize, Ptr) -> c_int,
    memset: unsafe extern "C" fn(Ptr, c_int, usize, Ptr) -> c_int,
    stream_create: unsafe extern "C" fn(*mut Ptr) -> c_int,
    stream_destroy: unsafe extern "C" fn(Ptr) -> c_int,
    stream_synchronize: unsafe extern "C" fn(Ptr) -> c_int,
    stream_wait_event: unsafe extern "C" fn(Ptr, Ptr, c_uint) -> c_int,
    event_create: unsafe extern "C" fn(*mut Ptr, c_uint) -> c_int,
    event_record: unsafe extern "C" fn(Ptr, Ptr) -> c_int,
    event_synchronize: unsafe extern "C" fn(Ptr) -> c_int,
    event_destroy: unsafe extern "C" fn(Ptr) -> c_int,
    module_load: unsafe extern "C" fn(*mut Ptr, *const c_void) -> c_int,
    module_unload: unsafe extern "C" fn(Ptr) -> c_int,
    module_function: unsafe extern "C" fn(*mut Ptr, Ptr, *const c_char) -> c_int,
    function_attribute: unsafe extern "C" fn(*mut c_int, c_int, Ptr) -> c_int,
    launch: LaunchKernel,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    device_reset: unsafe extern "C" fn() -> c_int,
}

impl Api {
    /// Every engine function of `runtime`, or the first one it lacks.
    pub fn load(runtime: &Loaded) -> Result<Api, String> {
        fn get<T: Copy>(runtime: &Loaded, name: &str) -> Result<T, String> {
            // SAFETY: `T` is the C signature HIP declares for `name` (the fields below).
            unsafe { runtime.library.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|_| {
                    format!(
                        "the HIP runtime at {} lacks {name}: not a runtime this engine can use",
                        runtime.path
                    )
                })
        }
        Ok(Api {
            set_device: get(runtime, "hipSetDevice")?,
            device_name: get(runtime, "hipDeviceGetName")?,
            device_attribute: get(runtime, "hipDeviceGetAttribute")?,
            pci_bus_id: get(runtime, "hipDeviceGetPCIBusId")?,
            mem_get_info: get(runtime, "hipMemGetInfo")?,
            malloc: get(runtime, "hipMalloc")?,
            free: get(runtime, "hipFree")?,
            htod: get(runtime, "hipMemcpyHtoDAsync")?,
            dtoh: get(runtime, "hipMemcpyDtoHAsync")?,
            dtod: get(runtime, "hipMemcpyDtoDAsync")?,
            host_malloc: get(runtime, "hipHostMalloc")?,
            host_free: get(runtime, "hipHostFree")?,
            host_register: get(runtime, "hipHostRegister")?,
            host_unregister: get(runtime, "hipHostUnregister")?,
            memset: get(runtime, "hipMemsetAsync")?,
            stream_create: get(runtime, "hipStreamCreate")?,
            stream_destroy: get(runtime, "hipStreamDestroy")?,
            stream_synchronize: get(runtime, "hipStreamSynchronize")?,
            stream_wait_event: get(runtime, "hipStreamWaitEvent")?,
            event_create: get(runtime, "hipEventCreateWithFlags")?,
            event_record: get(runtime, "hipEventRecord")?,
            event_synchronize: get(runtime, "hipEventSynchronize")?,
            event_destroy: get(runtime, "hipEventDestroy")?,
            module_load: get(runtime, "hipModuleLoadData")?,
            module_unload: get(runtime, "hipModuleUnload")?,
            module_function: get(runtime, "hipModuleGetFunction")?,
            function_attribute: get(runtime, "hipFuncGetAttribute")?,
            launch: get(runtime, "hipModuleLaunchKernel")?,
            error_string: get(runtime, "hipGetErrorString")?,
            device_reset: get(runtime, "hipDeviceReset")?,
        })
    }

    /// Resets device `ordinal` in this process: every allocation, module and stream on
    /// it is gone, and a sticky error with them (a re-probe's fresh start, as the CUDA
    /// path resets its primary context).
    pub fn reset_device(&self, ordinal: usize) -> Result<(), String> {
        // SAFETY: HIP's signatures.
        let rc = unsafe {
            match (self.set_device)(ordinal as c_int) {
                0 => (self.device_reset)(),
                rc => rc,
            }
        };
        self.check(rc, "hipDeviceReset")
            .map_err(|e| format!("AMD device {ordinal}: {e}"))
    }

    /// `rc` as a device error: out of memory, or fatal (the context may be unusable).
    pub(super) fn check(&self, rc: c_int, what: &str) -> Result<(), DeviceError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: hipGetErrorString returns a static string (or null) for any code.
        let text = unsafe {
            let s = (self.error_string)(rc);
            if s.is_null() {
                "unknown error".to_string()
            } else {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            }
        };
        let message = format!("HIP: {what}: {text} ({rc})");
        Err(if rc == OUT_OF_MEMORY {
            DeviceError::out_of_memory(message)
        } else {
            DeviceError::fatal(message)
        })
    }

    /// A NUL-terminated string the runtime writes into `len` bytes.
    fn string(
        &self,
        f: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int,
        device: c_int,
    ) -> Option<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the runtime writes at most `len` bytes, NUL-terminated.
        let rc = unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, device) };
        buf[buf.len() - 1] = 0;
        // SAFETY: terminated above whatever the runtime wrote.
        (rc == 0).then(|| {
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        })
    }
}

/// Device memory of the HIP engine: exactly `bytes`, freed when dropped.
pub struct HipMemory {
    /// The device address; launches pass a pointer to this field, as HIP takes a buffer
    /// argument.
    pub(super) address: Ptr,
    pub(super) bytes: usize,
    pub(crate) engine: EngineId,
    free: unsafe extern "C" fn(Ptr) -> c_int,
}

// SAFETY: a device address is a number the runtime resolves from any thread; the memory
// is used only under the device's lease.
unsafe impl Send for HipMemory {}
unsafe impl Sync for HipMemory {}

impl HipMemory {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Where the device address is kept: a launch's argument for this buffer.
    pub fn address_slot(&self) -> *mut c_void {
        (&self.address as *const Ptr).cast_mut().cast()
    }
}

impl Drop for HipMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by hipMalloc and freed once, here.
        unsafe { (self.free)(self.address) };
    }
}

/// One AMD device's engine: the runtime, the device's ordinal and the loaded kernels.
pub struct HipEngine {
    /// What this engine's allocations and streams carry (`DeviceEngine::owns`).
    pub(crate) id: EngineId,
    pub(super) api: Api,
    ordinal: c_int,
    modules: Vec<Ptr>,
    functions: HashMap<String, Ptr>,
    limits: HashMap<String, KernelLimits>,
    pub module_loads: Vec<ModuleLoad>,
}

// SAFETY: the modules and functions are runtime handles valid on any thread once the
// device is current there (`bind_to_thread`, on every lease); HIP's calls on them are
// thread-safe, and each stream is used by its lease's thread alone.
unsafe impl Send for HipEngine {}
unsafe impl Sync for HipEngine {}

impl Drop for HipEngine {
    fn drop(&mut self) {
        // SAFETY: handles this engine created, released once.
        unsafe {
            (self.api.set_device)(self.ordinal);
            for &m in &self.modules {
                (self.api.module_unload)(m);
            }
        }
    }
}

/// What opening a device found out, for `GpuInfo`.
pub struct Opened {
    pub engine: HipEngine,
    pub name: String,
    pub pci_bus_id: String,
    pub compute_units: u32,
    pub memory_total: u64,
}

impl HipEngine {
    /// Makes the device current on this thread (HIP's current device is per thread).
    pub fn bind_to_thread(&self) -> Result<(), DeviceError> {
        // SAFETY: HIP's signature.
        self.api.check(
            unsafe { (self.api.set_device)(self.ordinal) },
            "hipSetDevice",
        )
    }

    pub fn alloc(&self, bytes: usize) -> Result<HipMemory, DeviceError> {
        // hipMalloc allocates on the calling thread's current device: make it this one,
        // whatever thread holds the lease.
        self.bind_to_thread()?;
        let mut address: Ptr = std::ptr::null_mut();
        // Never a zero-byte allocation (HIP may answer null): a buffer has an address.
        // SAFETY: HIP's signature; the out-pointer is valid.
        let rc = unsafe { (self.api.malloc)(&mut address, bytes.max(1)) };
        self.api.check(rc, "hipMalloc")?;
        Ok(HipMemory {
            address,
            bytes,
            engine: self.id,
            free: self.api.free,
        })
    }

    /// A new stream on this device, destroyed when dropped.
    pub fn new_stream(&self) -> Result<HipStream, DeviceError> {
        self.bind_to_thread()?;
        let mut handle: Ptr = std::ptr::null_mut();
        // SAFETY: HIP's signature; the out-pointer is valid.
        let rc = unsafe { (self.api.stream_create)(&mut handle) };
        self.api.check(rc, "hipStreamCreate")?;
        Ok(HipStream {
            engine: self.id,
            handle,
            api: self.api,
            ordinal: self.ordinal,
        })
    }

    /// An event at the end of `stream`'s work so far, destroyed when dropped.
    pub fn record(&self, stream: &HipStream) -> Result<HipEvent, DeviceError> {
        /// `hipEventDisableTiming`: an event for ordering only is cheaper.
        const DISABLE_TIMING: c_uint = 2;
        let mut handle: Ptr = std::ptr::null_mut();
        // SAFETY: HIP's signatures; the out-pointer is valid, the stream this device's.
        let rc = unsafe { (self.api.event_create)(&mut handle, DISABLE_TIMING) };
        self.api.check(rc, "hipEventCreateWithFlags")?;
        let event = HipEvent {
            engine: self.id,
            handle,
            api: self.api,
        };
        // SAFETY: as above.
        let rc = unsafe { (self.api.event_record)(handle, stream.handle) };
        self.api.check(rc, "hipEventRecord")?;
        Ok(event)
    }

    /// Blocks the host until the work before `event` has finished.
    pub fn host_wait(&self, event: &HipEvent) -> Result<(), DeviceError> {
        // SAFETY: HIP's signature; the handle is live and this device's.
        let rc = unsafe { (self.api.event_synchronize)(event.handle) };
        self.api.check(rc, "hipEventSynchronize")
    }

    /// `stream`'s later work waits for `event`.
    pub fn wait(&self, stream: &HipStream, event: &HipEvent) -> Result<(), DeviceError> {
        // SAFETY: HIP's signature; both handles are live and this device's.
        let rc = unsafe { (self.api.stream_wait_event)(stream.handle, event.handle, 0) };
        self.api.check(rc, "hipStreamWaitEvent")
    }

    /// Copies `bytes` host bytes at `src` into `dst` and waits: the host memory may go
    /// as soon as this returns.
    ///
    /// # Safety
    /// `src` must hold `bytes` readable bytes, at most `dst.bytes()`.
    pub unsafe fn write(
        &self,
        stream: &HipStream,
        dst: &HipMemory,
        src: *const c_void,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        debug_assert!(bytes <= dst.bytes);
        // SAFETY: the caller's contract; HIP's signature.
        let rc = unsafe { (self.api.htod)(dst.address, src.cast_mut(), bytes, stream.handle) };
        self.api.check(rc, "hipMemcpyHtoDAsync")?;
        self.synchronize(stream)
    }

    /// Copies `bytes` bytes of `src` to host memory at `dst`, after the work before it.
    ///
    /// # Safety
    /// `dst` must have room for `bytes` bytes, at most `src.bytes()`.
    pub unsafe fn read(
        &self,
        stream: &HipStream,
        src: &HipMemory,
        dst: *mut c_void,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        debug_assert!(bytes <= src.bytes);
        // SAFETY: the caller's contract; HIP's signature.
        let rc = unsafe { (self.api.dtoh)(dst, src.address, bytes, stream.handle) };
        self.api.check(rc, "hipMemcpyDtoHAsync")?;
        self.synchronize(stream)
    }

    pub fn zero(&self, stream: &HipStream, m: &mut HipMemory) -> Result<(), DeviceError> {
        // SAFETY: `m` holds `bytes` bytes; HIP's signature.
        let rc = unsafe { (self.api.memset)(m.address, 0, m.bytes, stream.handle) };
        self.api.check(rc, "hipMemsetAsync")
    }

    pub fn copy(
        &self,
        stream: &HipStream,
        src: &HipMemory,
        dst: &mut HipMemory,
    ) -> Result<(), DeviceError> {
        let bytes = src.bytes.min(dst.bytes);
        // SAFETY: both hold at least `bytes` bytes; HIP's signature.
        let rc = unsafe { (self.api.dtod)(dst.address, src.address, bytes, stream.handle) };
        self.api.check(rc, "hipMemcpyDtoDAsync")
    }

    pub fn synchronize(&self, stream: &HipStream) -> Result<(), DeviceError> {
        // SAFETY: HIP's signature; the stream is this engine's.
        let rc = unsafe { (self.api.stream_synchronize)(stream.handle) };
        self.api.check(rc, "hipStreamSynchronize")
    }

    /// Whether kernel `name` is loaded.
    pub fn has_kernel(&self, name: &str) -> bool {
        self.functions.contains_key(name)
    }

    /// Queues kernel `name` on the stream.
    ///
    /// # Safety
    /// `params` must point at the kernel's arguments in order and type, and the launch
    /// must keep inside its buffers, as for `hipModuleLaunchKernel`.
    pub unsafe fn launch(
        &self,
        stream: &HipStream,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), DeviceError> {
        let f = *self
            .functions
            .get(name)
            .ok_or_else(|| DeviceError::fatal(format!("kernel {name} is not loaded")))?;
        // SAFETY: the caller's contract; HIP's signature.
        let rc = unsafe {
            (self.api.launch)(
                f,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared_bytes,
                stream.handle,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.api.check(rc, &format!("launching {name}"))
    }

    /// (free, total) bytes now.
    pub fn memory(&self) -> Option<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: HIP's signature; the device is current on this thread after any lease.
        let rc = unsafe {
            (self.api.set_device)(self.ordinal);
            (self.api.mem_get_info)(&mut free, &mut total)
        };
        (rc == 0).then_some((free as u64, total as u64))
    }

    /// The most threads a block of kernel `name` may have here, where known.
    pub fn max_threads(&self, name: &str) -> Option<u32> {
        self.limits.get(name).and_then(|l| l.max_threads)
    }

    /// Kernel `name`'s limits, as read after load.
    pub fn kernel_limits(&self, name: &str) -> KernelLimits {
        self.limits
            .get(name)
            .cloned()
            .unwrap_or_else(|| KernelLimits::unknown(name, None))
    }

    /// Opens device `ordinal` of `api`'s runtime and loads `modules` (name, code object,
    /// entry points, compile seconds) on it.
    pub fn open(
        api: Api,
        ordinal: usize,
        modules: Vec<(&'static str, Vec<u8>, &[String], f64)>,
    ) -> Result<Opened, String> {
        let device = ordinal as c_int;
        let fail = |what: &str, e: DeviceError| format!("AMD device {ordinal}: {what}: {e}");
        // SAFETY: HIP's signature.
        api.check(unsafe { (api.set_device)(device) }, "hipSetDevice")
            .map_err(|e| fail("selecting it", e))?;
        let mut engine = HipEngine {
            id: EngineId::fresh(),
            api,
            ordinal: device,
            modules: Vec::new(),
            functions: HashMap::new(),
            limits: HashMap::new(),
            module_loads: Vec::new(),
        };
        for (module, code, entry_points, compile_seconds) in modules {
            let started = std::time::Instant::now();
            let mut handle: Ptr = std::ptr::null_mut();
            // SAFETY: `code` is a whole code object that outlives the call (HIP copies
            // what it keeps); HIP's signature.
            let rc = unsafe { (api.module_load)(&mut handle, code.as_ptr().cast()) };
            api.check(rc, "hipModuleLoadData")
                .map_err(|e| fail(&format!("loading {module}"), e))?;
            engine.modules.push(handle);
            for name in entry_points {
                let c_name = CString::new(name.as_str()).map_err(|e| e.to_string())?;
                let mut f: Ptr = std::ptr::null_mut();
                // SAFETY: HIP's signature; `handle` is the module just loaded.
                let rc = unsafe { (api.module_function)(&mut f, handle, c_name.as_ptr()) };
                api.check(rc, "hipModuleGetFunction")
                    .map_err(|e| fail(&format!("kernel {name}"), e))?;
                engine.limits.insert(name.clone(), limits_of(&api, name, f));
                engine.functions.insert(name.clone(), f);
            }
            engine.module_loads.push(ModuleLoad {
                module: module.to_string(),
                seconds: compile_seconds + started.elapsed().as_secs_f64(),
                cache: "miss",
            });
        }
        let mut units = 0;
        // SAFETY: HIP's signature; the out-pointer is valid.
        unsafe { (api.device_attribute)(&mut units, ATTRIBUTE_COMPUTE_UNITS, device) };
        Ok(Opened {
            name: api
                .string(api.device_name, device)
                .unwrap_or_else(|| "AMD GPU".into()),
            pci_bus_id: api.string(api.pci_bus_id, device).unwrap_or_default(),
            compute_units: units.max(0) as u32,
            memory_total: engine.memory().map_or(0, |(_, t)| t),
            engine,
        })
    }
}

/// Kernel `name`'s limits as the runtime reports them, against its declared bound.
fn limits_of(api: &Api, name: &str, f: Ptr) -> KernelLimits {
    let attribute = |which| {
        let mut v = 0;
        // SAFETY: HIP's signature; `f` is a loaded function.
        let rc = unsafe { (api.function_attribute)(&mut v, which, f) };
        (rc == 0 && v >= 0).then_some(v as u32)
    };
    let bound = crate::backend::emulated::kernel_max_threads(name);
    let max_threads = attribute(FUNC_MAX_THREADS);
    KernelLimits {
        kernel: name.to_string(),
        launch_bound: bound,
        max_threads,
        registers: attribute(FUNC_REGISTERS),
        local_bytes: attribute(FUNC_LOCAL_BYTES),
        fits: bound.zip(max_threads).is_some_and(|(b, m)| b <= m),
    }
}

/// A stream of one AMD device, destroyed when dropped.
pub struct HipStream {
    pub(crate) engine: EngineId,
    pub(super) handle: Ptr,
    api: Api,
    ordinal: c_int,
}

// SAFETY: a runtime handle, valid on any thread where its device is current; a lease's
// thread alone queues work on it.
unsafe impl Send for HipStream {}
unsafe impl Sync for HipStream {}

impl Drop for HipStream {
    fn drop(&mut self) {
        // SAFETY: created by hipStreamCreate on this device, destroyed once.
        unsafe {
            (self.api.set_device)(self.ordinal);
            (self.api.stream_destroy)(self.handle);
        }
    }
}

/// An event of one AMD device, destroyed when dropped.
pub struct HipEvent {
    pub(crate) engine: EngineId,
    handle: Ptr,
    api: Api,
}

// SAFETY: a runtime handle, valid on any thread.
unsafe impl Send for HipEvent {}
unsafe impl Sync for HipEvent {}

impl Drop for HipEvent {
    fn drop(&mut self) {
        // SAFETY: created by hipEventCreateWithFlags, destroyed once.
        unsafe { (self.api.event_destroy)(self.handle) };
    }
}
