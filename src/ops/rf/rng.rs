//! Counter-based randomness for the synthetic datasets: every draw of sample n comes
//! from a stream keyed by (seed, n, receiver, purpose), so a dataset does not depend on
//! thread count, batch size, backend, or where a job resumed. Draw k of a stream is
//! SplitMix64's finaliser over (stream key + k·γ): a pure function of its coordinates that
//! a GPU thread computes as cheaply as a CPU (the same construction as SplitMix64's
//! sequence, which passes BigCrush). Normals by the polar method.

use sha2::{Digest, Sha256};

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
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Two independent standard normals (Marsaglia's polar method: no trigonometry;
    /// accepts π/4 of the draws).
    pub fn normal_pair(&mut self) -> (f64, f64) {
        loop {
            let u = 2.0 * self.uniform() - 1.0;
            let v = 2.0 * self.uniform() - 1.0;
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                let m = (-2.0 * s.ln() / s).sqrt();
                return (u * m, v * m);
            }
        }
    }

    pub fn normal(&mut self) -> f64 {
        self.normal_pair().0
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
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            counts[s.pick(&[1.0, 0.0, 2.0])] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!((counts[2] as f64 / counts[0] as f64 - 2.0).abs() < 0.1);
    }
}
