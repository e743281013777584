//! Convolution on a device, image by image: the windows (`conv_im2col_f32`), one product
//! per group on linalg's `matmul_f32`, then bias and ReLU; or cuDNN's convolution over
//! passes of images, then our bias and ReLU. The images come from the job (uploaded a
//! pass at a time) or from a tensor the device holds; the output is downloaded, or
//! written where it lies into one buffer a kept convolution keeps (`ConvEnds`,
//! `super::kept`).

use super::conv2d::{Conv2dJob, ConvTensors};
use crate::backend::cuda::cudnn::{ConvGeometry, CONV2D_CUDNN_OP};
use crate::backend::device::DeviceBuffer;
use crate::backend::{DeviceError, DeviceErrorKind, DeviceLease};
use crate::ops::linalg::{
    copy_range, matmul_pass, Compute, DeviceRef, MatmulPass, MatmulProvider, PassOperand, Strides,
    Values,
};
use std::sync::Arc;

/// Where a convolution's images are read and its output goes.
#[derive(Default)]
pub(crate) struct ConvEnds<'a> {
    /// The whole batch's images on the device (NCHW, the job's input being empty), or
    /// `None`: the job's images, uploaded a pass at a time.
    pub input: Option<&'a DeviceBuffer<f32>>,
    /// The whole output on the device, each pass's written at its offset and left
    /// unrounded; `None`: each pass downloaded.
    pub output: Option<&'a mut DeviceBuffer<f32>>,
}

impl ConvEnds<'_> {
    /// Images `first … first + count − 1` (of `image_len` values each) on the device:
    /// copied out of the held input, or uploaded from the job's.
    fn images(
        &self,
        dev: &DeviceLease<'_>,
        input: &[f32],
        (first, count, image_len): (usize, usize, usize),
    ) -> Result<DeviceBuffer<f32>, DeviceError> {
        let (at, len) = (first * image_len, count * image_len);
        match self.input {
            Some(all) => {
                let mut part = dev.alloc_zeros::<f32>(len)?;
                copy_range(dev, (all, at), (&mut part, 0), len)?;
                Ok(part)
            }
            None => dev.upload(&input[at..at + len]),
        }
    }

    /// Image `n` (of `image_len` values) for the im2col kernel, with the value it starts
    /// at: read in place in the held input, or uploaded from the job's.
    fn image(
        &self,
        dev: &DeviceLease<'_>,
        input: &[f32],
        (n, image_len): (usize, usize),
    ) -> Result<(DeviceRef<'_, f32>, u64), DeviceError> {
        let at = n * image_len;
        match self.input {
            Some(all) if at + image_len <= all.len() => Ok((DeviceRef::Borrowed(all), at as u64)),
            Some(all) => Err(DeviceError::fatal(format!(
                "image {n} of {image_len} values past a held input of {}",
                all.len()
            ))),
            None => Ok((DeviceRef::Made(dev.upload(&input[at..at + image_len])?), 0)),
        }
    }

    /// A pass's output, starting at value `at` of the whole: written into the kept
    /// output, or downloaded onto `host`.
    fn put(
        &mut self,
        dev: &DeviceLease<'_>,
        part: &DeviceBuffer<f32>,
        at: usize,
        host: &mut Vec<f32>,
    ) -> Result<(), DeviceError> {
        match self.output.as_deref_mut() {
            Some(all) => copy_range(dev, (part, 0), (all, at), part.len()),
            None => {
                host.extend(dev.download(part)?);
                Ok(())
            }
        }
    }

    /// Bytes the ends hold beside a pass's own: the kept output (the held input is
    /// already the device's).
    fn fixed_bytes(&self) -> usize {
        self.output.as_ref().map_or(0, |o| 4 * o.len())
    }
}

/// A job's f32 tensors.
struct F32Conv<'a> {
    input: &'a [f32],
    weight: &'a [f32],
    bias: Option<&'a [f32]>,
}

/// The job's f32 input, weights and bias (f64 convolutions run on the CPU only).
fn f32_tensors(job: &Conv2dJob) -> Result<F32Conv<'_>, DeviceError> {
    match &job.tensors {
        ConvTensors::F32 {
            input,
            weight,
            bias,
        } => Ok(F32Conv {
            input,
            weight,
            bias: bias.as_deref(),
        }),
        _ => Err(DeviceError::unsupported("f64 conv2d runs on the CPU only")),
    }
}

/// The weights on the device: the cached copy of a resident array's weights (uploaded on
/// the first use), else a fresh upload for this job.
fn weights_on(
    job: &Conv2dJob,
    dev: &DeviceLease<'_>,
    weight: &[f32],
) -> Result<Arc<DeviceBuffer<f32>>, DeviceError> {
    match &job.weight_key {
        Some(key) => dev.cached_table(key, || dev.upload(weight)),
        None => Ok(Arc::new(dev.upload(weight)?)),
    }
}

