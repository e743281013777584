//! The CPU transforms on the crates a ZK engineer would reach for: Plonky3's
//! `Radix2DFTSmallBatch` for Goldilocks and BabyBear, ark-poly's radix-2 domains for the
//! 256-bit fields. Both derive ω_n from the generators of `Field::generator` exactly as the
//! kernels' tables do, so the results are the same field elements bit for bit; the tests
//! hold them to the radix-2 reference in `Plan` and to the definition.

use super::{from_limbs, Direction, NttJob, Order};
use crate::ops::zk::field::FieldVec;
use crate::ops::zk::vector_ops::Fp;
use ark_ff::{BigInt, FftField, MontConfig};
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

/// Where the element of natural index `i` sits in a transform of 2^bits in `order`
/// (bit reversal is an involution, so this also maps positions back to indices).
fn position(i: usize, bits: u32, order: Order) -> usize {
    match order {
        Order::Natural => i,
        Order::BitReversed => super::reversed_index(i, bits),
    }
}

/// A group of transforms is put in one matrix up to this size, so that the transposes into
/// and out of Plonky3's layout run in cache: the group's input and its matrix together
/// are twice this, within a core's L2 (512 KiB on the development machine's EPYC).
const GROUP_MATRIX_BYTES: usize = 256 * 1024;

/// The job on Plonky3, whose layout for a batch is the columns of one n × batch matrix,
/// transformed a row of butterflies at a time (vectorised across the columns). The wire
/// holds each transform's values together, so the batch is taken a group of transforms at
/// a time, as many as keep the group's matrix within GROUP_MATRIX_BYTES: the transposes
/// then cost cache reads, not memory passes (with the whole batch as one matrix they cost
/// more than Plonky3 saved: 1.6–2.2× its batched call on 256 × 2^12 Goldilocks,
/// docs/PERFORMANCE.md). Small transforms make wide groups (thousands of columns when n is
/// tiny), so the per-call overhead is spread over many; a large transform is a group of its
/// own, a one-column matrix, converted in parallel pieces. The input order is undone as
/// the values are converted, the output order applied as they are read back.
fn plonky3<F: TwoAdicField, W: Copy + Default + Send + Sync>(
    job: &NttJob,
    values: &[W],
    dft: &Radix2DFTSmallBatch<F>,
    shift: Option<F>,
    from: impl Fn(W) -> F + Sync,
    to: impl Fn(F) -> W + Sync,
) -> Vec<W> {
    let n = job.size();
    let bits = n.trailing_zeros();
    let width = (GROUP_MATRIX_BYTES / (n * std::mem::size_of::<F>()))
        .max(1)
        .min(job.batch);
    let mut out = vec![W::default(); values.len()];
    out.par_chunks_mut(n * width)
        .zip(values.par_chunks(n * width))
        .for_each(|(group_out, group)| {
            let width = group.len() / n;
            let mut matrix = vec![F::ZERO; group.len()];
            matrix
                .par_chunks_mut(width)
                .with_min_len((MIN_PIECE / width).max(1))
                .enumerate()
                .for_each(|(r, row)| {
                    let i = position(r, bits, job.input_order);
                    for (b, x) in row.iter_mut().enumerate() {
                        *x = from(group[b * n + i]);
                    }
                });
            let matrix = RowMajorMatrix::new(matrix, width);
            let evaluations = match (job.direction, shift) {
                (Direction::Forward, None) => dft.dft_batch(matrix),
                (Direction::Forward, Some(s)) => dft.coset_dft_batch(matrix, s),
                (Direction::Inverse, None) => dft.idft_batch(matrix),
                (Direction::Inverse, Some(s)) => dft.coset_idft_batch(matrix, s),
            }
            .values;
            if width == 1 {
                // Element j is at row position(j): position is an involution.
                group_out
                    .par_iter_mut()
                    .with_min_len(MIN_PIECE)
                    .enumerate()
                    .for_each(|(j, w)| *w = to(evaluations[position(j, bits, job.output_order)]));
                return;
            }
            // Row by row (the group is in cache): row r holds element `position(r)` of
            // each transform.
            for (r, row) in evaluations.chunks_exact(width).enumerate() {
                let j = position(r, bits, job.output_order);
                for (b, &x) in row.iter().enumerate() {
                    group_out[b * n + j] = to(x);
                }
            }
        });
    out
}

/// The job on ark-poly's radix-2 domain (a coset of it when shifted), one transform at a
/// time in parallel, with the orders applied on the way in and out.
///
/// The canonical integers go in as if they were already in Montgomery form, and what comes
/// out is read the same way, so nothing is converted (a multiplication and a reduction an
/// element saved: 256 × 2^12 batches 1.1–1.2× faster on two threads, docs/PERFORMANCE.md).
/// This is exact because the transform is linear and every constant
/// in it (the powers of ω, n⁻¹, the coset shift's powers) is a true field element: the
/// input x taken as Montgomery form is the value x·R⁻¹, the output is then NTT(x)·R⁻¹, and
/// that value's Montgomery form is NTT(x), fully reduced like every element ark-ff holds.
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
    // Canonical by construction (`FieldVec` is checked on the way in); a value at or above
    // the modulus would not be an element's Montgomery form.
    debug_assert!(values.iter().all(|v| BigInt(*v) < C::MODULUS));
    let mut out = vec![[0u64; 4]; values.len()];
    out.par_chunks_mut(n)
        .zip(values.par_chunks(n))
        .for_each(|(poly_out, poly)| {
            let mut coeffs: Vec<Fp<C>> = (0..n)
                .into_par_iter()
                .with_min_len(MIN_PIECE)
                .map(|i| Fp::<C>::new_unchecked(BigInt(poly[position(i, bits, job.input_order)])))
                .collect();
            match job.direction {
                Direction::Forward => domain.fft_in_place(&mut coeffs),
                Direction::Inverse => domain.ifft_in_place(&mut coeffs),
            }
            poly_out
                .par_iter_mut()
                .with_min_len(MIN_PIECE)
                .enumerate()
                .for_each(|(j, w)| *w = coeffs[position(j, bits, job.output_order)].0 .0);
        });
    out
}
