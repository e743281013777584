//! `GET /device/batch_hint`: the largest batch of a tensor operation that one pass of its
//! launcher holds in the memory the device would give the job now, and that one request
//! may carry under the server's limits.

use super::linalg::MAX_MATMUL_FLOPS;
use super::problem::{ErrorCode, Problem};
use super::{ApiQuery, AppState};
use crate::ops::beams::SweepJob;
use crate::ops::linalg::MatmulShape;
use crate::ops::nn::{AttentionShape, Conv2dShape};
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
    Conv2d,
    /// Lookups in a resident embedding table: the batch is the number of ids.
    #[serde(rename = "embedding_lookup")]
    EmbeddingLookup,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BatchHintQuery {
    #[param(inline)]
    pub op: HintOp,
    /// One batch item's shape, comma-separated. matmul: `M,N,K` (A, B and D batched, no
    /// C). attention: `H,S,D` (H_kv = H, S_kv = S, D_v = D) or `H,H_kv,S,S_kv,D,D_v`.
    /// beam_sweep: `N_T,N_R,K_T,K_R` (array elements and codebook beams; one channel).
    /// conv2d: `C,H,W,O,KH,KW` (stride 1, no padding, one group) or
    /// `C,H,W,O,KH,KW,STRIDE,PADDING,GROUPS` (one image, NCHW). embedding_lookup: `V,D`
    /// (the table's rows and dimension; one item is one id).
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
    /// memory; on the CPU, three times that (an allowance for the body's text and the
    /// decoded and working copies beside the values).
    pub bytes_per_item: u64,
    /// Bytes a job holds whatever its batch, taken from the budget first: conv2d's
    /// weights and one image's im2col matrix, a lookup's table on a device (0 for the
    /// other ops).
    pub fixed_bytes: u64,
    /// Items that fit the budget (0: not even one). conv2d's images go through a device
    /// one at a time, so there any batch fits once one image does, and the request
    /// limits decide.
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
            attention, 6; for beam_sweep, 4; for conv2d, 6 or 9; for embedding_lookup, 2) positive integers, \
            heads or groups that do not divide, a head dimension over 256, a kernel larger than its padded \
            image, or products of 2^48 or more"),
    ))]
pub async fn batch_hint(
    State(state): State<Arc<AppState>>,
    ApiQuery(q): ApiQuery<BatchHintQuery>,
) -> Result<Json<BatchHint>, Problem> {
    let shape = parse_shape(&q.shape, q.op)?;
    let max = state.settings.config.max_tensor_elements as u64;
    let item = item(q.op, &shape)?;
    let max_per_request = item
        .values
        .iter()
        .map(|&n| max / n.max(1))
        .chain([(MAX_MATMUL_FLOPS / item.flops.max(1.0)) as u64])
        .min()
        .unwrap_or(0);
    let (device, budget, bytes_per_item, fixed_bytes) = match state.backends.pick_gpu(item.op) {
        Some(gpu) => (
            gpu.label(),
            gpu.memory_budget() as u64,
            item.device_bytes,
            item.device_fixed,
        ),
        None => (
            "cpu".into(),
            mem_available() / 2,
            3 * item.device_bytes,
            item.host_fixed,
        ),
    };
    let room = budget.checked_sub(fixed_bytes);
    let fits = match room {
        None => 0,
        Some(_) if item.streams_on_device && device != "cpu" => max_per_request,
        Some(room) => room / bytes_per_item.max(1),
    };
    Ok(Json(BatchHint {
        op: q.op,
        shape,
        device,
        memory_budget_bytes: budget,
        bytes_per_item,
        fixed_bytes,
        fits,
        max_per_request,
        batch: fits.min(max_per_request),
    }))
}

