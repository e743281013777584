//! The linalg ops under `gpu-ops check`: each op at the level's sizes, with fresh random
//! inputs and edge values, held to its CPU twin; what the report says of each case.
//!
//! Standard: 4096³ products in each compute precision (f32, tf32, f16, bf16) and one
//! batched product of transposed operands, on our kernel (`matmul`) and again forced
//! through cuBLASLt (`matmul_cublaslt`, where it opened); 32 768 sinusoidal positions of
//! 1 024 dimensions in both layouts; 65 536 lookups in a 100 000 × 512 table.
//! Quick (the emulated device): products across the kernel's 64-wide tiles and 16-deep
//! slices, one per compute precision, one of them past a grid stride of tiles; embeddings
//! and lookups past one grid stride.
//!
//! CPU twins at the standard level (measured here as CPU seconds, 2 cores, test build,
//! at 2048³ and scaled by 8): a 4096³ product's twin (f32 `gemm`) takes about 6.7 CPU-s
//! and the tolerance `Job::agrees` builds (the product of |A|·|B| in f64) about 15, so
//! about 1.4 s on 16 cores; the four cubes and the batched product (half a cube), on
//! both providers, about 13 s. The embeddings' twins took 0.8 CPU-s (sinusoidal) and
//! 0.15–0.4 (lookups) each, their checks under 0.1 s: well under a second in all.

use super::{run_matmul_on, MatmulProvider};
use super::{Compute, Dtype, Layout, LookupJob, MatmulJob, MatmulShape, Operands, SinusoidalJob};
use crate::backend::cuda::blaslt::MATMUL_BLASLT_OP;
use crate::backend::measure::{case_seed, mixed_values as mixed, CaseInfo, CheckLevel};
use crate::backend::verify::{JobCheck, LibraryCheck, SelfTest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// The edge magnitudes of a product's operands: A's large one, B's, and both operands'
/// small one. Within the compute precision's range, and such that no value of D
/// overflows the output dtype: where f16 is either, only A is large (2^10: a row of A
/// holds about k/96 of them, times B's values in (−1, 1), a sum whose spread at k = 4096
/// is about 4 000, far below f16's 65 504). The small one is an f16 subnormal for f16
/// compute, a tiny normal f32 otherwise.
fn operand_edges(compute: Compute, output: Dtype) -> (f32, f32, f32) {
    let tiny = if compute == Compute::F16 {
        2f32.powi(-20)
    } else {
        1e-30
    };
    if compute == Compute::F16 || output == Dtype::F16 {
        (1024.0, 1.0, tiny)
    } else {
        (1e12, 1e12, tiny)
    }
}

/// One product of the check: its shape, precisions, and C with β or not.
struct Product {
    shape: MatmulShape,
    compute: Compute,
    output: Dtype,
    with_c: bool,
}

/// "8 × 2048×2048×1024 tf32, Bᵀ", "4096³ f16, f16 out", "70×130×33 f32 + β·C".
fn product_label(p: &Product) -> String {
    let s = p.shape;
    let batch = if s.batch > 1 {
        format!("{} × ", s.batch)
    } else {
        String::new()
    };
    let dims = if s.m == s.n && s.n == s.k {
        format!("{}³", s.m)
    } else {
        format!("{}×{}×{}", s.m, s.n, s.k)
    };
    let mut label = format!("{batch}{dims} {}", p.compute.name());
    if p.output != Dtype::F32 {
        label.push_str(&format!(", {} out", p.output.name()));
    }
    label.push_str(match (s.trans_a, s.trans_b) {
        (false, false) => "",
        (true, false) => ", Aᵀ",
        (false, true) => ", Bᵀ",
        (true, true) => ", Aᵀ Bᵀ",
    });
    if p.with_c {
        label.push_str(" + β·C");
    }
    label
}

fn matmul_products(level: CheckLevel) -> Vec<Product> {
    let shape = |batch, m, n, k, trans_a, trans_b| MatmulShape {
        batch,
        m,
        n,
        k,
        a_batched: batch > 1,
        b_batched: batch > 1,
        c_batched: batch > 1,
        trans_a,
        trans_b,
    };
    let product = |shape, compute, output, with_c| Product {
        shape,
        compute,
        output,
        with_c,
    };
    match level {
        // 64 × 64 tiles, 16 deep: every m, n and k below crosses a tile or slice edge
        // raggedly; the f16 case has 36 tiles, past the emulated device's grid of 32
        // blocks; the bf16 one broadcasts A over a batched B and adds a batched C.
        CheckLevel::Quick => vec![
            product(
                shape(1, 70, 130, 33, false, false),
                Compute::F32,
                Dtype::F32,
                false,
            ),
            product(
                shape(1, 129, 67, 40, true, true),
                Compute::Tf32,
                Dtype::F32,
                true,
            ),
            product(
                shape(4, 130, 130, 20, false, true),
                Compute::F16,
                Dtype::F16,
                false,
            ),
            product(
                MatmulShape {
                    a_batched: false,
                    ..shape(3, 17, 130, 33, true, false)
                },
                Compute::Bf16,
                Dtype::Bf16,
                true,
            ),
        ],
        // 4096³ in each precision (half-precision products answer in their own dtype,
        // as a framework's would), and a batched A·Bᵀ (a linear layer's weights stored
        // as rows, per batch entry).
        CheckLevel::Standard => {
            let cube = shape(1, 4096, 4096, 4096, false, false);
            vec![
                product(cube, Compute::F32, Dtype::F32, false),
                product(cube, Compute::Tf32, Dtype::F32, false),
                product(cube, Compute::F16, Dtype::F16, false),
                product(cube, Compute::Bf16, Dtype::Bf16, false),
                product(
                    shape(8, 2048, 2048, 1024, false, true),
                    Compute::Tf32,
                    Dtype::F32,
                    false,
                ),
            ]
        }
    }
}

/// The check's products as jobs, each described: bytes of A, B, C and D in f32 (what the
/// device holds), 2·batch·m·n·k flops, and the same product for PyTorch.
fn matmul_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, MatmulJob)> {
    matmul_products(level)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let s = p.shape;
            let (a_big, b_big, tiny) = operand_edges(p.compute, p.output);
            let salt = seed ^ (0x11 + 4 * i as u64);
            let operands = Operands::F32 {
                a: mixed(s.a_len(), salt, a_big, tiny).into(),
                b: mixed(s.b_len(), salt ^ 1, b_big, tiny).into(),
                c: p.with_c
                    .then(|| mixed(s.c_len(), salt ^ 2, a_big, tiny).into()),
            };
            // A plain product at production sizes (what PyTorch times); α and β other
            // than 1 where the quick level exercises C.
            let (alpha, beta) = if p.with_c { (0.75, -1.5) } else { (1.0, 0.0) };
            let job = MatmulJob::new(s, operands, alpha, beta, p.compute, Dtype::F32, p.output)
                .expect("a valid check product");
            let c = if p.with_c { s.c_len() } else { 0 };
            let info = CaseInfo::labelled(product_label(&p))
                .with_bytes(4.0 * (s.a_len() + s.b_len() + c + s.out_len()) as f64)
                .with_flops(s.flops())
                .with_compare(json!({
                    "kind": "matmul",
                    "batch": s.batch,
                    "m": s.m,
                    "n": s.n,
                    "k": s.k,
                    "trans_a": s.trans_a,
                    "trans_b": s.trans_b,
                    "compute": p.compute.name(),
                }));
            (info, job)
        })
        .collect()
}

