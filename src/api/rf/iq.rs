//! `POST /rf/iq`: one sample's recordings, generated alone (no dataset job): every
//! receiver's IQ as `cf32_le` (with its SigMF metadata when asked) and the sample's truth.

use super::super::array_operands::ArrayScope;
use super::super::arrays::ArrayView;
use super::super::byte_strings::ByteStringOut;
use super::super::extract::ObjectOnly;
use super::super::kept_results::{self, Keep, KeepPlan};
use super::super::openapi::Binary;
use super::super::problem::{ErrorCode, Problem};
use super::super::{
    blocking, bulk, job_timeout, json_body, seed_or_drawn, AnswerForm, ApiBody, AppState,
};
use crate::arrays::Recording;
use crate::backend::BackendChoice;
use crate::datasets::sigmf;
use crate::ops::rf::generate::{
    samples_per_recording, Modulation, RxTruth, TxTruth, GENERATOR_VERSION,
};
use crate::ops::rf::recordings::{Recordings, RecordingsJob};
use crate::ops::rf::scenario::Scenario;
use crate::wire::Dtype;
use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// How each recording is returned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RecordingFormat {
    /// `iq` alone: interleaved little-endian f32 I/Q (`cf32_le`), base64.
    #[default]
    Cf32,
    /// `iq` as for `cf32`, and `sigmf_meta`: the recording's SigMF 1.2 `.sigmf-meta`
    /// document (its `core:sha512` is that of the decoded `iq`, the `.sigmf-data` file).
    Sigmf,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"seed": 7, "sample_index": 0, "format": "cf32",
    "config": {"signal": {"duration_ms": 5.0}, "chunk_ms": 5.0,
               "geometry": {"receivers_min": 2, "receivers_max": 2}}}))]
