//! Masks on the ring Z/2^32: word i of a mask is word i of the ChaCha20 key stream
//! (RFC 8439: 32-bit block counter from 0, zero nonce) under the mask's key, read little
//! endian. A client adds its self-mask and its pair masks to its quantised vector; the
//! server subtracts the self-masks of survivors and the dropouts' pair masks from the
//! sum of the uploads (`UnmaskJob`, with its kernel `secagg_unmask` in `kernels/mpc.cu`).

use crate::backend::{DeviceError, DeviceLease, Job};
use chacha20::cipher::{KeyIvInit, StreamCipher, StreamCipherSeek};
use chacha20::ChaCha20;
use rayon::prelude::*;
use std::sync::Arc;

/// One mask to add to, or subtract from, a vector.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MaskTerm {
    pub key: [u8; 32],
    pub subtract: bool,
}

impl std::fmt::Debug for MaskTerm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MaskTerm(.., subtract: {})", self.subtract)
    }
}

impl MaskTerm {
    /// The key as the kernel takes it: eight little-endian words.
    pub fn key_words(&self) -> [u32; 8] {
        std::array::from_fn(|i| u32::from_le_bytes(self.key[4 * i..4 * i + 4].try_into().unwrap()))
    }
}

/// Words per parallel piece: 64 KiB of key stream per mask, a multiple of the block.
const CHUNK_WORDS: usize = 16 * 1024;

/// Adds or subtracts words `start..start + acc.len()` of each mask to `acc`; `start` is
/// a multiple of 16 (a ChaCha20 block).
fn apply_range(acc: &mut [u32], start: usize, terms: &[MaskTerm], stream: &mut Vec<u8>) {
    debug_assert_eq!(start % 16, 0);
    stream.resize(acc.len() * 4, 0);
    for term in terms {
        stream.fill(0);
        let mut cipher = ChaCha20::new(&term.key.into(), &[0u8; 12].into());
        cipher.seek(start as u64 * 4);
        cipher.apply_keystream(stream);
        let words = stream
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()));
        if term.subtract {
            acc.iter_mut()
                .zip(words)
                .for_each(|(a, w)| *a = a.wrapping_sub(w));
        } else {
            acc.iter_mut()
                .zip(words)
                .for_each(|(a, w)| *a = a.wrapping_add(w));
        }
    }
}

/// `acc ± Σ masks`, in parallel over pieces of the vector: the CPU twin of
/// `secagg_unmask`, and how a client masks its upload.
pub fn apply_masks(acc: &mut [u32], terms: &[MaskTerm]) {
    acc.par_chunks_mut(CHUNK_WORDS)
        .enumerate()
        .for_each_init(Vec::new, |stream, (i, piece)| {
            apply_range(piece, i * CHUNK_WORDS, terms, stream)
        });
}

/// Element-wise sum on the ring: how the server folds each upload into the round's sum.
pub fn add_into(acc: &mut [u32], v: &[u32]) {
    acc.par_iter_mut()
        .zip(v.par_iter())
        .for_each(|(a, b)| *a = a.wrapping_add(*b));
}

/// The server's unmasking: the sum of the uploads minus the masks that do not cancel.
pub struct UnmaskJob {
    sum: Arc<Vec<u32>>,
    terms: Arc<Vec<MaskTerm>>,
}

impl UnmaskJob {
    pub fn new(sum: Arc<Vec<u32>>, terms: Vec<MaskTerm>) -> Self {
        Self {
            sum,
            terms: Arc::new(terms),
        }
    }

    pub fn sum(&self) -> &[u32] {
        &self.sum
    }

    pub fn terms(&self) -> &[MaskTerm] {
        &self.terms
    }
}

impl Job for UnmaskJob {
    type Output = Vec<u32>;

    fn name(&self) -> &'static str {
        "secagg_unmask"
    }

    /// Key-stream words to expand.
    fn size(&self) -> usize {
        self.sum.len() * self.terms.len().max(1)
    }

    fn input_bytes(&self) -> usize {
        self.sum.len() * 4 + self.terms.len() * 33
    }

    /// About 4 Mi words of key stream: below that the copies cost more than the CPU's
    /// ChaCha20.
    fn gpu_threshold(&self) -> usize {
        1 << 22
    }

    fn run_cpu(&self) -> Vec<u32> {
        let mut out = self.sum.to_vec();
        apply_masks(&mut out, &self.terms);
        out
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Vec<u32>, DeviceError> {
        super::super::gpu::launch_unmask(self, dev)
    }

    fn agrees(&self, device: &Vec<u32>, cpu: &Vec<u32>) -> Result<(), String> {
        if device.len() != cpu.len() {
            return Err(format!("{} words, expected {}", device.len(), cpu.len()));
        }
        match device.iter().zip(cpu).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(i) => Err(format!(
                "word {i}: device {:#010x}, CPU {:#010x}",
                device[i], cpu[i]
            )),
        }
    }
}
