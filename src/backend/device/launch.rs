//! Kernel launches by name. Arguments travel as the driver takes them, one pointer per
//! parameter to the argument's value (a buffer's argument is its device address), so a
//! launcher whose arguments disagree with the kernel's signature misbehaves on the
//! emulated device as on hardware; the emulated device also refuses a launch whose
//! argument sizes differ from the kernel's parameters. Both engines refuse a block of more
//! threads than the kernel allows (its `__launch_bounds__`, or fewer where the loaded
//! kernel's registers do not fit that many) before it reaches the device.

use super::buffer::{foreign, Memory};
use super::{DeviceBuffer, DeviceError, DeviceLease, Engine, GpuDevice};
use crate::backend::emulated::{self, EmulatedEngine, Fault, HostMemory};
use crate::backend::hip::engine::HipEngine;
use cudarc::driver::{CudaStream, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg};
use std::ffi::c_void;

/// One launch being put together: `lease.launch(name)?.arg(..)…`, then `launch(config)`.
pub struct Launch<'a> {
    name: &'a str,
    args: Args<'a>,
    /// The most threads a block of this kernel may have, where the engine knows it.
    max_threads: Option<u32>,
    /// The device and its stream (CUDA), for `gpu-ops check`'s kernel clock.
    device: &'a GpuDevice,
    stream: Option<&'a CudaStream>,
    /// A buffer of another engine was passed; refused at launch.
    foreign: bool,
}

enum Args<'a> {
    Cuda(LaunchArgs<'a>),
    /// One pointer per parameter to its value, as `hipModuleLaunchKernel` takes them.
    Hip {
        engine: &'a HipEngine,
        pointers: Vec<*mut c_void>,
    },
    Emulated {
        engine: &'a EmulatedEngine,
        pointers: Vec<*mut c_void>,
        sizes: Vec<usize>,
        /// The last buffer passed mutably (an output): where an injected `Fault::Corrupt`
        /// lands.
        last_buffer: Option<*mut c_void>,
    },
}

/// What `Launch::arg` takes: a scalar by reference, or a device buffer.
pub trait KernelArg<'a> {
    fn push(self, launch: &mut Launch<'a>);
}

impl<'a, T: DeviceRepr> KernelArg<'a> for &'a T {
    fn push(self, launch: &mut Launch<'a>) {
        match &mut launch.args {
            Args::Cuda(l) => {
                l.arg(self);
            }
            Args::Hip { pointers, .. } => pointers.push(self as *const T as *mut c_void),
            Args::Emulated {
                pointers, sizes, ..
            } => {
                pointers.push(self as *const T as *mut c_void);
                sizes.push(std::mem::size_of::<T>());
            }
        }
    }
}

/// An emulated buffer's argument: a pointer to where its device address is kept.
fn push_host(pointers: &mut Vec<*mut c_void>, sizes: &mut Vec<usize>, m: &HostMemory) {
    pointers.push(m.address_slot());
    sizes.push(std::mem::size_of::<*mut c_void>());
}

impl<'a, T> KernelArg<'a> for &'a DeviceBuffer<T> {
    fn push(self, launch: &mut Launch<'a>) {
        match (&mut launch.args, &self.memory) {
            (Args::Cuda(l), Memory::Cuda(s)) => {
                l.arg(s);
            }
            (Args::Hip { pointers, .. }, Memory::Hip(m)) => pointers.push(m.address_slot()),
            (
                Args::Emulated {
                    pointers, sizes, ..
                },
                Memory::Host(m),
            ) => push_host(pointers, sizes, m),
            _ => launch.foreign = true,
        }
    }
}

impl<'a, T> KernelArg<'a> for &'a mut DeviceBuffer<T> {
    fn push(self, launch: &mut Launch<'a>) {
        match (&mut launch.args, &mut self.memory) {
            // cudarc orders later reads of a buffer passed mutably after this write.
            (Args::Cuda(l), Memory::Cuda(s)) => {
                l.arg(s);
            }
            // The stream orders every launch and copy of the device.
            (Args::Hip { pointers, .. }, Memory::Hip(m)) => pointers.push(m.address_slot()),
            (
                Args::Emulated {
                    pointers,
                    sizes,
                    last_buffer,
                    ..
                },
                Memory::Host(m),
            ) => {
                push_host(pointers, sizes, m);
                *last_buffer = Some(m.address());
            }
            _ => launch.foreign = true,
        }
    }
}

