//! RF features of complex baseband IQ, per chunk, aggregated over chunks. Every formula
//! is in docs/RF_FEATURES.md; the names below are the public column and field names.
//!
//! Units: an IQ sample's |x|² is taken as milliwatts (the generator writes samples so;
//! for real recordings the dBm figures are relative to the recorder's full scale).

use super::simd::avx2_dispatch;
use rayon::prelude::*;
use rustfft::num_complex::Complex32;
use serde::Serialize;
use std::f64::consts::PI;

/// Feature names, in the order of `ChunkFeatures`.
pub const FEATURE_NAMES: [&str; 18] = [
    "rssi_dbm",
    "noise_floor_dbm",
    "snr_db",
    "frequency_offset_hz",
    "bandwidth_hz",
    "psd_dbm_per_hz",
    "spectral_centroid_hz",
    "spectral_rolloff_hz",
    "envelope_mean",
    "envelope_std",
    "envelope_max",
    "peak_to_avg_ratio_db",
    "zero_crossing_rate",
    "multipath_delay_spread_us",
    "coherence_bandwidth_khz",
    "delay_spread_confidence",
    "confidence_score",
    "signal_present",
];

/// One chunk's features, indexed like `FEATURE_NAMES`.
pub type ChunkFeatures = [f64; 18];

mod agreement;
pub use agreement::{chunk_agrees, floor_allowance_db, stats_agree, FLOOR_FEATURES};

/// The index of feature `name` in `FEATURE_NAMES`.
pub fn feature_index(name: &str) -> usize {
    FEATURE_NAMES
        .iter()
        .position(|n| *n == name)
        .expect("a feature name")
}

/// Welch segments whose noise-only bins pass the detection threshold, per chunk, when
/// no signal is present: the false-alarm probability of `signal_present`.
pub const FALSE_ALARM: f64 = 1e-3;
/// Target frequency resolution of the PSD, Hz.
const RESOLUTION_HZ: f64 = 400.0;
/// Fewest Welch segments per chunk: fewer would make the noise floor estimate noisy.
const MIN_SEGMENTS: usize = 8;
/// Smallest chunk, samples.
pub const MIN_CHUNK_SAMPLES: usize = 128;
/// Power share that defines the occupied bandwidth (ITU-R SM.328's 99 %).
const OCCUPIED_SHARE: f64 = 0.99;
/// Spectral roll-off point.
const ROLLOFF_SHARE: f64 = 0.85;
/// In-band SNR (dB) at which `confidence_score` reaches 1.
const CONFIDENT_SNR_DB: f64 = 20.0;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExtractConfig {
    pub sample_rate_hz: f64,
    pub chunk_ms: f64,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ExtractError {
    #[error("{samples} samples make no chunk of at least {MIN_CHUNK_SAMPLES} samples")]
    TooShort { samples: usize },
    #[error("chunk_ms × sample_rate_hz gives {0} samples per chunk; at least {MIN_CHUNK_SAMPLES} are needed")]
    ChunkTooSmall(usize),
}

/// Per-chunk features and how they were computed.
#[derive(Clone, Debug)]
pub struct Extraction {
    pub chunks: Vec<ChunkFeatures>,
    pub samples_per_chunk: usize,
    /// Welch segment length (FFT size) and segments per chunk.
    pub segment_len: usize,
    pub segments: usize,
}

/// Mean, population standard deviation, min and max of one feature over the chunks.
/// JSON has no NaN or infinity: a value that is not finite is written `null` (a feature
/// undefined for the input, such as the spectral centroid of silence, or a power past
/// the f32 range).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Stats {
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, required))]
    pub mean: f64,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, required))]
    pub std: f64,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, required))]
    pub min: f64,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, required))]
    pub max: f64,
}

impl Extraction {
    /// Each feature's statistics over the chunks, in `FEATURE_NAMES` order.
    pub fn aggregate(&self) -> Vec<Stats> {
        (0..FEATURE_NAMES.len())
            .map(|f| stats(self.chunks.iter().map(|c| c[f])))
            .collect()
    }
}

