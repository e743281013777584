//! `SweepJob`: every (receive, transmit) beam pair over a batch of channels. The gain of
//! pair (r, t) on channel H is g = w_rᴴ·H·f_t, formed as X = H·Fᵀ (each transmit beam
//! through the channel) and G = conj(W)·X, two complex products per channel (gemm's on the
//! CPU). With an SNR, what the receiver measures is w_rᴴ(H·f_t + n), n ~ CN(0, σ²I) and
//! σ² = 10^(−SNR/10) (unit transmit power, and E|[H f]_i|² = 1 for the generated
//! channels): g plus σ‖w_r‖/√2 times sample r·K_t + t of the channel's noise stream, the
//! receiver noise of `rf::noise` (counter-based, the same bits on both backends). The
//! power is |g|², and the best pair the largest power (the lowest index on a tie).

use super::geometry::{beams_key, form_channels, frobenius, Array, ChannelSpec, DrawnPath};
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::ops::invalid::{FieldPath, Invalid};
use crate::ops::linalg::views::gemm_into;
use crate::ops::linalg::Dtype;
use crate::ops::rf::noise::Noise;
use crate::ops::rf::rng::{Purpose, Stream};
use gemm::{c64, Parallelism};
use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

/// Most beams in one codebook, and most complex values (beams × elements) in one.
pub const MAX_BEAMS: usize = 4096;
pub const MAX_CODEBOOK_VALUES: usize = 1 << 20;
/// Most oversampling of a DFT codebook.
pub const MAX_OVERSAMPLING: usize = 8;

/// Where the channels come from.
#[derive(Clone, Debug)]
pub enum Channels {
    /// Drawn from a seed: the spec, its paths, and their kernel words.
    Generated {
        spec: ChannelSpec,
        drawn: Vec<DrawnPath>,
        words: Vec<f64>,
    },
    /// Given: `[B, N_r, N_t]` complex, interleaved.
    Uploaded(Vec<f64>),
}

/// `[K, N]` complex (beam k is row k), interleaved.
#[derive(Clone, Debug)]
pub struct Codebook {
    pub beams: usize,
    pub values: Vec<f64>,
}

impl Codebook {
    pub fn new(values: Vec<f64>, elements: usize, at: FieldPath) -> Result<Self, Invalid> {
        let beams = values.len() / (2 * elements).max(1);
        if beams == 0 || beams * 2 * elements != values.len() {
            return Err(Invalid::new(
                at,
                format!("must be [K, {elements}, 2]: K beams of the array's {elements} elements"),
            ));
        }
        if beams > MAX_BEAMS || beams * elements > MAX_CODEBOOK_VALUES {
            return Err(Invalid::new(
                at,
                format!(
                    "at most {MAX_BEAMS} beams and {MAX_CODEBOOK_VALUES} complex values in a codebook"
                ),
            ));
        }
        Ok(Self { beams, values })
    }

    /// The array's DFT codebook.
    pub fn dft(array: Array, oversampling: usize, at: FieldPath) -> Result<Self, Invalid> {
        if oversampling == 0 || oversampling > MAX_OVERSAMPLING {
            return Err(Invalid::new(
                at.field("oversampling"),
                format!("from 1 to {MAX_OVERSAMPLING}"),
            ));
        }
        let beams = super::geometry::dft_beams(array, oversampling);
        if beams > MAX_BEAMS || beams * array.elements() > MAX_CODEBOOK_VALUES {
            return Err(Invalid::new(
                at.field("oversampling"),
                format!(
                    "{beams} beams of {} elements: over {MAX_BEAMS} beams or {MAX_CODEBOOK_VALUES} complex values",
                    array.elements()
                ),
            ));
        }
        Self::new(
            super::geometry::dft_codebook(array, oversampling),
            array.elements(),
            at,
        )
    }

    /// ‖beam k‖.
    pub fn norm(&self, k: usize) -> f64 {
        let n = self.values.len() / self.beams;
        frobenius(&self.values[k * n..][..n])
    }

    fn max_norm(&self) -> f64 {
        (0..self.beams).map(|k| self.norm(k)).fold(0.0, f64::max)
    }
}

/// σ/√2 of the measurement noise (0 without), σ² = 10^(−SNR/10).
fn sigma_over_root2(noise: Option<MeasurementNoise>) -> f64 {
    noise.map_or(0.0, |n| {
        10f64.powf(-n.snr_db / 20.0) * std::f64::consts::FRAC_1_SQRT_2
    })
}

