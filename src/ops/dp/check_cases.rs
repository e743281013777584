//! The dp ops under `gpu-ops check`: each op at the level's sizes, with fresh random
//! inputs and edge values, held to its CPU twin; what the report says of each case.
//!
//! Standard: DP-SGD privatization of 256 per-example gradients of 2^20 parameters, f32
//! with flat clipping (the mean) and f64 with three uneven layers (the sum), planned by
//! `SgdPlan` as the route plans them; the Gaussian and Laplace releases of 2^24 values.
//! Quick (the emulated device, 8 192 threads a launch): 13 × 9 000 gradients, so the
//! norms' 39 (row, layer) items wrap the 32 blocks and the columns the grid stride and
//! the CPU's 2 048-column blocks; releases of 17 161 values, two grid strides and a part.
//!
//! Every input carries edges: an all-zero row, a row whose norm is exactly its clip
//! bound, a row with the largest magnitudes whose squares stay finite, a row of
//! subnormals; released values of ±0, ties half-way between grid steps, subnormals and
//! ±(2^62 − 2^11) grid steps (the largest a release takes, plus room for the noise).
//!
//! CPU twins at the standard level, on the GPU host's 16 cores, scaled linearly from this
//! 2-core machine: release figures from docs/PERFORMANCE.md (`cargo bench --bench dp`),
//! and the test profile measured here under a load of about 5 at 32 × 2^20 and 2^20
//! values (exact noise 2.2 µs a value per core there, 0.24–0.32 µs in release).
//! - Each 2^24-value release: about 0.3 s (2.3 s in the test profile).
//! - Each privatize: two memory-bound passes over 1 or 2 GiB plus 2^20 noise values,
//!   about 0.1–0.2 s (0.3 s); 260–314 ms on 2 cores in release for the f32 case.
//! - Drawing the 3 GiB of gradients, in parallel: about 0.5 s (3–6 s on 2 cores here).
//!
//! The device runs are bound by the uploads: 1 and 2 GiB a privatize run, 12 runs a case.

use super::plan::{calibrate_gaussian, calibrate_laplace, MAX_SNAPPED};
use super::sgd::{Clipping, SgdPlan};
use super::{Gradients, Mechanism, NoiseJob, NoiseKey, PrivatizeJob};
use crate::backend::measure::{case_seed, size_label, CaseInfo, CheckLevel};
use crate::backend::verify::{JobCheck, SelfTest};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

/// The noise multiplier of every privatize case: a common DP-SGD setting.
const NOISE_MULTIPLIER: f64 = 1.1;

