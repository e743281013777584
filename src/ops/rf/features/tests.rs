use super::*;
use fft_plans::F64Planner;
use rustfft::num_complex::Complex;

/// Deterministic complex Gaussian noise of power `p` (Box–Muller on splitmix64).
pub(crate) fn noise(n: usize, p: f64, seed: u64) -> Vec<Complex32> {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let sigma = (p / 2.0).sqrt();
    (0..n)
        .map(|_| {
            let (u1, u2) = (next().max(1e-300), next());
            let r = (-2.0 * u1.ln()).sqrt() * sigma;
            Complex32::new(
                (r * (2.0 * PI * u2).cos()) as f32,
                (r * (2.0 * PI * u2).sin()) as f32,
            )
        })
        .collect()
}

fn tone(n: usize, fs: f64, f: f64, p: f64) -> Vec<Complex32> {
    let a = p.sqrt();
    (0..n)
        .map(|i| {
            let ph = 2.0 * PI * f * i as f64 / fs;
            Complex32::new((a * ph.cos()) as f32, (a * ph.sin()) as f32)
        })
        .collect()
}

fn add(a: &[Complex32], b: &[Complex32]) -> Vec<Complex32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

const CFG: ExtractConfig = ExtractConfig {
    sample_rate_hz: 200_000.0,
    chunk_ms: 200.0,
};

fn get(stats: &[Stats], name: &str) -> Stats {
    stats[FEATURE_NAMES.iter().position(|n| *n == name).unwrap()]
}

#[test]
fn pure_noise_reads_zero_db_snr_its_own_floor_and_no_signal() {
    // -90 dBm of noise over 200 kHz, 1 s: five chunks, across several seeds.
    let mut snrs = Vec::new();
    for seed in 0..8 {
        let x = noise(200_000, 1e-9, seed);
        let ex = extract(&x, &CFG).unwrap();
        assert_eq!(ex.chunks.len(), 5);
        let agg = ex.aggregate();
        assert!(
            (get(&agg, "noise_floor_dbm").mean + 90.0).abs() < 0.1,
            "{agg:?}"
        );
        assert!((get(&agg, "rssi_dbm").mean + 90.0).abs() < 0.05);
        assert_eq!(get(&agg, "signal_present").max, 0.0, "seed {seed}");
        assert_eq!(get(&agg, "confidence_score").max, 0.0);
        snrs.push(get(&agg, "snr_db").mean);
        // Circular Gaussian: the real part crosses zero half the time on average
        // for white noise (consecutive samples independent).
        assert!((get(&agg, "zero_crossing_rate").mean - 0.5).abs() < 0.01);
        // PAPR of 40k exponential powers: ln(40000) ≈ 10.6 → ~10.3 dB.
        assert!((8.0..13.0).contains(&get(&agg, "peak_to_avg_ratio_db").mean));
    }
    let mean_snr = snrs.iter().sum::<f64>() / snrs.len() as f64;
    assert!(
        mean_snr.abs() < 0.05,
        "pure noise SNR {mean_snr} dB: biased"
    );
}

#[test]
fn a_tone_in_noise_gives_its_offset_power_and_narrow_band() {
    let fs = CFG.sample_rate_hz;
    let (f0, p_sig, p_noise) = (12_345.0, 1e-8, 1e-9); // +10 dB over the whole band
    let x = add(&tone(200_000, fs, f0, p_sig), &noise(200_000, p_noise, 3));
    let ex = extract(&x, &CFG).unwrap();
    let agg = ex.aggregate();
    assert_eq!(get(&agg, "signal_present").min, 1.0);
    let df = fs / ex.segment_len as f64;
    assert!(
        (get(&agg, "frequency_offset_hz").mean - f0).abs() < 0.1 * df,
        "{agg:?}"
    );
    assert!(get(&agg, "bandwidth_hz").max <= 4.0 * df);
    // Total power −79.59 dBm, noise floor −90 dBm, full-band SNR 10.41 dB.
    assert!((get(&agg, "rssi_dbm").mean - db(1.1e-8)).abs() < 0.05);
    assert!((get(&agg, "noise_floor_dbm").mean + 90.0).abs() < 0.15);
    assert!((get(&agg, "snr_db").mean - db(11.0)).abs() < 0.15);
    assert!((get(&agg, "spectral_centroid_hz").mean - f0 * 10.0 / 11.0).abs() < 200.0);
    assert_eq!(get(&agg, "confidence_score").min, 1.0);
}

