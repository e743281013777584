//! Request bodies in page-locked memory. On a host with a GPU a large body in the bulk
//! form (docs/WIRE.md) is read from the socket into a `PinnedBlock`: host memory of ours,
//! page-aligned, registered with a device's engine (`DeviceEngine::register_host`).
//! Operands read in place from the body (f32 gradients and tensors) then already lie in
//! page-locked memory, and `DeviceLease::upload` copies them straight from it at the
//! bus's speed: the host touches those bytes once, as they arrive from the socket,
//! instead of a second time into a staging buffer (`staged.rs`).
//!
//! Every live block is in one registry by address, so an upload finds whether the slice
//! it is given lies inside one, and which engine registered it. The memory is ours, not
//! the engine's: a re-probe that resets the device drops the registration, never the
//! bytes a request still reads (the block is then another engine's, and uploads from it
//! are staged as from any pageable memory).

use super::engine::{EngineId, PinnedHost};
use super::{DeviceError, GpuDevice};
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// `--gpu-pinned-body-mib`'s default: four bodies of the default `--max-body-bytes`.
pub const DEFAULT_PINNED_BODY_MIB: u64 = 1024;

/// Blocks are whole pages, as the drivers pin them.
const PAGE: usize = 4096;

/// A registration with an engine, shared by a block and the uploads reading it.
pub(super) type Registration = Arc<Mutex<Box<dyn PinnedHost>>>;

/// Host memory registered as page-locked with one engine, freed (after its registration
/// is dropped) when the block is.
pub struct PinnedBlock {
    address: *mut u8,
    layout: Layout,
    registration: Option<Registration>,
    engine: EngineId,
}

// SAFETY: the block owns its memory; its one owner writes it (`as_mut_ptr`) before the
// bytes are shared for reading, and the registration is behind a mutex.
unsafe impl Send for PinnedBlock {}

/// One registered block in the registry: where it ends, whose it is, and its registration
/// (weak: the block owns it).
struct Region {
    end: usize,
    engine: EngineId,
    registration: Weak<Mutex<Box<dyn PinnedHost>>>,
}

/// Live blocks by start address.
static REGISTRY: Mutex<BTreeMap<usize, Region>> = Mutex::new(BTreeMap::new());

impl PinnedBlock {
    /// The bytes a block for `bytes` holds: whole pages.
    pub fn size_for(bytes: usize) -> usize {
        bytes.max(1).next_multiple_of(PAGE)
    }

    /// At least `bytes` of host memory, registered with `device`'s engine; `None` where
    /// the engine cannot register host memory. Not zeroed: registering faults every page
    /// in, and a body exposes only the bytes written to it.
    pub fn new(device: &GpuDevice, bytes: usize) -> Result<Option<Self>, DeviceError> {
        let size = Self::size_for(bytes);
        let layout = Layout::from_size_align(size, PAGE)
            .map_err(|e| DeviceError::out_of_memory(format!("a body of {bytes} bytes: {e}")))?;
        // SAFETY: the layout's size is nonzero. Its bytes are read only once written
        // (`BodyBuf` exposes its first `len`; uploads take ranges of those).
        let address = unsafe { std::alloc::alloc(layout) };
        if address.is_null() {
            return Err(DeviceError::out_of_memory(format!(
                "the host refused {size} bytes for a request body"
            )));
        }
        let engine = device.engine();
        // SAFETY: the memory is valid for `size` bytes and outlives the registration,
        // which `drop` releases before freeing it.
        let registered = unsafe { engine.register_host(address, size) };
        let pinned = match registered {
            Ok(Some(pinned)) => pinned,
            other => {
                // SAFETY: allocated above with this layout; nothing registered it.
                unsafe { std::alloc::dealloc(address, layout) };
                return other.map(|_| None);
            }
        };
        let (id, registration) = (engine.id(), Arc::new(Mutex::new(pinned)));
        lock(&REGISTRY).insert(
            address as usize,
            Region {
                end: address as usize + size,
                engine: id,
                registration: Arc::downgrade(&registration),
            },
        );
        Ok(Some(Self {
            address,
            layout,
            registration: Some(registration),
            engine: id,
        }))
    }

    /// The engine that registered it: uploads of other engines stage from it.
    pub fn engine_id(&self) -> EngineId {
        self.engine
    }

