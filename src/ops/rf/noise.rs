//! The receiver noise: complex sample i of a recording is one draw of its noise stream
//! turned into two independent standard normals by the Box–Muller transform, in f32 (the
//! precision a recording keeps). Box–Muller rather than the ziggurat `Stream::normal_at`
//! uses: it reads no tables and has no rejections, so eight lanes (or a GPU warp) run the
//! same instructions; what a ziggurat saves in arithmetic it spends in gathers and
//! branches there.
//!
//! Draw d: its low 32 bits give the radius, its high 32 bits the angle.
//! - Radius r = √(−2 ln U), U = (m + 1)·2⁻²⁴ for the draw's top 24 low-half bits m, so
//!   U is exact in f32 and in (0, 1]. ln by the exponent and an atanh series on the
//!   mantissa, no libm. Where m < 2⁸ (U ≤ 2⁻¹⁶, r > 4.7, one sample in 65,536) the grid
//!   would cut the tail short (at 5.8), so U is refined within its cell by 53 bits of a
//!   sub-stream of i and r computed in f64: the tail is exact to 10σ.
//! - Angle θ = 2π·h/2³² for the high half h: its top two bits (rounded) pick the
//!   quadrant exactly, the rest a turn t in [−π/4, π/4) whose sine and cosine are
//!   Cephes' f32 minimax polynomials (within 2e-7 of the exact values, rounding included).
//!
//! Every operation is an IEEE f32 operation in a fixed order, never fused, so the
//! baseline and AVX2 builds and kernels/rf.cuh give the same bits.

use super::rng::Stream;

/// Below this low half (m < 2⁸) the radius takes the tail path.
const TAIL_BELOW: u32 = 1 << 16;
const TAIL_SALT: u64 = 0x6e6f_6973_6574_6169;
/// ln 2 in two parts (as musl's logf): e·LN2_HI is exact for |e| < 2⁸.
const LN2_HI: f32 = f32::from_bits(0x3f31_7180);
const LN2_LO: f32 = f32::from_bits(0x3717_f7d1);
/// 2π / 2³², the angle of one step of the high half (rounded to f32).
const TURN_STEP: f32 = f32::from_bits(0x30c9_0fdb);

/// ln u for u in [2⁻²⁴, 1] (a normal f32): u = 2ᵉ·f with f in [√½, √2), and
/// ln f = 2·atanh(s), s = (f − 1)/(f + 1), |s| < 0.172, by its series to s⁹.
#[inline(always)]
fn ln(u: f32) -> f32 {
    let ix = u.to_bits().wrapping_add(0x3f80_0000 - 0x3f35_04f3);
    let e = ((ix >> 23) as i32 - 127) as f32;
    let f = f32::from_bits((ix & 0x007f_ffff) + 0x3f35_04f3);
    let s = (f - 1.0) / (f + 1.0);
    let s2 = s * s;
    let p = s2 * (1.0 / 3.0 + s2 * (1.0 / 5.0 + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0))));
    let half = s + s * p;
    e * LN2_HI + (e * LN2_LO + (half + half))
}

/// The radius from a draw's low half (the fast path; `Noise::tail_radius` below
/// TAIL_BELOW).
#[inline(always)]
fn radius(lo: u32) -> f32 {
    let u = ((lo >> 8) + 1) as i32 as f32 * (1.0 / (1u32 << 24) as f32);
    (-2.0 * ln(u)).max(0.0).sqrt()
}

/// Minimax polynomials for sin and cos on [−π/4, π/4] in f32 (Cephes' sinf and cosf):
/// sin t = t + t³·(S1 + t²·(S2 + t²·S3)), cos t = 1 − t²/2 + t⁴·(C1 + t²·(C2 + t²·C3)).
const S1: f32 = -1.666_665_5e-1;
const S2: f32 = 8.332_161e-3;
const S3: f32 = -1.951_529_6e-4;
const C1: f32 = 4.166_664_6e-2;
const C2: f32 = -1.388_731_6e-3;
const C3: f32 = 2.443_315_7e-5;

