//! Counter-based privacy noise: the CPU twin of `kernels/dp_noise.cuh`, bit for bit.
//! Element i of a release reads ChaCha20 keyed by the release's key with nonce
//! (domain, i); the samplers are Canonne, Kamath & Steinke's exact integer algorithms.

use super::chacha::{self, LANES};
use sha2::{Digest, Sha256};

pub const DOMAIN_GAUSSIAN: u32 = 1;
pub const DOMAIN_LAPLACE: u32 = 2;
/// Proposals beyond this are rejected outright (acceptance below exp(-2^17)).
const MAX_ABS_NOISE: u64 = 1 << 40;

/// The 256-bit key of one release.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NoiseKey(pub [u8; 32]);

impl std::fmt::Debug for NoiseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NoiseKey(..)")
    }
}

impl NoiseKey {
    /// A fresh key from the operating system's CSPRNG.
    pub fn from_os() -> Result<Self, String> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| format!("no OS entropy: {e}"))?;
        Ok(Self(key))
    }

    /// A reproducible key, for servers started with the client-seed test flag.
    pub fn from_seed(seed: u64) -> Self {
        Self::derive(b"gpu-ops/dp/client-seed/v1", seed)
    }

    /// A reproducible key for one purpose (`label`), from a test seed: different labels
    /// give unrelated keys for the same seed.
    pub fn derive(label: &[u8], seed: u64) -> Self {
        let mut h = Sha256::new();
        h.update(label);
        h.update(seed.to_le_bytes());
        Self(h.finalize().into())
    }

    /// The key as the kernels take it: eight little-endian words.
    pub fn words(&self) -> [u32; 8] {
        std::array::from_fn(|i| u32::from_le_bytes(self.0[4 * i..4 * i + 4].try_into().unwrap()))
    }
}

/// The random bits of one element, consumed lowest bit first from 32-bit words: its
/// ChaCha20 keystream (`chacha`), block 0 first.
pub struct BitStream {
    key: [u32; 8],
    nonce: [u32; 3],
    /// The block `next_word` runs into once `block` is spent.
    counter: u32,
    block: [u32; 16],
    next_word: usize,
    buf: u64,
    avail: u32,
}

/// Calls `f(j, stream)` with the stream of element `first + j`, for j < count; the
/// streams' first blocks are computed `LANES` at a time. What bulk noise should use.
pub fn for_each_stream(
    key: &NoiseKey,
    domain: u32,
    first: u64,
    count: usize,
    mut f: impl FnMut(usize, &mut BitStream),
) {
    let words = key.words();
    for start in (0..count).step_by(LANES) {
        let base = first.wrapping_add(start as u64);
        let nonces: [[u32; 3]; LANES] =
            std::array::from_fn(|l| chacha::nonce(domain, base.wrapping_add(l as u64)));
        let blocks = chacha::blocks(&words, 0, &nonces);
        for (l, (block, nonce)) in blocks.into_iter().zip(nonces).enumerate() {
            if start + l == count {
                break;
            }
            f(start + l, &mut BitStream::starting(words, nonce, block));
        }
    }
}

impl BitStream {
    /// The stream of one element; its first block is computed when first read.
    pub fn new(key: &NoiseKey, domain: u32, index: u64) -> Self {
        Self {
            key: key.words(),
            nonce: chacha::nonce(domain, index),
            counter: 0,
            block: [0; 16],
            next_word: 16,
            buf: 0,
            avail: 0,
        }
    }

    /// A stream whose block 0 is already computed.
    fn starting(key: [u32; 8], nonce: [u32; 3], block0: [u32; 16]) -> Self {
        Self {
            key,
            nonce,
            counter: 1,
            block: block0,
            next_word: 0,
            buf: 0,
            avail: 0,
        }
    }

    fn next_word(&mut self) -> u32 {
        if self.next_word == 16 {
            self.block = chacha::block(&self.key, self.counter, self.nonce);
            self.counter = self.counter.wrapping_add(1);
            self.next_word = 0;
        }
        let w = self.block[self.next_word];
        self.next_word += 1;
        w
    }

    /// The next `k` bits, 1 <= k <= 32.
    fn take(&mut self, k: u32) -> u32 {
        if self.avail < k {
            self.buf |= u64::from(self.next_word()) << self.avail;
            self.avail += 32;
        }
        let r = (self.buf & ((1u64 << k) - 1)) as u32;
        self.buf >>= k;
        self.avail -= k;
        r
    }

