//! `AttentionJob::tolerance`: the bound of docs/TENSORS.md ("Error bound") for every output
//! value and weight, in f64. Each task bounds up to 64 rows of one (batch, head). Four
//! quantities are products on the `gemm` crate:
//! - the rows' dot products with every key the task's last row sees;
//! - their magnitudes `Σ_c |q_ic·k_jc|`;
//! - `Σ_j p_ij·v_jc` and `Σ_j p_ij·|v_jc|`.
//!
//! The rounding terms of each row follow from those. Tasks run on rayon. One head at
//! S = S_kv = 4096, D = D_v = 128 takes 0.14 s causal and 0.22 s not (wall clock, two
//! AVX-512 threads, release build, 2026-12-07). The row-by-row loop this replaced took
//! 7.0 and 16.3 CPU-seconds, which had kept `gpu-ops check` to one head a case.

use super::{tensor_cores, AttentionJob, Tensors, SMALLEST_KEY_BLOCK};
use crate::ops::linalg::views::gemm_into;
use crate::ops::linalg::Dtype;
use gemm::Parallelism;
use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

/// Query rows one task bounds.
const ROWS: usize = 64;

/// The unit roundoffs the bound is built from (`AttentionJob::tolerance` says why).
struct Rounding {
    /// Of every f32 (f64) sum: twice f32's where the tensor cores' kernel may run.
    u: f64,
    /// P rounded to the input dtype before P·V (tensor cores only): relative, and the
    /// absolute floor per visible key where a weight falls below the normal range.
    p_u: f64,
    p_floor: f64,
    out_u: f64,
    /// Roundings a value's sums, exponentials, rescales and division make.
    n: f64,
}

impl Rounding {
    fn of(job: &AttentionJob) -> Self {
        let tensor_cores = tensor_cores::kernel_for(job).is_some();
        let u = match (job.input, tensor_cores) {
            (Dtype::F64, _) => Dtype::F64.unit_roundoff(),
            (_, false) => Dtype::F32.unit_roundoff(),
            (_, true) => 2.0 * Dtype::F32.unit_roundoff(),
        };
        let (p_u, p_floor) = match (tensor_cores, job.input) {
            (false, _) => (0.0, 0.0),
            (true, Dtype::Bf16) => (Dtype::Bf16.unit_roundoff(), 2f64.powi(-134)),
            (true, _) => (Dtype::F16.unit_roundoff(), 2f64.powi(-25)),
        };
        let keys = job.shape.keys;
        Rounding {
            u,
            p_u,
            p_floor,
            out_u: job.output.unit_roundoff(),
            n: (keys + 3 * keys.div_ceil(SMALLEST_KEY_BLOCK) + 16) as f64,
        }
    }

    fn gamma(&self, m: f64) -> f64 {
        m * self.u / (1.0 - m * self.u)
    }
}

/// Q, K and V in f64.
struct Operands {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
}

impl Operands {
    fn of(job: &AttentionJob) -> Self {
        let widen = |x: &[f32]| x.par_iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let (q, k, v) = match &job.tensors {
            Tensors::F32 { q, k, v } => (widen(q), widen(k), widen(v)),
            Tensors::F64 { q, k, v } => (q.clone(), k.clone(), v.clone()),
        };
        Operands { q, k, v }
    }
}

/// The magnitudes of `x`: a task's own slice (a 1/128 of its products' work), so the
/// bound holds no whole copy of them.
fn magnitudes_of(x: &[f64]) -> Vec<f64> {
    x.iter().map(|x| x.abs()).collect()
}

/// `out = a · b` (`a` rows × inner), on this thread: `b` is `cols × inner` read transposed
/// when `b_rows_are_cols`, else `inner × cols`.
fn product(
    out: &mut [f64],
    a: &[f64],
    b: &[f64],
    (rows, cols, inner): (usize, usize, usize),
    b_rows_are_cols: bool,
) {
    if rows == 0 || cols == 0 || inner == 0 {
        out.fill(0.0);
        return;
    }
    let a = ArrayView2::from_shape((rows, inner), &a[..rows * inner]).expect("rows × inner");
    let b = if b_rows_are_cols {
        ArrayView2::from_shape((cols, inner), &b[..cols * inner]).map(|b| b.reversed_axes())
    } else {
        ArrayView2::from_shape((inner, cols), &b[..inner * cols])
    }
    .expect("b's shape");
    let out =
        ArrayViewMut2::from_shape((rows, cols), &mut out[..rows * cols]).expect("rows × cols");
    gemm_into(out, a, b, 1.0, None, false, Parallelism::None);
}

