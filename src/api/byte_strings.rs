//! Byte strings: standard base64 in JSON; in the bulk form (docs/WIRE.md) a buffer of
//! one dimension, read and written where it lies. An HE ciphertext is `u8`; an uploaded
//! RF recording is `cf32`.

use super::problem::{ErrorCode, Problem};
use crate::wire::Dtype;
use base64::Engine;
use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A byte string as sent: text to decode, or a buffer's bytes; or `{"array": id}`, a
/// resident array of kind bytes, which the handler resolves (`resolve`).
pub enum ByteStringIn {
    Base64(String),
    Buffer(crate::wire::BufferRef, Bytes),
    Array(String),
    Resident(Bytes),
}

impl<'de> Deserialize<'de> for ByteStringIn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ByteStringVisitor)
    }
}

struct ByteStringVisitor;

impl<'de> Visitor<'de> for ByteStringVisitor {
    type Value = ByteStringIn;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("standard base64 text, a buffer descriptor, or {array}")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteStringIn, E> {
        Ok(ByteStringIn::Base64(v.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<ByteStringIn, E> {
        Ok(ByteStringIn::Base64(v))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ByteStringIn, A::Error> {
        use super::array_operands::{object_operand, ObjectOperand};
        Ok(match object_operand(map)? {
            ObjectOperand::Array(id) => ByteStringIn::Array(id),
            ObjectOperand::Buffer(b, bytes) => ByteStringIn::Buffer(b, bytes),
        })
    }
}

impl ByteStringIn {
    /// About how many bytes it holds: what a size limit is checked against before
    /// anything is decoded.
    pub fn approx_bytes(&self) -> usize {
        match self {
            ByteStringIn::Base64(text) => text.len() / 4 * 3,
            ByteStringIn::Buffer(_, bytes) | ByteStringIn::Resident(bytes) => bytes.len(),
            ByteStringIn::Array(_) => 0,
        }
    }

    /// A named byte string replaced by the tenant's resident bytes (422 unknown_array,
    /// or array_mismatch for another kind, at `{path}/array`).
    pub fn resolve(
        &mut self,
        scope: &super::array_operands::ArrayScope,
        path: &str,
    ) -> Result<(), Problem> {
        if let ByteStringIn::Array(id) = self {
            *self = ByteStringIn::Resident(scope.bytes(id, path)?);
        }
        Ok(())
    }

    /// The bytes; `code` at `path` for text that is not base64, and for a buffer that is
    /// not `dtype` of one dimension at its `dtype` or `shape`.
    pub fn bytes(&self, dtype: Dtype, code: ErrorCode, path: &str) -> Result<Bytes, Problem> {
        match self {
            ByteStringIn::Base64(text) => B64
                .decode(text)
                .map(Bytes::from)
                .map_err(|_| Problem::at(code, path, "not standard base64")),
            ByteStringIn::Buffer(b, bytes) => {
                one_dimension_of(b, dtype, code, path)?;
                Ok(bytes.clone())
            }
            ByteStringIn::Resident(bytes) => Ok(bytes.clone()),
            ByteStringIn::Array(_) => Err(Problem::at(
                ErrorCode::InvalidRequest,
                format!("{path}/array"),
                "this operand does not take a resident array",
            )),
        }
    }
}

/// A buffer that must hold `dtype` in one dimension: else `code` at its `dtype` or
/// `shape`.
pub fn one_dimension_of(
    b: &crate::wire::BufferRef,
    dtype: Dtype,
    code: ErrorCode,
    path: &str,
) -> Result<(), Problem> {
    if b.dtype != dtype {
        return Err(Problem::at(
            code,
            format!("{path}/dtype"),
            format!("must be {}, not {}", dtype.name(), b.dtype.name()),
        ));
    }
    if b.shape.len() != 1 {
        return Err(Problem::at(
            code,
            format!("{path}/shape"),
            format!("must have one dimension, not {}", b.shape.len()),
        ));
    }
    Ok(())
}

/// Schema of an HE byte string operand: standard base64 text (in the bulk form a `u8`
/// buffer), or a resident array of kind bytes.
pub struct ByteStringDoc;

impl utoipa::PartialSchema for ByteStringDoc {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Ref, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some("Standard base64 with padding")),
            )
            .item(Ref::from_schema_name("ArrayRefDoc"))
            .into()
    }
}

super::array_operands::names_array_ref!(ByteStringDoc);

/// A byte string answered: base64 text in JSON, a buffer of `dtype` (whole elements of
/// it) in a bulk answer.
pub struct ByteStringOut {
    pub dtype: Dtype,
    pub bytes: Bytes,
}

impl Serialize for ByteStringOut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if super::bulk::answering() {
            let shape = vec![self.bytes.len() as u64 / self.dtype.width()];
            return super::bulk::push_answer_buffer(self.dtype, shape, self.bytes.clone())
                .serialize(s);
        }
        s.serialize_str(&B64.encode(&self.bytes))
    }
}
