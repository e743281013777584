//! Small kernels over f32 buffers already on a device (`kernels/linalg.cu`): a kept
//! result rounded to its dtype where it lies, a range copied between buffers, operands
//! packed into 16 bits for cuBLASLt (and back), a held field vector searched for zeros.

use crate::backend::device::DeviceBuffer;
use crate::backend::{DeviceError, DeviceLease, Element};
use crate::ops::linalg::Dtype;

/// A device buffer borrowed where it lies, or made for the caller (a packed, widened or
/// uploaded copy).
pub(crate) enum DeviceRef<'a, T: Element> {
    Borrowed(&'a DeviceBuffer<T>),
    Made(DeviceBuffer<T>),
}

impl<T: Element> std::ops::Deref for DeviceRef<'_, T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        match self {
            DeviceRef::Borrowed(b) => b,
            DeviceRef::Made(b) => b,
        }
    }
}

/// `v` packed into 16-bit f16 or bf16 storage on the device (`pack_half_f32`), rounded
/// to nearest, ties to even, bit for bit as the `half` crate packs on the host (NaN
/// aside: its payload is not kept).
pub(crate) fn pack_half(
    dev: &DeviceLease<'_>,
    v: &DeviceBuffer<f32>,
    dtype: Dtype,
) -> Result<DeviceBuffer<u16>, DeviceError> {
    convert_half(dev, v, dtype, "pack_half_f32")
}

/// `v` (16-bit f16 or bf16 values) widened to f32 on the device (`unpack_half_f32`), each
/// exactly the value it stands for.
pub(crate) fn unpack_half(
    dev: &DeviceLease<'_>,
    v: &DeviceBuffer<u16>,
    dtype: Dtype,
) -> Result<DeviceBuffer<f32>, DeviceError> {
    convert_half(dev, v, dtype, "unpack_half_f32")
}

/// `kernel` (`(in, n, dtype code, out)`, one value out for each in) over `v`.
fn convert_half<I: Element, O: Element>(
    dev: &DeviceLease<'_>,
    v: &DeviceBuffer<I>,
    dtype: Dtype,
    kernel: &str,
) -> Result<DeviceBuffer<O>, DeviceError> {
    let code = half_code(dtype)?;
    let len = v.len();
    let mut out = dev.alloc_zeros::<O>(len)?;
    if len == 0 {
        return Ok(out);
    }
    let n = len as u64;
    let mut l = dev.launch(kernel)?;
    l.arg(v).arg(&n).arg(&code).arg(&mut out);
    // SAFETY: the kernel reads v's n values and writes out's n.
    unsafe { l.launch(dev.launch_config(len)) }?;
    Ok(out)
}

/// `v` packed into 16 bits on the host, as `pack_half` packs on the device (the `half`
/// crate's rounding), for an upload of half the bytes.
pub(crate) fn pack_half_on_host(v: &[f32], dtype: Dtype) -> Vec<u16> {
    use rayon::prelude::*;
    let pack = |x: f32| match dtype {
        Dtype::F16 => half::f16::from_f32(x).to_bits(),
        _ => half::bf16::from_f32(x).to_bits(),
    };
    v.par_iter()
        .with_min_len(1 << 14)
        .map(|&x| pack(x))
        .collect()
}

/// The kernels' code for a 16-bit dtype.
fn half_code(dtype: Dtype) -> Result<u32, DeviceError> {
    match dtype {
        Dtype::F16 => Ok(1),
        Dtype::Bf16 => Ok(2),
        other => Err(DeviceError::unsupported(format!(
            "{} does not pack into 16 bits",
            other.name()
        ))),
    }
}

/// Rounds `d` to `dtype` on the device, as `Dtype::round_all` does on the host (f32:
/// unchanged); whether a value is not finite afterwards (one read of four bytes).
pub(crate) fn round_output(
    dev: &DeviceLease<'_>,
    d: &mut DeviceBuffer<f32>,
    dtype: Dtype,
) -> Result<bool, DeviceError> {
    let code: u32 = match dtype {
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
        Dtype::F32 | Dtype::F64 => 0,
    };
    let mut non_finite = dev.alloc_zeros::<u32>(1)?;
    let len = d.len();
    let n = len as u64;
    let mut l = dev.launch("round_output_f32")?;
    l.arg(d).arg(&n).arg(&code).arg(&mut non_finite);
    // SAFETY: the kernel reads and writes d's n values and sets the one flag.
    unsafe { l.launch(dev.launch_config(len)) }?;
    Ok(dev.download(&non_finite)?[0] != 0)
}

