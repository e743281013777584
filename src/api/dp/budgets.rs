//! `/dp/budgets`: durable privacy budgets per tenant, and their history of charges.

use super::{open_unit, positive};
use crate::api::auth::{tenant, Tenant};
use crate::api::problem::{ErrorCode, Problem};
use crate::api::{blocking, ApiJson, ApiPath, ApiQuery, AppState, IdParam};
use crate::store::{Budget, ChargeRecord, NewBudget};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

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
        (status = 503, description = "storage_unavailable: the budget database (--database-url) cannot be reached; retry after Retry-After"),
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
        (status = 503, description = "storage_unavailable: the budget database (--database-url) cannot be reached; retry after Retry-After"),
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
    blocking(move || {
        let b = store.budget(&t, &id)?;
        let history = store.charges(&t, &id, limit)?;
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
    responses(
        (status = 200, description = "Budgets, oldest first", body = BudgetList),
        (status = 503, description = "storage_unavailable: the budget database (--database-url) cannot be reached; retry after Retry-After"),
    ),
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
