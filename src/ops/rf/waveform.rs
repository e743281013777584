//! A sample's transmitted waveform in two steps: `WaveSpec::draw` takes every random draw
//! the waveform needs from its stream, up front, and `WaveSpec::synthesize` computes the
//! samples from that spec alone. The device synthesises the same spec
//! (`kernels/rf_waveform.cuh`, `rf_waveform`), so a GPU host draws a few hundred numbers
//! per sample instead of computing a second of baseband on the CPU and uploading it.

use super::generate::Modulation;
use super::rng::Stream;
use super::scenario::Scenario;
use super::sincos::polar;
use rustfft::num_complex::Complex;
use std::f64::consts::PI;

/// The FM modes' highest audio frequency, Hz (Carson: B = 2·(Δf + f_audio)).
pub const AUDIO_MAX_HZ: f64 = 3_000.0;
/// Points in one tabulated period of the voice's harmonics.
pub const VOICE_TABLE: usize = 2048;
/// Seconds per DTMF key.
const KEY_SECONDS: f64 = 0.1;
const ROWS: [f64; 4] = [697.0, 770.0, 852.0, 941.0];
const COLS: [f64; 3] = [1209.0, 1336.0, 1477.0];

/// Voice-like audio: the harmonics of a pitch f₀, each weighted by three formant
/// resonances, under a syllable-rate envelope.
#[derive(Clone, Debug, PartialEq)]
pub struct Voice {
    pub f0: f64,
    /// (amplitude, phase) of harmonics 1, 2, … below `AUDIO_MAX_HZ`.
    pub harmonics: Vec<(f64, f64)>,
    pub syllable_hz: f64,
    pub syllable_phase: f64,
}

/// What modulates the carrier.
#[derive(Clone, Debug, PartialEq)]
pub enum Audio {
    Voice(Voice),
    Tone {
        hz: f64,
    },
    /// (row, column) tone frequencies of each key, `per_key` samples each.
    Dtmf {
        keys: Vec<(f64, f64)>,
        per_key: usize,
    },
    None,
}

/// One sample's transmitted waveform before synthesis.
#[derive(Clone, Debug, PartialEq)]
pub struct WaveSpec {
    pub modulation: Modulation,
    pub audio: Audio,
    pub len: usize,
    pub sample_rate_hz: f64,
    /// FM peak deviation, Hz.
    pub deviation_hz: f64,
    pub am_depth: f64,
}

impl Voice {
    fn draw(r: &mut Stream) -> Self {
        let f0 = r.range(90.0, 250.0);
        let formants = [
            r.range(300.0, 900.0),
            r.range(900.0, 2300.0),
            r.range(2300.0, 3000.0),
        ];
        let syllable_hz = r.range(3.0, 6.0);
        let syllable_phase = 2.0 * PI * r.uniform();
        let mut harmonics = Vec::new();
        let mut h = 1;
        while (h as f64) * f0 < AUDIO_MAX_HZ {
            let f = h as f64 * f0;
            let a: f64 = formants
                .iter()
                .map(|fk| 1.0 / (1.0 + ((f - fk) / 120.0).powi(2)))
                .sum();
            harmonics.push((a, 2.0 * PI * r.uniform()));
            h += 1;
        }
        Self {
            f0,
            harmonics,
            syllable_hz,
            syllable_phase,
        }
    }

    /// One period of the harmonics, and its peak magnitude.
    fn table(&self) -> (Vec<f64>, f64) {
        let mut table = vec![0.0f64; VOICE_TABLE];
        for (k, &(a, phi)) in self.harmonics.iter().enumerate() {
            let h = (k + 1) as f64;
            for_each_sine(
                VOICE_TABLE,
                |i| 2.0 * PI * h * i as f64 / VOICE_TABLE as f64 + phi,
                |i, s| table[i] += a * s,
            );
        }
        let peak = table.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-12);
        (table, peak)
    }

    /// `len` samples in [−1, 1]: the table read with linear interpolation, under the
    /// envelope 0.6 + 0.4·sin(2π·f_syllable·t + φ).
    fn audio(&self, len: usize, fs: f64) -> Vec<f64> {
        let (table, peak) = self.table();
        sines(len, self.syllable_hz / fs, self.syllable_phase)
            .enumerate()
            .map(|(i, (syllable, _))| {
                let t = i as f64 / fs;
                let pos = fract(self.f0 * t) * VOICE_TABLE as f64;
                let (k, frac) = (pos as usize % VOICE_TABLE, fract(pos));
                let v = table[k] * (1.0 - frac) + table[(k + 1) % VOICE_TABLE] * frac;
                let envelope = 0.6 + 0.4 * syllable;
                envelope * v / peak
            })
            .collect()
    }
}

