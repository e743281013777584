//! Launchers for `kernels/nn.cu`. Convolution runs image by image: the windows
//! (`conv_im2col_f32`), one product per group on linalg's `matmul_f32`, then bias and
//! ReLU. Attention uploads whole sequences (all heads of a batch
//! entry) in passes that fit the device's memory budget, sizes the key tile so that the
//! fused kernel's shared memory fits 48 KiB, and rounds the output to its dtype (a
//! resident array's Q, K or V read whole in one pass is kept in the device's cache:
//! `resident_operand`). f16 and
//! bf16 attention without weights goes to the tensor cores' kernel where the device has
//! it (`attention::tensor_cores`).

use super::attention::{tensor_cores, Attended, AttentionJob, Tensors};
use super::conv2d::{Conv2dJob, ConvTensors};
use crate::backend::cuda::cudnn::{ConvGeometry, CONV2D_CUDNN_OP};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::DeviceBuffer;
use crate::backend::device::{Launch, LaunchConfig};
use crate::backend::{DeviceError, DeviceErrorKind, DeviceLease, Element};
use crate::ops::linalg::{matmul_pass, Compute, MatmulPass, MatmulProvider, Strides, Values};
use std::sync::Arc;

const KERNEL_NAMES: &[&str] = &[
    "attention_f32",
    "attention_weights_f32",
    "conv_im2col_f32",
    "conv_bias_relu_f32",
];

/// Query rows per block (kernels/nn.cu `ATT_QUERIES`) and the block's threads.
const QUERY_ROWS: usize = 16;
const THREADS: u32 = 128;
/// The softmax's pieces per query row (kernels/nn.cu `ATT_SOFTMAX_PARTS`).
const SOFTMAX_PARTS: usize = 8;
/// Shared memory any kernel may use without opting in.
const SHARED_LIMIT: usize = 48 * 1024;

pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "nn",
        source: include_str!("../../../kernels/nn.cu"),
        entry_points: KERNEL_NAMES.iter().map(|s| s.to_string()).collect(),
        // Attention and conv2d are held to tolerances: FMA is their speed.
        exact_floats: false,
        nvidia_only: false,
    }
}

/// The fused kernel's dynamic shared memory for a key tile of `tile` keys (their rows
/// padded by a word, against bank conflicts: kernels/nn.cu).
pub fn attention_shared_bytes(d: usize, dv: usize, tile: usize) -> usize {
    let tile_width = (d + 1).max(dv);
    4 * (QUERY_ROWS * d
        + tile * tile_width
        + QUERY_ROWS * tile
        + QUERY_ROWS * dv
        + 3 * QUERY_ROWS
        + QUERY_ROWS * SOFTMAX_PARTS)
}

/// The largest key tile (64, 32, 16 or 8 keys) whose shared memory fits; 8 always does
/// for head dimensions up to `MAX_HEAD_DIM`.
pub fn attention_key_tile(d: usize, dv: usize) -> usize {
    [64, 32, 16, 8]
        .into_iter()
        .find(|&t| attention_shared_bytes(d, dv, t) <= SHARED_LIMIT)
        .unwrap_or(8)
}

