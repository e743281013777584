//! `/dp/*`: DP-SGD privatization, noise mechanisms, RDP accounting and privacy budgets.

use super::auth::{tenant, Tenant};
use super::problem::{ErrorCode, Problem};
use super::tensor::{Decoded, Matrix, MatrixDoc, Vector, VectorDoc, VectorOut};
use super::{blocking, job_response, job_timeout, ApiJson, ApiPath, ApiQuery, AppState, IdParam};
use crate::backend::BackendChoice;
use crate::backend::Job;
use crate::ops::dp::accountant::{self, MAX_ORDER};
use crate::ops::dp::plan::{self, GaussianPlan, MAX_SNAPPED};
use crate::ops::dp::{Gradients, Mechanism, NoiseJob, NoiseKey, PrivatizeJob};
use crate::pool::Completed;
use crate::store::{Budget, BudgetError, Charge, ChargeRecord, NewBudget};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

// ---------------------------------------------------------------- shared request parts

fn positive(v: f64, path: &str) -> Result<f64, Problem> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(Problem::at(
            ErrorCode::InvalidParameter,
            path,
            "must be a finite number greater than 0",
        ))
    }
}

fn open_unit(v: f64, path: &str) -> Result<f64, Problem> {
    if v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(Problem::at(
            ErrorCode::InvalidParameter,
            path,
            "must be strictly between 0 and 1",
        ))
    }
}

fn sample_rate(v: f64, path: &str) -> Result<f64, Problem> {
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(Problem::at(
            ErrorCode::InvalidParameter,
            path,
            "must be in (0, 1]",
        ))
    }
}

/// A fresh key from OS entropy; a client seed only on servers started for testing.
fn noise_key(state: &AppState, seed: Option<u64>) -> Result<NoiseKey, Problem> {
    match seed {
        None => NoiseKey::from_os().map_err(|e| Problem::new(ErrorCode::Internal, e)),
        Some(s) if state.settings.config.dp_allow_client_seed => Ok(NoiseKey::from_seed(s)),
        Some(_) => Err(Problem::at(
            ErrorCode::SeedNotAllowed,
            "/seed",
            "client seeds make the noise predictable; this server does not accept them \
             (only servers started with --dp-allow-client-seed do, for testing)",
        )),
    }
}

/// Where a budget stands after a charge.
#[derive(Serialize, ToSchema)]
pub struct PrivacyReport {
    pub budget_id: String,
    /// ε of everything charged so far, this release included.
    pub epsilon_spent: f64,
    pub epsilon_remaining: f64,
    pub epsilon_limit: f64,
    pub delta: f64,
    pub optimal_order: Option<f64>,
    /// This release's entry in the budget's history.
    pub charge_seq: u64,
}

/// Charges `charge` to the budget before anything is released.
async fn charge(
    state: &Arc<AppState>,
    tenant: &str,
    budget_id: &str,
    charge: Charge,
) -> Result<(Budget, u64), Problem> {
    let (store, t, id) = (
        state.store.clone(),
        tenant.to_string(),
        budget_id.to_string(),
    );
    let out = blocking(move || store.charge(&t, &id, &charge).map_err(Problem::from)).await;
    let outcome = match &out {
        Ok(_) => "charged",
        Err(p) if p.code == ErrorCode::BudgetExhausted => "exhausted",
        Err(_) => "failed",
    };
    state
        .metrics
        .dp_budget_charges
        .with_label_values(&[outcome])
        .inc();
    out
}

/// Runs the job; when it fails nothing was released, so a charge made for it is refunded.
async fn run_charged<J: Job>(
    state: &Arc<AppState>,
    job: J,
    backend: BackendChoice,
    timeout: Option<Duration>,
    charged: Option<(&str, &str, u64)>,
) -> Result<Completed<J::Output>, Problem> {
    match state.pool.submit(job, backend, timeout).await {
        Ok(done) => Ok(done),
        Err(e) => {
            if let Some((tenant, id, seq)) = charged {
                let (store, t, bid) = (state.store.clone(), tenant.to_string(), id.to_string());
                match blocking(move || store.refund(&t, &bid, seq).map_err(Problem::from)).await {
                    Ok(_) => state
                        .metrics
                        .dp_budget_charges
                        .with_label_values(&["refunded"])
                        .inc(),
                    Err(r) => {
                        tracing::error!(budget = %id, seq, error = %r.detail, "refund failed; the charge stands")
                    }
                }
            }
            Err(e.into())
        }
    }
}

