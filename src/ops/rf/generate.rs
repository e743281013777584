//! One synthetic sample: a transmitter heard by R receivers, one IQ recording each. The
//! model is in docs/RF_DATASETS.md; every random draw reads the counter-based stream of
//! (dataset, sample, receiver, purpose) (`rng.rs`).

use super::multipath::{lead_for, Channel, Fir, Padded};
use super::noise::Noise;
use super::rng::{Purpose, Stream};
use super::scenario::{Scenario, Site};
use super::simd::avx2_dispatch;
use super::waveform::WaveSpec;
use rustfft::num_complex::{Complex, Complex32};
use serde::Serialize;
use std::f64::consts::PI;

/// Which generator made a dataset: bumped whenever the same seed would give different
/// bits. 2 (2026-11-23): receiver noise from one draw per complex sample in f32, the
/// rotation in lanes, FM phasors by `sincos::polar`, and features from f32 Welch
/// transforms. 3: receiver noise by Box–Muller in f32 (`noise`) instead of the
/// ziggurat, about 3.5× cheaper in lanes. 4: the voice table's and the DTMF tones' sines
/// by the vectorised `sincos::polar` instead of libm per value (last-bit differences).
/// Recorded in the Parquet file's key-value metadata
/// (`gpu_ops.generator_version`) and in a job's checkpoint, which refuses a resume
/// across versions.
pub const GENERATOR_VERSION: u32 = 4;

const EARTH_RADIUS_M: f64 = 6_371_008.8;
/// Thermal noise density at 290 K, dBm/Hz.
const KTB_DBM_PER_HZ: f64 = -174.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Modulation {
    FmVoice,
    FmTone,
    FmDtmf,
    Am,
    Carrier,
}