pub(super) fn tolerance(job: &AttentionJob) -> (Vec<f64>, Option<Vec<f64>>) {
    let s = job.shape;
    let r = Rounding::of(job);
    let x = Operands::of(job);
    let (d, dv) = (s.head_dim, s.value_dim);
    // Σ_{j < end} |v_jc| of each key/value head, for every end: P's absolute floor.
    let prefix: Vec<f64> = if r.p_floor > 0.0 {
        (0..s.batch * s.kv_heads)
            .into_par_iter()
            .flat_map_iter(|g| {
                let mut run = vec![0.0; dv];
                let mut sums = run.clone();
                for j in 0..s.keys {
                    for (c, total) in run.iter_mut().enumerate() {
                        *total += x.v[(g * s.keys + j) * dv + c].abs();
                    }
                    sums.extend_from_slice(&run);
                }
                sums
            })
            .collect()
    } else {
        Vec::new()
    };
    let tasks: Vec<(usize, usize)> = (0..s.batch * s.heads)
        .flat_map(|bh| (0..s.queries).step_by(ROWS).map(move |first| (bh, first)))
        .collect();
    let bounded: Vec<(Vec<f64>, Option<Vec<f64>>)> = tasks
        .into_par_iter()
        .map(|(bh, first)| {
            let (b, h) = (bh / s.heads, bh % s.heads);
            let g = b * s.kv_heads + s.kv_head(h);
            let rows = ROWS.min(s.queries - first);
            let ends: Vec<usize> = (0..rows).map(|i| job.visible_keys(b, first + i)).collect();
            let width = ends.iter().copied().max().unwrap_or(0);
            let at = (bh * s.queries + first) * d;
            let (kg, vg) = (g * s.keys * d, g * s.keys * dv);
            let mut dots = vec![0.0; rows * width];
            let mut mags = vec![0.0; rows * width];
            product(&mut dots, &x.q[at..], &x.k[kg..], (rows, width, d), true);
            let q_abs = magnitudes_of(&x.q[at..][..rows * d]);
            let k_abs = magnitudes_of(&x.k[kg..][..width * d]);
            product(&mut mags, &q_abs, &k_abs, (rows, width, d), true);
            // Each row's relative factor; `dots` becomes its softmax p (zero past its end).
            let mut relative = vec![0.0; rows];
            for (i, &end) in ends.iter().enumerate() {
                let (p, mag) = (&mut dots[i * width..][..width], &mags[i * width..][..end]);
                let mut err = 0.0f64;
                for (l, &m) in p[..end].iter_mut().zip(mag) {
                    *l *= job.scale;
                    err = err
                        .max(r.gamma(d as f64 + 2.0) * job.scale.abs() * m + 2.0 * r.u * l.abs());
                }
                let top = p[..end].iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut sum = 0.0;
                for l in &mut p[..end] {
                    *l = (*l - top).exp();
                    sum += *l;
                }
                p[..end].iter_mut().for_each(|l| *l /= sum);
                p[end..].fill(0.0);
                relative[i] = (2.0 * err).exp_m1() + r.gamma(r.n) + r.p_u;
            }
            let mut values = vec![0.0; rows * dv];
            let mut magnitudes = vec![0.0; rows * dv];
            product(&mut values, &dots, &x.v[vg..], (rows, dv, width), false);
            let v_abs = magnitudes_of(&x.v[vg..][..width * dv]);
            product(&mut magnitudes, &dots, &v_abs, (rows, dv, width), false);
            let mut out = vec![0.0; rows * dv];
            for (i, &end) in ends.iter().enumerate() {
                for c in 0..dv {
                    let e = i * dv + c;
                    let floor = if r.p_floor > 0.0 {
                        r.p_floor * prefix[(g * (s.keys + 1) + end) * dv + c]
                    } else {
                        0.0
                    };
                    out[e] = relative[i] * magnitudes[e] * 1.01
                        + floor
                        + 2.0 * r.out_u * values[e].abs()
                        + f64::from(f32::MIN_POSITIVE);
                }
            }
            let weights = job.weights.then(|| {
                let mut w = vec![0.0; rows * s.keys];
                for (i, &end) in ends.iter().enumerate() {
                    let factor = relative[i] * 1.01 + 2.0 * r.out_u;
                    for (w, p) in w[i * s.keys..][..end].iter_mut().zip(&dots[i * width..]) {
                        *w = factor * p + f64::from(f32::MIN_POSITIVE);
                    }
                }
                w
            });
            (out, weights)
        })
        .collect();
    let mut out_tol = Vec::with_capacity(s.out_len());
    let mut w_tol = job.weights.then(|| Vec::with_capacity(s.weights_len()));
    for (out, weights) in bounded {
        out_tol.extend(out);
        if let (Some(all), Some(w)) = (&mut w_tol, weights) {
            all.extend(w);
        }
    }
    (out_tol, w_tol)
}