fn report(b: &Budget, seq: u64) -> PrivacyReport {
    PrivacyReport {
        budget_id: b.id.clone(),
        epsilon_spent: b.epsilon_spent,
        epsilon_remaining: (b.epsilon_limit - b.epsilon_spent).max(0.0),
        epsilon_limit: b.epsilon_limit,
        delta: b.delta,
        optimal_order: b.optimal_order,
        charge_seq: seq,
    }
}

async fn encode(body: impl Serialize + Send + 'static) -> Result<Vec<u8>, Problem> {
    blocking(move || {
        serde_json::to_vec(&body).map_err(|e| Problem::new(ErrorCode::Internal, e.to_string()))
    })
    .await
}

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
    /// `[B, D]`: one row per example. At most --max-tensor-elements values.
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

#[derive(Serialize, ToSchema)]
pub struct PrivatizeResponse {
    /// The noised (mean or sum) gradient, `[D]`, in the request's form and dtype.
    #[schema(value_type = VectorDoc)]
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
    request_body = PrivatizeRequest,
    responses(
        (status = 200, description = "The privatized gradient", body = PrivatizeResponse),
        (status = 403, description = "seed_not_allowed"),
        (status = 404, description = "budget_not_found"),
        (status = 409, description = "budget_exhausted: nothing was released"),
        (status = 413, description = "Too many values"),
        (status = 422, description = "invalid_request, invalid_parameter, invalid_tensor"),
    ),
    security((), ("bearer" = []))
)]
pub async fn privatize(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiJson(req): ApiJson<PrivatizeRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let nm = positive(req.noise_multiplier, "/noise_multiplier")?;
    let q = req
        .sample_rate
        .map(|q| sample_rate(q, "/sample_rate"))
        .transpose()?;
    if req.budget_id.is_some() && q.is_none() {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/sample_rate",
            "is required with budget_id: the accountant needs the batch's sampling rate",
        ));
    }
    let ebs = req
        .expected_batch_size
        .map(|b| positive(b, "/expected_batch_size"))
        .transpose()?;
    let key = noise_key(&state, req.seed)?;
    let clip = match (&req.clip_norm, &req.layers) {
        (Some(c), None) => vec![(None, positive(*c, "/clip_norm")?)],
        (None, Some(layers)) if !layers.is_empty() => layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                if l.columns == 0 {
                    return Err(Problem::at(
                        ErrorCode::InvalidParameter,
                        format!("/layers/{i}/columns"),
                        "must be at least 1",
                    ));
                }
                Ok((
                    Some(l.columns),
                    positive(l.clip_norm, &format!("/layers/{i}/clip_norm"))?,
                ))
            })
            .collect::<Result<Vec<_>, _>>()?,
        (None, Some(_)) => {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/layers",
                "must not be empty",
            ))
        }
        _ => {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/clip_norm",
                "give exactly one of clip_norm (flat clipping) or layers (per-layer clipping)",
            ))
        }
    };
    let max = state.settings.config.max_tensor_elements;
    let (reduction, backend) = (req.reduction, req.backend);
    let packed = match &req.per_example_gradients {
        Matrix::Packed(p) => Some(p.dtype),
        Matrix::Nested(_) => None,
    };
    let grads = req.per_example_gradients;
    let (rows, cols, values) =
        blocking(move || grads.decode("/per_example_gradients", max)).await?;

    let mut bounds = vec![0u64];
    for (cols_in_layer, _) in &clip {
        let end = bounds.last().unwrap() + cols_in_layer.unwrap_or(cols) as u64;
        bounds.push(end);
    }
    if *bounds.last().unwrap() != cols as u64 {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/layers",
            format!(
                "the layers cover {} columns but the gradients have {cols}",
                bounds.last().unwrap()
            ),
        ));
    }
    let clip_norms: Vec<f64> = clip.iter().map(|c| c.1).collect();
    let clip_total = clip_norms.iter().map(|c| c * c).sum::<f64>().sqrt();
    let root_d = (cols as f64).sqrt();
    let plan = GaussianPlan::new(nm * clip_total, clip_total * plan::GRID_SLACK / root_d)
        .map_err(|m| Problem::at(ErrorCode::InvalidParameter, "/noise_multiplier", m))?;
    let max_clip = clip_norms.iter().copied().fold(0.0, f64::max);
    if rows as f64 * max_clip / plan.grid >= MAX_SNAPPED {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/noise_multiplier",
            "too small for this batch: the clipped sum would not fit the noise grid",
        ));
    }
    let sensitivity = clip_total + root_d * plan.grid;
    let effective_nm = plan.sigma() / sensitivity;
    let divisor = match reduction {
        Reduction::Mean => ebs.unwrap_or(rows as f64),
        Reduction::Sum => 1.0,
    };

    let tenant = tenant(&who);
    let charged = match (&req.budget_id, q) {
        (Some(id), Some(q)) => Some(
            charge(&state, &tenant, id, Charge {
                kind: "privatize",
                params: json!({"sample_rate": q, "noise_multiplier": nm, "effective_noise_multiplier": effective_nm,
                    "batch_size": rows, "dimensions": cols}),
                rdp: Box::new(move |orders| {
                    orders.iter().map(|&a| accountant::sampled_gaussian_rdp_capped(q, effective_nm, a)).collect()
                }),
            })
            .await?,
        ),
        _ => None,
    };
    let gradients = match values {
        Decoded::F32(v) => Gradients::F32(v),
        Decoded::F64(v) => Gradients::F64(v),
    };
    let job = PrivatizeJob {
        gradients,
        rows,
        cols,
        bounds,
        clip_norms,
        plan,
        divisor,
        key,
    };
    let charge_ref = charged
        .as_ref()
        .map(|(b, seq)| (tenant.as_str(), b.id.as_str(), *seq));
    let done = run_charged(&state, job, backend, timeout, charge_ref).await?;
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
        noise: NoiseInfo {
            mechanism: "discrete_gaussian",
            scale: plan.sigma(),
            grid: plan.grid,
            sensitivity,
        },
        effective_noise_multiplier: effective_nm,
        privacy: charged.map(|(b, seq)| report(&b, seq)),
    };
    Ok(job_response(encode(body).await?, &done.run))
}

