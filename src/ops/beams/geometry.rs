//! Arrays, directions and the multipath draw. Elements sit half a wavelength apart on a
//! `rows × columns` grid (a uniform linear array is one row); element e = row·columns +
//! column. Toward azimuth φ and elevation θ its phase is π·(column·h + row·v) with
//! spatial frequencies h = sin φ·cos θ and v = sin θ, so a linear array sees π·n·sin φ
//! in the horizontal plane.
//!
//! A channel of L paths is H[i, j] = Σ_l g_l·e^{jπ·p_rx(i)}·e^{−jπ·p_tx(j)} with
//! g_l = α_l/√L and α_l ~ CN(0, 1): the usual √(N_r·N_t/L)·Σ α_l·a_r·a_tᴴ with unit-norm
//! steering vectors, so E‖H‖²_F = N_r·N_t. Path l of channel c draws its angles and gain
//! from the counter-based stream keyed by (seed, c), draws 8l … 8l + 5, so channel c is the
//! same whatever batch it came in, whichever backend formed it.

use crate::ops::invalid::{FieldPath, Invalid};
use crate::ops::rf::rng::{Purpose, Stream};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

/// Most elements in one array.
pub const MAX_ELEMENTS: usize = 1024;
/// Most paths in one channel.
pub const MAX_PATHS: usize = 64;
/// Words per drawn path as the kernels read them: gain (re, im) over √L, then the
/// departure's (h, v) and the arrival's (h, v).
pub const PATH_WORDS: usize = 6;

/// A planar grid of elements at half a wavelength; one row is a uniform linear array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Array {
    pub rows: usize,
    pub columns: usize,
}

impl Array {
    pub fn new(rows: usize, columns: usize, at: FieldPath) -> Result<Self, Invalid> {
        if rows == 0 || columns == 0 || rows.saturating_mul(columns) > MAX_ELEMENTS {
            return Err(Invalid::new(
                at,
                format!("rows and columns at least 1, at most {MAX_ELEMENTS} elements"),
            ));
        }
        Ok(Self { rows, columns })
    }

    pub fn elements(&self) -> usize {
        self.rows * self.columns
    }

    /// Element e's phase toward spatial frequencies (h, v), in units of π.
    #[inline]
    pub fn phase(&self, e: usize, h: f64, v: f64) -> f64 {
        (e % self.columns) as f64 * h + (e / self.columns) as f64 * v
    }

    /// The largest |phase| any direction gives an element (|h|, |v| ≤ 1).
    pub fn max_phase(&self) -> f64 {
        (self.columns - 1 + self.rows - 1) as f64
    }
}

/// e^{jπx} as (cos, sin).
#[inline]
pub fn phasor(x: f64) -> (f64, f64) {
    let (s, c) = (std::f64::consts::PI * x).sin_cos();
    (c, s)
}

/// A direction's spatial frequencies (h, v) from degrees.
pub fn spatial(azimuth_deg: f64, elevation_deg: f64) -> (f64, f64) {
    let (az, el) = (azimuth_deg.to_radians(), elevation_deg.to_radians());
    (az.sin() * el.cos(), el.sin())
}

/// One drawn path, as the answer reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DrawnPath {
    /// α (before the 1/√L).
    pub gain: (f64, f64),
    pub departure_deg: (f64, f64),
    pub arrival_deg: (f64, f64),
}

/// What a generated batch of channels is: arrays, paths, angle ranges and where in the
/// seed's sequence of channels the batch starts.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelSpec {
    pub tx: Array,
    pub rx: Array,
    pub paths: usize,
    /// Azimuth and elevation ranges (degrees), shared by departures and arrivals.
    pub azimuth_deg: (f64, f64),
    pub elevation_deg: (f64, f64),
    pub seed: u64,
    pub first: u64,
    pub count: usize,
}

