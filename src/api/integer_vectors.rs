//! Vectors of unsigned integers that are not field elements (HE slot values): a JSON
//! array of integers, or in the bulk form (docs/WIRE.md) a `u64` buffer of one dimension.

use super::byte_strings::one_dimension_of;
use super::problem::{ErrorCode, Problem};
use crate::wire::{BufferRef, Dtype};
use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// A u64 vector as sent.
pub enum U64sIn {
    List(Vec<u64>),
    Buffer(BufferRef, Bytes),
}

impl<'de> Deserialize<'de> for U64sIn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(U64sVisitor)
    }
}

struct U64sVisitor;

impl<'de> Visitor<'de> for U64sVisitor {
    type Value = U64sIn;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of unsigned integers, or a u64 buffer descriptor")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<U64sIn, A::Error> {
        Vec::<u64>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq)).map(U64sIn::List)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<U64sIn, A::Error> {
        let (b, bytes) = super::bulk::descriptor_in(map)?;
        Ok(U64sIn::Buffer(b, bytes))
    }
}

impl U64sIn {
    /// The values; a buffer that is not `u64` of one dimension is 422 `invalid_parameter`
    /// at its `dtype` or `shape`.
    pub fn into_values(self, path: &str) -> Result<Vec<u64>, Problem> {
        match self {
            U64sIn::List(values) => Ok(values),
            U64sIn::Buffer(b, bytes) => {
                one_dimension_of(&b, Dtype::U64, ErrorCode::InvalidParameter, path)?;
                Ok(bytes
                    .chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                    .collect())
            }
        }
    }
}

/// A u64 vector answered: JSON integers, or a `u64` buffer in a bulk answer.
pub struct U64sOut(pub Vec<u64>);

impl Serialize for U64sOut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if super::bulk::answering() {
            let bytes: Vec<u8> = self.0.iter().flat_map(|v| v.to_le_bytes()).collect();
            let shape = vec![self.0.len() as u64];
            return super::bulk::push_answer_buffer(Dtype::U64, shape, bytes.into()).serialize(s);
        }
        self.0.serialize(s)
    }
}