// ------------------------------------------------------------------------ mechanisms

/// Release `values` with Laplace noise: ε-DP for L1 `sensitivity`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"values": [10.0, 20.5, 3.0], "sensitivity": 1.0, "epsilon": 0.5}))]
pub struct LaplaceRequest {
    /// At most --max-elements values.
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
    /// At most --max-elements values.
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
    #[schema(value_type = VectorDoc)]
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
    request_body = LaplaceRequest,
    responses(
        (status = 200, description = "Released values", body = MechanismResponse),
        (status = 403, description = "seed_not_allowed"),
        (status = 404, description = "budget_not_found"),
        (status = 409, description = "budget_exhausted: nothing was released"),
        (status = 413, description = "Too many values"),
        (status = 422, description = "invalid_request, invalid_parameter, invalid_tensor"),
    ),
    security((), ("bearer" = []))
)]
pub async fn laplace(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiJson(req): ApiJson<LaplaceRequest>,
) -> Result<Response, Problem> {
    let sensitivity = positive(req.sensitivity, "/sensitivity")?;
    let epsilon = positive(req.epsilon, "/epsilon")?;
    let r = Release {
        values: req.values,
        budget_id: req.budget_id,
        seed: req.seed,
        backend: req.backend,
        timeout_ms: req.timeout_ms,
    };
    release(state, who, r, move |n| {
        let cal = plan::calibrate_laplace(n, sensitivity, epsilon)
            .map_err(|m| Problem::at(ErrorCode::InvalidParameter, "/epsilon", m))?;
        let eps = cal.epsilon;
        Ok((
            Mechanism::Laplace(cal.plan),
            NoiseInfo {
                mechanism: "discrete_laplace",
                scale: cal.plan.scale(),
                grid: cal.plan.grid,
                sensitivity: cal.sensitivity,
            },
            eps,
            None,
            Charge {
                kind: "laplace",
                params: json!({"epsilon": eps, "sensitivity": sensitivity, "values": n}),
                rdp: Box::new(move |orders| {
                    orders
                        .iter()
                        .map(|&a| accountant::pure_dp_rdp(a, eps))
                        .collect()
                }),
            },
        ))
    })
    .await
}

