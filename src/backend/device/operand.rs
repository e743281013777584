//! A streaming job's operands (`DeviceLease::stream_items`): what each chunk's kernel
//! reads, and where the host gets it from.

use super::pinned_body::{self, Registration};
use super::{DeviceBuffer, DeviceError, DeviceLease, Element};
use std::ops::Range;

/// One input of a streaming job: `per_item` elements for each item, read from a slice
/// or written by the launcher straight into the chunk's staging (an input that is not
/// one slice on the host, such as a ciphertext's rows, is then still copied once), or
/// device room for the kernel's intermediates that is never copied (`scratch`).
pub struct Operand<'a, T> {
    source: Source<'a, T>,
    pub(super) per_item: usize,
}

/// Writes the elements of the items in the range into the slice (exactly their length).
type WriteItems<'a, T> = &'a (dyn Fn(Range<usize>, &mut [T]) + Sync);

enum Source<'a, T> {
    Slice(&'a [T]),
    Written(WriteItems<'a, T>),
    Scratch,
}

impl<'a, T: Element> Operand<'a, T> {
    /// `per_item` elements of `data` for each item.
    pub fn slice(data: &'a [T], per_item: usize) -> Self {
        Operand {
            source: Source::Slice(data),
            per_item,
        }
    }

    /// `per_item` elements for each item, written by `write(items, into)`.
    pub fn written(per_item: usize, write: WriteItems<'a, T>) -> Self {
        Operand {
            source: Source::Written(write),
            per_item,
        }
    }

    /// `per_item` elements of device memory for each item of a chunk, for the kernel's
    /// own intermediates: counted in the memory budget, zeroed once per lane, never
    /// copied to or from the host.
    pub fn scratch(per_item: usize) -> Self {
        Operand {
            source: Source::Scratch,
            per_item,
        }
    }

    /// Whether the operand is copied to the device.
    pub(super) fn is_staged(&self) -> bool {
        !matches!(self.source, Source::Scratch)
    }

    /// Where a slice operand lies, whole, in a request body already page-locked for this
    /// lease's engine (`pinned_body.rs`): its chunks are then uploaded straight from the
    /// body, with no staging copy. `None` for any other operand.
    pub(super) fn in_pinned_body(
        &self,
        lease: &DeviceLease<'_>,
    ) -> Option<(Registration, Range<usize>)> {
        let Source::Slice(data) = self.source else {
            return None;
        };
        let bytes = std::mem::size_of_val(data);
        pinned_body::registered_at(data.as_ptr().cast(), bytes, lease.engine().id())
    }

    /// The elements of `items` into `into`, of exactly their length.
    pub(super) fn write(&self, items: Range<usize>, into: &mut [T]) {
        match self.source {
            Source::Slice(data) => {
                into.copy_from_slice(&data[items.start * self.per_item..items.end * self.per_item])
            }
            Source::Written(write) => write(items, into),
            Source::Scratch => unreachable!("scratch is not staged"),
        }
    }

    /// The operand of `items` on the device by a pageable upload (scratch: allocated).
    pub(super) fn to_device(
        &self,
        lease: &DeviceLease<'_>,
        items: Range<usize>,
    ) -> Result<DeviceBuffer<T>, DeviceError> {
        match self.source {
            Source::Slice(data) => {
                lease.upload_pageable(&data[items.start * self.per_item..items.end * self.per_item])
            }
            Source::Written(write) => {
                // SAFETY: every bit pattern, zero included, is an Element (its contract).
                let mut v = vec![unsafe { std::mem::zeroed::<T>() }; items.len() * self.per_item];
                write(items, &mut v);
                lease.upload_pageable(&v)
            }
            Source::Scratch => lease.alloc_zeros(items.len() * self.per_item),
        }
    }
}
