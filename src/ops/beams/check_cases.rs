//! The beams ops under `gpu-ops check`: each op at the level's sizes, with fresh random
//! inputs and edge values, held to its CPU twin; what the report says of each case.
//!
//! Standard: channels of a mmWave cell (16 384 channels between an 8 × 8 planar array
//! and a 4 × 4 one, 8 paths, f64), and of the service's extremes (4 096 channels from a
//! 256-element linear array to a 4-element one over 64 paths, the most, f32); a sweep of
//! 4 096 generated channels of the cell with DFT codebooks oversampled twice (256 × 64
//! beams, 16 384 pairs a channel) and measurement noise, best pairs reduced on the
//! device; a sweep of 1 024 uploaded channels (64-element linear array to 8) with a DFT
//! codebook oversampled four times and an uploaded receive codebook, the power grid
//! returned in f32.
//! Quick (the emulated device, 8 192 threads a launch, 32 blocks): channels past one
//! grid stride (9 600 values; 14 000 phasors), and one of the largest array and the most
//! paths; a generated sweep of 40 channels (past the 32 blocks of the best-pair
//! reduction) of 512 pairs (20 480, past one grid stride) with noise; an uploaded sweep
//! with its grid.
//!
//! Edges: angle ranges out to ±90° (endfire, and straight up); a zero channel and one
//! scaled by 10^3 among the uploaded ones; channel indices far into the seed's sequence.
//!
//! CPU twins at the standard level, on the GPU host's 16 cores, scaled linearly from this
//! 2-core machine (test profile measured here at an eighth or a quarter of each batch,
//! under a load of about 5; the `gemm` products run at dependency optimisation there, as
//! in release):
//! - forming 16 384 cell channels (134 M complex products): 0.25 s (246 ms for 2 048);
//! - forming 4 096 channels of 64 paths (268 M products, 68 M phasors): 0.7 s (676 ms for
//!   512);
//! - the generated sweep (8.6 GFLOP and 67 M noise draws, with `agrees`' bounds): 0.9 s
//!   (886 ms for 512);
//! - the uploaded sweep: 55 ms (118 ms for 256).
//!
//! About 2 s in the test profile, less in release.

use super::geometry::{Array, ChannelSpec, PATH_WORDS};
use super::{Channels, ChannelsJob, Codebook, MeasurementNoise, SweepJob};
use crate::backend::measure::{case_seed, CaseInfo, CheckLevel};
use crate::backend::verify::{JobCheck, SelfTest};
use crate::ops::invalid::FieldPath;
use crate::ops::linalg::Dtype;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn array(rows: usize, columns: usize) -> Array {
    Array::new(rows, columns, FieldPath::root()).expect("a valid array")
}

fn array_label(a: Array) -> String {
    format!("{}×{}", a.rows, a.columns)
}

/// A batch of `count` channels from `seed`, starting far into its sequence.
fn spec(tx: Array, rx: Array, paths: usize, count: usize, wide: bool, seed: u64) -> ChannelSpec {
    let (azimuth_deg, elevation_deg) = if wide {
        ((-90.0, 90.0), (-90.0, 90.0))
    } else {
        ((-60.0, 60.0), (-15.0, 30.0))
    };
    ChannelSpec {
        tx,
        rx,
        paths,
        azimuth_deg,
        elevation_deg,
        seed,
        first: seed % (1 << 40),
        count,
    }
}

/// Complex multiply-adds are 8 flops.
const CMAC_FLOPS: f64 = 8.0;

fn channels_case(s: ChannelSpec, output: Dtype) -> (CaseInfo, ChannelsJob) {
    let (nr, nt) = (s.rx.elements(), s.tx.elements());
    let label = format!(
        "{} channels, {} tx → {} rx, {} paths{}, {}",
        s.count,
        array_label(s.tx),
        array_label(s.rx),
        s.paths,
        if s.azimuth_deg.1 >= 90.0 {
            ", angles to ±90°"
        } else {
            ""
        },
        output.name()
    );
    // The path words read once, the channels written once (the kernel writes f64).
    let bytes = 8 * s.count * (PATH_WORDS * s.paths + 2 * nr * nt);
    let flops = CMAC_FLOPS * (s.count * nr * nt * s.paths) as f64;
    let info = CaseInfo::labelled(label)
        .with_bytes(bytes as f64)
        .with_flops(flops);
    (info, ChannelsJob::new(s, output).expect("a valid spec"))
}