#[utoipa::path(
    post, path = "/dp/gaussian", tag = "dp", operation_id = "dp_gaussian",
    summary = "Release values with discrete Gaussian noise ((ε, δ)-DP)",
    description = "σ is the least that makes the release (ε, δ)-DP by RDP (exact for the discrete Gaussian), \
        for the L2 sensitivity plus what snapping to the grid can add. Exact sampling as /dp/laplace.",
    request_body = GaussianRequest,
    responses(
        (status = 200, description = "Released values", body = MechanismResponse),
        (status = 403, description = "seed_not_allowed"),
        (status = 404, description = "budget_not_found"),
        (status = 409, description = "budget_exhausted: nothing was released"),
        (status = 413, description = "Too many values"),
        (status = 422, description = "invalid_request, invalid_parameter, invalid_tensor"),
    ),
    security((), ("bearer" = []))
)]
pub async fn gaussian(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiJson(req): ApiJson<GaussianRequest>,
) -> Result<Response, Problem> {
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
    release(state, who, r, move |n| {
        let cal = plan::calibrate_gaussian(n, sensitivity, epsilon, delta)
            .map_err(|m| Problem::at(ErrorCode::InvalidParameter, "/epsilon", m))?;
        let (snapped, sigma) = (cal.sensitivity, cal.plan.sigma());
        Ok((
            Mechanism::Gaussian(cal.plan),
            NoiseInfo { mechanism: "discrete_gaussian", scale: sigma, grid: cal.plan.grid, sensitivity: snapped },
            cal.epsilon,
            Some(delta),
            Charge {
                kind: "gaussian",
                params: json!({"epsilon": cal.epsilon, "delta": delta, "sigma": sigma, "sensitivity": snapped, "values": n}),
                rdp: Box::new(move |orders| orders.iter().map(|&a| accountant::gaussian_rdp(a, snapped, sigma)).collect()),
            },
        ))
    })
    .await
}

type Calibrated = (Mechanism, NoiseInfo, f64, Option<f64>, Charge);

async fn release(
    state: Arc<AppState>,
    who: Option<Extension<Tenant>>,
    r: Release,
    calibrate: impl FnOnce(usize) -> Result<Calibrated, Problem> + Send + 'static,
) -> Result<Response, Problem> {
    let timeout = job_timeout(r.timeout_ms)?;
    let key = noise_key(&state, r.seed)?;
    let max = state.settings.config.max_elements;
    let packed = match &r.values {
        Vector::Packed(p) => Some(p.dtype),
        Vector::Numbers(_) => None,
    };
    let vals = r.values;
    // Decoding, calibration and the range check are CPU work: off the runtime.
    let (values, (mechanism, info, epsilon, delta, cost)) = blocking(move || {
        let values = vals.decode("/values", max)?.into_f64();
        let cal = calibrate(values.len())?;
        let grid = cal.0.grid();
        if let Some(i) = values.iter().position(|x| (x / grid).abs() >= MAX_SNAPPED) {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                format!("/values/{i}"),
                format!(
                    "too large for the noise grid {grid:e} (|value| must be below 2^62 grid steps)"
                ),
            ));
        }
        Ok((values, cal))
    })
    .await?;
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
    Ok(job_response(encode(body).await?, &done.run))
}

// ------------------------------------------------------------------------ accountant

/// Orders: a list of numbers > 1, or a preset (`opacus`, the default, or `tf`).
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Orders {
    Preset(OrdersPreset),
    List(Vec<f64>),
}

/// Most orders in one list.
const MAX_LISTED_ORDERS: usize = 512;

/// Written by hand for the bounds of the list, which derived schemas cannot put on an
/// enum variant: 1 to 512 orders, each in (1, MAX_ORDER].
impl utoipa::PartialSchema for Orders {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{
            ArrayBuilder, KnownFormat, ObjectBuilder, OneOfBuilder, Ref, SchemaFormat, Type,
        };
        let order = ObjectBuilder::new()
            .schema_type(Type::Number)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Double)))
            .exclusive_minimum(Some(1.0))
            .maximum(Some(MAX_ORDER));
        OneOfBuilder::new()
            .description(Some(
                "A preset (`opacus`, the default, or `tf`), or 1 to 512 orders, each in (1, 65536].",
            ))
            .item(Ref::from_schema_name("OrdersPreset"))
            .item(
                ArrayBuilder::new()
                    .items(order)
                    .min_items(Some(1))
                    .max_items(Some(MAX_LISTED_ORDERS)),
            )
            .into()
    }
}