/// Sinusoidal embeddings: a sequence's positions (0, 1, 2, …) with about one in 32
/// replaced by a large, fractional or negative one, in both layouts and two output
/// dtypes. Quick: 300 × 64, 9 600 (row, pair) threads, past the emulated grid of 8 192.
fn sinusoidal_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, SinusoidalJob)> {
    let (rows, dim) = level.pick((300, 64), (32_768, 1024));
    let mut rng = StdRng::seed_from_u64(seed ^ 0x21);
    let positions: Vec<f64> = (0..rows)
        .map(|i| match (i, rng.random_ratio(1, 32)) {
            (0, _) | (_, false) => i as f64,
            (_, true) => match rng.random_range(0..3) {
                0 => rng.random_range(1e6..1e12),
                1 => i as f64 + rng.random_range(0.0..1.0),
                _ => -rng.random_range(0.0..1e4),
            },
        })
        .collect();
    [
        (Layout::Interleaved, Dtype::F32, "interleaved"),
        (Layout::Split, Dtype::Bf16, "split"),
    ]
    .into_iter()
    .map(|(layout, output, how)| {
        let job = SinusoidalJob::new(&positions, dim, 10_000.0, 1.0, 0.0, layout, output)
            .expect("a valid check embedding");
        // The device reads the f64 times and frequencies and writes f64 values.
        let bytes = 8.0 * (rows + dim / 2 + rows * dim) as f64;
        let label = format!(
            "{} positions × {dim}, {how}, {}",
            thousands(rows),
            output.name()
        );
        (CaseInfo::labelled(label).with_bytes(bytes), job)
    })
    .collect()
}