#[test]
fn the_f32_welch_psd_keeps_a_noise_floor_90_db_under_a_tone() {
    // A tone 90 dB over the noise in its bin: the f64 reference and the f32 transform
    // agree within 0.01 dB on every bin, the tone's neighbourhood included.
    let fs = CFG.sample_rate_hz;
    let x = add(&tone(51_200, fs, 12_345.0, 1.0), &noise(51_200, 1e-6, 4));
    let seg = 512;
    let window = hann(seg);
    let (psd, k) = welch_psd(&x, fs, &window, super::super::fft_plan(seg).as_ref());
    let w64: Vec<f64> = window.iter().map(|&w| f64::from(w)).collect();
    let fft = F64Planner::default().forward(seg);
    let mut want = vec![0.0f64; seg];
    for s in 0..k {
        let mut buf: Vec<Complex<f64>> = (0..seg)
            .map(|i| {
                let v = x[s * seg + i];
                Complex::new(f64::from(v.re), f64::from(v.im)) * w64[i]
            })
            .collect();
        fft.process(&mut buf);
        for (a, b) in want.iter_mut().zip(&buf) {
            *a += b.norm_sqr();
        }
    }
    let u: f64 = w64.iter().map(|w| w * w).sum();
    let scale = 1.0 / (k as f64 * fs * u);
    let worst = (0..seg)
        .map(|i| (db(psd[i]) - db(want[(i + seg / 2) % seg] * scale)).abs())
        .fold(0.0, f64::max);
    assert!(worst < 0.01, "worst bin {worst} dB");
    let floor = psd.iter().copied().fold(f64::INFINITY, f64::min);
    let peak = psd.iter().copied().fold(0.0, f64::max);
    assert!(
        db(peak / floor) > 80.0,
        "dynamic range {}",
        db(peak / floor)
    );
}

#[test]
fn the_envelope_pass_agrees_with_f64_and_across_builds() {
    let x = add(&tone(10_007, 200e3, 3_000.0, 2e-6), &noise(10_007, 1e-6, 8));
    let got = envelope(&x);
    assert_eq!(got, envelope_lanes(&x));
    let p: f64 = x.iter().map(|c| f64::from(c.norm_sqr())).sum();
    let e: f64 = x.iter().map(|c| f64::from(c.norm_sqr()).sqrt()).sum();
    let m = x
        .iter()
        .map(|c| f64::from(c.norm_sqr()))
        .fold(0.0, f64::max);
    let z = x
        .windows(2)
        .filter(|w| (w[0].re >= 0.0) != (w[1].re >= 0.0))
        .count();
    assert!((got.power_sum / p - 1.0).abs() < 1e-6);
    assert!((got.magnitude_sum / e - 1.0).abs() < 1e-6);
    assert!((got.power_max / m - 1.0).abs() < 1e-6);
    assert_eq!(got.crossings, z);
}

#[test]
fn a_weak_wideband_signal_sets_bandwidth_and_a_band_limited_floor() {
    // Noise filtered to ±20 kHz (a flat 40 kHz "signal", 2e-9 mW) over white noise.
    let fs = CFG.sample_rate_hz;
    let n = 200_000;
    let band = band_noise(n, fs, 20_000.0, 2e-9, 9);
    let x = add(&band, &noise(n, 1e-9, 10));
    let agg = extract(&x, &CFG).unwrap().aggregate();
    assert_eq!(get(&agg, "signal_present").min, 1.0);
    let bw = get(&agg, "bandwidth_hz").mean;
    assert!((38_000.0..42_000.0).contains(&bw), "bandwidth {bw}");
    assert!(get(&agg, "frequency_offset_hz").mean.abs() < 500.0);
    // The band holds 2e-9 mW over 40 kHz against 1e-9 · 0.2 of noise: 10 dB in band.
    assert!(
        (get(&agg, "noise_floor_dbm").mean + 90.0).abs() < 0.2,
        "{agg:?}"
    );
}

/// White noise of power `p` limited to ±`half_band` Hz.
fn band_noise(n: usize, fs: f64, half_band: f64, p: f64, seed: u64) -> Vec<Complex32> {
    let wide = noise(n, p * fs / (2.0 * half_band), seed);
    let mut spec: Vec<Complex<f64>> = wide
        .iter()
        .map(|v| Complex::new(v.re as f64, v.im as f64))
        .collect();
    let mut planner = F64Planner::default();
    planner.forward(n).process(&mut spec);
    for (i, s) in spec.iter_mut().enumerate() {
        let f = if i < n / 2 {
            i as f64
        } else {
            i as f64 - n as f64
        } * fs
            / n as f64;
        if f.abs() > half_band {
            *s = Complex::new(0.0, 0.0);
        }
    }
    planner.inverse(n).process(&mut spec);
    spec.iter()
        .map(|v| Complex32::new((v.re / n as f64) as f32, (v.im / n as f64) as f32))
        .collect()
}