impl WaveSpec {
    /// Every draw of modulation `m`'s waveform, in the order the generator has always
    /// taken them (the same seed gives the same waveform as before the split).
    pub fn draw(s: &Scenario, modulation: Modulation, len: usize, r: &mut Stream) -> Self {
        let fs = s.signal.sample_rate_hz;
        let audio = match modulation {
            Modulation::FmVoice | Modulation::Am => Audio::Voice(Voice::draw(r)),
            Modulation::FmTone => Audio::Tone {
                hz: r.range(300.0, AUDIO_MAX_HZ),
            },
            Modulation::FmDtmf => {
                let per_key = (KEY_SECONDS * fs) as usize;
                let keys = (0..len.div_ceil(per_key))
                    .map(|_| {
                        let row = ROWS[(r.uniform() * 4.0) as usize % 4];
                        (row, COLS[(r.uniform() * 3.0) as usize % 3])
                    })
                    .collect();
                Audio::Dtmf { keys, per_key }
            }
            Modulation::Carrier => Audio::None,
        };
        Self {
            modulation,
            audio,
            len,
            sample_rate_hz: fs,
            deviation_hz: (s.signal.bandwidth_hz / 2.0 - AUDIO_MAX_HZ).max(250.0),
            am_depth: s.signal.am_depth,
        }
    }

    /// The complex baseband waveform, unit mean power.
    pub fn synthesize(&self) -> Vec<Complex<f64>> {
        let (len, fs) = (self.len, self.sample_rate_hz);
        let audio = match &self.audio {
            Audio::Voice(v) => v.audio(len, fs),
            Audio::Tone { hz } => sines(len, hz / fs, 0.0).map(|(s, _)| s).collect(),
            Audio::Dtmf { keys, per_key } => {
                let mut audio = vec![0.0; len];
                let tone = |i: usize, column: bool| {
                    let (fr, fc) = keys[i / per_key];
                    let (f, t) = (if column { fc } else { fr }, i as f64 / fs);
                    2.0 * PI * f * t
                };
                for_each_sine(len, |i| tone(i, false), |i, s| audio[i] = s);
                for_each_sine(
                    len,
                    |i| tone(i, true),
                    |i, s| audio[i] = 0.5 * (audio[i] + s),
                );
                audio
            }
            Audio::None => Vec::new(),
        };
        match self.modulation {
            Modulation::FmVoice | Modulation::FmTone | Modulation::FmDtmf => {
                self.frequency_modulate(audio)
            }
            Modulation::Am => {
                let mu = self.am_depth;
                let x: Vec<f64> = audio.iter().map(|a| 1.0 + mu * a).collect();
                let p = x.iter().map(|v| v * v).sum::<f64>() / len as f64;
                x.iter().map(|v| Complex::new(v / p.sqrt(), 0.0)).collect()
            }
            Modulation::Carrier => vec![Complex::new(1.0, 0.0); len],
        }
    }

    /// e^{jφ_i}, φ_i = Σ_{k ≤ i} 2π·Δf·a_k / fs.
    fn frequency_modulate(&self, mut audio: Vec<f64>) -> Vec<Complex<f64>> {
        let (deviation, fs) = (self.deviation_hz, self.sample_rate_hz);
        let mut phase = 0.0f64;
        for a in audio.iter_mut() {
            // Kept in (−π, π] by one subtraction (a step is far below 2π) rather than a
            // remainder per sample.
            phase += 2.0 * PI * deviation * *a / fs;
            if phase > PI {
                phase -= 2.0 * PI;
            } else if phase <= -PI {
                phase += 2.0 * PI;
            }
            *a = phase;
        }
        let mut out = vec![Complex::new(0.0, 0.0); audio.len()];
        polar(&audio, &mut out);
        out
    }
}

