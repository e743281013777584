//! `cargo bench --bench ntt`: the service's CPU NTT (`NttJob::run_cpu`, on Plonky3 and
//! ark-poly) beside, in the same process and on the same rayon pool, (a) the radix-2 twin
//! it replaced (`NttJob::run_reference`) and (b) the library called directly on the
//! elements its users hold: Plonky3 field elements in a column matrix (batches as the
//! matrix's columns, Plonky3's own layout), ark-poly elements in Montgomery form. Forward,
//! natural order, no coset. The service figure includes converting canonical integers
//! into the library's form and back (Plonky3's fields; the 256-bit fields go through
//! ark-poly without conversion). The `conversions` column times that alone for Plonky3's
//! fields (each element out of the library's form and back in, a separate pass on the same
//! pool, where the service folds it into its transposes), so roughly the rest of the gap
//! to the library is the layout work around the call. Env: BENCH_NTT_LOG2 (default 20),
//! BENCH_NTT_BATCH (transforms in the batched rows, default 256), BENCH_NTT_BATCH_LOG2
//! (their size, default 12).

mod common;

use ark_ff::{BigInt, Fp256, MontBackend, MontConfig};
use ark_poly::{EvaluationDomain, Radix2EvaluationDomain};
use common::{env, ms, time};
use gpu_ops::backend::CpuExecutor;
use gpu_ops::ops::zk::ntt::{Direction, NttJob, Order};
use gpu_ops::ops::zk::samples::random_elements;
use gpu_ops::ops::zk::{Field, FieldVec, U256};
use p3_dft::{Radix2DFTSmallBatch, TwoAdicSubgroupDft};
use p3_field::{PrimeField64, TwoAdicField};
use p3_matrix::dense::RowMajorMatrix;
use rayon::prelude::*;
use std::time::Duration;

fn main() {
    let log_n = env("BENCH_NTT_LOG2", 20) as u32;
    let batch = env("BENCH_NTT_BATCH", 256);
    let batch_log_n = env("BENCH_NTT_BATCH_LOG2", 12) as u32;
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = CpuExecutor::new(1).unwrap().info.model.clone();
    println!("# gpu-ops NTT benchmark, CPU: {model}\n");
    println!("| threads | field | transforms | service NTT | previous twin | library direct | conversions | service ÷ library | service ÷ previous |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut threads = vec![1];
    if all > 1 {
        threads.push(all);
    }
    for &t in &threads {
        let cpu = CpuExecutor::new(t).unwrap();
        for field in Field::ALL {
            for (log_n, batch) in [(log_n, 1), (batch_log_n, batch)] {
                row(&cpu, t, field, log_n, batch);
            }
        }
    }
}

fn row(cpu: &CpuExecutor, threads: usize, field: Field, log_n: u32, batch: usize) {
    let n = 1usize << log_n;
    let xs = random_elements(field, n * batch, 9);
    let job = NttJob::new(
        Direction::Forward,
        FieldVec::from_integers(field, &xs).unwrap(),
        batch,
        Order::Natural,
        Order::Natural,
        None,
        32,
    )
    .unwrap();
    let runs = if field.byte_width() == 32 { 5 } else { 9 };
    let service = cpu.install(|| time(runs, || job.run_cpu()));
    let previous = cpu.install(|| time(runs, || job.run_reference()));
    let (direct, conversions) = cpu.install(|| match field {
        Field::Goldilocks => plonky3(&xs, n, batch, runs, p3_goldilocks::Goldilocks::new),
        Field::BabyBear => plonky3(&xs, n, batch, runs, |x| {
            p3_baby_bear::BabyBear::new(x as u32)
        }),
        Field::Bn254Fr => ark::<ark_bn254::FrConfig>(&xs, n, runs),
        Field::Bls12_381Fr => ark::<ark_bls12_381::FrConfig>(&xs, n, runs),
    });
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "| {threads} | {} | {batch} × 2^{log_n} | {} | {} | {} | {} | {:.2}× | {:.2}× |",
        field.name(),
        ms(service),
        ms(previous),
        ms(direct),
        conversions.map_or("—".into(), ms),
        ratio(service, direct),
        ratio(service, previous),
    );
}

/// Plonky3's `Radix2DFTSmallBatch` with its twiddles kept between calls (as a Plonky3
/// user keeps the instance), on an n × batch matrix: each column one polynomial. Also
/// the time to take every element out of Plonky3's form and back in (canonical integers
/// are what the wire holds).
fn plonky3<F: TwoAdicField + PrimeField64>(
    xs: &[U256],
    n: usize,
    batch: usize,
    runs: usize,
    from: impl Fn(u64) -> F + Sync,
) -> (Duration, Option<Duration>) {
    // xs holds the polynomials one after another; the matrix wants them as columns.
    let mut columns = Vec::with_capacity(xs.len());
    for row in 0..n {
        columns.extend((0..batch).map(|b| from(xs[b * n + row].0[0])));
    }
    let dft = Radix2DFTSmallBatch::<F>::default();
    let direct = time(runs, || {
        dft.dft_batch(RowMajorMatrix::new(columns.clone(), batch))
    });
    let conversions = time(runs, || {
        columns
            .par_iter()
            .map(|x| from(x.as_canonical_u64()))
            .collect::<Vec<F>>()
    });
    (direct, Some(conversions))
}

/// ark-poly's radix-2 FFT on elements already in Montgomery form, the polynomials of a
/// batch in parallel.
fn ark<C: MontConfig<4>>(xs: &[U256], n: usize, runs: usize) -> (Duration, Option<Duration>) {
    type F<C> = Fp256<MontBackend<C, 4>>;
    let coeffs: Vec<F<C>> = xs.iter().map(|x| F::<C>::new(BigInt(x.0))).collect();
    let domain = Radix2EvaluationDomain::<F<C>>::new(n).unwrap();
    let direct = time(runs, || {
        coeffs
            .par_chunks(n)
            .map(|poly| domain.fft(poly))
            .collect::<Vec<_>>()
    });
    (direct, None)
}