impl ToSchema for Orders {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::PartialSchema;
        schemas.push((OrdersPreset::name().into(), OrdersPreset::schema()));
    }
}

#[derive(Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OrdersPreset {
    /// 1.1, 1.2, …, 10.9, 12, …, 63
    Opacus,
    /// 1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5, 5, …, 63, 128, 256, 512
    Tf,
}

fn orders(o: Option<Orders>) -> Result<Vec<f64>, Problem> {
    match o {
        None | Some(Orders::Preset(OrdersPreset::Opacus)) => Ok(accountant::opacus_orders()),
        Some(Orders::Preset(OrdersPreset::Tf)) => Ok(accountant::tf_orders()),
        Some(Orders::List(list)) => {
            if list.is_empty() || list.len() > MAX_LISTED_ORDERS {
                return Err(Problem::at(
                    ErrorCode::InvalidParameter,
                    "/orders",
                    "give 1 to 512 orders",
                ));
            }
            for (i, &a) in list.iter().enumerate() {
                if !(a > 1.0 && a <= MAX_ORDER) {
                    return Err(Problem::at(
                        ErrorCode::InvalidParameter,
                        format!("/orders/{i}"),
                        format!("must be greater than 1 and at most {MAX_ORDER}"),
                    ));
                }
            }
            Ok(list)
        }
    }
}

/// ε of `steps` DP-SGD steps.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"sample_rate": 0.04, "noise_multiplier": 1.5, "steps": 2250, "delta": 1e-5}))]
pub struct EpsilonRequest {
    /// q, in (0, 1].
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub sample_rate: f64,
    #[schema(exclusive_minimum = 0.0)]
    pub noise_multiplier: f64,
    #[schema(minimum = 1, maximum = 34359738368_u64)]
    pub steps: u64,
    #[schema(exclusive_minimum = 0.0, exclusive_maximum = 1.0)]
    pub delta: f64,
    pub orders: Option<Orders>,
}

#[derive(Serialize, ToSchema)]
#[schema(example = json!({"epsilon": 7.32911117143, "optimal_order": 3.9}))]
pub struct EpsilonResponse {
    pub epsilon: f64,
    pub optimal_order: f64,
}

/// The noise multiplier that meets a target ε.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"target_epsilon": 8.0, "delta": 1e-5, "sample_rate": 0.04, "steps": 2250}))]
pub struct NoiseMultiplierRequest {
    #[schema(exclusive_minimum = 0.0)]
    pub target_epsilon: f64,
    #[schema(exclusive_minimum = 0.0, exclusive_maximum = 1.0)]
    pub delta: f64,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub sample_rate: f64,
    #[schema(minimum = 1, maximum = 34359738368_u64)]
    pub steps: u64,
    pub orders: Option<Orders>,
}

#[derive(Serialize, ToSchema)]
pub struct NoiseMultiplierResponse {
    /// The smallest σ (to 1e-9 relative) whose ε is at most the target.
    pub noise_multiplier: f64,
    /// ε at that σ.
    pub epsilon: f64,
    pub optimal_order: f64,
}

/// Most steps accepted (a year of one step per millisecond).
const MAX_STEPS: u64 = 1 << 35;

fn steps(s: u64) -> Result<u64, Problem> {
    if (1..=MAX_STEPS).contains(&s) {
        Ok(s)
    } else {
        Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/steps",
            format!("must be 1 to {MAX_STEPS}"),
        ))
    }
}

#[utoipa::path(
    post, path = "/dp/accountant/epsilon", tag = "dp", operation_id = "dp_accountant_epsilon",
    summary = "ε of DP-SGD from RDP of the subsampled Gaussian",
    description = "RDP of the Poisson-subsampled Gaussian (integer orders by the binomial expansion, \
        fractional by TF Privacy's erfc series), composed over `steps`, converted to (ε, δ) by Balle et al. \
        2020 (Theorem 21) — as Opacus and TF Privacy compute it.",
    request_body = EpsilonRequest,
    responses(
        (status = 200, description = "ε and the order that attains it", body = EpsilonResponse),
        (status = 422, description = "invalid_request, invalid_parameter"),
    ),
    security((), ("bearer" = []))
)]
pub async fn accountant_epsilon(
    ApiJson(req): ApiJson<EpsilonRequest>,
) -> Result<Json<EpsilonResponse>, Problem> {
    let q = sample_rate(req.sample_rate, "/sample_rate")?;
    let sigma = positive(req.noise_multiplier, "/noise_multiplier")?;
    let steps = steps(req.steps)?;
    let delta = open_unit(req.delta, "/delta")?;
    let orders = orders(req.orders)?;
    blocking(move || {
        let (epsilon, optimal_order) = accountant::epsilon(q, sigma, steps, delta, &orders);
        if !epsilon.is_finite() {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/noise_multiplier",
                "too small: the RDP bound overflows and ε is unbounded",
            ));
        }
        Ok(Json(EpsilonResponse {
            epsilon,
            optimal_order,
        }))
    })
    .await
}

