//! The rf domain's API: `POST /rf/features`, RF features of an uploaded IQ recording,
//! synchronously; and `POST /rf/iq` (`iq`), one synthetic sample's recordings.

mod iq;
pub(super) mod recording;

use super::array_operands::ArrayScope;
use super::float_arrays::BinaryEncoding;
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::{blocking, bulk, job_timeout, json_body, AnswerForm, ApiBody, AppState};
use crate::backend::BackendChoice;
use crate::ops::rf::{self, ExtractConfig, Extraction, Stats};
use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

const SAMPLE_RATE_RANGE: std::ops::RangeInclusive<f64> = 1e3..=1e9;
const CHUNK_MS_MAX: f64 = 60_000.0;

fn base64_text() -> BinaryEncoding {
    BinaryEncoding::Base64
}

fn default_chunk_ms() -> f64 {
    200.0
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"sample_rate_hz": 200000.0, "encoding": "base64", "iq": "AAAAPwAAAABxePM+ejcePr0bzz4YeZY+GHmWPr0bzz56Nx4+cXjzPmdnuaQAAAA/ejcevnF48z4YeZa+vRvPPr0bz74YeZY+cXjzvno3Hj4AAAC/Z2c5pXF48756Nx6+vRvPvhh5lr4YeZa+vRvPvno3Hr5xePO+ysnTpAAAAL96Nx4+cXjzvhh5lj69G8++vRvPPhh5lr5xePM+ejcevgAAAD9nZ7klcXjzPno3Hj69G88+GHmWPhh5lj69G88+ejcePnF48z5+fTAlAAAAP3o3Hr5xePM+GHmWvr0bzz69G8++GHmWPnF48756Nx4+AAAAv8rJUyVxePO+ejcevr0bz74YeZa+GHmWvr0bz756Nx6+cXjzvno6QiYAAAC/ejcePnF4874YeZY+vRvPvr0bzz4YeZa+cXjzPno3Hr4AAAA/Z2c5JnF48z56Nx4+vRvPPhh5lj4YeZY+vRvPPno3Hj5xePM+WNeeJQAAAD96Nx6+cXjzPhh5lr69G88+vRvPvhh5lj5xePO+ejcePgAAAL9+fbAlcXjzvno3Hr69G8++GHmWvhh5lr69G8++ejcevnF4877piLCmAAAAv3o3Hj5xePO+GHmWPr0bz769G88+GHmWvnF48z56Nx6+AAAAP8rJ06VxePM+ejcePr0bzz4YeZY+GHmWPr0bzz56Nx4+cXjzPghIDaYAAAA/ejcevnF48z4YeZa+vRvPPr0bz74YeZY+cXjzvno3Hj4AAAC/ejrCpnF48756Nx6+vRvPvhh5lr4YeZa+vRvPvno3Hr5xePO+w0P3JQAAAL96Nx4+cXjzvhh5lj69G8++vRvPPhh5lr5xePM+ejcevgAAAD9nZ7kmcXjzPno3Hj69G88+GHmWPhh5lj69G88+ejcePnF48z5399OlAAAAP3o3Hr5xePM+GHmWvr0bzz69G8++GHmWPnF48756Nx4+AAAAv1jXHiZxePO+ejcevr0bz74YeZa+GHmWvr0bz756Nx6+cXjzviqrsCUAAAC/ejcePnF4874YeZY+vRvPvr0bzz4YeZa+cXjzPno3Hr4AAAA/fn0wpnF48z56Nx4+vRvPPhh5lj4YeZY+vRvPPno3Hj5xePM+3l6NpQAAAD96Nx6+cXjzPhh5lr69G88+vRvPvhh5lj5xePO+ejcePgAAAL/piDAncXjzvno3Hr69G8++GHmWvhh5lr69G8++ejcevnF4875SQg0nAAAAv3o3Hj5xePO+GHmWPr0bz769G88+GHmWvnF48z56Nx6+AAAAP8rJU6ZxePM+ejcePr0bzz4YeZY+GHmWPr0bzz56Nx4+cXjzPoqMDaUAAAA/ejcevnF48z4YeZa+vRvPPg==", "chunk_ms": 0.64}))]
pub struct RfFeaturesRequest {
    /// Sample rate of the recording, Hz (1 kHz to 1 GHz).
    #[schema(minimum = 1000.0, maximum = 1000000000.0)]
    pub sample_rate_hz: f64,
    /// Interleaved little-endian f32 pairs I, Q (8 bytes per complex sample), base64;
    /// in the bulk form a `cf32` buffer of shape `[samples]`; or a resident recording
    /// (`POST /arrays` kind recording, or `/rf/iq`'s `keep`) as `{"array": id}`.
    /// |I + jQ|² is read as milliwatts: dBm figures are relative to that scale.
    /// At least 128 samples (1368 characters); at most --max-elements samples.
    #[schema(value_type = recording::FeaturesRecordingDoc)]
    pub iq: recording::RecordingIn,
    /// How `iq` is written when it is text: only `base64`, the default. A bulk body may
    /// keep it beside its buffer, which it does not describe.
    #[serde(default = "base64_text")]
    #[schema(default = "base64")]
    pub encoding: BinaryEncoding,
    /// Chunk length; features are computed per chunk and aggregated. A trailing part
    /// shorter than a chunk is left out (a recording shorter than one chunk is one chunk).
    /// At least 128 samples at `sample_rate_hz`.
    #[serde(default = "default_chunk_ms")]
    #[schema(default = 200.0, exclusive_minimum = 0.0, maximum = 60000.0)]
    pub chunk_ms: f64,
    /// Also return every chunk's features.
    #[serde(default)]
    pub per_chunk: bool,
    /// `auto` (the device for recordings of a million samples or more, when one is in
    /// service), `cpu`, or `cuda`: chunk sums on the device (`rf_chunk_reduce`), features
    /// derived on the CPU, within 1e-3 dB and 0.1 Hz of the CPU's. `cuda` takes Welch
    /// segments up to 4096 points (sample rates up to about 1.6 MHz); longer → 422.
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

macro_rules! feature_structs {
    ($($name:ident),* $(,)?) => {
        /// Each feature over the chunks: mean, population std, min, max. Formulas in
        /// docs/RF_FEATURES.md.
        #[derive(Serialize, ToSchema)]
        pub struct FeatureStats {
            $(pub $name: Stats,)*
        }

        /// One chunk's features; `null` where a value is not finite (as in `Stats`).
        #[derive(Serialize, ToSchema)]
        pub struct ChunkFeatureValues {
            $(#[schema(value_type = Option<f64>, required)] pub $name: f64,)*
        }

        impl FeatureStats {
            fn new(s: &[Stats]) -> Self {
                let mut it = s.iter().copied();
                Self { $($name: it.next().expect("one per feature"),)* }
            }
        }

        impl ChunkFeatureValues {
            fn new(v: &rf::features::ChunkFeatures) -> Self {
                let mut it = v.iter().copied();
                Self { $($name: it.next().expect("one per feature"),)* }
            }
        }

        #[cfg(test)]
        const STRUCT_FIELDS: &[&str] = &[$(stringify!($name)),*];
    };
}

feature_structs!(
    rssi_dbm,
    noise_floor_dbm,
    snr_db,
    frequency_offset_hz,
    bandwidth_hz,
    psd_dbm_per_hz,
    spectral_centroid_hz,
    spectral_rolloff_hz,
    envelope_mean,
    envelope_std,
    envelope_max,
    peak_to_avg_ratio_db,
    zero_crossing_rate,
    multipath_delay_spread_us,
    coherence_bandwidth_khz,
    delay_spread_confidence,
    confidence_score,
    signal_present,
);

#[derive(Serialize, ToSchema)]
pub struct RfFeaturesResponse {
    pub sample_rate_hz: f64,
    /// Complex samples received.
    pub samples: usize,
    /// Chunks the features were computed over, and their length in samples.
    pub chunks: usize,
    pub samples_per_chunk: usize,
    /// Welch PSD: FFT size and non-overlapping Hann segments per chunk.
    pub fft_size: usize,
    pub segments_per_chunk: usize,
    pub features: FeatureStats,
    /// With `per_chunk: true`, every chunk's features in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_chunk: Option<Vec<ChunkFeatureValues>>,
}

#[utoipa::path(
    post, path = "/rf/features", tag = "rf", operation_id = "rf_features",
    summary = "RF features of an IQ recording",
    description = "Splits the recording into `chunk_ms` chunks and computes per chunk: power (rssi_dbm), a noise \
        floor from the lower quartile of a Welch PSD, SNR, carrier offset and 99 % occupied bandwidth of the \
        detected signal, spectral centroid and roll-off, envelope statistics, zero-crossing rate, a \
        frequency-correlation estimate of coherence bandwidth and delay spread with its confidence, and \
        whether a signal is present (false-alarm rate 1e-3 per chunk on noise). Each is aggregated over \
        chunks as mean / std / min / max. Pure noise reads snr_db ≈ 0 and signal_present = 0.",
    request_body(content((RfFeaturesRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "Features", body = RfFeaturesResponse),
        (status = 413, description = "More samples than --max-elements"),
        (status = 422, description = "invalid_request, invalid_tensor (iq not base64, not whole f32 pairs, non-finite; a buffer not cf32 or not one-dimensional), invalid_parameter (sample rate, chunk, too short, backend), unknown_array, array_mismatch (iq/array names no recording)"),
        (status = 503, description = "queue_full, shutting_down, device_unavailable (backend gpu without a device)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn rf_features(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<RfFeaturesRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    req.iq.resolve(&arrays, "/iq")?;
    if !req.sample_rate_hz.is_finite() || !SAMPLE_RATE_RANGE.contains(&req.sample_rate_hz) {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/sample_rate_hz",
            "must be between 1e3 and 1e9 Hz",
        ));
    }
    if !req.chunk_ms.is_finite() || req.chunk_ms <= 0.0 || req.chunk_ms > CHUNK_MS_MAX {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/chunk_ms",
            format!("must be in (0, {CHUNK_MS_MAX}]"),
        ));
    }
    let max = state.settings.config.max_elements;
    let approx = req.iq.approx_samples();
    if approx > max {
        return Err(Problem::at(
            ErrorCode::PayloadTooLarge,
            "/iq",
            format!("{approx} samples is more than the server's limit of {max} (--max-elements)"),
        ));
    }
    let config = ExtractConfig {
        sample_rate_hz: req.sample_rate_hz,
        chunk_ms: req.chunk_ms,
    };
    let upload = req.iq;
    let iq = blocking(move || upload.decode("/iq").map(|r| r.samples())).await?;
    rf::features::plan(&config, iq.len()).map_err(Problem::from)?;
    let samples = iq.len();
    let job = rf::FeaturesJob { iq, config };
    let done = state.pool.submit(job, req.backend, timeout).await?;
    let ex = done.output.map_err(Problem::from)?;
    let body = response(&ex, req.sample_rate_hz, samples, req.per_chunk);
    // Features are a few numbers a chunk: a bulk answer carries them in its header.
    bulk::answer(form, &body, |b| json_body(b, 1024), &done.run)
}

fn response(ex: &Extraction, fs: f64, samples: usize, per_chunk: bool) -> RfFeaturesResponse {
    RfFeaturesResponse {
        sample_rate_hz: fs,
        samples,
        chunks: ex.chunks.len(),
        samples_per_chunk: ex.samples_per_chunk,
        fft_size: ex.segment_len,
        segments_per_chunk: ex.segments,
        features: FeatureStats::new(&ex.aggregate()),
        per_chunk: per_chunk.then(|| ex.chunks.iter().map(ChunkFeatureValues::new).collect()),
    }
}

/// The rf domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "rf",
    description: "RF signal features from IQ recordings",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(rf_features))
        .routes(routes!(iq::rf_iq))
}

#[cfg(test)]
mod tests {
    #[test]
    fn response_fields_follow_the_feature_names() {
        assert_eq!(
            super::STRUCT_FIELDS,
            crate::ops::rf::FEATURE_NAMES.as_slice()
        );
    }
}
