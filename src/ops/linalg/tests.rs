//! The matmul twin against an f64 reference computed from the inputs as given, within the
//! error bound docs/TENSORS.md states, for every dtype, compute precision, transpose and
//! broadcast.

use super::*;
use crate::backend::Job;
use crate::ops::FieldPath;

use crate::ops::testing::spread_values as values;

fn in_dtype(v: &[f64], dtype: Dtype) -> Vec<f64> {
    v.iter()
        .map(|&x| match dtype {
            Dtype::F64 => x,
            d => f64::from(d.round(x as f32)),
        })
        .collect()
}

/// D in f64 from the inputs as given, and Σ|α·a·b| + |β·c| per value. The layouts are
/// spelled out here from the API's definition (A is m×k, or k×m stored when transposed;
/// B is k×n, or n×k; an unbatched operand is one matrix shared by every batch element),
/// not taken from `MatmulShape`'s strides, which `run_cpu` and the launchers use.
pub(crate) fn reference(
    s: &MatmulShape,
    a: &[f64],
    b: &[f64],
    c: Option<&[f64]>,
    alpha: f64,
    beta: f64,
) -> (Vec<f64>, Vec<f64>) {
    let (m, n, k) = (s.m, s.n, s.k);
    let a_at = |e: usize, i: usize, p: usize| {
        let matrix = if s.a_batched {
            &a[e * m * k..][..m * k]
        } else {
            &a[..m * k]
        };
        if s.trans_a {
            matrix[p * m + i]
        } else {
            matrix[i * k + p]
        }
    };
    let b_at = |e: usize, p: usize, j: usize| {
        let matrix = if s.b_batched {
            &b[e * k * n..][..k * n]
        } else {
            &b[..k * n]
        };
        if s.trans_b {
            matrix[j * k + p]
        } else {
            matrix[p * n + j]
        }
    };
    let c_at = |e: usize, i: usize, j: usize| {
        c.map_or(0.0, |c| {
            let matrix = if s.c_batched {
                &c[e * m * n..][..m * n]
            } else {
                &c[..m * n]
            };
            matrix[i * n + j]
        })
    };
    let mut d = vec![0.0; s.batch * m * n];
    let mut mag = vec![0.0; s.batch * m * n];
    for e in 0..s.batch {
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut abs) = (0.0, 0.0);
                for p in 0..k {
                    let xy = a_at(e, i, p) * b_at(e, p, j);
                    sum += xy;
                    abs += xy.abs();
                }
                let o = (e * m + i) * n + j;
                let cv = c_at(e, i, j);
                d[o] = alpha * sum + beta * cv;
                mag[o] = (alpha * abs).abs() + (beta * cv).abs();
            }
        }
    }
    (d, mag)
}

/// `x` rounded once from f64 to `output`, by the `half` crate (not `Dtype`'s rounding).
pub(crate) fn rounded(x: f64, output: Dtype) -> f64 {
    match output {
        Dtype::F16 => half::f16::from_f64(x).to_f64(),
        Dtype::Bf16 => half::bf16::from_f64(x).to_f64(),
        Dtype::F32 => f64::from(x as f32),
        Dtype::F64 => x,
    }
}

/// The job's CPU answer is finite and, by the job's own `agrees`, the naive product of
/// its operands (as the job holds them: rounded to the compute type) rounded once to the
/// output dtype; and `agrees` refuses that product with one value made wrong. For the
/// check's and the self-tests' cases: each must tell a right device from a wrong one.
pub(crate) fn holds_to_the_naive_product(job: &MatmulJob, label: &str) {
    let Operands::F32 { a, b, c } = &job.operands else {
        panic!("{label}: f32 operands expected");
    };
    let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let c = c.as_deref().map(wide);
    let (d, _) = reference(
        &job.shape,
        &wide(a),
        &wide(b),
        c.as_deref(),
        job.alpha,
        job.beta,
    );
    let mut want: Vec<f32> = d.iter().map(|&x| rounded(x, job.output) as f32).collect();
    let cpu = job.run_cpu();
    assert_eq!(cpu.first_non_finite(), None, "{label}");
    job.agrees(&Values::F32(want.clone().into()), &cpu)
        .expect(label);
    // Off by three tolerances and one (a tolerance may be large where |A|·|B| is).
    let i = want.len() / 2;
    want[i] += (3.0 * job.tolerance()[i] + 1.0) as f32;
    assert!(
        job.agrees(&Values::F32(want.into()), &cpu).is_err(),
        "{label}: a wrong value is accepted"
    );
}

fn shapes() -> Vec<MatmulShape> {
    let base = MatmulShape {
        batch: 1,
        m: 3,
        n: 4,
        k: 1,
        a_batched: false,
        b_batched: false,
        c_batched: false,
        trans_a: false,
        trans_b: false,
    };
    vec![
        base,
        MatmulShape {
            m: 9,
            n: 5,
            k: 300,
            trans_a: true,
            ..base
        },
        MatmulShape {
            batch: 3,
            m: 7,
            n: 6,
            k: 33,
            a_batched: true,
            trans_b: true,
            ..base
        },
        MatmulShape {
            batch: 2,
            m: 5,
            n: 70,
            k: 17,
            b_batched: true,
            c_batched: true,
            trans_a: true,
            trans_b: true,
            ..base
        },
    ]
}

