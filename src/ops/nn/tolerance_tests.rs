//! Each nn op's tolerance is tight, not only sound: an f32 implementation a device could
//! run (each output summed in order in f32, as one thread of a direct kernel does) errs
//! by a good part of it on inputs that make every addition round the same way, and the
//! job's `agrees` still accepts that device. A tolerance grown loose by a factor of four
//! or more fails here, and so does one too tight for such a device.

use super::attention::{Attended, AttentionJob, AttentionShape, Tensors};
use super::conv2d::{Conv2dJob, Conv2dShape, ConvTensors};
use crate::backend::Job;
use crate::ops::linalg::{Dtype, Values};

/// The least share of its tolerance the in-order sum's worst error must reach.
const TIGHT: f64 = 0.25;

/// Terms of each sum: one of 1 (scaled), then `TERMS − 1` just over half an ulp of it.
const TERMS: usize = 512;

/// Just over half an ulp of 1 in f32: added to a sum in [1, 2), it rounds up a whole ulp.
fn nudge() -> f32 {
    2f32.powi(-24) * (1.0 + 2f32.powi(-10))
}

/// The worst |got − exact| / tolerance, with its index.
fn worst_share(got: &[f32], exact: &[f64], tol: &[f64]) -> (f64, usize) {
    (0..got.len())
        .map(|i| ((f64::from(got[i]) - exact[i]).abs() / tol[i], i))
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a })
}

/// Asserts the in-order device's error reaches TIGHT of the tolerance and stays within
/// it, and the CPU twin's stays within it too.
fn assert_tight(op: &str, in_order: &[f32], cpu: &[f32], exact: &[f64], tol: &[f64]) {
    let (share, i) = worst_share(in_order, exact, tol);
    assert!(
        (TIGHT..=1.0).contains(&share),
        "{op}: the in-order f32 sum errs by {share:.3} of the tolerance at {i} \
         ({} against {}, tolerance {:e})",
        in_order[i],
        exact[i],
        tol[i]
    );
    let (cpu_share, j) = worst_share(cpu, exact, tol);
    assert!(
        cpu_share <= 1.0,
        "{op}: the CPU twin errs by {cpu_share} of it at {j}"
    );
    eprintln!("{op}: in-order f32 error {share:.3} of the tolerance, CPU twin {cpu_share:.3}");
}

#[test]
fn conv2d_tolerance_is_within_a_small_factor_of_an_in_order_f32_sums_error() {
    // A 1×1 convolution over TERMS channels: each output sums channel 0's 1 and then the
    // nudges, every one of which rounds the f32 sum up.
    let pixels = 4;
    let shape = Conv2dShape {
        batch: 1,
        channels: TERMS,
        height: 2,
        width: 2,
        out_channels: 1,
        kernel_h: 1,
        kernel_w: 1,
        stride: (1, 1),
        padding: [0; 4],
        dilation: (1, 1),
        groups: 1,
    };
    let input: Vec<f32> = (0..TERMS)
        .flat_map(|c| std::iter::repeat_n(if c == 0 { 1.0 } else { nudge() }, pixels))
        .collect();
    let weight = vec![1.0f32; TERMS];
    let tensors = ConvTensors::F32 {
        input: input.clone(),
        weight: weight.clone(),
        bias: None,
    };
    let job = Conv2dJob::new(shape, tensors, false, Dtype::F32, Dtype::F32).unwrap();
    let term = |c: usize, px: usize| input[c * pixels + px] * weight[c];
    let in_order: Vec<f32> = (0..pixels)
        .map(|px| (0..TERMS).fold(0f32, |acc, c| acc + term(c, px)))
        .collect();
    // Exact in f64: 1 + 511 nudges needs 30 bits.
    let exact: Vec<f64> = (0..pixels)
        .map(|px| (0..TERMS).map(|c| f64::from(term(c, px))).sum())
        .collect();
    let Values::F32(cpu) = job.run_cpu() else {
        panic!("an f32 answer")
    };
    assert_tight("conv2d", &in_order, &cpu, &exact, &job.tolerance());
    job.agrees(&Values::F32(in_order.into()), &Values::F32(cpu))
        .expect("the check accepts the in-order device");
}

#[test]
fn attention_tolerance_is_within_a_small_factor_of_an_in_order_f32_sums_error() {
    // Q = 0: every logit is 0 and every weight 1/TERMS, so the output is the mean of V's
    // column, which the device sums in order (512, then the nudges at 512's scale, each
    // rounding up) and divides by the exact TERMS.
    let shape = AttentionShape {
        batch: 1,
        heads: 1,
        kv_heads: 1,
        queries: 1,
        keys: TERMS,
        head_dim: 8,
        value_dim: 1,
    };
    let scale = TERMS as f32;
    let v: Vec<f32> = (0..TERMS)
        .map(|j| if j == 0 { scale } else { nudge() * scale })
        .collect();
    let tensors = Tensors::F32 {
        q: vec![0.0; 8],
        k: (0..TERMS * 8).map(|i| (i % 5) as f32 - 2.0).collect(),
        v: v.clone(),
    };
    let job = AttentionJob::new(
        shape,
        tensors,
        1.0 / 8f64.sqrt(),
        false,
        None,
        Dtype::F32,
        Dtype::F32,
        false,
    )
    .unwrap();
    let in_order = vec![v.iter().fold(0f32, |acc, &x| acc + x) / TERMS as f32];
    let exact = vec![v.iter().map(|&x| f64::from(x)).sum::<f64>() / TERMS as f64];
    let cpu = job.run_cpu();
    let Values::F32(cpu_out) = &cpu.output else {
        panic!("an f32 answer")
    };
    let (tol, _) = job.tolerance();
    assert_tight("attention", &in_order, cpu_out, &exact, &tol);
    let device = Attended {
        output: Values::F32(in_order.into()),
        weights: None,
    };
    job.agrees(&device, &cpu)
        .expect("the check accepts the in-order device");
}

/// Where the tensor cores' kernel may run (f16 or bf16 in, no weights), the bound allows
/// for P rounded to the input dtype: a relative `u_in` of the weighted values. With
/// weights asked (attention_f32 runs) or f32 inputs it does not, so those stay tight.
#[test]
fn attention_allows_for_p_in_the_input_dtype_only_where_tensor_cores_may_run() {
    let shape = AttentionShape {
        batch: 1,
        heads: 1,
        kv_heads: 1,
        queries: 1,
        keys: 4,
        head_dim: 1,
        value_dim: 1,
    };
    // Equal logits: four weights of 1/4 on values of 1, so the output is 1.
    let tolerance = |input: Dtype, weights: bool| {
        let tensors = Tensors::F32 {
            q: vec![0.0],
            k: vec![0.0; 4],
            v: vec![1.0; 4],
        };
        let job = AttentionJob::new(shape, tensors, 1.0, false, None, input, Dtype::F32, weights)
            .unwrap();
        job.tolerance().0[0]
    };
    let f32_bound = tolerance(Dtype::F32, false);
    assert!(f32_bound < 2f64.powi(-18), "{f32_bound:e}");
    assert!(tolerance(Dtype::F16, true) < 2f64.powi(-18));
    for (input, u) in [(Dtype::F16, 2f64.powi(-11)), (Dtype::Bf16, 2f64.powi(-8))] {
        let bound = tolerance(input, false);
        assert!(
            (u..2.0 * u).contains(&bound),
            "{input:?}: {bound:e} against u = {u:e}"
        );
    }
}
