//! Multipath as a time-domain FIR: each tap g·x(t − τ) with its fractional delay τ·fs
//! realised by a 16-tap Kaiser-windowed sinc (β = 8), so no FFT of the recording is
//! needed. A delayed signal is within −80 dB of the exact delay for content within
//! ±0.2·fs and −75 dB within ±0.3·fs (the widest signal the scenario allows reaches
//! ±0.25·fs); a whole-sample delay is exact. The
//! delay is circular over the recording, as an FFT-domain delay would be. Computed in
//! f32, split into real and imaginary parts; the receive loop asks for outputs several
//! at a time (`Fir::lanes`), their sums kept in registers over all taps.

use rustfft::num_complex::Complex;

/// Half-width of the fractional-delay kernel: offsets floor(d) − 7 ..= floor(d) + 8.
pub const HALF_WIDTH: i64 = 8;
const BETA: f64 = 8.0;
/// Coefficient groups closer than this are merged into one dense segment.
const MERGE_GAP: i64 = 8;

/// A recording in f32 parts, with `lead` samples of its end before it and
/// `HALF_WIDTH` of its start after it, for circular delays up to `lead`.
pub struct Padded {
    re: Vec<f32>,
    im: Vec<f32>,
    lead: usize,
    len: usize,
}

impl Padded {
    pub fn new(x: &[Complex<f64>], lead: usize) -> Self {
        let len = x.len();
        let total = padded_len(len, lead);
        // Index p holds x[(p − lead) mod len]: the recording repeated from the right phase.
        let mut at = (len - lead % len) % len;
        let (mut re, mut im) = (Vec::with_capacity(total), Vec::with_capacity(total));
        // Whole stretches of x at a time (a cycled iterator would step through the
        // skipped part one element at a time).
        while re.len() < total {
            let stretch = &x[at..len.min(at + total - re.len())];
            re.extend(stretch.iter().map(|v| v.re as f32));
            im.extend(stretch.iter().map(|v| v.im as f32));
            at = 0;
        }
        Self { re, im, lead, len }
    }

    /// Real and imaginary parts, padding included; sample 0 is at index `lead`.
    pub fn parts(&self) -> (&[f32], &[f32]) {
        (&self.re, &self.im)
    }

    pub fn lead(&self) -> usize {
        self.lead
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Floats in each part of a `Padded` of `len` samples after `lead`.
pub fn padded_len(len: usize, lead: usize) -> usize {
    lead + len + HALF_WIDTH as usize
}

/// The lead a `Padded` needs for delays up to `max_delay_samples`.
pub fn lead_for(max_delay_samples: f64) -> usize {
    max_delay_samples.floor() as usize + HALF_WIDTH as usize
}

fn bessel_i0(x: f64) -> f64 {
    let (mut sum, mut term, q) = (1.0, 1.0, x * x / 4.0);
    for k in 1..64 {
        term *= q / (k * k) as f64;
        sum += term;
        if term < 1e-17 * sum {
            break;
        }
    }
    sum
}

/// The kernel at distance `u` from the delay (|u| < HALF_WIDTH).
fn kernel(u: f64) -> f64 {
    let sinc = if u == 0.0 {
        1.0
    } else {
        (std::f64::consts::PI * u).sin() / (std::f64::consts::PI * u)
    };
    let r = u / HALF_WIDTH as f64;
    sinc * bessel_i0(BETA * (1.0 - r * r).max(0.0).sqrt()) / bessel_i0(BETA)
}

/// y[i] = Σ c[l]·x[i − first − l].
struct Segment {
    first: i64,
    coeffs: Vec<Complex<f64>>,
}

/// The channel's FIR: taps (delay in samples ≥ 0, complex gain) merged into segments.
pub struct Channel {
    segments: Vec<Segment>,
}

impl Channel {
    pub fn new(taps: &[(f64, Complex<f64>)]) -> Self {
        let mut parts: Vec<Segment> = taps
            .iter()
            .map(|&(d, g)| {
                let whole = d.floor();
                if d == whole {
                    return Segment {
                        first: whole as i64,
                        coeffs: vec![g],
                    };
                }
                let first = whole as i64 - HALF_WIDTH + 1;
                Segment {
                    first,
                    coeffs: (0..2 * HALF_WIDTH)
                        .map(|l| g * kernel((first + l) as f64 - d))
                        .collect(),
                }
            })
            .collect();
        parts.sort_by_key(|p| p.first);
        let mut segments: Vec<Segment> = Vec::new();
        for p in parts {
            match segments.last_mut() {
                Some(s) if p.first <= s.first + s.coeffs.len() as i64 + MERGE_GAP => {
                    let end =
                        (p.first + p.coeffs.len() as i64).max(s.first + s.coeffs.len() as i64);
                    s.coeffs
                        .resize((end - s.first) as usize, Complex::new(0.0, 0.0));
                    for (l, c) in p.coeffs.iter().enumerate() {
                        s.coeffs[(p.first - s.first) as usize + l] += c;
                    }
                }
                _ => segments.push(p),
            }
        }
        Self { segments }
    }

    /// The largest offset any coefficient reaches (what `Padded::lead` must cover).
    pub fn reach(&self) -> i64 {
        self.segments
            .iter()
            .map(|s| s.first + s.coeffs.len() as i64 - 1)
            .max()
            .unwrap_or(0)
    }

    /// Every coefficient as (offset m, value), in the order `apply` sums them.
    pub fn coefficients(&self) -> impl Iterator<Item = (i64, Complex<f64>)> + '_ {
        self.segments.iter().flat_map(|s| {
            s.coeffs
                .iter()
                .enumerate()
                .map(move |(l, c)| (s.first + l as i64, *c))
        })
    }

    /// The channel's output: real and imaginary parts.
    pub fn apply(&self, x: &Padded) -> (Vec<f32>, Vec<f32>) {
        let fir = self.fir(x);
        (0..fir.len()).map(|i| fir.at(i)).unzip()
    }

    /// The channel over `x`, output by output (`Fir`).
    pub fn fir<'a>(&self, x: &'a Padded) -> Fir<'a> {
        assert!(
            self.reach() <= x.lead as i64,
            "padding shorter than the delay"
        );
        Fir {
            // x[i − m] sits at lead + i − m in the padded arrays; m ≥ −7.
            taps: self
                .coefficients()
                .map(|(m, c)| ((x.lead as i64 - m) as usize, c.re as f32, c.im as f32))
                .collect(),
            x,
        }
    }
}

