//! DP-SGD privatization of a [rows, cols] batch of per-example gradients: per-example
//! (optionally per-layer) L2 clipping, column sums, snapping, discrete Gaussian noise.
//! The floating-point order is the kernels' (`kernels/dp.cu`): squared norms in 256
//! strided lanes then a tree, column sums in row order, no fused multiply-add, so the
//! CPU and the GPU agree bit for bit.

use super::noise::{for_each_stream, NoiseKey, DOMAIN_GAUSSIAN};
use super::plan::{snap, GaussianPlan};
use crate::backend::{DeviceError, DeviceLease, Job};
use rayon::prelude::*;

/// Lanes of the squared-norm reduction (the kernel's block size).
pub const LANES: usize = 256;
/// Opacus' guard against division by a zero norm.
const NORM_EPS: f64 = 1e-6;

pub enum Gradients {
    F32(Vec<f32>),
    F64(Vec<f64>),
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

    pub fn run_cpu(&self) -> Privatized {
        let sq = match &self.gradients {
            Gradients::F32(g) => self.sq_norms(g),
            Gradients::F64(g) => self.sq_norms(g),
        };
        let factors = clip_factors(&sq, &self.clip_norms);
        let gradient = match &self.gradients {
            Gradients::F32(g) => self.clip_sum_noise(g, &factors),
            Gradients::F64(g) => self.clip_sum_noise(g, &factors),
        };
        Privatized {
            gradient,
            stats: clip_stats(&sq, &self.clip_norms),
        }
    }

    fn sq_norms<T: Copy + Into<f64> + Sync>(&self, g: &[T]) -> Vec<f64> {
        let layers = self.layers();
        (0..self.rows * layers)
            .into_par_iter()
            .map(|item| {
                let (row, layer) = (item / layers, item % layers);
                let base = row * self.cols;
                let part =
                    &g[base + self.bounds[layer] as usize..base + self.bounds[layer + 1] as usize];
                lane_tree_sum_of_squares(part)
            })
            .collect()
    }

    fn clip_sum_noise<T: Copy + Into<f64> + Sync>(&self, g: &[T], factors: &[f64]) -> Vec<f64> {
        const CHUNK: usize = 2048;
        let layers = self.layers();
        let grid = self.plan.grid;
        let mut out = vec![0.0; self.cols];
        out.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(chunk, out)| {
                let c0 = chunk * CHUNK;
                let c1 = c0 + out.len();
                let mut acc = vec![0.0f64; out.len()];
                for row in 0..self.rows {
                    let g_row = &g[row * self.cols..(row + 1) * self.cols];
                    let f_row = &factors[row * layers..(row + 1) * layers];
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
                let (t, c) = (self.plan.t, self.plan.c);
                for_each_stream(&self.key, DOMAIN_GAUSSIAN, c0 as u64, out.len(), |i, s| {
                    let noise = s.discrete_gaussian(t, c);
                    out[i] = (snap(acc[i], grid) + noise) as f64 * grid / self.divisor;
                });
            });
        out
    }
}

/// Σ x² in the kernel's order: lane j takes elements j, j + 256, …; then lanes fold as
/// a tree (j += j + s for s = 128, 64, …, 1).
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
    let layers = clip_norms.len();
    sq_norms
        .iter()
        .enumerate()
        .map(|(i, &s)| (clip_norms[i % layers] / (s.sqrt() + NORM_EPS)).min(1.0))
        .collect()
}

pub fn clip_stats(sq_norms: &[f64], clip_norms: &[f64]) -> ClipStats {
    let layers = clip_norms.len();
    let clipped = sq_norms
        .iter()
        .enumerate()
        .filter(|(i, &s)| clip_norms[i % layers] / (s.sqrt() + NORM_EPS) < 1.0)
        .count();
    let norms: Vec<f64> = sq_norms
        .chunks(layers)
        .map(|r| r.iter().sum::<f64>().sqrt())
        .collect();
    let rows = norms.len().max(1) as f64;
    ClipStats {
        fraction_clipped: clipped as f64 / sq_norms.len().max(1) as f64,
        mean_norm: norms.iter().sum::<f64>() / rows,
        max_norm: norms.iter().copied().fold(0.0, f64::max),
    }
}

impl Job for PrivatizeJob {
    type Output = Privatized;

    fn name(&self) -> &'static str {
        "dp_privatize"
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
        super::gpu::run_privatize_cuda(self, dev)
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
            gradients: Gradients::F64(g),
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
    }
}
