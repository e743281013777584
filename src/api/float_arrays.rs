//! The f32/f64 vectors and matrices of the DP releases (and the `encoding` field that RF
//! uploads share): JSON numbers, or base64 of little-endian f32/f64 with a shape. Answers
//! come back in the form (and dtype) the request used. The tensor ops' rank 1–4 tensors,
//! with half precisions, are `dense_tensors`.

use super::array_operands::ArrayScope;
use super::numbers::{read_rows, Counted, Rows, RowsDefect};
use super::problem::{ErrorCode, Problem};
use crate::arrays::Tensor;
use crate::ops::linalg::Values;
use crate::wire::{first_non_finite, Array};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    F64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BinaryEncoding {
    Base64,
}

/// Packed little-endian values: `data` is base64 of `shape`'s product of `dtype` values,
/// row-major.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"encoding": "base64", "dtype": "f32", "shape": [2, 2], "data": "AACAPwAAAEAAAEBAAACAQA=="}))]
pub struct Packed {
    pub encoding: BinaryEncoding,
    pub dtype: Dtype,
    /// `[n]` for a vector, `[rows, cols]` for a matrix; every dimension at least 1, the
    /// product at most the server's element limit.
    #[schema(min_items = 1, max_items = 2, minimum = 1)]
    pub shape: Vec<usize>,
    /// Standard base64 with padding: exactly `shape`'s product × 4 (`f32`) or 8 (`f64`)
    /// bytes.
    #[schema(
        min_length = 8,
        pattern = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$"
    )]
    pub data: String,
}

/// A decoded array and the dtype it arrived in; a bulk buffer's values are read in
/// place (`wire::Array`).
pub enum Decoded {
    F32(Array<f32>),
    F64(Array<f64>),
}

