//! Kept convolutions on the emulated device (`ops::nn::kept`): a conv2d asked to keep its
//! output without answering it leaves the output on the device, rounded to its dtype
//! there; the next layer that names it runs there and reads its images in place (nothing
//! downloaded between the layers), with the CPU's answer; a read brings it to the host
//! once. And the job alone: several images through the held input and the kept output,
//! an output too large to keep beside the work, an overflow, a lost input.

use super::emulated_kept::{downloaded, lease_of, resident_placements, server};
use crate::common::TestServer;
use gpu_ops::backend::{GpuDevice, Job};
use gpu_ops::ops::linalg::kept::{KeepOnDevice, TensorResult};
use gpu_ops::ops::linalg::Dtype;
use gpu_ops::ops::nn::kept::KeptConv2dJob;
use gpu_ops::ops::nn::{Conv2dJob, Conv2dShape, ConvTensors};
use serde_json::{json, Value};
use std::sync::Arc;

async fn conv2d(s: &TestServer, body: Value, ran_on: &str) -> Value {
    let res = s.post("/nn/conv2d", body).send().await.unwrap();
    let status = res.status();
    let backend = res
        .headers()
        .get("x-backend")
        .map_or("", |b| b.to_str().unwrap())
        .to_string();
    let answer: Value = res.json().await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(backend, ran_on, "{answer}");
    answer
}

/// A nested `[a, b, c, d]` tensor of small integers (every product and sum of the layers
/// below is exact in f32, so any order of the sums gives the same bits).
fn integers(dims: [usize; 4], seed: usize) -> Value {
    let [a, b, c, d] = dims;
    let at = |i: usize| ((i * 5 + seed * 3) % 7) as i64 - 3;
    json!((0..a)
        .map(|i| (0..b)
            .map(|j| (0..c)
                .map(|k| (0..d)
                    .map(|l| at(((i * b + j) * c + k) * d + l))
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>())
            .collect::<Vec<_>>())
        .collect::<Vec<_>>())
}

#[tokio::test]
async fn a_kept_stack_of_convolutions_stays_on_the_emulated_device_until_read() {
    let s = server().await;
    // Two images of 3 channels, 8 × 8; a 3 × 3 layer to 4 channels (padding 1, bias,
    // ReLU), then a strided 3 × 3 layer to 2 channels.
    let x = integers([2, 3, 8, 8], 1);
    let (w1, w2) = (integers([4, 3, 3, 3], 2), integers([2, 4, 3, 3], 3));
    let first = |input: Value, backend: &str| {
        json!({"input": input, "weight": w1, "bias": [1, -2, 0, 3], "padding": [1, 1],
               "relu": true, "dtype": "bf16", "backend": backend})
    };
    let second = |input: Value, backend: &str| {
        json!({"input": input, "weight": w2, "stride": [2, 2], "dtype": "bf16",
               "out_dtype": "f32", "backend": backend})
    };
    // The stack on the CPU, the first output sent back.
    let h = conv2d(&s, first(x.clone(), "cpu"), "cpu").await["result"].clone();
    let want = conv2d(&s, second(h.clone(), "cpu"), "cpu").await["result"].clone();

    // On the device, the first output kept there.
    let before = downloaded(&s);
    let mut kept_first = first(x, "gpu");
    kept_first["keep"] = json!({"with_data": false});
    let answer = conv2d(&s, kept_first, "emulated").await;
    assert!(answer.get("result").is_none(), "{answer}");
    assert_eq!(answer["kept"]["held"], json!(["device"]), "{answer}");
    assert_eq!(answer["shape"], json!([2, 4, 8, 8]), "{answer}");
    let kept = answer["kept"]["id"].as_str().unwrap().to_string();
    // Four bytes came back: the rounding kernel's flag of a value that is not finite.
    assert_eq!(
        downloaded(&s),
        before + 4,
        "the output stayed on the device"
    );
    let key = gpu_ops::arrays::device_key(&kept);
    let gpus = s.state.backends.gpus();
    assert!(gpus[0].holds_table(&key));

    // `auto` takes the next layer to the device holding its input, which reads it there.
    let resident = resident_placements(&s, "conv2d");
    let before = downloaded(&s);
    let got = conv2d(&s, second(json!({"array": kept}), "auto"), "emulated").await;
    assert_eq!(resident_placements(&s, "conv2d"), resident + 1);
    assert_eq!(got["result"], want, "the stack's answer is the CPU's");
    assert_eq!(got["shape"], json!([2, 2, 3, 3]), "{got}");
    assert_eq!(
        downloaded(&s),
        before + 2 * 2 * 3 * 3 * 4,
        "only the answer came back"
    );

    // nhwc reads it back (a held tensor is NCHW on the device; read as [N, H, W, C] its
    // 4 × 8 images have 8 channels), and answers as the CPU does.
    let mut nhwc = second(json!({"array": kept}), "gpu");
    nhwc["layout"] = json!("nhwc");
    nhwc["weight"] = integers([2, 8, 3, 3], 4);
    let mut nhwc_cpu = nhwc.clone();
    nhwc_cpu["backend"] = json!("cpu");
    let on_cpu = conv2d(&s, nhwc_cpu, "cpu").await;
    assert_eq!(
        conv2d(&s, nhwc, "emulated").await["result"],
        on_cpu["result"]
    );

    // Read: the CPU's first output, held on the host and the disk from then on.
    let data: Value = s
        .get(&format!("/arrays/{kept}/data"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(data["tensor"], h, "{data}");
    let deleted = s.delete(&format!("/arrays/{kept}")).send().await.unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(!gpus[0].holds_table(&key));
}

/// `n` images of `c` channels, h × w, through `o` filters of 3 × 3 (padding 1), over
/// integers that keep every sum exact in f32 (below 2^24), in any order: the weights are
/// multiples of `scale`.
fn layer_scaled(
    n: usize,
    c: usize,
    (h, w): (usize, usize),
    o: usize,
    held_input: bool,
    scale: f32,
) -> Conv2dJob {
    let shape = Conv2dShape {
        batch: n,
        channels: c,
        height: h,
        width: w,
        out_channels: o,
        kernel_h: 3,
        kernel_w: 3,
        stride: (1, 1),
        padding: [1; 4],
        dilation: (1, 1),
        groups: 1,
    };
    let values = |len: usize, salt: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7 + salt) % 9) as f32 - 4.0)
            .collect()
    };
    let tensors = ConvTensors::F32 {
        input: if held_input {
            Vec::new()
        } else {
            values(shape.input_len(), 1)
        },
        weight: values(shape.weight_len(), 2)
            .into_iter()
            .map(|x| x * scale)
            .collect(),
        bias: Some(values(o, 3)),
    };
    Conv2dJob::checked(shape, tensors, true, (Dtype::F32, Dtype::F32), held_input).unwrap()
}

