//! Batched 2-D convolution (cross-correlation, as in every deep-learning framework):
//! the job, its CPU twin (im2col on the `gemm` crate) and the tolerance a device's answer
//! is held to.
//!
//! Input `[N, C, H, W]`, weights `[O, C/G, KH, KW]`, output `[N, O, OH, OW]` with
//! `OH = ⌊(H + pad_top + pad_bottom − dil_h·(KH − 1) − 1) / stride_h⌋ + 1` (and so for W).
//! Output channel `o` of group `g = o / (O/G)` reads input channels
//! `g·C/G … (g+1)·C/G − 1`. Optional bias per output channel, then optional ReLU. Both
//! backends lower each (image, group) to one product `W_g · cols`, where `cols` holds the
//! input windows (`C/G·KH·KW` rows, one column per output position, zeros in the padding).

use super::real::Real;
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::ops::invalid::{FieldPath, Invalid};
use crate::ops::linalg::views::gemm_into;
use crate::ops::linalg::{Dtype, Values};
use gemm::Parallelism;
use ndarray::{s, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

/// Bytes of window columns one CPU task holds at a time: the positions are cut into
/// chunks of about this many bytes.
const CPU_COLUMN_BYTES: usize = 1 << 22;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dShape {
    pub batch: usize,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub out_channels: usize,
    pub kernel_h: usize,
    pub kernel_w: usize,
    /// (rows, columns).
    pub stride: (usize, usize),
    /// Top, bottom, left, right.
    pub padding: [usize; 4],
    pub dilation: (usize, usize),
    pub groups: usize,
}

impl Conv2dShape {
    /// Output rows and columns, or None where the dilated kernel is larger than the
    /// padded input (or a stride or dilation is 0).
    pub fn out_size(&self) -> Option<(usize, usize)> {
        let one = |size: usize, pad: usize, kernel: usize, dil: usize, stride: usize| {
            let span = dil.checked_mul(kernel.checked_sub(1)?)?.checked_add(1)?;
            let padded = size.checked_add(pad)?;
            (stride > 0 && dil > 0 && span <= padded).then(|| (padded - span) / stride + 1)
        };
        let [top, bottom, left, right] = self.padding;
        Some((
            one(
                self.height,
                top.checked_add(bottom)?,
                self.kernel_h,
                self.dilation.0,
                self.stride.0,
            )?,
            one(
                self.width,
                left.checked_add(right)?,
                self.kernel_w,
                self.dilation.1,
                self.stride.1,
            )?,
        ))
    }

    fn out(&self) -> (usize, usize) {
        self.out_size().expect("the job checked the output size")
    }

    /// Output positions per channel.
    pub fn positions(&self) -> usize {
        let (h, w) = self.out();
        h * w
    }

    pub fn group_in(&self) -> usize {
        self.channels / self.groups
    }

    pub fn group_out(&self) -> usize {
        self.out_channels / self.groups
    }

    /// Rows of `cols` per group: the reduction length K.
    pub fn window(&self) -> usize {
        self.group_in() * self.kernel_h * self.kernel_w
    }

    pub fn input_len(&self) -> usize {
        self.batch * self.channels * self.height * self.width
    }

    pub fn weight_len(&self) -> usize {
        self.out_channels * self.window()
    }

    pub fn out_len(&self) -> usize {
        self.batch * self.out_channels * self.positions()
    }

    /// 2·N·O·OH·OW·K: multiplies and adds.
    pub fn flops(&self) -> f64 {
        2.0 * self.out_len() as f64 * self.window() as f64
    }

    /// Fills `cols` (`window() × count`, row-major) with image `image`'s windows for
    /// output positions `first … first + count − 1` of group `g`; zeros in the padding.
    /// Walks the positions an output row at a time, so the row's input row is found once
    /// and each value costs one bounds test.
    fn im2col<T: Real>(&self, image: &[T], g: usize, first: usize, count: usize, cols: &mut [T]) {
        let (_, out_w) = self.out();
        let (kh, kw) = (self.kernel_h, self.kernel_w);
        let [top, _, left, _] = self.padding;
        let (sh, sw) = self.stride;
        for c in 0..self.group_in() {
            let plane = &image[(g * self.group_in() + c) * self.height * self.width..]
                [..self.height * self.width];
            for i in 0..kh {
                for j in 0..kw {
                    let row = &mut cols[((c * kh + i) * kw + j) * count..][..count];
                    let shift = j * self.dilation.1;
                    let mut done = 0;
                    while done < count {
                        let p = first + done;
                        let (oh, ow) = (p / out_w, p % out_w);
                        let run = (out_w - ow).min(count - done);
                        let dst = &mut row[done..done + run];
                        let y = (oh * sh + i * self.dilation.0)
                            .checked_sub(top)
                            .filter(|&y| y < self.height);
                        match y {
                            None => dst.fill(T::ZERO),
                            Some(y) => {
                                let src = &plane[y * self.width..][..self.width];
                                for (slot, o) in dst.iter_mut().zip(ow..) {
                                    // x = o·stride + j·dilation − left, when in the image.
                                    let x = (o * sw + shift).wrapping_sub(left);
                                    *slot = if x < self.width { src[x] } else { T::ZERO };
                                }
                            }
                        }
                        done += run;
                    }
                }
            }
        }
    }

    /// A 1×1 kernel with stride 1 and no padding (dilation moves nothing then): each
    /// image's channels of a group are already its window columns (`C/G × H·W`), so no
    /// im2col is needed.
    fn pointwise(&self) -> bool {
        self.kernel_h == 1 && self.kernel_w == 1 && self.stride == (1, 1) && self.padding == [0; 4]
    }
}

/// Input, weights and bias: f32 (already rounded to the input dtype) or f64.
#[derive(Clone, Debug)]
pub enum ConvTensors {
    F32 {
        input: Vec<f32>,
        weight: Vec<f32>,
        bias: Option<Vec<f32>>,
    },
    F64 {
        input: Vec<f64>,
        weight: Vec<f64>,
        bias: Option<Vec<f64>>,
    },
}

#[derive(Clone, Debug)]
pub struct Conv2dJob {
    pub shape: Conv2dShape,
    pub tensors: ConvTensors,
    pub relu: bool,
    pub input: Dtype,
    pub output: Dtype,
    /// Where a device keeps the weights between jobs: the resident array's device key and
    /// the dtype they were rounded to (`with_weight_key`); `None` uploads them each job.
    pub weight_key: Option<String>,
}

impl Conv2dJob {
    /// Checks the shape and the lengths. Paths are the request's: `input`, `weight`,
    /// `bias`, `groups`, `stride`, `dilation`, `out_dtype`.
    pub fn new(
        shape: Conv2dShape,
        tensors: ConvTensors,
        relu: bool,
        input: Dtype,
        output: Dtype,
    ) -> Result<Self, Invalid> {
        Self::checked(shape, tensors, relu, (input, output), false)
    }

    /// `new`, the input left empty when `held_input`: a device holds the images
    /// (`kept::KeptConv2dJob`), of the shape's length, already in the input dtype.
    pub fn checked(
        shape: Conv2dShape,
        tensors: ConvTensors,
        relu: bool,
        (input, output): (Dtype, Dtype),
        held_input: bool,
    ) -> Result<Self, Invalid> {
        let root = FieldPath::root();
        let s = shape;
        if s.groups == 0 || s.channels % s.groups != 0 || s.out_channels % s.groups != 0 {
            return Err(Invalid::new(
                root.field("groups"),
                format!(
                    "{} groups do not divide {} input and {} output channels",
                    s.groups, s.channels, s.out_channels
                ),
            ));
        }
        for (name, (a, b)) in [("stride", s.stride), ("dilation", s.dilation)] {
            if a == 0 || b == 0 {
                return Err(Invalid::new(root.field(name), "each must be at least 1"));
            }
        }
        if s.out_size().is_none() {
            return Err(Invalid::new(
                root.field("weight"),
                format!(
                    "the dilated {}×{} kernel is larger than the padded {}×{} input",
                    s.kernel_h, s.kernel_w, s.height, s.width
                ),
            ));
        }
        let (i, w, b) = match &tensors {
            ConvTensors::F32 {
                input,
                weight,
                bias,
            } => (input.len(), weight.len(), bias.as_ref().map(Vec::len)),
            ConvTensors::F64 {
                input,
                weight,
                bias,
            } => (input.len(), weight.len(), bias.as_ref().map(Vec::len)),
        };
        for (name, got, want) in [("input", i, s.input_len()), ("weight", w, s.weight_len())]
            .into_iter()
            .chain(b.map(|b| ("bias", b, s.out_channels)))
        {
            if got != want && !(name == "input" && held_input && got == 0) {
                return Err(Invalid::new(
                    root.field(name),
                    format!("{got} values where the shape needs {want}"),
                ));
            }
        }
        if (input == Dtype::F64) != (output == Dtype::F64) {
            return Err(Invalid::new(
                root.field("out_dtype"),
                "f64 inputs answer in f64; other inputs in f32, f16 or bf16",
            ));
        }
        Ok(Self {
            shape,
            tensors,
            relu,
            input,
            output,
            weight_key: None,
        })
    }

    /// Keeps the weights on a device under a resident array's `key` (its
    /// `arrays::device_key`), suffixed with the job's input dtype as matmul's keys are
    /// with their compute type: the device copy is the weights in that dtype, as f32.
    pub fn with_weight_key(mut self, key: Option<String>) -> Self {
        self.weight_key = key.map(|k| format!("{k}/{}", self.input.name()));
        self
    }

    /// The CPU twin, then the output dtype's rounding.
    pub fn run_cpu(&self) -> Values {
        match &self.tensors {
            ConvTensors::F32 {
                input,
                weight,
                bias,
            } => {
                let mut out = self.convolve(input, weight, bias.as_deref(), self.relu);
                self.output.round_all(&mut out);
                Values::F32(out.into())
            }
            ConvTensors::F64 {
                input,
                weight,
                bias,
            } => Values::F64(self.convolve(input, weight, bias.as_deref(), self.relu)),
        }
    }

    /// One task per (image, group), each walking its output positions in chunks whose
    /// window columns stay within `CPU_COLUMN_BYTES`; every thread on one task when
    /// there are fewer tasks than threads.
    fn convolve<T: Real>(
        &self,
        input: &[T],
        weight: &[T],
        bias: Option<&[T]>,
        relu: bool,
    ) -> Vec<T> {
        let s = self.shape;
        let (p, k, og) = (s.positions(), s.window(), s.group_out());
        let mut out = vec![T::ZERO; s.out_len()];
        let chunk = (CPU_COLUMN_BYTES / (k * std::mem::size_of::<T>()).max(1)).clamp(1, p);
        let threads = rayon::current_num_threads();
        let tasks = s.batch * s.groups;
        let parallelism = if tasks < threads {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        // `cols`: one buffer of window columns per rayon job, reused by its tasks.
        let run = |cols: &mut Vec<T>, task: usize, out: &mut [T]| {
            let (n, g) = (task / s.groups, task % s.groups);
            let image =
                &input[n * s.channels * s.height * s.width..][..s.channels * s.height * s.width];
            let w = ArrayView2::from_shape((og, k), &weight[g * og * k..][..og * k])
                .expect("the group's og × k weights");
            if s.pointwise() {
                let cols = ArrayView2::from_shape((k, p), &image[g * k * p..][..k * p])
                    .expect("the group's C/G × H·W channels");
                let block = ArrayViewMut2::from_shape((og, p), &mut *out).expect("og × p");
                gemm_into(block, w, cols, T::ONE, None, false, parallelism);
            } else {
                // im2col writes every value it hands gemm: the buffer is only grown.
                if cols.len() < k * chunk {
                    cols.resize(k * chunk, T::ZERO);
                }
                for first in (0..p).step_by(chunk) {
                    let count = chunk.min(p - first);
                    let cols = &mut cols[..k * count];
                    s.im2col(image, g, first, count, cols);
                    // W_g (og × k) · cols (k × count) into columns `first..` of this
                    // task's og × p block.
                    let cols = ArrayView2::from_shape((k, count), &*cols).expect("k × count");
                    let mut block = ArrayViewMut2::from_shape((og, p), &mut *out).expect("og × p");
                    let dst = block.slice_mut(s![.., first..first + count]);
                    gemm_into(dst, w, cols, T::ONE, None, false, parallelism);
                }
            }
            for (o, row) in out.chunks_mut(p).enumerate() {
                let b = bias.map_or(T::ZERO, |b| b[g * og + o]);
                for x in row {
                    let v = if bias.is_some() { *x + b } else { *x };
                    *x = if relu && v < T::ZERO { T::ZERO } else { v };
                }
            }
        };
        if tasks < threads {
            let mut cols = Vec::new();
            out.chunks_mut(og * p)
                .enumerate()
                .for_each(|(t, o)| run(&mut cols, t, o));
        } else {
            out.par_chunks_mut(og * p)
                .enumerate()
                .for_each_init(Vec::new, |cols, (t, o)| run(cols, t, o));
        }
        out
    }

    /// Per output value, a bound on |device − CPU|: both sum the same K exact products
    /// (and the bias) in f32 in different orders, each within γ_{K+2}·Σ|w·x| + |b| of the
    /// exact sum; ReLU cannot widen the gap; then each rounds to the output dtype.
    pub fn tolerance(&self) -> Vec<f64> {
        let ConvTensors::F32 {
            input,
            weight,
            bias,
        } = &self.tensors
        else {
            return vec![0.0; self.shape.out_len()];
        };
        let abs = |v: &[f32]| v.iter().map(|x| f64::from(x.abs())).collect::<Vec<_>>();
        let bias = bias.as_deref().map(abs);
        let magnitude = self.convolve(&abs(input), &abs(weight), bias.as_deref(), false);
        let u = Dtype::F32.unit_roundoff();
        let m = (self.shape.window() + 2) as f64;
        let gamma = m * u / (1.0 - m * u);
        let out_u = self.output.unit_roundoff();
        magnitude
            .into_iter()
            .map(|mag| 2.0 * gamma * mag * 1.01 + 2.0 * out_u * mag + f64::from(f32::MIN_POSITIVE))
            .collect()
    }
}

impl Job for Conv2dJob {
    type Output = Values;

    fn name(&self) -> &'static str {
        "conv2d"
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.input.name().into()
    }

    fn size(&self) -> usize {
        self.shape.out_len()
    }

    fn input_bytes(&self) -> usize {
        let s = self.shape;
        (s.input_len() + s.weight_len()) * self.input.bytes()
    }

    /// Outputs of at least 2^16 values go to the device on `auto`.
    fn gpu_threshold(&self) -> usize {
        1 << 16
    }

    fn device_refusal(&self) -> Option<String> {
        (self.input == Dtype::F64)
            .then(|| "f64 conv2d runs on the CPU only; use backend auto or cpu".into())
    }

    fn run_cpu(&self) -> Values {
        Conv2dJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Values, DeviceError> {
        super::conv_launch::launch_conv2d(self, dev)
    }

    fn agrees(&self, device: &Values, cpu: &Values) -> Result<(), String> {
        super::within(device, cpu, &self.tolerance(), self.output, "value")
    }
}