#[test]
fn matmul_is_within_the_stated_bound_of_an_f64_reference() {
    let cases = [
        (Dtype::F32, Compute::F32, Dtype::F32),
        (Dtype::F32, Compute::Tf32, Dtype::F32),
        (Dtype::F32, Compute::F16, Dtype::F16),
        (Dtype::F32, Compute::Bf16, Dtype::Bf16),
        (Dtype::F16, Compute::F32, Dtype::F16),
        (Dtype::F16, Compute::F16, Dtype::F32),
        (Dtype::Bf16, Compute::Bf16, Dtype::Bf16),
        (Dtype::Bf16, Compute::F16, Dtype::F32),
        (Dtype::F64, Compute::F64, Dtype::F64),
    ];
    for (si, s) in shapes().into_iter().enumerate() {
        for (input, compute, output) in cases {
            for with_c in [false, true] {
                let a = in_dtype(&values(s.a_len(), 1 + si as u64), input);
                let b = in_dtype(&values(s.b_len(), 2 + si as u64), input);
                let c = with_c.then(|| in_dtype(&values(s.c_len(), 3), input));
                // alpha and beta not representable in f32: their rounding is in the bound.
                let (alpha, beta) = (0.1, if with_c { -1.3 } else { 1.0 });
                let operands = if input == Dtype::F64 {
                    Operands::F64 {
                        a: a.clone(),
                        b: b.clone(),
                        c: c.clone(),
                    }
                } else {
                    let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
                    Operands::F32 {
                        a: f(&a).into(),
                        b: f(&b).into(),
                        c: c.as_deref().map(f).map(Into::into),
                    }
                };
                let job = MatmulJob::new(s, operands, alpha, beta, compute, input, output)
                    .expect("a valid job");
                let got: Vec<f64> = match job.run_cpu() {
                    Values::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
                    Values::F64(v) => v,
                };
                let (want, mag) = reference(&s, &a, &b, c.as_deref(), alpha, beta);
                let uc = compute.operand_roundoff(input);
                let u = if input == Dtype::F64 {
                    Dtype::F64
                } else {
                    Dtype::F32
                }
                .unit_roundoff();
                let kk = (s.k + 3) as f64;
                let gamma = kk * u / (1.0 - kk * u);
                let uo = output.unit_roundoff();
                for o in 0..want.len() {
                    let sums = (2.0 * uc + uc * uc + gamma * (1.0 + uc).powi(2)) * mag[o];
                    let bound = sums * (1.0 + uo) + uo * want[o].abs();
                    assert!(
                        (got[o] - want[o]).abs() <= bound,
                        "{s:?} {input:?}/{compute:?}/{output:?} c={with_c} value {o}: {} vs {} (bound {bound:e})",
                        got[o],
                        want[o]
                    );
                }
            }
        }
    }
}

