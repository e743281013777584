//! Device memory: a typed buffer over an engine's allocation, and the lease's allocate,
//! copy-in, copy-out, zero and device-to-device copy. The engines deal in bytes; the
//! element type is checked here, once.

use super::engine::{foreign, EngineMemory};
use super::{CopyCounts, DeviceError, DeviceLease};
use std::marker::PhantomData;

/// What a device buffer (or a kernel's scalar argument) may hold: plain data with the
/// same layout on host and device, copied by copying its bytes.
///
/// # Safety
/// Every bit pattern must be a valid value (a download builds values from whatever bytes
/// a kernel wrote, and a zeroed buffer holds zeros): no `bool`, no enum, no reference. The
/// type must have no padding a kernel could read as data and no pointers into host memory.
pub unsafe trait Element: Copy + Send + Sync + Unpin + 'static {}

macro_rules! plain {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive number: no padding, zero is a value.
        unsafe impl Element for $t {}
    )* };
}
plain!(
    u8,
    u16,
    u32,
    u64,
    usize,
    i8,
    i16,
    i32,
    i64,
    isize,
    f32,
    f64,
    half::f16,
    half::bf16
);
// SAFETY: an array of plain data is plain data.
unsafe impl<T: Element, const N: usize> Element for [T; N] {}

/// `len` elements of `T` in device memory, freed when dropped.
pub struct DeviceBuffer<T> {
    len: usize,
    pub(crate) memory: Box<dyn EngineMemory>,
    _element: PhantomData<T>,
}

impl<T> DeviceBuffer<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Element> DeviceBuffer<T> {
    pub(super) fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// `len` elements in `memory`, which holds at least their bytes.
    pub(super) fn over(memory: Box<dyn EngineMemory>, len: usize) -> Self {
        debug_assert!(memory.bytes() >= len * std::mem::size_of::<T>());
        Self {
            len,
            memory,
            _element: PhantomData,
        }
    }
}

impl DeviceLease<'_> {
    /// A copy of `host` on the device: through page-locked staging where it is large
    /// enough and staging is to be had (`staged.rs`), from pageable memory otherwise.
    pub fn upload<T: Element>(&self, host: &[T]) -> Result<DeviceBuffer<T>, DeviceError> {
        self.upload_staged(host)
    }

    /// A copy of `host` on the device, from pageable memory (the driver stages it).
    pub(super) fn upload_pageable<T: Element>(
        &self,
        host: &[T],
    ) -> Result<DeviceBuffer<T>, DeviceError> {
        let bytes = std::mem::size_of_val(host);
        let mut memory = self.engine().alloc(bytes)?;
        // SAFETY: `host` holds exactly `bytes` bytes of plain data, as does the memory.
        unsafe {
            self.engine()
                .write(self.stream(), &mut *memory, host.as_ptr().cast(), bytes)?
        };
        CopyCounts::add(&self.copies.pageable_to_device, bytes);
        Ok(DeviceBuffer {
            len: host.len(),
            memory,
            _element: PhantomData,
        })
    }

    /// `len` zeroed elements on the device.
    pub fn alloc_zeros<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>, DeviceError> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| DeviceError::out_of_memory(format!("{len} elements")))?;
        let memory = self.engine().alloc_zeroed(self.stream(), bytes)?;
        Ok(DeviceBuffer {
            len,
            memory,
            _element: PhantomData,
        })
    }

    /// The buffer's contents, once the work queued before has finished.
    pub fn download<T: Element>(&self, buf: &DeviceBuffer<T>) -> Result<Vec<T>, DeviceError> {
        let mut host = Vec::new();
        self.download_into(buf, &mut host)?;
        Ok(host)
    }

    /// Appends the buffer's contents to `host`, once the work queued before has finished:
    /// through page-locked staging where it is large enough and staging is to be had
    /// (`staged.rs`), otherwise straight into the vector's room; touched once either way.
    pub fn download_into<T: Element>(
        &self,
        buf: &DeviceBuffer<T>,
        host: &mut Vec<T>,
    ) -> Result<(), DeviceError> {
        self.download_staged_into(buf, host)
    }

    /// `download_into` from pageable memory: copied straight into the vector's room.
    pub(super) fn download_pageable_into<T: Element>(
        &self,
        buf: &DeviceBuffer<T>,
        host: &mut Vec<T>,
    ) -> Result<(), DeviceError> {
        if !self.engine().owns(&*buf.memory) {
            return Err(foreign());
        }
        host.reserve(buf.len);
        // SAFETY: the memory holds len elements of T (written as T, or zeroed, which T
        // allows); the vector has room for them past its length, filled before the
        // length takes them in.
        unsafe {
            self.engine().read(
                self.stream(),
                &*buf.memory,
                host.as_mut_ptr().add(host.len()).cast(),
                buf.bytes(),
            )?;
            host.set_len(host.len() + buf.len);
        }
        CopyCounts::add(&self.copies.pageable_from_device, buf.bytes());
        Ok(())
    }

    /// Zeroes the buffer.
    pub fn zero<T: Element>(&self, buf: &mut DeviceBuffer<T>) -> Result<(), DeviceError> {
        self.engine().zero(self.stream(), &mut *buf.memory)
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
        self.engine()
            .copy(self.stream(), &*src.memory, &mut *dst.memory)
    }
}
