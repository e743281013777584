//! Device memory: a typed buffer on either engine, and the lease's allocate, copy-in,
//! copy-out, zero and device-to-device copy.

use super::{DeviceError, DeviceLease, Engine};
use crate::backend::emulated::HostMemory;
use crate::backend::hip::engine::HipMemory;
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

/// What a device buffer may hold: plain data with the same layout on host and device.
pub trait Element: DeviceRepr + Copy + Send + Sync + Unpin + 'static {}
impl<T: DeviceRepr + Copy + Send + Sync + Unpin + 'static> Element for T {}

/// `len` elements of `T` in device memory, freed when dropped.
pub struct DeviceBuffer<T> {
    len: usize,
    pub(crate) memory: Memory<T>,
}

pub(crate) enum Memory<T> {
    Cuda(CudaSlice<T>),
    /// An AMD device's memory: exactly the buffer's bytes.
    Hip(HipMemory),
    /// The emulated device's memory: host memory of exactly the buffer's bytes, so
    /// AddressSanitizer sees a kernel that steps past it.
    Host(HostMemory),
}

impl<T> DeviceBuffer<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl DeviceLease<'_> {
    /// A copy of `host` on the device.
    pub fn upload<T: Element>(&self, host: &[T]) -> Result<DeviceBuffer<T>, DeviceError> {
        let memory = match self.engine() {
            Engine::Cuda(c) => Memory::Cuda(c.stream.clone_htod(host)?),
            Engine::Hip(h) => {
                let m = h.alloc(std::mem::size_of_val(host))?;
                // SAFETY: `host` holds exactly that many bytes; T is plain data.
                unsafe { h.write(&m, host.as_ptr().cast(), std::mem::size_of_val(host))? };
                Memory::Hip(m)
            }
            Engine::Emulated(e) => {
                let m = e.alloc(std::mem::size_of_val(host))?;
                // SAFETY: `m` holds exactly size_of_val(host) bytes; T is plain data.
                unsafe { m.write(host.as_ptr().cast(), std::mem::size_of_val(host)) };
                Memory::Host(m)
            }
        };
        Ok(DeviceBuffer {
            len: host.len(),
            memory,
        })
    }

    /// `len` zeroed elements on the device.
    pub fn alloc_zeros<T: Element + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<DeviceBuffer<T>, DeviceError> {
        let memory = match self.engine() {
            Engine::Cuda(c) => Memory::Cuda(c.stream.alloc_zeros(len)?),
            Engine::Hip(h) => {
                let mut m = h.alloc(len * std::mem::size_of::<T>())?;
                h.zero(&mut m)?;
                Memory::Hip(m)
            }
            Engine::Emulated(e) => Memory::Host(e.alloc(len * std::mem::size_of::<T>())?),
        };
        Ok(DeviceBuffer { len, memory })
    }

    /// The buffer's contents, once the work queued before has finished.
    pub fn download<T: Element>(&self, buf: &DeviceBuffer<T>) -> Result<Vec<T>, DeviceError> {
        match (self.engine(), &buf.memory) {
            (Engine::Cuda(c), Memory::Cuda(s)) => {
                let host = c.stream.clone_dtoh(s)?;
                c.stream.synchronize()?;
                Ok(host)
            }
            (Engine::Hip(h), Memory::Hip(m)) => {
                let mut host = Vec::<T>::with_capacity(buf.len);
                // SAFETY: the memory holds len elements of T (written as T, or zeroed);
                // the vector has room for them, and is filled before its length is set.
                unsafe {
                    h.read(
                        m,
                        host.as_mut_ptr().cast(),
                        buf.len * std::mem::size_of::<T>(),
                    )?;
                    host.set_len(buf.len);
                }
                Ok(host)
            }
            (Engine::Emulated(_), Memory::Host(m)) => {
                let mut host = Vec::<T>::with_capacity(buf.len);
                // SAFETY: the memory holds len elements of T, written as T (or zeroed,
                // which the buffer's T allows); the vector has room for them.
                unsafe {
                    m.read(host.as_mut_ptr().cast(), buf.len * std::mem::size_of::<T>());
                    host.set_len(buf.len);
                }
                Ok(host)
            }
            _ => Err(foreign()),
        }
    }

    /// Zeroes the buffer.
    pub fn zero<T: Element + ValidAsZeroBits>(
        &self,
        buf: &mut DeviceBuffer<T>,
    ) -> Result<(), DeviceError> {
        match (self.engine(), &mut buf.memory) {
            (Engine::Cuda(c), Memory::Cuda(s)) => Ok(c.stream.memset_zeros(s)?),
            (Engine::Hip(h), Memory::Hip(m)) => h.zero(m),
            (Engine::Emulated(_), Memory::Host(m)) => {
                m.zero();
                Ok(())
            }
            _ => Err(foreign()),
        }
    }

    /// Copies `src` into `dst` on the device; both hold the same number of elements.
    pub fn copy<T: Element>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<(), DeviceError> {
        if src.len != dst.len {
            return Err(DeviceError::fatal(format!(
                "device copy of {} elements into {}",
                src.len, dst.len
            )));
        }
        match (self.engine(), &src.memory, &mut dst.memory) {
            (Engine::Cuda(c), Memory::Cuda(s), Memory::Cuda(d)) => {
                Ok(c.stream.memcpy_dtod(s, d)?)
            }
            (Engine::Hip(h), Memory::Hip(s), Memory::Hip(d)) => h.copy(s, d),
            (Engine::Emulated(_), Memory::Host(s), Memory::Host(d)) => {
                d.copy_from(s);
                Ok(())
            }
            _ => Err(foreign()),
        }
    }
}

/// A buffer handed to an engine that did not allocate it.
pub(super) fn foreign() -> DeviceError {
    DeviceError::fatal("a buffer of another device reached this one")
}
