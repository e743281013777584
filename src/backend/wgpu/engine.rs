//! `DeviceEngine` on one wgpu device: buffers are storage buffers, copies go through the
//! device's one queue, a launch is one compute pass.
//!
//! wgpu has one queue per device and runs its submissions in order, so every stream of
//! this engine is that queue: work of two streams is ordered whether or not an event
//! says so (`wait` has nothing to add), and an event is the queue's last submission.
//! Every operation is submitted as it is queued, so an event recorded after it covers it.
//! Errors wgpu reports (validation, out of memory) are caught per operation with error
//! scopes, never left to wgpu's default handler, which panics.

use super::compile::{compile_all, Kernel};
use super::handles::{WgpuEvent, WgpuMemory, WgpuStream};
use super::{Param, WgslLibrary, BLOCK_THREADS, PARAM_WORDS};
use crate::backend::device::engine::{
    own, own_event, own_mut, own_stream, DeviceEngine, EngineEvent, EngineId, EngineMemory,
    EngineStream, KernelArgs, LaunchConfig,
};
use crate::backend::device::{DeviceError, KernelLimits, ModuleLoad};
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wgpu::util::DeviceExt;

/// Copies, clears and buffer sizes are whole 4-byte words in wgpu.
const WORD: usize = 4;

pub struct WgpuEngine {
    id: EngineId,
    device: wgpu::Device,
    queue: wgpu::Queue,
    kernels: HashMap<String, Kernel>,
    ops: Vec<&'static str>,
    /// Ops `--wgpu-ops` kept off (their kernels not compiled).
    left_off: Vec<&'static str>,
    limits: wgpu::Limits,
    module_loads: Vec<ModuleLoad>,
    facts: serde_json::Value,
    /// Why the device was lost, once it was (`set_device_lost_callback`): every
    /// operation after fails as fatal, so the device is retired and re-probed.
    lost: Arc<Mutex<Option<String>>>,
    /// The queue's last submission: what an event recorded now waits for.
    last: Mutex<Option<wgpu::SubmissionIndex>>,
}

fn words(bytes: usize) -> usize {
    bytes.div_ceil(WORD).max(1) * WORD
}

