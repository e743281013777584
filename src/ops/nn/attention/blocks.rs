//! The CPU twin's inner loops: one query block's online softmax over key blocks, and a
//! block of logits through the `gemm` crate.

use super::super::real::Real;
use super::CPU_KEY_BLOCK;
use crate::ops::linalg::views::gemm_into;
use gemm::Parallelism;
use ndarray::{ArrayView2, ArrayViewMut2};

/// One query block's attention: `rows` queries `q` (`rows × d`), the head's keys and
/// values, and each row's visible-key count `ends` (non-decreasing). Writes the rows'
/// outputs and log-sum-exps.
#[allow(clippy::too_many_arguments)]
pub(super) fn online_softmax_block<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    (d, dv): (usize, usize),
    scale: T,
    ends: &[usize],
    out: &mut [T],
    lse: &mut [T],
) {
    let rows = ends.len();
    let key_end = ends.iter().copied().max().unwrap_or(0);
    let mut top = vec![T::NEG_INFINITY; rows];
    let mut sum = vec![T::ZERO; rows];
    let mut scores = vec![T::ZERO; rows * CPU_KEY_BLOCK];
    for first in (0..key_end).step_by(CPU_KEY_BLOCK) {
        let width = CPU_KEY_BLOCK.min(key_end - first);
        let scores = &mut scores[..rows * width];
        block_logits(q, &k[first * d..], d, scale, rows, width, scores, false);
        for r in 0..rows {
            let row = &mut scores[r * width..][..width];
            let seen = ends[r].saturating_sub(first).min(width);
            let block_top = row[..seen].iter().copied().fold(T::NEG_INFINITY, T::max);
            let new_top = top[r].max(block_top);
            if new_top == T::NEG_INFINITY {
                // Nothing visible yet: the row's partial output stays zero.
                row.fill(T::ZERO);
                continue;
            }
            let mut added = T::ZERO;
            for (j, x) in row.iter_mut().enumerate() {
                *x = if j < seen {
                    (*x - new_top).exp()
                } else {
                    T::ZERO
                };
                added = added + *x;
            }
            // exp(−∞) = 0: a row's first visible block needs no rescale.
            let rescale = (top[r] - new_top).exp();
            if rescale != T::ONE {
                out[r * dv..][..dv]
                    .iter_mut()
                    .for_each(|o| *o = *o * rescale);
            }
            sum[r] = sum[r] * rescale + added;
            top[r] = new_top;
        }
        // out += P · V_block, the values of keys first..first + width.
        let p = ArrayView2::from_shape((rows, width), &*scores).expect("rows × width");
        let v_block = ArrayView2::from_shape((width, dv), &v[first * dv..][..width * dv])
            .expect("width × dv values");
        let out = ArrayViewMut2::from_shape((rows, dv), &mut out[..rows * dv]).expect("rows × dv");
        gemm_into(
            out,
            p,
            v_block,
            T::ONE,
            Some(T::ONE),
            false,
            Parallelism::None,
        );
    }
    for r in 0..rows {
        if sum[r] > T::ZERO {
            let inv = sum[r];
            out[r * dv..][..dv].iter_mut().for_each(|o| *o = *o / inv);
            lse[r] = top[r] + sum[r].ln();
        } else {
            out[r * dv..][..dv].fill(T::ZERO);
            lse[r] = T::NEG_INFINITY;
        }
    }
}

/// `scores = scale · Q · K_blockᵀ` for `rows` queries and `width` keys (row-major
/// `rows × width`), with one thread, or every thread when `parallel`.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_logits<T: Real>(
    q: &[T],
    k: &[T],
    d: usize,
    scale: T,
    rows: usize,
    width: usize,
    scores: &mut [T],
    parallel: bool,
) {
    let parallelism = if parallel {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    };
    let q = ArrayView2::from_shape((rows, d), &q[..rows * d]).expect("rows × d queries");
    let k = ArrayView2::from_shape((width, d), &k[..width * d]).expect("width × d keys");
    let scores = ArrayViewMut2::from_shape((rows, width), &mut scores[..rows * width])
        .expect("rows × width");
    gemm_into(scores, q, k.t(), scale, None, false, parallelism);
}
