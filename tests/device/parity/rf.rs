//! RF recordings, chunk sums, waveforms, dataset records and upload features. The upload
//! features are a job (`FeaturesJob`, held to its own `agrees`); the rest are the dataset
//! path's kernels, compared piece by piece: recordings within 1e-6 of the signal (or the
//! noise), features within the tolerances (1e-3 dB, 0.1 Hz).

use super::{on_every_device, Device};
use gpu_ops::backend::Job;
use gpu_ops::ops::rf::features::{
    self, chunk_sums, extract, extract_from_sums, Extraction, FEATURE_NAMES,
};
use gpu_ops::ops::rf::generate::{draft, generate, plan, receive};
use gpu_ops::ops::rf::gpu::{
    chunks_of, launch_receive, launch_receive_and_reduce, launch_waveforms, pack, pack_drafts,
    unpack,
};
use gpu_ops::ops::rf::rng::dataset_key;
use gpu_ops::ops::rf::scenario::Scenario;
use gpu_ops::ops::rf::{ExtractConfig, FeaturesJob};

/// RF samples per test here: fewer under ThreadSanitizer.
fn rf_samples(d: &Device, n: u64) -> u64 {
    if d.race_checked() {
        n.min(3)
    } else {
        n
    }
}

/// The scenario of the dataset-path cases: the service's default, 400 ms long instead of
/// 1 s. Two feature chunks a receiver and 80 000 samples (ten times the emulated device's
/// 32 × 256 threads) still cross every branch of the kernels, at two fifths of the work:
/// the emulated device runs each GPU thread as a fiber on the CPU, and under
/// ThreadSanitizer these cases at 1 s were two thirds of CI's race-checked run.
fn scenario() -> Scenario {
    let mut s = Scenario::default();
    s.signal.duration_ms = 2.0 * s.chunk_ms;
    s
}

/// `x < bound` and `x <= bound`, false for a NaN: comparisons that a NaN fails.
fn below<T: PartialOrd>(x: T, bound: T) -> bool {
    x < bound
}

fn at_most<T: PartialOrd>(x: T, bound: T) -> bool {
    x <= bound
}

/// Whether feature `name` from the device is within the tolerance of the CPU's:
/// 0.1 Hz for frequencies, 1e-3 (dB and the rest) otherwise, or 1e-6 relative. A NaN is
/// not.
fn feature_close(name: &str, got: f64, want: f64) -> bool {
    let tol = if name.ends_with("_hz") { 0.1 } else { 1e-3 };
    let diff = (got - want).abs();
    at_most(diff, tol) || at_most(diff, 1e-6 * want.abs())
}

/// Each aggregated feature's mean within `feature_close`.
fn features_close(d: &Device, case: &str, got: &[features::Stats], want: &[features::Stats]) {
    for (i, name) in FEATURE_NAMES.iter().enumerate() {
        let (g, w) = (got[i].mean, want[i].mean);
        if !feature_close(name, g, w) {
            d.fail(case, format!("{name}: {g} vs {w}"));
        }
    }
}

/// `rf_receive` against `generate::receive`, and the features of the device's recordings
/// against the CPU's.
#[test]
fn rf_recordings_match_the_cpu() {
    let s = scenario();
    let key = dataset_key(5);
    let all: Vec<_> = (0..6).map(|n| plan(&s, key, n)).collect();
    let cfg = gpu_ops::ops::rf::dataset::extract_config(&s);
    on_every_device("rf_recordings_match_the_cpu", |d| {
        let plans = &all[..rf_samples(d, 6) as usize];
        let batch = pack(&plans.iter().collect::<Vec<_>>());
        let out = match launch_receive(&batch, &d.lease()) {
            Ok(out) => out,
            Err(e) => return d.fail("rf_receive", e),
        };
        let got = unpack(&batch, &out);
        for (n, (sample, recordings)) in plans.iter().zip(&got).enumerate() {
            for (r, (p, rec)) in sample.plans.iter().zip(recordings).enumerate() {
                let case = format!("sample {n} rx {r}");
                let want = receive(p, &sample.wave);
                let worst = rec
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| {
                        f64::from((a - b).norm()) / f64::from(b.norm()).max(p.noise_sigma)
                    })
                    .fold(0.0, f64::max);
                if !below(worst, 1e-6) {
                    d.fail(&case, format!("relative difference {worst}"));
                }
                let (fa, fb) = (
                    extract(rec, &cfg).unwrap().aggregate(),
                    extract(&want, &cfg).unwrap().aggregate(),
                );
                features_close(d, &case, &fa, &fb);
            }
        }
    });
}

