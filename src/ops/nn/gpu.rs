//! Launchers for `kernels/nn.cu`. Convolution runs image by image: the windows
//! (`conv_im2col_f32`), one product per group on linalg's `matmul_f32`, then bias and
//! ReLU. Attention uploads whole sequences (all heads of a batch
//! entry) in passes that fit the device's memory budget, sizes the key tile so that the
//! fused kernel's shared memory fits 48 KiB, and rounds the output to its dtype.

use super::attention::{Attended, AttentionJob, Tensors};
use super::conv2d::{Conv2dJob, ConvTensors};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::{DeviceError, DeviceErrorKind, DeviceLease};
use crate::ops::linalg::{matmul_pass, Compute, Dtype, MatmulEngine, MatmulPass, Strides, Values};
use cudarc::driver::LaunchConfig;

const KERNEL_NAMES: &[&str] = &[
    "attention_f32",
    "attention_weights_f32",
    "conv_im2col_f32",
    "conv_bias_relu_f32",
];

/// Query rows per block (kernels/nn.cu `ATT_QUERIES`) and the block's threads.
const QUERY_ROWS: usize = 16;
const THREADS: u32 = 128;
/// Shared memory any kernel may use without opting in.
const SHARED_LIMIT: usize = 48 * 1024;

pub fn kernel_module() -> KernelModule {
    KernelModule {
        name: "nn",
        source: include_str!("../../../kernels/nn.cu"),
        entry_points: KERNEL_NAMES.iter().map(|s| s.to_string()).collect(),
    }
}

/// The fused kernel's dynamic shared memory for a key tile of `tile` keys.
pub fn attention_shared_bytes(d: usize, dv: usize, tile: usize) -> usize {
    4 * (QUERY_ROWS * d + tile * d.max(dv) + QUERY_ROWS * tile + QUERY_ROWS * dv + 3 * QUERY_ROWS)
}

/// The largest key tile (64, 32, 16 or 8 keys) whose shared memory fits; 8 always does
/// for head dimensions up to `MAX_HEAD_DIM`.
pub fn attention_key_tile(d: usize, dv: usize) -> usize {
    [64, 32, 16, 8]
        .into_iter()
        .find(|&t| attention_shared_bytes(d, dv, t) <= SHARED_LIMIT)
        .unwrap_or(8)
}

pub fn run_attention_cuda(
    job: &AttentionJob,
    dev: &DeviceLease<'_>,
) -> Result<Attended, DeviceError> {
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
    let mut first = 0;
    while first < s.batch {
        dev.still_wanted()?;
        let count = per_pass.min(s.batch - first);
        let part = |x: &[f32], per: usize| dev.upload(&x[first * per..(first + count) * per]);
        let d_q = part(q, per_q * d)?;
        let d_k = part(k, per_kv * d)?;
        let d_v = part(v, per_kv * dv)?;
        let d_len = dev.upload(&lengths[first..first + count])?;
        let mut d_out = dev.alloc_zeros::<f32>(count * per_q * dv)?;
        let mut d_lse = dev.alloc_zeros::<f32>(count * per_q)?;
        let (batch, heads, kv_heads) = (count as u64, s.heads as u64, s.kv_heads as u64);
        let (queries, keys) = (s.queries as u64, s.keys as u64);
        let (d64, dv64) = (d as u64, dv as u64);
        let causal = u32::from(job.causal);
        let scale = job.scale as f32;
        let tile32 = tile as u32;
        let tasks = count * s.heads * s.queries.div_ceil(QUERY_ROWS);
        // One block per task, up to the device's cap (launch_config counts blocks of 256
        // threads, so ask it for 256 per task).
        let blocks = tasks.min(dev.launch_config(tasks * 256).grid_dim.0 as usize);
        let config = LaunchConfig {
            grid_dim: (blocks.max(1) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: attention_shared_bytes(d, dv, tile) as u32,
        };
        let mut l = dev.launch("attention_f32")?;
        l.arg(&d_q)
            .arg(&d_k)
            .arg(&d_v)
            .arg(&d_len)
            .arg(&mut d_out)
            .arg(&mut d_lse)
            .arg(&batch)
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&queries)
            .arg(&keys)
            .arg(&d64)
            .arg(&dv64)
            .arg(&causal)
            .arg(&scale)
            .arg(&tile32);
        // SAFETY: the pass's Q, K, V, lengths and outputs hold `count` batch entries of
        // the job's shape; the shared memory is what the kernel lays out for `tile`.
        unsafe { l.launch(config) }?;
        if let Some(all) = &mut weights {
            let total = count * per_q * s.keys;
            let mut d_w = dev.alloc_zeros::<f32>(total)?;
            let mut l = dev.launch("attention_weights_f32")?;
            l.arg(&d_q)
                .arg(&d_k)
                .arg(&d_len)
                .arg(&d_lse)
                .arg(&mut d_w)
                .arg(&batch)
                .arg(&heads)
                .arg(&kv_heads)
                .arg(&queries)
                .arg(&keys)
                .arg(&d64)
                .arg(&causal)
                .arg(&scale);
            // SAFETY: as above; the weights hold count·H·S·S_kv values.
            unsafe { l.launch(dev.launch_config(total)) }?;
            all.extend(dev.download(&d_w)?);
        }
        out.extend(dev.download(&d_out)?);
        first += count;
    }
    let round = |x: &mut Vec<f32>| {
        if job.output != Dtype::F32 {
            x.iter_mut().for_each(|v| *v = job.output.round(*v));
        }
    };
    round(&mut out);
    if let Some(w) = &mut weights {
        round(w);
    }
    Ok(Attended {
        output: Values::F32(out),
        weights: weights.map(Values::F32),
    })
}

pub fn run_conv2d_cuda(job: &Conv2dJob, dev: &DeviceLease<'_>) -> Result<Values, DeviceError> {
    let ConvTensors::F32 {
        input,
        weight,
        bias,
    } = &job.tensors
    else {
        return Err(DeviceError {
            kind: DeviceErrorKind::Unsupported,
            message: "f64 conv2d runs on the CPU only".into(),
        });
    };
    let s = job.shape;
    let (out_h, out_w) = s.out_size().expect("the job checked the output size");
    let (p, k, og) = (s.positions(), s.window(), s.group_out());
    let image_len = s.channels * s.height * s.width;
    let engine = MatmulEngine::for_device(dev);
    let d_weight = dev.upload(weight)?;
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
    let (channels, positions) = (s.out_channels as u64, p as u64);
    let has_bias = u32::from(d_bias.is_some());
    let relu = u32::from(job.relu);
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
            engine,
            Compute::F32,
            &pass,
            &d_weight,
            &cols,
            None,
            &mut d_out,
        )?;
        if has_bias == 1 || relu == 1 {
            let mut l = dev.launch("conv_bias_relu_f32")?;
            // Without a bias the kernel never reads it; the weights stand in.
            l.arg(&mut d_out)
                .arg(d_bias.as_ref().unwrap_or(&d_weight))
                .arg(&channels)
                .arg(&positions)
                .arg(&has_bias)
                .arg(&relu);
            // SAFETY: the output holds O·p values, the bias O.
            unsafe { l.launch(dev.launch_config(s.out_channels * p)) }?;
        }
        out.extend(dev.download(&d_out)?);
    }
    if job.output != Dtype::F32 {
        for x in &mut out {
            *x = job.output.round(*x);
        }
    }
    Ok(Values::F32(out))
}