fn channels_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, ChannelsJob)> {
    match level {
        CheckLevel::Quick => vec![
            channels_case(
                spec(array(2, 4), array(3, 2), 5, 200, false, seed),
                Dtype::F64,
            ),
            channels_case(
                spec(array(1, 1024), array(1, 3), 64, 3, true, seed ^ 1),
                Dtype::F32,
            ),
        ],
        CheckLevel::Standard => vec![
            channels_case(
                spec(array(8, 8), array(4, 4), 8, 16_384, false, seed),
                Dtype::F64,
            ),
            channels_case(
                spec(array(1, 256), array(1, 4), 64, 4_096, true, seed ^ 1),
                Dtype::F32,
            ),
        ],
    }
}

/// `beams` beams of `elements` random complex weights (each of norm about 1), the first
/// one zero.
fn uploaded_codebook(beams: usize, elements: usize, rng: &mut SmallRng) -> Codebook {
    let scale = (1.5 / elements as f64).sqrt();
    let mut values: Vec<f64> = (0..2 * beams * elements)
        .map(|_| scale * rng.random_range(-1.0..1.0))
        .collect();
    values[..2 * elements].fill(0.0);
    Codebook::new(values, elements, FieldPath::root()).expect("a valid codebook")
}

/// Generated channels swept with DFT codebooks, noise at `snr_db`, best pairs only.
fn generated_sweep(
    s: ChannelSpec,
    oversampling: usize,
    snr_db: f64,
    output: Dtype,
) -> (CaseInfo, SweepJob) {
    let generated = ChannelsJob::new(s.clone(), Dtype::F64).expect("a valid spec");
    let root = FieldPath::root();
    let tx_book = Codebook::dft(s.tx, oversampling, root.clone()).expect("a DFT codebook");
    let rx_book = Codebook::dft(s.rx, oversampling, root).expect("a DFT codebook");
    let (nr, nt, kr, kt) = (
        s.rx.elements(),
        s.tx.elements(),
        rx_book.beams,
        tx_book.beams,
    );
    let label = format!(
        "{} generated channels, {} tx → {} rx, {} paths, DFT ×{oversampling} ({kt} × {kr} beams), SNR {snr_db} dB, best pairs, {}",
        s.count,
        array_label(s.tx),
        array_label(s.rx),
        s.paths,
        output.name()
    );
    // The path words and codebooks read once, the best pairs written once.
    let bytes =
        8 * (s.count * (PATH_WORDS * s.paths + 3) + tx_book.values.len() + rx_book.values.len());
    let flops = CMAC_FLOPS * (s.count * (nr * nt * s.paths + nr * kt * nt + kr * kt * nr)) as f64;
    let job = SweepJob::new(
        Channels::Generated {
            spec: s.clone(),
            drawn: generated.drawn,
            words: generated.words,
        },
        s.first,
        s.tx,
        s.rx,
        tx_book,
        rx_book,
        Some(MeasurementNoise {
            snr_db,
            seed: s.seed ^ 0x0015E,
        }),
        false,
        output,
    )
    .expect("a valid sweep");
    let info = CaseInfo::labelled(label)
        .with_bytes(bytes as f64)
        .with_flops(flops);
    (info, job)
}

/// Channels formed on the CPU and uploaded (channel 1 zero, channel 2 scaled by 10^3),
/// a DFT transmit codebook and an uploaded receive one, no noise, the grid returned.
fn uploaded_sweep(
    s: ChannelSpec,
    oversampling: usize,
    rx_beams: usize,
    output: Dtype,
) -> (CaseInfo, SweepJob) {
    let mut h = ChannelsJob::new(s.clone(), Dtype::F64)
        .expect("a valid spec")
        .run_cpu();
    let per = 2 * s.rx.elements() * s.tx.elements();
    h[per..2 * per].fill(0.0);
    h[2 * per..3 * per].iter_mut().for_each(|x| *x *= 1e3);
    let mut rng = SmallRng::seed_from_u64(s.seed ^ 0xB00C);
    let tx_book = Codebook::dft(s.tx, oversampling, FieldPath::root()).expect("a DFT codebook");
    let rx_book = uploaded_codebook(rx_beams, s.rx.elements(), &mut rng);
    let (nr, nt, kr, kt) = (
        s.rx.elements(),
        s.tx.elements(),
        rx_book.beams,
        tx_book.beams,
    );
    let label = format!(
        "{} uploaded channels, {} tx → {} rx, DFT ×{oversampling} × uploaded ({kt} × {kr} beams), power grid, {}",
        s.count,
        array_label(s.tx),
        array_label(s.rx),
        output.name()
    );
    // The channels and codebooks read once, the grid written once (the kernel writes f64).
    let bytes = 8 * (h.len() + tx_book.values.len() + rx_book.values.len() + s.count * kr * kt);
    let flops = CMAC_FLOPS * (s.count * (nr * kt * nt + kr * kt * nr)) as f64;
    let job = SweepJob::new(
        Channels::Uploaded(h),
        s.first,
        s.tx,
        s.rx,
        tx_book,
        rx_book,
        None,
        true,
        output,
    )
    .expect("a valid sweep");
    let info = CaseInfo::labelled(label)
        .with_bytes(bytes as f64)
        .with_flops(flops);
    (info, job)
}

