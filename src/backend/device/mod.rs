//! The device interface every launcher speaks: a leased device allocates, copies in and
//! out, launches a kernel by name (grid, block, shared bytes, arguments as the driver takes
//! them), synchronises, and frees what it allocated when the buffer drops. A lease is a
//! stream and a share of the device's job memory (`lease.rs`), so several jobs run on one
//! device at once. Three engines
//! implement `DeviceEngine` (`engine.rs`), each in its own folder: CUDA through cudarc
//! (`backend::cuda`), HIP (`backend::hip`) and the emulated device (`backend::emulated`),
//! which runs the same `kernels/*.cu` compiled for the host. So every launcher, pass and
//! cache runs in CI without a GPU, exactly as it would on one.

mod bandwidth;
mod budget;
mod buffer;
mod clock;
pub mod engine;
pub mod held;
mod inventory;
mod launch;
mod lease;
mod lease_tables;
mod operand;
mod pinned_body;
mod pipeline;
mod staged;
mod staging;
mod tables;

pub use bandwidth::{best_rate, CopyBandwidth};
pub use buffer::{DeviceBuffer, Element};
pub use engine::{DeviceEngine, Engine, EngineEvent, EngineId, EngineStream, LaunchConfig};
pub use inventory::{KernelLimits, ModuleLoad};
pub use launch::Launch;
pub use lease::{CopyCounts, DeviceLease, Event, Stop, DEFAULT_JOBS_PER_DEVICE};
pub use pinned_body::{PinnedBlock, DEFAULT_PINNED_BODY_MIB};
pub use pipeline::{Chunk, Operand};
pub use staged::STAGED_COPY_MIN_BYTES;
pub use staging::{StagingBudget, DEFAULT_STAGING_MIB, STAGING_BUFFER_BYTES};

use super::emulated::EmulatedEngine;
use super::verify::{OpState, OpStatus};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use tables::TableCache;
pub use tables::{CacheCounts, CacheKind};

/// What `/device` reports for one device.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuInfo {
    pub ordinal: usize,
    /// Whose device: `nvidia`, `amd`, `intel`, `apple`, `other`, or `emulated`. Which
    /// engine runs it is `backend` in answers: CUDA for NVIDIA and HIP for AMD unless
    /// `adapter` is set (wgpu's).
    pub vendor: GpuVendor,
    pub name: String,
    pub uuid: String,
    /// "major.minor" on NVIDIA; the architecture (`gfx90a`) on AMD; "emulated" for the
    /// emulated device.
    pub compute_capability: String,
    pub sm_count: u32,
    pub memory_total_bytes: u64,
    /// Driver API version, e.g. "13.0"; empty on AMD and for the emulated device.
    pub cuda_version: String,
    /// NVRTC's version on NVIDIA ("13.0"); empty elsewhere.
    pub nvrtc_version: String,
    /// hipRTC's version on AMD ("6.2"); empty elsewhere.
    pub hiprtc_version: String,
    /// What the kernels were loaded as: a cubin for the exact architecture ("sm_90"), or
    /// PTX the driver compiled ("compute_90") where no cubin could be made; "host" for the
    /// emulated device.
    pub kernel_arch: String,
    /// True for the emulated device (`--emulate-device`): the kernels run on the CPU
    /// under CUDA's execution model, for testing; nothing about its speed means anything.
    pub emulated: bool,
    /// A wgpu adapter's API, type, driver and limits (absent on the other engines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<super::wgpu::AdapterFacts>,
}

/// Whose device, and so which engine runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum GpuVendor {
    Nvidia,
    Amd,
    Intel,
    Apple,
    /// A vendor the id does not name (a software adapter's, say).
    Other,
    Emulated,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceErrorKind {
    /// Not enough device memory for this job; the device itself is fine.
    OutOfMemory,
    /// Anything else: the context may be unusable, so the device is taken out of service.
    Fatal,
    /// The op has no kernel; the pool never sends it (`Job::device_refusal`).
    Unsupported,
    /// The job's deadline passed, or its caller left, while it waited for the device or
    /// between passes: dropped, not a device failure.
    Abandoned,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct DeviceError {
    pub kind: DeviceErrorKind,
    pub message: String,
}

impl DeviceError {
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            kind: DeviceErrorKind::Fatal,
            message: message.into(),
        }
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self {
            kind: DeviceErrorKind::Unsupported,
            message: message.into(),
        }
    }

    pub fn out_of_memory(message: impl Into<String>) -> Self {
        Self {
            kind: DeviceErrorKind::OutOfMemory,
            message: message.into(),
        }
    }

    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            DeviceErrorKind::OutOfMemory => "out_of_memory",
            DeviceErrorKind::Fatal => "device_error",
            DeviceErrorKind::Unsupported => "unsupported",
            DeviceErrorKind::Abandoned => "abandoned",
        }
    }
}

