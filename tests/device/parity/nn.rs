//! Attention and convolution, within each job's stated tolerance.

use super::on_every_device;
use gpu_ops::backend::device::DeviceErrorKind;
use gpu_ops::backend::emulated::Fault;
use gpu_ops::backend::Job;
use gpu_ops::ops::linalg::Dtype;
use gpu_ops::ops::nn::{
    AttentionJob, AttentionShape, Conv2dJob, Conv2dShape, ConvTensors, Tensors,
};

/// B, H, H_kv, S, S_kv, D, D_v.
fn shape(
    batch: usize,
    heads: usize,
    kv_heads: usize,
    queries: usize,
    keys: usize,
    head_dim: usize,
    value_dim: usize,
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

/// Query blocks cut at their edge, more tasks than the grid, every key tile size (D from 8
/// to 256), grouped heads, causal masks with fewer and more queries than keys, padded and
/// empty sequences, weights, each output dtype, large logits; then passes under a memory
/// limit, one sequence at a time.
#[test]
fn attention_agrees_with_the_cpu() {
    let values = |len: usize, salt: usize, gain: f32| -> Vec<f32> {
        (0..len)
            .map(|i| {
                ((i * 31 + salt * 7) as f32 * 0.377).sin() * gain * (1 + (i + salt) % 3) as f32
            })
            .collect()
    };
    let job = |s: AttentionShape, causal, lengths: Option<Vec<usize>>, output, gain| {
        let tensors = Tensors::F32 {
            q: values(s.q_len(), 1, gain),
            k: values(s.k_len(), 2, 1.0),
            v: values(s.v_len(), 3, 1.0),
        };
        let scale = 1.0 / (s.head_dim as f64).sqrt();
        AttentionJob::new(s, tensors, scale, causal, lengths, Dtype::F32, output, true).unwrap()
    };
    on_every_device("attention_agrees_with_the_cpu", |d| {
        let cases = d.sizes(
            &[
                (shape(2, 8, 2, 512, 512, 64, 64), true, None),
                (shape(1, 4, 4, 300, 1000, 128, 128), false, Some(vec![777])),
            ],
            &[
                (shape(2, 4, 2, 19, 75, 32, 24), true, Some(vec![75, 0])),
                (shape(1, 2, 1, 40, 9, 8, 16), true, None),
                (shape(1, 1, 1, 17, 70, 256, 256), false, Some(vec![45])),
                (shape(3, 2, 1, 1, 33, 100, 3), false, None),
            ],
        );
        for (s, causal, lengths) in cases {
            for (output, gain) in [(Dtype::F32, 1.0), (Dtype::F16, 1.0), (Dtype::F32, 3000.0)] {
                let case = format!("{s:?} causal={causal} {output:?} ×{gain}");
                d.check(case, &job(s, causal, lengths.clone(), output, gain));
            }
        }
        d.in_passes(64 << 10, |d| {
            let lengths = Some(vec![40, 3, 0, 39, 1]);
            let s = shape(5, 2, 1, 30, 40, 16, 16);
            d.check("in passes", &job(s, true, lengths, Dtype::F32, 1.0));
        });
    });
}

/// f16 and bf16 attention without weights, on the tensor cores' kernel
/// (`kernels/nvidia/attention_mma.cu`) wherever the device has it: query blocks of 64 cut
/// at their edge and wrapping the grid, key tiles of 32 cut at theirs, D and D_v that are
/// not multiples of 16 or 8 (and the largest, 128), grouped heads, causal masks with
/// fewer and more queries than keys, empty sequences and rows that see no key, large
/// logits; then passes under a memory limit. On the emulated device a fault injected into
/// the kernel shows the jobs went to it.
#[test]
fn attention_on_tensor_cores_agrees_with_the_cpu() {
    let values = |len: usize, salt: usize, gain: f32, dtype: Dtype| -> Vec<f32> {
        (0..len)
            .map(|i| {
                let x =
                    ((i * 31 + salt * 7) as f32 * 0.377).sin() * gain * (1 + (i + salt) % 3) as f32;
                dtype.round(x)
            })
            .collect()
    };
    let job =
        |s: AttentionShape, causal, lengths: Option<Vec<usize>>, input: Dtype, output, gain| {
            let tensors = Tensors::F32 {
                q: values(s.q_len(), 1, gain, input),
                k: values(s.k_len(), 2, 1.0, input),
                v: values(s.v_len(), 3, 1.0, input),
            };
            let scale = 1.0 / (s.head_dim as f64).sqrt();
            AttentionJob::new(s, tensors, scale, causal, lengths, input, output, false).unwrap()
        };
    on_every_device("attention_on_tensor_cores_agrees_with_the_cpu", |d| {
        let cases = d.sizes(
            &[
                (shape(2, 8, 2, 512, 512, 64, 64), true, None),
                (shape(1, 4, 4, 300, 1000, 128, 128), false, Some(vec![777])),
            ],
            &[
                (shape(2, 4, 2, 19, 75, 32, 24), true, Some(vec![75, 0])),
                (shape(1, 2, 1, 40, 9, 8, 16), true, None),
                (shape(1, 2, 2, 130, 64, 24, 40), true, None),
                (shape(3, 2, 1, 1, 33, 100, 3), false, None),
                (shape(1, 1, 1, 70, 100, 128, 128), false, Some(vec![45])),
            ],
        );
        for (s, causal, lengths) in cases {
            for (input, output, gain) in [
                (Dtype::F16, Dtype::F32, 1.0),
                (Dtype::Bf16, Dtype::Bf16, 1.0),
                (Dtype::Bf16, Dtype::F32, 3000.0),
            ] {
                let case = format!("{s:?} causal={causal} {input:?}→{output:?} ×{gain}");
                d.check(case, &job(s, causal, lengths.clone(), input, output, gain));
            }
        }
        d.in_passes(32 << 10, |d| {
            let lengths = Some(vec![40, 3, 0, 39, 1]);
            let s = shape(5, 2, 1, 30, 40, 16, 16);
            let j = job(s, true, lengths, Dtype::F16, Dtype::F16, 1.0);
            d.check("in passes", &j);
        });
        if d.is_emulated() {
            let s = shape(1, 1, 1, 8, 8, 16, 16);
            for input in [Dtype::F16, Dtype::Bf16] {
                let j = job(s, false, None, input, Dtype::F32, 1.0);
                let fault = Fault::Fail(DeviceErrorKind::Fatal);
                d.device().inject_fault("attention_mma_", fault, 1).unwrap();
                if j.run_device(&d.lease()).is_ok() {
                    d.fail(format!("{input:?}"), "the job did not run attention_mma_*");
                }
            }
        }
    });
}

/// Groups (depthwise too), strides, dilation, uneven padding, bias and ReLU, each output
/// dtype, windows past one matmul tile.
#[test]
fn conv2d_agrees_with_the_cpu() {
    let base = Conv2dShape {
        batch: 2,
        channels: 4,
        height: 9,
        width: 11,
        out_channels: 6,
        kernel_h: 3,
        kernel_w: 2,
        stride: (1, 1),
        padding: [0; 4],
        dilation: (1, 1),
        groups: 1,
    };
    let values = |len: usize, salt: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 31 + salt * 7) as f32 * 0.377).sin() * (1 + (i + salt) % 4) as f32)
            .collect()
    };
    on_every_device("conv2d_agrees_with_the_cpu", |d| {
        let shapes = d.sizes(
            &[Conv2dShape {
                batch: 8,
                channels: 64,
                height: 56,
                width: 56,
                out_channels: 64,
                padding: [1; 4],
                kernel_w: 3,
                ..base
            }],
            &[
                Conv2dShape {
                    groups: 2,
                    stride: (1, 2),
                    padding: [1, 2, 0, 1],
                    ..base
                },
                Conv2dShape {
                    channels: 5,
                    out_channels: 10,
                    groups: 5,
                    stride: (2, 1),
                    padding: [0, 0, 3, 3],
                    dilation: (2, 3),
                    ..base
                },
                Conv2dShape {
                    batch: 1,
                    channels: 3,
                    height: 12,
                    width: 12,
                    out_channels: 70,
                    padding: [1; 4],
                    kernel_w: 3,
                    ..base
                },
            ],
        );
        for shape in shapes {
            for (with_bias, relu, output) in [
                (true, true, Dtype::F32),
                (false, false, Dtype::F16),
                (true, false, Dtype::Bf16),
            ] {
                let tensors = ConvTensors::F32 {
                    input: values(shape.input_len(), 1),
                    weight: values(shape.weight_len(), 2),
                    bias: with_bias.then(|| values(shape.out_channels, 3)),
                };
                let job = Conv2dJob::new(shape, tensors, relu, Dtype::F32, output).unwrap();
                d.check(
                    format!("{shape:?} bias={with_bias} relu={relu} {output:?}"),
                    &job,
                );
            }
        }
    });
}
