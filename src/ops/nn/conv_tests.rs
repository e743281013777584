//! The conv2d twin against a naive f64 reference (seven loops, no lowering), within the
//! bound `Conv2dJob::tolerance` states: groups (depthwise among them), strides, dilation,
//! uneven and odd padding, bias and ReLU, each dtype.

use super::*;
use crate::backend::Job;
use crate::ops::linalg::{Dtype, Values};
use crate::ops::FieldPath;

use crate::ops::testing::spread_values as values;

/// The convolution as its definition reads, in f64.
fn reference(s: &Conv2dShape, x: &[f64], w: &[f64], bias: Option<&[f64]>, relu: bool) -> Vec<f64> {
    let (oh_n, ow_n) = s.out_size().unwrap();
    let (cg, og) = (s.channels / s.groups, s.out_channels / s.groups);
    let mut out = Vec::with_capacity(s.out_len());
    for n in 0..s.batch {
        for o in 0..s.out_channels {
            let g = o / og;
            for oh in 0..oh_n {
                for ow in 0..ow_n {
                    let mut acc = bias.map_or(0.0, |b| b[o]);
                    for c in 0..cg {
                        for i in 0..s.kernel_h {
                            for j in 0..s.kernel_w {
                                let y = (oh * s.stride.0 + i * s.dilation.0) as i64
                                    - s.padding[0] as i64;
                                let xx = (ow * s.stride.1 + j * s.dilation.1) as i64
                                    - s.padding[2] as i64;
                                if y < 0 || xx < 0 || y >= s.height as i64 || xx >= s.width as i64 {
                                    continue;
                                }
                                let input = x[((n * s.channels + g * cg + c) * s.height
                                    + y as usize)
                                    * s.width
                                    + xx as usize];
                                let weight = w[((o * cg + c) * s.kernel_h + i) * s.kernel_w + j];
                                acc += input * weight;
                            }
                        }
                    }
                    out.push(if relu { acc.max(0.0) } else { acc });
                }
            }
        }
    }
    out
}

