//! The conv2d self-tests: groups (depthwise too), stride, dilation, uneven padding, bias
//! and ReLU, each output dtype. The attention self-tests: grouped heads, queries past one query block and keys past
//! one key tile, a causal mask with fewer queries than keys, padded sequences (one with no
//! key at all), head dimensions that pick each key tile, weights, and f16 output.

use super::{AttentionJob, AttentionShape, Conv2dJob, Conv2dShape, ConvTensors, Tensors};
use crate::backend::verify::{JobCheck, SelfTest};
use crate::ops::linalg::Dtype;

/// Values of mixed sign and magnitude, zeros among them.
fn values(len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let x = ((i * 7 + salt) as f32 * 0.618).sin();
            if (i + salt) % 11 == 0 {
                0.0
            } else {
                x * [1.0, 2.5, 0.05, 4.0][(i + salt) % 4]
            }
        })
        .collect()
}

pub(crate) fn self_tests() -> Vec<Box<dyn SelfTest>> {
    let shape = |batch, heads, kv_heads, queries, keys, head_dim, value_dim| AttentionShape {
        batch,
        heads,
        kv_heads,
        queries,
        keys,
        head_dim,
        value_dim,
    };
    let cases = [
        // Grouped heads, a causal mask aligned to the bottom right, one sequence empty.
        (
            shape(2, 4, 2, 19, 75, 32, 24),
            true,
            Some(vec![75, 0]),
            true,
            Dtype::F32,
        ),
        // One tile of 8 keys (D = 256), padded, f16 out.
        (
            shape(1, 2, 1, 5, 21, 256, 64),
            false,
            Some(vec![13]),
            false,
            Dtype::F16,
        ),
        (shape(3, 1, 1, 33, 33, 8, 8), true, None, true, Dtype::Bf16),
    ];
    let jobs = cases
        .into_iter()
        .enumerate()
        .map(|(n, (shape, causal, lengths, weights, output))| {
            let tensors = Tensors::F32 {
                q: values(shape.q_len(), 3 * n + 1),
                k: values(shape.k_len(), 3 * n + 2),
                v: values(shape.v_len(), 3 * n + 3),
            };
            let scale = 1.0 / (shape.head_dim as f64).sqrt();
            AttentionJob::new(
                shape,
                tensors,
                scale,
                causal,
                lengths,
                Dtype::F32,
                output,
                weights,
            )
            .expect("a valid self-test attention")
        })
        .collect();
    vec![JobCheck::boxed(jobs), JobCheck::boxed(conv_jobs())]
}

fn conv_jobs() -> Vec<Conv2dJob> {
    let shape = |channels, out_channels, groups, stride, padding, dilation| Conv2dShape {
        batch: 2,
        channels,
        height: 9,
        width: 11,
        out_channels,
        kernel_h: 3,
        kernel_w: 2,
        stride,
        padding,
        dilation,
        groups,
    };
    [
        (
            shape(4, 6, 2, (1, 2), [1, 2, 0, 1], (1, 1)),
            true,
            true,
            Dtype::F32,
        ),
        (
            shape(5, 5, 5, (2, 1), [0, 0, 3, 3], (2, 3)),
            false,
            true,
            Dtype::F16,
        ),
        (
            shape(3, 70, 1, (1, 1), [1, 1, 1, 1], (1, 1)),
            true,
            false,
            Dtype::Bf16,
        ),
    ]
    .into_iter()
    .enumerate()
    .map(|(n, (shape, with_bias, relu, output))| {
        let tensors = ConvTensors::F32 {
            input: values(shape.input_len(), 3 * n + 1),
            weight: values(shape.weight_len(), 3 * n + 2),
            bias: with_bias.then(|| values(shape.out_channels, 3 * n + 3)),
        };
        Conv2dJob::new(shape, tensors, relu, Dtype::F32, output)
            .expect("a valid self-test convolution")
    })
    .collect()
}
