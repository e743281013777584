//! Dense tensors of rank 1–4 for the tensor operations (linalg, nn, embeddings, beams):
//! nested JSON arrays of numbers, parsed straight into a flat buffer and a shape, or
//! base64 of little-endian f16, bf16, f32 or f64 with a shape. Answers come back in the
//! form of the request's first operand. DP's f32/f64 vectors and matrices are
//! `float_arrays`.

use super::array_operands::{ArrayScope, TensorOperand};
use super::float_arrays::{too_many, BinaryEncoding};
use super::numbers::Counted;
use super::packed::PackedWords;
use super::problem::{ErrorCode, Problem};
use crate::arrays::Tensor;
use crate::ops::linalg::held::HeldTensor;
use crate::ops::linalg::{Compute, Dtype, Values};
use bytes::Bytes;
use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// Deepest nesting the tensor operations take.
pub const MAX_RANK: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TensorDtype {
    F16,
    Bf16,
    F32,
    F64,
}

impl From<TensorDtype> for Dtype {
    fn from(d: TensorDtype) -> Self {
        match d {
            TensorDtype::F16 => Dtype::F16,
            TensorDtype::Bf16 => Dtype::Bf16,
            TensorDtype::F32 => Dtype::F32,
            TensorDtype::F64 => Dtype::F64,
        }
    }
}

impl From<Dtype> for TensorDtype {
    fn from(d: Dtype) -> Self {
        match d {
            Dtype::F16 => TensorDtype::F16,
            Dtype::Bf16 => TensorDtype::Bf16,
            Dtype::F32 => TensorDtype::F32,
            Dtype::F64 => TensorDtype::F64,
        }
    }
}

/// Packed little-endian values: `data` is base64 of `shape`'s product of `dtype` values,
/// row-major.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"encoding": "base64", "dtype": "f32", "shape": [2, 2], "data": "AACAPwAAAEAAAEBAAACAQA=="}))]
pub struct PackedTensor {
    pub encoding: BinaryEncoding,
    pub dtype: TensorDtype,
    /// Every dimension at least 1; the rank the operand takes: 2 or 3 for matrices (a
    /// batch of them), 4 for attention's `[B, H, S, D]`.
    #[schema(min_items = 2, max_items = 4, minimum = 1)]
    pub shape: Vec<usize>,
    /// Standard base64 with padding: exactly `shape`'s product × the dtype's width bytes.
    #[schema(value_type = String)]
    pub data: Base64Data,
}

/// Base64 text decoded while the body is parsed, so a large tensor's JSON string is never
/// copied into a `String` first; in 4-byte words, so packed f32 values become a
/// `Vec<f32>` without a copy. A bad one is kept, to be refused with its field's path and
/// code once the tensor is decoded.
#[derive(Clone, Debug)]
pub struct Base64Data(Result<PackedWords<u32>, String>);

impl Base64Data {
    pub fn new(text: &str) -> Self {
        Base64Data(PackedWords::decode(text))
    }
}

impl<'de> Deserialize<'de> for Base64Data {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl Visitor<'_> for Text {
            type Value = Base64Data;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a base64 string")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Base64Data, E> {
                Ok(Base64Data::new(s))
            }
        }
        d.deserialize_str(Text)
    }
}

/// A tensor as it arrived.
#[derive(Debug)]
pub enum DenseIn {
    Nested {
        shape: Vec<usize>,
        values: Vec<f64>,
    },
    Packed(PackedTensor),
    /// A buffer of a bulk body (`api::bulk`): its bytes, the layout already checked.
    Buffer {
        dtype: crate::wire::Dtype,
        shape: Vec<usize>,
        bytes: Bytes,
    },
    /// `{"array": id}`: a resident tensor, named; `resolve` finds it.
    Array(String),
    /// A resident tensor, found: its values were checked when it was made.
    Resident(Arc<Tensor>),
    /// A resident tensor a device holds (a kept product or convolution output), found by
    /// `resolve_where_held`
    /// for an op that reads it there.
    Held(Arc<HeldTensor>),
}

impl TryFrom<crate::wire::Dtype> for TensorDtype {
    type Error = String;

    fn try_from(d: crate::wire::Dtype) -> Result<Self, String> {
        use crate::wire::Dtype as W;
        match d {
            W::F16 => Ok(TensorDtype::F16),
            W::Bf16 => Ok(TensorDtype::Bf16),
            W::F32 => Ok(TensorDtype::F32),
            W::F64 => Ok(TensorDtype::F64),
            other => Err(format!(
                "{} is not a tensor dtype: f16, bf16, f32 or f64",
                other.name()
            )),
        }
    }
}