/// The job's CPU answer is finite and, by the job's own `agrees`, the naive reference's
/// (rounded once to the output dtype by the `half` crate); and `agrees` refuses it with
/// one value made wrong. For the check's cases.
pub(crate) fn holds_to_the_reference(job: &Conv2dJob, label: &str) {
    let ConvTensors::F32 {
        input,
        weight,
        bias,
    } = &job.tensors
    else {
        panic!("{label}: f32 tensors expected");
    };
    let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let bias = bias.as_deref().map(wide);
    let exact = reference(
        &job.shape,
        &wide(input),
        &wide(weight),
        bias.as_deref(),
        job.relu,
    );
    let once = crate::ops::linalg::tests::rounded;
    let mut want: Vec<f32> = exact.iter().map(|&x| once(x, job.output) as f32).collect();
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

fn shape(
    (batch, channels, height, width): (usize, usize, usize, usize),
    (out_channels, kernel_h, kernel_w, groups): (usize, usize, usize, usize),
    stride: (usize, usize),
    padding: [usize; 4],
    dilation: (usize, usize),
) -> Conv2dShape {
    Conv2dShape {
        batch,
        channels,
        height,
        width,
        out_channels,
        kernel_h,
        kernel_w,
        stride,
        padding,
        dilation,
        groups,
    }
}

fn check(s: Conv2dShape, with_bias: bool, relu: bool, input: Dtype, output: Dtype) {
    let rounded = |v: Vec<f64>| {
        v.into_iter()
            .map(|x| input.round_f64(x))
            .collect::<Vec<_>>()
    };
    let x = rounded(values(s.input_len(), 1));
    let w = rounded(values(s.weight_len(), 2));
    let b = with_bias.then(|| rounded(values(s.out_channels, 3)));
    let tensors = if input == Dtype::F64 {
        ConvTensors::F64 {
            input: x.clone(),
            weight: w.clone(),
            bias: b.clone(),
        }
    } else {
        let narrow = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        ConvTensors::F32 {
            input: narrow(&x),
            weight: narrow(&w),
            bias: b.as_deref().map(narrow),
        }
    };
    let job = Conv2dJob::new(s, tensors, relu, input, output).expect("a valid job");
    let got = match job.run_cpu() {
        Values::F32(v) => v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(),
        Values::F64(v) => v,
    };
    let want = reference(&s, &x, &w, b.as_deref(), relu);
    assert_eq!(got.len(), want.len());
    let tol = job.tolerance();
    let (step, _) = output.subnormal_step_and_max();
    for (i, (x, y)) in got.iter().zip(&want).enumerate() {
        // The f64 job's tolerance is 0: allow f64's own rounding of the sums.
        let t = tol[i].max(1e-12 * (1.0 + y.abs()));
        assert!(
            (x - y).abs() <= t + step,
            "value {i}: {x} against {y} (tolerance {t:e}) in {s:?}"
        );
    }
}

#[test]
fn convolution_matches_the_f64_reference_across_groups_strides_and_padding() {
    for (s, bias, relu) in [
        (
            shape((2, 4, 9, 11), (6, 3, 2, 2), (1, 2), [1, 2, 0, 1], (1, 1)),
            true,
            true,
        ),
        // Depthwise: groups = channels.
        (
            shape((1, 5, 8, 8), (5, 3, 3, 5), (2, 1), [0, 0, 3, 3], (2, 3)),
            false,
            true,
        ),
        // Odd padding, a 1 × 1 kernel, and a window larger than one output chunk.
        (
            shape((3, 3, 16, 16), (70, 1, 1, 1), (1, 1), [1, 0, 0, 1], (1, 1)),
            true,
            false,
        ),
        (
            shape((1, 64, 40, 40), (8, 5, 5, 1), (1, 1), [2, 2, 2, 2], (1, 1)),
            false,
            false,
        ),
        // A 1 × 1 kernel, stride 1, no padding: the channels are the window columns (no
        // im2col), grouped and not; dilation moves nothing there.
        (
            shape((2, 6, 5, 7), (4, 1, 1, 2), (1, 1), [0; 4], (3, 2)),
            true,
            true,
        ),
        (
            shape((1, 8, 9, 9), (3, 1, 1, 1), (1, 1), [0; 4], (1, 1)),
            false,
            false,
        ),
        // 1 × 1 with a stride: im2col again.
        (
            shape((1, 4, 9, 9), (3, 1, 1, 1), (2, 2), [0; 4], (1, 1)),
            true,
            false,
        ),
        // The kernel exactly the padded input: one output position.
        (
            shape((2, 2, 3, 4), (3, 5, 6, 1), (1, 1), [1, 1, 1, 1], (1, 1)),
            true,
            true,
        ),
    ] {
        check(s, bias, relu, Dtype::F32, Dtype::F32);
    }
}

#[test]
fn each_dtype_is_within_its_bound() {
    let s = shape((2, 6, 10, 7), (4, 3, 3, 2), (1, 1), [1, 1, 1, 1], (1, 1));
    for (input, output) in [
        (Dtype::F16, Dtype::F16),
        (Dtype::Bf16, Dtype::Bf16),
        (Dtype::F32, Dtype::F16),
        (Dtype::F64, Dtype::F64),
    ] {
        check(s, true, false, input, output);
    }
}

#[test]
fn the_job_refuses_what_it_cannot_do_with_the_field_at_fault() {
    let make = |s: Conv2dShape| {
        let tensors = ConvTensors::F32 {
            input: vec![1.0; s.input_len()],
            weight: vec![
                1.0;
                s.channels / s.groups.max(1) * s.out_channels * s.kernel_h * s.kernel_w
            ],
            bias: None,
        };
        Conv2dJob::new(s, tensors, false, Dtype::F32, Dtype::F32)
            .map(|_| ())
            .map_err(|e| e.path)
    };
    let at = |name: &'static str| Err(FieldPath::root().field(name));
    let ok = shape((1, 4, 5, 5), (2, 3, 3, 2), (1, 1), [0; 4], (1, 1));
    assert_eq!(make(ok), Ok(()));
    assert_eq!(make(Conv2dShape { groups: 3, ..ok }), at("groups"));
    assert_eq!(
        make(Conv2dShape {
            stride: (0, 1),
            ..ok
        }),
        at("stride")
    );
    assert_eq!(
        make(Conv2dShape {
            dilation: (1, 0),
            ..ok
        }),
        at("dilation")
    );
    assert_eq!(make(Conv2dShape { kernel_h: 6, ..ok }), at("weight"));
    assert_eq!(
        make(Conv2dShape {
            dilation: (3, 1),
            ..ok
        }),
        at("weight")
    );
}