/// A generator for piece `piece` of the input drawn from `seed`.
fn rng(seed: u64, piece: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed ^ piece.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// One privatize case: its shape, element type, clipping and reduction.
struct PrivatizeShape {
    rows: usize,
    cols: usize,
    f32: bool,
    /// Columns per layer with its clip norm; empty for flat clipping at `FLAT_CLIP`.
    layers: Vec<(usize, f64)>,
    /// Divide by the batch size (`mean`), or not (`sum`).
    mean: bool,
}

const FLAT_CLIP: f64 = 1.0;

/// Per-example gradients, row-major `rows × cols`, each row drawn from its own
/// generator: uniform values scaled to norms from a tenth to ten times the clip bound
/// `clip`, and the edge rows (0: zeros; 1: one value equal to `clip` at `at_bound`, the
/// norm exactly at its bound; 2: ±`big` at both ends; 3: `tiny` everywhere); `to` the
/// element type.
fn gradients<T: Copy + Default + Send + Sync>(
    (rows, cols): (usize, usize),
    clip: f64,
    (big, tiny): (f64, f64),
    at_bound: usize,
    seed: u64,
    to: impl Fn(f64) -> T + Sync,
) -> Vec<T> {
    let mut g = vec![T::default(); rows * cols];
    g.par_chunks_mut(cols).enumerate().for_each(|(r, row)| {
        let mut rng = rng(seed, r as u64);
        match r {
            0 => {}
            1 => row[at_bound] = to(clip),
            3 => row.fill(to(tiny)),
            _ => {
                // Uniform in (−1, 1) has variance 1/3: the row's norm is about `norm`.
                let norm = clip * 10f64.powf(rng.random_range(-1.0..1.0));
                let scale = norm / (cols as f64 / 3.0).sqrt();
                row.iter_mut()
                    .for_each(|x| *x = to(scale * rng.random_range(-1.0..1.0)));
                if r == 2 {
                    row[0] = to(big);
                    row[cols - 1] = to(-big);
                }
            }
        }
    });
    g
}

fn privatize_case(shape: &PrivatizeShape, seed: u64) -> (CaseInfo, PrivatizeJob) {
    let (rows, cols) = (shape.rows, shape.cols);
    let clipping = if shape.layers.is_empty() {
        Clipping::Flat(FLAT_CLIP)
    } else {
        Clipping::Layers(shape.layers.clone())
    };
    let plan =
        SgdPlan::new(NOISE_MULTIPLIER, &clipping, rows, cols).expect("a plan the route accepts");
    let (clip, at_bound) = shape
        .layers
        .first()
        .map_or((FLAT_CLIP, cols / 2), |&(columns, c)| (c, columns - 1));
    // The largest magnitudes whose squares (and a row's sum of them) stay finite in f64,
    // and subnormals of the element type.
    let edges = if shape.f32 {
        (f32::MAX as f64, 1e-40)
    } else {
        (1e150, 1e-310)
    };
    let gradients = if shape.f32 {
        Gradients::F32(gradients((rows, cols), clip, edges, at_bound, seed, |x| x as f32).into())
    } else {
        Gradients::F64(gradients((rows, cols), clip, edges, at_bound, seed, |x| x).into())
    };
    let elem = if shape.f32 { 4 } else { 8 };
    let clipping = if shape.layers.is_empty() {
        format!("flat clip {FLAT_CLIP}")
    } else {
        let widths: Vec<String> = shape.layers.iter().map(|l| size_label(l.0)).collect();
        let clips: Vec<String> = shape.layers.iter().map(|l| l.1.to_string()).collect();
        format!(
            "{} layers of {} columns, clip {}",
            shape.layers.len(),
            widths.join(" / "),
            clips.join(" / ")
        )
    };
    let label = format!(
        "{rows} × {} {}, {clipping}, noise ×{NOISE_MULTIPLIER}, {}",
        size_label(cols),
        if shape.f32 { "f32" } else { "f64" },
        if shape.mean { "mean" } else { "sum" }
    );
    // The gradients read once, the noised sum written once.
    let bytes = (elem * rows * cols + 8 * cols) as f64;
    let divisor = if shape.mean { rows as f64 } else { 1.0 };
    let key = NoiseKey::derive(b"gpu-ops/check/dp_privatize", seed);
    let job = plan.job(gradients, rows, cols, divisor, key);
    (CaseInfo::labelled(label).with_bytes(bytes), job)
}

/// The privatize cases of the level.
fn privatize_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, PrivatizeJob)> {
    let (rows, cols) = level.pick((13, 9_000), (256, 1 << 20));
    // Uneven layers: one column (a lone bias), one not a multiple of the 256 lanes, the
    // rest.
    let middle = level.pick(4_096, (1 << 18) + 2);
    let layers = vec![(1, 0.5), (middle, 1.0), (cols - 1 - middle, 2.0)];
    let shapes = [
        PrivatizeShape {
            rows,
            cols,
            f32: true,
            layers: Vec::new(),
            mean: true,
        },
        PrivatizeShape {
            rows,
            cols,
            f32: false,
            layers,
            mean: false,
        },
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, s)| privatize_case(s, seed.wrapping_add(i as u64)))
        .collect()
}

/// `n` values to release on `grid`: uniform in (−100, 100), the first and last few the
/// edges (±0, ties between grid steps, subnormals, the largest magnitude a release takes).
fn release_values(n: usize, grid: f64, seed: u64) -> Vec<f64> {
    const PIECE: usize = 1 << 16;
    let mut v = vec![0.0f64; n];
    v.par_chunks_mut(PIECE).enumerate().for_each(|(p, piece)| {
        let mut rng = rng(seed, p as u64);
        piece
            .iter_mut()
            .for_each(|x| *x = rng.random_range(-100.0..100.0));
    });
    // 2^62 − 2^11 grid steps: below MAX_SNAPPED, with room for any noise the samplers
    // draw (they reject beyond 2^40 steps).
    let top = (MAX_SNAPPED - 2048.0) * grid;
    let edges = [
        0.0,
        -0.0,
        top,
        -top,
        0.5 * grid,
        1.5 * grid,
        -2.5 * grid,
        f64::MIN_POSITIVE,
        -5e-324,
        1.0,
        -1.0,
    ];
    let k = edges.len().min(n);
    v[..k].copy_from_slice(&edges[..k]);
    v[n - k..].copy_from_slice(&edges[edges.len() - k..]);
    v
}

/// Which release.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Release {
    Gaussian,
    Laplace,
}

/// The release cases of the level: one of `release`.
fn release_cases(level: CheckLevel, release: Release, seed: u64) -> Vec<(CaseInfo, NoiseJob)> {
    let n = level.pick(2 * 8_192 + 777, 1 << 24);
    let (sensitivity, epsilon, delta) = (1.0, 1.0, 1e-6);
    let (mechanism, what) = match release {
        Release::Gaussian => (
            Mechanism::Gaussian(
                calibrate_gaussian(n, sensitivity, epsilon, delta)
                    .expect("valid parameters")
                    .plan,
            ),
            format!("L2 sensitivity {sensitivity}, ε = {epsilon}, δ = {delta:e}"),
        ),
        Release::Laplace => (
            Mechanism::Laplace(
                calibrate_laplace(n, sensitivity, epsilon)
                    .expect("valid parameters")
                    .plan,
            ),
            format!("L1 sensitivity {sensitivity}, ε = {epsilon}"),
        ),
    };
    let values = release_values(n, mechanism.grid(), seed);
    mechanism
        .check_values(&values)
        .expect("every value snaps within the grid's range");
    let key = NoiseKey::derive(b"gpu-ops/check/dp_release", seed);
    let label = format!("{} values, {what}", size_label(n));
    // The values read once, the released values written once.
    let info = CaseInfo::labelled(label).with_bytes(16.0 * n as f64);
    vec![(
        info,
        NoiseJob {
            values,
            mechanism,
            key,
        },
    )]
}

