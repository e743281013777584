//! An uploaded IQ recording (`POST /rf/features`' `iq`): base64 text in JSON, or in the
//! bulk form (docs/WIRE.md) a `cf32` buffer of one dimension (`ByteStringIn`).

use super::super::byte_strings::ByteStringIn;
use super::super::problem::{ErrorCode, Problem};
use crate::wire::Dtype;
use rustfft::num_complex::Complex32;

/// Complex samples, about: what the size limit is checked against before decoding.
pub fn approx_samples(iq: &ByteStringIn) -> usize {
    iq.approx_bytes() / 8
}

/// The samples, every value finite; problems name `/iq` (and the descriptor's member).
pub fn decode(iq: &ByteStringIn) -> Result<Vec<Complex32>, Problem> {
    let bytes = iq.bytes(Dtype::Cf32, ErrorCode::InvalidTensor, "/iq")?;
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
