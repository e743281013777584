//! Storage and compute precisions, and rounding to them (round to nearest, ties to even).

use half::{bf16, f16};

/// A tensor's element type on the wire (and in a resident tensor's metadata).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F16,
    Bf16,
    F32,
    F64,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 => 4,
            Dtype::F64 => 8,
        }
    }

    /// `x` rounded to this type and widened back to f32 (f32 and f64: unchanged).
    /// Inlined into the rounding loops, whichever codegen unit they land in: a call per
    /// value costs them a third of a 1024³ matmul's time (`cargo bench --bench linalg`).
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F16 => f16::from_f32(x).to_f32(),
            Dtype::Bf16 => bf16::from_f32(x).to_f32(),
            Dtype::F32 | Dtype::F64 => x,
        }
    }

    /// Every value rounded to this type in place (f32 and f64: unchanged), in parallel
    /// over large outputs.
    pub fn round_all(self, values: &mut [f32]) {
        use rayon::prelude::*;
        if matches!(self, Dtype::F32 | Dtype::F64) {
            return;
        }
        values
            .par_iter_mut()
            .with_min_len(1 << 14)
            .for_each(|x| *x = self.round(*x));
    }

    /// `x` rounded once, straight from f64, to this type (f32, f16, bf16: ties to even).
    pub fn round_f64(self, x: f64) -> f64 {
        match self {
            Dtype::F16 => half::f16::from_f64(x).to_f64(),
            Dtype::Bf16 => half::bf16::from_f64(x).to_f64(),
            Dtype::F32 => f64::from(x as f32),
            Dtype::F64 => x,
        }
    }

    /// The distance between neighbouring subnormals, and the largest finite value.
    pub fn subnormal_step_and_max(self) -> (f64, f64) {
        match self {
            Dtype::F16 => (2f64.powi(-24), 65504.0),
            Dtype::Bf16 => (2f64.powi(-133), f64::from(half::bf16::MAX.to_f32())),
            Dtype::F32 => (2f64.powi(-149), f64::from(f32::MAX)),
            Dtype::F64 => (0.0, f64::MAX),
        }
    }

    /// Unit roundoff u: a rounded value is x(1 + δ), |δ| ≤ u, in the normal range.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Dtype::F16 => 2f64.powi(-11),
            Dtype::Bf16 => 2f64.powi(-8),
            Dtype::F32 => 2f64.powi(-24),
            Dtype::F64 => 2f64.powi(-53),
        }
    }
}

/// The precision products are formed in; sums are always f32 (f64 for `F64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compute {
    F32,
    /// 10-bit mantissa, f32's range: what tensor cores take for f32 inputs.
    Tf32,
    F16,
    Bf16,
    F64,
}

impl Compute {
    pub fn name(self) -> &'static str {
        match self {
            Compute::F32 => "f32",
            Compute::Tf32 => "tf32",
            Compute::F16 => "f16",
            Compute::Bf16 => "bf16",
            Compute::F64 => "f64",
        }
    }

    /// An operand rounded to this precision. Products of two rounded operands are exact
    /// in f32 (at most 11 + 11 significant bits), so only the sums round after this.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Compute::F32 | Compute::F64 => x,
            Compute::Tf32 => round_tf32(x),
            Compute::F16 => Dtype::F16.round(x),
            Compute::Bf16 => Dtype::Bf16.round(x),
        }
    }

    /// Whether rounding values of `dtype` to this precision changes none of them: a
    /// tensor held on a device in `dtype` is then an operand as it is.
    pub fn keeps(self, dtype: Dtype) -> bool {
        self != Compute::F64 && dtype != Dtype::F64 && self.operand_roundoff(dtype) == 0.0
    }

    /// Unit roundoff of the operand rounding (0 when an input of `dtype` is exact here).
    pub fn operand_roundoff(self, dtype: Dtype) -> f64 {
        let u = match self {
            Compute::F32 | Compute::F64 => return 0.0,
            Compute::Tf32 => 2f64.powi(-11),
            Compute::F16 => 2f64.powi(-11),
            Compute::Bf16 => 2f64.powi(-8),
        };
        if dtype.unit_roundoff() >= u && !(self == Compute::F16 && dtype == Dtype::Bf16) {
            0.0
        } else {
            u
        }
    }
}

/// f32 to TF32 (10 explicit mantissa bits), ties to even, kept in an f32.
#[inline]
fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let bits = x.to_bits();
    let keep = 0xFFFF_E000u32;
    let half = 0x1000u32;
    let lsb = (bits >> 13) & 1;
    f32::from_bits(bits.wrapping_add(half - 1 + lsb) & keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_precision_keeps_a_dtype_exactly_when_rounding_changes_none_of_its_values() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for dtype in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
            // Values of `dtype`: random magnitudes over its range, its extremes.
            let (_, largest) = dtype.subnormal_step_and_max();
            let mut values: Vec<f32> = (0..4000)
                .map(|_| {
                    dtype.round(
                        rng.random_range(-1.0f32..1.0) * 2f32.powi(rng.random_range(-30..15)),
                    )
                })
                .collect();
            values.extend([
                largest as f32,
                -(largest as f32),
                dtype.round(2f32.powi(-24)),
                0.0,
            ]);
            for compute in [Compute::F32, Compute::Tf32, Compute::F16, Compute::Bf16] {
                let changed = values
                    .iter()
                    .any(|&x| compute.round(x).to_bits() != x.to_bits());
                assert_eq!(
                    compute.keeps(dtype),
                    !changed,
                    "{} of {} values",
                    compute.name(),
                    dtype.name()
                );
            }
        }
    }

    #[test]
    fn tf32_rounds_to_ten_mantissa_bits_ties_to_even() {
        let one = 1.0f32;
        let ulp = 2f32.powi(-10);
        assert_eq!(round_tf32(one + ulp / 2.0), one, "tie to even (down)");
        assert_eq!(
            round_tf32(one + ulp * 1.5),
            one + 2.0 * ulp,
            "tie to even (up)"
        );
        assert_eq!(round_tf32(one + ulp * 0.75), one + ulp);
        assert_eq!(round_tf32(-(one + ulp * 0.25)), -one);
        assert_eq!(round_tf32(3.0), 3.0);
        // Every rounded value has its low 13 bits clear and is within half an ulp.
        for i in 0..10_000u32 {
            let x = f32::from_bits(0x3F80_0000 + i * 977);
            let r = round_tf32(x);
            assert_eq!(r.to_bits() & 0x1FFF, 0);
            assert!(((r - x) / x).abs() <= 2f32.powi(-11));
        }
    }

    #[test]
    fn half_precisions_round_as_the_half_crate() {
        assert_eq!(Dtype::F16.round(1.0 + 2f32.powi(-12)), 1.0);
        assert_eq!(Dtype::Bf16.round(1.0 + 2f32.powi(-9)), 1.0);
        assert_eq!(Dtype::F16.round(70000.0), f32::INFINITY);
        assert_eq!(Compute::Bf16.operand_roundoff(Dtype::Bf16), 0.0);
        assert_eq!(Compute::F16.operand_roundoff(Dtype::Bf16), 2f64.powi(-11));
        assert_eq!(Compute::Tf32.operand_roundoff(Dtype::F32), 2f64.powi(-11));
        assert_eq!(Compute::Tf32.operand_roundoff(Dtype::F16), 0.0);
    }
}
