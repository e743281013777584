//! Compiling the library's WGSL kernels into compute pipelines when an adapter opens.

use super::{Param, WgslKernel, WgslLibrary};
use std::sync::Mutex;
use std::time::Instant;

/// One kernel's pipeline, its bind group layout (from the shader), and how its launch
/// arguments are read.
pub(super) struct Kernel {
    pub(super) pipeline: wgpu::ComputePipeline,
    pub(super) layout: wgpu::BindGroupLayout,
    pub(super) params: Vec<Param>,
    pub(super) shared_bytes: u32,
}

/// A kernel's pipeline and the seconds its compile took, or why it failed.
type Compiled = Result<(Kernel, f64), String>;

/// Every kernel of `library` compiled, in its order, with the seconds each took: on as
/// many threads as the host has cores, the largest sources first. A driver that compiles
/// on the CPU takes about a minute for the MSM's curve kernels (lavapipe, 2026-12-06:
/// 4.7-27 s each; the library 57.7 s on one thread, 35 s on two); wgpu's error scopes
/// are per thread, so each compile keeps its own. A compile that panics (a naga or
/// driver fault) fails the opening as an error, as one that does not compile does.
pub(super) fn compile_all(device: &wgpu::Device, library: &WgslLibrary) -> Vec<Compiled> {
    let kernels = &library.kernels;
    let mut order: Vec<usize> = (0..kernels.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(kernels[i].source.len()));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Compiled>>> = Mutex::new((0..kernels.len()).map(|_| None).collect());
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(kernels.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let taken = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&i) = order.get(taken) else { break };
                let started = Instant::now();
                let k = &kernels[i];
                let result =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compile(device, k)))
                        .unwrap_or_else(|_| Err(format!("{}: its compile panicked", k.name)))
                        .map(|kernel| (kernel, started.elapsed().as_secs_f64()));
                done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
            });
        }
    });
    done.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a compile thread stopped".to_string())))
        .collect()
}

fn compile(device: &wgpu::Device, k: &WgslKernel) -> Result<Kernel, String> {
    let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
    let memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(&k.name),
        source: wgpu::ShaderSource::Wgsl(k.source.as_str().into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&k.name),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let validation = pollster::block_on(scope.pop());
    let memory = pollster::block_on(memory.pop());
    let internal = pollster::block_on(internal.pop());
    // A translation to the driver's language that fails is an internal error, not a
    // validation one: either fails the opening.
    if let Some(e) = validation.or(internal).or(memory) {
        return Err(format!("WGSL kernel {} does not compile: {e}", k.name));
    }
    Ok(Kernel {
        layout: pipeline.get_bind_group_layout(0),
        pipeline,
        params: k.params.clone(),
        shared_bytes: k.shared_bytes,
    })
}
