//! A resident array's IQ recording: complex samples kept as their wire and disk form,
//! interleaved little-endian f32 I/Q (`cf32_le`, 8 bytes a sample), checked finite once.
//! Kept as bytes because every use but one reads them so: the data read-back, the file,
//! and a bulk answer share them; RF features decode them into samples per job.

use bytes::Bytes;
use rustfft::num_complex::Complex32;

#[derive(Debug)]
pub struct Recording {
    bytes: Bytes,
}

/// Why bytes are not a recording.
#[derive(Debug, PartialEq, Eq)]
pub enum RecordingDefect {
    /// Not a whole number of 8-byte I/Q pairs.
    Length(usize),
    /// Sample `0` has a component that is NaN or infinite.
    NotFinite(usize),
}

impl std::fmt::Display for RecordingDefect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordingDefect::Length(n) => write!(
                f,
                "{n} bytes is not a whole number of 8-byte I/Q pairs (two little-endian f32)"
            ),
            RecordingDefect::NotFinite(i) => write!(f, "sample {i} is not finite"),
        }
    }
}

impl Recording {
    /// `cf32_le` bytes, every component finite.
    pub fn from_le_bytes(bytes: Bytes) -> Result<Self, RecordingDefect> {
        if bytes.len() % 8 != 0 {
            return Err(RecordingDefect::Length(bytes.len()));
        }
        let finite = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite();
        if let Some(i) = bytes
            .chunks_exact(8)
            .position(|c| !finite(&c[..4]) || !finite(&c[4..]))
        {
            return Err(RecordingDefect::NotFinite(i));
        }
        Ok(Self { bytes })
    }

    /// The same samples in bytes of their own, not lent from a request body's
    /// (`wire::owned_bytes`).
    pub fn detached(self: std::sync::Arc<Self>) -> std::sync::Arc<Self> {
        let bytes = match std::sync::Arc::try_unwrap(self) {
            Ok(r) => crate::wire::owned_bytes(r.bytes),
            Err(shared) => Bytes::copy_from_slice(&shared.bytes),
        };
        std::sync::Arc::new(Self { bytes })
    }

    /// Samples already finite (a result this server produced).
    pub fn from_samples(samples: &[Complex32]) -> Self {
        let mut bytes = Vec::with_capacity(8 * samples.len());
        for c in samples {
            bytes.extend_from_slice(&c.re.to_le_bytes());
            bytes.extend_from_slice(&c.im.to_le_bytes());
        }
        Self {
            bytes: bytes.into(),
        }
    }

    /// Complex samples.
    pub fn len(&self) -> usize {
        self.bytes.len() / 8
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn as_le_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The `cf32_le` bytes, shared.
    pub fn le_bytes(&self) -> Bytes {
        self.bytes.clone()
    }

    /// The samples, decoded (one pass; they were checked when the recording was made).
    pub fn samples(&self) -> Vec<Complex32> {
        let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        self.bytes
            .chunks_exact(8)
            .map(|c| Complex32::new(f(&c[..4]), f(&c[4..])))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_round_trip_and_defects_are_named() {
        let samples = [Complex32::new(1.5, -2.0), Complex32::new(0.0, 3.25)];
        let r = Recording::from_samples(&samples);
        assert_eq!(r.len(), 2);
        assert_eq!(r.samples(), samples);
        let again = Recording::from_le_bytes(r.le_bytes()).unwrap();
        assert_eq!(again.samples(), samples);
        let mut bad = r.le_bytes().to_vec();
        bad[12..16].copy_from_slice(&f32::INFINITY.to_le_bytes());
        assert_eq!(
            Recording::from_le_bytes(bad.clone().into()).unwrap_err(),
            RecordingDefect::NotFinite(1)
        );
        bad.pop();
        assert_eq!(
            Recording::from_le_bytes(bad.into()).unwrap_err(),
            RecordingDefect::Length(15)
        );
    }
}