/// Comma-separated positive integers whose product stays below 2^48 (so no byte count
/// below overflows; no request could carry an item that large anyway). conv2d's
/// PADDING, the 8th, may be 0 and stays out of the product.
fn parse_shape(text: &str, op: HintOp) -> Result<Vec<usize>, Problem> {
    let may_be_zero = |i: usize| matches!(op, HintOp::Conv2d) && i == 7;
    let dims = text
        .split(',')
        .enumerate()
        .map(|(i, d)| {
            d.trim()
                .parse::<usize>()
                .ok()
                .filter(|&d| d > 0 || may_be_zero(i))
        })
        .collect::<Option<Vec<_>>>();
    match dims {
        Some(dims)
            if dims
                .iter()
                .enumerate()
                .filter(|&(i, _)| !may_be_zero(i))
                .try_fold(1usize, |a, (_, &d)| a.checked_mul(d))
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

/// What one batch item of an op costs.
struct Item {
    /// The op's name, as the pool knows it.
    op: &'static str,
    /// One item's f32 inputs and outputs in device memory.
    device_bytes: u64,
    /// Held whatever the batch: on a device, and on the CPU.
    device_fixed: u64,
    host_fixed: u64,
    /// Each tensor's values per item (against --max-tensor-elements).
    values: Vec<u64>,
    /// One item's flops (0 for an op without a flop cap).
    flops: f64,
    /// The device launcher holds one item at a time (conv2d's images).
    streams_on_device: bool,
}

impl Item {
    fn new(op: &'static str, device_bytes: usize, values: Vec<usize>, flops: f64) -> Self {
        Self {
            op,
            device_bytes: device_bytes as u64,
            device_fixed: 0,
            host_fixed: 0,
            values: values.into_iter().map(|v| v as u64).collect(),
            flops,
            streams_on_device: false,
        }
    }
}

fn item(op: HintOp, shape: &[usize]) -> Result<Item, Problem> {
    let bad = |m: &str| Problem::at(ErrorCode::InvalidParameter, "/shape", m);
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
            let (entry, _) = s.device_bytes(false, false);
            Ok(Item::new(
                "matmul",
                entry,
                vec![m * k, k * n, m * n],
                s.flops(),
            ))
        }
        (HintOp::Matmul, _) => Err(bad("matmul takes M,N,K")),
        (HintOp::BeamSweep, &[nt, nr, kt, kr]) => Ok(Item::new(
            "beams_sweep",
            SweepJob::device_bytes_per_channel(nr, nt, kr, kt),
            vec![2 * nr * nt, kr * kt],
            // Sweeps have no flop cap (their deadline bounds them).
            0.0,
        )),
        (HintOp::Conv2d, dims) => conv2d_item(dims),
        (HintOp::EmbeddingLookup, &[vocab, dim]) => {
            let table = 4 * vocab as u64 * dim as u64;
            Ok(Item {
                // The table waits in the device's cache; on the CPU it is already in
                // memory (counted by the tables' own limits).
                device_fixed: table,
                ..Item::new("embeddings_lookup", 4 + 4 * dim, vec![1, dim], 0.0)
            })
        }
        (HintOp::EmbeddingLookup, _) => Err(bad("embedding_lookup takes V,D")),
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
            Ok(Item::new(
                "attention",
                s.device_bytes_per_sequence(false),
                vec![s.q_len(), s.k_len(), s.v_len(), s.out_len()],
                s.flops(),
            ))
        }
    }
}

/// One NCHW image of conv2d: its input and output per item; the weights and one image's
/// im2col matrix (C·KH·KW × OH·OW) held whatever the batch.
fn conv2d_item(dims: &[usize]) -> Result<Item, Problem> {
    let bad = |m: &str| Problem::at(ErrorCode::InvalidParameter, "/shape", m);
    let (c, h, w, o, kh, kw, stride, pad, groups) = match *dims {
        [c, h, w, o, kh, kw] => (c, h, w, o, kh, kw, 1, 0, 1),
        [c, h, w, o, kh, kw, s, p, g] => (c, h, w, o, kh, kw, s, p, g),
        _ => {
            return Err(bad(
                "conv2d takes C,H,W,O,KH,KW or C,H,W,O,KH,KW,STRIDE,PADDING,GROUPS",
            ))
        }
    };
    if c % groups != 0 || o % groups != 0 {
        return Err(bad("GROUPS must divide C and O"));
    }
    let s = Conv2dShape {
        batch: 1,
        channels: c,
        height: h,
        width: w,
        out_channels: o,
        kernel_h: kh,
        kernel_w: kw,
        stride: (stride, stride),
        padding: [pad; 4],
        dilation: (1, 1),
        groups,
    };
    let Some((oh, ow)) = s.out_size() else {
        return Err(bad("the kernel is larger than the padded image"));
    };
    // The padding is outside the 2^48 bound on the shape, so the output's size is not:
    // counted in u128, capped at u64::MAX (an item that large fits nowhere).
    let n = |dims: &[usize]| dims.iter().map(|&d| d as u128).product::<u128>();
    let bytes = |count: u128| (4 * count).min(u64::MAX as u128) as u64;
    let weights = n(&[o, s.group_in(), kh, kw]);
    let cols = n(&[c, kh, kw, oh, ow]);
    let (image, out) = (n(&[c, h, w]), n(&[o, oh, ow]));
    let fixed = bytes(weights + cols);
    Ok(Item {
        op: "conv2d",
        device_bytes: bytes(image + out),
        device_fixed: fixed,
        host_fixed: fixed,
        values: vec![
            image.min(u64::MAX as u128) as u64,
            out.min(u64::MAX as u128) as u64,
        ],
        // Conv2dShape::flops in f64 throughout (its usize product could overflow here).
        flops: 2.0 * out as f64 * (s.group_in() * kh * kw) as f64,
        streams_on_device: true,
    })
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
