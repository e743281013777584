//! `/dp/accountant/*`: ε of a DP-SGD run, and the noise multiplier for a target ε.

use super::{open_unit, positive, sample_rate};
use crate::api::problem::{ErrorCode, Problem};
use crate::api::{blocking, ApiJson};
use crate::ops::dp::accountant::{self as rdp, MAX_ORDER};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
        None | Some(Orders::Preset(OrdersPreset::Opacus)) => Ok(rdp::opacus_orders()),
        Some(Orders::Preset(OrdersPreset::Tf)) => Ok(rdp::tf_orders()),
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
        let (epsilon, optimal_order) = rdp::epsilon(q, sigma, steps, delta, &orders);
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
        let (sigma, epsilon) =
            rdp::noise_multiplier(target, delta, q, steps, &orders).ok_or_else(|| {
                Problem::at(
                    ErrorCode::InvalidParameter,
                    "/target_epsilon",
                    format!(
                        "no noise multiplier up to {} meets it: the budget is too small",
                        rdp::MAX_NOISE_MULTIPLIER
                    ),
                )
            })?;
        let (_, optimal_order) = rdp::epsilon(q, sigma, steps, delta, &orders);
        Ok(Json(NoiseMultiplierResponse {
            noise_multiplier: sigma,
            epsilon,
            optimal_order,
        }))
    })
    .await
}
