//! The binary form of bulk requests and answers, `application/vnd.gpu-ops.bulk`
//! (docs/WIRE.md is the contract; this module is its only reader and writer).
//!
//! A body is an 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the
//! data section. The header is the operation's JSON request (or answer) with each bulk
//! field replaced by a [`BufferRef`]: `{"dtype", "shape", "byte_offset", "byte_length"}`,
//! the offset counted from the start of the data section. Buffers start on 64-byte
//! boundaries and tile the data section exactly: each at the first boundary at or after
//! the previous one's end, nothing before the first, after the last or between them but
//! that padding. So a body has one layout, its size is its buffers' sizes plus at most
//! 63 bytes each, and a limit charged by decoded size can be checked from the header
//! before any buffer is read.
//!
//! The framing is safetensors' (a length-prefixed JSON header, offsets into one byte
//! buffer, no holes); keeping the request's own JSON around the buffers is Triton's
//! binary tensor extension's idea; the 64-byte alignment is Arrow's. Numbers are
//! little-endian, arrays row-major (C order), as NumPy and PyTorch hold them.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

mod array;
#[cfg(test)]
mod tests;

pub use array::{first_non_finite, owned_bytes, Array, LeScalar};

/// The media type of a bulk body, in `Content-Type` and `Accept`.
pub const MEDIA_TYPE: &str = "application/vnd.gpu-ops.bulk";
/// Every buffer starts at a multiple of this many bytes from the data section's start.
pub const ALIGN: u64 = 64;
/// The longest header accepted: a request's JSON without its bulk fields is small, and
/// the header is parsed before anything is charged for its buffers.
pub const MAX_HEADER_BYTES: u64 = 1 << 20;
/// The header length's own bytes.
const PREFIX: usize = 8;

/// The element type of a buffer. Field elements are unsigned integers of the field's
/// width (BabyBear `u32`, Goldilocks `u64`, BN254 and BLS12-381 scalars `u256`: 32 bytes,
/// least significant first); complex samples are `cf32`, real then imaginary (SigMF's
/// `cf32_le`); opaque byte strings (HE ciphertexts) are `u8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = BulkDtype))]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F16,
    Bf16,
    F32,
    F64,
    U32,
    U64,
    U256,
    Cf32,
    U8,
}

impl Dtype {
    /// Its name on the wire (`f32`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::U32 => "u32",
            Dtype::U64 => "u64",
            Dtype::U256 => "u256",
            Dtype::Cf32 => "cf32",
            Dtype::U8 => "u8",
        }
    }

    /// Bytes per element.
    pub fn width(self) -> u64 {
        match self {
            Dtype::U8 => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 | Dtype::U32 => 4,
            Dtype::F64 | Dtype::U64 | Dtype::Cf32 => 8,
            Dtype::U256 => 32,
        }
    }
}

/// Where one bulk field's values lie in the data section.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BufferRef {
    pub dtype: Dtype,
    /// Row-major; `[]` is one element.
    pub shape: Vec<u64>,
    /// From the start of the data section; a multiple of 64.
    pub byte_offset: u64,
    /// The element count times the dtype's width.
    pub byte_length: u64,
}

impl BufferRef {
    /// The element count, or `None` when it does not fit a `u64`.
    pub fn elements(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }

    /// The byte length that `dtype` and `shape` call for, or `None` past `u64`.
    pub fn expected_length(&self) -> Option<u64> {
        self.elements()?.checked_mul(self.dtype.width())
    }
}

/// What is wrong with a body's framing, before its header is read as JSON.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error(
        "a bulk body starts with an 8-byte little-endian header length; this one has {0} bytes"
    )]
    TooShort(usize),
    #[error("the header length is {0} bytes, over the limit of {MAX_HEADER_BYTES}")]
    HeaderTooLong(u64),
    #[error("the header length is {header} bytes, past the end of the {body}-byte body")]
    HeaderPastEnd { header: u64, body: usize },
    #[error("the header is not UTF-8 (byte {0} of the header)")]
    NotUtf8(usize),
}

/// A buffer whose descriptor disagrees with itself or with the data section: `path` is
/// the JSON pointer of the descriptor's member at fault (`/a/byte_offset`).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct BufferError {
    pub path: String,
    pub message: String,
}

/// A bulk body split into its JSON header and its data section.
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    pub header: &'a str,
    pub data: &'a [u8],
}

/// Splits `body` at its header length; the header's JSON is the caller's to parse.
pub fn split(body: &[u8]) -> Result<Envelope<'_>, FramingError> {
    let Some((prefix, rest)) = body.split_first_chunk::<PREFIX>() else {
        return Err(FramingError::TooShort(body.len()));
    };
    let n = u64::from_le_bytes(*prefix);
    if n > MAX_HEADER_BYTES {
        return Err(FramingError::HeaderTooLong(n));
    }
    // n ≤ 1 MiB, so it fits a usize.
    if n as usize > rest.len() {
        return Err(FramingError::HeaderPastEnd {
            header: n,
            body: body.len(),
        });
    }
    let (header, data) = rest.split_at(n as usize);
    let header = std::str::from_utf8(header).map_err(|e| FramingError::NotUtf8(e.valid_up_to()))?;
    Ok(Envelope { header, data })
}