/// The device's chunk sums against the CPU's over the device's own recordings, then end
/// to end: features from the device's sums against the CPU's extraction of the CPU's
/// recordings.
#[test]
fn rf_chunk_sums_match_the_cpu() {
    let s = scenario();
    let key = dataset_key(6);
    let all: Vec<_> = (0..6).map(|n| plan(&s, key, n)).collect();
    let cfg = gpu_ops::ops::rf::dataset::extract_config(&s);
    on_every_device("rf_chunk_sums_match_the_cpu", |d| {
        let plans = &all[..rf_samples(d, 6) as usize];
        let batch = pack(&plans.iter().collect::<Vec<_>>());
        let (chunk, seg) = features::plan(&cfg, batch.receivers[0].len as usize).unwrap();
        let chunks = chunks_of(&batch, chunk);
        let window = features::hann(seg);
        let fft = fft_plans::F32Planner::default().forward(seg);
        let (iq, sums) = match launch_receive_and_reduce(&batch, chunk, seg, true, &d.lease()) {
            Ok((Some(iq), sums)) if sums.len() == chunks.len() => (iq, sums),
            Ok((iq, sums)) => {
                let kept = iq.is_some();
                let got = sums.len();
                let want = chunks.len();
                return d.fail(
                    "rf_receive_and_reduce",
                    format!("recordings kept: {kept}, {got} chunk sums for {want} chunks"),
                );
            }
            Err(e) => return d.fail("rf_receive_and_reduce", e),
        };
        for (i, (c, got)) in chunks.iter().zip(&sums).enumerate() {
            let case = format!("chunk {i}");
            let want = chunk_sums(&c.samples(&iq), &window, fft.as_ref());
            if (got.crossings, got.power_max, got.segments)
                != (want.crossings, want.power_max, want.segments)
            {
                d.fail(&case, "crossings, peak power or segment count differ");
            }
            if !((got.power_sum - want.power_sum).abs() <= 1e-12 * want.power_sum
                && (got.magnitude_sum - want.magnitude_sum).abs() <= 1e-12 * want.magnitude_sum)
            {
                d.fail(&case, "power or magnitude sums differ");
            }
            let peak = want.bins.iter().copied().fold(0.0, f64::max);
            for (j, (a, b)) in got.bins.iter().zip(&want.bins).enumerate() {
                if !at_most((a - b).abs(), 2e-5 * (b + 1e-6 * peak)) {
                    d.fail(&case, format!("bin {j}: {a} vs {b}"));
                }
            }
        }
        let per_rx = chunks.len() / batch.receivers.len();
        let recordings = unpack(&batch, &iq);
        let mut at = 0;
        for (n, (sample, recs)) in plans.iter().zip(&recordings).enumerate() {
            for (r, p) in sample.plans.iter().enumerate() {
                if recs[r].len() != sample.wave.len() {
                    d.fail(
                        format!("sample {n} rx {r}"),
                        "a recording of the wrong length",
                    );
                }
                let got = extract_from_sums(&sums[at..at + per_rx], cfg.sample_rate_hz, chunk, seg)
                    .aggregate();
                at += per_rx;
                let want = extract(&receive(p, &sample.wave), &cfg)
                    .unwrap()
                    .aggregate();
                features_close(d, &format!("sample {n} rx {r}"), &got, &want);
            }
        }
    });
}