impl WgpuEngine {
    /// The engine of an opened device, every kernel of `library` compiled into a
    /// pipeline. A kernel that fails to compile fails the open: its op would be served
    /// by nothing, and a broken shader is the build's fault, found by CI on lavapipe.
    pub fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        library: &WgslLibrary,
        facts: serde_json::Value,
    ) -> Result<Self, String> {
        let lost = Arc::new(Mutex::new(None));
        let on_lost = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            let why = format!("the wgpu device was lost ({reason:?}): {message}");
            tracing::error!(reason = %why, "wgpu device lost");
            *on_lost.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        });
        // Errors outside any scope (none are expected: every operation has one) are
        // logged, never wgpu's default panic.
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            tracing::error!(error = %e, "wgpu error outside an operation");
        }));
        let mut kernels = HashMap::new();
        let mut loads: Vec<ModuleLoad> = Vec::new();
        for (k, compiled) in library.kernels.iter().zip(compile_all(&device, library)) {
            let (kernel, seconds) = compiled?;
            tracing::debug!(kernel = %k.name, seconds, "WGSL kernel compiled");
            match loads.iter_mut().find(|l| l.module == k.module) {
                Some(l) => l.seconds += seconds,
                None => loads.push(ModuleLoad {
                    module: k.module.to_string(),
                    seconds,
                    cache: "wgsl",
                }),
            }
            kernels.insert(k.name.clone(), kernel);
        }
        Ok(Self {
            id: EngineId::fresh(),
            limits: device.limits(),
            device,
            queue,
            kernels,
            ops: library.ops.clone(),
            left_off: library.left_off.clone(),
            module_loads: loads,
            facts,
            lost,
            last: Mutex::new(None),
        })
    }

    /// Destroys the device (`GpuDevice::destroy_wgpu_device`).
    pub fn destroy(&self) {
        self.device.destroy();
    }

    fn lost(&self) -> Result<(), DeviceError> {
        match &*self.lost.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(why) => Err(DeviceError::fatal(why.clone())),
            None => Ok(()),
        }
    }

    /// `work` with wgpu's errors caught: out of memory as this job's, anything else
    /// (validation, an internal error) as fatal.
    fn scoped<T>(&self, what: &str, work: impl FnOnce() -> T) -> Result<T, DeviceError> {
        self.lost()?;
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = work();
        let validation = pollster::block_on(validation.pop());
        let memory = pollster::block_on(memory.pop());
        let internal = pollster::block_on(internal.pop());
        if let Some(e) = memory {
            return Err(DeviceError::out_of_memory(format!("{what}: {e}")));
        }
        if let Some(e) = validation.or(internal) {
            return Err(DeviceError::fatal(format!("{what}: {e}")));
        }
        self.lost()?;
        Ok(value)
    }

    fn submit(&self, commands: Option<wgpu::CommandBuffer>) -> wgpu::SubmissionIndex {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let index = self.queue.submit(commands);
        *last = Some(index.clone());
        index
    }

    fn wait_for(&self, submission: Option<wgpu::SubmissionIndex>) -> Result<(), DeviceError> {
        self.lost()?;
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: submission,
                timeout: None,
            })
            .map_err(|e| DeviceError::fatal(format!("waiting for the wgpu queue: {e}")))?;
        self.lost()
    }

    fn encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default())
    }

    /// The bind group's entries for `args` against `kernel`'s parameters, and the
    /// `params` words: refused where the launcher's arguments are not the kernel's.
    fn bind<'b>(
        &self,
        name: &str,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &'b KernelArgs<'_>,
    ) -> Result<(Vec<u32>, Vec<&'b wgpu::Buffer>), DeviceError> {
        let mismatch = |why: String| DeviceError::fatal(format!("{name}: {why}"));
        if args.pointers.len() != kernel.params.len() || args.sizes.len() != args.pointers.len() {
            return Err(mismatch(format!(
                "{} arguments for {} parameters",
                args.pointers.len(),
                kernel.params.len()
            )));
        }
        let (g, b) = (config.grid_dim, config.block_dim);
        let mut words = vec![g.0, g.1, g.2, b.0, b.1, b.2];
        let mut buffers = Vec::new();
        for (i, param) in kernel.params.iter().enumerate() {
            let (pointer, size) = (args.pointers[i], args.sizes[i]);
            match *param {
                Param::Read | Param::Write => {
                    let memory = args
                        .buffers
                        .iter()
                        .find(|(m, _)| m.address_slot() == pointer)
                        .map(|(m, _)| *m)
                        .ok_or_else(|| mismatch(format!("argument {i} is not a buffer")))?;
                    let memory: &WgpuMemory = own(self.id, memory)?;
                    // The kernels index u32 words in 32 bits.
                    let indexable = memory.buffer.size() <= 4 * u64::from(u32::MAX);
                    if !indexable
                        || memory.buffer.size() > self.limits.max_storage_buffer_binding_size
                    {
                        return Err(DeviceError::unsupported(format!(
                            "{name}: a buffer of {} bytes, more than the adapter binds \
                             ({} bytes)",
                            memory.bytes, self.limits.max_storage_buffer_binding_size
                        )));
                    }
                    buffers.push(&memory.buffer);
                }
                Param::Scalar(bytes) => {
                    if size != bytes {
                        return Err(mismatch(format!(
                            "argument {i} has {size} bytes, the kernel's {bytes}"
                        )));
                    }
                    // SAFETY: the launcher's contract: each pointer is valid for its size.
                    let value = unsafe { std::slice::from_raw_parts(pointer as *const u8, size) };
                    let mut le = [0u8; 8];
                    le[..size].copy_from_slice(value);
                    let (lo, hi) = (
                        u32::from_ne_bytes(le[..4].try_into().expect("4 bytes")),
                        u32::from_ne_bytes(le[4..].try_into().expect("4 bytes")),
                    );
                    words.push(lo);
                    if bytes == 8 {
                        // The kernels index in 32 bits: a count past that is not theirs.
                        if hi != 0 {
                            return Err(DeviceError::unsupported(format!(
                                "{name}: argument {i} is {}, past the WGSL kernels' \
                                 32-bit indices",
                                u64::from(lo) | (u64::from(hi) << 32)
                            )));
                        }
                        words.push(hi);
                    }
                }
            }
        }
        if words.len() > PARAM_WORDS {
            return Err(mismatch(format!(
                "{} parameter words, more than the {PARAM_WORDS} of `params`",
                words.len()
            )));
        }
        words.resize(PARAM_WORDS, 0);
        Ok((words, buffers))
    }
}

impl DeviceEngine for WgpuEngine {
    fn memory(&self) -> Option<(u64, u64)> {
        // wgpu reports no memory sizes; jobs are bounded by `--gpu-memory-limit-mib`.
        None
    }