/// Copies `n` values of `src` from `src_at` on into `dst` from `dst_at` on, on the device
/// (the engines' own copies take whole buffers). A range past either end is refused here:
/// the kernel does not check.
pub(crate) fn copy_range(
    dev: &DeviceLease<'_>,
    (src, src_at): (&DeviceBuffer<f32>, usize),
    (dst, dst_at): (&mut DeviceBuffer<f32>, usize),
    n: usize,
) -> Result<(), DeviceError> {
    let fits = |at: usize, len: usize| at.checked_add(n).is_some_and(|end| end <= len);
    if !fits(src_at, src.len()) || !fits(dst_at, dst.len()) {
        return Err(DeviceError::fatal(format!(
            "a device copy of {n} values from {src_at} of {} into {dst_at} of {}",
            src.len(),
            dst.len()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let (from, to, count) = (src_at as u64, dst_at as u64, n as u64);
    let mut l = dev.launch("copy_range_f32")?;
    l.arg(src).arg(&from).arg(dst).arg(&to).arg(&count);
    // SAFETY: both ranges lie inside their buffers (checked above).
    unsafe { l.launch(dev.launch_config(n)) }
}

/// Whether `x` (`n` elements of `words` u32 words each: any field's buffer) has an
/// element whose words are all zero, found on the device (one read of four bytes).
/// `Unsupported` on an engine without the kernel (wgpu's).
pub(crate) fn any_zero_element<T: Element>(
    dev: &DeviceLease<'_>,
    x: &DeviceBuffer<T>,
    n: usize,
    words: u32,
) -> Result<bool, DeviceError> {
    let mut zeros = dev.alloc_zeros::<u32>(1)?;
    let n64 = n as u64;
    let mut l = dev.launch("any_zero_element")?;
    l.arg(x).arg(&n64).arg(&words).arg(&mut zeros);
    // SAFETY: x holds n·words u32 words (its elements' words, read as u32); one flag.
    unsafe { l.launch(dev.launch_config(n)) }?;
    Ok(dev.download(&zeros)?[0] != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values at every edge of f16 and bf16: zeros, subnormals and the smallest normals,
    /// halfway cases both ways, the largest finite values and just past them, infinities.
    fn edges() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1.0,
            -1.5,
            65504.0,
            65519.0,
            65520.0,
            -65536.0,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            1e-45,
            2f32.powi(-14),
            2f32.powi(-24),
            2f32.powi(-25),
            3.0 * 2f32.powi(-25),
            2f32.powi(-14) - 2f32.powi(-25),
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            f32::from_bits(0x7f7f_8000),
        ];
        // And a spread of ordinary values of every magnitude and sign.
        v.extend((0..4000u32).map(|i| {
            let bits = i.wrapping_mul(0x9E37_79B9) & 0xff7f_ffff;
            f32::from_bits(bits)
        }));
        v
    }

    #[test]
    fn operands_pack_into_16_bits_on_the_device_as_the_half_crate_packs_them() {
        let dev = crate::backend::GpuDevice::emulated(0, 1 << 26);
        let lease = dev.lease().unwrap();
        let v = edges();
        let dv = lease.upload(&v).unwrap();
        let f16s = lease.download(&pack_half(&lease, &dv, Dtype::F16).unwrap());
        let bf16s = lease.download(&pack_half(&lease, &dv, Dtype::Bf16).unwrap());
        let (f16s, bf16s) = (f16s.unwrap(), bf16s.unwrap());
        for (i, x) in v.iter().enumerate() {
            assert_eq!(
                f16s[i],
                half::f16::from_f32(*x).to_bits(),
                "f16 of {x:e} ({i})"
            );
            assert_eq!(
                bf16s[i],
                half::bf16::from_f32(*x).to_bits(),
                "bf16 of {x:e} ({i})"
            );
        }
        let nan = lease.upload(&[f32::NAN, -f32::NAN]).unwrap();
        for dtype in [Dtype::F16, Dtype::Bf16] {
            let packed = lease
                .download(&pack_half(&lease, &nan, dtype).unwrap())
                .unwrap();
            let back: Vec<f32> = packed
                .iter()
                .map(|&b| match dtype {
                    Dtype::F16 => half::f16::from_bits(b).to_f32(),
                    _ => half::bf16::from_bits(b).to_f32(),
                })
                .collect();
            assert!(back.iter().all(|x| x.is_nan()), "{dtype:?}: {packed:x?}");
        }
        assert!(pack_half(&lease, &dv, Dtype::F32).is_err());
        // The host's packing is the same.
        assert_eq!(pack_half_on_host(&v, Dtype::F16), f16s);
        assert_eq!(pack_half_on_host(&v, Dtype::Bf16), bf16s);
    }

    #[test]
    fn every_16_bit_value_unpacks_on_the_device_to_the_value_it_stands_for() {
        let dev = crate::backend::GpuDevice::emulated(0, 1 << 26);
        let lease = dev.lease().unwrap();
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let d = lease.upload(&all).unwrap();
        for dtype in [Dtype::F16, Dtype::Bf16] {
            let got = lease
                .download(&unpack_half(&lease, &d, dtype).unwrap())
                .unwrap();
            for (&h, x) in all.iter().zip(&got) {
                let want = match dtype {
                    Dtype::F16 => half::f16::from_bits(h).to_f32(),
                    _ => half::bf16::from_bits(h).to_f32(),
                };
                let same = x.to_bits() == want.to_bits() || (x.is_nan() && want.is_nan());
                assert!(same, "{dtype:?} {h:#06x}: {x:e}, not {want:e}");
            }
        }
        assert!(unpack_half(&lease, &d, Dtype::F64).is_err());
    }
}