fn layer(n: usize, c: usize, hw: (usize, usize), o: usize, held_input: bool) -> Conv2dJob {
    layer_scaled(n, c, hw, o, held_input, 1.0)
}

fn keep(key: &str, shape: Vec<usize>) -> Option<KeepOnDevice> {
    Some(KeepOnDevice {
        key: key.into(),
        shape,
    })
}

#[test]
fn a_convolution_reads_held_images_and_keeps_its_output_where_it_lies() {
    let dev = Arc::new(GpuDevice::emulated(0, 64 << 20));
    let lease = lease_of(&dev);
    // Three images: each one's output is written at its own offset of the kept output,
    // and rounded there to bf16: the sums (multiples of 37, up to about 10^4) are exact
    // in f32 and many are not bf16's (a quarter; ReLU zeroes as many), so the device's
    // rounding is the host's or not.
    let mut job = layer_scaled(3, 2, (5, 6), 4, false, 37.0);
    job.output = Dtype::Bf16;
    let unrounded = {
        let mut plain = job.clone();
        plain.output = Dtype::F32;
        plain.run_cpu().into_f32()
    };
    let first = KeptConv2dJob::new(job, None, keep("array/arr_l1", vec![3, 4, 5, 6])).unwrap();
    let on_cpu = first.run_cpu();
    let Ok(TensorResult::Host(want)) = &on_cpu else {
        panic!("the CPU answers on the host")
    };
    let rounded = want.clone().into_f32();
    let changed = rounded
        .iter()
        .zip(&unrounded)
        .filter(|(a, b)| a != b)
        .count();
    assert!(changed > rounded.len() / 8, "{changed} values rounded");
    let TensorResult::Held(held) = first.run_device(&lease).unwrap().unwrap() else {
        panic!("a finite output is kept");
    };
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(
        bits(held.read_on(&lease).unwrap().into_f32()),
        bits(rounded.clone())
    );
    assert_eq!(
        (held.shape(), held.dtype()),
        (&[3, 4, 5, 6][..], Dtype::Bf16)
    );

    // The next layer reads the three images where they lie, one at a time.
    let next = |held| KeptConv2dJob::new(layer(3, 4, (5, 6), 2, true), Some(held), None);
    let job = next(held.clone()).unwrap();
    assert_eq!(job.resident_on(), Some(0));
    let on_device = job.run_device(&lease).unwrap();
    let cpu = job.run_cpu();
    let (Ok(TensorResult::Host(d)), Ok(TensorResult::Host(c))) = (&on_device, &cpu) else {
        panic!("both answer on the host");
    };
    assert_eq!(d, c);
    assert_eq!(job.agrees(&on_device, &cpu), Ok(()));
    // The same layer on the host's copy of the images, as a plain job: the same answer.
    let mut plain = layer(3, 4, (5, 6), 2, false);
    let ConvTensors::F32 { input, .. } = &mut plain.tensors else {
        unreachable!()
    };
    *input = rounded;
    assert_eq!(&plain.run_cpu(), d);
    // A held tensor of another length, or images both held and sent, are refused.
    assert!(KeptConv2dJob::new(layer(2, 4, (5, 6), 2, true), Some(held.clone()), None).is_err());
    assert!(KeptConv2dJob::new(layer(3, 4, (5, 6), 2, false), Some(held.clone()), None).is_err());
    assert!(KeptConv2dJob::new(layer(3, 4, (5, 6), 2, true), None, None).is_err());

    // Lost (its device's context rebuilt): the layer names its input, no device fault.
    dev.forget_table("array/arr_l1");
    let Ok(Err(failed)) = next(held).unwrap().run_device(&lease) else {
        panic!("a lost input is the request's failure");
    };
    assert_eq!(failed.input, Some(0));
}