/// A decoded tensor: its shape and values, and the dtype they came in (None: JSON).
/// Packed f32, f16 and bf16 values stay f32 (exactly: both halves widen to f32 without
/// rounding), so a large f32 operand is never widened to f64 and back; packed f64 and
/// JSON numbers are f64.
pub struct DenseValues {
    pub shape: Vec<usize>,
    pub values: Values,
    pub packed: Option<TensorDtype>,
}

impl DenseIn {
    /// The dtype the tensor states: packed and buffer tensors do, nested numbers not.
    pub fn packed_dtype(&self) -> Option<TensorDtype> {
        match self {
            DenseIn::Packed(p) => Some(p.dtype),
            DenseIn::Buffer { dtype, .. } => TensorDtype::try_from(*dtype).ok(),
            DenseIn::Resident(t) => Some(t.dtype.into()),
            DenseIn::Held(h) => Some(h.dtype().into()),
            DenseIn::Nested { .. } | DenseIn::Array(_) => None,
        }
    }

    /// Whether an answer in this operand's form is packed: it is when the operand came
    /// packed (or as a bulk buffer); nested numbers and resident tensors answer nested.
    pub fn answers_packed(&self) -> bool {
        matches!(self, DenseIn::Packed(_) | DenseIn::Buffer { .. })
    }

    /// A named operand at `path` replaced by the tenant's resident tensor (422
    /// unknown_array, or array_mismatch for an array of another kind, at `{path}/array`);
    /// any other form left as it is. Every handler that takes a dense operand resolves it
    /// before reading its dtype.
    /// The key a device keeps its copy under when it names an array
    /// (`arrays::device_key`).
    pub fn resolve(&mut self, scope: &ArrayScope, path: &str) -> Result<Option<String>, Problem> {
        let DenseIn::Array(id) = self else {
            return Ok(None);
        };
        let key = crate::arrays::device_key(id);
        *self = DenseIn::Resident(scope.tensor(id, path)?);
        Ok(Some(key))
    }

    /// `resolve`, but a product a device holds stays there when `compute` takes its
    /// values as they are (`DenseIn::Held`; `ArrayScope::tensor_where_held`).
    pub fn resolve_where_held(
        &mut self,
        scope: &ArrayScope,
        compute: Compute,
        path: &str,
    ) -> Result<Option<String>, Problem> {
        let DenseIn::Array(id) = self else {
            return Ok(None);
        };
        let key = crate::arrays::device_key(id);
        *self = match scope.tensor_where_held(id, compute, path)? {
            TensorOperand::Host(t) => DenseIn::Resident(t),
            TensorOperand::Held(h) => DenseIn::Held(h),
        };
        Ok(Some(key))
    }

    /// The array an operand names, before it is resolved.
    pub fn array_id(&self) -> Option<String> {
        match self {
            DenseIn::Array(id) => Some(id.clone()),
            _ => None,
        }
    }

    /// The tensor a device holds, for a resolved operand that names one.
    pub fn held(&self) -> Option<Arc<HeldTensor>> {
        match self {
            DenseIn::Held(h) => Some(h.clone()),
            _ => None,
        }
    }

    /// `resolve` for an optional operand.
    pub fn resolve_some(
        t: &mut Option<DenseIn>,
        scope: &ArrayScope,
        path: &str,
    ) -> Result<Option<String>, Problem> {
        t.as_mut().map_or(Ok(None), |t| t.resolve(scope, path))
    }

