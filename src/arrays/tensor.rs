//! A resident array's dense tensor.

use crate::ops::linalg::{Dtype, Values};

/// A dense tensor kept as an array: f16, bf16 and f32 values held as f32 (exactly: the
/// halves widen without rounding), f64 as f64; f32 values shared, so an op that names
/// the tensor reads them in place rather than copying them.
#[derive(Debug)]
pub struct Tensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub values: Values,
}

impl Tensor {
    /// `values`, already representable in `dtype`, finite, `shape`'s product of them;
    /// held as f64 for f64, else as f32.
    pub fn new(dtype: Dtype, shape: Vec<usize>, values: Values) -> Self {
        let values = match dtype {
            Dtype::F64 => Values::F64(values.into_f64()),
            // Detached from the request body first: kept, it would hold the whole body.
            _ => Values::F32(values.into_f32_array().detached().shared()),
        };
        Self {
            dtype,
            shape,
            values,
        }
    }

    /// Bytes its values take in host memory: 4 per f16, bf16 or f32 value, 8 per f64.
    pub fn held_bytes(&self) -> u64 {
        let width = match self.values {
            Values::F32(_) => 4,
            Values::F64(_) => 8,
        };
        (width * self.values.len()) as u64
    }
}