    /// Uniform on 0..t, t >= 1.
    fn uniform(&mut self, t: u64) -> u64 {
        if t <= 1 {
            return 0;
        }
        let bits = 64 - (t - 1).leading_zeros();
        loop {
            let u = if bits <= 32 {
                u64::from(self.take(bits))
            } else {
                let lo = u64::from(self.take(32));
                lo | (u64::from(self.take(bits - 32)) << 32)
            };
            if u < t {
                return u;
            }
        }
    }

    /// Bernoulli(n/m), m < 2^127.
    fn bernoulli(&mut self, n: u128, m: u128) -> bool {
        if n >= m {
            return true;
        }
        if n == 0 {
            return false;
        }
        let mut rem = n;
        loop {
            rem <<= 1;
            let p_bit = rem >= m;
            if p_bit {
                rem -= m;
            }
            let u_bit = self.take(1) == 1;
            if u_bit != p_bit {
                return p_bit;
            }
            if rem == 0 {
                return false;
            }
        }
    }

    /// Bernoulli(exp(-n/m)) for n/m in [0, 1].
    fn bernoulli_exp_unit(&mut self, n: u128, m: u128) -> bool {
        let mut k = 1u64;
        while k < 64 && self.bernoulli(n, m * u128::from(k)) {
            k += 1;
        }
        k % 2 == 1
    }

    /// Bernoulli(exp(-n/m)): one Bernoulli(exp(-1)) per whole unit of n/m, then the
    /// fraction. The units are counted off by subtraction, not a 128-bit division (a
    /// library call, once per proposal): the same draws in the same order.
    fn bernoulli_exp(&mut self, n: u128, m: u128) -> bool {
        let mut rest = n;
        while rest >= m {
            if !self.bernoulli_exp_unit(1, 1) {
                return false;
            }
            rest -= m;
        }
        self.bernoulli_exp_unit(rest, m)
    }

    /// P(y) ∝ exp(-|y| / t).
    pub fn discrete_laplace(&mut self, t: u64) -> i64 {
        loop {
            let u = self.uniform(t);
            if !self.bernoulli_exp_unit(u128::from(u), u128::from(t)) {
                continue;
            }
            let mut v = 0u64;
            while self.bernoulli_exp_unit(1, 1) {
                v += 1;
            }
            let y = u + t * v;
            let negative = self.take(1) == 1;
            if negative && y == 0 {
                continue;
            }
            return if negative { -(y as i64) } else { y as i64 };
        }
    }

