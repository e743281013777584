//! One dataset sample end to end: generate, extract every receiver's features, judge
//! its quality (receivers detected, mean SNR, GDOP) and accept or reject it by reason.

use super::features::{
    self, extract, feature_index, stats_agree, ChunkSums, Derivation, ExtractConfig, Stats,
};
use super::generate::{
    draft, plan, receive_to, samples_per_recording, RxTruth, SamplePlan, TxTruth,
};
use super::gpu::{launch_receive_and_reduce, pack_drafts, unpack, MAX_REDUCE_SEGMENT};
use super::scenario::Scenario;
use crate::backend::DeviceError;
use crate::backend::DeviceLease;
use rayon::prelude::*;
use rustfft::num_complex::Complex32;
use serde::Serialize;

/// Why a sample was rejected; checked in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rejection {
    TooFewReceivers,
    LowSnr,
    HighGdop,
}

impl Rejection {
    pub const ALL: [Rejection; 3] = [
        Rejection::TooFewReceivers,
        Rejection::LowSnr,
        Rejection::HighGdop,
    ];
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Quality {
    /// Receivers whose signal_present mean is at least 0.5.
    pub receivers_detected: usize,
    /// Mean of the detected receivers' snr_db means (−∞ with none).
    pub mean_snr_db: f64,
    /// Of the detected receivers about the transmitter (∞ when undefined).
    pub gdop: f64,
}

#[derive(Clone, Debug)]
pub struct SampleRecord {
    pub index: u64,
    pub tx: TxTruth,
    pub receivers: Vec<RxTruth>,
    /// Per receiver, each feature's statistics over the chunks (`FEATURE_NAMES` order).
    pub features: Vec<Vec<Stats>>,
    pub quality: Quality,
    pub rejected: Option<Rejection>,
    /// The recordings, kept when asked for and the sample is accepted.
    pub iq: Option<Vec<Vec<Complex32>>>,
}

/// The most complex samples a thread keeps in its recording buffer between samples
/// (1 MiB): reusing a short one saves an allocation per receiver, and a long one costs
/// more to hold than to allocate again.
const KEEP_RECORDING_BUFFER: usize = 1 << 17;

thread_local! {
    /// The recording being evaluated, reused across receivers and samples.
    static RECORDING: std::cell::Cell<Vec<Complex32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Generates and evaluates sample `n`, keeping its recordings when `keep_iq` and it is
/// accepted; also returns the time generation and extraction took (for the benchmark).
pub fn sample(
    s: &Scenario,
    key: u64,
    n: u64,
    keep_iq: bool,
) -> (SampleRecord, std::time::Duration, std::time::Duration) {
    let cfg = extract_config(s);
    let features_of = |x: &[Complex32]| {
        extract(x, &cfg)
            .map(|e| e.aggregate())
            .expect("validated: a recording holds a chunk")
    };
    let started = std::time::Instant::now();
    let plan = plan(s, key, n);
    let (mut generating, mut extracting) = (started.elapsed(), std::time::Duration::ZERO);
    let mut features = Vec::with_capacity(plan.plans.len());
    let mut kept = Vec::new();
    // Taken out of the thread's slot, not borrowed in it: `extract` fans out on the
    // rayon pool, and while this thread waits for its chunks it may run another sample,
    // which then finds the slot empty and allocates its own buffer.
    let mut buffer = RECORDING.take();
    for p in &plan.plans {
        let t0 = std::time::Instant::now();
        // Recordings that may be kept are each their own; the others share one buffer.
        let mut own = Vec::new();
        let x = if keep_iq { &mut own } else { &mut buffer };
        receive_to(p, &plan.wave, x);
        let t1 = std::time::Instant::now();
        features.push(features_of(x));
        (generating, extracting) = (generating + (t1 - t0), extracting + t1.elapsed());
        if keep_iq {
            kept.push(own);
        }
    }
    // A long recording's buffer is not kept for the thread's next sample: a thread
    // idle in a small batch would hold it outside the job's memory budget.
    if buffer.capacity() <= KEEP_RECORDING_BUFFER {
        RECORDING.set(buffer);
    }
    (
        evaluate(s, n, plan, features, keep_iq.then_some(kept)),
        generating,
        extracting,
    )
}

/// How the dataset's recordings are cut into chunks for their features.
pub fn extract_config(s: &Scenario) -> ExtractConfig {
    ExtractConfig {
        sample_rate_hz: s.signal.sample_rate_hz,
        chunk_ms: s.chunk_ms,
    }
}

/// Sample n's record from its plan and each receiver's feature statistics: its quality,
/// and accepted or rejected by reason (the recordings kept only when accepted).
fn evaluate<W>(
    s: &Scenario,
    n: u64,
    plan: SamplePlan<W>,
    features: Vec<Vec<Stats>>,
    iq: Option<Vec<Vec<Complex32>>>,
) -> SampleRecord {
    let quality = judge(&plan.receivers, &features);
    let q = &s.quality;
    let rejected = if quality.receivers_detected < q.min_receivers {
        Some(Rejection::TooFewReceivers)
    } else if quality.mean_snr_db < q.min_snr_db {
        Some(Rejection::LowSnr)
    } else if quality.gdop > q.max_gdop {
        Some(Rejection::HighGdop)
    } else {
        None
    };
    SampleRecord {
        index: n,
        tx: plan.tx,
        receivers: plan.receivers,
        features,
        quality,
        rejected,
        iq: iq.filter(|_| rejected.is_none()),
    }
}

/// Whether a scenario's recordings fit the device path (`samples_on_device`): its Welch
/// segment within what `rf_chunk_reduce` takes.
pub fn fits_device(s: &Scenario) -> bool {
    features::plan(&extract_config(s), samples_per_recording(s))
        .is_ok_and(|(_, seg)| seg <= MAX_REDUCE_SEGMENT)
}

/// Samples in one device batch: recordings and waveforms (one per sample, about a
/// recording's size) of at most `DEVICE_BATCH_BYTES`, and no more than `DEVICE_BATCH_MAX`.
pub fn device_batch(s: &Scenario) -> u64 {
    let per_sample = 8 * (samples_per_recording(s) * (s.receiver_slots().max(1) + 1)) as u64;
    (DEVICE_BATCH_BYTES / per_sample.max(1)).clamp(1, DEVICE_BATCH_MAX)
}
const DEVICE_BATCH_BYTES: u64 = 1 << 30;
const DEVICE_BATCH_MAX: u64 = 64;

/// Samples `indices` with their waveforms synthesised, their recordings written and
/// reduced to chunk sums on the device (`rf_waveform`, `rf_receive`, `rf_chunk_reduce`);
/// the draws and the features' last step on the CPU (the caller's rayon pool). The same
/// records as `sample` within the kernels' tolerances (features within 1e-3 dB and
/// 0.1 Hz; tests/device/parity/rf.rs).
pub fn samples_on_device(
    s: &Scenario,
    key: u64,
    indices: std::ops::Range<u64>,
    keep_iq: bool,
    dev: &DeviceLease<'_>,
) -> Result<Vec<SampleRecord>, DeviceError> {
    let cfg = extract_config(s);
    let (chunk, seg) = features::plan(&cfg, samples_per_recording(s))
        .map_err(|e| DeviceError::unsupported(e.to_string()))?;
    let plans: Vec<_> = indices
        .clone()
        .into_par_iter()
        .map(|n| draft(s, key, n))
        .collect();
    let batch = pack_drafts(&plans.iter().collect::<Vec<_>>());
    let (iq, sums) = launch_receive_and_reduce(&batch, chunk, seg, keep_iq, dev)?;
    let recordings = iq.map(|iq| unpack(&batch, &iq));
    Ok(records_from_sums(
        s, indices, plans, &sums, recordings, chunk, seg,
    ))
}

/// The records of samples `indices` from their plans, every receiver's chunk sums in
/// order (receiver by receiver, sample by sample) and, when kept, the recordings.
fn records_from_sums<W: Send>(
    s: &Scenario,
    indices: std::ops::Range<u64>,
    plans: Vec<SamplePlan<W>>,
    sums: &[ChunkSums],
    recordings: Option<Vec<Vec<Vec<Complex32>>>>,
    chunk: usize,
    seg: usize,
) -> Vec<SampleRecord> {
    let per_receiver = samples_per_recording(s) / chunk;
    let mut recordings = recordings.map(Vec::into_iter);
    let mut at = 0;
    let mut work = Vec::with_capacity(plans.len());
    for (n, p) in indices.zip(plans) {
        let count = p.plans.len() * per_receiver;
        let kept = recordings.as_mut().and_then(Iterator::next);
        work.push((n, p, &sums[at..at + count], kept));
        at += count;
    }
    assert_eq!(
        at,
        sums.len(),
        "one chunk's sums per chunk of every recording"
    );
    let fs = s.signal.sample_rate_hz;
    let derivation = Derivation::new(chunk, seg);
    work.into_par_iter()
        .map(|(n, p, sums, kept)| {
            let features = sums
                .chunks(per_receiver)
                .map(|c| derivation.extract(c, fs).aggregate())
                .collect();
            evaluate(s, n, p, features, kept)
        })
        .collect()
}

/// Dataset batches' op: their name in metrics, self-tests and quarantine.
pub const DATASET_OP: &str = "rf_dataset";

/// Whether two records of one sample agree within the device path's tolerances: the same
/// receivers and decision, each receiver's feature statistics within
/// `features::stats_agree` for Welch segments of `segment_len` (the scenario's
/// `segment_len`). What a
/// dataset job checks before trusting a device.
pub fn records_agree(a: &SampleRecord, b: &SampleRecord, segment_len: usize) -> Result<(), String> {
    if a.rejected != b.rejected || a.features.len() != b.features.len() {
        return Err(format!(
            "decision {:?} vs {:?}, {} vs {} receivers",
            a.rejected,
            b.rejected,
            a.features.len(),
            b.features.len()
        ));
    }
    for (r, (fa, fb)) in a.features.iter().zip(&b.features).enumerate() {
        stats_agree(fa, fb, segment_len).map_err(|why| format!("receiver {r} {why}"))?;
    }
    Ok(())
}

/// The Welch segment length of a scenario's recordings (a scenario that makes no chunk
/// has no features to hold to it; the longest segment the device takes then).
pub fn segment_len(s: &Scenario) -> usize {
    features::plan(&extract_config(s), samples_per_recording(s))
        .map_or(MAX_REDUCE_SEGMENT, |(_, seg)| seg)
}

fn judge(receivers: &[RxTruth], features: &[Vec<Stats>]) -> Quality {
    let (present, snr) = (feature_index("signal_present"), feature_index("snr_db"));
    let detected: Vec<usize> = (0..receivers.len())
        .filter(|&r| features[r][present].mean >= 0.5)
        .collect();
    let mean_snr_db = if detected.is_empty() {
        f64::NEG_INFINITY
    } else {
        detected.iter().map(|&r| features[r][snr].mean).sum::<f64>() / detected.len() as f64
    };
    let positions: Vec<(f64, f64)> = detected
        .iter()
        .map(|&r| (receivers[r].east_m, receivers[r].north_m))
        .collect();
    Quality {
        receivers_detected: detected.len(),
        mean_snr_db,
        gdop: gdop(&positions),
    }
}

/// GDOP of range measurements with an unknown clock offset, receivers at `positions`
/// relative to the transmitter: rows (uₓ, u_y, 1) of unit vectors from the transmitter;
/// √trace((HᵀH)⁻¹). ∞ with fewer than three receivers or a singular geometry.
pub fn gdop(positions: &[(f64, f64)]) -> f64 {
    if positions.len() < 3 {
        return f64::INFINITY;
    }
    let mut a = [[0.0f64; 3]; 3];
    for &(x, y) in positions {
        let d = (x * x + y * y).sqrt().max(1e-9);
        let row = [x / d, y / d, 1.0];
        for i in 0..3 {
            for j in 0..3 {
                a[i][j] += row[i] * row[j];
            }
        }
    }
    let det = a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
        - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
        + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]);
    if det.abs() < 1e-9 {
        return f64::INFINITY;
    }
    // Diagonal of the inverse: the cofactors C_ii over det.
    let c00 = a[1][1] * a[2][2] - a[1][2] * a[2][1];
    let c11 = a[0][0] * a[2][2] - a[0][2] * a[2][0];
    let c22 = a[0][0] * a[1][1] - a[0][1] * a[1][0];
    ((c00 + c11 + c22) / det).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rf::generate::{generate, noise_floor_dbm, Modulation};
    use crate::ops::rf::rng::dataset_key;
    use crate::ops::rf::scenario::{ModulationMix, Site};