pub struct RfIqRequest {
    /// Every model parameter, each with its default: a dataset's `config`
    /// (docs/RF_DATASETS.md). Its receivers' recordings together are at most
    /// --max-elements complex samples.
    #[serde(default)]
    pub config: Scenario,
    /// The same seed, config and `sample_index` give the same recordings and truth, those
    /// a dataset of that seed and config holds for that generator index (its rows'
    /// `sample_index`). Drawn by the server when absent (and reported).
    #[schema(minimum = 0, maximum = 9223372036854775807_u64)]
    pub seed: Option<u64>,
    /// The generator's index of the sample, below 2^63 (as a dataset's `sample_index`
    /// column, a signed 64-bit integer).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 9223372036854775807_u64)]
    pub sample_index: u64,
    #[serde(default)]
    pub format: RecordingFormat,
    /// `auto` (the device from 2^20 complex samples, when one is in service), `cpu`, or
    /// `cuda`: the waveform and recordings by `rf_waveform` and `rf_receive`, each value
    /// within 1e-5 of the CPU recording's RMS; the truth is the CPU's either way.
    #[serde(default)]
    pub backend: BackendChoice,
    /// Keep each receiver's recording as a resident recording (`kept` in each receiver),
    /// for `/rf/features` to name as `{"array": id}`: all of them or, past a quota, none.
    #[schema(value_type = Option<Keep>)]
    pub keep: Option<ObjectOnly<Keep>>,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

/// The transmitter of the sample.
#[derive(Serialize, ToSchema)]
pub struct IqTransmitter {
    pub lat: f64,
    pub lon: f64,
    pub alt_m: f64,
    /// Transmit power after this sample's fluctuation, dBm.
    pub power_dbm: f64,
    pub modulation: Modulation,
    /// Whether it was placed inside the receivers' bounding box.
    pub inside: bool,
}

/// What one receiver heard, by construction.
#[derive(Serialize, ToSchema)]
pub struct IqReceiverTruth {
    pub lat: f64,
    pub lon: f64,
    pub alt_m: f64,
    /// East and north of the transmitter, m.
    pub east_m: f64,
    pub north_m: f64,
    pub distance_m: f64,
    /// Free-space, environment and terrain loss, dB.
    pub path_loss_db: f64,
    pub shadowing_db: f64,
    /// Mean received power before fast fading, dBm.
    pub received_power_dbm: f64,
    /// Rician K-factor, dB; `null` for Rayleigh fading.
    #[schema(value_type = Option<f64>, required)]
    pub k_factor_db: f64,
    pub carrier_offset_hz: f64,
    pub drift_hz_per_s: f64,
    /// Multipath taps of the channel.
    pub taps: usize,
    pub rms_delay_spread_us: f64,
    pub noise_floor_dbm: f64,
}

/// One receiver: its truth and its recording.
#[derive(Serialize, ToSchema)]
pub struct IqRecording {
    pub truth: IqReceiverTruth,
    /// `samples_per_recording` complex samples as interleaved little-endian f32 I/Q
    /// (`cf32_le`, 8 bytes each), base64; |I + jQ|² in milliwatts. In a bulk answer, a
    /// `cf32` buffer of shape `[samples_per_recording]`. Absent when `keep.with_data`
    /// was false.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub iq: Option<ByteStringOut>,
    /// With `format: sigmf`, the SigMF 1.2 metadata of `iq` (core fields, the receiver's
    /// position as `core:geolocation`, the truth under the `gpu_ops` extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub sigmf_meta: Option<serde_json::Value>,
    /// The resident recording this one was kept as, when the request asked to `keep`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<ArrayView>,
}

#[derive(Serialize, ToSchema)]
pub struct RfIqResponse {
    pub seed: u64,
    pub sample_index: u64,
    /// The generator's version: the same seed gives the same bits within one version.
    pub generator_version: u32,
    pub sample_rate_hz: f64,
    pub center_frequency_hz: f64,
    pub samples_per_recording: usize,
    pub transmitter: IqTransmitter,
    /// One per receiver of the sample, in order.
    pub receivers: Vec<IqRecording>,
}

#[utoipa::path(
    post, path = "/rf/iq", tag = "rf", operation_id = "rf_iq",
    summary = "Recordings of one synthetic sample",
    description = "Generates sample `sample_index` of the scenario `config` with `seed`, as a dataset job \
        would, without one: a transmitter placed and modulated, each receiver's channel (path loss, \
        shadowing, multipath, fading, oscillator offset and drift) and its noisy recording. Returns every \
        receiver's recording as base64 `cf32_le` with its truth, and with `format: sigmf` each recording's \
        SigMF metadata. No quality filter applies: every index has a sample.",
    request_body(content((RfIqRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The sample's recordings and truth", body = RfIqResponse),
        (status = 413, description = "payload_too_large: the receivers' recordings together exceed --max-elements (at /config/signal/duration_ms)"),
        (status = 422, description = "invalid_request, invalid_parameter (a config field by its path, seed, sample_index, timeout_ms, keep/name, keep/ttl_seconds), array_quota_exceeded (keep: nothing kept)"),
        (status = 503, description = "queue_full, shutting_down, device_unavailable (backend gpu without a device)"),
        (status = 507, description = "arrays_full (keep: nothing kept)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn rf_iq(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<RfIqRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let keep = kept_results::plan(req.keep.take().map(|k| k.0), &state, &arrays)?;
    req.config.validate().map_err(|e| e.under("config"))?;
    let seed = seed_or_drawn(req.seed, "/seed")?;
    if req.sample_index > i64::MAX as u64 {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/sample_index",
            "must be below 2^63",
        ));
    }
    let scenario = req.config.clone();
    let job = RecordingsJob {
        scenario: req.config,
        seed,
        sample_index: req.sample_index,
    };
    let max = state.settings.config.max_elements;
    if job.max_samples() > max {
        return Err(Problem::at(
            ErrorCode::PayloadTooLarge,
            "/config/signal/duration_ms",
            format!(
                "{} receivers × {} samples is more than the server's limit of {max} complex samples (--max-elements)",
                job.scenario.receiver_slots(),
                samples_per_recording(&job.scenario)
            ),
        ));
    }
    let done = state.pool.submit(job, req.backend, timeout).await?;
    let run = done.run;
    let (format, index) = (req.format, req.sample_index);
    blocking(move || {
        let body = response(done.output, &scenario, seed, index, format, keep)?;
        let hint = body.receivers.len() * (body.samples_per_recording * 32 / 3 + 1024);
        bulk::answer(form, &body, |b| json_body(b, hint), &run)
    })
    .await
}

fn response(
    out: Recordings,
    s: &Scenario,
    seed: u64,
    sample_index: u64,
    format: RecordingFormat,
    keep: Option<KeepPlan>,
) -> Result<RfIqResponse, Problem> {
    /// The truth as a dataset stores it, which the SigMF metadata reads.
    #[derive(Serialize)]
    struct Truth<'a> {
        sample_index: u64,
        tx: &'a TxTruth,
        receivers: &'a [RxTruth],
    }
    let truth = (format == RecordingFormat::Sigmf)
        .then(|| {
            serde_json::to_value(Truth {
                sample_index,
                tx: &out.tx,
                receivers: &out.receivers,
            })
        })
        .transpose()
        .map_err(Problem::internal)?;
    let mut receivers: Vec<IqRecording> = out
        .receivers
        .iter()
        // Each recording is freed once written as bytes, which are what the answer holds.
        .zip(out.iq)
        .enumerate()
        .map(|(r, (truth_rx, iq))| {
            let mut bytes = Vec::new();
            sigmf::cf32_le_into(&iq, &mut bytes);
            let sigmf_meta = truth.as_ref().map(|t| {
                let id = sigmf::RecordingId {
                    origin: sigmf::Origin::Generated,
                    seed,
                    sample_index,
                    receiver: r as u32,
                };
                sigmf::meta(&id, s, t, &bytes)
            });
            IqRecording {
                truth: receiver_truth(truth_rx),
                iq: Some(ByteStringOut {
                    dtype: Dtype::Cf32,
                    bytes: bytes.into(),
                }),
                sigmf_meta,
                kept: None,
            }
        })
        .collect();
    if let Some(plan) = keep {
        keep_recordings(plan, &mut receivers)?;
    }
    Ok(RfIqResponse {
        seed,
        sample_index,
        generator_version: GENERATOR_VERSION,
        sample_rate_hz: s.signal.sample_rate_hz,
        center_frequency_hz: s.propagation.frequency_mhz * 1e6,
        samples_per_recording: samples_per_recording(s),
        transmitter: transmitter(&out.tx),
        receivers,
    })
}

/// Keeps every receiver's recording (its answer's bytes, shared) and says so in its
/// entry; without `with_data` the entries lose their `iq`.
fn keep_recordings(plan: KeepPlan, receivers: &mut [IqRecording]) -> Result<(), Problem> {
    let with_data = plan.with_data;
    let recordings = receivers
        .iter()
        .map(|r| {
            let bytes =
                r.iq.as_ref()
                    .expect("every recording is answered")
                    .bytes
                    .clone();
            // A generated recording is finite; checked anyway, as every array is.
            Recording::from_le_bytes(bytes)
                .map(Arc::new)
                .map_err(Problem::internal)
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (r, view) in receivers.iter_mut().zip(plan.keep_recordings(recordings)?) {
        r.kept = Some(view);
        if !with_data {
            r.iq = None;
        }
    }
    Ok(())
}

fn transmitter(t: &TxTruth) -> IqTransmitter {
    IqTransmitter {
        lat: t.lat,
        lon: t.lon,
        alt_m: t.alt_m,
        power_dbm: t.power_dbm,
        modulation: t.modulation,
        inside: t.inside,
    }
}

fn receiver_truth(r: &RxTruth) -> IqReceiverTruth {
    IqReceiverTruth {
        lat: r.lat,
        lon: r.lon,
        alt_m: r.alt_m,
        east_m: r.east_m,
        north_m: r.north_m,
        distance_m: r.distance_m,
        path_loss_db: r.path_loss_db,
        shadowing_db: r.shadowing_db,
        received_power_dbm: r.received_power_dbm,
        k_factor_db: r.k_factor_db,
        carrier_offset_hz: r.carrier_offset_hz,
        drift_hz_per_s: r.drift_hz_per_s,
        taps: r.taps,
        rms_delay_spread_us: r.rms_delay_spread_us,
        noise_floor_dbm: r.noise_floor_dbm,
    }
}