pub fn launch_attention(
    job: &AttentionJob,
    dev: &DeviceLease<'_>,
) -> Result<Attended, DeviceError> {
    if let Some(kernel) = tensor_cores::kernel_for(job).filter(|k| dev.has_kernel(k)) {
        return tensor_cores::launch(job, dev, kernel);
    }
    let Tensors::F32 { q, k, v } = &job.tensors else {
        return Err(DeviceError {
            kind: DeviceErrorKind::Unsupported,
            message: "f64 attention runs on the CPU only".into(),
        });
    };
    let s = job.shape;
    let (d, dv) = (s.head_dim, s.value_dim);
    let per_q = s.heads * s.queries;
    let per_kv = s.kv_heads * s.keys;
    let entry_bytes = s.device_bytes_per_sequence(job.weights);
    let per_pass = (dev.memory_budget() / entry_bytes.max(1)).clamp(1, s.batch.max(1));
    let tile = attention_key_tile(d, dv);
    let lengths: Vec<u32> = job.key_lengths.iter().map(|&l| l as u32).collect();
    let mut out = Vec::with_capacity(s.out_len());
    let mut weights = job.weights.then(|| Vec::with_capacity(s.weights_len()));
    let one_pass = per_pass >= s.batch;
    let whole = |x: &[f32], key: &Option<String>| {
        resident_operand(dev, key.as_deref(), one_pass, || dev.upload(x))
    };
    let [key_q, key_k, key_v] = &job.device_keys;
    let (q_all, k_all, v_all) = (whole(q, key_q)?, whole(k, key_k)?, whole(v, key_v)?);
    let mut first = 0;
    while first < s.batch {
        dev.still_wanted()?;
        let count = per_pass.min(s.batch - first);
        let part = |all: &Option<Arc<DeviceBuffer<f32>>>, x: &[f32], per: usize| {
            pass_part(all, || dev.upload(&x[first * per..(first + count) * per]))
        };
        let d_q = part(&q_all, q, per_q * d)?;
        let d_k = part(&k_all, k, per_kv * d)?;
        let d_v = part(&v_all, v, per_kv * dv)?;
        let d_len = dev.upload(&lengths[first..first + count])?;
        let mut d_out = dev.alloc_zeros::<f32>(count * per_q * dv)?;
        let mut d_lse = dev.alloc_zeros::<f32>(count * per_q)?;
        let scalars = AttentionScalars::of(job, count);
        let tile32 = tile as u32;
        let tasks = count * s.heads * s.queries.div_ceil(QUERY_ROWS);
        let config = block_per_task(dev, tasks, THREADS, attention_shared_bytes(d, dv, tile));
        let mut l = dev.launch("attention_f32")?;
        l.arg(d_q.as_ref())
            .arg(d_k.as_ref())
            .arg(d_v.as_ref())
            .arg(&d_len)
            .arg(&mut d_out)
            .arg(&mut d_lse);
        scalars.push(&mut l);
        l.arg(&tile32);
        // SAFETY: the pass's Q, K, V, lengths and outputs hold `count` batch entries of
        // the job's shape; the shared memory is what the kernel lays out for `tile`.
        unsafe { l.launch(config) }?;
        if let Some(all) = &mut weights {
            let total = count * per_q * s.keys;
            let mut d_w = dev.alloc_zeros::<f32>(total)?;
            let mut l = dev.launch("attention_weights_f32")?;
            l.arg(d_q.as_ref())
                .arg(d_k.as_ref())
                .arg(&d_len)
                .arg(&d_lse)
                .arg(&mut d_w)
                .arg(&scalars.batch)
                .arg(&scalars.heads)
                .arg(&scalars.kv_heads)
                .arg(&scalars.queries)
                .arg(&scalars.keys)
                .arg(&scalars.d)
                .arg(&scalars.causal)
                .arg(&scalars.scale);
            // SAFETY: as above; the weights hold count·H·S·S_kv values.
            unsafe { l.launch(dev.launch_config(total)) }?;
            all.extend(dev.download(&d_w)?);
        }
        out.extend(dev.download(&d_out)?);
        first += count;
    }
    job.output.round_all(&mut out);
    if let Some(w) = &mut weights {
        job.output.round_all(w);
    }
    Ok(Attended {
        output: Values::F32(out.into()),
        weights: weights.map(|w| Values::F32(w.into())),
    })
}

/// The scalars both attention kernels take after their buffers, in their order, for a
/// pass of `count` sequences: B, H, H_kv, S, S_kv, D, D_v, the mask and the scale.
pub(super) struct AttentionScalars {
    pub batch: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub queries: u64,
    pub keys: u64,
    pub d: u64,
    pub dv: u64,
    pub causal: u32,
    pub scale: f32,
}

impl AttentionScalars {
    pub fn of(job: &AttentionJob, count: usize) -> Self {
        let s = job.shape;
        AttentionScalars {
            batch: count as u64,
            heads: s.heads as u64,
            kv_heads: s.kv_heads as u64,
            queries: s.queries as u64,
            keys: s.keys as u64,
            d: s.head_dim as u64,
            dv: s.value_dim as u64,
            causal: u32::from(job.causal),
            scale: job.scale as f32,
        }
    }

    pub fn push<'a>(&'a self, l: &mut Launch<'a>) {
        l.arg(&self.batch)
            .arg(&self.heads)
            .arg(&self.kv_heads)
            .arg(&self.queries)
            .arg(&self.keys)
            .arg(&self.d)
            .arg(&self.dv)
            .arg(&self.causal)
            .arg(&self.scale);
    }
}

