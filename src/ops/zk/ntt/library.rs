//! The CPU transforms on the crates a ZK engineer would reach for: Plonky3's
//! `Radix2DFTSmallBatch` for Goldilocks and BabyBear, ark-poly's radix-2 domains for the
//! 256-bit fields. Both derive ω_n from the generators of `Field::generator` exactly as the
//! kernels' tables do, so the results are the same field elements bit for bit; the tests
//! hold them to the radix-2 reference in `Plan` and to the definition.

use super::{from_limbs, to_limbs, Direction, NttJob, Order};
use crate::ops::zk::field::FieldVec;
use crate::ops::zk::vector_ops::Fp;
use ark_ff::{FftField, MontConfig};
use ark_poly::{EvaluationDomain, Radix2EvaluationDomain};
use p3_baby_bear::BabyBear;
use p3_dft::{Radix2DFTSmallBatch, TwoAdicSubgroupDft};
use p3_field::{PrimeField32, PrimeField64, TwoAdicField};
use p3_goldilocks::Goldilocks;
use p3_matrix::dense::RowMajorMatrix;
use rayon::prelude::*;
use std::sync::LazyLock;

/// Plonky3 keeps the twiddles of the largest size it has seen and serves smaller sizes
/// from them. Up to this size they live for the process (at most 16 MiB for Goldilocks,
/// 8 MiB for BabyBear, forward and inverse); a larger transform builds its own and drops
/// them with the job, so one huge request does not pin its tables.
const CACHED_TWIDDLES_MAX_LOG2: u32 = 20;

static GOLDILOCKS_DFT: LazyLock<Radix2DFTSmallBatch<Goldilocks>> =
    LazyLock::new(Radix2DFTSmallBatch::default);
static BABYBEAR_DFT: LazyLock<Radix2DFTSmallBatch<BabyBear>> =
    LazyLock::new(Radix2DFTSmallBatch::default);

pub(super) fn run(job: &NttJob) -> FieldVec {
    let n = job.size();
    let shift = job.coset_shift;
    match &job.values {
        FieldVec::Goldilocks(v) => {
            let shift = shift.map(|s| Goldilocks::new(s.0[0]));
            let dft = dft_for(&GOLDILOCKS_DFT, n);
            FieldVec::Goldilocks(plonky3(job, v, &dft, shift, Goldilocks::new, |x| {
                x.as_canonical_u64()
            }))
        }
        FieldVec::BabyBear(v) => {
            let shift = shift.map(|s| BabyBear::new(s.0[0] as u32));
            let dft = dft_for(&BABYBEAR_DFT, n);
            FieldVec::BabyBear(plonky3(job, v, &dft, shift, BabyBear::new, |x| {
                x.as_canonical_u32()
            }))
        }
        FieldVec::Bn254Fr(v) => FieldVec::Bn254Fr(ark::<ark_bn254::FrConfig>(job, v)),
        FieldVec::Bls12_381Fr(v) => FieldVec::Bls12_381Fr(ark::<ark_bls12_381::FrConfig>(job, v)),
    }
}

/// The process-wide instance for sizes whose tables it may keep, else a fresh one.
fn dft_for<F: TwoAdicField>(
    cached: &LazyLock<Radix2DFTSmallBatch<F>>,
    n: usize,
) -> Radix2DFTSmallBatch<F> {
    if n.trailing_zeros() <= CACHED_TWIDDLES_MAX_LOG2 {
        // A clone shares the cache (an `Arc` inside).
        (**cached).clone()
    } else {
        Radix2DFTSmallBatch::new(n)
    }
}

/// Conversions run in parallel pieces of at least this many elements.
const MIN_PIECE: usize = 4096;

/// Columns read back together from a wide Plonky3 matrix: a 64-byte line of Goldilocks.
const COLUMNS_PER_GROUP: usize = 8;

/// Where the element of natural index `i` sits in a transform of 2^bits in `order`
/// (bit reversal is an involution, so this also maps positions back to indices).
fn position(i: usize, bits: u32, order: Order) -> usize {
    match order {
        Order::Natural => i,
        Order::BitReversed if bits == 0 => i,
        Order::BitReversed => i.reverse_bits() >> (usize::BITS - bits),
    }
}