#[test]
fn the_bound_is_not_vacuous() {
    // Operands rounded to bf16 lose bits: a product of values that bf16 cannot hold is
    // off by more than f32's bound, and within bf16's.
    let s = MatmulShape {
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
    let x = 1.0 + 2f32.powi(-12);
    let job = |compute| {
        MatmulJob::new(
            s,
            Operands::F32 {
                a: vec![x].into(),
                b: vec![x].into(),
                c: None,
            },
            1.0,
            1.0,
            compute,
            Dtype::F32,
            Dtype::F32,
        )
        .unwrap()
        .run_cpu()
    };
    assert_eq!(job(Compute::Bf16), Values::F32(vec![1.0].into()));
    assert_eq!(job(Compute::F32), Values::F32(vec![x * x].into()));
}

#[test]
fn shapes_dtypes_and_overflow_are_refused_with_their_field() {
    let s = shapes()[0];
    let ok = |a: usize| Operands::F32 {
        a: vec![1.0; a].into(),
        b: vec![1.0; s.b_len()].into(),
        c: None,
    };
    let e = MatmulJob::new(s, ok(2), 1.0, 1.0, Compute::F32, Dtype::F32, Dtype::F32).unwrap_err();
    assert_eq!(e.path, FieldPath::root().field("a"));
    let e = MatmulJob::new(s, ok(3), 1.0, 1.0, Compute::F64, Dtype::F32, Dtype::F32).unwrap_err();
    assert_eq!(e.path, FieldPath::root().field("compute"));
    let big = Operands::F32 {
        a: vec![1e6; 3].into(),
        b: vec![1.0; s.b_len()].into(),
        c: None,
    };
    let e = MatmulJob::new(s, big, 1.0, 1.0, Compute::F16, Dtype::F32, Dtype::F32).unwrap_err();
    assert!(e.message.contains("overflows f16"), "{}", e.message);
    // f16 out of a product beyond 65504: the twin gives inf, which the API refuses.
    let wide = Operands::F32 {
        a: vec![300.0; 3].into(),
        b: vec![300.0; s.b_len()].into(),
        c: None,
    };
    let job = MatmulJob::new(s, wide, 1.0, 1.0, Compute::F32, Dtype::F32, Dtype::F16).unwrap();
    assert_eq!(job.run_cpu().first_non_finite(), Some(0));
}

#[test]
fn sinusoidal_embeddings_are_the_closed_form_rounded_once() {
    let positions = [0.0, 1.0, 7.0, 1000.0, 65_535.0, 4_000_000_000.0];
    let (dim, base, scale, offset) = (12usize, 10_000.0f64, 0.5, 2.0);
    for layout in [Layout::Interleaved, Layout::Split] {
        for output in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            let job =
                SinusoidalJob::new(&positions, dim, base, scale, offset, layout, output).unwrap();
            let got = job.run_cpu();
            assert_eq!(got.len(), positions.len() * dim);
            for (j, &p) in positions.iter().enumerate() {
                for i in 0..dim / 2 {
                    let angle = (p + offset) * scale / base.powf(2.0 * i as f64 / dim as f64);
                    let (si, ci) = match layout {
                        Layout::Interleaved => (2 * i, 2 * i + 1),
                        Layout::Split => (i, dim / 2 + i),
                    };
                    for (slot, want) in [(si, angle.sin()), (ci, angle.cos())] {
                        let v = got[j * dim + slot];
                        // Half an ulp of the dtype, plus f64's error in a large angle.
                        let tol = output.unit_roundoff() * want.abs() + 1e-15 * angle.abs();
                        assert!(
                            (v - want).abs() <= tol,
                            "{layout:?} {output:?} p={p} i={i}: {v} vs {want}"
                        );
                    }
                }
            }
        }
    }
    // Position 0: sin 0 = 0, cos 0 = 1 in every pair.
    let job = SinusoidalJob::new(
        &[0.0],
        4,
        10_000.0,
        1.0,
        0.0,
        Layout::Interleaved,
        Dtype::F16,
    )
    .unwrap();
    assert_eq!(job.run_cpu(), [0.0, 1.0, 0.0, 1.0]);
}

#[test]
fn sinusoidal_parameters_are_refused_with_their_field() {
    let new = |dim, base, scale, offset, p: &[f64]| {
        SinusoidalJob::new(p, dim, base, scale, offset, Layout::Split, Dtype::F32).unwrap_err()
    };
    assert_eq!(
        new(3, 1e4, 1.0, 0.0, &[1.0]).path,
        FieldPath::root().field("dim")
    );
    assert_eq!(
        new(4, 1.0, 1.0, 0.0, &[1.0]).path,
        FieldPath::root().field("base")
    );
    assert_eq!(
        new(4, 1e4, 0.0, 0.0, &[1.0]).path,
        FieldPath::root().field("scale")
    );
    assert_eq!(
        new(4, 1e4, 1e10, 0.0, &[1.0, 1e6]).path,
        FieldPath::root().field("positions").index(1)
    );
}

/// A bulk request's f32 operands (`wire::Array`, lent from the body) are not copied when
/// the compute precision is f32, and copied once, then rounded, when it is not; the
/// body's bytes are never written.
#[test]
fn f32_operands_stay_lent_unless_the_compute_precision_rounds_them() {
    let s = shapes()[0];
    let lent = |n: usize| {
        let bytes: Vec<u8> = (0..n)
            .flat_map(|i| (1.0 + i as f32 * 2f32.powi(-20)).to_le_bytes())
            .collect();
        crate::wire::Array::<f32>::from_le_bytes(bytes::Bytes::from(bytes)).unwrap()
    };
    let (a, b) = (lent(s.a_len()), lent(s.b_len()));
    assert!(a.is_lent() && b.is_lent());
    let job = |compute, a: &crate::wire::Array<f32>, b: &crate::wire::Array<f32>| {
        let operands = Operands::F32 {
            a: a.clone(),
            b: b.clone(),
            c: None,
        };
        MatmulJob::new(s, operands, 1.0, 1.0, compute, Dtype::F32, Dtype::F32).unwrap()
    };
    let f32_job = job(Compute::F32, &a, &b);
    let Operands::F32 { a: ja, b: jb, .. } = &f32_job.operands else {
        unreachable!()
    };
    assert!(
        ja.is_lent() && jb.is_lent(),
        "f32 compute reads them in place"
    );
    let bf16_job = job(Compute::Bf16, &a, &b);
    let Operands::F32 { a: ra, .. } = &bf16_job.operands else {
        unreachable!()
    };
    assert!(!ra.is_lent(), "rounding works on a copy");
    assert_ne!(**ra, *a, "the copy is rounded");
    assert_eq!(a[1], 1.0 + 2f32.powi(-20), "the body's bytes are untouched");
}
