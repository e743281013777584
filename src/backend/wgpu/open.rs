//! Finding and opening wgpu adapters: after CUDA and HIP found nothing usable, each
//! adapter wgpu enumerates (Vulkan, Metal, DX12), numbered in that order, `--devices`
//! honoured; software adapters only as `--wgpu-software-adapters` says.

use super::engine::WgpuEngine;
use super::WgslLibrary;
use crate::backend::cuda::DeviceSelection;
use crate::backend::{GpuDevice, GpuInfo, GpuVendor, Reopen};
use serde::Serialize;
use std::sync::Arc;

/// `--wgpu-software-adapters`: what becomes of an adapter that is the CPU (lavapipe,
/// llvmpipe, WARP): slower than the CPU pool it shares cores with, so never a device
/// unless asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SoftwareAdapters {
    /// Not opened.
    #[default]
    Off,
    /// Opened and self-tested, serving requests that name the device backend (and
    /// `gpu-ops check`); `auto` places nothing there.
    Forced,
    /// Also a side `auto` places work on by measured time, like any device.
    Auto,
}

/// What `/device` says of a wgpu adapter, beside the fields every device has.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdapterFacts {
    /// The graphics API wgpu drives it through: `vulkan`, `metal`, `dx12` or `gl`.
    pub api: String,
    /// `discrete_gpu`, `integrated_gpu`, `virtual_gpu`, `cpu` or `other`, as the driver says.
    pub device_type: String,
    /// True for an adapter that is the CPU (lavapipe, llvmpipe, WARP).
    pub software: bool,
    pub driver: String,
    pub driver_info: String,
    /// PCI vendor and device ids (0 where the API has none).
    pub vendor_id: u32,
    pub device_id: u32,
    /// Whether `auto` may place work here (a software adapter only under
    /// `--wgpu-software-adapters auto`).
    pub auto_placement: bool,
    /// Whether the adapter offers 64-bit integers in shaders (the kernels do not need
    /// them: their 64-bit words are pairs of 32-bit ones).
    pub shader_int64: bool,
    pub max_buffer_bytes: u64,
    pub max_storage_binding_bytes: u64,
    pub max_workgroup_storage_bytes: u32,
    pub max_workgroups_per_dimension: u32,
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    })
}

fn is_software(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu
}

/// The adapters a server may open, in wgpu's order: software ones only when asked.
fn adapters(software: SoftwareAdapters) -> (Vec<wgpu::Adapter>, usize) {
    let all = pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()));
    let total = all.len();
    let kept = all
        .into_iter()
        .filter(|a| software != SoftwareAdapters::Off || !is_software(&a.get_info()))
        .collect();
    (kept, total)
}

/// The usable wgpu adapters, each opened with `library`'s kernels compiled, and a line
/// saying what was found.
pub fn discover(
    selection: &DeviceSelection,
    software: SoftwareAdapters,
    library: &WgslLibrary,
) -> (Vec<Arc<GpuDevice>>, String) {
    let (found, total) = adapters(software);
    if found.is_empty() {
        let why = if total > 0 {
            format!("{total} software wgpu adapter(s) left alone (--wgpu-software-adapters off)")
        } else {
            "no wgpu adapter (Vulkan, Metal or DX12)".to_string()
        };
        return (Vec::new(), why);
    }
    let mut opened = Vec::new();
    let mut failed = Vec::new();
    for ordinal in selection.ordinals(found.len()) {
        let Some(adapter) = found.get(ordinal) else {
            failed.push(format!("wgpu adapter {ordinal}: no such adapter"));
            continue;
        };
        match crate::backend::guarded("opening a wgpu adapter", || {
            open(ordinal, adapter, software, library)
        }) {
            Ok(d) => opened.push(Arc::new(d)),
            Err(e) => failed.push(format!("wgpu adapter {ordinal}: {e}")),
        }
    }
    let names: Vec<String> = opened.iter().map(|d| d.info.name.clone()).collect();
    let mut why = format!(
        "wgpu: {} of {} adapter(s) opened",
        opened.len(),
        found.len()
    );
    if !names.is_empty() {
        why.push_str(&format!(" ({})", names.join(", ")));
    }
    if !failed.is_empty() {
        why.push_str(&format!("; {}", failed.join("; ")));
    }
    (opened, why)
}

fn vendor(info: &wgpu::AdapterInfo) -> GpuVendor {
    match info.vendor {
        0x10de => GpuVendor::Nvidia,
        0x1002 | 0x1022 => GpuVendor::Amd,
        0x8086 => GpuVendor::Intel,
        0x106b => GpuVendor::Apple,
        _ if info.backend == wgpu::Backend::Metal => GpuVendor::Apple,
        _ => GpuVendor::Other,
    }
}

