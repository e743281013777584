//! `/dp/*`: DP-SGD privatization and noise releases (`releases`), RDP accounting
//! (`accountant`) and privacy budgets (`budgets`). The maths is in `ops::dp`; this is the
//! HTTP: decoding, budgets charged before anything is released, answers.

pub mod accountant;
pub mod budgets;
pub mod releases;

use super::domain_errors::charge_refused;
use super::problem::{ErrorCode, Problem};
use super::{blocking, AppState};
use crate::backend::BackendChoice;
use crate::backend::Job;
use crate::ops::dp::NoiseKey;
use crate::pool::Completed;
use crate::store::{Budget, Charge};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use utoipa::ToSchema;
use utoipa_axum::routes;

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
    random_key(state, seed, NoiseKey::from_seed)
}

/// A fresh key from OS entropy, or on servers started for testing
/// (--dp-allow-client-seed) the key `derive` makes from a client's seed.
pub(crate) fn random_key(
    state: &AppState,
    seed: Option<u64>,
    derive: impl FnOnce(u64) -> NoiseKey,
) -> Result<NoiseKey, Problem> {
    match seed {
        None => NoiseKey::from_os().map_err(Problem::internal),
        Some(s) if state.settings.config.dp_allow_client_seed => Ok(derive(s)),
        Some(_) => Err(Problem::at(
            ErrorCode::SeedNotAllowed,
            "/seed",
            "client seeds make the randomness predictable; this server does not accept them \
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
    let out = blocking(move || store.charge(&t, &id, &charge).map_err(charge_refused)).await;
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
                match blocking(move || store.refund(&t, &bid, seq).map_err(charge_refused)).await {
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

/// The dp domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "dp",
    description: "Differential privacy: DP-SGD privatization, noise mechanisms, RDP accounting, privacy budgets",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(releases::privatize))
        .routes(routes!(releases::laplace))
        .routes(routes!(releases::gaussian))
        .routes(routes!(accountant::accountant_epsilon))
        .routes(routes!(accountant::accountant_noise_multiplier))
        .routes(routes!(budgets::create_budget, budgets::list_budgets))
        .routes(routes!(budgets::get_budget))
}