/// (cos θ, sin θ) for θ = 2π·h/2³².
#[inline(always)]
fn turn(h: u32) -> (f32, f32) {
    let q = h.wrapping_add(1 << 29) >> 30;
    let t = (h.wrapping_sub(q << 30) as i32) as f32 * TURN_STEP;
    let t2 = t * t;
    let s = t + t * (t2 * (S1 + t2 * (S2 + t2 * S3)));
    let c = (1.0 - 0.5 * t2) + (t2 * t2) * (C1 + t2 * (C2 + t2 * C3));
    // Quadrant q: (c, s) turned by q·π/2.
    let (a, b) = if q & 1 == 1 { (s, c) } else { (c, s) };
    let a = f32::from_bits(a.to_bits() ^ ((((q + 1) >> 1) & 1) << 31));
    let b = f32::from_bits(b.to_bits() ^ ((q >> 1) << 31));
    (a, b)
}

/// A recording's noise: its stream, sample by sample.
#[derive(Clone, Copy, Debug)]
pub struct Noise(pub Stream);

impl Noise {
    /// Complex noise sample i: (re, im), independent standard normals.
    pub fn at(&self, i: u64) -> (f32, f32) {
        let (mut re, mut im) = ([0f32; 1], [0f32; 1]);
        self.lanes(i, &mut re, &mut im);
        (re[0], im[0])
    }

    /// Samples `first .. first + N` (each `at` of its index), side by side; only the rare
    /// tail radii are computed one at a time.
    #[inline(always)]
    pub fn lanes<const N: usize>(&self, first: u64, re: &mut [f32; N], im: &mut [f32; N]) {
        let (mut lo, mut hi) = ([0u32; N], [0u32; N]);
        for j in 0..N {
            let d = self.0.at(first + j as u64);
            (lo[j], hi[j]) = (d as u32, (d >> 32) as u32);
        }
        let mut r = [0f32; N];
        for j in 0..N {
            r[j] = radius(lo[j]);
        }
        // The lanes' minimum (one vector reduction) rather than `any`, which compiles to
        // an extract, compare and branch per lane.
        if lo.iter().fold(u32::MAX, |m, &l| m.min(l)) < TAIL_BELOW {
            for j in 0..N {
                if lo[j] < TAIL_BELOW {
                    r[j] = self.tail_radius(first + j as u64, lo[j] >> 8);
                }
            }
        }
        for j in 0..N {
            let (c, s) = turn(hi[j]);
            (re[j], im[j]) = (r[j] * c, r[j] * s);
        }
    }