    /// Decodes and checks the rank is in `ranks`, at most `max` values, all finite.
    pub fn decode(
        self,
        path: &str,
        ranks: std::ops::RangeInclusive<usize>,
        max: usize,
    ) -> Result<DenseValues, Problem> {
        let bad = |p: String, m: String| Problem::at(ErrorCode::InvalidTensor, p, m);
        let resident = matches!(self, DenseIn::Resident(_) | DenseIn::Held(_));
        let (shape, values, packed) = match self {
            DenseIn::Resident(t) => {
                if !ranks.contains(&t.shape.len()) {
                    return Err(Problem::at(
                        ErrorCode::ArrayMismatch,
                        format!("{path}/array"),
                        format!(
                            "the array is shaped {:?}; this operand takes rank {} to {}",
                            t.shape,
                            ranks.start(),
                            ranks.end()
                        ),
                    ));
                }
                (t.shape.clone(), t.values.clone(), Some(t.dtype.into()))
            }
            // Read back here; an op that reads it on its device takes it before this.
            DenseIn::Held(h) => {
                let values = h.download().map_err(|e| {
                    Problem::at(ErrorCode::ArrayLost, format!("{path}/array"), e.message)
                })?;
                (h.shape().to_vec(), values, Some(h.dtype().into()))
            }
            // Only operands whose handler resolves them take arrays.
            DenseIn::Array(_) => {
                return Err(Problem::at(
                    ErrorCode::InvalidRequest,
                    format!("{path}/array"),
                    "this operand does not take a resident array",
                ))
            }
            DenseIn::Nested { shape, values } => {
                let n = shape.iter().fold(1usize, |a, &d| a.saturating_mul(d));
                if n != values.len() {
                    return Err(too_many(path, n, max));
                }
                (shape, Values::F64(values), None)
            }
            DenseIn::Packed(p) => {
                let n = check_shape(&p.shape, &format!("{path}/shape"), max)?;
                let width = Dtype::from(p.dtype).bytes();
                let words = p
                    .data
                    .0
                    .map_err(|e| bad(format!("{path}/data"), format!("not base64: {e}")))?;
                if words.len != n * width {
                    return Err(bad(
                        format!("{path}/data"),
                        format!(
                            "{} bytes, but shape {:?} of {} needs {}",
                            words.len,
                            p.shape,
                            Dtype::from(p.dtype).name(),
                            n * width
                        ),
                    ));
                }
                (p.shape, decode_le(words, p.dtype), Some(p.dtype))
            }
            DenseIn::Buffer {
                dtype,
                shape,
                bytes,
            } => {
                let dtype = TensorDtype::try_from(dtype).map_err(|e| {
                    Problem::at(ErrorCode::InvalidRequest, format!("{path}/dtype"), e)
                })?;
                // The layout check made the length the shape's product × the width.
                check_shape(&shape, &format!("{path}/shape"), max)?;
                (shape, decode_buffer(bytes, dtype), Some(dtype))
            }
        };
        if !ranks.contains(&shape.len()) {
            return Err(bad(
                path.into(),
                format!(
                    "rank {}, but this operand takes rank {} to {}",
                    shape.len(),
                    ranks.start(),
                    ranks.end()
                ),
            ));
        }
        if values.len() > max {
            return Err(too_many(path, values.len(), max));
        }
        // A resident tensor was checked when it was made.
        if let Some(i) = values.first_non_finite().filter(|_| !resident) {
            return Err(bad(
                path.into(),
                format!("value {i} (row-major) is not finite"),
            ));
        }
        Ok(DenseValues {
            shape,
            values,
            packed,
        })
    }
}

pub(super) fn check_shape(shape: &[usize], path: &str, max: usize) -> Result<usize, Problem> {
    let bad = |m: &str| Problem::at(ErrorCode::InvalidTensor, path, m);
    if shape.is_empty() || shape.len() > MAX_RANK {
        return Err(bad("must have 1 to 4 dimensions"));
    }
    match shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) {
        Some(0) => Err(bad("every dimension must be at least 1")),
        None => Err(too_many(path, usize::MAX, max)),
        Some(n) if n > max => Err(too_many(path, n, max)),
        Some(n) => Ok(n),
    }
}

fn decode_le(words: PackedWords<u32>, dtype: TensorDtype) -> Values {
    if dtype == TensorDtype::F32 && cfg!(target_endian = "little") {
        return Values::F32(bytemuck::allocation::cast_vec::<u32, f32>(words.words).into());
    }
    decode_le_bytes(words.bytes(), dtype)
}

/// A bulk buffer's values: f32 read where they lie in the body (`wire::Array`), the
/// other dtypes converted.
fn decode_buffer(bytes: Bytes, dtype: TensorDtype) -> Values {
    if dtype == TensorDtype::F32 {
        // The layout check made the length a whole number of f32s.
        if let Some(values) = crate::wire::Array::from_le_bytes(bytes.clone()) {
            return Values::F32(values);
        }
    }
    decode_le_bytes(&bytes, dtype)
}

/// Little-endian values of `dtype`; f32 on a little-endian host is one copy.
fn decode_le_bytes(bytes: &[u8], dtype: TensorDtype) -> Values {
    Values::from_le_bytes(bytes, Dtype::from(dtype))
}

// ------------------------------------------------------------------- nested arrays

/// What parsing nested arrays has seen: each depth's length (from its first array), the
/// depth of the numbers (from the first), and the values in order (stored up to the
/// parse-time cap, `numbers::Counted`).
struct Nesting {
    dims: [Option<usize>; MAX_RANK],
    rank: Option<usize>,
    numbers: Counted,
}

/// One array (or number) at `depth` inside the outermost array.
struct Level<'a> {
    nesting: &'a mut Nesting,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Level<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Level<'_> {
    fn number<E: serde::de::Error>(self, x: f64) -> Result<(), E> {
        match self.nesting.rank {
            None if self.depth == 0 => Err(E::custom("expected an array of numbers")),
            None => {
                self.nesting.rank = Some(self.depth);
                self.nesting.numbers.push(x);
                Ok(())
            }
            Some(r) if r == self.depth => {
                self.nesting.numbers.push(x);
                Ok(())
            }
            Some(r) => Err(E::custom(format!(
                "a number at depth {} where earlier numbers are at depth {r} (ragged)",
                self.depth
            ))),
        }
    }
}