    /// P(y) ∝ exp(-y² / (2 t c)).
    pub fn discrete_gaussian(&mut self, t: u64, c: u64) -> i64 {
        let den = 2 * u128::from(t) * u128::from(c);
        loop {
            let y = self.discrete_laplace(t);
            let mag = y.unsigned_abs();
            if mag > MAX_ABS_NOISE {
                continue;
            }
            let diff = u128::from(mag.abs_diff(c));
            if self.bernoulli_exp(diff * diff, den) {
                return y;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(n: u64, f: impl Fn(&mut BitStream) -> i64 + Sync) -> Vec<i64> {
        use rayon::prelude::*;
        let key = NoiseKey::from_seed(42);
        (0..n)
            .into_par_iter()
            .map(|i| f(&mut BitStream::new(&key, DOMAIN_GAUSSIAN, i)))
            .collect()
    }

    fn mean_var(xs: &[i64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = xs.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var)
    }

    /// |observed − expected| within 5 standard errors of a proportion.
    fn assert_proportion(count: usize, n: usize, p: f64, what: &str) {
        let se = (p * (1.0 - p) / n as f64).sqrt();
        let got = count as f64 / n as f64;
        assert!(
            (got - p).abs() < 5.0 * se + 1e-12,
            "{what}: {got} vs {p} (se {se})"
        );
    }

    #[test]
    fn discrete_gaussian_moments_and_tails() {
        let n = 200_000usize;
        // sigma^2 = t c = 1_000_001 * 1_000_000 ≈ 1e12.
        let (t, c) = (1_000_001u64, 1_000_000u64);
        let xs = draws(n as u64, |b| b.discrete_gaussian(t, c));
        let sigma2 = (t * c) as f64;
        let (mean, var) = mean_var(&xs);
        assert!(mean.abs() < 5.0 * (sigma2 / n as f64).sqrt(), "mean {mean}");
        // Var of the sample variance is 2σ⁴/(n−1).
        assert!(
            (var - sigma2).abs() < 5.0 * sigma2 * (2.0 / n as f64).sqrt(),
            "var {var}"
        );
        let sigma = sigma2.sqrt();
        for (k, p) in [
            (1.0, 0.317_310_507_862_914_1),
            (2.0, 0.045_500_263_896_358_4),
            (3.0, 0.002_699_796_063_260_2),
        ] {
            let count = xs.iter().filter(|&&x| (x as f64).abs() > k * sigma).count();
            assert_proportion(count, n, p, &format!("P(|X| > {k}σ)"));
        }
    }

    #[test]
    fn discrete_gaussian_is_exact_at_small_scale() {
        // sigma^2 = 2: P(y) ∝ exp(-y²/4), checked value by value.
        let n = 200_000usize;
        let xs = draws(n as u64, |b| b.discrete_gaussian(1, 2));
        let w = |y: i64| (-(y * y) as f64 / 4.0).exp();
        let z: f64 = (-40..=40).map(w).sum();
        for y in -6..=6 {
            let count = xs.iter().filter(|&&x| x == y).count();
            assert_proportion(count, n, w(y) / z, &format!("P(Y = {y})"));
        }
    }

    #[test]
    fn discrete_laplace_is_exact() {
        for t in [1u64, 5, 1 << 20] {
            let n = 200_000usize;
            let xs = draws(n as u64, |b| b.discrete_laplace(t));
            let r = (-1.0 / t as f64).exp();
            // P(y) = (1 − r)/(1 + r) r^|y|; Var = 2r/(1 − r)².
            let p = |y: i64| (1.0 - r) / (1.0 + r) * r.powi(y.abs() as i32);
            let (mean, var) = mean_var(&xs);
            let want_var = 2.0 * r / (1.0 - r).powi(2);
            assert!(
                mean.abs() < 5.0 * (want_var / n as f64).sqrt(),
                "t={t} mean {mean}"
            );
            // Laplace kurtosis is 6: Var(s²) ≈ (κ − 1)σ⁴/n = 5σ⁴/n.
            assert!(
                (var - want_var).abs() < 5.0 * want_var * (5.0 / n as f64).sqrt(),
                "t={t} var {var}"
            );
            if t == 1 {
                for y in -4..=4 {
                    let count = xs.iter().filter(|&&x| x == y).count();
                    assert_proportion(count, n, p(y), &format!("t=1 P(Y = {y})"));
                }
            } else {
                // P(|Y| > k t) = 2 r^(k t + 1) / (1 + r).
                for k in [1u64, 3] {
                    let count = xs.iter().filter(|&&x| x.unsigned_abs() > k * t).count();
                    let want = 2.0 * r.powf((k * t + 1) as f64) / (1.0 + r);
                    assert_proportion(count, n, want, &format!("t={t} P(|Y| > {k}t)"));
                }
            }
        }
    }

    #[test]
    fn batched_streams_equal_streams_made_one_at_a_time() {
        // for_each_stream computes first blocks eight at a time: every count, including
        // none and partial last groups, and a start that is not a multiple of eight.
        let key = NoiseKey::from_seed(9);
        for count in 0..=17 {
            let mut got = Vec::new();
            for_each_stream(&key, DOMAIN_LAPLACE, 1000 + 3, count, |j, s| {
                got.push((j, s.discrete_laplace(1 << 20), s.take(32)));
            });
            let want: Vec<_> = (0..count)
                .map(|j| {
                    let mut s = BitStream::new(&key, DOMAIN_LAPLACE, 1003 + j as u64);
                    (j, s.discrete_laplace(1 << 20), s.take(32))
                })
                .collect();
            assert_eq!(got, want, "count {count}");
        }
    }

    #[test]
    fn streams_depend_on_key_domain_and_index_only() {
        let k = NoiseKey::from_seed(9);
        let a: Vec<i64> = (0..50)
            .map(|i| BitStream::new(&k, 1, i).discrete_laplace(1000))
            .collect();
        let b: Vec<i64> = (0..50)
            .map(|i| BitStream::new(&k, 1, i).discrete_laplace(1000))
            .collect();
        assert_eq!(a, b);
        let other: Vec<i64> = (0..50)
            .map(|i| BitStream::new(&k, 2, i).discrete_laplace(1000))
            .collect();
        assert_ne!(a, other);
        assert_ne!(NoiseKey::from_os().unwrap(), NoiseKey::from_os().unwrap());
    }
}
