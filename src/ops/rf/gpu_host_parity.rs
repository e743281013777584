//! `kernels/rf.cuh`, `kernels/rf_waveform.cuh` and `kernels/rf_features.cuh` compiled
//! for the host (kernels/host/rf_host.cpp) against the CPU twins `generate::receive`,
//! `WaveSpec::synthesize` and `features::chunk_sums`, on packed batches exactly as
//! `gpu::launch_receive` and `gpu::launch_receive_and_reduce` upload them.

use super::dataset::extract_config;
use super::features::{self, chunk_sums, extract_from_sums, ChunkSums, ExtractConfig};
use super::generate::{draft, plan, receive, Modulation};
use super::gpu::{
    chunk_sums as sums_of, chunks_of, pack, pack_drafts, recording_chunks, twiddles, unpack, Batch,
    RfChunk, RfReceiver, RfWave,
};
use super::rng::dataset_key;
use super::scenario::{Environment, Scenario};

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn gpu_ops_host_rf_receive(
        receivers: *const RfReceiver,
        count: usize,
        wave_re: *const f32,
        wave_im: *const f32,
        coeff_offset: *const i64,
        coeff_re: *const f32,
        coeff_im: *const f32,
        gains: *const f64,
        out: *mut f32,
    );
    fn gpu_ops_host_rf_waveform(
        waves: *const RfWave,
        count: usize,
        params: *const f64,
        wave_re: *mut f32,
        wave_im: *mut f32,
    );
    #[allow(clippy::too_many_arguments)]
    fn gpu_ops_host_rf_chunk_reduce(
        rec: *const f32,
        chunks: *const RfChunk,
        count: usize,
        window: *const f32,
        tw: *const f32,
        seg: u32,
        bits: u32,
        out: *mut f64,
    );
}

/// `rf_chunk_reduce`'s arithmetic on the host over interleaved recordings.
fn host_reduce(rec: &[f32], chunks: &[RfChunk], seg: usize) -> Vec<ChunkSums> {
    assert!(chunks
        .iter()
        .all(|c| 2 * (c.start + c.len) as usize <= rec.len()));
    let window = features::hann(seg);
    let tw = twiddles(seg);
    let mut records = vec![f64::NAN; chunks.len() * (seg + 4)];
    // SAFETY: every chunk lies inside rec (asserted), window holds seg floats and tw seg/2
    // pairs, records seg + 4 doubles per chunk.
    unsafe {
        gpu_ops_host_rf_chunk_reduce(
            rec.as_ptr(),
            chunks.as_ptr(),
            chunks.len(),
            window.as_ptr(),
            tw.as_ptr(),
            seg as u32,
            seg.trailing_zeros(),
            records.as_mut_ptr(),
        )
    };
    sums_of(chunks, seg, &records)
}

/// `rf_waveform`'s arithmetic on the host: fills a `pack_drafts` batch's waveform arrays.
fn host_waveforms(b: &mut Batch) {
    assert!(b.waves.iter().all(|w| w.out + w.total <= b.wave_len));
    b.wave_re = vec![f32::NAN; b.wave_len as usize];
    b.wave_im = vec![f32::NAN; b.wave_len as usize];
    // SAFETY: every wave lies inside the arrays of wave_len floats (asserted); its pairs
    // were appended to wave_params by pack_drafts.
    unsafe {
        gpu_ops_host_rf_waveform(
            b.waves.as_ptr(),
            b.waves.len(),
            b.wave_params.as_ptr(),
            b.wave_re.as_mut_ptr(),
            b.wave_im.as_mut_ptr(),
        )
    };
}

fn host_receive(b: &Batch) -> Vec<f32> {
    let mut out = vec![f32::NAN; 2 * b.out_len as usize];
    // SAFETY: the arrays are the packed batch's (offsets made by `pack` over them) and out
    // holds 2·out_len floats.
    unsafe {
        gpu_ops_host_rf_receive(
            b.receivers.as_ptr(),
            b.receivers.len(),
            b.wave_re.as_ptr(),
            b.wave_im.as_ptr(),
            b.coeff_offset.as_ptr(),
            b.coeff_re.as_ptr(),
            b.coeff_im.as_ptr(),
            b.gains.as_ptr(),
            out.as_mut_ptr(),
        )
    };
    out
}

