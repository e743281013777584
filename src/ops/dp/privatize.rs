//! DP-SGD privatization of a [rows, cols] batch of per-example gradients: per-example
//! (optionally per-layer) L2 clipping, column sums, snapping, discrete Gaussian noise.
//! The floating-point order is the kernels' (`kernels/dp.cu`): squared norms over
//! segments of 4096 columns, each in 256 strided lanes then a tree, the segments added in
//! order; column sums in row order; no fused multiply-add; so the CPU and the GPU agree
//! bit for bit.

use super::noise::{for_each_stream, NoiseKey, DOMAIN_GAUSSIAN};
use super::plan::{snap, GaussianPlan};
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::wire::Array;
use rayon::prelude::*;
use std::ops::Range;

/// Lanes of the squared-norm reduction (the kernel's block size).
pub const LANES: usize = 256;
/// Columns of a layer one block of the norm kernel sums (`DP_SEGMENT`): a row is cut into
/// segments so that even a chunk of a few wide rows keeps a GPU's SMs busy.
pub const SEGMENT: usize = 4096;
/// Opacus' guard against division by a zero norm.
const NORM_EPS: f64 = 1e-6;

/// Row-major `[rows, cols]` gradients; a bulk body's buffer is read in place.
pub enum Gradients {
    F32(Array<f32>),
    F64(Array<f64>),
}