    fn alloc(&self, bytes: usize) -> Result<Box<dyn EngineMemory>, DeviceError> {
        let size = words(bytes) as u64;
        if size > self.limits.max_buffer_size {
            // The job's size, not the device's state: never counted towards retiring it.
            return Err(DeviceError::unsupported(format!(
                "a buffer of {bytes} bytes, more than the adapter's largest ({} bytes)",
                self.limits.max_buffer_size
            )));
        }
        let buffer = self.scoped("allocating", || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Box::new(WgpuMemory {
            engine: self.id,
            buffer,
            bytes,
            slot: Box::new(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
        }))
    }

    fn alloc_zeroed(
        &self,
        _stream: &dyn EngineStream,
        bytes: usize,
    ) -> Result<Box<dyn EngineMemory>, DeviceError> {
        // wgpu zeroes every new buffer before its first use.
        self.alloc(bytes)
    }

    fn id(&self) -> EngineId {
        self.id
    }

    fn new_stream(&self) -> Result<Box<dyn EngineStream>, DeviceError> {
        Ok(Box::new(WgpuStream { engine: self.id }))
    }

    fn record(&self, stream: &dyn EngineStream) -> Result<Box<dyn EngineEvent>, DeviceError> {
        own_stream::<WgpuStream>(self.id, stream)?;
        let submission = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(Box::new(WgpuEvent {
            engine: self.id,
            submission,
        }))
    }

    fn wait(&self, stream: &dyn EngineStream, event: &dyn EngineEvent) -> Result<(), DeviceError> {
        // One queue: its submissions run in order, so the stream's later work already
        // follows the event's.
        own_stream::<WgpuStream>(self.id, stream)?;
        own_event::<WgpuEvent>(self.id, event)?;
        Ok(())
    }

    fn host_wait(&self, event: &dyn EngineEvent) -> Result<(), DeviceError> {
        let event = own_event::<WgpuEvent>(self.id, event)?;
        match &event.submission {
            Some(s) => self.wait_for(Some(s.clone())),
            None => Ok(()),
        }
    }

    unsafe fn write(
        &self,
        stream: &dyn EngineStream,
        dst: &mut dyn EngineMemory,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        own_stream::<WgpuStream>(self.id, stream)?;
        let dst: &mut WgpuMemory = own_mut(self.id, dst)?;
        if bytes == 0 {
            return Ok(());
        }
        if bytes % WORD != 0 && bytes != dst.bytes {
            // The last word's other bytes are the buffer's, not padding: refused (no
            // launcher writes a part of a buffer that is not whole words).
            return Err(DeviceError::unsupported(format!(
                "a copy of {bytes} bytes into a buffer of {}: wgpu copies whole words",
                dst.bytes
            )));
        }
        // SAFETY: the caller's contract: `src` is valid for `bytes` reads.
        let data = unsafe { std::slice::from_raw_parts(src, bytes) };
        self.scoped("copying to the device", || {
            if bytes % WORD == 0 {
                self.queue.write_buffer(&dst.buffer, 0, data);
            } else {
                // The last word's other bytes are the buffer's padding past `bytes`.
                let mut padded = data.to_vec();
                padded.resize(words(bytes), 0);
                self.queue.write_buffer(&dst.buffer, 0, &padded);
            }
            // The copy is staged now; submitting puts it in the queue's order.
            self.submit(None);
        })
    }

    unsafe fn read(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        own_stream::<WgpuStream>(self.id, stream)?;
        let src: &WgpuMemory = own(self.id, src)?;
        if bytes == 0 {
            return Ok(());
        }
        let size = words(bytes) as u64;
        let (staging, submission) = self.scoped("copying from the device", || {
            let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut encoder = self.encoder();
            encoder.copy_buffer_to_buffer(&src.buffer, 0, &staging, 0, size);
            let submission = self.submit(Some(encoder.finish()));
            (staging, submission)
        })?;
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait_for(Some(submission))?;
        rx.recv()
            .map_err(|_| DeviceError::fatal("the wgpu read-back was dropped"))?
            .map_err(|e| DeviceError::fatal(format!("mapping a read-back: {e}")))?;
        {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| DeviceError::fatal(format!("reading a read-back: {e}")))?;
            // SAFETY: the caller's contract: `dst` is valid for `bytes` writes.
            unsafe { std::ptr::copy_nonoverlapping(view.as_ptr(), dst, bytes) };
        }
        staging.unmap();
        Ok(())
    }