    fn short() -> Scenario {
        let mut s = Scenario::default();
        s.signal.duration_ms = 200.0;
        s.chunk_ms = 50.0;
        s.geometry.receivers_min = 3;
        s.geometry.receivers_max = 5;
        s
    }

    /// `sample` runs inside the dataset's rayon pool and its feature extraction fans out
    /// on the same pool: a thread waiting for its chunks may steal another sample and
    /// evaluate it on the same stack. Seen on a 16-core H200 host in `gpu-ops check`
    /// ("RefCell already borrowed"); many threads on small chunks make it likely here.
    #[test]
    fn samples_evaluated_on_one_thread_while_another_waits_do_not_collide() {
        let mut s = short();
        s.chunk_ms = 20.0;
        s.signal.duration_ms = 400.0;
        let key = dataset_key(12);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(16)
            .build()
            .unwrap();
        for round in 0..4u64 {
            let parallel: Vec<SampleRecord> = pool.install(|| {
                (round * 32..(round + 1) * 32)
                    .into_par_iter()
                    .map(|n| sample(&s, key, n, false).0)
                    .collect()
            });
            for r in parallel.iter().step_by(8) {
                let alone = sample(&s, key, r.index, false).0;
                // Debug text: a feature may be NaN (which equals nothing), the same bits.
                assert_eq!(
                    format!("{:?}", r.features),
                    format!("{:?}", alone.features),
                    "sample {}",
                    r.index
                );
            }
        }
    }

