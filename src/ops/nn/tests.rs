//! The fused attention twin against a naive f64 reference that materialises every
//! softmax, within the bound `AttentionJob::tolerance` states: grouped heads, causal masks
//! with fewer and more queries than keys, padded and empty sequences, each dtype, large
//! logits, and the weights.

use super::*;
use crate::backend::Job;
use crate::ops::linalg::{Dtype, Values};
use crate::ops::FieldPath;

fn at(name: &'static str) -> FieldPath {
    FieldPath::root().field(name)
}

use crate::ops::testing::spread_values as values;

fn shape(
    (batch, heads, kv_heads): (usize, usize, usize),
    (queries, keys): (usize, usize),
    (head_dim, value_dim): (usize, usize),
) -> AttentionShape {
    AttentionShape {
        batch,
        heads,
        kv_heads,
        queries,
        keys,
        head_dim,
        value_dim,
    }
}

/// Output and weights in f64, every softmax materialised, from the inputs as given.
fn reference(
    s: &AttentionShape,
    (q, k, v): (&[f64], &[f64], &[f64]),
    scale: f64,
    causal: bool,
    lengths: &[usize],
) -> (Vec<f64>, Vec<f64>) {
    let (d, dv) = (s.head_dim, s.value_dim);
    let mut out = vec![0.0; s.out_len()];
    let mut weights = vec![0.0; s.weights_len()];
    for row in 0..s.rows() {
        let (bh, i) = (row / s.queries, row % s.queries);
        let (b, h) = (bh / s.heads, bh % s.heads);
        let g = b * s.kv_heads + h / (s.heads / s.kv_heads);
        // The mask as docs/TENSORS.md states it, written apart from the job's.
        let len = lengths[b];
        let end = (0..len)
            .filter(|&j| !causal || j + s.queries <= i + len)
            .count();
        let logits: Vec<f64> = (0..end)
            .map(|j| {
                let dot: f64 = (0..d)
                    .map(|c| q[row * d + c] * k[(g * s.keys + j) * d + c])
                    .sum();
                scale * dot
            })
            .collect();
        let top = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = logits.iter().map(|l| (l - top).exp()).collect();
        let sum: f64 = p.iter().sum();
        for (j, pj) in p.iter().enumerate() {
            weights[row * s.keys + j] = pj / sum;
            for c in 0..dv {
                out[row * dv + c] += pj / sum * v[(g * s.keys + j) * dv + c];
            }
        }
    }
    (out, weights)
}

/// The job's CPU answer is finite and, by the job's own `agrees`, the naive reference's
/// (rounded once to the output dtype by the `half` crate); and `agrees` refuses that
/// answer with one output value made wrong. For the check's cases: each must tell a
/// right device from a wrong one.
pub(crate) fn holds_to_the_reference(job: &AttentionJob, label: &str) {
    let Tensors::F32 { q, k, v } = &job.tensors else {
        panic!("{label}: f32 tensors expected");
    };
    let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let (out, weights) = reference(
        &job.shape,
        (&wide(q), &wide(k), &wide(v)),
        job.scale,
        job.causal,
        &job.key_lengths,
    );
    let narrow = |v: &[f64]| -> Values {
        let once = crate::ops::linalg::tests::rounded;
        Values::F32(
            v.iter()
                .map(|&x| once(x, job.output) as f32)
                .collect::<Vec<_>>()
                .into(),
        )
    };
    let mut want = Attended {
        output: narrow(&out),
        weights: job.weights.then(|| narrow(&weights)),
    };
    let cpu = job.run_cpu();
    assert_eq!(cpu.output.first_non_finite(), None, "{label}");
    job.agrees(&want, &cpu).expect(label);
    let Values::F32(values) = &want.output else {
        unreachable!()
    };
    let mut wrong = values.to_vec();
    // Off by three tolerances and one.
    let i = wrong.len() / 2;
    wrong[i] += (3.0 * job.tolerance().0[i] + 1.0) as f32;
    want.output = Values::F32(wrong.into());
    assert!(
        job.agrees(&want, &cpu).is_err(),
        "{label}: a wrong value is accepted"
    );
}

