//! A tensor held on a device (`backend::device::held`): a product or a convolution's
//! output kept where it was made (`kept::KeptMatmulJob`, `ops::nn::kept::KeptConv2dJob`),
//! its values f32 already rounded to its dtype.

use super::{Compute, Dtype, Values};
use crate::backend::device::held::{lost, HeldCopy, HeldValues};
use crate::backend::{DeviceError, DeviceLease};

/// A tensor whose only copy is on a device.
pub type HeldTensor = HeldCopy<Values>;

/// A held tensor's dtype (f32, f16 or bf16: its values are f32 on the device, each
/// representable in it) and shape.
#[derive(Clone, Debug)]
pub struct TensorShape {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl HeldValues for Values {
    type Meta = TensorShape;

    fn read(dev: &DeviceLease<'_>, key: &str, _: &TensorShape) -> Result<Self, DeviceError> {
        let table = dev.table::<f32>(key)?.ok_or_else(|| lost(key))?;
        Ok(Values::F32(dev.download(&table)?.into()))
    }
}

impl HeldCopy<Values> {
    pub fn dtype(&self) -> Dtype {
        self.meta().dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.meta().shape
    }

    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of its device copy, as the quotas count a tensor's: 4 a value.
    pub fn byte_len(&self) -> usize {
        4 * self.len()
    }

    /// Whether a product computing in `compute` reads its copy as it is: rounding its
    /// values to `compute` changes none of them (`Compute::keeps`).
    pub fn serves(&self, compute: Compute) -> bool {
        compute.keeps(self.dtype())
    }
}
