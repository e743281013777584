//! `GET /device/batch_hint`: the largest batch of a tensor operation that one pass of its
//! launcher holds in the memory the device would give the job now, and that one request
//! may carry under the server's limits.

use super::linalg::MAX_MATMUL_FLOPS;
use super::problem::{ErrorCode, Problem};
use super::{ApiQuery, AppState};
use crate::ops::beams::SweepJob;
use crate::ops::linalg::MatmulShape;
use crate::ops::nn::AttentionShape;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

/// The operations a hint is given for: those whose launchers cut a batch into passes.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HintOp {
    Matmul,
    Attention,
    /// `beam_sweep` of uploaded channels.
    #[serde(rename = "beam_sweep")]
    BeamSweep,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BatchHintQuery {
    #[param(inline)]
    pub op: HintOp,
    /// One batch item's shape, comma-separated. matmul: `M,N,K` (A, B and D batched, no
    /// C). attention: `H,S,D` (H_kv = H, S_kv = S, D_v = D) or `H,H_kv,S,S_kv,D,D_v`.
    /// beam_sweep: `N_T,N_R,K_T,K_R` (array elements and codebook beams; one channel).
    #[param(example = "1024,1024,1024")]
    pub shape: String,
}

#[derive(Serialize, ToSchema)]
pub struct BatchHint {
    pub op: HintOp,
    pub shape: Vec<usize>,
    /// Where `auto` would run the op now: `cuda:N` (`emulated:N` for the emulated
    /// device), or `cpu` when no healthy device takes it.
    pub device: String,
    /// What one job may allocate there: on a device, --gpu-memory-limit-mib but never
    /// more than is free, or half the free memory; on the CPU, half of MemAvailable.
    pub memory_budget_bytes: u64,
    /// Bytes one batch item holds: on a device, its f32 inputs and outputs in device
    /// memory; on the CPU, three times that (decoded f64 values, the f32 working copy,
    /// the f64 answer before encoding).
    pub bytes_per_item: u64,
    /// Items that fit the budget (0: not even one).
    pub fits: u64,
    /// The most items one request may carry: every tensor within
    /// --max-tensor-elements and, for matmul and attention, the work within 2^40 flops.
    pub max_per_request: u64,
    /// min(fits, max_per_request): the batch to send.
    pub batch: u64,
}

#[utoipa::path(get, path = "/device/batch_hint", tag = "system", operation_id = "device_batch_hint",
    summary = "The largest batch of an operation that fits the device it would run on",
    params(BatchHintQuery),
    responses(
        (status = 200, body = BatchHint),
        (status = 422, description = "invalid_parameter: an unknown op, or a shape that is not 3 (or, for \
            attention, 6; for beam_sweep, 4) positive integers, heads that do not divide, a head dimension \
            over 256, or products of 2^48 or more"),
    ))]
pub async fn batch_hint(
    State(state): State<Arc<AppState>>,
    ApiQuery(q): ApiQuery<BatchHintQuery>,
) -> Result<Json<BatchHint>, Problem> {
    let shape = parse_shape(&q.shape)?;
    let max = state.settings.config.max_tensor_elements as u64;
    let (name, device_bytes, per_item_values, flops) = item(q.op, &shape)?;
    let max_per_request = per_item_values
        .iter()
        .map(|&n| max / n.max(1))
        .chain([(MAX_MATMUL_FLOPS / flops.max(1.0)) as u64])
        .min()
        .unwrap_or(0);
    let (device, budget, bytes_per_item) = match state.backends.pick_gpu(name) {
        Some(gpu) => (gpu.label(), gpu.memory_budget() as u64, device_bytes),
        None => ("cpu".into(), mem_available() / 2, 3 * device_bytes),
    };
    let fits = budget / bytes_per_item.max(1);
    Ok(Json(BatchHint {
        op: q.op,
        shape,
        device,
        memory_budget_bytes: budget,
        bytes_per_item,
        fits,
        max_per_request,
        batch: fits.min(max_per_request),
    }))
}

/// Comma-separated positive integers whose product stays below 2^48 (so no byte count
/// below overflows; no request could carry an item that large anyway).
fn parse_shape(text: &str) -> Result<Vec<usize>, Problem> {
    let dims = text
        .split(',')
        .map(|d| d.trim().parse::<usize>().ok().filter(|&d| d > 0))
        .collect::<Option<Vec<_>>>();
    match dims {
        Some(dims)
            if dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .is_some_and(|n| n < 1 << 48) =>
        {
            Ok(dims)
        }
        _ => Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/shape",
            "comma-separated positive integers whose product is below 2^48",
        )),
    }
}

/// The op's name (as the pool knows it), one item's device bytes, each tensor's values
/// per item, and one item's flops (0 for an op without a flop cap).
fn item(op: HintOp, shape: &[usize]) -> Result<(&'static str, u64, Vec<u64>, f64), Problem> {
    let bad = |m: &str| Problem::at(ErrorCode::InvalidParameter, "/shape", m);
    let big = |x: usize| x as u64;
    match (op, shape) {
        (HintOp::Matmul, &[m, n, k]) => {
            let s = MatmulShape {
                batch: 1,
                m,
                n,
                k,
                a_batched: true,
                b_batched: true,
                c_batched: false,
                trans_a: false,
                trans_b: false,
            };
            let (entry, _) = s.device_bytes(false);
            Ok((
                "matmul",
                big(entry),
                vec![big(m * k), big(k * n), big(m * n)],
                s.flops(),
            ))
        }
        (HintOp::Matmul, _) => Err(bad("matmul takes M,N,K")),
        (HintOp::BeamSweep, &[nt, nr, kt, kr]) => Ok((
            "beams_sweep",
            big(SweepJob::device_bytes_per_channel(nr, nt, kr, kt)),
            vec![big(2 * nr * nt), big(kr * kt)],
            // Sweeps have no flop cap (their deadline bounds them).
            0.0,
        )),
        (HintOp::BeamSweep, _) => Err(bad("beam_sweep takes N_T,N_R,K_T,K_R")),
        (HintOp::Attention, dims) => {
            let (heads, kv_heads, queries, keys, head_dim, value_dim) = match *dims {
                [h, s, d] => (h, h, s, s, d, d),
                [h, hk, s, sk, d, dv] => (h, hk, s, sk, d, dv),
                _ => return Err(bad("attention takes H,S,D or H,H_kv,S,S_kv,D,D_v")),
            };
            if heads % kv_heads != 0 {
                return Err(bad("H_kv must divide H"));
            }
            if head_dim.max(value_dim) > crate::ops::nn::MAX_HEAD_DIM {
                return Err(bad("head dimensions are at most 256"));
            }
            // The logits, H·S·S_kv, bound every count below (and, in the H,S,D form, are
            // not bounded by the shape's product).
            if [heads, queries, keys]
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .is_none_or(|n| n >= 1 << 48)
            {
                return Err(bad("H·S·S_kv must be below 2^48"));
            }
            let s = AttentionShape {
                batch: 1,
                heads,
                kv_heads,
                queries,
                keys,
                head_dim,
                value_dim,
            };
            Ok((
                "attention",
                big(s.device_bytes_per_sequence(false)),
                vec![
                    big(s.q_len()),
                    big(s.k_len()),
                    big(s.v_len()),
                    big(s.out_len()),
                ],
                s.flops(),
            ))
        }
    }
}

/// MemAvailable from /proc/meminfo, in bytes (0 where it cannot be read).
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .map_or(0, |kib| kib * 1024)
}