impl<'de> Visitor<'de> for Level<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("nested arrays of numbers (rank 1 to 4), or {encoding, dtype, shape, data}")
    }

    fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<(), E> {
        self.number(x)
    }

    fn visit_i64<E: serde::de::Error>(self, x: i64) -> Result<(), E> {
        self.number(x as f64)
    }

    fn visit_u64<E: serde::de::Error>(self, x: u64) -> Result<(), E> {
        self.number(x as f64)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let depth = self.depth;
        if depth >= MAX_RANK || self.nesting.rank.is_some_and(|r| depth >= r) {
            return Err(A::Error::custom(
                "nested deeper than the numbers before it, or deeper than rank 4",
            ));
        }
        let mut len = 0;
        while seq
            .next_element_seed(Level {
                nesting: &mut *self.nesting,
                depth: depth + 1,
            })?
            .is_some()
        {
            len += 1;
        }
        if len == 0 {
            return Err(A::Error::custom(
                "an empty array: every dimension must be at least 1",
            ));
        }
        match self.nesting.dims[depth] {
            None => self.nesting.dims[depth] = Some(len),
            Some(want) if want == len => {}
            Some(want) => {
                return Err(A::Error::custom(format!(
                    "{len} items where the first array at this depth has {want} (ragged)"
                )))
            }
        }
        Ok(())
    }
}

/// A tensor object: packed (`encoding`, `data`), in a bulk body a buffer descriptor
/// (`byte_offset`, `byte_length`), or a resident array's id (`array`); which one is
/// decided once it is read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TensorObject {
    array: Option<String>,
    encoding: Option<BinaryEncoding>,
    /// Any buffer dtype: a buffer's is checked where the tensor is decoded (integer ids
    /// and positions take `u32` and `u64`), a packed tensor's here.
    dtype: Option<crate::wire::Dtype>,
    shape: Option<Vec<usize>>,
    data: Option<Base64Data>,
    byte_offset: Option<u64>,
    byte_length: Option<u64>,
}

/// The outermost value: an array (nested numbers) or an object (packed, or a buffer).
struct Outer;

impl<'de> Visitor<'de> for Outer {
    type Value = DenseIn;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("nested arrays of numbers (rank 1 to 4), or {encoding, dtype, shape, data}")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<DenseIn, A::Error> {
        let mut nesting = Nesting {
            dims: [None; MAX_RANK],
            rank: None,
            numbers: Counted::new(),
        };
        Level {
            nesting: &mut nesting,
            depth: 0,
        }
        .visit_seq(seq)?;
        let rank = nesting.rank.unwrap_or(0);
        Ok(DenseIn::Nested {
            shape: nesting.dims[..rank].iter().flatten().copied().collect(),
            // Past the cap nothing is kept: decode refuses it by its shape.
            values: nesting.numbers.into_values().unwrap_or_default(),
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<DenseIn, A::Error> {
        let t = TensorObject::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        let packed_fields = t.encoding.is_some() || t.data.is_some();
        if let Some(id) = t.array {
            let described = t.dtype.is_some() || t.shape.is_some();
            if packed_fields || described || t.byte_offset.is_some() || t.byte_length.is_some() {
                return Err(A::Error::custom(
                    "an array reference takes only `array`: the array states its dtype and shape",
                ));
            }
            return Ok(DenseIn::Array(id));
        }
        let dtype = t.dtype.ok_or_else(|| A::Error::missing_field("dtype"))?;
        let shape = t.shape.ok_or_else(|| A::Error::missing_field("shape"))?;
        match super::bulk::described_buffer(t.byte_offset, t.byte_length, packed_fields)? {
            Some(bytes) => Ok(DenseIn::Buffer {
                dtype,
                shape,
                bytes,
            }),
            None => Ok(DenseIn::Packed(PackedTensor {
                encoding: t
                    .encoding
                    .ok_or_else(|| A::Error::missing_field("encoding"))?,
                dtype: TensorDtype::try_from(dtype).map_err(A::Error::custom)?,
                shape,
                data: t.data.ok_or_else(|| A::Error::missing_field("data"))?,
            })),
        }
    }
}

impl<'de> Deserialize<'de> for DenseIn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Outer)
    }
}

mod docs;
pub use docs::*;

mod answers;
pub use answers::DenseOut;

#[cfg(test)]
mod tests;