impl DeviceLease<'_> {
    /// Starts a launch of kernel `name`.
    pub fn launch<'s>(&'s self, name: &'s str) -> Result<Launch<'s>, DeviceError> {
        let (args, max_threads) = match self.engine() {
            Engine::Cuda(c) => (
                Args::Cuda(c.stream.launch_builder(c.function(name)?)),
                c.max_threads(name),
            ),
            Engine::Hip(h) => {
                if !h.has_kernel(name) {
                    return Err(DeviceError::fatal(format!("kernel {name} is not loaded")));
                }
                let args = Args::Hip {
                    engine: h,
                    pointers: Vec::new(),
                };
                (args, h.max_threads(name))
            }
            Engine::Emulated(engine) => {
                if emulated::kernel_params(name).is_none() {
                    return Err(DeviceError::fatal(format!("kernel {name} is not loaded")));
                }
                let args = Args::Emulated {
                    engine,
                    pointers: Vec::new(),
                    sizes: Vec::new(),
                    last_buffer: None,
                };
                (args, emulated::kernel_max_threads(name))
            }
        };
        let stream = match self.engine() {
            Engine::Cuda(c) => Some(&*c.stream),
            Engine::Hip(_) | Engine::Emulated(_) => None,
        };
        Ok(Launch {
            name,
            args,
            max_threads,
            device: self.device,
            stream,
            foreign: false,
        })
    }
}

impl<'a> Launch<'a> {
    pub fn arg(&mut self, arg: impl KernelArg<'a>) -> &mut Self {
        arg.push(self);
        self
    }

    /// Queues the kernel (CUDA) or runs it to completion (emulated).
    ///
    /// # Safety
    /// The arguments must be the kernel's parameters in order and type, and every index
    /// the kernel computes from them for this `config` must stay inside its buffers — as
    /// for `cuLaunchKernel`. The emulated device checks the count and sizes, not meaning.
    pub unsafe fn launch(&mut self, config: LaunchConfig) -> Result<(), DeviceError> {
        if self.foreign {
            return Err(foreign());
        }
        self.within_bounds(&config)?;
        let (device, stream) = (self.device, self.stream);
        match &mut self.args {
            // SAFETY: the caller's contract.
            Args::Cuda(l) => device
                .clocked(stream, || unsafe { l.launch(config) })
                .map(|_| ())
                .map_err(Into::into),
            Args::Hip { engine, pointers } => {
                let name = self.name;
                device.clocked(None, || {
                    // SAFETY: the caller's contract; every pointer lives as long as 'a.
                    unsafe {
                        engine.launch(
                            name,
                            config.grid_dim,
                            config.block_dim,
                            config.shared_mem_bytes,
                            pointers,
                        )
                    }?;
                    // Clocked on the host: wait for the kernel, so the time is its own.
                    if device.kernel_clock_running() {
                        engine.synchronize()?;
                    }
                    Ok(())
                })
            }
            Args::Emulated {
                engine,
                pointers,
                sizes,
                last_buffer,
            } => {
                let fault = engine.take_fault(self.name);
                if let Some(Fault::Fail(kind)) = fault {
                    return Err(DeviceError {
                        kind,
                        message: format!("emulated device: a fault injected into {}", self.name),
                    });
                }
                let expected = emulated::kernel_params(self.name).unwrap_or_default();
                if expected.len() == sizes.len() && expected != *sizes {
                    return Err(DeviceError::fatal(format!(
                        "emulated device: {} takes arguments of {expected:?} bytes, the launch passed {sizes:?}",
                        self.name
                    )));
                }
                let name = self.name;
                if let Some(Fault::SlowMs(ms)) = fault {
                    std::thread::sleep(std::time::Duration::from_millis(u64::from(ms)));
                }
                // SAFETY: the caller's contract; every pointer lives as long as 'a.
                device
                    .clocked(None, || unsafe { emulated::launch(name, config, pointers) })
                    .map_err(|e| DeviceError::fatal(format!("emulated device: {e}")))?;
                if let (Some(Fault::Corrupt), Some(out)) = (fault, last_buffer) {
                    // SAFETY: a buffer holds at least one byte (the allocator rounds zero up).
                    unsafe { *out.cast::<u8>() ^= 1 };
                }
                Ok(())
            }
        }
    }

    /// Refuses a block of more threads than the kernel allows, before the device sees it.
    /// The driver would refuse it too, but its error reads as fatal here (`From<DriverError>`)
    /// and would retire the device, when the fault is the launcher's: `Unsupported` moves
    /// only this job, to the CPU. The emulated device refuses it the same way, so CI finds
    /// such a launcher before a GPU does.
    fn within_bounds(&self, config: &LaunchConfig) -> Result<(), DeviceError> {
        let (x, y, z) = config.block_dim;
        let threads = u64::from(x) * u64::from(y) * u64::from(z);
        match self.max_threads {
            Some(limit) if threads > u64::from(limit) => Err(DeviceError::unsupported(format!(
                "{}: a block of {threads} threads ({x}×{y}×{z}), more than the kernel's limit \
                 of {limit} (its __launch_bounds__, or what its registers allow)",
                self.name
            ))),
            _ => Ok(()),
        }
    }
}