fn api(backend: wgpu::Backend) -> &'static str {
    match backend {
        wgpu::Backend::Vulkan => "vulkan",
        wgpu::Backend::Metal => "metal",
        wgpu::Backend::Dx12 => "dx12",
        wgpu::Backend::Gl => "gl",
        _ => "other",
    }
}

fn device_type(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete_gpu",
        wgpu::DeviceType::IntegratedGpu => "integrated_gpu",
        wgpu::DeviceType::VirtualGpu => "virtual_gpu",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

/// Threads a launch's grid is capped at, per `sm_count` unit (`launch_config`): wgpu
/// does not say how many compute units an adapter has, so 64 stands in, 2,048
/// workgroups of 256 threads, which fills any GPU the grid-stride kernels run on.
const NOMINAL_UNITS: u32 = 64;

/// The table cache of an adapter whose memory is not known (`--gpu-table-cache-mib`
/// otherwise): kept results and resident operands, least recently used out.
const UNKNOWN_MEMORY_TABLE_CACHE: usize = 256 << 20;

fn open(
    ordinal: usize,
    adapter: &wgpu::Adapter,
    software: SoftwareAdapters,
    library: &WgslLibrary,
) -> Result<GpuDevice, String> {
    let info = adapter.get_info();
    let limits = adapter.limits();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("gpu-ops"),
        required_features: wgpu::Features::empty(),
        // The adapter's best: the largest buffers and bindings it allows.
        required_limits: limits.clone(),
        ..Default::default()
    }))
    .map_err(|e| format!("{}: no device: {e}", info.name))?;
    let soft = is_software(&info);
    let facts = AdapterFacts {
        api: api(info.backend).into(),
        device_type: device_type(info.device_type).into(),
        software: soft,
        driver: info.driver.clone(),
        driver_info: info.driver_info.clone(),
        vendor_id: info.vendor,
        device_id: info.device,
        auto_placement: !soft || software == SoftwareAdapters::Auto,
        shader_int64: adapter.features().contains(wgpu::Features::SHADER_INT64),
        max_buffer_bytes: limits.max_buffer_size,
        max_storage_binding_bytes: limits.max_storage_buffer_binding_size,
        max_workgroup_storage_bytes: limits.max_compute_workgroup_storage_size,
        max_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
    };
    let engine = WgpuEngine::new(
        device,
        queue,
        library,
        serde_json::to_value(&facts).unwrap_or_default(),
    )
    .map_err(|e| format!("{}: {e}", info.name))?;
    let gpu = GpuInfo {
        ordinal,
        vendor: vendor(&info),
        name: info.name.clone(),
        uuid: format!(
            "WGPU-{}-{:04x}-{:04x}-{ordinal}",
            api(info.backend),
            info.vendor,
            info.device
        ),
        compute_capability: api(info.backend).into(),
        sm_count: NOMINAL_UNITS,
        memory_total_bytes: 0,
        cuda_version: String::new(),
        nvrtc_version: String::new(),
        hiprtc_version: String::new(),
        kernel_arch: "wgsl".into(),
        emulated: false,
        adapter: Some(facts.clone()),
    };
    let dev = GpuDevice::new(gpu, Box::new(engine));
    dev.set_auto_placement(facts.auto_placement);
    // wgpu reports no memory sizes: a job's budget is one storage binding (so larger
    // work runs in passes, never past what a kernel may bind), the tables' cache a
    // fixed 256 MiB (both overridden by --gpu-memory-limit-mib and --gpu-table-cache-mib).
    dev.set_unknown_memory_budget(facts.max_storage_binding_bytes.min(facts.max_buffer_bytes));
    dev.set_table_cache_limit(UNKNOWN_MEMORY_TABLE_CACHE);
    Ok(dev)
}

/// A re-probe: the adapter found again (the same API, vendor, device and name, in the
/// same place among those), opened afresh, its kernels compiled again.
pub fn reopen(software: SoftwareAdapters, library: WgslLibrary) -> Reopen {
    Arc::new(move |dev: &GpuDevice| {
        crate::backend::guarded("re-opening a wgpu adapter", || {
            let (found, _) = adapters(software);
            let adapter = found
                .get(dev.info.ordinal)
                .filter(|a| a.get_info().name == dev.info.name)
                .ok_or_else(|| format!("{} is no longer among the adapters", dev.info.name))?;
            open(dev.info.ordinal, adapter, software, &library).map(GpuDevice::into_engine)
        })
    })
}