    fn zero(
        &self,
        stream: &dyn EngineStream,
        memory: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError> {
        own_stream::<WgpuStream>(self.id, stream)?;
        let memory: &mut WgpuMemory = own_mut(self.id, memory)?;
        self.scoped("zeroing", || {
            let mut encoder = self.encoder();
            encoder.clear_buffer(&memory.buffer, 0, None);
            self.submit(Some(encoder.finish()));
        })
    }

    fn copy(
        &self,
        stream: &dyn EngineStream,
        src: &dyn EngineMemory,
        dst: &mut dyn EngineMemory,
    ) -> Result<(), DeviceError> {
        own_stream::<WgpuStream>(self.id, stream)?;
        let src: &WgpuMemory = own(self.id, src)?;
        let dst: &mut WgpuMemory = own_mut(self.id, dst)?;
        let bytes = src.bytes.min(dst.bytes);
        // Whole words only: the padding copied with a last partial word would land on
        // bytes of `dst` the copy must leave alone, unless they are its padding too.
        let size = if bytes % WORD == 0 || bytes == dst.bytes {
            words(bytes)
        } else {
            return Err(DeviceError::unsupported(format!(
                "a device copy of {bytes} bytes into a buffer of {}: wgpu copies whole words",
                dst.bytes
            )));
        };
        if bytes == 0 {
            return Ok(());
        }
        self.scoped("copying on the device", || {
            let mut encoder = self.encoder();
            encoder.copy_buffer_to_buffer(&src.buffer, 0, &dst.buffer, 0, size as u64);
            self.submit(Some(encoder.finish()));
        })
    }

    fn synchronize(&self, stream: &dyn EngineStream) -> Result<(), DeviceError> {
        own_stream::<WgpuStream>(self.id, stream)?;
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.wait_for(last)
    }

    fn has_kernel(&self, name: &str) -> bool {
        self.kernels.contains_key(name)
    }

    fn max_shared_bytes(&self, name: &str) -> Option<u32> {
        self.kernels.get(name).map(|k| k.shared_bytes)
    }

    fn serves(&self, op: &str) -> bool {
        self.ops.contains(&op)
    }

    fn why_not_served(&self, op: &str) -> &'static str {
        if self.left_off.contains(&op) {
            super::LEFT_OFF
        } else {
            crate::backend::verify::NO_KERNELS
        }
    }

    fn kernel_limits(&self, name: &str) -> KernelLimits {
        let bound = self.kernels.contains_key(name).then_some(BLOCK_THREADS);
        let mut limits = KernelLimits::unknown(name, bound);
        limits.max_threads = bound;
        // Every WGSL kernel's workgroup is its launch bound: a block fits if it is no
        // larger (`launch` refuses one that is).
        limits.fits = bound.is_some();
        limits
    }

    unsafe fn launch(
        &self,
        stream: &dyn EngineStream,
        name: &str,
        config: LaunchConfig,
        args: &mut KernelArgs<'_>,
    ) -> Result<(), DeviceError> {
        own_stream::<WgpuStream>(self.id, stream)?;
        let kernel = self.kernels.get(name).ok_or_else(|| {
            DeviceError::unsupported(format!("{name}: no WGSL kernel of that name"))
        })?;
        let (g, b) = (config.grid_dim, config.block_dim);
        let most = self.limits.max_compute_workgroups_per_dimension;
        if b.1 != 1
            || b.2 != 1
            || b.0 > BLOCK_THREADS
            || config.shared_mem_bytes > kernel.shared_bytes
        {
            return Err(DeviceError::unsupported(format!(
                "{name}: a block of {b:?} with {} shared bytes; the WGSL kernel takes \
                 {BLOCK_THREADS} threads along x at most and {} shared bytes",
                config.shared_mem_bytes, kernel.shared_bytes
            )));
        }
        if g.0 > most || g.1 > most || g.2 > most {
            return Err(DeviceError::unsupported(format!(
                "{name}: a grid of {g:?}, more than the adapter's {most} workgroups a dimension"
            )));
        }
        let (params, buffers) = self.bind(name, kernel, config, args)?;
        self.scoped(name, || {
            let params = self
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("params"),
                    contents: bytemuck::cast_slice(&params),
                    usage: wgpu::BufferUsages::UNIFORM,
                });
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: params.as_entire_binding(),
            }];
            entries.extend(
                buffers
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: b.as_entire_binding(),
                    }),
            );
            let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(name),
                layout: &kernel.layout,
                entries: &entries,
            });
            let mut encoder = self.encoder();
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(name),
                    timestamp_writes: None,
                });
                pass.set_pipeline(&kernel.pipeline);
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(g.0, g.1, g.2);
            }
            self.submit(Some(encoder.finish()));
        })
    }

    fn module_loads(&self) -> Vec<ModuleLoad> {
        self.module_loads.clone()
    }

    fn facts(&self) -> serde_json::Value {
        self.facts.clone()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