    /// The radius for cell m < 2⁸ of sample i: U = (m + w)·2⁻²⁴, w in (0, 1] from the
    /// sub-stream of i, in f64.
    #[cold]
    fn tail_radius(&self, i: u64, m: u32) -> f32 {
        let w = 1.0 - self.0.sub(i ^ TAIL_SALT).uniform();
        let u = (f64::from(m) + w) * (1.0 / (1u64 << 24) as f64);
        (-2.0 * u.ln()).sqrt() as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rf::rng::ziggurat_tests::{assert_standard_normal, phi};
    use crate::ops::rf::rng::{dataset_key, Purpose};

    fn noise() -> Noise {
        Noise(Stream::new(dataset_key(9), 3, 1, Purpose::Noise))
    }

    #[test]
    fn components_are_independent_standard_normals() {
        let n = noise();
        let pairs: Vec<(f32, f32)> = (0..1_000_000).map(|i| n.at(i)).collect();
        let count = pairs.len() as f64;
        let corr = pairs
            .iter()
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum::<f64>()
            / count;
        // Correlation of independent unit normals: sd 1/√n = 0.001.
        assert!(corr.abs() < 0.005, "re·im correlation {corr}");
        // The radius alone: P(r > x) = e^{−x²/2}, out to where the tail path takes over.
        for x in [1.0f64, 2.5, 4.0] {
            let seen = pairs
                .iter()
                .filter(|(a, b)| f64::from(*a).hypot(f64::from(*b)) > x)
                .count() as f64;
            let want = count * (-0.5 * x * x).exp();
            assert!(
                (seen - want).abs() < 4.0 * want.sqrt() + 2.0,
                "r > {x}: {seen} vs {want}"
            );
        }
        assert_standard_normal(
            pairs
                .iter()
                .flat_map(|(a, b)| [f64::from(*a), f64::from(*b)])
                .collect(),
        );
    }

    #[test]
    fn the_radius_is_within_f32_rounding_of_the_exact_one() {
        let mut worst = 0f64;
        for m in 1u32 << 8..1 << 24 {
            let u = f64::from(m + 1) / f64::from(1u32 << 24);
            let exact = (-2.0 * u.ln()).sqrt();
            let got = f64::from(radius(m << 8 | 0xff));
            let err = (got - exact).abs() / exact.max(1e-3);
            worst = worst.max(err);
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(radius(u32::MAX), 0.0);
    }

    #[test]
    fn the_turn_is_within_f32_rounding_of_the_exact_one() {
        let quadrant_edges = (0..4u32).flat_map(|q| {
            let edge = (q << 30).wrapping_add(1 << 29);
            [edge.wrapping_sub(1), edge, q << 30]
        });
        let mut worst = 0f64;
        for h in (0..u32::MAX).step_by(997).chain(quadrant_edges) {
            let theta = 2.0 * std::f64::consts::PI * f64::from(h) / 2f64.powi(32);
            let (c, s) = turn(h);
            worst = worst
                .max((f64::from(c) - theta.cos()).abs())
                .max((f64::from(s) - theta.sin()).abs());
        }
        assert!(worst < 2e-7, "worst error {worst}");
    }

    #[test]
    fn the_tail_path_extends_the_radius_exactly() {
        // Cells m < 2⁸ refined: U uniform on (0, 2⁻¹⁶], so r² − 32·ln 2 is exponential
        // with mean 2 (the grid alone would stop at r² = 48·ln 2).
        let n = noise();
        let k = 200_000;
        let mut excess: Vec<f64> = (0..k)
            .map(|i| f64::from(n.tail_radius(i, (i % 256) as u32)).powi(2) - 32.0 * 2f64.ln())
            .collect();
        excess.sort_by(f64::total_cmp);
        let d = excess
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let c = 1.0 - (-x / 2.0).exp();
                (c - i as f64 / k as f64)
                    .abs()
                    .max(((i + 1) as f64 / k as f64 - c).abs())
            })
            .fold(0.0, f64::max);
        assert!(d * (k as f64).sqrt() < 1.95, "KS {}", d * (k as f64).sqrt());
        assert!(excess[k as usize - 1] > 48.0 * 2f64.ln() - 32.0 * 2f64.ln());
        // About one sample in 65,536 reaches it; lanes and one by one agree there too.
        let mut tails = 0;
        for first in (0..1_000_000u64).step_by(8) {
            let (mut re, mut im) = ([0f32; 8], [0f32; 8]);
            n.lanes(first, &mut re, &mut im);
            for j in 0..8 {
                let (r, i) = n.at(first + j as u64);
                assert_eq!(
                    (re[j].to_bits(), im[j].to_bits()),
                    (r.to_bits(), i.to_bits())
                );
                let rr = f64::from(r).hypot(f64::from(i));
                tails += usize::from(rr * rr > 32.0 * 2f64.ln() + 1e-4);
            }
        }
        let want = 1e6 / 65_536.0;
        assert!(
            (tails as f64 - want).abs() < 4.0 * want.sqrt() + 2.0,
            "{tails} tail radii"
        );
        let _ = phi;
    }
}
