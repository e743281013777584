//! An uploaded IQ recording (`POST /rf/features`' `iq`): base64 text in JSON, or in the
//! bulk form (docs/WIRE.md) a `cf32` buffer of one dimension, read where it lies.

use super::super::problem::{ErrorCode, Problem};
use crate::wire::{BufferRef, Dtype};
use base64::Engine;
use bytes::Bytes;
use rustfft::num_complex::Complex32;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The recording as sent: text to decode, or a buffer's bytes.
pub enum IqIn {
    Base64(String),
    Buffer(BufferRef, Bytes),
}

impl<'de> Deserialize<'de> for IqIn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IqVisitor)
    }
}

struct IqVisitor;

impl<'de> Visitor<'de> for IqVisitor {
    type Value = IqIn;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("base64 text of little-endian f32 I/Q pairs, or a cf32 buffer descriptor")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IqIn, E> {
        Ok(IqIn::Base64(v.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<IqIn, E> {
        Ok(IqIn::Base64(v))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<IqIn, A::Error> {
        let (b, bytes) = super::super::bulk::descriptor_in(map)?;
        Ok(IqIn::Buffer(b, bytes))
    }
}

impl IqIn {
    /// Complex samples, about: what the size limit is checked against before decoding.
    pub fn approx_samples(&self) -> usize {
        match self {
            IqIn::Base64(text) => text.len() / 4 * 3 / 8,
            IqIn::Buffer(_, bytes) => bytes.len() / 8,
        }
    }

    /// The samples, every value finite; problems name `/iq` (and the descriptor's member).
    pub fn decode(self) -> Result<Vec<Complex32>, Problem> {
        match self {
            IqIn::Base64(text) => {
                let bytes = B64.decode(text).map_err(|e| {
                    Problem::at(
                        ErrorCode::InvalidTensor,
                        "/iq",
                        format!("invalid base64: {e}"),
                    )
                })?;
                from_le_pairs(&bytes)
            }
            IqIn::Buffer(b, bytes) => {
                if b.dtype != Dtype::Cf32 {
                    return Err(Problem::at(
                        ErrorCode::InvalidTensor,
                        "/iq/dtype",
                        format!(
                            "a recording is cf32 (I/Q pairs of f32), not {}",
                            b.dtype.name()
                        ),
                    ));
                }
                if b.shape.len() != 1 {
                    return Err(Problem::at(
                        ErrorCode::InvalidTensor,
                        "/iq/shape",
                        format!("a recording has one dimension, not {}", b.shape.len()),
                    ));
                }
                from_le_pairs(&bytes)
            }
        }
    }
}

/// Interleaved little-endian f32 I/Q; every value finite.
fn from_le_pairs(bytes: &[u8]) -> Result<Vec<Complex32>, Problem> {
    if bytes.len() % 8 != 0 {
        return Err(Problem::at(
            ErrorCode::InvalidTensor,
            "/iq",
            format!(
                "{} bytes is not a whole number of 8-byte I/Q pairs (two little-endian f32)",
                bytes.len()
            ),
        ));
    }
    let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let iq: Vec<Complex32> = bytes
        .chunks_exact(8)
        .map(|c| Complex32::new(f(&c[..4]), f(&c[4..])))
        .collect();
    if let Some(i) = iq
        .iter()
        .position(|v| !v.re.is_finite() || !v.im.is_finite())
    {
        return Err(Problem::at(
            ErrorCode::InvalidTensor,
            "/iq",
            format!("sample {i} is not finite"),
        ));
    }
    Ok(iq)
}