/// A resident operand's copy on the device (`AttentionJob::device_keys`): the cached one,
/// or `upload` cached under `key`, when the job reads it whole in one pass; `None` (the
/// pass uploads its part) otherwise.
pub(super) fn resident_operand<T: Element>(
    dev: &DeviceLease<'_>,
    key: Option<&str>,
    one_pass: bool,
    upload: impl FnOnce() -> Result<DeviceBuffer<T>, DeviceError>,
) -> Result<Option<Arc<DeviceBuffer<T>>>, DeviceError> {
    match key {
        Some(key) if one_pass => dev.cached_table(key, upload).map(Some),
        _ => Ok(None),
    }
}

/// A pass's part of an operand: its whole copy where `resident_operand` kept one, else
/// `upload`'s of the part.
pub(super) fn pass_part<T: Element>(
    all: &Option<Arc<DeviceBuffer<T>>>,
    upload: impl FnOnce() -> Result<DeviceBuffer<T>, DeviceError>,
) -> Result<Arc<DeviceBuffer<T>>, DeviceError> {
    match all {
        Some(all) => Ok(all.clone()),
        None => upload().map(Arc::new),
    }
}

/// One block of `threads` per task, up to the device's cap (`launch_config` counts blocks
/// of 256 threads, so it is asked for 256 per task), with `shared` bytes each.
pub(super) fn block_per_task(
    dev: &DeviceLease<'_>,
    tasks: usize,
    threads: u32,
    shared: usize,
) -> LaunchConfig {
    let blocks = tasks.min(dev.launch_config(tasks * 256).grid_dim.0 as usize);
    LaunchConfig {
        grid_dim: (blocks.max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared as u32,
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

pub(crate) fn run_conv2d_on(
    job: &Conv2dJob,
    dev: &DeviceLease<'_>,
    provider: ConvProvider,
) -> Result<Values, DeviceError> {
    if provider == ConvProvider::Cudnn {
        match run_conv2d_cudnn(job, dev) {
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
    let mut out = Vec::with_capacity(s.out_len());
    for image in input.chunks(image_len) {
        dev.still_wanted()?;
        let d_image = dev.upload(image)?;
        let mut cols = dev.alloc_zeros::<f32>(s.groups * k * p)?;
        let mut l = dev.launch("conv_im2col_f32")?;
        l.arg(&d_image).arg(&mut cols);
        for x in &dims {
            l.arg(x);
        }
        // SAFETY: the image holds C·H·W values and cols C·KH·KW·OH·OW (groups·k·p); the
        // kernel reads inside the image only where the window is off the padding.
        unsafe { l.launch(dev.launch_config(s.groups * k * p)) }?;
        let mut d_out = dev.alloc_zeros::<f32>(s.out_channels * p)?;
        matmul_pass(
            dev,
            provider,
            Compute::F32,
            &pass,
            &d_weight,
            &cols,
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
        out.extend(dev.download(&d_out)?);
    }
    job.output.round_all(&mut out);
    Ok(Values::F32(out.into()))
}

/// The convolution on cuDNN, images in passes that fit the memory budget beside the
/// weights, then our bias and ReLU over each pass. cuDNN pads both sides of an axis
/// alike: other padding is `Unsupported`, for im2col.
pub(crate) fn run_conv2d_cudnn(
    job: &Conv2dJob,
    dev: &DeviceLease<'_>,
) -> Result<Values, DeviceError> {
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
    // Each image's input, output and bias copy; the weights held once.
    let per_image = 4 * (image_len + out_len + s.out_channels);
    let per_pass = dev.items_per_pass(s.batch, per_image, 4 * weight.len());
    // The bias repeated for a full pass (a shorter last pass reads its first part), so
    // the pass's images run as one run of count·O channels.
    let repeated = bias.as_ref().map(|b| b.repeat(per_pass));
    let d_bias = repeated.as_deref().map(|b| dev.upload(b)).transpose()?;
    let mut values = Vec::with_capacity(s.out_len());
    let mut first = 0;
    while first < s.batch {
        dev.still_wanted()?;
        let count = per_pass.min(s.batch - first);
        let d_input = dev.upload(&input[first * image_len..(first + count) * image_len])?;
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
        dev.cudnn_conv2d(&geometry, &d_input, &d_weight, &mut d_out)?;
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
        values.extend(dev.download(&d_out)?);
        first += count;
    }
    job.output.round_all(&mut values);
    Ok(Values::F32(values.into()))
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
