//! Launchers for `kernels/nn.cu`. Attention uploads whole sequences (all heads of a batch
//! entry) in passes that fit the device's memory budget, sizes the key tile so that the
//! fused kernel's shared memory fits 48 KiB, and rounds the output to its dtype.

use super::attention::{Attended, AttentionJob, Tensors};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::{DeviceError, DeviceErrorKind, DeviceLease};
use crate::ops::linalg::{Dtype, Values};
use cudarc::driver::LaunchConfig;

const KERNEL_NAMES: &[&str] = &["attention_f32", "attention_weights_f32"];

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
    let weights_per_entry = if job.weights { per_q * s.keys } else { 0 };
    let entry_bytes = 4 * (per_q * (d + dv + 1) + per_kv * (d + dv) + weights_per_entry) + 4;
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
        let blocks = tasks.min(dev.launch_config(tasks * THREADS as usize).grid_dim.0 as usize);
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