/// The job on Plonky3: the transforms become the columns of one n × batch matrix
/// (Plonky3's own layout, which it transforms a row of butterflies at a time), with the
/// input order undone in the same pass; the answer is read back out of the columns in the
/// output order, again in one pass.
fn plonky3<F: TwoAdicField, W: Copy + Default + Send + Sync>(
    job: &NttJob,
    values: &[W],
    dft: &Radix2DFTSmallBatch<F>,
    shift: Option<F>,
    from: impl Fn(W) -> F + Sync,
    to: impl Fn(F) -> W + Sync,
) -> Vec<W> {
    let (n, batch) = (job.size(), job.batch);
    let bits = n.trailing_zeros();
    let matrix: Vec<F> = if batch == 1 {
        (0..n)
            .into_par_iter()
            .with_min_len(MIN_PIECE)
            .map(|r| from(values[position(r, bits, job.input_order)]))
            .collect()
    } else {
        let rows_per_piece = (MIN_PIECE / batch).max(1);
        let mut matrix = vec![F::ZERO; values.len()];
        matrix
            .par_chunks_mut(batch * rows_per_piece)
            .enumerate()
            .for_each(|(piece, rows)| {
                // A block transpose: each transform's run of rows is read in one pass,
                // and the piece written is small enough to stay in cache.
                let first = piece * rows_per_piece;
                for b in 0..batch {
                    let column = &values[b * n..(b + 1) * n];
                    for i in 0..rows.len() / batch {
                        rows[i * batch + b] =
                            from(column[position(first + i, bits, job.input_order)]);
                    }
                }
            });
        matrix
    };
    let matrix = RowMajorMatrix::new(matrix, batch);
    let evaluations = match (job.direction, shift) {
        (Direction::Forward, None) => dft.dft_batch(matrix),
        (Direction::Forward, Some(s)) => dft.coset_dft_batch(matrix, s),
        (Direction::Inverse, None) => dft.idft_batch(matrix),
        (Direction::Inverse, Some(s)) => dft.coset_idft_batch(matrix, s),
    }
    .values;
    if batch < 2 * COLUMNS_PER_GROUP {
        // Output element k is element j of transform b (n is a power of two). With few
        // columns, reading one column touches lines its neighbours share.
        return (0..values.len())
            .into_par_iter()
            .with_min_len(MIN_PIECE)
            .map(|k| {
                let (b, j) = (k >> bits, k & (n - 1));
                to(evaluations[position(j, bits, job.output_order) * batch + b])
            })
            .collect();
    }
    // Many columns: a group of them at a time, so every cache line of the matrix is read
    // once rather than once per column.
    let mut out = vec![W::default(); values.len()];
    out.par_chunks_mut(n * COLUMNS_PER_GROUP)
        .enumerate()
        .for_each(|(group, transforms)| {
            let first = group * COLUMNS_PER_GROUP;
            let count = transforms.len() / n;
            for j in 0..n {
                let row = position(j, bits, job.output_order) * batch + first;
                for (c, &x) in evaluations[row..row + count].iter().enumerate() {
                    transforms[c * n + j] = to(x);
                }
            }
        });
    out
}

/// The job on ark-poly's radix-2 domain (a coset of it when shifted), one transform at a
/// time in parallel; conversions to and from Montgomery form also in parallel, with the
/// orders applied on the way.
fn ark<C: MontConfig<4>>(job: &NttJob, values: &[[u64; 4]]) -> Vec<[u64; 4]> {
    let n = job.size();
    let bits = n.trailing_zeros();
    let mut domain =
        Radix2EvaluationDomain::<Fp<C>>::new(n).expect("size checked against the two-adicity");
    if let Some(s) = job.coset_shift {
        domain = domain
            .get_coset(from_limbs::<C>(&s.0))
            .expect("a non-zero shift");
    }
    debug_assert_eq!(
        domain.group_gen,
        Fp::<C>::get_root_of_unity(n as u64).unwrap()
    );
    let mut out = vec![[0u64; 4]; values.len()];
    out.par_chunks_mut(n)
        .zip(values.par_chunks(n))
        .for_each(|(poly_out, poly)| {
            let mut coeffs: Vec<Fp<C>> = (0..n)
                .into_par_iter()
                .with_min_len(MIN_PIECE)
                .map(|i| from_limbs::<C>(&poly[position(i, bits, job.input_order)]))
                .collect();
            match job.direction {
                Direction::Forward => domain.fft_in_place(&mut coeffs),
                Direction::Inverse => domain.ifft_in_place(&mut coeffs),
            }
            poly_out
                .par_iter_mut()
                .with_min_len(MIN_PIECE)
                .enumerate()
                .for_each(|(j, w)| *w = to_limbs(coeffs[position(j, bits, job.output_order)]));
        });
    out
}
