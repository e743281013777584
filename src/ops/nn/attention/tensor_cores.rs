//! Attention on tensor cores (`kernels/nvidia/attention_mma.cu`) for f16 and bf16
//! inputs: Q, K and V travel in their own 16-bit form (half the bytes of the f32
//! kernel's), the output comes back in f32 and is rounded to its dtype. Chosen wherever
//! the device has the kernels (NVIDIA GPUs, sm_80 on, and the emulated device that
//! checks them in CI); elsewhere, and for jobs it does not take, `attention_f32` runs.

use super::super::gpu::{block_per_task, pass_part, resident_operand, AttentionScalars};
use super::{Attended, AttentionJob, Tensors};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::{DeviceBuffer, DeviceError, DeviceLease};
use crate::ops::linalg::{Dtype, Values};
use half::{bf16, f16};
use rayon::prelude::*;
use std::sync::Arc;

/// The largest D and D_v the kernels take (`MMA_MAX_DIM`: the output accumulators are
/// registers sized for it).
pub const MAX_DIM: usize = 128;
/// Query rows per block (`MMA_ROWS`), keys per tile (`MMA_KEYS`), the padding of each
/// shared row (`MMA_PAD`) and the block (`MMA_THREADS`).
const ROWS: usize = 64;
const KEYS: usize = 32;
const PAD: usize = 8;
const THREADS: u32 = 128;

pub fn tensor_core_module() -> KernelModule {
    KernelModule {
        name: "attention_mma",
        source: include_str!("../../../../kernels/nvidia/attention_mma.cu"),
        entry_points: vec!["attention_mma_f16".into(), "attention_mma_bf16".into()],
        exact_floats: false,
        nvidia_only: true,
    }
}

/// The tensor cores' kernel for `job`, if that path takes it: f16 or bf16 inputs, no
/// weights (their kernel recomputes logits from `attention_f32`'s log-sum-exps), and
/// head dimensions up to `MAX_DIM`. Whether it runs is then the device's: it must have
/// the kernel. The tolerance allows for it wherever it may run.
pub fn kernel_for(job: &AttentionJob) -> Option<&'static str> {
    let s = job.shape;
    if job.weights || s.head_dim > MAX_DIM || s.value_dim > MAX_DIM {
        return None;
    }
    match job.input {
        Dtype::F16 => Some("attention_mma_f16"),
        Dtype::Bf16 => Some("attention_mma_bf16"),
        Dtype::F32 | Dtype::F64 => None,
    }
}

/// The kernel's dynamic shared memory: Q's block and one tile of keys, then one of
/// values, 16 bits a value, rows padded (D and D_v up to a multiple of 16).
pub fn shared_bytes(d: usize, dv: usize) -> usize {
    let (dq, dw) = (d.div_ceil(16) * 16, dv.div_ceil(16) * 16);
    2 * ((ROWS + KEYS) * (dq + PAD) + KEYS * (dw + PAD))
}

/// Device bytes of one sequence (all its heads): 16-bit Q, K and V, the f32 output and
/// the key length.
fn bytes_per_sequence(job: &AttentionJob) -> usize {
    let s = job.shape;
    let (per_q, per_kv) = (s.heads * s.queries, s.kv_heads * s.keys);
    2 * (per_q * s.head_dim + per_kv * (s.head_dim + s.value_dim)) + 4 * per_q * s.value_dim + 4
}

/// The 16-bit patterns of values already rounded to `dtype` (exact: nothing rounds).
fn bits_of(values: &[f32], dtype: Dtype) -> Vec<u16> {
    let convert = |&x: &f32| match dtype {
        Dtype::Bf16 => bf16::from_f32(x).to_bits(),
        _ => f16::from_f32(x).to_bits(),
    };
    values
        .par_iter()
        .with_min_len(1 << 14)
        .map(convert)
        .collect()
}