/// The channel's outputs on demand: y[i] = Σ c·x[i − m] over the coefficients in order,
/// each sum from 0 (the kernel's order, whatever the lane).
pub struct Fir<'a> {
    /// (lead − m, c.re, c.im)
    taps: Vec<(usize, f32, f32)>,
    x: &'a Padded,
}

impl Fir<'_> {
    /// Outputs i .. i + N side by side, their sums kept in registers over all taps.
    #[inline(always)]
    pub fn lanes<const N: usize>(&self, i: usize) -> ([f32; N], [f32; N]) {
        let (mut ar, mut ai) = ([0f32; N], [0f32; N]);
        for &(at, cr, ci) in &self.taps {
            let xr: &[f32; N] = self.x.re[at + i..at + i + N].try_into().expect("N");
            let xi: &[f32; N] = self.x.im[at + i..at + i + N].try_into().expect("N");
            for j in 0..N {
                ar[j] += cr * xr[j] - ci * xi[j];
                ai[j] += cr * xi[j] + ci * xr[j];
            }
        }
        (ar, ai)
    }

    /// Output i alone.
    #[inline(always)]
    pub fn at(&self, i: usize) -> (f32, f32) {
        let (mut ar, mut ai) = (0f32, 0f32);
        for &(at, cr, ci) in &self.taps {
            let (xr, xi) = (self.x.re[at + i], self.x.im[at + i]);
            ar += cr * xr - ci * xi;
            ai += cr * xi + ci * xr;
        }
        (ar, ai)
    }

    pub fn len(&self) -> usize {
        self.x.len
    }

    pub fn is_empty(&self) -> bool {
        self.x.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::f64::consts::PI;

    fn tone(n: usize, cycles: f64) -> Vec<Complex<f64>> {
        (0..n)
            .map(|i| Complex::from_polar(1.0, 2.0 * PI * cycles * i as f64 / n as f64))
            .collect()
    }

    #[test]
    fn fractional_delays_match_the_exact_phase_shift() {
        // Whole cycles: the circular delay of a tone is exactly a phase shift, at the
        // wrap too. Tones up to 0.3·fs, delays below, across and past one sample.
        let n = 4000;
        for frac in [0.02, 0.1, 0.25, 0.3] {
            let cycles = (frac * n as f64).round();
            let x = tone(n, cycles);
            for d in [0.0, 0.26, 0.5, 1.0, 1.73, 9.4, 37.05] {
                let g = Complex::from_polar(0.5, 0.7);
                let ch = Channel::new(&[(d, g)]);
                let p = Padded::new(&x, lead_for(d));
                let (yr, yi) = ch.apply(&p);
                let worst = (0..n)
                    .map(|i| {
                        let want = g * Complex::from_polar(
                            1.0,
                            2.0 * PI * cycles * (i as f64 - d) / n as f64,
                        );
                        (Complex::new(yr[i] as f64, yi[i] as f64) - want).norm()
                    })
                    .fold(0.0, f64::max);
                // Of the 0.5 amplitude: −80 dB within ±0.2·fs, −75 dB at 0.3·fs, plus f32
                // rounding.
                let db = if frac <= 0.2 { -80.0 } else { -75.0 };
                let bound = if d.fract() == 0.0 {
                    1e-6
                } else {
                    0.5 * 10f64.powf(db / 20.0) + 1e-6
                };
                assert!(worst < bound, "f = {frac}·fs, d = {d}: error {worst}");
            }
        }
    }

    #[test]
    fn taps_add_up_and_far_taps_stay_separate_segments() {
        let n = 2000;
        let x = tone(n, 40.0);
        let taps = [
            (0.0, Complex::new(0.8, 0.0)),
            (0.4, Complex::new(0.0, 0.3)),
            (120.6, Complex::new(-0.2, 0.1)),
        ];
        let ch = Channel::new(&taps);
        assert_eq!(ch.segments.len(), 2);
        let p = Padded::new(&x, lead_for(120.6));
        let (yr, yi) = ch.apply(&p);
        // Side by side as one by one, to the bit.
        let fir = ch.fir(&p);
        for i in (0..n - 16).step_by(7) {
            let (lr, li) = fir.lanes::<16>(i);
            for j in 0..16 {
                assert_eq!(
                    (lr[j].to_bits(), li[j].to_bits()),
                    (yr[i + j].to_bits(), yi[i + j].to_bits())
                );
            }
        }
        let alone: Vec<(Vec<f32>, Vec<f32>)> =
            taps.iter().map(|t| Channel::new(&[*t]).apply(&p)).collect();
        for i in 0..n {
            let sum_r: f32 = alone.iter().map(|a| a.0[i]).sum();
            let sum_i: f32 = alone.iter().map(|a| a.1[i]).sum();
            assert!(
                (yr[i] - sum_r).abs() < 1e-5 && (yi[i] - sum_i).abs() < 1e-5,
                "{i}"
            );
        }
    }
}