pub fn stats(values: impl Iterator<Item = f64> + Clone) -> Stats {
    let n = values.clone().count().max(1) as f64;
    let mean = values.clone().sum::<f64>() / n;
    let var = values.clone().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    Stats {
        mean,
        std: var.sqrt(),
        min: values.clone().fold(f64::INFINITY, f64::min),
        max: values.fold(f64::NEG_INFINITY, f64::max),
    }
}

/// Samples per chunk and the Welch segment length for a configuration.
pub fn plan(cfg: &ExtractConfig, samples: usize) -> Result<(usize, usize), ExtractError> {
    let wanted = (cfg.sample_rate_hz * cfg.chunk_ms / 1e3).round() as usize;
    if wanted < MIN_CHUNK_SAMPLES {
        return Err(ExtractError::ChunkTooSmall(wanted));
    }
    // A recording shorter than one chunk is one (shorter) chunk.
    let chunk = wanted.min(samples);
    if chunk < MIN_CHUNK_SAMPLES {
        return Err(ExtractError::TooShort { samples });
    }
    let by_resolution = (cfg.sample_rate_hz / RESOLUTION_HZ).max(16.0) as usize;
    let by_segments = (chunk / MIN_SEGMENTS).max(16);
    let seg = prev_power_of_two(by_resolution.next_power_of_two().min(by_segments)).clamp(16, 8192);
    Ok((chunk, seg))
}

fn prev_power_of_two(n: usize) -> usize {
    if n.is_power_of_two() {
        n
    } else {
        n.next_power_of_two() / 2
    }
}

/// Features of every whole chunk of `iq` (a trailing part shorter than a chunk is left
/// out, unless the recording is shorter than one chunk).
pub fn extract(iq: &[Complex32], cfg: &ExtractConfig) -> Result<Extraction, ExtractError> {
    let (chunk, seg) = plan(cfg, iq.len())?;
    let fft = super::fft_plan(seg);
    let window = hann(seg);
    let sums: Vec<ChunkSums> = iq
        .par_chunks_exact(chunk)
        .map(|c| chunk_sums(c, &window, fft.as_ref()))
        .collect();
    Ok(Derivation::with_window(chunk, &window).extract(&sums, cfg.sample_rate_hz))
}

/// The features of chunks already reduced to their sums (`chunk_sums` here, or the
/// `rf_chunk_reduce` kernel), each of `chunk` samples with Welch segments of `seg`.
pub fn extract_from_sums(sums: &[ChunkSums], fs: f64, chunk: usize, seg: usize) -> Extraction {
    Derivation::new(chunk, seg).extract(sums, fs)
}

/// What deriving features from chunk sums needs besides the sums, for one shape of
/// chunk: the window's power and the detector's quantiles. Made once and used for every
/// recording of that shape (a dataset batch), it spares each one a window and two
/// quantile searches.
pub struct Derivation {
    chunk: usize,
    seg: usize,
    window_power: f64,
    detector: Detector,
}

impl Derivation {
    /// For chunks of `chunk` samples in Welch segments of `seg`.
    pub fn new(chunk: usize, seg: usize) -> Self {
        Self::with_window(chunk, &hann(seg))
    }

    fn with_window(chunk: usize, window: &[f32]) -> Self {
        let seg = window.len();
        Self {
            chunk,
            seg,
            window_power: window_power(window),
            detector: Detector::new(seg, chunk / seg),
        }
    }

    /// `extract_from_sums` for this shape.
    pub fn extract(&self, sums: &[ChunkSums], fs: f64) -> Extraction {
        let (chunk, seg) = (self.chunk, self.seg);
        Extraction {
            chunks: sums
                .iter()
                .map(|s| chunk_features(s, chunk, fs, self.window_power, &self.detector))
                .collect(),
            samples_per_chunk: chunk,
            segment_len: seg,
            segments: chunk / seg,
        }
    }
}

/// What a chunk reduces to before its features are derived: its time-domain sums, and
/// per FFT bin (natural order, bin 0 = DC) the sum over its Welch segments of |X|². The
/// heavy part of extraction; the rest reads only these seg + 4 numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkSums {
    pub power_sum: f64,
    pub magnitude_sum: f64,
    pub power_max: f64,
    /// Sign changes of the real part between consecutive samples.
    pub crossings: u64,
    pub bins: Vec<f64>,
    pub segments: usize,
}

