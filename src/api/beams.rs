//! `/beams/channels` and `/beams/sweep`: geometric multipath channels, and the sweep of
//! beam codebooks over them.

use super::dense_tensors::{
    Dense3Doc, Dense3OutDoc, Dense4Doc, Dense4OutDoc, DenseIn, DenseOut, TensorDtype,
};
use super::domain_errors::pointer;
use super::embeddings::OutputEncoding;
use super::extract::ObjectOnly;
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::{blocking, bulk, job_timeout, json_body, seed_or_drawn, AnswerForm, ApiBody, AppState};
use crate::backend::BackendChoice;
use crate::ops::beams::geometry::PATH_WORDS;
use crate::ops::beams::sweep::MAX_CODEBOOK_VALUES;
use crate::ops::beams::{
    Array, ChannelSpec, Channels, ChannelsJob, Codebook, DrawnPath, MeasurementNoise, SweepJob,
};
use crate::ops::linalg::Dtype;
use crate::ops::FieldPath;
use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

/// Antennas half a wavelength apart on a grid; one row is a uniform linear array.
/// Element e = row·columns + column.
#[derive(Clone, Copy, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArrayGeometry {
    /// Default 1 (a linear array).
    #[serde(default = "one")]
    #[schema(default = 1, minimum = 1, maximum = 1024)]
    pub rows: usize,
    /// rows × columns at most 1024.
    #[schema(minimum = 1, maximum = 1024)]
    pub columns: usize,
}

fn one() -> usize {
    1
}

fn three() -> usize {
    3
}

impl ArrayGeometry {
    fn array(self, at: FieldPath) -> Result<Array, crate::ops::Invalid> {
        Array::new(self.rows, self.columns, at)
    }
}

/// Channels H = √(N_r·N_t/L)·Σ_l α_l·a_r(arrival_l)·a_t(departure_l)ᴴ with unit-norm
/// steering vectors and α_l ~ CN(0, 1): each departure and arrival uniform in the angle
/// ranges, drawn from the seed by channel index (channel `first_channel + b` is the same
/// whatever batch asks for it).
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"batch": 2, "tx_array": {"columns": 8}, "rx_array": {"columns": 4}, "paths": 2, "seed": 7}))]
pub struct ChannelModel {
    /// Channels in the batch.
    #[schema(minimum = 1)]
    pub batch: usize,
    #[schema(value_type = ArrayGeometry)]
    pub tx_array: ObjectOnly<ArrayGeometry>,
    #[schema(value_type = ArrayGeometry)]
    pub rx_array: ObjectOnly<ArrayGeometry>,
    /// Paths per channel, 1 to 64.
    #[serde(default = "three")]
    #[schema(default = 3, minimum = 1, maximum = 64)]
    pub paths: usize,
    /// [low, high] degrees, −90 ≤ low ≤ high ≤ 90; broadside is 0. Default [−90, 90].
    #[schema(min_items = 2, max_items = 2)]
    pub azimuth_deg: Option<[f64; 2]>,
    /// [low, high] degrees, −90 ≤ low ≤ high ≤ 90. Default [0, 0]: paths in the
    /// horizontal plane.
    #[schema(min_items = 2, max_items = 2)]
    pub elevation_deg: Option<[f64; 2]>,
    /// Below 2^63. Default: one from OS entropy, reported in the answer.
    #[schema(maximum = 9223372036854775807_u64)]
    pub seed: Option<u64>,
    /// The batch's first channel index in the seed's sequence, below 2^63.
    #[serde(default)]
    #[schema(default = 0, maximum = 9223372036854775807_u64)]
    pub first_channel: u64,
}

impl ChannelModel {
    /// The spec, checked, with its seed; paths under `at`.
    fn spec(&self, at: &FieldPath, max: usize) -> Result<(ChannelSpec, u64), Problem> {
        let tx = self.tx_array.0.array(at.field("tx_array"))?;
        let rx = self.rx_array.0.array(at.field("rx_array"))?;
        let complex = (self.batch as u64).saturating_mul((tx.elements() * rx.elements()) as u64);
        if self.batch == 0 {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                pointer(&at.field("batch")),
                "must be at least 1",
            ));
        }
        if complex.saturating_mul(2) > max as u64 {
            return Err(too_large(
                &pointer(&at.field("batch")),
                "channel values",
                complex.saturating_mul(2),
                max,
            ));
        }
        // The drawn paths are held too (PATH_WORDS each), whatever the arrays' size.
        let words = (self.batch as u64)
            .saturating_mul(self.paths as u64)
            .saturating_mul(PATH_WORDS as u64);
        if words > max as u64 {
            return Err(too_large(
                &pointer(&at.field("paths")),
                "path values",
                words,
                max,
            ));
        }
        let seed = seed_or_drawn(self.seed, &pointer(&at.field("seed")))?;
        if self.first_channel > MAX_FIRST_CHANNEL {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                pointer(&at.field("first_channel")),
                "must be below 2^63",
            ));
        }
        let [az_lo, az_hi] = self.azimuth_deg.unwrap_or([-90.0, 90.0]);
        let [el_lo, el_hi] = self.elevation_deg.unwrap_or([0.0, 0.0]);
        let spec = ChannelSpec {
            tx,
            rx,
            paths: self.paths,
            azimuth_deg: (az_lo, az_hi),
            elevation_deg: (el_lo, el_hi),
            seed,
            first: self.first_channel,
            count: self.batch,
        };
        spec.validate(at)?;
        Ok((spec, seed))
    }
}

