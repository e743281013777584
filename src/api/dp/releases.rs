//! `/dp/privatize`, `/dp/laplace`, `/dp/gaussian`: releases, each charged to a budget
//! (when given) before it is computed, and refunded if the computation fails.

use super::{
    charge, noise_key, open_unit, positive, report, run_charged, sample_rate, PrivacyReport,
};
use crate::api::array_operands::ArrayScope;
use crate::api::auth::{tenant, Tenant};
use crate::api::float_arrays::{
    Decoded, Matrix, MatrixDoc, Vector, VectorDoc, VectorOut, VectorOutDoc,
};
use crate::api::openapi::Binary;
use crate::api::problem::{ErrorCode, Problem};
use crate::api::{blocking, bulk, job_timeout, json_body, AnswerForm, ApiBody, AppState};
use crate::backend::BackendChoice;
use crate::ops::dp::plan::{self, GaussianPlan};
use crate::ops::dp::{check_noise_multiplier, Clipping, Gradients, Mechanism, NoiseJob, SgdPlan};
use crate::store::Charge;
use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;
use utoipa::ToSchema;

// ------------------------------------------------------------------------- privatize

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Reduction {
    /// Divide the noised sum by `expected_batch_size`.
    #[default]
    Mean,
    Sum,
}

/// One layer for per-layer clipping: the next `columns` columns, clipped to `clip_norm`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LayerClip {
    #[schema(minimum = 1)]
    pub columns: usize,
    #[schema(exclusive_minimum = 0.0)]
    pub clip_norm: f64,
}

/// DP-SGD aggregation of per-example gradients.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"per_example_gradients": [[0.5, -1.0, 2.0], [3.0, 0.0, -4.0]],
    "clip_norm": 1.0, "noise_multiplier": 1.1, "expected_batch_size": 2}))]
pub struct PrivatizeRequest {
    /// `[B, D]`: one row per example. At most --max-tensor-elements values. Or
    /// `{"array": id}`, a resident tensor of rank 2 (answered as numbers).
    #[schema(value_type = MatrixDoc)]
    pub per_example_gradients: Matrix,
    /// Flat clipping: every example's whole gradient to this L2 norm. Give this or `layers`.
    #[schema(exclusive_minimum = 0.0)]
    pub clip_norm: Option<f64>,
    /// Per-layer clipping: consecutive column ranges covering all D columns, each with its
    /// own clip norm; the noise scales with the L2 norm of the clip norms.
    #[schema(min_items = 1)]
    pub layers: Option<Vec<LayerClip>>,
    /// σ: the noise standard deviation is σ × clip norm.
    #[schema(exclusive_minimum = 0.0)]
    pub noise_multiplier: f64,
    /// Divisor for `mean` (Opacus' expected batch size under Poisson sampling); default B.
    #[schema(exclusive_minimum = 0.0)]
    pub expected_batch_size: Option<f64>,
    #[serde(default)]
    pub reduction: Reduction,
    /// Charge this step to a privacy budget (needs `sample_rate`).
    pub budget_id: Option<String>,
    /// Poisson sampling rate q of the batch, for accounting; required with `budget_id`.
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub sample_rate: Option<f64>,
    /// Test servers only (--dp-allow-client-seed): a reproducible noise key.
    pub seed: Option<u64>,
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

/// What a DP-SGD step costs a budget: the subsampled Gaussian's RDP at the effective
/// noise multiplier, and the step's parameters for the budget's history.
fn privatize_charge(nm: f64, sgd: &SgdPlan, q: f64, rows: usize, cols: usize) -> Charge {
    let params = json!({"sample_rate": q, "noise_multiplier": nm,
        "effective_noise_multiplier": sgd.effective_noise_multiplier,
        "batch_size": rows, "dimensions": cols});
    Charge {
        kind: "privatize",
        params,
        rdp: Box::new(sgd.rdp(q)),
    }
}

impl From<Decoded> for Gradients {
    fn from(values: Decoded) -> Self {
        match values {
            Decoded::F32(v) => Gradients::F32(v),
            Decoded::F64(v) => Gradients::F64(v),
        }
    }
}

impl PrivatizeRequest {
    /// The sampling rate to account at: required with a budget, checked when given.
    fn accounted_sample_rate(&self) -> Result<Option<f64>, Problem> {
        let q = self
            .sample_rate
            .map(|q| sample_rate(q, "/sample_rate"))
            .transpose()?;
        if self.budget_id.is_some() && q.is_none() {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/sample_rate",
                "is required with budget_id: the accountant needs the batch's sampling rate",
            ));
        }
        Ok(q)
    }

    /// Flat or per-layer clipping: exactly one of `clip_norm` and `layers`.
    fn clipping(&self) -> Result<Clipping, Problem> {
        match (self.clip_norm, &self.layers) {
            (Some(c), None) => Ok(Clipping::Flat(c)),
            (None, Some(layers)) => Ok(Clipping::Layers(
                layers.iter().map(|l| (l.columns, l.clip_norm)).collect(),
            )),
            _ => Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/clip_norm",
                "give exactly one of clip_norm (flat clipping) or layers (per-layer clipping)",
            )),
        }
    }
}

