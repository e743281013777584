//! Values read in place from a bulk body's buffer.
//!
//! A bulk buffer already holds little-endian values at a 64-byte boundary of the body, so
//! on a little-endian host an f32 buffer *is* a `[f32]`: decoding it into a fresh `Vec`
//! would copy the whole buffer into pages the kernel must first zero, and hold the body
//! and its copy at once (for a 1 GiB DP batch, about 0.7 s and a second gigabyte,
//! docs/PERFORMANCE.md). An [`Array`] lends the body's bytes to the job instead and copies
//! only when it must: a big-endian host, a buffer that does not lie aligned for `T` (the
//! body's allocation is, in practice, but nothing promises it), or a job that writes to
//! its operand (`make_mut`).

use bytes::Bytes;
use std::marker::PhantomData;

/// A value that an [`Array`] can lend from little-endian bytes.
pub trait LeScalar: bytemuck::Pod + Send {
    /// The value whose little-endian bytes `self`'s native bytes are.
    fn decode_le(self) -> Self;
    /// Not an infinity or a NaN (integers always are finite).
    fn finite(self) -> bool;
}

macro_rules! le_scalar {
    ($($t:ty => $bits:ty, $finite:expr);*) => {$(
        impl LeScalar for $t {
            fn decode_le(self) -> Self {
                bytemuck::cast(<$bits>::from_le(bytemuck::cast(self)))
            }
            fn finite(self) -> bool {
                $finite(self)
            }
        }
    )*};
}
le_scalar!(
    f32 => u32, f32::is_finite;
    f64 => u64, f64::is_finite;
    u32 => u32, |_| true;
    u64 => u64, |_| true
);

/// The index of the first value that is not finite. A block at a time without an early
/// exit inside it, so the check vectorizes: a gigabyte of gradients is read at memory
/// speed rather than a compare and branch per value.
pub fn first_non_finite<T: LeScalar>(values: &[T]) -> Option<usize> {
    const BLOCK: usize = 4096;
    let block = values
        .chunks(BLOCK)
        .position(|c| !c.iter().fold(true, |ok, &x| ok & x.finite()))?;
    let start = block * BLOCK;
    values[start..]
        .iter()
        .position(|&x| !x.finite())
        .map(|i| start + i)
}

/// A slice of `T`: owned, or lent from a buffer of a request's body (no copy).
pub struct Array<T: LeScalar> {
    held: Held<T>,
}

enum Held<T> {
    Owned(Vec<T>),
    /// Bytes whose length is a multiple of `T`'s and whose start is aligned for `T`,
    /// on a little-endian host.
    Lent(Bytes, PhantomData<T>),
}

/// `bytes` in memory of their own: kept as they are when nothing else holds their
/// memory (a vector's), copied out when they are a slice of something larger that others
/// share (a request body's), so keeping them keeps nothing more (`Array::detached`).
pub fn owned_bytes(bytes: Bytes) -> Bytes {
    match bytes.try_into_mut() {
        Ok(unique) => unique.freeze(),
        Err(shared) => Bytes::copy_from_slice(&shared),
    }
}

impl<T: LeScalar> Array<T> {
    /// `bytes` as little-endian values of `T`, lent when they can be read in place,
    /// else copied; `None` when their length is not a whole number of values.
    pub fn from_le_bytes(bytes: Bytes) -> Option<Self> {
        let width = std::mem::size_of::<T>();
        if bytes.len() % width != 0 {
            return None;
        }
        let in_place =
            cfg!(target_endian = "little") && bytemuck::try_cast_slice::<u8, T>(&bytes).is_ok();
        if in_place {
            return Some(Array {
                held: Held::Lent(bytes, PhantomData),
            });
        }
        let values: Vec<T> = bytes
            .chunks_exact(width)
            .map(|c| bytemuck::pod_read_unaligned::<T>(c).decode_le())
            .collect();
        Some(Array::from(values))
    }

    /// The same values, held so that clones share them rather than copy them (an
    /// owned vector becomes bytes lent to every clone): how a resident tensor is kept,
    /// so each op that names it reads it in place. A big-endian host keeps it owned.
    pub fn shared(self) -> Self {
        match self.held {
            Held::Owned(v) if cfg!(target_endian = "little") => Array {
                held: Held::Lent(Bytes::from_owner(LeBytes(v)), PhantomData),
            },
            held => Array { held },
        }
    }

    /// The values in memory of their own: a lent array, read in place from a request
    /// body, is copied out once, so keeping it keeps neither the rest of the body nor
    /// its buffer (a pooled one, or a page-locked one counted against
    /// `--gpu-pinned-body-mib`).
    pub fn detached(self) -> Self {
        match self.held {
            Held::Lent(..) => Array::from(self.to_vec()),
            held => Array { held },
        }
    }

    /// Whether the values are read in place from the bytes they arrived in.
    pub fn is_lent(&self) -> bool {
        matches!(self.held, Held::Lent(..))
    }

    /// The values to write to: a lent array is copied first (once).
    pub fn make_mut(&mut self) -> &mut Vec<T> {
        if let Held::Lent(..) = self.held {
            self.held = Held::Owned(self.to_vec());
        }
        match &mut self.held {
            Held::Owned(v) => v,
            Held::Lent(..) => unreachable!("copied above"),
        }
    }

    pub fn into_vec(self) -> Vec<T> {
        match self.held {
            Held::Owned(v) => v,
            Held::Lent(..) => self.to_vec(),
        }
    }
}