/// Which code runs a device's convolutions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConvProvider {
    /// `conv_im2col_f32`, the product (`MatmulProvider`), then bias and ReLU (every device).
    Im2col,
    /// cuDNN for the convolution, then our bias and ReLU; im2col for what it refuses.
    Cudnn,
}

impl ConvProvider {
    /// cuDNN where this device has it, its self-test passed, and the operator left it on.
    pub(crate) fn for_device(dev: &DeviceLease<'_>) -> Self {
        if dev.has_cudnn() && dev.device.op_verified(CONV2D_CUDNN_OP) {
            ConvProvider::Cudnn
        } else {
            ConvProvider::Im2col
        }
    }
}

pub fn launch_conv2d(job: &Conv2dJob, dev: &DeviceLease<'_>) -> Result<Values, DeviceError> {
    run_conv2d_on(job, dev, ConvProvider::for_device(dev))
}

/// The job's images through `provider`, the output downloaded and rounded to its dtype.
pub(crate) fn run_conv2d_on(
    job: &Conv2dJob,
    dev: &DeviceLease<'_>,
    provider: ConvProvider,
) -> Result<Values, DeviceError> {
    let mut out = conv2d_between(job, dev, provider, ConvEnds::default())?;
    job.output.round_all(&mut out);
    Ok(Values::F32(out.into()))
}

/// cuDNN's convolution alone (the library check's and the self-test's), the output
/// downloaded and rounded.
pub(crate) fn run_conv2d_cudnn(
    job: &Conv2dJob,
    dev: &DeviceLease<'_>,
) -> Result<Values, DeviceError> {
    let mut out = conv2d_cudnn(job, dev, ConvEnds::default())?;
    job.output.round_all(&mut out);
    Ok(Values::F32(out.into()))
}

/// The convolution between `ends` through `provider` (im2col for what cuDNN declines);
/// the output's values on the host, unrounded, unless `ends` keeps it on the device.
pub(crate) fn conv2d_between(
    job: &Conv2dJob,
    dev: &DeviceLease<'_>,
    provider: ConvProvider,
    mut ends: ConvEnds<'_>,
) -> Result<Vec<f32>, DeviceError> {
    if provider == ConvProvider::Cudnn {
        match conv2d_cudnn(
            job,
            dev,
            ConvEnds {
                input: ends.input,
                output: ends.output.as_deref_mut(),
            },
        ) {
            Err(e) if e.kind == DeviceErrorKind::Unsupported => {
                tracing::warn!(reason = %e.message, "cuDNN declined a convolution; im2col runs it");
            }
            done => return done,
        }
    }
    let F32Conv {
        input,
        weight,
        bias,
    } = f32_tensors(job)?;
    let s = job.shape;
    let (out_h, out_w) = s.out_size().expect("the job checked the output size");
    let (p, k, og) = (s.positions(), s.window(), s.group_out());
    let image_len = s.channels * s.height * s.width;
    let out_image = s.out_channels * p;
    let provider = MatmulProvider::for_device(dev);
    let d_weight = weights_on(job, dev, weight)?;
    let d_bias = bias.as_ref().map(|b| dev.upload(b)).transpose()?;
    let pass = MatmulPass {
        m: og,
        n: p,
        k,
        // W_g: og × k, groups og·k apart; cols_g: k × p, groups k·p apart.
        a: Strides {
            batch: og * k,
            row: k,
            col: 1,
        },
        b: Strides {
            batch: k * p,
            row: p,
            col: 1,
        },
        c_batch: 0,
        alpha: 1.0,
        beta: 0.0,
        batches: s.groups,
    };
    let dims = [
        s.channels,
        s.height,
        s.width,
        s.kernel_h,
        s.kernel_w,
        out_h,
        out_w,
        s.stride.0,
        s.stride.1,
        s.padding[0],
        s.padding[2],
        s.dilation.0,
        s.dilation.1,
    ]
    .map(|x| x as u64);
    let mut out = Vec::with_capacity(if ends.output.is_some() {
        0
    } else {
        s.out_len()
    });
    for n in 0..s.batch {
        dev.still_wanted()?;
        let (d_image, image_at) = ends.image(dev, input, (n, image_len))?;
        let mut cols = dev.alloc_zeros::<f32>(s.groups * k * p)?;
        let mut l = dev.launch("conv_im2col_f32")?;
        l.arg(&*d_image).arg(&image_at).arg(&mut cols);
        for x in &dims {
            l.arg(x);
        }
        // SAFETY: the buffer holds the image's C·H·W values from `image_at` on (checked in
        // `image`) and cols C·KH·KW·OH·OW (groups·k·p); the kernel reads inside the image
        // only where the window is off the padding.
        unsafe { l.launch(dev.launch_config(s.groups * k * p)) }?;
        let mut d_out = dev.alloc_zeros::<f32>(out_image)?;
        matmul_pass(
            dev,
            provider,
            Compute::F32,
            &pass,
            (PassOperand::F32(&d_weight), PassOperand::F32(&cols)),
            None,
            &mut d_out,
        )?;
        if d_bias.is_some() || job.relu {
            bias_relu(
                dev,
                &mut d_out,
                d_bias.as_ref(),
                &d_weight,
                s.out_channels,
                p,
                job.relu,
            )?;
        }
        ends.put(dev, &d_out, n * out_image, &mut out)?;
    }
    Ok(out)
}