/// A bound on ‖H_b‖_F: computed for uploaded channels; for generated ones every entry is
/// at most Σ|g_l|, so √(N_r·N_t)·Σ|g_l|.
fn channel_norm(channels: &Channels, per: usize, entries: usize, b: usize) -> f64 {
    match channels {
        Channels::Uploaded(h) => frobenius(&h[b * per..][..per]),
        Channels::Generated { spec, words, .. } => {
            spec.gain_sum(words, b) * (entries as f64).sqrt()
        }
    }
}

/// Measurement noise at an SNR, from its own seed.
#[derive(Clone, Copy, Debug)]
pub struct MeasurementNoise {
    pub snr_db: f64,
    pub seed: u64,
}

/// The best pair of one channel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BestPair {
    pub rx: usize,
    pub tx: usize,
    pub power: f64,
}

#[derive(Clone, Debug)]
pub struct Swept {
    pub best: Vec<BestPair>,
    /// `[B, K_r, K_t]` powers in the output dtype, when asked for.
    pub grid: Option<Vec<f64>>,
}

#[derive(Clone, Debug)]
pub struct SweepJob {
    pub channels: Channels,
    /// How many channels, and the first one's index (the noise stream of each).
    pub count: usize,
    pub first: u64,
    pub tx: Array,
    pub rx: Array,
    pub tx_book: Codebook,
    pub rx_book: Codebook,
    pub noise: Option<MeasurementNoise>,
    pub grid: bool,
    /// f32 or f64: what the powers are rounded to.
    pub output: Dtype,
    /// The codebooks' largest beam norms and the noise's largest term, computed once
    /// (every channel's tolerance reads them).
    norms: Norms,
}

#[derive(Clone, Copy, Debug)]
struct Norms {
    rx: f64,
    tx: f64,
    /// 15 standard deviations of the largest receive beam's noise (the receiver noise's
    /// tail reaches 10σ).
    noise: f64,
}

