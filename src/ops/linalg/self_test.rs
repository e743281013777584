//! The linalg ops' self-tests: products across the kernel's tile edges, transposed and
//! broadcast operands, C with β, and each compute precision and output dtype; sinusoidal
//! embeddings in both layouts past one grid stride, with large and fractional positions;
//! table lookups.

use super::{run_matmul_on, MatmulProvider};
use super::{Compute, Dtype, Layout, LookupJob, MatmulJob, MatmulShape, Operands, SinusoidalJob};
use crate::backend::cuda::blaslt::MATMUL_BLASLT_OP;
use crate::backend::verify::{JobCheck, LibraryCheck, SelfTest};

/// Values of mixed sign and magnitude (within f16's normal range), zeros among them.
fn values(len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let x = ((i * 7 + salt) as f32 * 0.618).sin();
            if (i + salt) % 13 == 0 {
                0.0
            } else {
                x * [1.0, 3.5, 0.02, 40.0][(i + salt) % 4]
            }
        })
        .collect()
}

/// The matmul cases: across the kernel's tile edges, transposed and broadcast operands,
/// C with β, each compute precision and output dtype.
fn matmul_jobs() -> Vec<MatmulJob> {
    let plain = MatmulShape {
        batch: 2,
        m: 70,
        n: 65,
        k: 33,
        a_batched: true,
        b_batched: false,
        c_batched: false,
        trans_a: false,
        trans_b: true,
    };
    let transposed = MatmulShape {
        batch: 3,
        m: 5,
        n: 130,
        k: 17,
        a_batched: false,
        b_batched: true,
        c_batched: true,
        trans_a: true,
        trans_b: false,
    };
    let single = MatmulShape {
        batch: 1,
        m: 129,
        n: 67,
        k: 300,
        a_batched: false,
        b_batched: false,
        c_batched: false,
        trans_a: true,
        trans_b: true,
    };
    let cases = [
        (plain, Compute::F32, Dtype::F32, false),
        (plain, Compute::Tf32, Dtype::F16, true),
        (transposed, Compute::Bf16, Dtype::Bf16, true),
        (transposed, Compute::F16, Dtype::F32, false),
        (single, Compute::F32, Dtype::F32, true),
    ];
    cases
        .into_iter()
        .map(|(shape, compute, output, with_c)| {
            let operands = Operands::F32 {
                a: values(shape.a_len(), 1).into(),
                b: values(shape.b_len(), 2).into(),
                c: with_c.then(|| values(shape.c_len(), 3).into()),
            };
            MatmulJob::new(shape, operands, 0.75, -1.5, compute, Dtype::F32, output)
                .expect("a valid self-test product")
        })
        .collect()
}

pub(crate) fn self_tests() -> Vec<Box<dyn SelfTest>> {
    let jobs = matmul_jobs();
    let positions: Vec<f64> = (0..300).map(|i| (i * i) as f64 * 37.5).collect();
    let embeddings = [
        (Layout::Interleaved, Dtype::F32),
        (Layout::Split, Dtype::F16),
    ]
    .into_iter()
    .map(|(layout, output)| {
        SinusoidalJob::new(&positions, 64, 10_000.0, 0.5, 3.0, layout, output)
            .expect("a valid self-test embedding")
    })
    .collect();
    // Lookups past one grid stride, repeated and extreme ids, both output roundings; the
    // table under a key of its own, so a self-test never meets a caller's table.
    let table = crate::wire::Array::from(values(97 * 40, 4)).shared();
    let ids: Vec<u32> = (0..9000u32)
        .map(|i| (i * 31 + i / 7) % 97)
        .chain([0, 96, 96])
        .collect();
    let lookups = [Dtype::F32, Dtype::Bf16]
        .into_iter()
        .map(|output| {
            LookupJob::new(
                "self-test/embeddings".into(),
                table.clone(),
                40,
                ids.clone(),
                output,
            )
            .expect("ids within the table")
        })
        .collect();
    vec![
        JobCheck::boxed(jobs),
        JobCheck::boxed(embeddings),
        JobCheck::boxed(lookups),
    ]
}

/// cuBLASLt's self-test: every matmul case, and shapes that stress the layout mapping
/// (no transposes, m, n or k of 1, a single entry with C), forced through cuBLASLt and
/// held to the CPU twin. `ops::self_tests` runs it last, so the kernels' own self-tests
/// (matmul, conv2d) run on our kernel, before cuBLASLt may take their products.
pub(crate) fn blaslt_check() -> Box<dyn SelfTest> {
    Box::new(LibraryCheck {
        op: MATMUL_BLASLT_OP,
        serves: &["matmul", "conv2d"],
        jobs: blaslt_jobs(),
        opened: |dev| dev.has_blaslt(),
        run: |job, dev| run_matmul_on(job, dev, MatmulProvider::BlasLt),
        infos: Vec::new(),
    })
}

/// cuBLASLt's cases: the layout-mapping shapes, then every matmul case.
fn blaslt_jobs() -> Vec<MatmulJob> {
    let shape = |batch, m, n, k, trans_a, trans_b, c_batched| MatmulShape {
        batch,
        m,
        n,
        k,
        a_batched: batch > 1,
        b_batched: false,
        c_batched,
        trans_a,
        trans_b,
    };
    let cases = [
        (shape(2, 70, 65, 33, false, false, true), Compute::F32, true),
        (shape(1, 1, 40, 9, false, true, false), Compute::F32, true),
        (shape(3, 17, 1, 5, true, false, false), Compute::Tf32, false),
        (shape(2, 8, 12, 1, true, true, false), Compute::F16, false),
        (
            shape(1, 33, 31, 64, false, false, false),
            Compute::Bf16,
            true,
        ),
    ];
    let mut jobs: Vec<MatmulJob> = cases
        .into_iter()
        .map(|(shape, compute, with_c)| {
            let operands = Operands::F32 {
                a: values(shape.a_len(), 5).into(),
                b: values(shape.b_len(), 6).into(),
                c: with_c.then(|| values(shape.c_len(), 7).into()),
            };
            MatmulJob::new(shape, operands, 1.25, 0.5, compute, Dtype::F32, Dtype::F32)
                .expect("a valid self-test product")
        })
        .collect();
    jobs.extend(matmul_jobs());
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cublaslt_cases_agree_with_a_naive_product_and_refuse_a_wrong_one() {
        let check = blaslt_check();
        assert_eq!(check.op(), MATMUL_BLASLT_OP);
        // Building them checked every shape; each case's CPU answer must also be the
        // naive product's, by the job's own `agrees`, which must refuse a wrong value.
        for (i, job) in blaslt_jobs().iter().enumerate() {
            crate::ops::linalg::tests::holds_to_the_naive_product(job, &format!("case {i}"));
        }
    }
}