#[test]
fn two_ray_multipath_shows_in_coherence_bandwidth_and_flat_bands_stay_unconfident() {
    let fs = CFG.sample_rate_hz;
    let n = 200_000;
    let s = band_noise(n, fs, 60_000.0, 1e-8, 21);
    let floor = noise(n, 1e-10, 22);
    let spread = |delay: usize| {
        let x: Vec<Complex32> = (0..n)
            .map(|i| {
                s[i] + if i >= delay {
                    s[i - delay] * 0.9
                } else {
                    Complex32::new(0.0, 0.0)
                }
            })
            .collect();
        extract(&add(&x, &floor), &CFG).unwrap().aggregate()
    };
    let (short, long) = (spread(10), spread(20));
    let (d1, d2) = (
        get(&short, "multipath_delay_spread_us").mean,
        get(&long, "multipath_delay_spread_us").mean,
    );
    assert!(
        get(&short, "delay_spread_confidence").min > 0.3,
        "{short:?}"
    );
    assert!((1.6..2.4).contains(&(d2 / d1)), "{d1} µs vs {d2} µs");
    // Notches every 1/τ = 20 kHz: the correlation halves within a sixth of that.
    let bc = get(&short, "coherence_bandwidth_khz").mean;
    assert!((2.0..6.0).contains(&bc), "{bc} kHz");
    let flat = extract(&add(&s, &floor), &CFG).unwrap().aggregate();
    assert_eq!(get(&flat, "delay_spread_confidence").max, 0.0, "{flat:?}");
}

#[test]
fn short_and_empty_recordings_are_refused_and_remainders_dropped() {
    assert!(matches!(
        extract(&noise(100, 1.0, 1), &CFG),
        Err(ExtractError::TooShort { samples: 100 })
    ));
    let tiny = ExtractConfig {
        sample_rate_hz: 1000.0,
        chunk_ms: 10.0,
    };
    assert!(matches!(
        extract(&noise(5000, 1.0, 1), &tiny),
        Err(ExtractError::ChunkTooSmall(10))
    ));
    // 1.1 chunks: one chunk, the rest left out; 0.5 chunk: one short chunk.
    assert_eq!(
        extract(&noise(44_000, 1.0, 1), &CFG).unwrap().chunks.len(),
        1
    );
    let half = extract(&noise(20_000, 1.0, 1), &CFG).unwrap();
    assert_eq!((half.chunks.len(), half.samples_per_chunk), (1, 20_000));
}

#[test]
fn quantile_helpers_match_known_values() {
    assert!((normal_upper_quantile(0.025) - 1.959964).abs() < 1e-5);
    assert!((normal_upper_quantile(0.75) + 0.674490).abs() < 1e-5);
    // Gamma(1, 1) median ln 2; Wilson–Hilferty within 2 % (0.06 dB).
    assert!((gamma_mean_quantile(1, 0.0) / std::f64::consts::LN_2 - 1.0).abs() < 0.02);
    // Gamma(100, 1/100) median ≈ 0.99667.
    assert!((gamma_mean_quantile(100, 0.0) - 0.99667).abs() < 1e-4);
}

#[test]
fn the_floor_allowance_follows_the_f32_transform_and_stays_tight_at_ordinary_snr() {
    // 20·log10(1 + 2√r), r = 2^-48 · log2 L · 10^(snr/10).
    let at = |snr: f64, len: usize| {
        let r = (len as f64).log2() * 10f64.powf(snr / 10.0) / (1u64 << 48) as f64;
        20.0 * (1.0 + 2.0 * r.sqrt()).log10()
    };
    for (snr, len) in [(0.0, 16), (60.0, 4096), (95.0, 512), (110.0, 8192)] {
        let got = floor_allowance_db(snr, len);
        assert!(
            (got - at(snr, len)).abs() < 1e-12,
            "{snr} dB, L {len}: {got}"
        );
    }
    assert!(floor_allowance_db(60.0, 4096) < 0.004);
    assert!(floor_allowance_db(40.0, 8192) < 1e-3 / 2.0);
    assert!(floor_allowance_db(110.0, 512) > 0.5);
    assert_eq!(floor_allowance_db(f64::NEG_INFINITY, 512), 0.0);
    assert_eq!(floor_allowance_db(f64::NAN, 512), 0.0);
}

#[test]
fn a_chunk_agrees_within_the_floor_allowance_and_not_beyond_it() {
    let mut cpu: ChunkFeatures = [0.0; 18];
    let (floor, snr, rssi) = (
        feature_index("noise_floor_dbm"),
        feature_index("snr_db"),
        feature_index("rssi_dbm"),
    );
    (cpu[rssi], cpu[floor], cpu[snr]) = (-5.0, -105.0, 100.0);
    let bound = 1e-3 + floor_allowance_db(100.0, 512);
    for feature in FLOOR_FEATURES.map(feature_index) {
        let mut near = cpu;
        near[feature] += 0.9 * bound;
        if let Err(why) = chunk_agrees(&near, &cpu, 512) {
            panic!("{why}");
        }
        let mut far = cpu;
        far[feature] -= 1.1 * bound;
        let why = chunk_agrees(&far, &cpu, 512).expect_err("beyond the bound");
        assert!(why.starts_with(FEATURE_NAMES[feature]), "{why}");
    }
    // Features that do not rest on the floor keep 1e-3 at any SNR.
    let mut off = cpu;
    off[rssi] += 0.01;
    assert!(chunk_agrees(&off, &cpu, 512).is_err());
    // At an ordinary SNR the floor keeps 1e-3 too.
    let mut low = cpu;
    (low[floor], low[snr]) = (-45.0, 40.0);
    let mut moved = low;
    moved[floor] += 2e-3;
    assert!(chunk_agrees(&moved, &low, 512).is_err());
}