/// A vector seen as its native bytes (little-endian where `shared` makes one).
struct LeBytes<T>(Vec<T>);

impl<T: LeScalar> AsRef<[u8]> for LeBytes<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

impl<T: LeScalar> std::ops::Deref for Array<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.held {
            Held::Owned(v) => v,
            // Checked in `from_le_bytes`: whole values, aligned, little-endian host.
            Held::Lent(bytes, _) => bytemuck::cast_slice(bytes),
        }
    }
}

impl<T: LeScalar> From<Vec<T>> for Array<T> {
    fn from(values: Vec<T>) -> Self {
        Array {
            held: Held::Owned(values),
        }
    }
}

impl<T: LeScalar> Clone for Array<T> {
    /// A lent array's clone shares the body's bytes.
    fn clone(&self) -> Self {
        let held = match &self.held {
            Held::Owned(v) => Held::Owned(v.clone()),
            Held::Lent(bytes, _) => Held::Lent(bytes.clone(), PhantomData),
        };
        Array { held }
    }
}

impl<T: LeScalar + std::fmt::Debug> std::fmt::Debug for Array<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: LeScalar + PartialEq> PartialEq for Array<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `values`' little-endian bytes at `offset` of a buffer (so misaligned for a
    /// non-multiple of the width), as a `Bytes` slice.
    fn le_bytes_at<T: LeScalar>(
        values: &[T],
        offset: usize,
        to_le: impl Fn(T) -> Vec<u8>,
    ) -> Bytes {
        let mut body = vec![0u8; offset];
        for &v in values {
            body.extend(to_le(v));
        }
        Bytes::from(body).slice(offset..)
    }

    #[test]
    fn aligned_buffers_are_read_in_place_and_misaligned_ones_copied() {
        let values = [1.5f32, -0.0, f32::MAX, 3.25e-30];
        for offset in 0..8 {
            let bytes = le_bytes_at(&values, offset, |v| v.to_le_bytes().to_vec());
            let aligned = bytes.as_ptr() as usize % 4 == 0;
            let a = Array::<f32>::from_le_bytes(bytes.clone()).unwrap();
            assert_eq!(&*a, &values, "offset {offset}");
            assert_eq!(a.is_lent(), aligned && cfg!(target_endian = "little"));
            if a.is_lent() {
                assert_eq!(a.as_ptr() as usize, bytes.as_ptr() as usize, "not a copy");
            }
        }
        let wide = [u64::MAX, 1 << 63, 7];
        for offset in [0, 3, 8] {
            let bytes = le_bytes_at(&wide, offset, |v| v.to_le_bytes().to_vec());
            assert_eq!(&*Array::<u64>::from_le_bytes(bytes).unwrap(), &wide);
        }
    }

    #[test]
    fn a_length_that_is_not_whole_values_is_refused() {
        assert!(Array::<f64>::from_le_bytes(Bytes::from(vec![0u8; 12])).is_none());
        assert!(Array::<f64>::from_le_bytes(Bytes::new())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn writing_copies_a_lent_array_once_and_leaves_the_body_alone() {
        let values = [1.0f64, 2.0, 3.0];
        let bytes = le_bytes_at(&values, 0, |v| v.to_le_bytes().to_vec());
        let mut a = Array::<f64>::from_le_bytes(bytes.clone()).unwrap();
        let shared = a.clone();
        a.make_mut()[1] = 20.0;
        assert!(!a.is_lent());
        assert_eq!(&*a, &[1.0, 20.0, 3.0]);
        assert_eq!(&*shared, &values, "a clone still reads the body");
        assert_eq!(&bytes[8..16], &2.0f64.to_le_bytes());
        assert_eq!(a.into_vec(), vec![1.0, 20.0, 3.0]);
        assert_eq!(shared.into_vec(), values.to_vec());
    }

    #[test]
    fn a_shared_array_s_clones_read_one_copy() {
        let a = Array::from(vec![1.0f32, 2.5, -3.0]).shared();
        let b = a.clone();
        assert_eq!(&*b, &[1.0, 2.5, -3.0]);
        if cfg!(target_endian = "little") {
            assert!(a.is_lent());
            assert_eq!(a.as_ptr(), b.as_ptr(), "a clone is not a copy");
        }
        let mut c = b.clone();
        c.make_mut()[0] = 9.0;
        assert_eq!(&*a, &[1.0, 2.5, -3.0], "writing to a clone copies it first");
    }

    #[test]
    fn the_first_non_finite_value_is_found_in_any_block() {
        let mut v = vec![1.0f32; 10_000];
        assert_eq!(first_non_finite(&v), None);
        for (at, bad) in [
            (9_999, f32::NAN),
            (4_096, f32::INFINITY),
            (5, f32::NEG_INFINITY),
        ] {
            v[at] = bad;
            assert_eq!(first_non_finite(&v), Some(at));
        }
        assert_eq!(first_non_finite::<f64>(&[]), None);
        assert_eq!(first_non_finite(&[0.0, f64::NAN]), Some(1));
        assert_eq!(first_non_finite(&[u64::MAX]), None);
    }

    #[test]
    fn decode_le_reads_little_endian_bits_on_any_host() {
        let x = f64::from_ne_bytes(1.25f64.to_le_bytes());
        assert_eq!(x.decode_le(), 1.25);
        let n = u32::from_ne_bytes(0xdead_beefu32.to_le_bytes());
        assert_eq!(n.decode_le(), 0xdead_beef);
    }
}
