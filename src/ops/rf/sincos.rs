//! e^{jθ} for a whole waveform at once: the FM modes need one per sample (200,000 per
//! default recording), and libm's `sin_cos` is a call per value that does not vectorise.
//! Here θ is reduced by the nearest multiple of π/2 (Cody–Waite, π/2 in three parts) and
//! sine and cosine of the remainder (|r| ≤ π/4 + ε) are Taylor polynomials to r¹⁹ and r²⁰,
//! whose truncation error (< 1e-19) is far under an f64 ulp. Plain IEEE operations in a
//! fixed order, so the result is the same on every machine and in both builds; within
//! 3e-16 of libm for |θ| ≤ 4 (tested), and within the argument's own rounding beyond.

use super::simd::avx2_dispatch;
use rustfft::num_complex::Complex;

// π/2 = P1 + P2 + P3 (fdlibm's split): P1 and P2 carry 33 significant bits, so q·P1 and
// q·P2 are exact for |q| < 2^20.
const P1: f64 = 1.570_796_326_734_125_6;
const P2: f64 = 6.077_100_506_303_966e-11;
const P3: f64 = 2.022_266_248_795_950_6e-21;

/// 1 / ((2k)(2k + 1)) and 1 / ((2k − 1)(2k)) for k = 1..=10: the Horner factors of sine
/// and cosine.
const SIN_STEP: [f64; 11] = steps(0);
const COS_STEP: [f64; 11] = steps(1);

const fn steps(cos: usize) -> [f64; 11] {
    let mut out = [0.0; 11];
    let mut k = 1;
    while k <= 10 {
        let a = (2 * k - cos) as f64;
        out[k] = 1.0 / (a * (a + 1.0));
        k += 1;
    }
    out
}

avx2_dispatch! {
    /// `out[i] = e^{j·theta[i]}`, for |theta| < 1e6.
    pub fn polar(theta: &[f64], out: &mut [Complex<f64>]) => polar_lanes;
}

#[inline(always)]
fn polar_lanes(theta: &[f64], out: &mut [Complex<f64>]) {
    assert_eq!(theta.len(), out.len());
    // The reduction's q·P1 and q·P2 are exact for |q| < 2^20 only.
    debug_assert!(theta.iter().all(|t| t.abs() < 1e6), "polar: |θ| ≥ 1e6");
    for (t, o) in theta.iter().zip(out.iter_mut()) {
        *o = unit(*t);
    }
}

#[inline(always)]
fn unit(theta: f64) -> Complex<f64> {
    let q = (theta * std::f64::consts::FRAC_2_PI).round_ties_even();
    let r = ((theta - q * P1) - q * P2) - q * P3;
    let r2 = r * r;
    // Horner in r²: sin r = r·(1 − r²/(2·3)·(1 − r²/(4·5)·(…))), to r¹⁹; cos to r²⁰.
    let s = SIN_STEP[1..10]
        .iter()
        .rev()
        .fold(1.0, |acc, step| 1.0 - r2 * step * acc);
    let c = COS_STEP[1..=10]
        .iter()
        .rev()
        .fold(1.0, |acc, step| 1.0 - r2 * step * acc);
    let (sin_r, cos_r) = (r * s, c);
    // θ = q·π/2 + r: (cos r, sin r) turned by q quarter turns, q mod 4 = m. A quarter
    // turn swaps the parts (odd m), a half turn negates both (m ≥ 2); computed with
    // selects on floats so the loop vectorises.
    let m = q - 4.0 * (q * 0.25).floor();
    let odd = m == 1.0 || m == 3.0;
    let (re, im) = if odd { (-sin_r, cos_r) } else { (cos_r, sin_r) };
    if m >= 2.0 {
        Complex::new(-re, -im)
    } else {
        Complex::new(re, im)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_libm_and_across_builds() {
        // FM phases live in (−π, π]; wider arguments and the quadrant edges too.
        let mut theta: Vec<f64> = (0..200_001)
            .map(|i| -std::f64::consts::PI + i as f64 * (2.0 * std::f64::consts::PI / 200_000.0))
            .collect();
        theta.extend((-2000..2000).map(|q| q as f64 * std::f64::consts::FRAC_PI_2));
        theta.extend((0..100_000).map(|i| -1e4 + i as f64 * 0.2000_0001));
        let mut got = vec![Complex::new(0.0, 0.0); theta.len()];
        polar(&theta, &mut got);
        let mut base = vec![Complex::new(0.0, 0.0); theta.len()];
        polar_lanes(&theta, &mut base);
        let mut worst = 0.0f64;
        for ((t, g), b) in theta.iter().zip(&got).zip(&base) {
            assert_eq!(
                (g.re.to_bits(), g.im.to_bits()),
                (b.re.to_bits(), b.im.to_bits())
            );
            let (s, c) = t.sin_cos();
            // libm is within an ulp; the argument's own ulp bounds what any result can mean.
            let allowed = if t.abs() <= 4.0 {
                3e-16
            } else {
                4e-16 + 2.0 * t.abs() * f64::EPSILON
            };
            let err = (g.re - c).abs().max((g.im - s).abs());
            assert!(err <= allowed, "θ = {t}: error {err}");
            worst = worst.max(err / allowed);
        }
        assert!(worst > 0.0);
    }
}
