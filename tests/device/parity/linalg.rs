//! Matmul, sinusoidal embeddings and table lookups, within each job's stated tolerance
//! (lookups bit for bit).

use super::on_every_device;
use gpu_ops::ops::linalg::{
    Compute, Dtype, Layout, LookupJob, MatmulJob, MatmulShape, Operands, SinusoidalJob,
};

/// Matmul: tiles cut at every edge, more tiles than the grid (block-stride wraps), K across
/// several 16-deep slices and not a multiple of them, transposes, broadcast operands, C
/// with beta, each compute precision and output dtype; then a batch in passes under a
/// memory limit, the broadcast operand uploaded once.
#[test]
fn matmul_agrees_with_the_cpu() {
    let base = MatmulShape {
        batch: 1,
        m: 1,
        n: 1,
        k: 1,
        a_batched: false,
        b_batched: false,
        c_batched: false,
        trans_a: false,
        trans_b: false,
    };
    let values = |len: usize, salt: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 31 + salt * 7) as f32 * 0.377).sin() * (1 + (i + salt) % 5) as f32)
            .collect()
    };
    let job = |shape: MatmulShape, compute, output, with_c: bool| {
        let operands = Operands::F32 {
            a: values(shape.a_len(), 1).into(),
            b: values(shape.b_len(), 2).into(),
            c: with_c.then(|| values(shape.c_len(), 3).into()),
        };
        MatmulJob::new(shape, operands, 1.25, -0.5, compute, Dtype::F32, output).unwrap()
    };
    on_every_device("matmul_agrees_with_the_cpu", |d| {
        let shapes = d.sizes(
            &[
                MatmulShape {
                    m: 1000,
                    n: 1000,
                    k: 1000,
                    ..base
                },
                MatmulShape {
                    batch: 8,
                    m: 300,
                    n: 129,
                    k: 65,
                    a_batched: true,
                    trans_a: true,
                    ..base
                },
                MatmulShape {
                    batch: 3,
                    m: 63,
                    n: 257,
                    k: 1,
                    b_batched: true,
                    c_batched: true,
                    trans_b: true,
                    ..base
                },
            ],
            &[
                base,
                MatmulShape {
                    m: 65,
                    n: 63,
                    k: 40,
                    trans_a: true,
                    trans_b: true,
                    ..base
                },
                MatmulShape {
                    batch: 3,
                    m: 70,
                    n: 20,
                    k: 17,
                    b_batched: true,
                    c_batched: true,
                    ..base
                },
                MatmulShape {
                    batch: 5,
                    m: 130,
                    n: 129,
                    k: 33,
                    a_batched: true,
                    trans_b: true,
                    ..base
                },
            ],
        );
        for shape in shapes {
            for (compute, output, with_c) in [
                (Compute::F32, Dtype::F32, false),
                (Compute::Tf32, Dtype::F32, true),
                (Compute::F16, Dtype::F16, true),
                (Compute::Bf16, Dtype::Bf16, false),
            ] {
                let case = format!("{shape:?} {compute:?} {output:?} c={with_c}");
                d.check(case, &job(shape, compute, output, with_c));
            }
        }
        d.in_passes(64 << 10, |d| {
            let shape = MatmulShape {
                batch: 9,
                m: 40,
                n: 48,
                k: 56,
                a_batched: true,
                c_batched: true,
                ..base
            };
            d.check("in passes", &job(shape, Compute::F32, Dtype::F32, true));
        });
    });
}

/// Both layouts and every output dtype, past grid-stride wraps and in row passes under a
/// memory limit.
#[test]
fn sinusoidal_embeddings_agree_with_the_cpu() {
    on_every_device("sinusoidal_embeddings_agree_with_the_cpu", |d| {
        for (rows, dim) in d.sizes(
            &[(100_000usize, 512usize), (7, 65_536)],
            &[(300, 64), (5, 2)],
        ) {
            let positions: Vec<f64> = (0..rows).map(|i| ((i * 7919) % 100_003) as f64).collect();
            for layout in [Layout::Interleaved, Layout::Split] {
                for output in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
                    let job =
                        SinusoidalJob::new(&positions, dim, 10_000.0, 1.0, 0.5, layout, output)
                            .unwrap();
                    d.check(format!("{rows}×{dim} {layout:?} {output:?}"), &job);
                }
            }
        }
        d.in_passes(16 << 10, |d| {
            let positions: Vec<f64> = (0..500).map(f64::from).collect();
            let job = SinusoidalJob::new(
                &positions,
                32,
                10_000.0,
                1.0,
                0.0,
                Layout::Split,
                Dtype::F32,
            )
            .unwrap();
            d.check("in passes", &job);
        });
    });
}

/// Lookups equal the CPU's bit for bit, past grid-stride wraps and in passes under a
/// memory limit; the table is cached on the device after the first.
#[test]
fn lookups_equal_the_cpu_and_keep_their_table() {
    on_every_device("lookups_equal_the_cpu_and_keep_their_table", |d| {
        for (vocab, dim, n) in d.sizes(
            &[(50_000usize, 1024usize, 100_000usize)],
            &[(300, 48, 700), (5, 1, 9000)],
        ) {
            let table: Vec<f32> = (0..vocab * dim)
                .map(|i| ((i * 37 % 1001) as f32 - 500.0) / 7.0)
                .collect();
            let table = gpu_ops::wire::Array::from(table).shared();
            let ids: Vec<u32> = (0..n).map(|i| ((i * 7919) % vocab) as u32).collect();
            let key = format!("parity/{vocab}x{dim}");
            for output in [Dtype::F32, Dtype::F16] {
                let job =
                    LookupJob::new(key.clone(), table.clone(), dim, ids.clone(), output).unwrap();
                let case = format!("{vocab}×{dim}, {n} ids, {output:?}");
                d.check(&case, &job);
                if !d.device().holds_table(&key) {
                    d.fail(&case, "the table is not cached on the device");
                }
            }
            d.device().forget_table(&key);
            assert!(!d.device().holds_table(&key));
        }
        d.in_passes(4 << 10, |d| {
            let table =
                gpu_ops::wire::Array::from((0..64 * 16).map(|i| i as f32).collect::<Vec<_>>());
            let ids: Vec<u32> = (0..2000).map(|i| (i % 64) as u32).collect();
            let job = LookupJob::new("parity/passes".into(), table, 16, ids, Dtype::F32).unwrap();
            d.check("in passes", &job);
        });
    });
}