/// Checks a header's buffers against a data section of `data_len` bytes. `buffers` are
/// the descriptors found in the header with the JSON pointer of each (`/a`). Each length
/// must be its dtype times its shape, each offset a multiple of 64, and together they
/// must tile the data section (module docs). The first defect is returned, named by the
/// descriptor member at fault.
pub fn check_layout(buffers: &[(&str, &BufferRef)], data_len: usize) -> Result<(), BufferError> {
    let fault = |path: &str, member: &str, message: String| BufferError {
        path: format!("{path}/{member}"),
        message,
    };
    for (path, b) in buffers {
        let Some(want) = b.expected_length() else {
            return Err(fault(
                path,
                "shape",
                format!("{:?} has more elements than fit 64 bits", b.shape),
            ));
        };
        if b.byte_length != want {
            return Err(fault(
                path,
                "byte_length",
                format!(
                    "{} bytes, but {:?} elements of {:?} are {want}",
                    b.byte_length, b.shape, b.dtype
                ),
            ));
        }
        if b.byte_offset % ALIGN != 0 {
            return Err(fault(
                path,
                "byte_offset",
                format!("{} is not a multiple of {ALIGN}", b.byte_offset),
            ));
        }
    }
    let mut by_offset: Vec<&(&str, &BufferRef)> = buffers.iter().collect();
    by_offset.sort_by_key(|(_, b)| b.byte_offset);
    // Where the next buffer must start: the first boundary after the previous one's end.
    let mut next = 0u64;
    for (path, b) in by_offset {
        if b.byte_offset != next {
            let message = if b.byte_offset < next {
                format!(
                    "{} overlaps the buffer before it, which ends at {next}",
                    b.byte_offset
                )
            } else {
                format!(
                    "{} leaves a gap: buffers tile the data section, so this one starts at {next}",
                    b.byte_offset
                )
            };
            return Err(fault(path, "byte_offset", message));
        }
        let end = b
            .byte_offset
            .checked_add(b.byte_length)
            .filter(|&e| e <= data_len as u64);
        let Some(end) = end else {
            return Err(fault(
                path,
                "byte_length",
                format!(
                    "{} bytes from {} run past the {data_len}-byte data section",
                    b.byte_length, b.byte_offset
                ),
            ));
        };
        next = end.next_multiple_of(ALIGN);
    }
    // The last buffer's padding may be left off; nothing may follow it.
    if data_len as u64 > next {
        return Err(BufferError {
            path: String::new(),
            message: format!(
                "the data section has {data_len} bytes, but its buffers and their padding end at {next}"
            ),
        });
    }
    Ok(())
}

/// The bytes of `b` in `data`; `check_layout` first.
pub fn bytes_of<'a>(data: &'a [u8], b: &BufferRef) -> &'a [u8] {
    &data[b.byte_offset as usize..(b.byte_offset + b.byte_length) as usize]
}

/// Writes a bulk body from buffers that stay where they are: the body is a list of
/// chunks (the prefix and header, then each buffer and its padding), sent in turn.
#[derive(Default)]
pub struct EnvelopeWriter {
    chunks: Vec<Bytes>,
    len: u64,
}

/// Zeros for padding, shared by every body.
static PADDING: [u8; ALIGN as usize] = [0; ALIGN as usize];

impl EnvelopeWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a buffer of `dtype` and `shape` holding `bytes` (little-endian, row-major) and
    /// returns its descriptor for the header.
    ///
    /// Panics when `bytes` is not `dtype` × `shape` long: the server's own answers, so a
    /// mismatch is a bug.
    pub fn push(&mut self, dtype: Dtype, shape: Vec<u64>, bytes: Bytes) -> BufferRef {
        let r = BufferRef {
            dtype,
            shape,
            byte_offset: self.len,
            byte_length: bytes.len() as u64,
        };
        assert_eq!(r.expected_length(), Some(r.byte_length), "{r:?}");
        self.len += r.byte_length;
        self.chunks.push(bytes);
        let pad = self.len.next_multiple_of(ALIGN) - self.len;
        if pad > 0 {
            self.chunks
                .push(Bytes::from_static(&PADDING[..pad as usize]));
            self.len += pad;
        }
        r
    }

    /// The body's chunks: the prefix and `header` (padded with spaces so the data section
    /// starts on a 64-byte boundary of the body), then the buffers.
    pub fn finish<H: Serialize>(self, header: &H) -> serde_json::Result<Vec<Bytes>> {
        Ok(self.finish_json(serde_json::to_vec(header)?))
    }

    /// As `finish`, with the header already serialized (its buffers pushed meanwhile).
    pub fn finish_json(self, header: Vec<u8>) -> Vec<Bytes> {
        let mut head = Vec::with_capacity((PREFIX + header.len()).next_multiple_of(ALIGN as usize));
        head.extend_from_slice(&[0; PREFIX]);
        head.extend_from_slice(&header);
        let padded = head.len().next_multiple_of(ALIGN as usize);
        head.resize(padded, b' ');
        let n = (head.len() - PREFIX) as u64;
        head[..PREFIX].copy_from_slice(&n.to_le_bytes());
        let mut chunks = Vec::with_capacity(self.chunks.len() + 1);
        chunks.push(Bytes::from(head));
        chunks.extend(self.chunks);
        chunks
    }

    /// The whole body in one vector (clients, tests and small answers).
    pub fn finish_to_vec<H: Serialize>(self, header: &H) -> serde_json::Result<Vec<u8>> {
        Ok(self.finish(header)?.concat())
    }
}