    #[test]
    fn a_sample_depends_only_on_seed_and_index() {
        let s = short();
        let key = dataset_key(11);
        let alone = generate(&s, key, 5);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let batch: Vec<_> = pool.install(|| {
            (3..7u64)
                .into_par_iter()
                .map(|n| generate(&s, key, n))
                .collect()
        });
        let again = &batch[2];
        assert_eq!(alone.tx, again.tx);
        assert_eq!(alone.receivers, again.receivers);
        assert!(alone.iq == again.iq);
        assert!(generate(&s, dataset_key(12), 5).iq != alone.iq);
        assert!(batch[0].iq != alone.iq);
        assert!((3..=5).contains(&alone.receivers.len()));
    }

    /// A clean channel: no shadowing, terrain, fluctuation, multipath or fading spread.
    fn clean(mut s: Scenario) -> Scenario {
        let p = &mut s.propagation;
        p.shadowing_std_db = 0.0;
        p.terrain_loss_max_db = 0.0;
        p.tx_power_std_db = 0.0;
        p.max_extra_taps = 0;
        p.k_factor_db = 40.0;
        p.k_factor_slope_db_per_km = 0.0;
        p.rayleigh_beyond_km = 1e9;
        s.signal.mix = ModulationMix {
            fm_voice: 0.0,
            fm_tone: 0.0,
            fm_dtmf: 0.0,
            am: 0.0,
            carrier: 1.0,
        };
        s
    }

