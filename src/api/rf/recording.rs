//! An IQ recording operand (`POST /rf/features`' `iq`, `POST /arrays`' `iq`): base64 text
//! in JSON, in the bulk form (docs/WIRE.md) a `cf32` buffer of one dimension, or a
//! resident recording's id (`{"array": "arr_…"}`), used without another check.

use super::super::array_operands::{object_operand, ArrayScope, ObjectOperand};
use super::super::byte_strings::ByteStringIn;
use super::super::problem::{ErrorCode, Problem};
use crate::arrays::Recording;
use crate::wire::Dtype;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::sync::Arc;

/// A recording as sent.
pub enum RecordingIn {
    /// Base64 text or a bulk buffer, to decode and check.
    Sent(ByteStringIn),
    /// A resident array's id, until `resolve`.
    Array(String),
    /// A resident recording, checked when it was made.
    Resident(Arc<Recording>),
}

impl<'de> Deserialize<'de> for RecordingIn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RecordingVisitor)
    }
}

struct RecordingVisitor;

impl<'de> Visitor<'de> for RecordingVisitor {
    type Value = RecordingIn;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("standard base64 text, a buffer descriptor, or {\"array\": id}")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RecordingIn, E> {
        Ok(RecordingIn::Sent(ByteStringIn::Base64(v.to_owned())))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<RecordingIn, E> {
        Ok(RecordingIn::Sent(ByteStringIn::Base64(v)))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RecordingIn, A::Error> {
        Ok(match object_operand(map)? {
            ObjectOperand::Buffer(b, bytes) => RecordingIn::Sent(ByteStringIn::Buffer(b, bytes)),
            ObjectOperand::Array(id) => RecordingIn::Array(id),
        })
    }
}

impl RecordingIn {
    /// A named recording replaced by the tenant's resident one (422 unknown_array or
    /// array_mismatch at `path/array`).
    pub fn resolve(&mut self, scope: &ArrayScope, path: &str) -> Result<(), Problem> {
        if let RecordingIn::Array(id) = self {
            *self = RecordingIn::Resident(scope.recording(id, path)?);
        }
        Ok(())
    }

    /// Complex samples, about (exactly, for a resident one): what the size limit is
    /// checked against before decoding.
    pub fn approx_samples(&self) -> usize {
        match self {
            RecordingIn::Sent(iq) => iq.approx_bytes() / 8,
            RecordingIn::Array(_) => 0,
            RecordingIn::Resident(r) => r.len(),
        }
    }

    /// The recording, every value finite; problems name `path` (and the descriptor's
    /// member).
    pub fn decode(self, path: &str) -> Result<Arc<Recording>, Problem> {
        match self {
            RecordingIn::Sent(iq) => {
                let bytes = iq.bytes(Dtype::Cf32, ErrorCode::InvalidTensor, path)?;
                Recording::from_le_bytes(bytes)
                    .map(Arc::new)
                    .map_err(|e| Problem::at(ErrorCode::InvalidTensor, path, e.to_string()))
            }
            RecordingIn::Resident(r) => Ok(r),
            RecordingIn::Array(_) => unreachable!("resolve runs before decode"),
        }
    }
}

/// Base64 of whole `cf32_le` samples, at least `min_samples` of them, or a resident
/// recording's id.
fn recording_schema(min_samples: usize) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Ref, Type};
    // Base64 of a multiple of 8 bytes: groups of 32 characters (24 bytes), then what
    // 8 or 16 more bytes leave.
    let pattern = "^(?:[A-Za-z0-9+/]{32})*(?:[A-Za-z0-9+/]{10}[AEIMQUYcgkosw048]=|[A-Za-z0-9+/]{21}[AQgw]==)?$";
    let text = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some((8 * min_samples).div_ceil(3) * 4))
        .pattern(Some(pattern))
        .description(Some(
            "Interleaved little-endian f32 pairs I, Q (cf32_le, 8 bytes a sample), standard base64",
        ));
    OneOfBuilder::new()
        .item(text)
        .item(Ref::from_schema_name("ArrayRefDoc"))
        .into()
}

macro_rules! recording_doc {
    ($(#[$doc:meta])* $name:ident, $min:expr) => {
        $(#[$doc])*
        pub struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                recording_schema($min)
            }
        }

        crate::api::array_operands::names_array_ref!($name);
    };
}

recording_doc!(
    /// A recording to extract features from: base64 of at least 128 samples, or a
    /// resident recording's id.
    FeaturesRecordingDoc,
    crate::ops::rf::features::MIN_CHUNK_SAMPLES
);
recording_doc!(
    /// A recording to keep: base64 of at least one sample, or a resident recording's id
    /// (a copy of it).
    RecordingDoc,
    1
);