/// How the noise was drawn.
#[derive(Serialize, ToSchema)]
pub struct NoiseInfo {
    /// `discrete_gaussian` or `discrete_laplace`.
    pub mechanism: &'static str,
    /// Standard deviation (Gaussian) or scale b (Laplace) of the noise actually added;
    /// never less than asked.
    pub scale: f64,
    /// Values are released on multiples of this power of two.
    pub grid: f64,
    /// The sensitivity including what snapping to the grid can add.
    pub sensitivity: f64,
}

impl NoiseInfo {
    fn gaussian(plan: &GaussianPlan, sensitivity: f64) -> Self {
        Self {
            mechanism: "discrete_gaussian",
            scale: plan.sigma(),
            grid: plan.grid,
            sensitivity,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct PrivatizeResponse {
    /// The noised (mean or sum) gradient, `[D]`, in the request's form and dtype.
    #[schema(value_type = VectorOutDoc)]
    pub gradient: VectorOut,
    /// Fraction of (example, layer) gradients whose norm exceeded the clip norm.
    pub fraction_clipped: f64,
    /// Mean and max L2 norm of the per-example gradients before clipping.
    pub mean_norm: f64,
    pub max_norm: f64,
    pub noise: NoiseInfo,
    /// σ after snapping: noise std / (clip norm + snapping); the accountant charges this.
    pub effective_noise_multiplier: f64,
    /// Present when `budget_id` was given.
    pub privacy: Option<PrivacyReport>,
}

#[utoipa::path(
    post, path = "/dp/privatize", tag = "dp", operation_id = "dp_privatize",
    summary = "Clip, sum and noise per-example gradients (DP-SGD)",
    description = "Per-example L2 clipping with factor min(1, C/(‖g‖+1e-6)) (per layer when `layers` is \
        given), column sums, then discrete Gaussian noise of std noise_multiplier × ‖C‖ on a power-of-two grid, \
        divided by `expected_batch_size` for `mean`. With `budget_id` the step is charged (RDP of the \
        subsampled Gaussian at `sample_rate`) and committed before the gradient is released.",
    request_body(content((PrivatizeRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The privatized gradient", body = PrivatizeResponse),
        (status = 403, description = "seed_not_allowed"),
        (status = 404, description = "budget_not_found"),
        (status = 409, description = "budget_exhausted: nothing was released"),
        (status = 503, description = "storage_unavailable: the budget database (--database-url) cannot be reached; nothing was released, retry after Retry-After"),
        (status = 413, description = "Too many values"),
        (status = 422, description = "invalid_request, invalid_parameter, invalid_tensor, unknown_array, array_mismatch"),
    ),
    security((), ("bearer" = []))
)]
pub async fn privatize(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<PrivatizeRequest>,
) -> Result<Response, Problem> {
    req.per_example_gradients
        .resolve(&arrays, "/per_example_gradients")?;
    let timeout = job_timeout(req.timeout_ms)?;
    check_noise_multiplier(req.noise_multiplier)?;
    let q = req.accounted_sample_rate()?;
    let ebs = req
        .expected_batch_size
        .map(|b| positive(b, "/expected_batch_size"))
        .transpose()?;
    let key = noise_key(&state, req.seed)?;
    let clipping = req.clipping()?;
    clipping.check()?;
    let (max, packed) = (
        state.settings.config.max_tensor_elements,
        req.per_example_gradients.packed_dtype(),
    );
    let grads = req.per_example_gradients;
    let (rows, cols, values) =
        blocking(move || grads.decode("/per_example_gradients", max)).await?;
    let sgd = SgdPlan::new(req.noise_multiplier, &clipping, rows, cols)?;
    let divisor = match req.reduction {
        Reduction::Mean => ebs.unwrap_or(rows as f64),
        Reduction::Sum => 1.0,
    };
    let (noise, sensitivity, effective_nm) =
        (sgd.noise, sgd.sensitivity, sgd.effective_noise_multiplier);
    let tenant = tenant(&who);
    let charged = match (&req.budget_id, q) {
        (Some(id), Some(q)) => {
            let cost = privatize_charge(req.noise_multiplier, &sgd, q, rows, cols);
            Some(charge(&state, &tenant, id, cost).await?)
        }
        _ => None,
    };
    let job = sgd.job(values.into(), rows, cols, divisor, key);
    let charge_ref = charged
        .as_ref()
        .map(|(b, seq)| (tenant.as_str(), b.id.as_str(), *seq));
    let done = run_charged(&state, job, req.backend, timeout, charge_ref).await?;
    let out = done.output;
    state
        .metrics
        .dp_noise_values
        .with_label_values(&["discrete_gaussian"])
        .inc_by(cols as u64);
    let body = PrivatizeResponse {
        gradient: VectorOut::new(out.gradient, packed),
        fraction_clipped: out.stats.fraction_clipped,
        mean_norm: out.stats.mean_norm,
        max_norm: out.stats.max_norm,
        noise: NoiseInfo::gaussian(&noise, sensitivity),
        effective_noise_multiplier: effective_nm,
        privacy: charged.map(|(b, seq)| report(&b, seq)),
    };
    answer(form, body, done.run).await
}

/// A release's answer in the form asked for, written off the runtime thread.
async fn answer(
    form: AnswerForm,
    body: impl Serialize + Send + 'static,
    run: crate::pool::RunInfo,
) -> Result<Response, Problem> {
    blocking(move || bulk::answer(form, &body, |b| json_body(b, 1024), &run)).await
}

// ------------------------------------------------------------------------ mechanisms

/// Release `values` with Laplace noise: ε-DP for L1 `sensitivity`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"values": [10.0, 20.5, 3.0], "sensitivity": 1.0, "epsilon": 0.5}))]
pub struct LaplaceRequest {
    /// At most --max-elements values. Or `{"array": id}`, a resident tensor of rank 1
    /// (answered as numbers).
    #[schema(value_type = VectorDoc)]
    pub values: Vector,
    /// L1 sensitivity of the whole vector.
    #[schema(exclusive_minimum = 0.0)]
    pub sensitivity: f64,
    #[schema(exclusive_minimum = 0.0)]
    pub epsilon: f64,
    pub budget_id: Option<String>,
    /// Test servers only (--dp-allow-client-seed).
    pub seed: Option<u64>,
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

/// Release `values` with Gaussian noise: (ε, δ)-DP for L2 `sensitivity`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"values": [10.0, 20.5, 3.0], "sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5}))]
pub struct GaussianRequest {
    /// At most --max-elements values. Or `{"array": id}`, a resident tensor of rank 1
    /// (answered as numbers).
    #[schema(value_type = VectorDoc)]
    pub values: Vector,
    /// L2 sensitivity of the whole vector.
    #[schema(exclusive_minimum = 0.0)]
    pub sensitivity: f64,
    #[schema(exclusive_minimum = 0.0)]
    pub epsilon: f64,
    #[schema(exclusive_minimum = 0.0, exclusive_maximum = 1.0)]
    pub delta: f64,
    pub budget_id: Option<String>,
    /// Test servers only (--dp-allow-client-seed).
    pub seed: Option<u64>,
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct MechanismResponse {
    /// The released values, in the request's form and dtype.
    #[schema(value_type = VectorOutDoc)]
    pub values: VectorOut,
    pub noise: NoiseInfo,
    /// The ε this release actually costs (at most the one asked).
    pub epsilon: f64,
    pub delta: Option<f64>,
    pub privacy: Option<PrivacyReport>,
}

struct Release {
    values: Vector,
    budget_id: Option<String>,
    seed: Option<u64>,
    backend: BackendChoice,
    timeout_ms: Option<u64>,
}

#[utoipa::path(
    post, path = "/dp/laplace", tag = "dp", operation_id = "dp_laplace",
    summary = "Release values with discrete Laplace noise (ε-DP)",
    description = "Values are snapped to a power-of-two grid and get exact discrete Laplace noise of scale \
        ≥ sensitivity/ε in grid steps (Canonne–Kamath–Steinke sampling from ChaCha20), so floating-point \
        attacks on textbook samplers do not apply. The grid's effect on sensitivity is accounted.",
    request_body(content((LaplaceRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "Released values", body = MechanismResponse),
        (status = 403, description = "seed_not_allowed"),
        (status = 404, description = "budget_not_found"),
        (status = 409, description = "budget_exhausted: nothing was released"),
        (status = 503, description = "storage_unavailable: the budget database (--database-url) cannot be reached; nothing was released, retry after Retry-After"),
        (status = 413, description = "Too many values"),
        (status = 422, description = "invalid_request, invalid_parameter, invalid_tensor, unknown_array, array_mismatch"),
    ),
    security((), ("bearer" = []))
)]
pub async fn laplace(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<LaplaceRequest>,
) -> Result<Response, Problem> {
    req.values.resolve(&arrays, "/values")?;
    let sensitivity = positive(req.sensitivity, "/sensitivity")?;
    let epsilon = positive(req.epsilon, "/epsilon")?;
    let r = Release {
        values: req.values,
        budget_id: req.budget_id,
        seed: req.seed,
        backend: req.backend,
        timeout_ms: req.timeout_ms,
    };
    release(state, who, r, form, move |n| {
        let cal = plan::calibrate_laplace(n, sensitivity, epsilon)?;
        let eps = cal.epsilon;
        Ok(Calibrated {
            mechanism: Mechanism::Laplace(cal.plan),
            noise: NoiseInfo {
                mechanism: "discrete_laplace",
                scale: cal.plan.scale(),
                grid: cal.plan.grid,
                sensitivity: cal.sensitivity,
            },
            epsilon: eps,
            delta: None,
            charge: Charge {
                kind: "laplace",
                params: json!({"epsilon": eps, "sensitivity": sensitivity, "values": n}),
                rdp: Box::new(cal.rdp()),
            },
        })
    })
    .await
}

#[utoipa::path(
    post, path = "/dp/gaussian", tag = "dp", operation_id = "dp_gaussian",
    summary = "Release values with discrete Gaussian noise ((ε, δ)-DP)",
    description = "σ is the least that makes the release (ε, δ)-DP by RDP (exact for the discrete Gaussian), \
        for the L2 sensitivity plus what snapping to the grid can add. Exact sampling as /dp/laplace.",
    request_body(content((GaussianRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "Released values", body = MechanismResponse),
        (status = 403, description = "seed_not_allowed"),
        (status = 404, description = "budget_not_found"),
        (status = 409, description = "budget_exhausted: nothing was released"),
        (status = 503, description = "storage_unavailable: the budget database (--database-url) cannot be reached; nothing was released, retry after Retry-After"),
        (status = 413, description = "Too many values"),
        (status = 422, description = "invalid_request, invalid_parameter, invalid_tensor, unknown_array, array_mismatch"),
    ),
    security((), ("bearer" = []))
)]
pub async fn gaussian(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<GaussianRequest>,
) -> Result<Response, Problem> {
    req.values.resolve(&arrays, "/values")?;
    let sensitivity = positive(req.sensitivity, "/sensitivity")?;
    let epsilon = positive(req.epsilon, "/epsilon")?;
    let delta = open_unit(req.delta, "/delta")?;
    let r = Release {
        values: req.values,
        budget_id: req.budget_id,
        seed: req.seed,
        backend: req.backend,
        timeout_ms: req.timeout_ms,
    };
    release(state, who, r, form, move |n| {
        let cal = plan::calibrate_gaussian(n, sensitivity, epsilon, delta)?;
        let (snapped, sigma) = (cal.sensitivity, cal.plan.sigma());
        Ok(Calibrated {
            mechanism: Mechanism::Gaussian(cal.plan),
            noise: NoiseInfo::gaussian(&cal.plan, snapped),
            epsilon: cal.epsilon,
            delta: Some(delta),
            charge: Charge {
                kind: "gaussian",
                params: json!({"epsilon": cal.epsilon, "delta": delta, "sigma": sigma, "sensitivity": snapped, "values": n}),
                rdp: Box::new(cal.rdp()),
            },
        })
    })
    .await
}

/// A release as calibrated for its number of values: the mechanism it draws from, what
/// the answer reports of its noise, the ε and δ it spends, and its charge to a budget.
struct Calibrated {
    mechanism: Mechanism,
    noise: NoiseInfo,
    epsilon: f64,
    delta: Option<f64>,
    charge: Charge,
}

async fn release(
    state: Arc<AppState>,
    who: Option<Extension<Tenant>>,
    r: Release,
    form: AnswerForm,
    calibrate: impl FnOnce(usize) -> Result<Calibrated, Problem> + Send + 'static,
) -> Result<Response, Problem> {
    let timeout = job_timeout(r.timeout_ms)?;
    let key = noise_key(&state, r.seed)?;
    let max = state.settings.config.max_elements;
    let packed = r.values.packed_dtype();
    let vals = r.values;
    // Decoding, calibration and the range check are CPU work: off the runtime.
    let (values, cal) = blocking(move || {
        let values = vals.decode("/values", max)?.into_f64();
        let cal = calibrate(values.len())?;
        cal.mechanism.check_values(&values)?;
        Ok((values, cal))
    })
    .await?;
    let Calibrated {
        mechanism,
        noise: info,
        epsilon,
        delta,
        charge: cost,
    } = cal;
    let tenant = tenant(&who);
    let charged = match &r.budget_id {
        Some(id) => Some(charge(&state, &tenant, id, cost).await?),
        None => None,
    };
    let n = values.len() as u64;
    let job = NoiseJob {
        values,
        mechanism,
        key,
    };
    let charge_ref = charged
        .as_ref()
        .map(|(b, seq)| (tenant.as_str(), b.id.as_str(), *seq));
    let done = run_charged(&state, job, r.backend, timeout, charge_ref).await?;
    let out = done.output;
    state
        .metrics
        .dp_noise_values
        .with_label_values(&[info.mechanism])
        .inc_by(n);
    let body = MechanismResponse {
        values: VectorOut::new(out, packed),
        noise: info,
        epsilon,
        delta,
        privacy: charged.map(|(b, seq)| report(&b, seq)),
    };
    answer(form, body, done.run).await
}