#[utoipa::path(
    post, path = "/dp/accountant/noise_multiplier", tag = "dp", operation_id = "dp_accountant_noise_multiplier",
    summary = "The smallest noise multiplier that meets a target ε",
    request_body = NoiseMultiplierRequest,
    responses(
        (status = 200, description = "σ", body = NoiseMultiplierResponse),
        (status = 422, description = "invalid_request, invalid_parameter (including a target no σ up to 2e6 meets)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn accountant_noise_multiplier(
    ApiJson(req): ApiJson<NoiseMultiplierRequest>,
) -> Result<Json<NoiseMultiplierResponse>, Problem> {
    let target = positive(req.target_epsilon, "/target_epsilon")?;
    let q = sample_rate(req.sample_rate, "/sample_rate")?;
    let steps = steps(req.steps)?;
    let delta = open_unit(req.delta, "/delta")?;
    let orders = orders(req.orders)?;
    blocking(move || {
        let (sigma, epsilon) = accountant::noise_multiplier(target, delta, q, steps, &orders)
            .ok_or_else(|| {
                Problem::at(
                    ErrorCode::InvalidParameter,
                    "/target_epsilon",
                    format!(
                        "no noise multiplier up to {} meets it: the budget is too small",
                        accountant::MAX_NOISE_MULTIPLIER
                    ),
                )
            })?;
        let (_, optimal_order) = accountant::epsilon(q, sigma, steps, delta, &orders);
        Ok(Json(NoiseMultiplierResponse {
            noise_multiplier: sigma,
            epsilon,
            optimal_order,
        }))
    })
    .await
}

// --------------------------------------------------------------------------- budgets

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AccountantKind {
    /// Rényi DP, composed at fixed orders and converted with the budget's δ.
    #[default]
    Rdp,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"epsilon_limit": 8.0, "delta": 1e-5, "name": "mnist-run-3"}))]