/// Device memory kept for cached constant tables (NTT twiddles and scale factors): an
/// eighth of the device, at least 512 MiB and at most 4 GiB, never over a quarter. A
/// 2^24 BN254 inverse or coset NTT needs 768 MiB of them (256 MiB of twiddles, 512 MiB
/// of scale factors); under a fixed 512 MiB the two evicted each other on every call.
fn table_cache_bytes(device_bytes: u64) -> usize {
    const MIB: u64 = 1 << 20;
    ((device_bytes / 8).clamp(512 * MIB, 4096 * MIB)).min(device_bytes / 4) as usize
}

/// One device: its engine, its health, the leases that share it between jobs, and the
/// constant tables kept on it between jobs.
pub struct GpuDevice {
    pub info: GpuInfo,
    /// Replaced when a re-probe rebuilds the context (`replace_engine`).
    engine: RwLock<Engine>,
    healthy: AtomicBool,
    /// Device failures in a row (any kind but `Abandoned`); reset by a success.
    failures_in_row: AtomicU32,
    reprobing: AtomicBool,
    /// The leases held now, their memory and the streams kept for the next (`lease.rs`).
    slots: Mutex<lease::Slots>,
    /// Signalled when a lease ends.
    slot_freed: Condvar,
    /// `--gpu-jobs-per-device`: leases at once.
    jobs_per_device: AtomicUsize,
    /// Leases that had to wait for a slot or for memory, since start.
    lease_waits: AtomicU64,
    /// `--gpu-memory-limit-mib` in bytes, for the device's jobs together; 0: half the
    /// memory free when a job starts on the idle device.
    memory_limit: AtomicU64,
    tables: Mutex<TableCache>,
    /// Page-locked buffers kept for the device's copies, and the budget they count
    /// against (`staging.rs`).
    staging: staging::Staging,
    /// Each self-tested op's state, by op name.
    ops: Mutex<BTreeMap<String, OpStatus>>,
    /// False under `--no-cuda-libraries`.
    vendor_libraries: AtomicBool,
    /// Whether `auto` may place work here (`auto_placement`).
    auto_placement: AtomicBool,
    /// `memory_budget` where the engine reports no memory (`set_unknown_memory_budget`).
    unknown_memory_budget: AtomicU64,
    /// `gpu-ops check`'s kernel clock (`clock.rs`); off in the server.
    clock: clock::ClockSlot,
}

impl GpuDevice {
    pub(crate) fn new(info: GpuInfo, engine: Engine) -> Self {
        Self {
            tables: Mutex::new(TableCache::new(table_cache_bytes(info.memory_total_bytes))),
            info,
            engine: RwLock::new(engine),
            healthy: AtomicBool::new(true),
            failures_in_row: AtomicU32::new(0),
            reprobing: AtomicBool::new(false),
            slots: Mutex::new(lease::Slots::default()),
            slot_freed: Condvar::new(),
            jobs_per_device: AtomicUsize::new(DEFAULT_JOBS_PER_DEVICE),
            lease_waits: AtomicU64::new(0),
            memory_limit: AtomicU64::new(0),
            staging: Default::default(),
            ops: Mutex::new(BTreeMap::new()),
            vendor_libraries: AtomicBool::new(true),
            auto_placement: AtomicBool::new(true),
            unknown_memory_budget: AtomicU64::new(u64::MAX / 2),
            clock: Default::default(),
        }
    }

    /// The emulated device (`--emulate-device`, and the GPU tests without a GPU) with
    /// `memory_bytes` of pretend device memory.
    pub fn emulated(ordinal: usize, memory_bytes: u64) -> Self {
        let info = GpuInfo {
            ordinal,
            vendor: GpuVendor::Emulated,
            name: "emulated device (kernels compiled for the host)".into(),
            uuid: format!("EMU-{ordinal}"),
            compute_capability: "emulated".into(),
            sm_count: EmulatedEngine::SM_COUNT,
            memory_total_bytes: memory_bytes,
            cuda_version: String::new(),
            nvrtc_version: String::new(),
            hiprtc_version: String::new(),
            kernel_arch: "host".into(),
            emulated: true,
            adapter: None,
        };
        Self::new(info, Box::new(EmulatedEngine::new(memory_bytes)))
    }