/// Runs `kernel` (from `kernel_for`) for the job, whole sequences a pass within the
/// device's memory budget.
pub fn launch(
    job: &AttentionJob,
    dev: &DeviceLease<'_>,
    kernel: &'static str,
) -> Result<Attended, DeviceError> {
    let Tensors::F32 { q, k, v } = &job.tensors else {
        return Err(DeviceError::unsupported(
            "f64 attention runs on the CPU only",
        ));
    };
    let s = job.shape;
    let (d, dv) = (s.head_dim, s.value_dim);
    let (per_q, per_kv) = (s.heads * s.queries, s.kv_heads * s.keys);
    let per_pass = (dev.memory_budget() / bytes_per_sequence(job)).clamp(1, s.batch.max(1));
    let lengths: Vec<u32> = job.key_lengths.iter().map(|&l| l as u32).collect();
    let mut out = Vec::with_capacity(s.out_len());
    // A resident operand is kept in its 16-bit form, beside (not in place of) the f32
    // kernel's copy of the same array.
    let one_pass = per_pass >= s.batch;
    let whole = |x: &[f32], key: &Option<String>| {
        let key = key.as_ref().map(|k| format!("{k}/bits"));
        resident_operand(dev, key.as_deref(), one_pass, || {
            dev.upload(&bits_of(x, job.input))
        })
    };
    let [key_q, key_k, key_v] = &job.device_keys;
    let (q_all, k_all, v_all) = (whole(q, key_q)?, whole(k, key_k)?, whole(v, key_v)?);
    let mut first = 0;
    while first < s.batch {
        dev.still_wanted()?;
        let count = per_pass.min(s.batch - first);
        let part = |all: &Option<Arc<DeviceBuffer<u16>>>, x: &[f32], per: usize| {
            let range = first * per..(first + count) * per;
            pass_part(all, || dev.upload(&bits_of(&x[range], job.input)))
        };
        let d_q = part(&q_all, q, per_q * d)?;
        let d_k = part(&k_all, k, per_kv * d)?;
        let d_v = part(&v_all, v, per_kv * dv)?;
        let d_len = dev.upload(&lengths[first..first + count])?;
        let mut d_out = dev.alloc_zeros::<f32>(count * per_q * dv)?;
        let scalars = AttentionScalars::of(job, count);
        let tasks = count * s.heads * s.queries.div_ceil(ROWS);
        let config = block_per_task(dev, tasks, THREADS, shared_bytes(d, dv));
        let mut l = dev.launch(kernel)?;
        l.arg(d_q.as_ref())
            .arg(d_k.as_ref())
            .arg(d_v.as_ref())
            .arg(&d_len)
            .arg(&mut d_out);
        scalars.push(&mut l);
        // SAFETY: the pass's Q, K, V (16-bit), lengths and output hold `count` batch
        // entries of the job's shape; the shared memory is what the kernel lays out for
        // D and D_v, both at most MAX_DIM (`kernel_for`).
        unsafe { l.launch(config) }?;
        out.extend(dev.download(&d_out)?);
        first += count;
    }
    job.output.round_all(&mut out);
    Ok(Attended {
        output: Values::F32(out.into()),
        weights: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_heads_fit_the_shared_memory_every_device_gives() {
        assert_eq!(shared_bytes(MAX_DIM, MAX_DIM), 34_816);
        assert!(shared_bytes(MAX_DIM, MAX_DIM) <= 48 * 1024);
        // D and D_v round up to 16.
        assert_eq!(shared_bytes(1, 1), shared_bytes(16, 16));
        assert!(shared_bytes(17, 16) > shared_bytes(16, 16));
        assert!(shared_bytes(16, 17) > shared_bytes(16, 16));
    }

    #[test]
    fn bits_are_the_dtypes_own() {
        let x = [1.0f32, -2.5, 0.0, 65504.0];
        assert_eq!(bits_of(&x, Dtype::F16), [0x3c00, 0xc100, 0, 0x7bff]);
        assert_eq!(bits_of(&x[..3], Dtype::Bf16), [0x3f80, 0xc020, 0]);
    }
}
