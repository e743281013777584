//! Counter-based randomness for the synthetic datasets: every draw of sample n comes
//! from a stream keyed by (seed, n, receiver, purpose), so a dataset does not depend on
//! thread count, batch size, backend, or where a job resumed. Draw k of a stream is
//! SplitMix64's finaliser over (stream key + k·γ): a pure function of its coordinates that
//! a GPU thread computes as cheaply as a CPU (the same construction as SplitMix64's
//! sequence, which passes BigCrush). Normals by a 256-layer ziggurat in which normal k is
//! itself a pure function of (stream, k): its fast path reads draw k alone, and the rare
//! rejections read a sub-stream of k, so a GPU thread can compute any normal without the
//! ones before it.

use sha2::{Digest, Sha256};
use std::sync::OnceLock;

/// What a stream is for; streams of different purposes never share draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Purpose {
    Geometry = 1,
    Propagation = 2,
    Waveform = 3,
    Oscillator = 4,
    Multipath = 5,
    Fading = 6,
    Noise = 7,
}

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
const TAIL_SALT: u64 = 0x6e6f_726d_616c_7461;
/// Start of the 256-layer ziggurat's tail, and each layer's area (Marsaglia & Tsang 2000).
pub const ZIG_R: f64 = 3.654_152_885_361_009;
const ZIG_V: f64 = 0.004_928_673_233_99;

/// Layer right edges `x` (x[0] is the base strip's equivalent width, x[256] = 0) and
/// `ratio[i] = x[i+1] / x[i]`, below which a point lies inside the density for sure.
pub struct Ziggurat {
    pub x: [f64; 257],
    pub ratio: [f64; 256],
}

/// The ziggurat tables (computed once).
pub fn ziggurat() -> &'static Ziggurat {
    static TABLES: OnceLock<Ziggurat> = OnceLock::new();
    TABLES.get_or_init(|| {
        let f = |x: f64| (-0.5 * x * x).exp();
        let mut x = [0.0; 257];
        x[0] = ZIG_V / f(ZIG_R);
        x[1] = ZIG_R;
        for i in 2..256 {
            x[i] = (-2.0 * (ZIG_V / x[i - 1] + f(x[i - 1])).ln()).sqrt();
        }
        x[256] = 0.0;
        let mut ratio = [0.0; 256];
        for i in 0..256 {
            ratio[i] = x[i + 1] / x[i];
        }
        Ziggurat { x, ratio }
    })
}