#[test]
fn the_kernel_arithmetic_matches_the_cpu_twin_on_a_packed_batch() {
    let mut s = Scenario::default();
    s.signal.duration_ms = 30.0;
    s.propagation.coherence_time_ms = 7.0;
    // Urban delays reach several samples at a high rate, so the FIR has far taps too.
    s.propagation.environment = Environment::Urban;
    s.signal.sample_rate_hz = 2e6;
    s.signal.bandwidth_hz = 200e3;
    let key = dataset_key(21);
    let plans: Vec<_> = (0..4).map(|n| plan(&s, key, n)).collect();
    let batch = pack(&plans.iter().collect::<Vec<_>>());
    assert_eq!(
        batch.receivers.len(),
        plans.iter().map(|p| p.plans.len()).sum::<usize>()
    );
    let got = unpack(&batch, &host_receive(&batch));
    let (mut worst, mut identical, mut total) = (0.0f64, 0usize, 0usize);
    for (sample, recordings) in plans.iter().zip(&got) {
        for (p, rec) in sample.plans.iter().zip(recordings) {
            let want = receive(p, &sample.wave);
            assert_eq!(rec.len(), want.len());
            for (a, b) in rec.iter().zip(&want) {
                let scale = f64::from(b.norm()).max(p.noise_sigma);
                worst = worst.max(f64::from((a - b).norm()) / scale);
                identical += usize::from(a == b);
                total += 1;
            }
        }
    }
    // Only the rotation differs (direct vs recurrence, ~1e-12): at most an f32 rounding,
    // and rarely (about 1 output in 10⁴ here).
    assert!(worst < 2e-7, "worst relative difference {worst}");
    assert!(
        identical * 1000 > total * 999,
        "{identical} of {total} bit-identical"
    );
}

#[test]
fn the_chunk_reduction_matches_the_cpu_sums_and_features() {
    let mut s = Scenario::default();
    s.signal.duration_ms = 400.0;
    let key = dataset_key(22);
    let plans: Vec<_> = (0..3).map(|n| plan(&s, key, n)).collect();
    let batch = pack(&plans.iter().collect::<Vec<_>>());
    let rec = host_receive(&batch);
    let cfg = extract_config(&s);
    let (chunk, seg) = features::plan(&cfg, batch.receivers[0].len as usize).unwrap();
    let chunks = chunks_of(&batch, chunk);
    assert_eq!(chunks.len(), batch.receivers.len() * 2);
    let got = host_reduce(&rec, &chunks, seg);
    let fft = super::fft_plan(seg);
    let window = features::hann(seg);
    let (mut worst_bin, mut worst_sum) = (0.0f64, 0.0f64);
    for (c, g) in chunks.iter().zip(&got) {
        let want = chunk_sums(&c.samples(&rec), &window, fft.as_ref());
        assert_eq!(
            (g.crossings, g.power_max.to_bits(), g.segments),
            (want.crossings, want.power_max.to_bits(), want.segments)
        );
        for (a, b) in [
            (g.power_sum, want.power_sum),
            (g.magnitude_sum, want.magnitude_sum),
        ] {
            worst_sum = worst_sum.max((a - b).abs() / b);
        }
        // Two f32 FFTs (radix 2 here, rustfft's mixed radix there): each bin within a few
        // f32 roundings of the segment's largest.
        let peak = want.bins.iter().copied().fold(0.0, f64::max);
        for (a, b) in g.bins.iter().zip(&want.bins) {
            worst_bin = worst_bin.max((a - b).abs() / (b + 1e-6 * peak));
        }
        // The features from either side's sums.
        assert_features_agree(
            &extract_from_sums(std::slice::from_ref(g), cfg.sample_rate_hz, chunk, seg),
            &extract_from_sums(std::slice::from_ref(&want), cfg.sample_rate_hz, chunk, seg),
        );
    }
    assert!(worst_sum < 1e-12, "envelope sums {worst_sum}");
    assert!(worst_bin < 2e-5, "bins {worst_bin}");
}

/// Every chunk's features within the tolerances: 1e-3 dB, 0.1 Hz, and 1e-6
/// relative for the rest.
fn assert_features_agree(got: &features::Extraction, want: &features::Extraction) {
    assert_eq!(got.chunks.len(), want.chunks.len());
    for (g, w) in got.chunks.iter().zip(&want.chunks) {
        for (f, (a, b)) in features::FEATURE_NAMES.iter().zip(g.iter().zip(w)) {
            let tolerance = if f.ends_with("_db") || f.ends_with("_dbm") || f.ends_with("_per_hz") {
                1e-3
            } else if f.ends_with("_hz") {
                0.1
            } else {
                1e-6 * b.abs().max(1e-9)
            };
            assert!((a - b).abs() <= tolerance, "{f}: {a} vs {b}");
        }
    }
}

/// Every modulation in equal shares.
fn every_modulation(s: &mut Scenario) {
    let m = &mut s.signal.mix;
    (m.fm_voice, m.fm_tone, m.fm_dtmf, m.am, m.carrier) = (1.0, 1.0, 1.0, 1.0, 1.0);
}