/// Channel indices are below 2^63, as seeds are: int64 in the spec, as clients hold them.
const MAX_FIRST_CHANNEL: u64 = i64::MAX as u64;

fn too_large(path: &str, what: &str, values: u64, max: usize) -> Problem {
    Problem::at(
        ErrorCode::PayloadTooLarge,
        path,
        format!("{values} {what}; the server holds at most {max} (--max-tensor-elements)"),
    )
}

/// f32 or f64 answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BeamDtype {
    #[default]
    F32,
    F64,
}

impl From<BeamDtype> for Dtype {
    fn from(d: BeamDtype) -> Dtype {
        match d {
            BeamDtype::F32 => Dtype::F32,
            BeamDtype::F64 => Dtype::F64,
        }
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"model": {"batch": 2, "tx_array": {"columns": 8}, "rx_array": {"columns": 4}, "paths": 2, "seed": 7}}))]
pub struct ChannelsRequest {
    #[schema(value_type = ChannelModel)]
    pub model: ObjectOnly<ChannelModel>,
    /// Also answer each path's gain and angles (B·L·6 values, which the model's limit
    /// already keeps within --max-tensor-elements).
    #[serde(default)]
    #[schema(default = false)]
    pub return_paths: bool,
    #[serde(default)]
    pub out_dtype: BeamDtype,
    #[serde(default)]
    pub encoding: OutputEncoding,
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

/// The drawn paths, `[B, L, 2]` each.
#[derive(Serialize, ToSchema)]
pub struct DrawnPaths {
    /// α_l (re, im), before the 1/√L.
    #[schema(value_type = Dense3OutDoc)]
    pub gain: DenseOut,
    /// (azimuth, elevation) in degrees at the transmitter.
    #[schema(value_type = Dense3OutDoc)]
    pub departure_deg: DenseOut,
    /// (azimuth, elevation) in degrees at the receiver.
    #[schema(value_type = Dense3OutDoc)]
    pub arrival_deg: DenseOut,
}

impl DrawnPaths {
    fn new(drawn: &[DrawnPath], batch: usize, packed: bool) -> Self {
        let shape = vec![batch, drawn.len() / batch, 2];
        let pick = |f: fn(&DrawnPath) -> (f64, f64)| {
            let values: Vec<f64> = drawn.iter().flat_map(|p| <[f64; 2]>::from(f(p))).collect();
            DenseOut::new(shape.clone(), values, TensorDtype::F64, packed)
        };
        Self {
            gain: pick(|p| p.gain),
            departure_deg: pick(|p| p.departure_deg),
            arrival_deg: pick(|p| p.arrival_deg),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct ChannelsResponse {
    /// `[B, N_r, N_t, 2]`: (re, im) pairs, nested or packed in `dtype`.
    #[schema(value_type = Dense4OutDoc)]
    pub channels: DenseOut,
    pub shape: Vec<usize>,
    pub dtype: TensorDtype,
    /// The seed the channels came from (the given one, or the drawn one).
    pub seed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paths: Option<DrawnPaths>,
}

#[utoipa::path(
    post, path = "/beams/channels", tag = "beams", operation_id = "beam_channels",
    summary = "Geometric multipath channels",
    description = "A batch of channels between two half-wavelength arrays (linear or planar): L paths per \
        channel with uniform departure and arrival angles and CN(0, 1) gains, drawn from the seed by \
        channel index, so any batch split and either backend give the same channels. Formed in f64 and \
        rounded to `out_dtype`.",
    request_body(content((ChannelsRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The channels", body = ChannelsResponse),
        (status = 413, description = "The answer over --max-tensor-elements"),
        (status = 422, description = "invalid_parameter (arrays, paths, angle ranges, batch, first_channel)"),
        (status = 503, description = "queue_full, shutting_down, device_unavailable (backend gpu without a device)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn beam_channels(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    ApiBody(req): ApiBody<ChannelsRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let max = state.settings.config.max_tensor_elements;
    let (spec, seed) = req.model.0.spec(&FieldPath::root().field("model"), max)?;
    let output = Dtype::from(req.out_dtype);
    let job = blocking(move || Ok(ChannelsJob::new(spec, output)?)).await?;
    let (rx, tx, batch) = (
        job.spec.rx.elements(),
        job.spec.tx.elements(),
        job.spec.count,
    );
    let packed = req.encoding == OutputEncoding::Base64;
    let paths = req
        .return_paths
        .then(|| DrawnPaths::new(&job.drawn, batch, packed));
    let done = state.pool.submit(job, req.backend, timeout).await?;
    let shape = vec![batch, rx, tx, 2];
    let dtype = TensorDtype::from(output);
    let body = ChannelsResponse {
        channels: DenseOut::new(shape.clone(), done.output, dtype, packed),
        shape,
        dtype,
        seed,
        paths,
    };
    bulk::answer(
        form,
        &body,
        |body| json_body(body, body.channels.json_bytes_hint()),
        &done.run,
    )
}

/// A codebook: the array's DFT beams (the default, oversampling 1), or uploaded beams.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodebookSpec {
    /// DFT beams on the grid h = −1 + 2k/K per axis of more than one element, K =
    /// oversampling × elements on that axis; beam (k_row, k_column) is index
    /// k_row·K_columns + k_column. 1 to 8.
    #[schema(minimum = 1, maximum = 8)]
    pub oversampling: Option<usize>,
    /// `[K, N, 2]`: K beams (at most 4096, K·N at most 2^20) of the array's N elements,
    /// (re, im) pairs, applied as given (not normalised).
    #[schema(value_type = Option<Dense3Doc>)]
    pub beams: Option<DenseIn>,
}

impl CodebookSpec {
    fn build(self, array: Array, at: FieldPath, max: usize) -> Result<Codebook, Problem> {
        match (self.oversampling, self.beams) {
            (over, None) => Ok(Codebook::dft(array, over.unwrap_or(1), at)?),
            (None, Some(beams)) => {
                let pointer = pointer(&at.field("beams"));
                let n = array.elements();
                let t = beams.decode(&pointer, 3..=3, max.min(2 * MAX_CODEBOOK_VALUES))?;
                if t.shape[1..] != [n, 2] {
                    return Err(Problem::at(
                        ErrorCode::InvalidTensor,
                        pointer,
                        format!("shape {:?}, but the array's beams are [K, {n}, 2]", t.shape),
                    ));
                }
                Ok(Codebook::new(t.values.into_f64(), n, at.field("beams"))?)
            }
            (Some(_), Some(_)) => Err(Problem::at(
                ErrorCode::InvalidParameter,
                pointer(&at.field("oversampling")),
                "give oversampling (a DFT codebook) or beams, not both",
            )),
        }
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "model": {"batch": 2, "tx_array": {"columns": 8}, "rx_array": {"columns": 4}, "paths": 1, "seed": 7},
    "tx_codebook": {"oversampling": 2},
    "snr_db": 10,
    "noise_seed": 1
}))]
pub struct SweepRequest {
    /// Generate the channels (give this or `channels`).
    #[schema(value_type = Option<ChannelModel>)]
    pub model: Option<ObjectOnly<ChannelModel>>,
    /// Uploaded channels `[B, N_r, N_t, 2]`, (re, im) pairs (give this or `model`; with
    /// `tx_array` and `rx_array`).
    #[schema(value_type = Option<Dense4Doc>)]
    pub channels: Option<DenseIn>,
    /// The uploaded channels' arrays. Default: linear arrays of N_t and N_r elements.
    #[schema(value_type = Option<ArrayGeometry>)]
    pub tx_array: Option<ObjectOnly<ArrayGeometry>>,
    #[schema(value_type = Option<ArrayGeometry>)]
    pub rx_array: Option<ObjectOnly<ArrayGeometry>>,
    #[serde(default)]
    #[schema(value_type = CodebookSpec)]
    pub tx_codebook: ObjectOnly<CodebookSpec>,
    #[serde(default)]
    #[schema(value_type = CodebookSpec)]
    pub rx_codebook: ObjectOnly<CodebookSpec>,
    /// Measurement noise: w_rᴴ(H·f_t + n), n ~ CN(0, σ²I), σ² = 10^(−snr_db/10), −200 to
    /// 200. Default: none.
    #[schema(minimum = -200.0, maximum = 200.0)]
    pub snr_db: Option<f64>,
    /// The noise's seed, below 2^63. Default: one from OS entropy, reported in the answer.
    /// Channel b
    /// of the batch (first_channel + b when generated) draws from its own stream of it.
    #[schema(maximum = 9223372036854775807_u64)]
    pub noise_seed: Option<u64>,
    /// Also answer every pair's power `[B, K_r, K_t]`.
    #[serde(default)]
    #[schema(default = false)]
    pub return_grid: bool,
    #[serde(default)]
    pub out_dtype: BeamDtype,
    #[serde(default)]
    pub encoding: OutputEncoding,
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

/// Each channel's best pair.
#[derive(Serialize, ToSchema)]
pub struct BestPairs {
    /// Receive beam index per channel.
    pub rx: Vec<usize>,
    /// Transmit beam index per channel.
    pub tx: Vec<usize>,
    /// |w_rᴴ H f_t|² (with the noise), in `dtype`.
    pub power: Vec<f64>,
}

#[derive(Serialize, ToSchema)]
pub struct SweepResponse {
    pub best: BestPairs,
    /// `[B, K_r, K_t]` powers, with `return_grid`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Dense3OutDoc>)]
    pub grid: Option<DenseOut>,
    pub rx_beams: usize,
    pub tx_beams: usize,
    pub dtype: TensorDtype,
    /// The generated channels' seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The noise's seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub noise_seed: Option<u64>,
}

#[utoipa::path(
    post, path = "/beams/sweep", tag = "beams", operation_id = "beam_sweep",
    summary = "Beam sweep over a batch of channels",
    description = "The received power |w_rᴴ H f_t|² of every receive × transmit beam pair on each channel \
        (generated as /beams/channels does, or uploaded), with DFT or uploaded codebooks and optional \
        measurement noise at an SNR (counter-based, reproducible from its seed); each channel's best pair \
        (the lowest index on a tie) and optionally the whole grid. f64 arithmetic; powers rounded to \
        `out_dtype`.",
    request_body(content((SweepRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The best pairs (and the grid)", body = SweepResponse),
        (status = 413, description = "Channels or the power grid over --max-tensor-elements"),
        (status = 422, description = "invalid_tensor (channels or beams: shape, not finite), invalid_parameter \
            (model, arrays, codebooks, snr_db, both or neither of model and channels, powers that could overflow)"),
        (status = 503, description = "queue_full, shutting_down, device_unavailable (backend gpu without a device)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn beam_sweep(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: super::array_operands::ArrayScope,
    ApiBody(mut req): ApiBody<SweepRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    DenseIn::resolve_some(&mut req.channels, &arrays, "/channels")?;
    for (book, path) in [
        (&mut req.tx_codebook.0, "/tx_codebook/beams"),
        (&mut req.rx_codebook.0, "/rx_codebook/beams"),
    ] {
        DenseIn::resolve_some(&mut book.beams, &arrays, path)?;
    }
    let max = state.settings.config.max_tensor_elements;
    let (backend, encoding, out_dtype) = (req.backend, req.encoding, req.out_dtype);
    let (job, seed, noise_seed) = blocking(move || sweep_job(req, max)).await?;
    let (rx_beams, tx_beams) = (job.rx_book.beams, job.tx_book.beams);
    let done = state.pool.submit(job, backend, timeout).await?;
    let out = done.output;
    let batch = out.best.len();
    let dtype = TensorDtype::from(Dtype::from(out_dtype));
    let body = SweepResponse {
        best: BestPairs {
            rx: out.best.iter().map(|b| b.rx).collect(),
            tx: out.best.iter().map(|b| b.tx).collect(),
            power: out.best.iter().map(|b| b.power).collect(),
        },
        grid: out.grid.map(|g| {
            DenseOut::new(
                vec![batch, rx_beams, tx_beams],
                g,
                dtype,
                encoding == OutputEncoding::Base64,
            )
        }),
        rx_beams,
        tx_beams,
        dtype,
        seed,
        noise_seed,
    };
    bulk::answer(
        form,
        &body,
        |body| {
            json_body(
                body,
                body.grid.as_ref().map_or(1024, DenseOut::json_bytes_hint),
            )
        },
        &done.run,
    )
}

mod sweep_job;
use sweep_job::sweep_job;

/// The beams domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "beams",
    description: "Beam alignment: geometric multipath channels between antenna arrays, and sweeps of beam codebooks over them",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(beam_channels))
        .routes(routes!(beam_sweep))
}