/// A chunk's sums: `envelope` and the Welch sums of its whole Hann segments.
pub fn chunk_sums(x: &[Complex32], window: &[f32], fft: &dyn rustfft::Fft<f32>) -> ChunkSums {
    let env = envelope(x);
    let (bins, segments) = welch_sums(x, window, fft);
    ChunkSums {
        power_sum: env.power_sum,
        magnitude_sum: env.magnitude_sum,
        power_max: env.power_max,
        crossings: env.crossings as u64,
        bins,
        segments,
    }
}

/// The noise-only quantile factors a chunk's detector uses (they depend on the segment
/// length and count only, so they are computed once per extraction).
struct Detector {
    /// The lower quartile of a noise-only bin, in units of its mean.
    q25: f64,
    /// The level a noise-only bin passes with probability FALSE_ALARM / seg.
    alarm: f64,
}

impl Detector {
    fn new(seg: usize, k: usize) -> Self {
        Self {
            q25: gamma_mean_quantile(k, normal_upper_quantile(0.75)),
            alarm: gamma_mean_quantile(k, normal_upper_quantile(FALSE_ALARM / seg as f64)),
        }
    }
}

/// Periodic Hann window (the DFT-even form Welch's method uses), computed in f64.
pub fn hann(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (0.5 * (1.0 - (2.0 * PI * i as f64 / n as f64).cos())) as f32)
        .collect()
}

/// Welch PSD (mW/Hz) of non-overlapping Hann segments, ordered from −fs/2 to fs/2, and
/// the segment count.
pub fn welch_psd(
    x: &[Complex32],
    fs: f64,
    window: &[f32],
    fft: &dyn rustfft::Fft<f32>,
) -> (Vec<f64>, usize) {
    let (bins, k) = welch_sums(x, window, fft);
    (shifted_psd(&bins, k, fs, window_power(window)), k)
}

/// Σw² of a window (the Welch PSD's normalisation), in f64.
fn window_power(window: &[f32]) -> f64 {
    window.iter().map(|&w| f64::from(w) * f64::from(w)).sum()
}

/// Σ over the non-overlapping Hann segments of |FFT|², per bin in natural order. The
/// segments are transformed in f32, as the recording is (and as a GPU does): the
/// transform errs by about 2^-24·√log2 L of the segment's amplitude in every bin, far
/// under the noise floor of most recordings but not of a receiver 95 dB or more over it
/// (`floor_allowance_db`); the bins are summed in f64.
fn welch_sums(x: &[Complex32], window: &[f32], fft: &dyn rustfft::Fft<f32>) -> (Vec<f64>, usize) {
    let seg = window.len();
    let k = x.len() / seg;
    let mut acc = vec![0.0f64; seg];
    let mut buf = vec![Complex32::new(0.0, 0.0); seg];
    let mut scratch = vec![Complex32::new(0.0, 0.0); fft.get_inplace_scratch_len()];
    for s in 0..k {
        for ((b, v), w) in buf.iter_mut().zip(&x[s * seg..(s + 1) * seg]).zip(window) {
            *b = Complex32::new(v.re * w, v.im * w);
        }
        fft.process_with_scratch(&mut buf, &mut scratch);
        for (a, b) in acc.iter_mut().zip(&buf) {
            *a += f64::from(b.norm_sqr());
        }
    }
    (acc, k)
}

/// The PSD (mW/Hz) from Welch sums of k segments with window power u, fftshifted: bin
/// seg/2 (−fs/2) first.
fn shifted_psd(bins: &[f64], k: usize, fs: f64, u: f64) -> Vec<f64> {
    let seg = bins.len();
    let scale = 1.0 / (k as f64 * fs * u);
    (0..seg)
        .map(|i| bins[(i + seg / 2) % seg] * scale)
        .collect()
}

/// The p-quantile of the mean of k unit exponentials, Gamma(k, 1/k), by Wilson–Hilferty
/// (within 0.1 dB down to k = 1, far closer for the k ≥ 8 used here).
fn gamma_mean_quantile(k: usize, z: f64) -> f64 {
    let k = k as f64;
    let c = 1.0 - 1.0 / (9.0 * k) + z / (3.0 * k.sqrt());
    (c * c * c).max(0.0)
}