#[test]
fn the_waveform_kernel_matches_the_cpu_synthesis() {
    // The default rate, and urban delays at 2 MHz for leads of many samples.
    let mut urban = Scenario::default();
    urban.signal.sample_rate_hz = 2e6;
    urban.signal.bandwidth_hz = 200e3;
    urban.propagation.environment = Environment::Urban;
    for (mut s, ms) in [(Scenario::default(), 250.0), (urban, 30.0)] {
        every_modulation(&mut s);
        s.signal.duration_ms = ms;
        let key = dataset_key(23);
        let drafts: Vec<_> = (0..20).map(|n| draft(&s, key, n)).collect();
        let kinds: std::collections::HashSet<Modulation> =
            drafts.iter().map(|d| d.tx.modulation).collect();
        assert_eq!(kinds.len(), Modulation::ALL.len(), "{kinds:?}");
        let mut got = pack_drafts(&drafts.iter().collect::<Vec<_>>());
        host_waveforms(&mut got);
        let plans: Vec<_> = drafts.into_iter().map(|d| d.synthesized()).collect();
        let want = pack(&plans.iter().collect::<Vec<_>>());
        assert_eq!(got.receivers, want.receivers);
        assert_eq!(got.wave_len, want.wave_len);
        let (mut worst, mut identical) = (0.0f32, 0usize);
        for (a, b) in got
            .wave_re
            .iter()
            .chain(&got.wave_im)
            .zip(want.wave_re.iter().chain(&want.wave_im))
        {
            worst = worst.max((a - b).abs());
            identical += usize::from(a.to_bits() == b.to_bits());
        }
        // The phase summed per stretch instead of wrapped per sample, the sines direct
        // instead of by rotation: ~1e-10 in f64, so at most an f32 rounding of values up
        // to 2, and rarely (3 in 10⁵ here).
        assert!(worst < 2.5e-7, "worst difference {worst}");
        assert!(
            identical * 1000 > 2 * want.wave_re.len() * 999,
            "{identical} of {} bit-identical",
            2 * want.wave_re.len()
        );
    }
}

#[test]
fn device_waveforms_give_the_cpu_features() {
    // The dataset device path's whole chain in the kernels' arithmetic: waveforms,
    // recordings and chunk sums, against the CPU's synthesis, receive and extract.
    let mut s = Scenario::default();
    every_modulation(&mut s);
    s.signal.duration_ms = 400.0;
    let key = dataset_key(24);
    let drafts: Vec<_> = (0..5).map(|n| draft(&s, key, n)).collect();
    let mut batch = pack_drafts(&drafts.iter().collect::<Vec<_>>());
    host_waveforms(&mut batch);
    let rec = host_receive(&batch);
    let cfg = extract_config(&s);
    let (chunk, seg) = features::plan(&cfg, batch.receivers[0].len as usize).unwrap();
    let sums = host_reduce(&rec, &chunks_of(&batch, chunk), seg);
    let mut per_receiver = sums.chunks(sums.len() / batch.receivers.len());
    for d in drafts {
        let sample = d.synthesized();
        for p in &sample.plans {
            let got =
                extract_from_sums(per_receiver.next().unwrap(), cfg.sample_rate_hz, chunk, seg);
            assert_features_agree(
                &got,
                &features::extract(&receive(p, &sample.wave), &cfg).unwrap(),
            );
        }
    }
    assert!(per_receiver.next().is_none());
}

#[test]
fn an_uploaded_recording_reduces_to_the_cpu_features() {
    // `/rf/features` on the device: one recording cut as `extract` cuts it (a trailing
    // part left out; a recording shorter than a chunk one chunk), reduced by the kernel's
    // arithmetic, the features derived once per shape.
    let s = Scenario::default();
    let sample = plan(&s, dataset_key(25), 0);
    let cfg = ExtractConfig {
        sample_rate_hz: s.signal.sample_rate_hz,
        chunk_ms: 80.0,
    };
    let full = receive(&sample.plans[0], &sample.wave);
    for len in [full.len(), 2 * 16_000 + 5_000, 9_000] {
        let iq = &full[..len];
        let (chunk, seg) = features::plan(&cfg, len).unwrap();
        let chunks: Vec<RfChunk> = recording_chunks(0, len as u64, chunk).collect();
        assert_eq!(chunks.len(), (len / chunk).max(1), "{len}");
        let interleaved: Vec<f32> = iq.iter().flat_map(|c| [c.re, c.im]).collect();
        let sums = host_reduce(&interleaved, &chunks, seg);
        assert_features_agree(
            &features::Derivation::new(chunk, seg).extract(&sums, cfg.sample_rate_hz),
            &features::extract(iq, &cfg).unwrap(),
        );
    }
}