    /// Bytes it holds.
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.address
    }

    /// Where the owner writes; only while no copy reads it (`host_may_write`).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.address
    }

    /// Refused while a copy queued from it has not been waited for (the emulated device
    /// checks; the GPU engines trust the uploads, which wait before they return).
    pub fn host_may_write(&self) -> Result<(), DeviceError> {
        match &self.registration {
            Some(r) => lock(r).host_access(true),
            None => Ok(()),
        }
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        lock(&REGISTRY).remove(&(self.address as usize));
        // Unregistered before the memory goes (no upload holds it: any reads a slice of
        // this block, which keeps the block alive).
        drop(self.registration.take());
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.address, self.layout) };
    }
}

/// The registration of the live block of `engine`'s that holds all `bytes` at `host`,
/// and their range in it; `None` for memory of no block, or of another engine's.
pub(super) fn registered_at(
    host: *const u8,
    bytes: usize,
    engine: EngineId,
) -> Option<(Registration, Range<usize>)> {
    let start = host as usize;
    let end = start.checked_add(bytes)?;
    let registry = lock(&REGISTRY);
    let (&base, region) = registry.range(..=start).next_back()?;
    if end > region.end || region.engine != engine {
        return None;
    }
    Some((region.registration.upgrade()?, start - base..end - base))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::device::CopyCounts;

    /// 2 MiB of f32 values at `offset` floats into a block's memory, as a bulk body lays
    /// its buffers out after the header.
    fn body_with_values(dev: &GpuDevice, offset: usize) -> (PinnedBlock, Vec<f32>) {
        let values: Vec<f32> = (0..(1 << 19)).map(|i| i as f32 * 0.5 - 7.0).collect();
        let mut block = PinnedBlock::new(dev, 4 * (offset + values.len()))
            .unwrap()
            .expect("the emulated engine registers host memory");
        block.host_may_write().unwrap();
        // SAFETY: inside the block, which is at least that large.
        unsafe {
            std::ptr::copy_nonoverlapping(
                values.as_ptr(),
                block.as_mut_ptr().cast::<f32>().add(offset),
                values.len(),
            )
        };
        (block, values)
    }

    fn in_block(block: &PinnedBlock, offset: usize, len: usize) -> &[f32] {
        // SAFETY: written by `body_with_values`; lives as long as the block.
        unsafe { std::slice::from_raw_parts(block.as_ptr().cast::<f32>().add(offset), len) }
    }

    /// The copy-counting check for request bodies: an upload of a slice of a registered
    /// block is one copy straight from it (no staging, no pageable copy), the values
    /// arrive at their place, and the block may be written again once it returns.
    #[test]
    fn an_upload_of_a_page_locked_body_copies_straight_from_it() {
        let dev = GpuDevice::emulated(0, 1 << 30);
        let (block, values) = body_with_values(&dev, 16);
        let lease = dev.lease().unwrap();
        let buf = lease.upload(in_block(&block, 16, values.len())).unwrap();
        let c = lease.copies();
        let bytes = 4 * values.len() as u64;
        assert_eq!(CopyCounts::get(&c.body_to_device), bytes);
        let staged_or_pageable = CopyCounts::get(&c.staged_to_device)
            + CopyCounts::get(&c.pageable_to_device)
            + CopyCounts::get(&c.staging_fallbacks);
        assert_eq!(staged_or_pageable, 0);
        assert_eq!(lease.download(&buf).unwrap(), values);
        block.host_may_write().unwrap();
    }

    /// Memory of no block, a slice that runs past its block, and a block of another
    /// engine are staged as any memory; a dropped block is out of the registry.
    #[test]
    fn other_memory_is_staged() {
        let (dev, other) = (
            GpuDevice::emulated(0, 1 << 30),
            GpuDevice::emulated(1, 1 << 30),
        );
        let (block, values) = body_with_values(&dev, 0);
        let mine = dev.engine_id();
        let whole = in_block(&block, 0, values.len());
        assert!(registered_at(whole.as_ptr().cast(), 4 * whole.len(), mine).is_some());
        let past_its_end = block.capacity() + 1;
        assert!(registered_at(block.as_ptr(), past_its_end, mine).is_none());
        assert!(registered_at(values.as_ptr().cast(), 4 * values.len(), mine).is_none());

        let lease = other.lease().unwrap();
        let buf = lease.upload(whole).unwrap();
        assert_eq!(lease.download(&buf).unwrap(), values);
        let c = lease.copies();
        assert_eq!(
            CopyCounts::get(&c.body_to_device),
            0,
            "another engine's block"
        );
        assert_eq!(
            CopyCounts::get(&c.staged_to_device),
            4 * values.len() as u64
        );

        let at = block.as_ptr() as usize;
        drop(block);
        assert!(!lock(&REGISTRY).contains_key(&at), "out of the registry");
    }
}