/// The 64-bit key of a seed's channels or noise (hashed, so nearby seeds share nothing).
pub fn beams_key(seed: u64, purpose: &[u8]) -> u64 {
    let mut h = Sha256::new();
    h.update(b"gpu-ops/beams/v1/");
    h.update(purpose);
    h.update(seed.to_le_bytes());
    u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

fn unit(d: u64) -> f64 {
    (d >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl ChannelSpec {
    /// Checks the counts and ranges; `root` is where the spec sits in the request.
    pub fn validate(&self, root: &FieldPath) -> Result<(), Invalid> {
        if self.paths == 0 || self.paths > MAX_PATHS {
            return Err(Invalid::new(
                root.field("paths"),
                format!("from 1 to {MAX_PATHS}"),
            ));
        }
        for (name, (lo, hi)) in [
            ("azimuth_deg", self.azimuth_deg),
            ("elevation_deg", self.elevation_deg),
        ] {
            if !(lo.is_finite() && hi.is_finite() && -90.0 <= lo && lo <= hi && hi <= 90.0) {
                return Err(Invalid::new(
                    root.field(name),
                    "[low, high] with −90 ≤ low ≤ high ≤ 90",
                ));
            }
        }
        if self.first.checked_add(self.count as u64).is_none() {
            return Err(Invalid::new(
                root.field("first_channel"),
                "first_channel + batch must stay below 2^64",
            ));
        }
        Ok(())
    }

    fn angle(&self, range: (f64, f64), d: u64) -> f64 {
        range.0 + (range.1 - range.0) * unit(d)
    }

    /// Every path of every channel, channel-major.
    pub fn draw(&self) -> Vec<DrawnPath> {
        let key = beams_key(self.seed, b"channels");
        let mut out = vec![
            DrawnPath {
                gain: (0.0, 0.0),
                departure_deg: (0.0, 0.0),
                arrival_deg: (0.0, 0.0),
            };
            self.count * self.paths
        ];
        out.par_chunks_mut(self.paths)
            .enumerate()
            .with_min_len(64)
            .for_each(|(b, paths)| {
                let s = Stream::new(key, self.first + b as u64, 0, Purpose::Multipath);
                for (l, p) in paths.iter_mut().enumerate() {
                    let k = 8 * l as u64;
                    let half = std::f64::consts::FRAC_1_SQRT_2;
                    *p = DrawnPath {
                        departure_deg: (
                            self.angle(self.azimuth_deg, s.at(k)),
                            self.angle(self.elevation_deg, s.at(k + 1)),
                        ),
                        arrival_deg: (
                            self.angle(self.azimuth_deg, s.at(k + 2)),
                            self.angle(self.elevation_deg, s.at(k + 3)),
                        ),
                        gain: (s.normal_at(k + 4) * half, s.normal_at(k + 5) * half),
                    };
                }
            });
        out
    }

    /// The drawn paths as the kernels and the CPU twin read them (`PATH_WORDS` each).
    pub fn path_words(&self, drawn: &[DrawnPath]) -> Vec<f64> {
        let norm = 1.0 / (self.paths as f64).sqrt();
        drawn
            .iter()
            .flat_map(|p| {
                let (th, tv) = spatial(p.departure_deg.0, p.departure_deg.1);
                let (rh, rv) = spatial(p.arrival_deg.0, p.arrival_deg.1);
                [p.gain.0 * norm, p.gain.1 * norm, th, tv, rh, rv]
            })
            .collect()
    }

    /// Complex values per channel.
    pub fn channel_len(&self) -> usize {
        self.rx.elements() * self.tx.elements()
    }

    /// Σ|g_l| over channel b's paths (`words` as `path_words` gave them): no entry of the
    /// channel is larger.
    pub fn gain_sum(&self, words: &[f64], b: usize) -> f64 {
        let per = PATH_WORDS * self.paths;
        words[b * per..][..per]
            .chunks(PATH_WORDS)
            .map(|p| p[0].hypot(p[1]))
            .sum()
    }

    /// How far two correct formings of channel b may differ in one component: each phasor
    /// of phase πx is within (π|x| + 2)·ε of exact (the rounding of πx, and sin/cos
    /// within an ulp), each product and the L-term sum add (L + 4)·ε of Σ|g_l|; twice
    /// that between two backends.
    pub fn formed_tolerance(&self, words: &[f64], b: usize) -> f64 {
        let phase = self.rx.max_phase().max(self.tx.max_phase());
        2.0 * self.gain_sum(words, b)
            * f64::EPSILON
            * (std::f64::consts::PI * phase + self.paths as f64 + 8.0)
    }
}

/// √(Σ x²): a channel's Frobenius norm, or a beam's norm, from interleaved values.
pub fn frobenius(values: &[f64]) -> f64 {
    values.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// Channels formed from path words (`PATH_WORDS` per path, `paths` per channel):
/// `[count, N_r, N_t]` complex, interleaved. The phasors of each path first (the arrival's
/// times the gain, and the departure's), then H[i, j] = Σ_l r_l[i]·conj(t_l[j]) in path
/// order, as `beam_channels_f64` sums them.
pub fn form_channels(words: &[f64], paths: usize, rx: Array, tx: Array) -> Vec<f64> {
    let (nr, nt) = (rx.elements(), tx.elements());
    let count = words.len() / (PATH_WORDS * paths);
    let mut out = vec![0.0; count * nr * nt * 2];
    out.par_chunks_mut(nr * nt * 2)
        .zip(words.par_chunks(PATH_WORDS * paths))
        .for_each(|(h, w)| {
            let mut r = vec![(0.0, 0.0); paths * nr];
            let mut t = vec![(0.0, 0.0); paths * nt];
            for l in 0..paths {
                let p = &w[l * PATH_WORDS..][..PATH_WORDS];
                for i in 0..nr {
                    let (c, s) = phasor(rx.phase(i, p[4], p[5]));
                    r[l * nr + i] = (p[0] * c - p[1] * s, p[0] * s + p[1] * c);
                }
                for j in 0..nt {
                    t[l * nt + j] = phasor(tx.phase(j, p[2], p[3]));
                }
            }
            for i in 0..nr {
                for j in 0..nt {
                    let (mut re, mut im) = (0.0, 0.0);
                    for l in 0..paths {
                        let (a, b) = r[l * nr + i];
                        let (c, d) = t[l * nt + j];
                        re += a * c + b * d;
                        im += b * c - a * d;
                    }
                    h[2 * (i * nt + j)] = re;
                    h[2 * (i * nt + j) + 1] = im;
                }
            }
        });
    out
}

/// The DFT codebook of an array: beams on the grid h = −1 + 2k/K_c (K_c = oversampling ×
/// columns) by v = −1 + 2k/K_r (K_r = oversampling × rows, or 1 for one row), beam
/// (k_r, k_c) at index k_r·K_c + k_c, each unit-norm. `[K, N]` complex, interleaved.
pub fn dft_codebook(array: Array, oversampling: usize) -> Vec<f64> {
    let (kr, kc) = dft_grid(array, oversampling);
    let n = array.elements();
    let norm = 1.0 / (n as f64).sqrt();
    let mut out = Vec::with_capacity(kr * kc * n * 2);
    for a in 0..kr {
        let v = if kr == 1 {
            0.0
        } else {
            -1.0 + 2.0 * a as f64 / kr as f64
        };
        for b in 0..kc {
            let h = -1.0 + 2.0 * b as f64 / kc as f64;
            for e in 0..n {
                let (c, s) = phasor(array.phase(e, h, v));
                out.push(c * norm);
                out.push(s * norm);
            }
        }
    }
    out
}

/// Beams in an array's DFT codebook.
pub fn dft_beams(array: Array, oversampling: usize) -> usize {
    let (kr, kc) = dft_grid(array, oversampling);
    kr * kc
}

/// The DFT grid's (row, column) beam counts: oversampling × elements on an axis of more
/// than one element, one beam on an axis of one.
fn dft_grid(array: Array, oversampling: usize) -> (usize, usize) {
    let grid = |n: usize| if n == 1 { 1 } else { n * oversampling };
    (grid(array.rows), grid(array.columns))
}