fn rounded(v: &[f64], dtype: Dtype) -> Vec<f64> {
    v.iter().map(|&x| dtype.round_f64(x)).collect()
}

fn as_f64(v: &Values) -> Vec<f64> {
    match v {
        Values::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
        Values::F64(v) => v.clone(),
    }
}

struct Case {
    shape: AttentionShape,
    causal: bool,
    lengths: Option<Vec<usize>>,
    input: Dtype,
    output: Dtype,
    /// Multiplies Q (large logits).
    gain: f64,
}

/// Runs the twin and checks it against the reference within the job's tolerance;
/// returns the twin's output and weights.
fn check(case: Case) -> (Vec<f64>, Vec<f64>) {
    let s = case.shape;
    let q: Vec<f64> = rounded(
        &values(s.q_len(), 1)
            .iter()
            .map(|x| x * case.gain)
            .collect::<Vec<_>>(),
        case.input,
    );
    let k = rounded(&values(s.k_len(), 2), case.input);
    let v = rounded(&values(s.v_len(), 3), case.input);
    let tensors = if case.input == Dtype::F64 {
        Tensors::F64 {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
        }
    } else {
        let narrow = |x: &[f64]| x.iter().map(|&x| x as f32).collect();
        Tensors::F32 {
            q: narrow(&q),
            k: narrow(&k),
            v: narrow(&v),
        }
    };
    let scale = 1.0 / (s.head_dim as f64).sqrt();
    let job = AttentionJob::new(
        s,
        tensors,
        scale,
        case.causal,
        case.lengths.clone(),
        case.input,
        case.output,
        true,
    )
    .expect("a valid job");
    let got = job.run_cpu();
    let (out, w) = (
        as_f64(&got.output),
        as_f64(got.weights.as_ref().expect("weights")),
    );
    let (want_out, want_w) = reference(&s, (&q, &k, &v), scale, case.causal, &job.key_lengths);
    let (out_tol, w_tol) = job.tolerance();
    let w_tol = w_tol.expect("weights asked for");
    let (step, _) = case.output.subnormal_step_and_max();
    for (i, ((x, y), t)) in out.iter().zip(&want_out).zip(&out_tol).enumerate() {
        assert!(x.is_finite(), "output {i} is {x}");
        // One side only against the exact answer: half the two-sided tolerance would do;
        // the rounding of the reference itself to the output dtype adds its half ulp.
        assert!(
            (x - y).abs() <= t + step,
            "output {i}: {x} against {y} (tolerance {t:e}) in {:?}",
            s
        );
    }
    for (i, ((x, y), t)) in w.iter().zip(&want_w).zip(&w_tol).enumerate() {
        assert!(
            (x - y).abs() <= t + step,
            "weight {i}: {x} against {y} (tolerance {t:e})"
        );
    }
    (out, w)
}

#[test]
fn fused_attention_matches_the_f64_reference_across_masks_and_heads() {
    for (shape, causal, lengths) in [
        (
            shape((2, 4, 2), (19, 75), (32, 24)),
            true,
            Some(vec![75, 40]),
        ),
        (shape((1, 3, 1), (130, 130), (16, 16)), true, None),
        // More queries than keys: the first rows see nothing under the causal mask.
        (shape((1, 2, 2), (70, 20), (8, 12)), true, None),
        (
            shape((3, 2, 1), (1, 300), (64, 64)),
            false,
            Some(vec![300, 1, 129]),
        ),
        (shape((1, 1, 1), (65, 129), (5, 7)), false, None),
    ] {
        check(Case {
            shape,
            causal,
            lengths,
            input: Dtype::F32,
            output: Dtype::F32,
            gain: 1.0,
        });
    }
}

#[test]
fn each_dtype_is_within_its_bound() {
    let s = shape((2, 2, 1), (33, 50), (24, 16));
    for (input, output) in [
        (Dtype::F16, Dtype::F16),
        (Dtype::Bf16, Dtype::Bf16),
        (Dtype::F32, Dtype::F16),
        (Dtype::F64, Dtype::F64),
    ] {
        check(Case {
            shape: s,
            causal: true,
            lengths: None,
            input,
            output,
            gain: 1.0,
        });
    }
}