impl SweepJob {
    /// Checks that the codebooks fit the arrays and the noise is a finite SNR; `channels`
    /// already decoded (`Uploaded`: `count · N_r · N_t` complex values).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        channels: Channels,
        first: u64,
        tx: Array,
        rx: Array,
        tx_book: Codebook,
        rx_book: Codebook,
        noise: Option<MeasurementNoise>,
        grid: bool,
        output: Dtype,
    ) -> Result<Self, Invalid> {
        let root = FieldPath::root();
        let per = 2 * tx.elements() * rx.elements();
        let count = match &channels {
            Channels::Generated { spec, .. } => spec.count,
            Channels::Uploaded(h) => h.len() / per,
        };
        if let Channels::Uploaded(h) = &channels {
            if count == 0 || h.len() != count * per {
                return Err(Invalid::new(
                    root.field("channels"),
                    format!(
                        "must be [B, {}, {}, 2]: N_r × N_t complex values per channel",
                        rx.elements(),
                        tx.elements()
                    ),
                ));
            }
        }
        for (name, book, array) in [("tx_codebook", &tx_book, tx), ("rx_codebook", &rx_book, rx)] {
            if book.values.len() != 2 * book.beams * array.elements() {
                return Err(Invalid::new(
                    root.field(name),
                    format!("beams of {} elements, the array's", array.elements()),
                ));
            }
        }
        if let Some(n) = noise {
            if !(n.snr_db.is_finite() && n.snr_db.abs() <= 200.0) {
                return Err(Invalid::new(root.field("snr_db"), "from −200 to 200 dB"));
            }
        }
        let (rx_norm, tx_norm) = (rx_book.max_norm(), tx_book.max_norm());
        let norms = Norms {
            rx: rx_norm,
            tx: tx_norm,
            noise: match noise {
                Some(_) => 15.0 * sigma_over_root2(noise) * rx_norm,
                None => 0.0,
            },
        };
        // |g|² must stay finite in the output dtype: bound it before anything runs.
        let limit = (output.subnormal_step_and_max().1 / 4.0).sqrt();
        // A NaN (∞ times 0) counts as too big.
        let too_big = |b: usize| {
            let bound =
                channel_norm(&channels, per, tx.elements() * rx.elements(), b) * rx_norm * tx_norm
                    + norms.noise;
            bound.is_nan() || bound > limit
        };
        if let Some(b) = (0..count).find(|&b| too_big(b)) {
            let at = if norms.noise > limit / 2.0 {
                root.field("snr_db")
            } else if let Channels::Uploaded(_) = &channels {
                root.field("channels").index(b)
            } else if rx_norm >= tx_norm {
                root.field("rx_codebook")
            } else {
                root.field("tx_codebook")
            };
            return Err(Invalid::new(
                at,
                format!(
                    "‖w‖·‖H‖_F·‖f‖ plus the noise exceeds {limit:e} on channel {b}: the powers could overflow {}",
                    output.name()
                ),
            ));
        }
        Ok(Self {
            channels,
            count,
            first,
            tx,
            rx,
            tx_book,
            rx_book,
            noise,
            grid,
            output,
            norms,
        })
    }

    /// Device bytes per uploaded channel in a sweep pass: the channel, its projections
    /// through the transmit beams, its powers, its noise key and best pair. The launcher
    /// and `/device/batch_hint` size passes by it.
    pub fn device_bytes_per_channel(nr: usize, nt: usize, kr: usize, kt: usize) -> usize {
        8 * (2 * nr * nt + 2 * nr * kt + kr * kt + 3)
    }

    pub fn pairs(&self) -> usize {
        self.rx_book.beams * self.tx_book.beams
    }

    /// Each channel's noise stream key (what the kernel draws from), when noise is on.
    pub fn noise_keys(&self) -> Option<Vec<u64>> {
        let n = self.noise?;
        let key = beams_key(n.seed, b"noise");
        Some(
            (0..self.count as u64)
                .map(|b| Stream::new(key, self.first + b, 0, Purpose::Noise).key())
                .collect(),
        )
    }

    /// σ‖w_r‖/√2 per receive beam (zeros without noise).
    pub fn noise_scales(&self) -> Vec<f64> {
        let sigma = sigma_over_root2(self.noise);
        (0..self.rx_book.beams)
            .map(|r| sigma * self.rx_book.norm(r))
            .collect()
    }

    /// The channels, formed on the CPU when generated.
    fn cpu_channels(&self) -> std::borrow::Cow<'_, [f64]> {
        match &self.channels {
            Channels::Generated { spec, words, .. } => {
                form_channels(words, spec.paths, self.rx, self.tx).into()
            }
            Channels::Uploaded(h) => h.as_slice().into(),
        }
    }

    /// The CPU twin.
    pub fn run_cpu(&self) -> Swept {
        let h = self.cpu_channels();
        let (nr, nt) = (self.rx.elements(), self.tx.elements());
        let (kr, kt) = (self.rx_book.beams, self.tx_book.beams);
        let keys = self.noise_keys();
        let scales = self.noise_scales();
        let mut powers = vec![0.0; self.count * kr * kt];
        // Small channels: one thread each; large ones: every thread on one.
        let inner = if self.count >= 2 * rayon::current_num_threads() {
            Parallelism::None
        } else {
            Parallelism::Rayon(rayon::current_num_threads())
        };
        powers
            .par_chunks_mut(kr * kt)
            .enumerate()
            .for_each(|(b, p)| {
                let hb = complex_view(&h[2 * b * nr * nt..][..2 * nr * nt], nr, nt);
                let f = complex_view(&self.tx_book.values, kt, nt);
                let w = complex_view(&self.rx_book.values, kr, nr);
                let (zero, one) = (c64::new(0.0, 0.0), c64::new(1.0, 0.0));
                // X (nr × kt) = H · Fᵀ; G (kr × kt) = conj(W) · X.
                let mut x = Array2::from_elem((nr, kt), zero);
                gemm_into(x.view_mut(), hb, f.t(), one, None, false, inner);
                let mut g = Array2::from_elem((kr, kt), zero);
                gemm_into(g.view_mut(), w, x.view(), one, None, true, inner);
                let (g, _) = g.into_raw_vec_and_offset();
                let noise = keys.as_ref().map(|k| Noise(Stream::from_key(k[b])));
                for r in 0..kr {
                    for t in 0..kt {
                        let mut v = g[r * kt + t];
                        if let Some(n) = &noise {
                            let (a, c) = n.at((r * kt + t) as u64);
                            v.re += scales[r] * f64::from(a);
                            v.im += scales[r] * f64::from(c);
                        }
                        p[r * kt + t] = v.re * v.re + v.im * v.im;
                    }
                }
            });
        self.finish(powers)
    }

    /// Rounds the powers, picks each channel's best pair, and keeps the grid if asked.
    pub fn finish(&self, mut powers: Vec<f64>) -> Swept {
        if self.output != Dtype::F64 {
            powers
                .iter_mut()
                .for_each(|x| *x = self.output.round_f64(*x));
        }
        let kt = self.tx_book.beams;
        let best = powers
            .chunks(self.pairs())
            .map(|p| {
                let (k, power) =
                    p.iter()
                        .enumerate()
                        .fold((0, f64::NEG_INFINITY), |best, (k, &x)| {
                            if x > best.1 {
                                (k, x)
                            } else {
                                best
                            }
                        });
                BestPair {
                    rx: k / kt,
                    tx: k % kt,
                    power,
                }
            })
            .collect();
        Swept {
            best,
            grid: self.grid.then_some(powers),
        }
    }

    /// A bound on |g| for channel b (‖w‖·‖H_b‖_F·‖f‖ plus the noise's largest term: the
    /// receiver noise's tail reaches 10σ) and how far two correct backends' g may differ:
    /// each complex dot product of n terms within γ_{n+2} of Σ|a||b|, the two stages'
    /// bounds summed, the channels' own difference when generated, and the noise's add.
    fn gain_bounds(&self, h: &[f64], b: usize) -> (f64, f64) {
        let (nr, nt) = (self.rx.elements(), self.tx.elements());
        let hb = &h[2 * b * nr * nt..][..2 * nr * nt];
        let frob = frobenius(hb);
        let (w, f) = (self.norms.rx, self.norms.tx);
        let bound = w * frob * f + self.norms.noise;
        let gamma = |n: usize| (n + 2) as f64 * f64::EPSILON;
        let mut diff = 2.0 * (gamma(nt) + gamma(nr)) * w * frob * f + 4.0 * f64::EPSILON * bound;
        if let Channels::Generated { spec, words, .. } = &self.channels {
            // Each of the 2·N_r·N_t components within the forming's tolerance.
            diff += w * f * spec.formed_tolerance(words, b) * ((2 * nr * nt) as f64).sqrt();
        }
        (bound, diff)
    }

    /// How far two correct backends' powers of channel b may differ: |Δ|g|²| ≤ 2|g|δ + δ².
    pub fn power_tolerance(&self, h: &[f64], b: usize) -> f64 {
        let (bound, diff) = self.gain_bounds(h, b);
        2.0 * bound * diff + diff * diff
    }
}