/// z with P(Z > z) = p for a standard normal, by bisection on erfc.
fn normal_upper_quantile(p: f64) -> f64 {
    let (mut lo, mut hi) = (-40.0f64, 40.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if 0.5 * libm::erfc(mid / std::f64::consts::SQRT_2) > p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

fn db(x: f64) -> f64 {
    10.0 * x.max(1e-30).log10()
}

/// A chunk's time-domain sums: Σ|x|², Σ|x|, max |x|² and the real part's sign changes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Envelope {
    power_sum: f64,
    magnitude_sum: f64,
    power_max: f64,
    crossings: usize,
}

avx2_dispatch! {
    fn envelope(x: &[Complex32]) -> Envelope => envelope_lanes;
}

/// `Envelope` in LANES interleaved lanes (summed pairwise at the end) so the additions do
/// not wait on one another. |x|² and |x| of a sample are f32, as the recording is; the
/// sums are f64.
#[inline(always)]
fn envelope_lanes(x: &[Complex32]) -> Envelope {
    const LANES: usize = 8;
    let (mut p, mut e, mut m) = ([0.0f64; LANES], [0.0f64; LANES], [0.0f32; LANES]);
    // |x|² first, then every lane's square root together, so both vectorise. A function
    // rather than a closure: `#[inline(always)]` keeps it inside the AVX2 build.
    #[inline(always)]
    fn add(c: &[Complex32], p: &mut [f64; LANES], e: &mut [f64; LANES], m: &mut [f32; LANES]) {
        let mut v = [0f32; LANES];
        for (v, c) in v.iter_mut().zip(c) {
            *v = c.re * c.re + c.im * c.im;
        }
        let r = v.map(f32::sqrt);
        for j in 0..c.len() {
            p[j] += f64::from(v[j]);
            e[j] += f64::from(r[j]);
            // Not f32::max: the recording is finite, and a plain comparison vectorises.
            m[j] = if v[j] > m[j] { v[j] } else { m[j] };
        }
    }
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        add(c, &mut p, &mut e, &mut m);
    }
    add(chunks.remainder(), &mut p, &mut e, &mut m);
    let pairwise =
        |a: [f64; LANES]| ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    let crossings = x
        .windows(2)
        .map(|w| usize::from((w[0].re >= 0.0) != (w[1].re >= 0.0)))
        .sum();
    Envelope {
        power_sum: pairwise(p),
        magnitude_sum: pairwise(e),
        power_max: f64::from(m.iter().copied().fold(0.0, f32::max)),
        crossings,
    }
}