#[test]
fn an_output_is_kept_only_beside_room_for_its_work() {
    let small = Arc::new(GpuDevice::emulated(1, 256 << 10));
    // The cache of copies may take any size here (its own cap, a quarter of the device
    // by default, is the other reason an output is not kept): the budget alone decides.
    small.set_table_cache_limit(1 << 30);
    let lease = lease_of(&small);
    let budget = lease.memory_budget();
    // Images of 8 channels, 16 × 16, to 2: each one's output is 512 values, its windows
    // 8·9·256. As many images as the budget holds outputs beside the weights, one image
    // and its output, so only the windows do not fit.
    let others = 4 * (2 * 8 * 9 + 8 * 256 + 2 * 256);
    let n = (budget - others) / (4 * 512);
    assert!(n >= 2, "a budget of {budget} bytes");
    for (images, kept) in [(n, false), (1, true)] {
        let job = layer(images, 8, (16, 16), 2, false);
        let key = format!("array/arr_room_{images}");
        let kept_job = KeptConv2dJob::new(job.clone(), None, keep(&key, vec![images, 2, 16, 16]));
        let answer = kept_job.unwrap().run_device(&lease).unwrap().unwrap();
        assert_eq!(
            matches!(answer, TensorResult::Held(_)),
            kept,
            "{images} images"
        );
        assert_eq!(small.holds_table(&key), kept, "{images} images");
        if let TensorResult::Host(values) = answer {
            assert_eq!(values, job.run_cpu(), "answered from the host");
        }
    }

    // An output that overflows f16 is not kept, and the answer names the value.
    let dev = Arc::new(GpuDevice::emulated(2, 64 << 20));
    let lease = lease_of(&dev);
    let mut loud = layer(1, 1, (4, 4), 1, false);
    loud.output = Dtype::F16;
    if let ConvTensors::F32 { input, .. } = &mut loud.tensors {
        input[5] = 60000.0;
    }
    let job = KeptConv2dJob::new(loud, None, keep("array/arr_loud", vec![1, 1, 4, 4])).unwrap();
    let Ok(TensorResult::Host(values)) = job.run_device(&lease).unwrap() else {
        panic!("an overflow is not kept");
    };
    assert!(values.first_non_finite().is_some());
    assert!(!dev.holds_table("array/arr_loud"));
}
