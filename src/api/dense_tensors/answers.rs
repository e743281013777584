//! Answer tensors: nested numbers or packed little-endian values in a JSON answer, a
//! buffer in a bulk one (`api::bulk`).

use super::super::float_arrays::BinaryEncoding;
use super::super::packed::base64_json_string;
use super::TensorDtype;
use crate::ops::linalg::{Dtype, Values};
use bytes::Bytes;
use serde::ser::SerializeSeq;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

/// Values (already representable in `dtype`) as packed little-endian bytes. f32 values
/// packed as f32 on a little-endian host are not copied: the bytes are their vector's.
pub fn encode_le(values: Values, dtype: TensorDtype) -> Bytes {
    match values {
        Values::F32(v) if dtype == TensorDtype::F32 && cfg!(target_endian = "little") => {
            Bytes::from_owner(LeF32(v))
        }
        other => Bytes::from(other.le_bytes(Dtype::from(dtype)).into_owned()),
    }
}

/// f32 values seen as their little-endian bytes (on a little-endian host).
struct LeF32(crate::wire::Array<f32>);

impl AsRef<[u8]> for LeF32 {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// An answer tensor in the request's form: nested arrays, or packed. Written into a
/// bulk answer (`api::bulk::answer`), either is a buffer of its dtype.
pub enum DenseOut {
    Nested {
        shape: Vec<usize>,
        values: Vec<f64>,
        dtype: TensorDtype,
    },
    /// Little-endian values of `dtype`: base64 in a JSON answer, a bulk answer's buffer
    /// as they lie.
    Packed {
        dtype: TensorDtype,
        shape: Vec<usize>,
        bytes: Bytes,
    },
}

impl DenseOut {
    /// `values` (representable in `dtype`) shaped `shape`, packed when `packed`. Nested
    /// numbers are written as f64 (f32 values widened), as they always were.
    pub fn new(
        shape: Vec<usize>,
        values: impl Into<Values>,
        dtype: TensorDtype,
        packed: bool,
    ) -> Self {
        let values = values.into();
        if packed {
            DenseOut::Packed {
                dtype,
                bytes: encode_le(values, dtype),
                shape,
            }
        } else {
            DenseOut::Nested {
                shape,
                values: values.into_f64(),
                dtype,
            }
        }
    }

    /// About how many bytes the JSON takes (for the answer buffer's first capacity).
    pub fn json_bytes_hint(&self) -> usize {
        match self {
            // Numbers are written shortest-round-trip: most take under 24 bytes.
            DenseOut::Nested { values, .. } => values.len() * 24,
            DenseOut::Packed { bytes, shape, .. } => {
                bytes.len().div_ceil(3) * 4 + 64 * shape.len() + 64
            }
        }
    }
}

/// A packed tensor in a JSON answer: `PackedTensor`'s fields, in its order. `data` is the
/// finished JSON string: base64 needs no escaping, and serde's string writer would
/// otherwise check each of a large answer's bytes.
#[derive(Serialize)]
struct PackedTensorOut<'a> {
    encoding: BinaryEncoding,
    dtype: TensorDtype,
    shape: &'a [usize],
    data: Box<RawValue>,
}

/// Rows of `values` under `shape`, serialized as nested arrays without building them.
struct NestedSlice<'a> {
    shape: &'a [usize],
    values: &'a [f64],
}

impl Serialize for NestedSlice<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.shape[0]))?;
        if self.shape.len() == 1 {
            for x in self.values {
                seq.serialize_element(x)?;
            }
        } else {
            let inner: usize = self.shape[1..].iter().product();
            for part in self.values.chunks(inner) {
                seq.serialize_element(&NestedSlice {
                    shape: &self.shape[1..],
                    values: part,
                })?;
            }
        }
        seq.end()
    }
}

impl Serialize for DenseOut {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if crate::api::bulk::answering() {
            let (dtype, shape, bytes) = match self {
                DenseOut::Packed {
                    dtype,
                    shape,
                    bytes,
                } => (*dtype, shape, bytes.clone()),
                DenseOut::Nested {
                    shape,
                    values,
                    dtype,
                } => (
                    *dtype,
                    shape,
                    Bytes::from(Values::f64_le_bytes(values, (*dtype).into())),
                ),
            };
            let shape = shape.iter().map(|&d| d as u64).collect();
            let buffer = crate::api::bulk::push_answer_buffer(dtype.into(), shape, bytes);
            return buffer.serialize(s);
        }
        match self {
            DenseOut::Nested { shape, values, .. } => NestedSlice { shape, values }.serialize(s),
            DenseOut::Packed {
                dtype,
                shape,
                bytes,
            } => PackedTensorOut {
                encoding: BinaryEncoding::Base64,
                dtype: *dtype,
                shape,
                data: base64_json_string(bytes),
            }
            .serialize(s),
        }
    }
}

impl From<TensorDtype> for crate::wire::Dtype {
    fn from(d: TensorDtype) -> Self {
        match d {
            TensorDtype::F16 => crate::wire::Dtype::F16,
            TensorDtype::Bf16 => crate::wire::Dtype::Bf16,
            TensorDtype::F32 => crate::wire::Dtype::F32,
            TensorDtype::F64 => crate::wire::Dtype::F64,
        }
    }
}