/// `x.fract()` for 0 ≤ x < 2⁵³, by a conversion rather than the `trunc` call the
/// baseline x86-64 build makes (it has no rounding instruction): the same bits.
#[inline(always)]
fn fract(x: f64) -> f64 {
    x - (x as u64) as f64
}

/// `f(i, sin θ(i))` for i = 0..n, the sines by the vectorised `polar` a stretch at a time
/// (libm's sine is a call per value, and the voice table and DTMF need 25,000 to 400,000
/// of them a waveform).
fn for_each_sine(n: usize, theta: impl Fn(usize) -> f64, mut f: impl FnMut(usize, f64)) {
    const STRETCH: usize = 512;
    let mut angles = [0.0f64; STRETCH];
    let mut units = [Complex::new(0.0, 0.0); STRETCH];
    for start in (0..n).step_by(STRETCH) {
        let m = STRETCH.min(n - start);
        for (j, a) in angles[..m].iter_mut().enumerate() {
            *a = theta(start + j);
        }
        polar(&angles[..m], &mut units[..m]);
        for (j, u) in units[..m].iter().enumerate() {
            f(start + j, u.im);
        }
    }
}

/// (sin, cos) of 2π·cycles_per_sample·i + phase for i = 0..len, by rotation: one complex
/// product per sample instead of a sine, re-anchored exactly every 4096 samples so the
/// error stays near 1e-13.
fn sines(len: usize, cycles_per_sample: f64, phase: f64) -> impl Iterator<Item = (f64, f64)> {
    let step = Complex::from_polar(1.0, 2.0 * PI * cycles_per_sample);
    let mut z = Complex::new(0.0, 0.0);
    (0..len).map(move |i| {
        if i % 4096 == 0 {
            z = Complex::from_polar(1.0, 2.0 * PI * cycles_per_sample * i as f64 + phase);
        }
        let v = (z.im, z.re);
        z *= step;
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rf::rng::Purpose;

    #[test]
    fn waveforms_have_unit_power_and_fm_stays_in_its_band() {
        let s = Scenario::default();
        for m in Modulation::ALL {
            let mut r = Stream::new(5, 0, 0, Purpose::Waveform);
            let w = WaveSpec::draw(&s, m, 40_000, &mut r).synthesize();
            let p = w.iter().map(|v| v.norm_sqr()).sum::<f64>() / w.len() as f64;
            assert!((p - 1.0).abs() < 1e-9, "{m:?} power {p}");
            if m == Modulation::FmTone || m == Modulation::FmVoice {
                // Instantaneous frequency within ±deviation.
                let dev = s.signal.bandwidth_hz / 2.0 - AUDIO_MAX_HZ;
                let fmax = w
                    .windows(2)
                    .map(|p| {
                        (p[1] * p[0].conj()).arg().abs() * s.signal.sample_rate_hz / (2.0 * PI)
                    })
                    .fold(0.0, f64::max);
                assert!(fmax <= dev * 1.0001, "{m:?} peak deviation {fmax}");
            }
        }
    }

    #[test]
    fn vectorised_sines_match_libm_across_stretches() {
        // 1,300 values: two whole stretches and a partial one. Arguments up to the voice
        // table's (~220), a default DTMF second's (~9.3e3) and a 60 s DTMF recording's
        // (5.6e5), where the bound is the argument's own rounding (sincos.rs).
        for scale in [1e-3, 0.2, 8.0, 430.0] {
            let theta = |i: usize| 0.3 + scale * i as f64;
            let mut seen = 0;
            for_each_sine(1_300, theta, |i, s| {
                assert_eq!(i, seen);
                seen += 1;
                let want = theta(i).sin();
                assert!((s - want).abs() <= 4e-16 + 2.0 * theta(i) * f64::EPSILON);
            });
            assert_eq!(seen, 1_300);
        }
    }

    #[test]
    fn dtmf_draws_a_key_per_tenth_of_a_second() {
        let s = Scenario::default();
        let mut r = Stream::new(5, 1, 0, Purpose::Waveform);
        let spec = WaveSpec::draw(&s, Modulation::FmDtmf, 45_000, &mut r);
        let Audio::Dtmf { keys, per_key } = &spec.audio else {
            panic!("{:?}", spec.audio)
        };
        assert_eq!((*per_key, keys.len()), (20_000, 3));
        assert!(keys
            .iter()
            .all(|(row, col)| ROWS.contains(row) && COLS.contains(col)));
    }
}