/// Uniform on (−1, 1) from the top 53 bits of a draw.
#[inline]
fn signed_unit(d: u64) -> f64 {
    // Through i64: the same value (below 2^53), one conversion instruction instead of
    // the unsigned sequence.
    ((d >> 11) as i64) as f64 * (2.0 / (1u64 << 53) as f64) - 1.0
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The dataset's 64-bit key, from its seed (hashed, so nearby seeds share nothing).
pub fn dataset_key(seed: u64) -> u64 {
    let mut h = Sha256::new();
    h.update(b"gpu-ops/rf/dataset/v1");
    h.update(seed.to_le_bytes());
    u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

/// One stream's draws, by index.
#[derive(Clone, Copy, Debug)]
pub struct Stream {
    key: u64,
    next: u64,
}

impl Stream {
    pub fn new(dataset_key: u64, sample: u64, receiver: u16, purpose: Purpose) -> Self {
        let coords = mix(sample ^ GAMMA)
            ^ mix((u64::from(receiver) << 16 | purpose as u64).wrapping_mul(GAMMA) ^ 0x5bd1_e995);
        Self {
            key: mix(dataset_key ^ coords),
            next: 0,
        }
    }

    /// The stream whose key is `key` (as `key()` gave it), from its first draw.
    pub fn from_key(key: u64) -> Self {
        Self { key, next: 0 }
    }

    /// The stream's key (what a kernel needs to draw from it).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The sub-stream keyed by (this stream, `k`): draws for a rare path of draw k that
    /// must not shift any other draw.
    pub fn sub(&self, k: u64) -> Stream {
        Stream {
            key: mix(self.key ^ mix(k)),
            next: 0,
        }
    }

    /// Draw k of the stream, whatever was drawn before.
    pub fn at(&self, k: u64) -> u64 {
        mix(self.key.wrapping_add(k.wrapping_add(1).wrapping_mul(GAMMA)))
    }

    pub fn next_u64(&mut self) -> u64 {
        let v = self.at(self.next);
        self.next += 1;
        v
    }

    /// Uniform on [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as i64) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// The next standard normal (`normal_at` of the next index).
    pub fn normal(&mut self) -> f64 {
        let v = self.normal_at(self.next);
        self.next += 1;
        v
    }

    pub fn normal_pair(&mut self) -> (f64, f64) {
        (self.normal(), self.normal())
    }

    /// Standard normal k of the stream: Marsaglia and Tsang's ziggurat in Doornik's
    /// form, 256 layers. Draw k gives the layer (low 8 bits) and a signed uniform (top 53
    /// bits); 98.8 % of normals return there. Otherwise the wedge test and the tail read
    /// the sub-stream keyed by (stream, k), never draw k + 1.
    #[inline]
    pub fn normal_at(&self, k: u64) -> f64 {
        let z = ziggurat();
        let d = self.at(k);
        let layer = (d & 0xff) as usize;
        let u = signed_unit(d);
        if u.abs() < z.ratio[layer] {
            return u * z.x[layer];
        }
        self.normal_slow(k, layer, u)
    }

    #[cold]
    fn normal_slow(&self, k: u64, mut layer: usize, mut u: f64) -> f64 {
        let z = ziggurat();
        let mut sub = self.sub(k ^ TAIL_SALT);
        loop {
            if layer == 0 {
                // The tail beyond R (Marsaglia 1964).
                loop {
                    let x = -(1.0 - sub.uniform()).ln() / ZIG_R;
                    let y = -(1.0 - sub.uniform()).ln();
                    if 2.0 * y >= x * x {
                        return if u < 0.0 { -(ZIG_R + x) } else { ZIG_R + x };
                    }
                }
            }
            let x = u * z.x[layer];
            let f0 = (-0.5 * (z.x[layer] * z.x[layer] - x * x)).exp();
            let f1 = (-0.5 * (z.x[layer + 1] * z.x[layer + 1] - x * x)).exp();
            if f1 + sub.uniform() * (f0 - f1) < 1.0 {
                return x;
            }
            let d = sub.next_u64();
            layer = (d & 0xff) as usize;
            u = signed_unit(d);
            if u.abs() < z.ratio[layer] {
                return u * z.x[layer];
            }
        }
    }

    /// Index drawn with probability proportional to `weights` (not all zero).
    pub fn pick(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        let mut u = self.uniform() * total;
        for (i, w) in weights.iter().enumerate() {
            if u < *w {
                return i;
            }
            u -= w;
        }
        weights.iter().rposition(|w| *w > 0.0).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_pure_functions_of_their_coordinates() {
        let k = dataset_key(42);
        let a: Vec<u64> = {
            let mut s = Stream::new(k, 7, 2, Purpose::Noise);
            (0..5).map(|_| s.next_u64()).collect()
        };
        let s = Stream::new(k, 7, 2, Purpose::Noise);
        assert_eq!(a, (0..5).map(|i| s.at(i)).collect::<Vec<_>>());
        let others = [
            Stream::new(k, 8, 2, Purpose::Noise),
            Stream::new(k, 7, 3, Purpose::Noise),
            Stream::new(k, 7, 2, Purpose::Fading),
            Stream::new(dataset_key(43), 7, 2, Purpose::Noise),
        ];
        for o in others {
            assert_ne!(o.at(0), a[0]);
        }
    }

    #[test]
    fn uniforms_and_normals_have_their_moments() {
        let mut s = Stream::new(dataset_key(1), 0, 0, Purpose::Waveform);
        let n = 200_000;
        let u: Vec<f64> = (0..n).map(|_| s.uniform()).collect();
        let mean = u.iter().sum::<f64>() / n as f64;
        let var = u.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.003 && (var - 1.0 / 12.0).abs() < 0.001);
        let z: Vec<f64> = (0..n).map(|_| s.normal()).collect();
        let mean = z.iter().sum::<f64>() / n as f64;
        let var = z.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        let kurt = z.iter().map(|x| (x - mean).powi(4)).sum::<f64>() / n as f64 / (var * var);
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.01 && (kurt - 3.0).abs() < 0.05);
        let fixed = Stream::new(dataset_key(1), 0, 0, Purpose::Noise);
        assert_eq!(fixed.normal_at(17), {
            let mut t = fixed;
            (0..17).for_each(|_| {
                t.normal();
            });
            t.normal()
        });
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            counts[s.pick(&[1.0, 0.0, 2.0])] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!((counts[2] as f64 / counts[0] as f64 - 2.0).abs() < 0.1);
    }
}

#[cfg(test)]
pub(super) mod ziggurat_tests {
    use super::*;

    pub(in crate::ops::rf) fn phi(x: f64) -> f64 {
        0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
    }

    #[test]
    fn the_tables_close_at_zero() {
        let z = ziggurat();
        // The recursion lands on the density's peak: the top layer's edge is near 0, and
        // each layer has the same area.
        assert!(z.x[255] > 0.0 && z.x[255] < 0.3, "{}", z.x[255]);
        let f = |x: f64| (-0.5 * x * x).exp();
        let area = z.x[255] * (1.0 - f(z.x[255]));
        assert!((area - ZIG_V).abs() < 1e-6 * ZIG_V, "{area}");
    }

    #[test]
    fn normals_follow_the_normal_cdf_body_and_tails() {
        let s = Stream::new(dataset_key(9), 3, 1, Purpose::Fading);
        assert_standard_normal((0..2_000_000).map(|k| s.normal_at(k)).collect());
    }

    /// Kolmogorov–Smirnov, both tails' frequencies and the tail's shape.
    pub(in crate::ops::rf) fn assert_standard_normal(mut z: Vec<f64>) {
        let n = z.len() as u64;
        z.sort_by(f64::total_cmp);
        // Kolmogorov–Smirnov: D·√n below 1.95 (p = 0.001).
        let d = z
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let c = phi(x);
                (c - i as f64 / n as f64)
                    .abs()
                    .max(((i + 1) as f64 / n as f64 - c).abs())
            })
            .fold(0.0, f64::max);
        assert!(d * (n as f64).sqrt() < 1.95, "KS {}", d * (n as f64).sqrt());
        // Both tails beyond R (the tail path) and beyond 4.5, as often as they should be.
        for t in [ZIG_R, 4.5] {
            let seen = z.iter().filter(|x| x.abs() > t).count() as f64;
            let want = 2.0 * n as f64 * (1.0 - phi(t));
            assert!(
                (seen - want).abs() < 4.0 * want.sqrt() + 2.0,
                "|z| > {t}: {seen} vs {want}"
            );
        }
        // The tail's shape: mean excess over R is pdf(R)/Q(R) − R (≈ 0.25).
        let tail: Vec<f64> = z
            .iter()
            .filter(|x| x.abs() > ZIG_R)
            .map(|x| x.abs() - ZIG_R)
            .collect();
        let q = 1.0 - phi(ZIG_R);
        let want = (-0.5 * ZIG_R * ZIG_R).exp() / (2.0 * std::f64::consts::PI).sqrt() / q - ZIG_R;
        let mean = tail.iter().sum::<f64>() / tail.len() as f64;
        let sd = (tail.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / tail.len() as f64).sqrt();
        assert!(
            (mean - want).abs() < 5.0 * sd / (tail.len() as f64).sqrt(),
            "tail mean excess {mean} vs {want}"
        );
    }
}