/// Lookups in one table: ids uniform over the table with a hot set (a tenth of the ids
/// among 64 rows) and the first and last row, as f32 and bf16. Quick: 300 ids of 40
/// values, 12 000 threads, past the emulated grid of 8 192.
fn lookup_cases(level: CheckLevel, seed: u64) -> Vec<(CaseInfo, LookupJob)> {
    let (vocab, dim, count) = level.pick((97, 40, 300), (100_000, 512, 65_536));
    let table = crate::wire::Array::from(mixed(vocab * dim, seed ^ 0x31, 3e38, 1e-45)).shared();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x32);
    let hot: Vec<u32> = (0..64).map(|_| rng.random_range(0..vocab as u32)).collect();
    let ids: Vec<u32> = (0..count)
        .map(|i| match i {
            0 => 0,
            1 => vocab as u32 - 1,
            _ if rng.random_ratio(1, 10) => hot[rng.random_range(0..hot.len())],
            _ => rng.random_range(0..vocab as u32),
        })
        .collect();
    // A key of the check's own (never a caller's table), one per table shape.
    let key = format!("check/embeddings/{vocab}x{dim}");
    [Dtype::F32, Dtype::Bf16]
        .into_iter()
        .map(|output| {
            let job = LookupJob::new(key.clone(), table.clone(), dim, ids.clone(), output)
                .expect("ids within the table");
            // The ids and the rows they name read once, the output written once.
            let bytes = 4.0 * (count + 2 * count * dim) as f64;
            let label = format!(
                "{} ids from {} × {dim}, {}",
                thousands(count),
                thousands(vocab),
                output.name()
            );
            let info = CaseInfo::labelled(label).with_bytes(bytes).with_compare(
                json!({"kind": "embedding", "rows": vocab, "dim": dim, "ids": count}),
            );
            (info, job)
        })
        .collect()
}

/// "65 536", "100 000", "300".
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// The products again, forced through cuBLASLt (where it opened): the library measured
/// at the same sizes as our kernel.
fn blaslt_cases(cases: &[(CaseInfo, MatmulJob)]) -> Box<dyn SelfTest> {
    let (infos, jobs) = cases.iter().cloned().unzip();
    Box::new(LibraryCheck {
        op: MATMUL_BLASLT_OP,
        serves: &["matmul", "conv2d"],
        jobs,
        opened: |dev| dev.has_blaslt(),
        run: |job, dev| run_matmul_on(job, dev, MatmulProvider::BlasLt),
        infos,
    })
}

