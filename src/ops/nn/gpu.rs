//! Launchers for `kernels/nn.cu`; convolution's are `conv_launch`'s. Attention uploads
//! whole sequences (all heads of a batch entry) in passes that fit the device's memory
//! budget, sizes the key tile so that the fused kernel's shared memory fits 48 KiB, and
//! rounds the output to its dtype (a resident array's Q, K or V read whole in one pass is
//! kept in the device's cache: `resident_operand`). f16 and bf16 attention without
//! weights goes to the tensor cores' kernel where the device has it
//! (`attention::tensor_cores`).

use super::attention::{tensor_cores, Attended, AttentionJob, Tensors};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::device::DeviceBuffer;
use crate::backend::device::{Launch, LaunchConfig};
use crate::backend::{DeviceError, DeviceErrorKind, DeviceLease, Element};
use crate::ops::linalg::Values;
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
