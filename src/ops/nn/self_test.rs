//! The conv2d self-tests: groups (depthwise too), stride, dilation, uneven padding, bias
//! and ReLU, each output dtype. The attention self-tests: grouped heads, queries past one query block and keys past
//! one key tile, a causal mask with fewer queries than keys, padded sequences (one with no
//! key at all), head dimensions that pick each key tile, weights, and f16 output; and f16
//! and bf16 inputs without weights, which run on the tensor cores' kernel where the device
//! has it (so a GPU checks it against the CPU twin before it serves one).

use super::run_conv2d_cudnn;
use super::{AttentionJob, AttentionShape, Conv2dJob, Conv2dShape, ConvTensors, Tensors};
use crate::backend::cuda::cudnn::CONV2D_CUDNN_OP;
use crate::backend::verify::{JobCheck, LibraryCheck, SelfTest};
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
            Dtype::F32,
        ),
        // One tile of 8 keys (D = 256), padded, f16 out.
        (
            shape(1, 2, 1, 5, 21, 256, 64),
            false,
            Some(vec![13]),
            false,
            Dtype::F32,
            Dtype::F16,
        ),
        (
            shape(3, 1, 1, 33, 33, 8, 8),
            true,
            None,
            true,
            Dtype::F32,
            Dtype::Bf16,
        ),
        // The tensor cores' kernel where the device has it (f16 and bf16 in, no
        // weights): two query blocks of 64, the second cut; key tiles of 32, the last
        // cut; D and D_v off their multiples of 16 and 8; grouped heads; a row that sees
        // no key.
        (
            shape(1, 4, 2, 70, 45, 40, 20),
            true,
            Some(vec![44]),
            false,
            Dtype::F16,
            Dtype::F32,
        ),
        (
            shape(2, 2, 1, 65, 33, 128, 128),
            false,
            Some(vec![33, 5]),
            false,
            Dtype::Bf16,
            Dtype::Bf16,
        ),
    ];
    let jobs = cases
        .into_iter()
        .enumerate()
        .map(|(n, (shape, causal, lengths, weights, input, output))| {
            let rounded = |len, salt| -> Vec<f32> {
                values(len, salt)
                    .into_iter()
                    .map(|x| input.round(x))
                    .collect()
            };
            let tensors = Tensors::F32 {
                q: rounded(shape.q_len(), 3 * n + 1),
                k: rounded(shape.k_len(), 3 * n + 2),
                v: rounded(shape.v_len(), 3 * n + 3),
            };
            let scale = 1.0 / (shape.head_dim as f64).sqrt();
            AttentionJob::new(
                shape, tensors, scale, causal, lengths, input, output, weights,
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

/// cuDNN's self-test: the conv2d cases cuDNN takes (even padding: depthwise with
/// stride and dilation, and a plain one), and a 3 × 3, stride-1 layer of 16 → 24 channels,
/// run on cuDNN alone (no fallback: a refusal fails it) and held to the CPU twin.
/// `ops::self_tests` runs it last, after conv2d's own self-test verified im2col.
pub(crate) fn cudnn_check() -> Box<dyn SelfTest> {
    let layer = Conv2dShape {
        batch: 2,
        channels: 16,
        height: 12,
        width: 12,
        out_channels: 24,
        kernel_h: 3,
        kernel_w: 3,
        stride: (1, 1),
        padding: [1; 4],
        dilation: (1, 1),
        groups: 1,
    };
    let tensors = ConvTensors::F32 {
        input: values(layer.input_len(), 11),
        weight: values(layer.weight_len(), 12),
        bias: Some(values(layer.out_channels, 13)),
    };
    let layer = Conv2dJob::new(layer, tensors, true, Dtype::F32, Dtype::F32)
        .expect("a valid self-test convolution");
    let even = |job: &Conv2dJob| {
        let [top, bottom, left, right] = job.shape.padding;
        top == bottom && left == right
    };
    let mut jobs: Vec<Conv2dJob> = conv_jobs().into_iter().filter(even).collect();
    jobs.push(layer);
    Box::new(LibraryCheck {
        op: CONV2D_CUDNN_OP,
        serves: &["conv2d"],
        jobs,
        opened: |dev| dev.has_cudnn(),
        run: run_conv2d_cudnn,
        infos: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cudnn_check_takes_only_cases_cudnn_can_run() {
        // Built without a panic (every case valid), under its own op name; the uneven
        // padding case is left to im2col's own self-test.
        let check = cudnn_check();
        assert_eq!(check.op(), CONV2D_CUDNN_OP);
        let uneven = conv_jobs()
            .iter()
            .filter(|j| j.shape.padding[0] != j.shape.padding[1])
            .count();
        assert_eq!(
            uneven, 1,
            "conv2d's self-test keeps its uneven padding case"
        );
    }
}
