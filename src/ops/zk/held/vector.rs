//! A field vector held on a device (`backend::device::held`): what it is, and its reading
//! back.

use super::super::gpu;
use super::super::{Field, FieldVec};
use crate::backend::device::held::{lost, HeldCopy, HeldValues};
use crate::backend::{DeviceError, DeviceLease, Element};

/// A field vector whose only copy is on a device.
pub type HeldVector = HeldCopy<FieldVec>;

/// A held field vector's field and length.
#[derive(Clone, Copy, Debug)]
pub struct FieldShape {
    pub field: Field,
    pub len: usize,
}

impl HeldValues for FieldVec {
    type Meta = FieldShape;

    fn read(dev: &DeviceLease<'_>, key: &str, meta: &FieldShape) -> Result<Self, DeviceError> {
        if meta.field == Field::BabyBear {
            return Ok(FieldVec::BabyBear(read::<u32>(dev, key)?));
        }
        Ok(gpu::from_u64(meta.field, read::<u64>(dev, key)?))
    }
}

impl HeldCopy<FieldVec> {
    pub fn field(&self) -> Field {
        self.meta().field
    }

    pub fn len(&self) -> usize {
        self.meta().len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn byte_len(&self) -> usize {
        self.len() * self.field().byte_width()
    }
}

fn read<T: Element>(dev: &DeviceLease<'_>, key: &str) -> Result<Vec<T>, DeviceError> {
    let table = dev.table::<T>(key)?.ok_or_else(|| lost(key))?;
    dev.download(&table)
}
