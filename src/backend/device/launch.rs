//! Kernel launches by name. Arguments travel as the driver takes them, one pointer per
//! parameter to the argument's value (a buffer's argument is its device address), so a
//! launcher whose arguments disagree with the kernel's signature misbehaves on the
//! emulated device as on hardware; the emulated device also refuses a launch whose
//! argument sizes differ from the kernel's parameters. Every engine refuses a block of
//! more threads than the kernel allows (its `__launch_bounds__`, or fewer where the loaded
//! kernel's registers do not fit that many) before it reaches the device.

use super::engine::{foreign, DeviceEngine, KernelArgs, LaunchConfig};
use super::{DeviceBuffer, DeviceError, DeviceLease, Element};
use std::ffi::c_void;
use std::marker::PhantomData;

/// One launch being put together: `lease.launch(name)?.arg(..)…`, then `launch(config)`.
pub struct Launch<'a> {
    name: &'a str,
    args: KernelArgs<'a>,
    /// The most threads a block of this kernel may have, where the engine knows it.
    max_threads: Option<u32>,
    lease: &'a DeviceLease<'a>,
    /// A buffer of another engine was passed; refused at launch.
    foreign: bool,
    /// The arguments' values are borrowed for 'a: the pointers stay valid until launch.
    _borrows: PhantomData<&'a ()>,
}

/// What `Launch::arg` takes: a scalar by reference, or a device buffer.
pub trait KernelArg<'a> {
    fn push(self, launch: &mut Launch<'a>);
}

impl<'a, T: Element> KernelArg<'a> for &'a T {
    fn push(self, launch: &mut Launch<'a>) {
        launch.args.pointers.push(self as *const T as *mut c_void);
        launch.args.sizes.push(std::mem::size_of::<T>());
    }
}

impl<'a, T> KernelArg<'a> for &'a DeviceBuffer<T> {
    fn push(self, launch: &mut Launch<'a>) {
        launch.push_buffer(&*self.memory, false);
    }
}

impl<'a, T> KernelArg<'a> for &'a mut DeviceBuffer<T> {
    fn push(self, launch: &mut Launch<'a>) {
        let slot = launch.push_buffer(&*self.memory, true);
        launch.args.last_output = Some(slot);
    }
}

impl DeviceLease<'_> {
    /// The most threads a block of kernel `name` may have, where the engine knows it.
    pub fn max_threads(&self, name: &str) -> Option<u32> {
        self.engine().kernel_limits(name).max_threads
    }

    /// The most dynamic shared memory a launch of kernel `name` may ask, where the engine
    /// bounds it (`DeviceEngine::max_shared_bytes`).
    pub fn max_shared_bytes(&self, name: &str) -> Option<u32> {
        self.engine().max_shared_bytes(name)
    }

    /// Starts a launch of kernel `name`.
    pub fn launch<'s>(&'s self, name: &'s str) -> Result<Launch<'s>, DeviceError> {
        let engine = self.engine();
        if !engine.has_kernel(name) {
            return Err(DeviceError::fatal(format!("kernel {name} is not loaded")));
        }
        Ok(Launch {
            name,
            args: KernelArgs::default(),
            max_threads: engine.kernel_limits(name).max_threads,
            lease: self,
            foreign: false,
            _borrows: PhantomData,
        })
    }
}

impl<'a> Launch<'a> {
    pub fn arg(&mut self, arg: impl KernelArg<'a>) -> &mut Self {
        arg.push(self);
        self
    }

    /// A buffer's argument: a pointer to where its device address is kept.
    fn push_buffer(
        &mut self,
        memory: &'a dyn super::engine::EngineMemory,
        writes: bool,
    ) -> *mut c_void {
        self.foreign |= !self.engine().owns(memory);
        self.args.buffers.push((memory, writes));
        let slot = memory.address_slot();
        self.args.pointers.push(slot);
        self.args.sizes.push(std::mem::size_of::<*mut c_void>());
        slot
    }

    fn engine(&self) -> &'a dyn DeviceEngine {
        self.lease.engine()
    }

    /// Queues the kernel on the lease's stream.
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
        let (engine, name, args) = (self.engine(), self.name, &mut self.args);
        let stream = self.lease.stream();
        // SAFETY: the caller's contract; every pointer lives as long as 'a.
        self.lease
            .clocked(|| unsafe { engine.launch(stream, name, config, args) })
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