pub struct CreateBudgetRequest {
    #[schema(exclusive_minimum = 0.0)]
    pub epsilon_limit: f64,
    #[schema(exclusive_minimum = 0.0, exclusive_maximum = 1.0)]
    pub delta: f64,
    #[serde(default)]
    pub accountant: AccountantKind,
    /// A label for people; not unique. At most 200 bytes of UTF-8.
    #[schema(max_length = 200)]
    pub name: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct BudgetView {
    #[schema(example = "bud_3f1c9a0d2b7e4f6a8c5d1e0f9a8b7c6d")]
    pub id: String,
    pub name: Option<String>,
    pub accountant: String,
    pub epsilon_limit: f64,
    pub delta: f64,
    pub epsilon_spent: f64,
    pub epsilon_remaining: f64,
    pub optimal_order: Option<f64>,
    /// Charges standing (refunded ones excluded).
    pub charges: u64,
    pub created_at: String,
    pub updated_at: String,
}

impl From<Budget> for BudgetView {
    fn from(b: Budget) -> Self {
        Self {
            epsilon_remaining: (b.epsilon_limit - b.epsilon_spent).max(0.0),
            id: b.id,
            name: b.name,
            accountant: b.accountant,
            epsilon_limit: b.epsilon_limit,
            delta: b.delta,
            epsilon_spent: b.epsilon_spent,
            optimal_order: b.optimal_order,
            charges: b.charges,
            created_at: b.created_at,
            updated_at: b.updated_at,
        }
    }
}

/// One entry of a budget's history.
#[derive(Serialize, ToSchema)]
pub struct ChargeView {
    pub seq: u64,
    /// privatize, gaussian or laplace.
    pub kind: String,
    /// The release's parameters as charged.
    #[schema(value_type = Object)]
    pub params: serde_json::Value,
    /// The budget's ε right after this charge.
    pub epsilon_after: f64,
    /// charged, or refunded (the release failed before anything left the server).
    pub status: String,
    pub at: String,
}

impl From<ChargeRecord> for ChargeView {
    fn from(c: ChargeRecord) -> Self {
        Self {
            seq: c.seq,
            kind: c.kind,
            params: c.params,
            epsilon_after: c.epsilon_after,
            status: c.status,
            at: c.at,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct BudgetDetail {
    #[serde(flatten)]
    pub budget: BudgetView,
    /// The latest charges (see `history_limit`), oldest first.
    pub history: Vec<ChargeView>,
}

#[derive(Serialize, ToSchema)]
pub struct BudgetList {
    pub budgets: Vec<BudgetView>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// How many of the latest charges to return (default 100; more than 10000 counts as 10000).
    #[param(minimum = 0, maximum = 9223372036854775807_u64)]
    pub history_limit: Option<i64>,
}

#[utoipa::path(
    post, path = "/dp/budgets", tag = "dp", operation_id = "dp_budget_create",
    summary = "Create a privacy budget",
    request_body = CreateBudgetRequest,
    responses(
        (status = 201, description = "Created", body = BudgetView, headers(("location" = String, description = "/dp/budgets/{id}")),
            links(("get" = (operation_id = "dp_budget_get", parameters(("id" = "$response.body#/id")))))),
        (status = 422, description = "invalid_request, invalid_parameter"),
    ),
    security((), ("bearer" = []))
)]
pub async fn create_budget(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiJson(req): ApiJson<CreateBudgetRequest>,
) -> Result<Response, Problem> {
    let epsilon_limit = positive(req.epsilon_limit, "/epsilon_limit")?;
    let delta = open_unit(req.delta, "/delta")?;
    if req.name.as_ref().is_some_and(|n| n.len() > 200) {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/name",
            "at most 200 bytes",
        ));
    }
    let store = state.store.clone();
    let new = NewBudget {
        tenant: tenant(&who),
        name: req.name,
        epsilon_limit,
        delta,
    };
    let b = blocking(move || store.create_budget(new).map_err(Problem::from)).await?;
    let location = HeaderValue::from_str(&format!("/dp/budgets/{}", b.id)).expect("ascii id");
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(BudgetView::from(b)),
    )
        .into_response())
}

#[utoipa::path(
    get, path = "/dp/budgets/{id}", tag = "dp", operation_id = "dp_budget_get",
    summary = "A privacy budget: spent, remaining and history",
    params(("id" = String, Path, description = "Budget id"), HistoryQuery),
    responses(
        (status = 200, description = "The budget", body = BudgetDetail),
        (status = 404, description = "budget_not_found (also for another tenant's budget)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn get_budget(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
    ApiQuery(q): ApiQuery<HistoryQuery>,
) -> Result<Json<BudgetDetail>, Problem> {
    let limit = match q.history_limit {
        None => 100,
        Some(n @ 0..) => n.min(10_000) as usize,
        Some(_) => {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/history_limit",
                "must not be negative",
            ))
        }
    };
    let (store, t) = (state.store.clone(), tenant(&who));
    let not_found = |e| match e {
        BudgetError::NotFound => Problem::new(ErrorCode::BudgetNotFound, "no such budget"),
        e => Problem::from(e),
    };
    blocking(move || {
        let b = store.budget(&t, &id).map_err(not_found)?;
        let history = store.charges(&t, &id, limit).map_err(not_found)?;
        Ok(Json(BudgetDetail {
            budget: b.into(),
            history: history.into_iter().map(Into::into).collect(),
        }))
    })
    .await
}

#[utoipa::path(
    get, path = "/dp/budgets", tag = "dp", operation_id = "dp_budget_list",
    summary = "The caller's privacy budgets",
    responses((status = 200, description = "Budgets, oldest first", body = BudgetList)),
    security((), ("bearer" = []))
)]
pub async fn list_budgets(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
) -> Result<Json<BudgetList>, Problem> {
    let (store, t) = (state.store.clone(), tenant(&who));
    blocking(move || {
        let budgets = store.budgets(&t).map_err(Problem::from)?;
        Ok(Json(BudgetList {
            budgets: budgets.into_iter().map(Into::into).collect(),
        }))
    })
    .await
}
