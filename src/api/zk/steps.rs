//! Field ops and NTTs whose operands or result may stay on a device (`KeptFieldJob`):
//! when they are chosen, and how they are answered.

use super::super::array_operands::ArrayScope;
use super::super::elements::Encoding;
use super::super::kept_results::KeepPlan;
use super::super::problem::{ErrorCode, Problem};
use super::super::{blocking_if, bulk, AnswerForm, AppState};
use super::{answer, FieldVectorResponse};
use crate::arrays::HeldArray;
use crate::backend::BackendChoice;
use crate::ops::zk::held::{FieldResult, HeldVector, StepFailed};
use crate::ops::zk::Field;
use crate::pool::Completed;
use axum::response::Response;
use std::sync::Arc;

/// Whether a step may leave its operands or result on a device (`KeptFieldJob`): a
/// device is there, the request does not ask for the CPU, and replicas do not share
/// arrays (they read each other's from the artifact store, not from a device).
pub(in crate::api) fn devices_may_hold(state: &AppState, backend: BackendChoice) -> bool {
    backend != BackendChoice::Cpu && !state.arrays.is_shared() && !state.backends.gpus().is_empty()
}

/// What a `KeptFieldJob`'s answer needs of its request: the arrays its operands named
/// (by input) and their paths.
pub(in crate::api) struct Step {
    pub scope: ArrayScope,
    pub named: Vec<Option<String>>,
    pub paths: &'static [&'static str],
}

impl Step {
    /// The refusal for an inversion of a held operand with zeros (422 not_invertible, as
    /// for values sent), or for a step whose operand `e.input` a device no longer holds: 410
    /// array_lost at its path, and its array is gone; 422 unknown_array there when it was
    /// deleted (or expired) while the step waited, as it would have been had it gone
    /// before.
    pub(in crate::api) async fn failed(self, e: StepFailed) -> Problem {
        if let Some(zeros) = e.not_invertible {
            return Problem::from(zeros);
        }
        let Some(i) = e.input.filter(|&i| i < self.paths.len()) else {
            return Problem::new(ErrorCode::Internal, e.message);
        };
        let path = format!("{}/array", self.paths[i]);
        if let Some(id) = self.named[i].clone() {
            // Reading it back finds it gone and deletes it, as a read of it would; or
            // finds no such array: the tenant deleted it meanwhile.
            let scope = self.scope.clone();
            let named = id.clone();
            let read_back = move || -> Result<bool, Problem> {
                let (arrays, tenant) = scope.parts();
                Ok(arrays.use_operand(tenant, &named)?.is_none())
            };
            if let Ok(true) = blocking_if(true, read_back).await {
                let why = format!("{id:.40} was deleted or expired while this step waited");
                return Problem::at(ErrorCode::UnknownArray, path, why);
            }
        }
        Problem::at(ErrorCode::ArrayLost, path, e.message)
    }
}

/// Answers a `KeptFieldJob`: from the host as `answer` does, or with the array its result
/// was kept as on the device; an operand no longer held as `Step::failed` says.
pub(super) async fn answer_step(
    done: Completed<Result<FieldResult, StepFailed>>,
    shape: (Field, Encoding),
    large: bool,
    form: AnswerForm,
    keep: Option<KeepPlan>,
    step: Step,
) -> Result<Response, Problem> {
    let run = done.run;
    let output = match done.output {
        Ok(output) => output,
        Err(e) => return Err(step.failed(e).await),
    };
    match output {
        FieldResult::Host(output) => {
            answer(Completed { output, run }, shape, large, form, keep).await
        }
        FieldResult::Held(held) => answer_held(held, run, shape, form, keep).await,
    }
}

/// The answer for a result a device holds: its array only (a result is left on the
/// device only when the answer is not to carry it).
async fn answer_held(
    held: Arc<HeldVector>,
    run: crate::pool::RunInfo,
    (field, encoding): (Field, Encoding),
    form: AnswerForm,
    keep: Option<KeepPlan>,
) -> Result<Response, Problem> {
    let Some(plan) = keep else {
        held.discard();
        let why = "a result was left on the device without a request to keep it";
        return Err(Problem::new(ErrorCode::Internal, why));
    };
    let length = held.len();
    let kept = blocking_if(true, move || plan.keep_held(HeldArray::Field(held))).await?;
    let body = FieldVectorResponse {
        field,
        encoding,
        length,
        result: None,
        kept: Some(kept),
    };
    bulk::answer(form, &body, |b| Ok(b.to_json()), &run)
}