fn sweep_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, SweepJob)> {
    match level {
        CheckLevel::Quick => vec![
            generated_sweep(
                spec(array(1, 16), array(2, 2), 3, 40, false, seed),
                2,
                0.0,
                Dtype::F32,
            ),
            uploaded_sweep(
                spec(array(1, 8), array(1, 4), 2, 12, true, seed ^ 1),
                1,
                5,
                Dtype::F64,
            ),
        ],
        CheckLevel::Standard => vec![
            generated_sweep(
                spec(array(8, 8), array(4, 4), 4, 4_096, false, seed),
                2,
                10.0,
                Dtype::F64,
            ),
            uploaded_sweep(
                spec(array(1, 64), array(1, 8), 3, 1_024, true, seed ^ 1),
                4,
                32,
                Dtype::F32,
            ),
        ],
    }
}

pub(crate) fn check_cases(level: CheckLevel) -> Vec<Box<dyn SelfTest>> {
    let seed = case_seed();
    vec![
        JobCheck::described(channels_cases(level, seed)),
        JobCheck::described(sweep_cases(level, seed ^ 2)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Job;
    use crate::ops::beams::geometry::dft_beams as dft;

    fn assert_ops<J: Job>(cases: &[(CaseInfo, J)], op: &str) {
        assert!(!cases.is_empty(), "{op}: no case");
        for (info, job) in cases {
            assert_eq!(job.name(), op, "{}", info.label);
            assert!(info.bytes.is_some_and(|b| b > 0.0), "{}", info.label);
            assert!(info.flops.is_some_and(|f| f > 0.0), "{}", info.label);
        }
    }

    #[test]
    fn quick_cases_are_of_their_ops_and_agree_with_their_own_cpu_output() {
        let level = CheckLevel::Quick;
        let ops: Vec<&str> = check_cases(level).iter().map(|t| t.op()).collect();
        assert_eq!(ops, ["beams_channels", "beams_sweep"]);
        let channels = channels_cases(level, 3);
        assert_ops(&channels, "beams_channels");
        for (info, job) in &channels {
            job.agrees(&job.run_cpu(), &job.run_cpu())
                .expect(&info.label);
        }
        let sweeps = sweep_cases(level, 4);
        assert_ops(&sweeps, "beams_sweep");
        for (info, job) in &sweeps {
            let out = job.run_cpu();
            job.agrees(&out, &job.run_cpu()).expect(&info.label);
            assert!(out.best.iter().all(|b| b.power.is_finite()));
        }
    }

    /// Past one grid stride of the emulated device's 8 192 threads, and past its 32
    /// blocks in the best-pair reduction.
    #[test]
    fn quick_shapes_cross_the_kernels_edges() {
        let channels = channels_cases(CheckLevel::Quick, 3);
        let (_, first) = &channels[0];
        assert!(first.size() > 8_192);
        assert!(first.spec.count * first.paths() * 14 > 8_192);
        let (_, extreme) = &channels[1];
        assert_eq!(extreme.spec.tx.elements(), crate::ops::beams::MAX_ELEMENTS);
        assert_eq!(extreme.paths(), crate::ops::beams::MAX_PATHS);
        let sweeps = sweep_cases(CheckLevel::Quick, 4);
        let (_, generated) = &sweeps[0];
        assert!(generated.count > 32 && generated.size() > 8_192);
        assert_eq!(
            generated.pairs(),
            dft(array(1, 16), 2) * dft(array(2, 2), 2)
        );
        assert!(sweeps[1].1.grid && !generated.grid);
    }

    /// Builds the standard cases (about 0.4 GB of channels and their words; no CPU twin
    /// runs) and checks the production sizes.
    #[test]
    fn standard_cases_build_at_production_sizes() {
        let channels = channels_cases(CheckLevel::Standard, 5);
        assert_ops(&channels, "beams_channels");
        assert_eq!(channels[0].1.size(), 16_384 * 64 * 16);
        let sweeps = sweep_cases(CheckLevel::Standard, 6);
        assert_ops(&sweeps, "beams_sweep");
        let (info, sweep) = &sweeps[0];
        assert_eq!(
            (sweep.count, sweep.pairs()),
            (4_096, 256 * 64),
            "{}",
            info.label
        );
        assert_eq!(
            info.label,
            "4096 generated channels, 8×8 tx → 4×4 rx, 4 paths, DFT ×2 (256 × 64 beams), SNR 10 dB, best pairs, f64"
        );
        assert_eq!(sweeps[1].1.size(), 1_024 * 256 * 32);
    }
}