#[test]
fn rows_that_see_no_key_are_zero_and_so_are_their_weights() {
    let s = shape((2, 1, 1), (6, 4), (4, 3));
    let (out, w) = check(Case {
        shape: s,
        causal: true,
        lengths: Some(vec![0, 4]),
        input: Dtype::F32,
        output: Dtype::F32,
        gain: 1.0,
    });
    // Sequence 0 has no keys; in sequence 1 the first two of six queries see none.
    assert!(out[..6 * 3].iter().all(|&x| x == 0.0));
    assert!(out[6 * 3..8 * 3].iter().all(|&x| x == 0.0));
    assert!(out[8 * 3..].iter().all(|&x| x != 0.0));
    assert!(w[..8 * 4].iter().all(|&x| x == 0.0));
    for row in w[8 * 4..].chunks(4) {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-6);
    }
}

#[test]
fn large_logits_neither_overflow_nor_lose_the_winner() {
    // Logits in the millions: every exp would overflow without the running max.
    let s = shape((1, 2, 1), (17, 90), (16, 8));
    let (out, w) = check(Case {
        shape: s,
        causal: false,
        lengths: None,
        input: Dtype::F32,
        output: Dtype::F32,
        gain: 1e5,
    });
    assert!(out.iter().chain(&w).all(|x| x.is_finite()));
    // Each row's weight is all on its largest logit.
    for row in w.chunks(90) {
        let top = row.iter().copied().fold(0.0, f64::max);
        assert!(top > 0.999, "a row's largest weight is {top}");
    }
}

#[test]
fn the_job_refuses_what_it_cannot_do_with_the_field_at_fault() {
    let s = shape((2, 3, 2), (4, 4), (8, 8));
    let tensors = |s: &AttentionShape, gain: f32| Tensors::F32 {
        q: vec![gain; s.q_len()],
        k: vec![1.0; s.k_len()],
        v: vec![1.0; s.v_len()],
    };
    let make = |s: AttentionShape, lengths: Option<Vec<usize>>, scale: f64, gain: f32| {
        AttentionJob::new(
            s,
            tensors(&s, gain),
            scale,
            false,
            lengths,
            Dtype::F32,
            Dtype::F32,
            false,
        )
        .map(|_| ())
        .map_err(|e| e.path)
    };
    assert_eq!(make(s, None, 1.0, 1.0), Err(at("k")));
    let s = shape((2, 4, 2), (4, 4), (8, 8));
    assert_eq!(make(s, None, 1.0, 1.0), Ok(()));
    assert_eq!(make(s, Some(vec![4]), 1.0, 1.0), Err(at("key_lengths")));
    assert_eq!(
        make(s, Some(vec![4, 5]), 1.0, 1.0),
        Err(at("key_lengths").index(1))
    );
    assert_eq!(make(s, None, 1e-40, 1.0), Err(at("scale")));
    assert_eq!(make(s, None, 1.0, 1e37), Err(at("q")));
    // A small scale does not make the unscaled dot product safe: it is summed first.
    assert_eq!(make(s, None, 1e-20, 1e37), Err(at("q")));
    let huge_values = AttentionJob::new(
        s,
        Tensors::F32 {
            q: vec![1.0; s.q_len()],
            k: vec![1.0; s.k_len()],
            v: vec![1e38; s.v_len()],
        },
        1.0,
        false,
        None,
        Dtype::F32,
        Dtype::F32,
        false,
    );
    assert_eq!(huge_values.map(|_| ()).map_err(|e| e.path), Err(at("v")));
    let wide = shape((1, 1, 1), (1, 1), (257, 8));
    assert_eq!(make(wide, None, 1.0, 1.0), Err(at("q")));
}

#[test]
fn the_device_key_tile_fits_shared_memory_for_every_head_dimension() {
    for d in [1, 8, 64, 100, 128, 200, 256] {
        for dv in [1, 64, 256] {
            let tile = attention_key_tile(d, dv);
            assert!(super::gpu::attention_shared_bytes(d, dv, tile) <= 48 * 1024);
        }
    }
    assert_eq!(attention_key_tile(64, 64), 64);
    assert_eq!(attention_key_tile(256, 256), 8);
}