/// The convolution on cuDNN, images in passes that fit the memory budget beside the
/// weights (and a kept output), then our bias and ReLU over each pass. cuDNN pads both
/// sides of an axis alike: other padding is `Unsupported`, for im2col.
fn conv2d_cudnn(
    job: &Conv2dJob,
    dev: &DeviceLease<'_>,
    mut ends: ConvEnds<'_>,
) -> Result<Vec<f32>, DeviceError> {
    let F32Conv {
        input,
        weight,
        bias,
    } = f32_tensors(job)?;
    let s = job.shape;
    let [top, bottom, left, right] = s.padding;
    if top != bottom || left != right {
        return Err(DeviceError::unsupported("cuDNN pads both sides alike"));
    }
    let out = s.out_size().expect("the job checked the output size");
    let p = out.0 * out.1;
    let image_len = s.channels * s.height * s.width;
    let out_len = s.out_channels * p;
    let d_weight = weights_on(job, dev, weight)?;
    // Each image's input, output and bias copy; the weights (and a kept output) held once.
    // Passes take at most half the budget: cuDNN's workspace has what they leave.
    let per_image = 4 * (image_len + out_len + s.out_channels);
    let fixed = 4 * weight.len() + ends.fixed_bytes();
    let budget = dev.memory_budget();
    let per_pass = ((budget / 2).saturating_sub(fixed) / per_image).clamp(1, s.batch.max(1));
    // The bias repeated for a full pass (a shorter last pass reads its first part), so
    // the pass's images run as one run of count·O channels.
    let repeated = bias.as_ref().map(|b| b.repeat(per_pass));
    let d_bias = repeated.as_deref().map(|b| dev.upload(b)).transpose()?;
    let mut values = Vec::with_capacity(if ends.output.is_some() {
        0
    } else {
        s.out_len()
    });
    let mut first = 0;
    while first < s.batch {
        dev.still_wanted()?;
        let count = per_pass.min(s.batch - first);
        let d_input = ends.images(dev, input, (first, count, image_len))?;
        let mut d_out = dev.alloc_zeros::<f32>(count * out_len)?;
        let geometry = ConvGeometry {
            batch: count,
            channels: s.channels,
            height: s.height,
            width: s.width,
            out_channels: s.out_channels,
            kernel: (s.kernel_h, s.kernel_w),
            out,
            stride: s.stride,
            padding: (top, left),
            dilation: s.dilation,
            groups: s.groups,
        };
        let held = fixed + count * per_image;
        dev.cudnn_conv2d(
            &geometry,
            &d_input,
            &d_weight,
            &mut d_out,
            budget.saturating_sub(held),
        )?;
        if d_bias.is_some() || job.relu {
            let channels = count * s.out_channels;
            bias_relu(
                dev,
                &mut d_out,
                d_bias.as_ref(),
                &d_weight,
                channels,
                p,
                job.relu,
            )?;
        }
        ends.put(dev, &d_out, first * out_len, &mut values)?;
        first += count;
    }
    Ok(values)
}

/// `conv_bias_relu_f32` over `channels × positions` outputs; without a bias, `stand_in`
/// is passed and never read.
fn bias_relu(
    dev: &DeviceLease<'_>,
    out: &mut DeviceBuffer<f32>,
    bias: Option<&DeviceBuffer<f32>>,
    stand_in: &DeviceBuffer<f32>,
    channels: usize,
    positions: usize,
    relu: bool,
) -> Result<(), DeviceError> {
    let (has_bias, relu) = (u32::from(bias.is_some()), u32::from(relu));
    let (c, p) = (channels as u64, positions as u64);
    let mut l = dev.launch("conv_bias_relu_f32")?;
    l.arg(out)
        .arg(bias.unwrap_or(stand_in))
        .arg(&c)
        .arg(&p)
        .arg(&has_bias)
        .arg(&relu);
    // SAFETY: the output holds channels·positions values, the bias `channels`.
    unsafe { l.launch(dev.launch_config(channels * positions)) }
}