    #[test]
    fn power_noise_floor_and_carrier_offset_arrive_as_modelled() {
        let mut s = clean(short());
        s.receiver.drift_ppm_per_s_std = 0.0;
        let key = dataset_key(3);
        for n in 0..3 {
            let (rec, _, _) = sample(&s, key, n, false);
            assert_eq!(rec.tx.modulation, Modulation::Carrier);
            for (r, f) in rec.receivers.iter().zip(&rec.features) {
                let get = |name: &str| f[feature_index(name)];
                assert!(
                    (get("noise_floor_dbm").mean - noise_floor_dbm(&s)).abs() < 0.3,
                    "{r:?}"
                );
                // K = 40 dB: the fading gain stays within ~±0.1 dB of one.
                let p =
                    10f64.powf(r.received_power_dbm / 10.0) + 10f64.powf(r.noise_floor_dbm / 10.0);
                assert!(
                    (get("rssi_dbm").mean - 10.0 * p.log10()).abs() < 0.3,
                    "{r:?}"
                );
                if get("signal_present").min == 1.0 {
                    assert!(
                        (get("frequency_offset_hz").mean - r.carrier_offset_hz).abs() < 20.0,
                        "{r:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn oscillator_drift_is_applied() {
        let mut s = clean(short());
        s.signal.duration_ms = 1000.0;
        s.chunk_ms = 200.0;
        s.receiver.drift_ppm_per_s_std = 5.0; // ~2 kHz/s at 433.92 MHz
        s.propagation.tx_power_dbm = 60.0; // strong everywhere
        let g = generate(&s, dataset_key(8), 0);
        let cfg = ExtractConfig {
            sample_rate_hz: s.signal.sample_rate_hz,
            chunk_ms: s.chunk_ms,
        };
        for (r, x) in g.receivers.iter().zip(&g.iq) {
            let ex = extract(x, &cfg).unwrap();
            let offsets: Vec<f64> = ex
                .chunks
                .iter()
                .map(|c| c[feature_index("frequency_offset_hz")])
                .collect();
            // Chunk c is centred at 0.1 + 0.2c s.
            for (c, f) in offsets.iter().enumerate() {
                let want = r.carrier_offset_hz + r.drift_hz_per_s * (0.1 + 0.2 * c as f64);
                assert!((f - want).abs() < 25.0, "chunk {c}: {f} vs {want} ({r:?})");
            }
        }
    }

    #[test]
    fn gdop_of_known_geometries() {
        let square = [(1.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0)];
        assert!((gdop(&square) - 1.25f64.sqrt()).abs() < 1e-12);
        assert_eq!(gdop(&square[..2]), f64::INFINITY);
        // Three receivers in one direction: no geometry to speak of.
        assert_eq!(gdop(&[(1.0, 0.0), (2.0, 0.0), (3.0, 0.0)]), f64::INFINITY);
    }

    #[test]
    fn samples_are_rejected_for_each_reason() {
        let mut far = clean(short());
        far.geometry.receivers = vec![
            Site {
                lat: 47.0,
                lon: 8.0,
                alt_m: 10.0,
            },
            Site {
                lat: 47.0,
                lon: 8.1,
                alt_m: 10.0,
            },
            Site {
                lat: 47.1,
                lon: 8.0,
                alt_m: 10.0,
            },
        ];
        far.propagation.tx_power_dbm = -40.0;
        assert_eq!(
            sample(&far, dataset_key(1), 0, false).0.rejected,
            Some(Rejection::TooFewReceivers)
        );
        let mut strict = clean(short());
        strict.propagation.tx_power_dbm = 60.0;
        strict.quality.min_snr_db = 99.0;
        assert_eq!(
            sample(&strict, dataset_key(1), 0, false).0.rejected,
            Some(Rejection::LowSnr)
        );
        strict.quality.min_snr_db = 3.0;
        strict.quality.max_gdop = 1.0; // below the best possible geometry (√(5/4)·…)
        assert_eq!(
            sample(&strict, dataset_key(1), 0, false).0.rejected,
            Some(Rejection::HighGdop)
        );
        strict.quality.max_gdop = 1e6;
        let ok = sample(&strict, dataset_key(1), 0, false).0;
        assert_eq!(ok.rejected, None, "{:?}", ok.quality);
    }

    #[test]
    fn records_from_sums_assemble_what_sample_computes() {
        // The device path's bookkeeping, with the sums computed on the CPU: the same
        // records as `sample`, bit for bit, recordings kept for accepted samples only.
        use crate::ops::rf::features::{chunk_sums, hann};
        use crate::ops::rf::generate::receive;
        let mut s = short();
        s.quality.min_snr_db = 12.0;
        let key = dataset_key(13);
        let indices = 20..28u64;
        let plans: Vec<SamplePlan> = indices.clone().map(|n| plan(&s, key, n)).collect();
        let (chunk, seg) = features::plan(&extract_config(&s), samples_per_recording(&s)).unwrap();
        let fft = crate::ops::rf::fft_plan(seg);
        let window = hann(seg);
        let recordings: Vec<Vec<Vec<Complex32>>> = plans
            .iter()
            .map(|p| p.plans.iter().map(|r| receive(r, &p.wave)).collect())
            .collect();
        let sums: Vec<_> = recordings
            .iter()
            .flatten()
            .flat_map(|x| {
                x.chunks_exact(chunk)
                    .map(|c| chunk_sums(c, &window, fft.as_ref()))
            })
            .collect();
        let got = records_from_sums(
            &s,
            indices.clone(),
            plans,
            &sums,
            Some(recordings),
            chunk,
            seg,
        );
        let mut decisions = std::collections::HashSet::new();
        for (g, n) in got.iter().zip(indices) {
            let (want, _, _) = sample(&s, key, n, true);
            decisions.insert(want.rejected);
            assert_eq!(g.index, n);
            assert_eq!(g.rejected, want.rejected);
            assert_eq!(g.features, want.features);
            assert_eq!(g.quality, want.quality);
            assert_eq!(g.iq, want.iq);
            assert!(records_agree(g, &want, segment_len(&s)).is_ok());
        }
        // Both decisions occur, so the kept-recordings rule was exercised.
        assert!(decisions.len() > 1, "{decisions:?}");
        let mut off = got[0].clone();
        off.features[0][feature_index("rssi_dbm")].mean += 0.01;
        assert!(records_agree(&off, &got[0], segment_len(&s)).is_err());
    }
}