impl Decoded {
    pub fn len(&self) -> usize {
        match self {
            Decoded::F32(v) => v.len(),
            Decoded::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn into_f64(self) -> Vec<f64> {
        match self {
            Decoded::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Decoded::F64(v) => v.into_vec(),
        }
    }
}

impl Packed {
    /// Decodes and checks the shape has `dims` dimensions and every value is finite.
    pub fn decode(
        &self,
        path: &str,
        dims: usize,
        max: usize,
    ) -> Result<(Vec<usize>, Decoded), Problem> {
        let bad = |p: String, m: String| Problem::at(ErrorCode::InvalidTensor, p, m);
        let n = check_dims(&self.shape, path, dims, max)?;
        let bytes = B64
            .decode(self.data.as_bytes())
            .map_err(|e| bad(format!("{path}/data"), format!("not base64: {e}")))?;
        let decoded = decode_le(
            bytes::Bytes::from(bytes),
            self.dtype,
            n,
            &self.shape,
            &format!("{path}/data"),
        )?;
        Ok((self.shape.clone(), decoded))
    }

    pub fn encode_f64(values: &[f64], dtype: Dtype) -> Self {
        let data = match dtype {
            Dtype::F32 => B64.encode(
                values
                    .iter()
                    .flat_map(|&x| (x as f32).to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
            Dtype::F64 => B64.encode(
                values
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        };
        Packed {
            encoding: BinaryEncoding::Base64,
            dtype,
            shape: vec![values.len()],
            data,
        }
    }
}

/// `shape` has `dims` dimensions, each at least 1, and at most `max` values: how many.
fn check_dims(shape: &[usize], path: &str, dims: usize, max: usize) -> Result<usize, Problem> {
    let bad = |m: String| Problem::at(ErrorCode::InvalidTensor, format!("{path}/shape"), m);
    if shape.len() != dims {
        return Err(bad(format!(
            "expected {dims} dimension(s), got {}",
            shape.len()
        )));
    }
    match shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) {
        Some(0) | None => Err(bad("every dimension must be at least 1".into())),
        Some(n) if n > max => Err(too_many(&format!("{path}/shape"), n, max)),
        Some(n) => Ok(n),
    }
}

/// `n` little-endian values of `dtype` from `bytes` (which must be exactly that long),
/// all finite, read in place where they lie aligned (`wire::Array`); `at` names the data
/// in refusals.
fn decode_le(
    bytes: bytes::Bytes,
    dtype: Dtype,
    n: usize,
    shape: &[usize],
    at: &str,
) -> Result<Decoded, Problem> {
    let bad = |m: String| Problem::at(ErrorCode::InvalidTensor, at, m);
    let width = match dtype {
        Dtype::F32 => 4,
        Dtype::F64 => 8,
    };
    if bytes.len() != n * width {
        return Err(bad(format!(
            "{} bytes, but shape {shape:?} of {dtype:?} needs {}",
            bytes.len(),
            n * width
        )));
    }
    let whole = "the length was checked to be whole values";
    let decoded = match dtype {
        Dtype::F32 => Decoded::F32(Array::from_le_bytes(bytes).expect(whole)),
        Dtype::F64 => Decoded::F64(Array::from_le_bytes(bytes).expect(whole)),
    };
    let first_bad = match &decoded {
        Decoded::F32(v) => first_non_finite(v),
        Decoded::F64(v) => first_non_finite(v),
    };
    if let Some(i) = first_bad {
        return Err(bad(format!("value {i} (row-major) is not finite")));
    }
    Ok(decoded)
}

/// An array in a bulk body's buffer (`api::bulk`): the layout already checked.
pub struct Buffered {
    dtype: crate::wire::Dtype,
    shape: Vec<usize>,
    bytes: bytes::Bytes,
}

impl Buffered {
    /// As `Packed::decode`; the dtype must be f32 or f64.
    fn decode(
        &self,
        path: &str,
        dims: usize,
        max: usize,
    ) -> Result<(Vec<usize>, Decoded), Problem> {
        let dtype = Dtype::try_from(self.dtype)
            .map_err(|e| Problem::at(ErrorCode::InvalidRequest, format!("{path}/dtype"), e))?;
        let n = check_dims(&self.shape, path, dims, max)?;
        let decoded = decode_le(self.bytes.clone(), dtype, n, &self.shape, path)?;
        Ok((self.shape.clone(), decoded))
    }

    fn dtype(&self) -> Option<Dtype> {
        Dtype::try_from(self.dtype).ok()
    }
}

impl TryFrom<crate::wire::Dtype> for Dtype {
    type Error = String;

    fn try_from(d: crate::wire::Dtype) -> Result<Self, String> {
        match d {
            crate::wire::Dtype::F32 => Ok(Dtype::F32),
            crate::wire::Dtype::F64 => Ok(Dtype::F64),
            other => Err(format!("these values are f32 or f64, not {}", other.name())),
        }
    }
}

/// A packed array's object: base64 (`encoding`, `data`) or, in a bulk body, a buffer
/// descriptor (`byte_offset`, `byte_length`); or `{"array": id}`, a resident tensor.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArrayObject {
    array: Option<String>,
    encoding: Option<BinaryEncoding>,
    dtype: Option<crate::wire::Dtype>,
    shape: Option<Vec<usize>>,
    data: Option<String>,
    byte_offset: Option<u64>,
    byte_length: Option<u64>,
}

/// Each form of an array object.
enum PackedOrBuffer {
    Packed(Packed),
    Buffer(Buffered),
    Array(String),
}

fn packed_or_buffer<'de, A: MapAccess<'de>>(map: A) -> Result<PackedOrBuffer, A::Error> {
    use serde::de::Error;
    let o = ArrayObject::deserialize(MapAccessDeserializer::new(map))?;
    let packed_fields = o.encoding.is_some() || o.data.is_some();
    if let Some(id) = o.array {
        let described = o.shape.is_some() || o.dtype.is_some() || o.byte_offset.is_some();
        if packed_fields || described || o.byte_length.is_some() {
            return Err(A::Error::custom(
                "an array reference takes only `array`, no packed or buffer fields",
            ));
        }
        return Ok(PackedOrBuffer::Array(id));
    }
    let dtype = o.dtype.ok_or_else(|| A::Error::missing_field("dtype"))?;
    let shape = o.shape.ok_or_else(|| A::Error::missing_field("shape"))?;
    match super::bulk::described_buffer(o.byte_offset, o.byte_length, packed_fields)? {
        Some(bytes) => Ok(PackedOrBuffer::Buffer(Buffered {
            dtype,
            shape,
            bytes,
        })),
        None => Ok(PackedOrBuffer::Packed(Packed {
            encoding: o
                .encoding
                .ok_or_else(|| A::Error::missing_field("encoding"))?,
            dtype: Dtype::try_from(dtype).map_err(A::Error::custom)?,
            shape,
            data: o.data.ok_or_else(|| A::Error::missing_field("data"))?,
        })),
    }
}

pub(super) fn too_many(path: &str, n: usize, max: usize) -> Problem {
    let mut p = Problem::at(
        ErrorCode::PayloadTooLarge,
        path,
        format!("{n} values; the server accepts at most {max}"),
    );
    p.detail = format!("{path}: {n} values is more than the server's limit of {max}");
    p
}

/// A `[rows, cols]` tensor: nested JSON arrays (read flat as they arrive), `Packed`, or
/// a bulk body's buffer.
pub enum Matrix {
    Nested(Rows),
    Packed(Packed),
    Buffer(Buffered),
    /// `{"array": id}`: a resident tensor of rank 2, named; `resolve` finds it.
    Array(String),
    Resident(Arc<Tensor>),
}

/// A vector: a JSON array of numbers (counted as it arrives), `Packed` with a
/// one-dimensional shape, or a bulk body's buffer.
pub enum Vector {
    Numbers(Counted),
    Packed(Packed),
    Buffer(Buffered),
    /// `{"array": id}`: a resident tensor of rank 1, named; `resolve` finds it.
    Array(String),
    Resident(Arc<Tensor>),
}

/// Deserialize for a type that is a JSON array (read by `$read`) or a packed object.
macro_rules! array_or_packed {
    ($ty:ident, $variant:ident, $read:expr, $expecting:literal) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<$ty, A::Error> {
                        $read(seq).map($ty::$variant)
                    }
                    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<$ty, A::Error> {
                        Ok(match packed_or_buffer(map)? {
                            PackedOrBuffer::Packed(p) => $ty::Packed(p),
                            PackedOrBuffer::Buffer(b) => $ty::Buffer(b),
                            PackedOrBuffer::Array(id) => $ty::Array(id),
                        })
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

array_or_packed!(
    Matrix,
    Nested,
    read_rows,
    "an array of arrays of numbers, {encoding, dtype, shape, data}, or {array}"
);
array_or_packed!(
    Vector,
    Numbers,
    |seq| {
        let mut numbers = Counted::new();
        numbers.read_array(seq).map(|_| numbers)
    },
    "an array of numbers, {encoding, dtype, shape, data}, or {array}"
);

impl Matrix {
    /// The dtype of a packed matrix, which the answer is written in; None for nested
    /// JSON numbers and resident tensors (answered as numbers).
    pub fn packed_dtype(&self) -> Option<Dtype> {
        match self {
            Matrix::Packed(p) => Some(p.dtype),
            Matrix::Buffer(b) => b.dtype(),
            Matrix::Nested(_) | Matrix::Array(_) | Matrix::Resident(_) => None,
        }
    }

    /// A named matrix replaced by the tenant's resident tensor (422 unknown_array, or
    /// array_mismatch for another kind, at `{path}/array`); other forms left as they are.
    pub fn resolve(&mut self, scope: &ArrayScope, path: &str) -> Result<(), Problem> {
        if let Matrix::Array(id) = self {
            *self = Matrix::Resident(scope.tensor(id, path)?);
        }
        Ok(())
    }

    /// (rows, cols, row-major values).
    pub fn decode(self, path: &str, max: usize) -> Result<(usize, usize, Decoded), Problem> {
        match self {
            Matrix::Array(_) => Err(unresolved(path)),
            Matrix::Resident(t) => {
                let values = resident(&t, path, 2, max)?;
                Ok((t.shape[0], t.shape[1], values))
            }
            Matrix::Packed(p) => {
                let (shape, values) = p.decode(path, 2, max)?;
                Ok((shape[0], shape[1], values))
            }
            Matrix::Buffer(b) => {
                let (shape, values) = b.decode(path, 2, max)?;
                Ok((shape[0], shape[1], values))
            }
            Matrix::Nested(Rows {
                numbers,
                rows,
                cols,
                defect,
            }) => {
                let bad = |p: String, m: String| Problem::at(ErrorCode::InvalidTensor, p, m);
                if rows == 0 || cols == 0 {
                    return Err(bad(
                        path.into(),
                        "must have at least one row and one column".into(),
                    ));
                }
                if let Some(RowsDefect::Ragged { row, len }) = defect {
                    return Err(bad(
                        format!("{path}/{row}"),
                        format!("has {len} values where row 0 has {cols} (ragged)"),
                    ));
                }
                let n = numbers.count();
                if n > max {
                    return Err(too_many(path, n, max));
                }
                let values = numbers
                    .into_values()
                    .ok_or_else(|| too_many(path, n, max))?;
                Ok((rows, cols, Decoded::F64(values.into())))
            }
        }
    }
}

impl Vector {
    /// As `Matrix::packed_dtype`.
    pub fn packed_dtype(&self) -> Option<Dtype> {
        match self {
            Vector::Packed(p) => Some(p.dtype),
            Vector::Buffer(b) => b.dtype(),
            Vector::Numbers(_) | Vector::Array(_) | Vector::Resident(_) => None,
        }
    }

    /// As `Matrix::resolve`.
    pub fn resolve(&mut self, scope: &ArrayScope, path: &str) -> Result<(), Problem> {
        if let Vector::Array(id) = self {
            *self = Vector::Resident(scope.tensor(id, path)?);
        }
        Ok(())
    }

    pub fn decode(self, path: &str, max: usize) -> Result<Decoded, Problem> {
        match self {
            Vector::Array(_) => Err(unresolved(path)),
            Vector::Resident(t) => resident(&t, path, 1, max),
            Vector::Packed(p) => Ok(p.decode(path, 1, max)?.1),
            Vector::Buffer(b) => Ok(b.decode(path, 1, max)?.1),
            Vector::Numbers(v) if v.count() == 0 => Err(Problem::at(
                ErrorCode::InvalidTensor,
                path,
                "must not be empty",
            )),
            Vector::Numbers(v) if v.count() > max => Err(too_many(path, v.count(), max)),
            Vector::Numbers(v) => {
                let n = v.count();
                v.into_values()
                    .map(|v| Decoded::F64(v.into()))
                    .ok_or_else(|| too_many(path, n, max))
            }
        }
    }

    pub fn is_packed(&self) -> bool {
        matches!(self, Vector::Packed(_) | Vector::Buffer(_))
    }
}

/// A named operand its handler did not resolve (none does so today; a refusal rather
/// than a panic if one ever forgets).
fn unresolved(path: &str) -> Problem {
    Problem::at(
        ErrorCode::InvalidRequest,
        format!("{path}/array"),
        "this operand does not take a resident array",
    )
}

/// A resident tensor's values as an operand of rank `dims`: shared, not copied, for
/// f32 (and the halves, held as f32); checked finite when it was made.
fn resident(t: &Tensor, path: &str, dims: usize, max: usize) -> Result<Decoded, Problem> {
    if t.shape.len() != dims {
        return Err(Problem::at(
            ErrorCode::ArrayMismatch,
            format!("{path}/array"),
            format!(
                "the array is shaped {:?}; this operand takes rank {dims}",
                t.shape
            ),
        ));
    }
    if t.values.len() > max {
        return Err(too_many(path, t.values.len(), max));
    }
    Ok(match &t.values {
        Values::F32(v) => Decoded::F32(v.clone()),
        Values::F64(v) => Decoded::F64(v.clone().into()),
    })
}

/// An answer vector in the request's form: numbers, or packed in the request's dtype;
/// in a bulk answer (`api::bulk`), a buffer of that dtype (f64 for numbers).
pub struct VectorOut {
    values: Vec<f64>,
    packed: Option<Dtype>,
}

impl VectorOut {
    pub fn new(values: Vec<f64>, packed: Option<Dtype>) -> Self {
        VectorOut { values, packed }
    }
}

impl Serialize for VectorOut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if super::bulk::answering() {
            let (dtype, bytes): (crate::wire::Dtype, Vec<u8>) = match self.packed {
                Some(Dtype::F32) => (
                    crate::wire::Dtype::F32,
                    self.values
                        .iter()
                        .flat_map(|&x| (x as f32).to_le_bytes())
                        .collect(),
                ),
                _ => (
                    crate::wire::Dtype::F64,
                    self.values.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
            };
            let shape = vec![self.values.len() as u64];
            return super::bulk::push_answer_buffer(dtype, shape, bytes.into()).serialize(s);
        }
        match self.packed {
            Some(dtype) => Packed::encode_f64(&self.values, dtype).serialize(s),
            None => self.values.serialize(s),
        }
    }
}

mod docs;
pub use docs::{MatrixDoc, VectorDoc, VectorOutDoc};

#[cfg(test)]
mod tests {
    use super::super::numbers::with_number_cap;
    use super::*;

    fn matrix(json: &str, cap: usize) -> Matrix {
        with_number_cap(cap, || serde_json::from_str(json).unwrap()).0
    }

    #[test]
    fn a_matrix_past_the_parse_cap_is_refused_with_its_whole_count() {
        let json = "[[1, 2], [3, 4], [5, 6]]";
        let (rows, cols, values) = matrix(json, 6).decode("/m", 6).ok().unwrap();
        assert_eq!((rows, cols), (3, 2));
        assert!(matches!(values, Decoded::F64(v) if *v == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        // Past the cap nothing is stored, yet the refusal names all six values.
        let e = matrix(json, 4).decode("/m", 4).err().unwrap();
        assert_eq!(
            (e.code, e.errors[0].path.as_str()),
            (ErrorCode::PayloadTooLarge, "/m")
        );
        assert!(e.detail.contains("6 values"), "{}", e.detail);
        let e = matrix("[[1, 2], [3]]", 4).decode("/m", 4).err().unwrap();
        assert_eq!(
            (e.code, e.errors[0].path.as_str()),
            (ErrorCode::InvalidTensor, "/m/1")
        );
    }
}