/// `rf_waveform` against `WaveSpec::synthesize` for every modulation, and the dataset
/// device path (waveforms, recordings and chunk sums on the device) against the CPU's
/// records of the same samples.
#[test]
fn rf_waveforms_and_dataset_records_match_the_cpu() {
    use gpu_ops::ops::rf::dataset::{records_agree, sample, samples_on_device, segment_len};
    let mut s = scenario();
    let m = &mut s.signal.mix;
    (m.fm_voice, m.fm_tone, m.fm_dtmf, m.am, m.carrier) = (1.0, 1.0, 1.0, 1.0, 1.0);
    let key = dataset_key(7);
    let drafts: Vec<_> = (0..20).map(|n| draft(&s, key, n)).collect();
    let batch = pack_drafts(&drafts.iter().collect::<Vec<_>>());
    let plans: Vec<_> = drafts.into_iter().map(|d| d.synthesized()).collect();
    let want = pack(&plans.iter().collect::<Vec<_>>());
    on_every_device("rf_waveforms_and_dataset_records_match_the_cpu", |d| {
        let lease = d.lease();
        let (re, im) = match launch_waveforms(&batch, &lease) {
            Ok(waves) => waves,
            Err(e) => return d.fail("rf_waveform", e),
        };
        let worst = re
            .iter()
            .chain(&im)
            .zip(want.wave_re.iter().chain(&want.wave_im))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        if !below(worst, 1e-6) {
            d.fail("waveforms", format!("worst difference {worst}"));
        }
        let got = samples_on_device(&s, key, 0..rf_samples(d, 20), false, &lease)
            .expect("device path runs");
        for (n, g) in got.iter().enumerate() {
            let (cpu, _, _) = sample(&s, key, n as u64, false);
            if let Err(e) = records_agree(g, &cpu, segment_len(&s)) {
                d.fail(format!("sample {n}"), e);
            }
        }
    });
}

/// `/rf/features` on the device against the CPU's extraction of the same upload.
#[test]
fn rf_features_of_an_upload_match_the_cpu() {
    let s = Scenario::default();
    let sample = generate(&s, dataset_key(8), 0);
    let job = FeaturesJob {
        iq: sample.iq[0].clone(),
        config: ExtractConfig {
            sample_rate_hz: s.signal.sample_rate_hz,
            chunk_ms: 150.0,
        },
    };
    assert!(job.device_refusal().is_none());
    let want = job.run_cpu().unwrap();
    // About three feature chunks a pass under this limit (each chunk's samples in and
    // its record of at most 4 100 sums out, the tables besides): the stream's chunks
    // hold one or two, on two lanes.
    let size = (job.config.sample_rate_hz * job.config.chunk_ms / 1e3) as usize;
    let limited = 3 * (8 * size + 8 * 4100) + (64 << 10);
    on_every_device("rf_features_of_an_upload_match_the_cpu", |d| {
        check_upload(d, &job, &want, "upload");
        d.in_passes(limited as u64, |d| {
            check_upload(d, &job, &want, "upload in chunks")
        });
    });
}

/// The job's own agreement (the service's shadow checks), then every feature of every
/// chunk within the tolerance, which is stricter on the noise floor.
fn check_upload(d: &Device, job: &FeaturesJob, want: &Extraction, case: &str) {
    {
        let Some(got) = d.check(case, job) else {
            return;
        };
        let got = got.expect("the CPU extracted, so the device did");
        if got.chunks.len() != want.chunks.len() {
            return d.fail(
                case,
                format!(
                    "{} chunks, {} expected",
                    got.chunks.len(),
                    want.chunks.len()
                ),
            );
        }
        for (i, (g, w)) in got.chunks.iter().zip(&want.chunks).enumerate() {
            for (name, (a, b)) in FEATURE_NAMES.iter().zip(g.iter().zip(w)) {
                if !feature_close(name, *a, *b) {
                    d.fail(format!("{case}: chunk {i}"), format!("{name}: {a} vs {b}"));
                }
            }
        }
    }
}