fn chunk_features(
    sums: &ChunkSums,
    samples: usize,
    fs: f64,
    window_power: f64,
    detector: &Detector,
) -> ChunkFeatures {
    let n = samples as f64;
    let (p_total, p_max) = (sums.power_sum / n, sums.power_max);
    let env_mean = sums.magnitude_sum / n;
    let env_var = (p_total - env_mean * env_mean).max(0.0);
    let crossings = sums.crossings as f64 / (n - 1.0);

    let k = sums.segments;
    let psd = shifted_psd(&sums.bins, k, fs, window_power);
    let seg = psd.len();
    let df = fs / seg as f64;
    let freq = |i: usize| (i as f64 - (seg / 2) as f64) * df;

    // Noise floor: the lower quartile of the bins over the lower quartile of a noise-only
    // bin's distribution, unbiased while a signal covers under three quarters of the band.
    let mut order = psd.clone();
    let (_, q25, _) = order.select_nth_unstable_by(seg / 4, f64::total_cmp);
    let n0 = *q25 / detector.q25;

    // A bin holds signal when it passes the noise-only quantile at FALSE_ALARM / seg.
    let threshold = n0 * detector.alarm;
    let excess: Vec<f64> = psd
        .iter()
        .map(|&p| if p > threshold { p - n0 } else { 0.0 })
        .collect();
    let e_total: f64 = excess.iter().sum();
    let present = e_total > 0.0;

    let psd_sum: f64 = psd.iter().sum();
    let centroid = psd
        .iter()
        .enumerate()
        .map(|(i, p)| freq(i) * p)
        .sum::<f64>()
        / psd_sum;
    let rolloff = freq(cumulative_index(&psd, ROLLOFF_SHARE * psd_sum));

    let (offset, bandwidth, band_psd, inband_snr_db, lo, hi) = if present {
        let offset = excess
            .iter()
            .enumerate()
            .map(|(i, e)| freq(i) * e)
            .sum::<f64>()
            / e_total;
        let tail = (1.0 - OCCUPIED_SHARE) / 2.0;
        let lo = cumulative_index(&excess, tail * e_total);
        let hi = cumulative_index(&excess, (1.0 - tail) * e_total);
        let bins = (hi - lo + 1) as f64;
        let band_power: f64 = psd[lo..=hi].iter().sum::<f64>() * df;
        let noise = n0 * bins * df;
        let snr = db((band_power - noise).max(0.0) / noise);
        (offset, bins * df, band_power / (bins * df), snr, lo, hi)
    } else {
        (0.0, 0.0, n0, f64::NEG_INFINITY, 0, 0)
    };
    let (delay_spread_us, coherence_khz, delay_conf) = if present {
        coherence(&psd[lo..=hi], df, k)
    } else {
        (0.0, 0.0, 0.0)
    };
    let confidence = if present {
        (inband_snr_db / CONFIDENT_SNR_DB).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let noise_power = n0 * fs;
    [
        db(p_total),
        db(noise_power),
        db(p_total / noise_power),
        offset,
        bandwidth,
        db(band_psd),
        centroid,
        rolloff,
        env_mean,
        env_var.sqrt(),
        p_max.sqrt(),
        db(p_max / p_total),
        crossings,
        delay_spread_us,
        coherence_khz,
        delay_conf,
        confidence,
        f64::from(u8::from(present)),
    ]
}

/// First index where the running sum of `v` reaches `target`.
fn cumulative_index(v: &[f64], target: f64) -> usize {
    let mut acc = 0.0;
    for (i, x) in v.iter().enumerate() {
        acc += x;
        if acc >= target {
            return i;
        }
    }
    v.len() - 1
}

/// Coherence bandwidth from the frequency correlation of the occupied band's PSD (in dB):
/// the lag where the correlation of its structured part — variance beyond what k Welch
/// segments leave as estimation noise — first falls below 0.5. Delay spread by the
/// rule σ_τ ≈ 1 / (5·B_c). Returns (delay spread µs, B_c kHz, confidence); a band too
/// narrow (< 8 bins) or flat within its estimation noise gives B_c = the band (a lower
/// bound), σ_τ from it (an upper bound), and confidence 0.
fn coherence(band: &[f64], df: f64, k: usize) -> (f64, f64, f64) {
    let m = band.len();
    let bound = |bc: f64| (1e6 / (5.0 * bc), bc / 1e3, 0.0);
    if m < 8 {
        return bound(m as f64 * df);
    }
    let d: Vec<f64> = band.iter().map(|&p| db(p)).collect();
    let mean = d.iter().sum::<f64>() / m as f64;
    let autocov = |lag: usize| {
        (0..m - lag)
            .map(|i| (d[i] - mean) * (d[i + lag] - mean))
            .sum::<f64>()
            / (m - lag) as f64
    };
    // Variance of a k-segment Welch bin in dB: (10/ln 10)² · trigamma(k) ≈ 18.86 / k.
    let noise_var = (10.0 / std::f64::consts::LN_10).powi(2) / k as f64;
    let total_var = autocov(0);
    let structured = total_var - noise_var;
    if structured <= noise_var {
        return bound(m as f64 * df);
    }
    // Lags 1 and 2 share Hann main-lobe leakage with lag 0; start at 2.
    for lag in 2..m / 2 {
        let r = autocov(lag) / structured;
        if r < 0.5 {
            let bc = lag as f64 * df;
            let explained = structured / total_var;
            let inside = 1.0 - 2.0 * lag as f64 / m as f64;
            return (
                1e6 / (5.0 * bc),
                bc / 1e3,
                (explained * inside).clamp(0.0, 1.0),
            );
        }
    }
    bound(m as f64 * df)
}

#[cfg(test)]
mod tests;