pub(crate) fn check_cases(level: CheckLevel) -> Vec<Box<dyn SelfTest>> {
    let seed = case_seed();
    let products = matmul_cases(level, seed);
    let blaslt = blaslt_cases(&products);
    vec![
        JobCheck::described(products),
        JobCheck::described(sinusoidal_cases(level, seed)),
        JobCheck::described(lookup_cases(level, seed)),
        blaslt,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Job;
    use crate::ops::linalg::tests::rounded;

    const SEED: u64 = 0x5eed;

    #[test]
    fn every_op_has_its_check_at_both_levels() {
        for level in [CheckLevel::Quick, CheckLevel::Standard] {
            let ops: Vec<&str> = check_cases(level).iter().map(|c| c.op()).collect();
            assert_eq!(
                ops,
                [
                    "matmul",
                    "embeddings_sinusoidal",
                    "embeddings_lookup",
                    MATMUL_BLASLT_OP
                ],
                "{level:?}"
            );
        }
    }

    /// Each quick case's CPU answer is held, by the job's own `agrees`, to an answer
    /// computed here without the code under test (the naive product of `tests.rs`, the
    /// sines and cosines laid out from the API's definition, the table rows read by id),
    /// and `agrees` refuses that answer with one value made wrong: so a case of the check
    /// can tell a right device from a wrong one.
    #[test]
    fn quick_cases_agree_with_an_independent_answer_and_refuse_a_wrong_one() {
        let level = CheckLevel::Quick;
        for (info, job) in matmul_cases(level, SEED) {
            assert_eq!(job.name(), "matmul");
            super::super::tests::holds_to_the_naive_product(&job, &info.label);
        }
        for (info, job) in sinusoidal_cases(level, SEED) {
            assert_eq!(job.name(), "embeddings_sinusoidal");
            let (dim, half) = (job.dim(), job.frequencies.len());
            for (i, &f) in job.frequencies.iter().enumerate() {
                let want = 10_000f64.powf(-2.0 * i as f64 / dim as f64);
                assert!(
                    (f - want).abs() <= 4.0 * f64::EPSILON * want,
                    "{}",
                    info.label
                );
            }
            let mut want = vec![0.0; job.times.len() * dim];
            for (r, &t) in job.times.iter().enumerate() {
                for (i, &f) in job.frequencies.iter().enumerate() {
                    let (sine, cosine) = match job.layout {
                        Layout::Interleaved => (r * dim + 2 * i, r * dim + 2 * i + 1),
                        Layout::Split => (r * dim + i, r * dim + half + i),
                    };
                    want[sine] = rounded((t * f).sin(), job.output);
                    want[cosine] = rounded((t * f).cos(), job.output);
                }
            }
            let cpu = job.run_cpu();
            job.agrees(&want, &cpu).expect(&info.label);
            // Row 0 (position 0) with its first sine and cosine swapped: 1 and 0.
            let cosine = if job.layout == Layout::Split { half } else { 1 };
            want.swap(0, cosine);
            assert!(job.agrees(&want, &cpu).is_err(), "{}", info.label);
        }
        for (info, job) in lookup_cases(level, SEED) {
            assert_eq!(job.name(), "embeddings_lookup");
            let d = job.dim;
            let mut want: Vec<f32> = job
                .ids
                .iter()
                .flat_map(|&id| &job.table[id as usize * d..(id as usize + 1) * d])
                .map(|&x| rounded(f64::from(x), job.output) as f32)
                .collect();
            let cpu = job.run_cpu();
            job.agrees(&want, &cpu).expect(&info.label);
            // Row 1 read in place of row 0 (an off-by-one id).
            let next = job.table[job.ids[0] as usize * d + d];
            want[0] = rounded(f64::from(next), job.output) as f32;
            assert!(job.agrees(&want, &cpu).is_err(), "{}", info.label);
        }
    }

    #[test]
    fn quick_products_cross_the_kernels_tile_edges() {
        for p in matmul_products(CheckLevel::Quick) {
            let s = p.shape;
            assert!(s.m % 64 != 0 || s.n % 64 != 0, "{}", product_label(&p));
            assert!(s.k % 16 != 0, "{}", product_label(&p));
        }
        // One case has more tiles than the emulated device's 32 blocks.
        assert!(matmul_products(CheckLevel::Quick)
            .iter()
            .any(|p| p.shape.batch * p.shape.m.div_ceil(64) * p.shape.n.div_ceil(64) > 32));
        let computes: Vec<Compute> = matmul_products(CheckLevel::Quick)
            .iter()
            .map(|p| p.compute)
            .collect();
        assert_eq!(
            computes,
            [Compute::F32, Compute::Tf32, Compute::F16, Compute::Bf16]
        );
    }

    #[test]
    fn standard_cases_are_at_production_sizes() {
        let level = CheckLevel::Standard;
        let products = matmul_cases(level, SEED);
        let cubes: Vec<Compute> = products
            .iter()
            .filter(|(_, j)| {
                let s = j.shape;
                (s.batch, s.m, s.n, s.k) == (1, 4096, 4096, 4096)
            })
            .map(|(_, j)| j.compute)
            .collect();
        assert_eq!(
            cubes,
            [Compute::F32, Compute::Tf32, Compute::F16, Compute::Bf16]
        );
        let (info, job) = &products[0];
        assert_eq!(info.label, "4096³ f32");
        assert_eq!(info.flops, Some(2.0 * 4096f64.powi(3)));
        assert_eq!(info.bytes, Some(3.0 * 4.0 * 4096f64 * 4096.0));
        assert_eq!(
            info.compare.as_ref().expect("a compare")["compute"],
            json!("f32")
        );
        assert_eq!(job.size(), 4096 * 4096);
        assert!(products
            .iter()
            .any(|(_, j)| j.shape.batch > 1 && (j.shape.trans_a || j.shape.trans_b)));
        drop(products);
        let lookups = lookup_cases(level, SEED);
        let (info, job) = &lookups[0];
        assert_eq!((job.table.len() / job.dim, job.dim), (100_000, 512));
        assert_eq!(job.ids.len(), 65_536);
        assert_eq!(
            info.compare,
            Some(json!({"kind": "embedding", "rows": 100_000, "dim": 512, "ids": 65_536}))
        );
        let embeddings = sinusoidal_cases(level, SEED);
        assert!(embeddings.iter().all(|(_, j)| j.size() == 32_768 * 1024));
    }

    #[test]
    fn edge_values_are_in_every_operand_and_finite_in_their_precision() {
        let v = mixed(100_000, 1, 128.0, 2f32.powi(-20));
        assert!(v.contains(&0.0) && v.contains(&128.0) && v.contains(&-(2f32.powi(-20))));
        assert!(v.iter().any(|&x| x < 0.0) && v.iter().all(|x| x.abs() <= 128.0));
        // Same seed, same values, however the chunks were scheduled.
        assert_eq!(v, mixed(100_000, 1, 128.0, 2f32.powi(-20)));
        assert_eq!(thousands(65_536), "65 536");
        assert_eq!(thousands(300), "300");
        assert_eq!(thousands(100_000), "100 000");
    }
}