impl Job for SweepJob {
    type Output = Swept;

    fn name(&self) -> &'static str {
        "beams_sweep"
    }

    fn size(&self) -> usize {
        self.count * self.pairs()
    }

    fn input_bytes(&self) -> usize {
        let channels = match &self.channels {
            Channels::Generated { words, .. } => words.len(),
            Channels::Uploaded(h) => h.len(),
        };
        8 * (channels + self.tx_book.values.len() + self.rx_book.values.len())
    }

    /// A pair costs the CPU about N_r complex products (and the channel's N_r·N_t per
    /// transmit beam): 2^16 pairs and up go to the device on `auto`.
    fn gpu_threshold(&self) -> usize {
        1 << 16
    }

    fn run_cpu(&self) -> Swept {
        SweepJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Swept, DeviceError> {
        super::gpu::launch_sweep(self, dev)
    }

    /// Powers within `power_tolerance` (plus the output's rounding); the device's best
    /// pair within that of the CPU's best power, since near-ties may break either way.
    fn agrees(&self, device: &Swept, cpu: &Swept) -> Result<(), String> {
        if device.best.len() != cpu.best.len() || device.grid.is_some() != cpu.grid.is_some() {
            return Err("the device answered a different shape".into());
        }
        let h = self.cpu_channels();
        let u = 2.0 * self.output.unit_roundoff();
        let pairs = self.pairs();
        for (b, (d, c)) in device.best.iter().zip(&cpu.best).enumerate() {
            let tol = self.power_tolerance(&h, b) + u * c.power;
            if (d.power - c.power).abs() > tol {
                return Err(format!(
                    "channel {b}: best power {} on the device, {} on the CPU (tolerance {tol:e})",
                    d.power, c.power
                ));
            }
            if let (Some(dg), Some(cg)) = (&device.grid, &cpu.grid) {
                let (dg, cg) = (&dg[b * pairs..][..pairs], &cg[b * pairs..][..pairs]);
                if d.rx >= self.rx_book.beams || d.tx >= self.tx_book.beams {
                    return Err(format!("channel {b}: no beam pair ({}, {})", d.rx, d.tx));
                }
                let picked = cg[d.rx * self.tx_book.beams + d.tx];
                if picked < c.power - 2.0 * tol {
                    return Err(format!(
                        "channel {b}: the device's best pair ({}, {}) has power {picked} on the CPU, whose best is {}",
                        d.rx, d.tx, c.power
                    ));
                }
                if let Some(k) = (0..pairs).find(|&k| (dg[k] - cg[k]).abs() > tol) {
                    return Err(format!(
                        "channel {b}, pair {k}: device {} against CPU {} (tolerance {tol:e})",
                        dg[k], cg[k]
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Complex values stored as interleaved f64 pairs, as a `rows × columns` view of c64
/// (two f64s, repr(C)): no copy.
fn complex_view(values: &[f64], rows: usize, columns: usize) -> ArrayView2<'_, c64> {
    let values: &[c64] = bytemuck::cast_slice(values);
    ArrayView2::from_shape((rows, columns), values).expect("the job checked the lengths")
}