pub(crate) fn check_cases(level: CheckLevel) -> Vec<Box<dyn SelfTest>> {
    let seed = case_seed();
    vec![
        JobCheck::described(privatize_cases(level, seed)),
        JobCheck::described(release_cases(level, Release::Gaussian, seed ^ 1)),
        JobCheck::described(release_cases(level, Release::Laplace, seed ^ 2)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Job;

    const OPS: [&str; 3] = ["dp_privatize", "dp_gaussian", "dp_laplace"];

    fn assert_ops<J: Job>(cases: &[(CaseInfo, J)], op: &str) {
        assert!(!cases.is_empty(), "{op}: no case");
        for (info, job) in cases {
            assert_eq!(job.name(), op, "{}", info.label);
            assert!(info.bytes.is_some_and(|b| b > 0.0), "{}", info.label);
        }
    }

    #[test]
    fn quick_cases_are_of_their_ops_and_agree_with_their_own_cpu_output() {
        let level = CheckLevel::Quick;
        let ops: Vec<&str> = check_cases(level).iter().map(|t| t.op()).collect();
        assert_eq!(ops, OPS);
        let privatize = privatize_cases(level, 5);
        assert_ops(&privatize, "dp_privatize");
        for (info, job) in &privatize {
            let out = job.run_cpu();
            job.agrees(&out, &job.run_cpu()).expect(&info.label);
            assert!(out.gradient.iter().all(|x| x.is_finite()), "{}", info.label);
            assert!(out.stats.fraction_clipped > 0.0 && out.stats.fraction_clipped < 1.0);
            // Rows at the bound count as clipped (1e-6 guards the division), the zero
            // row and the subnormal one do not.
        }
        for (release, op) in [(Release::Gaussian, OPS[1]), (Release::Laplace, OPS[2])] {
            let cases = release_cases(level, release, 6);
            assert_ops(&cases, op);
            for (info, job) in &cases {
                // Past two grid strides of the emulated device's 8 192 threads.
                assert!(job.size() > 2 * 8_192 && job.size() % 8_192 != 0);
                let out = job.run_cpu();
                job.agrees(&out, &job.run_cpu()).expect(&info.label);
                assert!(out.iter().all(|x| x.is_finite()), "{}", info.label);
            }
        }
    }

    /// The quick shapes cross the edges the module's comment names.
    #[test]
    fn quick_shapes_cross_the_kernels_edges() {
        for (_, job) in privatize_cases(CheckLevel::Quick, 7) {
            assert!(job.rows * job.layers() > 32 || job.layers() == 1);
            assert!(job.cols > 8_192 && job.cols % 2_048 != 0);
        }
        let layered = privatize_cases(CheckLevel::Quick, 7).pop().unwrap().1;
        assert_eq!(layered.rows * layered.layers(), 39);
        assert_eq!(layered.bounds, vec![0, 1, 4_097, 9_000]);
    }

    /// Builds every standard case (about 3.3 GiB of inputs; no CPU twin runs) and checks
    /// the production sizes.
    #[test]
    fn standard_cases_build_at_production_sizes() {
        let level = CheckLevel::Standard;
        let privatize = privatize_cases(level, 8);
        assert_ops(&privatize, "dp_privatize");
        for (info, job) in &privatize {
            assert_eq!((job.rows, job.cols), (256, 1 << 20), "{}", info.label);
            assert_eq!(job.size(), 1 << 28);
            assert_eq!(*job.bounds.last().unwrap(), 1 << 20);
        }
        assert!(matches!(privatize[0].1.gradients, Gradients::F32(_)));
        assert!(matches!(privatize[1].1.gradients, Gradients::F64(_)));
        assert_eq!(privatize[1].1.bounds, vec![0, 1, (1 << 18) + 3, 1 << 20]);
        assert_eq!(
            privatize[0].0.label,
            "256 × 2^20 f32, flat clip 1, noise ×1.1, mean"
        );
        drop(privatize);
        for (release, op) in [(Release::Gaussian, OPS[1]), (Release::Laplace, OPS[2])] {
            let cases = release_cases(level, release, 9);
            assert_ops(&cases, op);
            assert!(cases.iter().all(|(_, j)| j.size() == 1 << 24));
        }
    }
}