    /// Injects `fault` into the next `times` launches of kernels named `kernel_prefix…`;
    /// the emulated device only (tests of the self-test, shadow checks and fault policy).
    pub fn inject_fault(
        &self,
        kernel_prefix: &str,
        fault: super::emulated::Fault,
        times: u32,
    ) -> Result<(), String> {
        match self.engine().as_any().downcast_ref::<EmulatedEngine>() {
            Some(e) => {
                e.inject(kernel_prefix, fault, times);
                Ok(())
            }
            None => Err("faults are injected into the emulated device only".into()),
        }
    }

    /// Destroys a wgpu adapter's device, as a driver reset or an unplugged GPU would: its
    /// next operation fails as fatal. Tests of the fault policy on a real driver.
    pub fn destroy_wgpu_device(&self) -> Result<(), String> {
        match self
            .engine()
            .as_any()
            .downcast_ref::<super::wgpu::WgpuEngine>()
        {
            Some(e) => {
                e.destroy();
                Ok(())
            }
            None => Err("only a wgpu adapter's device is destroyed".into()),
        }
    }

    /// The emulated device's seconds in allocations, copies, memsets and launches so far,
    /// summed over its streams (`None` on a GPU).
    pub fn emulated_engine_seconds(&self) -> Option<f64> {
        self.on_emulated(EmulatedEngine::busy_seconds)
    }

    /// The seconds callers spent waiting for the emulated device so far (allocations and
    /// host waits; `None` on a GPU): a device job's time less this is its host side,
    /// whatever its streams ran meanwhile (`benches/device_path.rs`).
    pub fn emulated_waiting_seconds(&self) -> Option<f64> {
        self.on_emulated(EmulatedEngine::waiting_seconds)
    }

    fn on_emulated<R>(&self, read: impl FnOnce(&EmulatedEngine) -> R) -> Option<R> {
        let engine = self.engine();
        engine.as_any().downcast_ref::<EmulatedEngine>().map(read)
    }

    pub fn is_emulated(&self) -> bool {
        self.info.emulated
    }

    /// Whether its work runs on the host's own cores: the emulated device, and a
    /// software wgpu adapter (lavapipe). Placement counts the CPU's backlog against it.
    pub fn on_host_cores(&self) -> bool {
        self.info.emulated || self.info.adapter.as_ref().is_some_and(|a| a.software)
    }

    /// Whether the driver ends a kernel's loops early past a count: llvmpipe (lavapipe)
    /// runs 8 invocations as the lanes of one vector and stops every loop they run,
    /// silently, once 65,535 iterations in which any lane was active have run in all
    /// (its guard against endless shaders; found 2026-12-06, Mesa 22.3.6: a BN254 MSM
    /// reduction thread went wrong at its 476th point addition). Other software adapters
    /// are held to the same bound. Launchers with long per-thread loops (the MSM's) give
    /// such a device shorter ones.
    pub fn bounds_loop_iterations(&self) -> bool {
        self.info.adapter.as_ref().is_some_and(|a| a.software)
    }

    /// What answers call the backend a job ran on here: `wgpu` for a wgpu adapter, else
    /// `hip` on AMD, `emulated` for the emulated device, `cuda` on NVIDIA.
    pub fn backend_kind(&self) -> super::BackendKind {
        if self.info.adapter.is_some() {
            return super::BackendKind::Wgpu;
        }
        match self.info.vendor {
            GpuVendor::Amd => super::BackendKind::Hip,
            GpuVendor::Emulated => super::BackendKind::Emulated,
            _ => super::BackendKind::Cuda,
        }
    }

    fn engine(&self) -> RwLockReadGuard<'_, Engine> {
        self.engine.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Its engine's identity now (a re-probe gives it a new one).
    pub fn engine_id(&self) -> EngineId {
        self.engine().id()
    }

    /// A re-probe's fresh engine (a rebuilt context): waits for the running jobs (each
    /// holds the engine's read lock), drops every cached table, kept stream and staging
    /// buffer of the old one, and forgets the ops' states for the self-test to record
    /// again.
    pub(crate) fn replace_engine(&self, engine: Engine) {
        let mut current = self.engine.write().unwrap_or_else(|e| e.into_inner());
        self.table_cache().clear();
        self.slot_table().idle_streams.clear();
        self.forget_staging(current.id());
        *current = engine;
        drop(current);
        self.op_table().clear();
    }