impl Modulation {
    pub const ALL: [Modulation; 5] = [
        Modulation::FmVoice,
        Modulation::FmTone,
        Modulation::FmDtmf,
        Modulation::Am,
        Modulation::Carrier,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Modulation::FmVoice => "fm_voice",
            Modulation::FmTone => "fm_tone",
            Modulation::FmDtmf => "fm_dtmf",
            Modulation::Am => "am",
            Modulation::Carrier => "carrier",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TxTruth {
    pub lat: f64,
    pub lon: f64,
    pub alt_m: f64,
    /// Transmit power after this sample's fluctuation, dBm.
    pub power_dbm: f64,
    pub modulation: Modulation,
    /// Whether it was placed inside the receivers' bounding box.
    pub inside: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RxTruth {
    pub lat: f64,
    pub lon: f64,
    pub alt_m: f64,
    /// East and north of the transmitter, m.
    pub east_m: f64,
    pub north_m: f64,
    pub distance_m: f64,
    /// Free-space, environment and terrain loss, dB.
    pub path_loss_db: f64,
    pub shadowing_db: f64,
    /// Mean received power before fast fading, dBm.
    pub received_power_dbm: f64,
    /// Rician K-factor, dB; −∞ (serialised as null) for Rayleigh.
    pub k_factor_db: f64,
    pub carrier_offset_hz: f64,
    pub drift_hz_per_s: f64,
    pub taps: usize,
    pub rms_delay_spread_us: f64,
    pub noise_floor_dbm: f64,
}

pub struct GeneratedSample {
    pub tx: TxTruth,
    pub receivers: Vec<RxTruth>,
    /// One recording per receiver, `signal.sample_rate_hz × duration` samples.
    pub iq: Vec<Vec<Complex32>>,
}

pub fn samples_per_recording(s: &Scenario) -> usize {
    (s.signal.sample_rate_hz * s.signal.duration_ms / 1e3).round() as usize
}

/// Noise power over the sample rate, dBm.
pub fn noise_floor_dbm(s: &Scenario) -> f64 {
    KTB_DBM_PER_HZ + s.receiver.noise_figure_db + 10.0 * s.signal.sample_rate_hz.log10()
}

/// Everything one receiver's recording needs besides the transmitted waveform. The CPU
/// loop (`receive`) and the `rf_receive` kernel compute the recording from this.
pub struct ReceiverPlan {
    pub channel: Channel,
    /// Fading gain × amplitude for each coherence block.
    pub gains: Vec<Complex<f64>>,
    /// Samples per coherence block.
    pub block: usize,
    pub carrier_offset_hz: f64,
    pub drift_hz_per_s: f64,
    pub sample_rate_hz: f64,
    /// Per I and Q.
    pub noise_sigma: f64,
    pub noise: Noise,
}

/// Sample `n` up to its recordings: the truth, the transmitted waveform (by default
/// synthesised and padded for the channels' delays; a `WaveDraft` before synthesis) and
/// each receiver's plan.
pub struct SamplePlan<W = Padded> {
    pub tx: TxTruth,
    pub receivers: Vec<RxTruth>,
    pub wave: W,
    pub plans: Vec<ReceiverPlan>,
}

/// A transmitted waveform not yet synthesised, and the lead its padding needs.
pub struct WaveDraft {
    pub spec: WaveSpec,
    pub lead: usize,
}

impl SamplePlan<WaveDraft> {
    /// The plan with its waveform synthesised on the CPU and padded.
    pub fn synthesized(self) -> SamplePlan {
        SamplePlan {
            wave: Padded::new(&self.wave.spec.synthesize(), self.wave.lead),
            tx: self.tx,
            receivers: self.receivers,
            plans: self.plans,
        }
    }
}

/// Sample `n` of the dataset keyed `key` (`rng::dataset_key`).
pub fn generate(s: &Scenario, key: u64, n: u64) -> GeneratedSample {
    let plan = plan(s, key, n);
    let iq = plan.plans.iter().map(|p| receive(p, &plan.wave)).collect();
    GeneratedSample {
        tx: plan.tx,
        receivers: plan.receivers,
        iq,
    }
}

/// Every random draw of sample `n` but the noise, which `receive` reads by index, with
/// the waveform synthesised.
pub fn plan(s: &Scenario, key: u64, n: u64) -> SamplePlan {
    draft(s, key, n).synthesized()
}

/// Every random draw of sample `n` but the noise; the waveform left to synthesise (on
/// the CPU by `SamplePlan::synthesized`, on a device by `rf_waveform`).
pub fn draft(s: &Scenario, key: u64, n: u64) -> SamplePlan<WaveDraft> {
    let (sites, tx_site, inside) = place(s, &mut Stream::new(key, n, 0, Purpose::Geometry));
    let mut prop = Stream::new(key, n, 0, Purpose::Propagation);
    let tx_power = s.propagation.tx_power_dbm + s.propagation.tx_power_std_db * prop.normal();
    let mut wave_rng = Stream::new(key, n, 0, Purpose::Waveform);
    let modulation = Modulation::ALL[wave_rng.pick(&mix_weights(s))];
    let len = samples_per_recording(s);
    let spec = WaveSpec::draw(s, modulation, len, &mut wave_rng);
    let fs = s.signal.sample_rate_hz;
    let floor = noise_floor_dbm(s);
    let mut receivers = Vec::with_capacity(sites.len());
    let mut plans = Vec::with_capacity(sites.len());
    for (r, site) in sites.iter().enumerate() {
        let rx = r as u16 + 1;
        let truth = propagate(s, key, n, rx, site, &tx_site, tx_power, floor);
        let taps = taps(s, &mut Stream::new(key, n, rx, Purpose::Multipath));
        let channel = Channel::new(
            &taps
                .iter()
                .map(|(tau, g)| (tau * fs, *g))
                .collect::<Vec<_>>(),
        );
        plans.push(receiver_plan(s, key, n, rx, channel, &truth, len));
        receivers.push(RxTruth {
            taps: taps.len(),
            rms_delay_spread_us: rms_delay_spread_us(&taps),
            ..truth
        });
    }
    let reach = plans.iter().map(|p| p.channel.reach()).max().unwrap_or(0);
    SamplePlan {
        tx: TxTruth {
            lat: tx_site.lat,
            lon: tx_site.lon,
            alt_m: tx_site.alt_m,
            power_dbm: tx_power,
            modulation,
            inside,
        },
        receivers,
        wave: WaveDraft {
            spec,
            lead: lead_for(reach.max(0) as f64),
        },
        plans,
    }
}

fn mix_weights(s: &Scenario) -> [f64; 5] {
    let m = &s.signal.mix;
    [m.fm_voice, m.fm_tone, m.fm_dtmf, m.am, m.carrier]
}

/// Receiver sites and the transmitter's.
fn place(s: &Scenario, g: &mut Stream) -> (Vec<Site>, Site, bool) {
    let geo = &s.geometry;
    let sites: Vec<Site> = if geo.receivers.is_empty() {
        let span = (geo.receivers_max - geo.receivers_min + 1) as f64;
        let count = geo.receivers_min
            + ((g.uniform() * span) as usize).min(geo.receivers_max - geo.receivers_min);
        (0..count)
            .map(|_| Site {
                lat: g.range(geo.lat_min, geo.lat_max),
                lon: g.range(geo.lon_min, geo.lon_max),
                alt_m: geo.receiver_alt_m,
            })
            .collect()
    } else {
        geo.receivers.clone()
    };
    let lat_lo = sites.iter().map(|p| p.lat).fold(f64::INFINITY, f64::min);
    let lat_hi = sites
        .iter()
        .map(|p| p.lat)
        .fold(f64::NEG_INFINITY, f64::max);
    let lon_lo = sites.iter().map(|p| p.lon).fold(f64::INFINITY, f64::min);
    let lon_hi = sites
        .iter()
        .map(|p| p.lon)
        .fold(f64::NEG_INFINITY, f64::max);
    let inside = g.uniform() < geo.inside_ratio;
    let m = if inside { 0.0 } else { geo.outside_margin_deg };
    let tx = Site {
        lat: g.range(lat_lo - m, lat_hi + m).clamp(-89.0, 89.0),
        lon: g.range(lon_lo - m, lon_hi + m),
        alt_m: geo.transmitter_alt_m,
    };
    (sites, tx, inside)
}

/// East and north of `origin`, m (equirectangular about the origin's latitude).
pub fn local_xy(p: &Site, origin: &Site) -> (f64, f64) {
    let k = EARTH_RADIUS_M * PI / 180.0;
    (
        k * origin.lat.to_radians().cos() * (p.lon - origin.lon),
        k * (p.lat - origin.lat),
    )
}

#[allow(clippy::too_many_arguments)]
fn propagate(
    s: &Scenario,
    key: u64,
    n: u64,
    rx: u16,
    site: &Site,
    tx: &Site,
    tx_power: f64,
    floor: f64,
) -> RxTruth {
    let p = &s.propagation;
    let mut r = Stream::new(key, n, rx, Purpose::Propagation);
    let (east, north) = local_xy(site, tx);
    let d = (east * east + north * north + (site.alt_m - tx.alt_m).powi(2))
        .sqrt()
        .max(1.0);
    let fspl = 20.0 * (d / 1e3).log10() + 20.0 * p.frequency_mhz.log10() + 32.44;
    let environment = 10.0 * (p.environment.exponent() - 2.0) * (d.max(100.0) / 100.0).log10();
    let terrain = r.uniform() * p.terrain_loss_max_db * (d / 10e3).min(1.0);
    let shadowing = p.shadowing_std_db * r.normal();
    let loss = fspl + environment + terrain;
    let d_km = d / 1e3;
    let k_factor_db = if d_km >= p.rayleigh_beyond_km {
        f64::NEG_INFINITY
    } else {
        p.k_factor_db - p.k_factor_slope_db_per_km * d_km
    };
    let mut osc = Stream::new(key, n, rx, Purpose::Oscillator);
    let carrier_hz = p.frequency_mhz * 1e6;
    RxTruth {
        lat: site.lat,
        lon: site.lon,
        alt_m: site.alt_m,
        east_m: east,
        north_m: north,
        distance_m: d,
        path_loss_db: loss,
        shadowing_db: shadowing,
        received_power_dbm: tx_power + p.tx_antenna_gain_dbi + p.rx_antenna_gain_dbi
            - loss
            - shadowing,
        k_factor_db,
        carrier_offset_hz: s.receiver.oscillator_ppm_std * 1e-6 * carrier_hz * osc.normal(),
        drift_hz_per_s: s.receiver.drift_ppm_per_s_std * 1e-6 * carrier_hz * osc.normal(),
        taps: 0,
        rms_delay_spread_us: 0.0,
        noise_floor_dbm: floor,
    }
}

/// (delay s, complex gain): the first arrival at 0 and the extra taps, total power 1.
fn taps(s: &Scenario, m: &mut Stream) -> Vec<(f64, Complex<f64>)> {
    let p = &s.propagation;
    let extra = ((m.uniform() * (p.max_extra_taps + 1) as f64) as usize).min(p.max_extra_taps);
    let mean_us = p.environment.mean_delay_us();
    let mut taps = vec![(0.0, Complex::new(1.0, 0.0))];
    for _ in 0..extra {
        let delay_us = -mean_us * (1.0 - m.uniform()).ln();
        let power = 10f64.powf(-p.tap_decay_db_per_us * delay_us / 10.0) * m.range(0.1, 1.0);
        let phase = 2.0 * PI * m.uniform();
        taps.push((delay_us * 1e-6, Complex::from_polar(power.sqrt(), phase)));
    }
    let total: f64 = taps.iter().map(|t| t.1.norm_sqr()).sum();
    for t in &mut taps {
        t.1 /= total.sqrt();
    }
    taps
}

fn rms_delay_spread_us(taps: &[(f64, Complex<f64>)]) -> f64 {
    let p: f64 = taps.iter().map(|t| t.1.norm_sqr()).sum();
    let mean = taps.iter().map(|t| t.0 * t.1.norm_sqr()).sum::<f64>() / p;
    let m2 = taps.iter().map(|t| t.0 * t.0 * t.1.norm_sqr()).sum::<f64>() / p;
    (m2 - mean * mean).max(0.0).sqrt() * 1e6
}

/// Fading per coherence block, power, oscillator and noise parameters of one receiver.
fn receiver_plan(
    s: &Scenario,
    key: u64,
    n: u64,
    rx: u16,
    channel: Channel,
    truth: &RxTruth,
    len: usize,
) -> ReceiverPlan {
    let fs = s.signal.sample_rate_hz;
    let k = if truth.k_factor_db.is_finite() {
        10f64.powf(truth.k_factor_db / 10.0)
    } else {
        0.0
    };
    let amplitude = 10f64.powf(truth.received_power_dbm / 20.0);
    let block = ((fs * s.propagation.coherence_time_ms / 1e3).round() as usize).max(1);
    let mut fading = Stream::new(key, n, rx, Purpose::Fading);
    let los = Complex::from_polar((k / (k + 1.0)).sqrt(), 2.0 * PI * fading.uniform());
    let scatter = (1.0 / (k + 1.0) / 2.0).sqrt();
    let gains = (0..len.div_ceil(block))
        .map(|_| {
            let (g1, g2) = fading.normal_pair();
            (los + Complex::new(g1, g2) * scatter) * amplitude
        })
        .collect();
    ReceiverPlan {
        channel,
        gains,
        block,
        carrier_offset_hz: truth.carrier_offset_hz,
        drift_hz_per_s: truth.drift_hz_per_s,
        sample_rate_hz: fs,
        noise_sigma: (10f64.powf(truth.noise_floor_dbm / 10.0) / 2.0).sqrt(),
        // Noise sample i is this stream's `Noise::at(i)`, so any stretch of a recording
        // can be computed on its own.
        noise: Noise(Stream::new(key, n, rx, Purpose::Noise)),
    }
}

/// One receiver's recording: the channel, then per sample i in block b
/// y = x·(h_b·e^{j2πφ(i)}) + σ·n_i, φ(i) = f₀t + ½ḟt², t = i/fs, n_i the noise stream's
/// complex sample i (`Noise::at`).
pub fn receive(p: &ReceiverPlan, wave: &Padded) -> Vec<Complex32> {
    let mut out = Vec::new();
    receive_to(p, wave, &mut out);
    out
}

/// `receive` into `out`, which is resized to the recording (a buffer reused from one
/// recording to the next spares the allocation and its page faults).
pub fn receive_to(p: &ReceiverPlan, wave: &Padded, out: &mut Vec<Complex32>) {
    // Every sample is written below, so a buffer of the right length is not cleared.
    out.resize(wave.len(), Complex32::new(0.0, 0.0));
    receive_into(p, &p.channel.fir(wave), out);
}

/// Samples side by side in the receive loop, each lane with its own rotation.
const LANES: usize = 8;

avx2_dispatch! {
    fn receive_into(p: &ReceiverPlan, fir: &Fir, out: &mut [Complex32]) => receive_lanes;
}

/// The rotation h_b·e^{j2πφ(i)} of LANES consecutive samples, and each lane's step to
/// the sample LANES further on.
struct Rotation {
    zr: [f64; LANES],
    zi: [f64; LANES],
    wr: [f64; LANES],
    wi: [f64; LANES],
}

/// `receive`, the channel's outputs computed LANES at a time as they are used. The
/// rotation steps by recurrence, z ← z·w, w ← w·c, in LANES interleaved lanes re-anchored
/// exactly at each block start, so no lane waits on another and the error stays near
/// 1e-13 (the kernel computes the rotation directly per sample; they agree to ~1e-12).
/// Lane steps: Δ(i) = φ(i+L) − φ(i) = L·f₀/fs + ḟ·(L·i + L²/2)/fs², which grows by
/// ḟ·L²/fs² each step.
#[inline(always)]
fn receive_lanes(p: &ReceiverPlan, fir: &Fir, out: &mut [Complex32]) {
    let fs = p.sample_rate_hz;
    let (f0, drift) = (p.carrier_offset_hz, p.drift_hz_per_s);
    let turn = |cycles: f64| Complex::from_polar(1.0, 2.0 * PI * cycles);
    let l = LANES as f64;
    let c = turn(drift * l * l / (fs * fs));
    for (b, start) in (0..out.len()).step_by(p.block).enumerate() {
        let end = (start + p.block).min(out.len());
        let h = p.gains[b];
        let mut rot = Rotation {
            zr: [0.0; LANES],
            zi: [0.0; LANES],
            wr: [0.0; LANES],
            wi: [0.0; LANES],
        };
        for j in 0..LANES {
            let i = (start + j) as f64;
            let t = i / fs;
            let z = h * turn(f0 * t + 0.5 * drift * t * t);
            let w = turn(l * f0 / fs + drift * (l * i + 0.5 * l * l) / (fs * fs));
            (rot.zr[j], rot.zi[j], rot.wr[j], rot.wi[j]) = (z.re, z.im, w.re, w.im);
        }
        let mut i = start;
        // The FIR two steps at a time: its sums over the taps are chains of additions,
        // and 2·LANES outputs give the core four independent ones to interleave.
        while i + 2 * LANES <= end {
            let (vr, vi) = fir.lanes::<{ 2 * LANES }>(i);
            for half in 0..2 {
                let at = half * LANES;
                let vr: &[f32; LANES] = vr[at..at + LANES].try_into().expect("LANES");
                let vi: &[f32; LANES] = vi[at..at + LANES].try_into().expect("LANES");
                let y = receive_step(p, &mut rot, c, i + at, vr, vi);
                out[i + at..i + at + LANES].copy_from_slice(&y);
            }
            i += 2 * LANES;
        }
        // The block's last (under 2·LANES) outputs one FIR output at a time.
        while i < end {
            let n = LANES.min(end - i);
            let (mut vr, mut vi) = ([0f32; LANES], [0f32; LANES]);
            for j in 0..n {
                (vr[j], vi[j]) = fir.at(i + j);
            }
            let y = receive_step(p, &mut rot, c, i, &vr, &vi);
            out[i..i + n].copy_from_slice(&y[..n]);
            i += n;
        }
    }
}

/// Samples i .. i + LANES, and the rotation stepped past them.
#[inline(always)]
fn receive_step(
    p: &ReceiverPlan,
    rot: &mut Rotation,
    c: Complex<f64>,
    i: usize,
    xr: &[f32; LANES],
    xi: &[f32; LANES],
) -> [Complex32; LANES] {
    let (mut nr, mut ni) = ([0f32; LANES], [0f32; LANES]);
    p.noise.lanes(i as u64, &mut nr, &mut ni);
    let sigma = p.noise_sigma;
    let mut y = [Complex32::new(0.0, 0.0); LANES];
    for j in 0..LANES {
        let (vr, vi) = (f64::from(xr[j]), f64::from(xi[j]));
        let (zr, zi, wr, wi) = (rot.zr[j], rot.zi[j], rot.wr[j], rot.wi[j]);
        let yr = (vr * zr - vi * zi) + f64::from(nr[j]) * sigma;
        let yi = (vr * zi + vi * zr) + f64::from(ni[j]) * sigma;
        y[j] = Complex32::new(yr as f32, yi as f32);
        rot.zr[j] = zr * wr - zi * wi;
        rot.zi[j] = zr * wi + zi * wr;
        rot.wr[j] = wr * c.re - wi * c.im;
        rot.wi[j] = wr * c.im + wi * c.re;
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_build_and_the_baseline_build_agree_to_the_bit() {
        // `receive_into` runs the AVX2 build where the CPU has it; `receive_lanes` called
        // here is the baseline build. Urban taps at 2 MHz give long FIRs and the 333-sample
        // blocks leave remainders.
        let mut s = Scenario::default();
        s.signal.duration_ms = 5.0;
        s.signal.sample_rate_hz = 2e6;
        s.signal.bandwidth_hz = 200e3;
        s.propagation.environment = super::super::scenario::Environment::Urban;
        s.propagation.coherence_time_ms = 0.1665;
        let plan = plan(&s, 77, 3);
        for p in &plan.plans {
            let fir = p.channel.fir(&plan.wave);
            let (mut a, mut b) = (
                vec![Complex32::new(0.0, 0.0); fir.len()],
                vec![Complex32::new(0.0, 0.0); fir.len()],
            );
            receive_into(p, &fir, &mut a);
            receive_lanes(p, &fir, &mut b);
            assert!(
                a.iter()
                    .zip(&b)
                    .all(|(x, y)| x.re.to_bits() == y.re.to_bits()
                        && x.im.to_bits() == y.im.to_bits())
            );
            assert_eq!(p.block, 333);
        }
    }

    #[test]
    fn taps_carry_unit_power_and_their_spread() {
        let s = Scenario::default();
        let mut m = Stream::new(1, 2, 3, Purpose::Multipath);
        for _ in 0..50 {
            let t = taps(&s, &mut m);
            assert!(t.len() <= 1 + s.propagation.max_extra_taps);
            let p: f64 = t.iter().map(|x| x.1.norm_sqr()).sum();
            assert!((p - 1.0).abs() < 1e-12);
        }
        let two = [
            (0.0, Complex::new(1.0, 0.0)),
            (2e-6, Complex::new(1.0, 0.0)),
        ];
        assert!((rms_delay_spread_us(&two) - 1.0).abs() < 1e-12);
    }
}