impl Gradients {
    pub fn len(&self) -> usize {
        match self {
            Gradients::F32(v) => v.len(),
            Gradients::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct PrivatizeJob {
    pub gradients: Gradients,
    pub rows: usize,
    pub cols: usize,
    /// Layer l covers columns bounds[l]..bounds[l + 1]; bounds[0] = 0, last = cols.
    pub bounds: Vec<u64>,
    pub clip_norms: Vec<f64>,
    pub plan: GaussianPlan,
    /// expected_batch_size for `mean`, 1 for `sum`.
    pub divisor: f64,
    pub key: NoiseKey,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClipStats {
    /// Fraction of (example, layer) gradients whose norm exceeded its clip norm.
    pub fraction_clipped: f64,
    pub mean_norm: f64,
    pub max_norm: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Privatized {
    pub gradient: Vec<f64>,
    pub stats: ClipStats,
}

impl PrivatizeJob {
    pub fn layers(&self) -> usize {
        self.clip_norms.len()
    }

    /// Rows a block at a time: each block's squared norms become its clip factors in
    /// place, and its clipped rows are added to the column sums in row order (the
    /// kernel's order, so blocks change no bit). Per-row arrays of the whole batch would
    /// take as much memory as the gradients themselves when rows are narrow.
    pub fn run_cpu(&self) -> Privatized {
        match &self.gradients {
            Gradients::F32(g) => self.clip_sum_noise(g),
            Gradients::F64(g) => self.clip_sum_noise(g),
        }
    }

    fn clip_sum_noise<T: Copy + Into<f64> + Sync>(&self, g: &[T]) -> Privatized {
        let mut sums = vec![0.0f64; self.cols];
        let mut stats = StatsSum::default();
        for r0 in (0..self.rows).step_by(ROW_BLOCK) {
            let rows = r0..(r0 + ROW_BLOCK).min(self.rows);
            let mut factors = self.sq_norms(g, rows.clone());
            stats.add(&factors, &self.clip_norms);
            into_clip_factors(&mut factors, &self.clip_norms);
            self.add_clipped(g, rows, &factors, &mut sums);
        }
        Privatized {
            gradient: self.snap_and_noise(&sums),
            stats: stats.finish(self.clip_norms.len()),
        }
    }

    /// (row, layer) squared norms of `rows`, row-major.
    fn sq_norms<T: Copy + Into<f64> + Sync>(&self, g: &[T], rows: Range<usize>) -> Vec<f64> {
        let layers = self.layers();
        (rows.start * layers..rows.end * layers)
            .into_par_iter()
            .map(|item| {
                let (row, layer) = (item / layers, item % layers);
                let base = row * self.cols;
                let part =
                    &g[base + self.bounds[layer] as usize..base + self.bounds[layer + 1] as usize];
                sum_of_squares(part)
            })
            .collect()
    }

    /// Adds `rows`, each layer scaled by its clip factor, to the column sums.
    fn add_clipped<T: Copy + Into<f64> + Sync>(
        &self,
        g: &[T],
        rows: Range<usize>,
        factors: &[f64],
        sums: &mut [f64],
    ) {
        let layers = self.layers();
        sums.par_chunks_mut(COLUMN_CHUNK)
            .enumerate()
            .for_each(|(chunk, acc)| {
                let c0 = chunk * COLUMN_CHUNK;
                let c1 = c0 + acc.len();
                for (i, row) in rows.clone().enumerate() {
                    let g_row = &g[row * self.cols..(row + 1) * self.cols];
                    let f_row = &factors[i * layers..(i + 1) * layers];
                    for (layer, &f) in f_row.iter().enumerate() {
                        let s = (self.bounds[layer] as usize).max(c0);
                        let e = (self.bounds[layer + 1] as usize).min(c1);
                        if s >= e {
                            continue;
                        }
                        for (a, &x) in acc[s - c0..e - c0].iter_mut().zip(&g_row[s..e]) {
                            *a += x.into() * f;
                        }
                    }
                }
            });
    }

    /// The column sums snapped to the grid, with discrete Gaussian noise, scaled back.
    fn snap_and_noise(&self, sums: &[f64]) -> Vec<f64> {
        let grid = self.plan.grid;
        let (t, c) = (self.plan.t, self.plan.c);
        let mut out = vec![0.0; self.cols];
        out.par_chunks_mut(COLUMN_CHUNK)
            .enumerate()
            .for_each(|(chunk, out)| {
                let c0 = chunk * COLUMN_CHUNK;
                let acc = &sums[c0..c0 + out.len()];
                for_each_stream(&self.key, DOMAIN_GAUSSIAN, c0 as u64, out.len(), |i, s| {
                    let noise = s.discrete_gaussian(t, c);
                    out[i] = (snap(acc[i], grid) + noise) as f64 * grid / self.divisor;
                });
            });
        out
    }
}

/// Rows whose norms and clip factors the CPU path holds at once.
const ROW_BLOCK: usize = 1 << 14;
/// Columns one task of the column sums takes.
const COLUMN_CHUNK: usize = 2048;

/// Σ x² in the kernels' order: each segment of `SEGMENT` values by
/// `lane_tree_sum_of_squares`, the segments' sums added in order from 0.0.
pub fn sum_of_squares<T: Copy + Into<f64>>(xs: &[T]) -> f64 {
    xs.chunks(SEGMENT)
        .fold(0.0, |acc, segment| acc + lane_tree_sum_of_squares(segment))
}

/// Σ x² of one segment in the kernel's order: lane j takes elements j, j + 256, …; then
/// lanes fold as a tree (j += j + s for s = 128, 64, …, 1).
pub fn lane_tree_sum_of_squares<T: Copy + Into<f64>>(xs: &[T]) -> f64 {
    let mut lanes = [0.0f64; LANES];
    for chunk in xs.chunks(LANES) {
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            let v: f64 = x.into();
            *l += v * v;
        }
    }
    let mut s = LANES / 2;
    while s > 0 {
        for j in 0..s {
            lanes[j] += lanes[j + s];
        }
        s /= 2;
    }
    lanes[0]
}

/// min(1, C_l / (‖g_l‖ + 1e-6)) for every (row, layer), from squared norms.
pub fn clip_factors(sq_norms: &[f64], clip_norms: &[f64]) -> Vec<f64> {
    let mut factors = sq_norms.to_vec();
    into_clip_factors(&mut factors, clip_norms);
    factors
}

/// (row, layer) squared norms, row-major, turned into their clip factors in place.
fn into_clip_factors(sq_norms: &mut [f64], clip_norms: &[f64]) {
    let layers = clip_norms.len();
    for (i, s) in sq_norms.iter_mut().enumerate() {
        *s = (clip_norms[i % layers] / (s.sqrt() + NORM_EPS)).min(1.0);
    }
}

pub fn clip_stats(sq_norms: &[f64], clip_norms: &[f64]) -> ClipStats {
    let mut stats = StatsSum::default();
    stats.add(sq_norms, clip_norms);
    stats.finish(clip_norms.len())
}

/// `ClipStats` summed over blocks of rows, in row order (the same sums as in one pass).
struct StatsSum {
    clipped: usize,
    rows: usize,
    norm_sum: f64,
    max_norm: f64,
}

impl Default for StatsSum {
    fn default() -> Self {
        // -0.0: where `Iterator::sum` of f64 starts, so an all-zero batch sums alike.
        StatsSum {
            clipped: 0,
            rows: 0,
            norm_sum: -0.0,
            max_norm: 0.0,
        }
    }
}

impl StatsSum {
    fn add(&mut self, sq_norms: &[f64], clip_norms: &[f64]) {
        let layers = clip_norms.len();
        self.clipped += sq_norms
            .iter()
            .enumerate()
            .filter(|(i, &s)| clip_norms[i % layers] / (s.sqrt() + NORM_EPS) < 1.0)
            .count();
        for row in sq_norms.chunks(layers) {
            let norm = row.iter().sum::<f64>().sqrt();
            self.norm_sum += norm;
            self.max_norm = self.max_norm.max(norm);
            self.rows += 1;
        }
    }

    fn finish(self, layers: usize) -> ClipStats {
        ClipStats {
            fraction_clipped: self.clipped as f64 / (self.rows * layers).max(1) as f64,
            mean_norm: self.norm_sum / self.rows.max(1) as f64,
            max_norm: self.max_norm,
        }
    }
}

impl Job for PrivatizeJob {
    type Output = Privatized;

    fn name(&self) -> &'static str {
        "dp_privatize"
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        match self.gradients {
            Gradients::F32(_) => "f32".into(),
            Gradients::F64(_) => "f64".into(),
        }
    }

    fn size(&self) -> usize {
        self.gradients.len()
    }

    fn input_bytes(&self) -> usize {
        match &self.gradients {
            Gradients::F32(g) => 4 * g.len(),
            Gradients::F64(g) => 8 * g.len(),
        }
    }

    fn gpu_threshold(&self) -> usize {
        1 << 18
    }

    fn run_cpu(&self) -> Privatized {
        PrivatizeJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Privatized, DeviceError> {
        super::gpu::launch_privatize(self, dev)
    }

    /// Exact noise and the same clipping: bit for bit.
    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        crate::backend::verify::exactly(&device.stats, &cpu.stats)
            .map_err(|_| format!("clip statistics {:?} vs {:?}", device.stats, cpu.stats))?;
        crate::backend::verify::same_bits(&device.gradient, &cpu.gradient)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(
        g: Vec<f64>,
        rows: usize,
        cols: usize,
        bounds: Vec<u64>,
        clips: Vec<f64>,
    ) -> PrivatizeJob {
        PrivatizeJob {
            gradients: Gradients::F64(g.into()),
            rows,
            cols,
            bounds,
            clip_norms: clips,
            // Noise so small against the grid that the result is the exact clipped sum.
            plan: GaussianPlan {
                grid: 2f64.powi(-40),
                t: 1,
                c: 1,
            },
            divisor: 1.0,
            key: NoiseKey([7; 32]),
        }
    }

    #[test]
    fn clipping_is_exact_per_example_and_per_layer() {
        // Row 0 has norm 5 (clipped to 1), row 1 norm 0.5 (kept).
        let g = vec![3.0, 4.0, 0.3, 0.4];
        let out = job(g.clone(), 2, 2, vec![0, 2], vec![1.0]).run_cpu();
        let f0 = 1.0 / (5.0 + 1e-6);
        let want = [3.0 * f0 + 0.3, 4.0 * f0 + 0.4];
        for (o, w) in out.gradient.iter().zip(want) {
            assert!((o - w).abs() < 1e-9, "{o} vs {w}");
        }
        assert_eq!(out.stats.fraction_clipped, 0.5);
        assert!(
            (out.stats.max_norm - 5.0).abs() < 1e-12 && (out.stats.mean_norm - 2.75).abs() < 1e-12
        );

        // Per layer: column 0 alone (clip 1), column 1 alone (clip 10).
        let out = job(g, 2, 2, vec![0, 1, 2], vec![1.0, 10.0]).run_cpu();
        let want = [3.0 / (3.0 + 1e-6) + 0.3 / 0.3f64.max(1.0), 4.0 + 0.4];
        for (o, w) in out.gradient.iter().zip(want) {
            assert!((o - w).abs() < 1e-9, "{o} vs {w}");
        }
        assert_eq!(out.stats.fraction_clipped, 0.25);
    }

    #[test]
    fn lane_tree_matches_a_plain_sum_closely() {
        let xs: Vec<f64> = (0..10_000)
            .map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0)
            .collect();
        let plain: f64 = xs.iter().map(|x| x * x).sum();
        assert!((lane_tree_sum_of_squares(&xs) - plain).abs() < 1e-9 * plain);
        assert_eq!(lane_tree_sum_of_squares::<f64>(&[]), 0.0);
        // Segments: added in order, each by its own lane tree.
        let by_segment = lane_tree_sum_of_squares(&xs[..SEGMENT])
            + lane_tree_sum_of_squares(&xs[SEGMENT..2 * SEGMENT])
            + lane_tree_sum_of_squares(&xs[2 * SEGMENT..]);
        assert_eq!(sum_of_squares(&xs).to_bits(), (0.0 + by_segment).to_bits());
        assert_eq!(sum_of_squares::<f64>(&[]), 0.0);
    }
}