    /// The engine, out of a device opened only to rebuild another's (a re-probe).
    pub(crate) fn into_engine(self) -> Engine {
        self.engine.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh emulated engine of the same size, keeping the faults still to inject.
    pub(crate) fn rebuilt_emulated(&self) -> Option<Engine> {
        let engine = self.engine();
        let emulated = engine.as_any().downcast_ref::<EmulatedEngine>()?;
        Some(Box::new(emulated.rebuilt()))
    }

    /// Whether a re-probe is scheduled or running; sets it.
    pub(crate) fn start_reprobe(&self) -> bool {
        !self.reprobing.swap(true, Ordering::Relaxed)
    }

    pub(crate) fn end_reprobe(&self) {
        self.reprobing.store(false, Ordering::Relaxed);
    }

    /// Back in service after a re-probe passed.
    pub fn mark_healthy(&self) {
        self.failures_in_row.store(0, Ordering::Relaxed);
        if !self.healthy.swap(true, Ordering::Relaxed) {
            tracing::info!(device = self.info.ordinal, "GPU back in service");
        }
    }

    /// Counts a device failure; returns how many in a row.
    pub(crate) fn count_failure(&self) -> u32 {
        self.failures_in_row.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn count_success(&self) {
        self.failures_in_row.store(0, Ordering::Relaxed);
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn mark_unhealthy(&self, why: &str) {
        if self.healthy.swap(false, Ordering::Relaxed) {
            tracing::error!(
                device = self.info.ordinal,
                error = why,
                "GPU marked unhealthy; its work moves to the CPU"
            );
        }
    }

    /// Records where `op` stands: verified, or quarantined for `reason`.
    pub fn set_op_state(&self, op: &str, reason: Option<String>) {
        let state = if reason.is_some() {
            OpState::Quarantined
        } else {
            OpState::Verified
        };
        let status = OpStatus {
            op: op.to_string(),
            state,
            reason,
        };
        self.op_table().insert(op.to_string(), status);
    }

    /// Records that the engine does not serve `op` (`/device` lists it so, with why).
    pub fn set_op_unavailable(&self, op: &str) {
        let status = OpStatus {
            op: op.to_string(),
            state: OpState::Unavailable,
            reason: Some(self.why_not_served(op).into()),
        };
        self.op_table().insert(op.to_string(), status);
    }

    /// Whether `op`'s self-test passed here (and nothing quarantined it since).
    pub fn op_verified(&self, op: &str) -> bool {
        self.op_table()
            .get(op)
            .is_some_and(|s| s.state == OpState::Verified)
    }

    /// `--no-cuda-libraries`: keep this device's products and convolutions on our own
    /// kernels, whatever cuBLASLt and cuDNN would do.
    pub fn set_vendor_libraries_allowed(&self, allowed: bool) {
        self.vendor_libraries.store(allowed, Ordering::Relaxed);
    }

    pub fn vendor_libraries_allowed(&self) -> bool {
        self.vendor_libraries.load(Ordering::Relaxed)
    }

    /// Whether `op` may run here: the engine has its kernels, and it is not quarantined
    /// (an op without a self-test may).
    pub fn op_usable(&self, op: &str) -> bool {
        self.serves(op)
            && self
                .op_table()
                .get(op)
                .is_none_or(|s| s.state != OpState::Quarantined)
    }

    /// Whether the engine has every kernel of `op`'s device path (`DeviceEngine::serves`).
    pub fn serves(&self, op: &str) -> bool {
        self.engine().serves(op)
    }

    /// Why the engine does not serve `op` (`DeviceEngine::why_not_served`).
    pub fn why_not_served(&self, op: &str) -> &'static str {
        self.engine().why_not_served(op)
    }

    /// Whether `auto` may place work here: false for a software wgpu adapter unless
    /// the operator allowed it (`--wgpu-software-adapters auto`).
    pub fn auto_placement(&self) -> bool {
        self.auto_placement.load(Ordering::Relaxed)
    }

    pub fn set_auto_placement(&self, allowed: bool) {
        self.auto_placement.store(allowed, Ordering::Relaxed);
    }

    /// Every self-tested op's state, by name.
    pub fn op_states(&self) -> Vec<OpStatus> {
        self.op_table().values().cloned().collect()
    }

    fn op_table(&self) -> MutexGuard<'_, BTreeMap<String, OpStatus>> {
        self.ops.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `cuda:N`, `hip:N`, `wgpu:N`, or `emulated:N` for the emulated device: how answers
    /// name a device.
    pub fn label(&self) -> String {
        format!("{}:{}", self.backend_kind().name(), self.info.ordinal)
    }

    /// `--gpu-table-cache-mib`: the cached tables' cap, evicting down to it now.
    pub fn set_table_cache_limit(&self, bytes: usize) {
        self.table_cache().set_cap(bytes);
    }

    /// Drops the cached table under `key` for good (its source was deleted): a job that
    /// looked it up before cannot cache it again.
    pub fn forget_table(&self, key: &str) {
        self.table_cache().forget(key);
    }

    /// Lets a kept result's copy under `key` (`DeviceLease::keep_table`) be evicted like
    /// any cached copy: its values are on the host now.
    pub fn release_table(&self, key: &str) {
        self.table_cache().unpin(key);
    }

    /// Bytes of kept results held only on this device.
    pub fn kept_bytes(&self) -> usize {
        self.table_cache().pinned_bytes()
    }

    /// Whether a table under `key` is cached here now.
    pub fn holds_table(&self, key: &str) -> bool {
        self.table_cache().contains(key)
    }

    /// The keys of the tables cached here now under `key/` (the forms and derived data
    /// one source is kept in).
    pub fn tables_under(&self, key: &str) -> Vec<String> {
        self.table_cache().keys_under(key)
    }

    /// Calls `f` with each kind's share of the cache, under the cache's lock: counters
    /// exported from these totals (as increments) cannot be counted twice by two callers.
    pub fn with_cache_counts(&self, mut f: impl FnMut(CacheKind, CacheCounts)) {
        let cache = self.table_cache();
        for kind in CacheKind::ALL {
            f(kind, cache.counts(kind));
        }
    }

    fn table_cache(&self) -> MutexGuard<'_, TableCache> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer is its device's: another device of the same kind refuses it (two GPUs of
    /// one host are two contexts), as does the same device's rebuilt engine.
    #[test]
    fn a_buffer_of_another_device_of_the_same_kind_is_refused() {
        let (a, b) = (
            GpuDevice::emulated(0, 1 << 20),
            GpuDevice::emulated(1, 1 << 20),
        );
        let (la, lb) = (a.lease().unwrap(), b.lease().unwrap());
        let mut on_a = la.upload(&[1u32, 2, 3]).unwrap();
        let mut on_b = lb.alloc_zeros::<u32>(3).unwrap();
        let refused = |r: Result<(), DeviceError>| {
            let e = r.unwrap_err();
            assert!(e.message.contains("another device"), "{e}");
        };
        refused(lb.download(&on_a).map(|_| ()));
        refused(lb.copy(&on_a, &mut on_b));
        refused(lb.zero(&mut on_a));
        assert_eq!(la.download(&on_a).unwrap(), [1, 2, 3]);
        assert_eq!(lb.download(&on_b).unwrap(), [0, 0, 0]);
        let mut out = la.alloc_zeros::<u64>(3).unwrap();
        let (n, stride) = (3u64, 1u64);
        {
            let mut launch = la.launch("goldilocks_add").unwrap();
            launch
                .arg(&on_a)
                .arg(&on_b)
                .arg(&mut out)
                .arg(&n)
                .arg(&stride);
            // SAFETY: refused before it runs: `on_b` is the other device's.
            refused(unsafe { launch.launch(la.launch_config(3)) });
        }
        drop((la, lb));
        b.replace_engine(b.rebuilt_emulated().unwrap());
        refused(b.lease().unwrap().download(&on_b).map(|_| ()));
    }

    /// A 2^24 BN254 inverse coset NTT's tables, alternately used as calls would use them,
    /// stay cached on every device size we expect (8 GiB and up).
    #[test]
    fn the_largest_ntts_tables_fit_the_cache_together() {
        const MIB: usize = 1 << 20;
        let (twiddles, scale) = (256 * MIB, 512 * MIB);
        for gib in [8u64, 16, 24, 40, 80, 141] {
            let cap = table_cache_bytes(gib << 30);
            assert!(cap >= twiddles + scale, "{gib} GiB: {cap}");
            assert!(cap <= (gib << 30) as usize / 4);
            let mut cache = TableCache::new(cap);
            for _ in 0..3 {
                for (key, bytes) in [("tw", twiddles), ("scale", scale)] {
                    if cache.get(key).is_none() {
                        cache.insert(key.into(), std::sync::Arc::new(0u8), bytes);
                    }
                }
            }
            assert!(cache.get("tw").is_some() && cache.get("scale").is_some());
        }
        // Never more than a quarter of a small device.
        assert_eq!(table_cache_bytes(1 << 30), 256 * MIB);
    }
}
