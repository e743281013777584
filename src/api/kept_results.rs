//! Results that stay: an op asked to `keep` its result stores it as a new resident array
//! of the requesting tenant's (`api::arrays`) and answers its id, with or without the
//! values, so the next op of a chain names it (`{"array": id}`) instead of the client
//! sending it back. Within the same quotas as uploads; checked before the job runs
//! (name, time to live), stored after (a result past the quota is 422
//! array_quota_exceeded, and nothing is kept).

use super::array_operands::ArrayScope;
use super::arrays::{check_name, new_id, store, store_as, ttl_ms, ArrayView};
use super::blocking_if;
use super::problem::ErrorCode;
use super::problem::Problem;
use super::zk::steps::Step;
use super::AppState;
use crate::arrays::{ArrayData, HeldArray, Recording, Tensor};
use crate::ops::linalg::kept::TensorResult;
use crate::ops::linalg::{Dtype, Values};
use crate::ops::zk::held::StepFailed;
use crate::ops::zk::FieldVec;
use crate::pool::{Completed, RunInfo};
use serde::Deserialize;
use std::sync::Arc;
use utoipa::ToSchema;

/// Keep the result as a resident array.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ttl_seconds": 600, "with_data": false}))]
pub struct Keep {
    /// A label for people; at most 200 characters.
    #[schema(max_length = 200)]
    pub name: Option<String>,
    /// Seconds the array lives, from now: 1 to --max-array-ttl; --array-ttl when absent.
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub ttl_seconds: Option<u64>,
    /// Whether the answer carries the values too (the default); with false it carries
    /// only `kept`, and the values stay on the server: a field op's, an NTT's, a
    /// matmul's or an NCHW conv2d's result made on a device then stays on that device
    /// until it is read (`held: ["device"]`), and the next step that names it runs there
    /// (a matmul naming a held product whose values its `compute` would round, or an nhwc
    /// conv2d naming a held tensor, reads it back first).
    #[serde(default = "yes")]
    pub with_data: bool,
}

fn yes() -> bool {
    true
}

/// A `keep` checked before its job runs.
pub(super) struct KeepPlan {
    /// The id the kept array will have, known before the job runs so a device can keep
    /// the result under it.
    id: String,
    name: Option<String>,
    ttl: u64,
    pub with_data: bool,
    scope: ArrayScope,
}

/// Checks `keep` (at `/keep`) against the flags; `None` when the request keeps nothing.
pub(super) fn plan(
    keep: Option<Keep>,
    state: &AppState,
    scope: &ArrayScope,
) -> Result<Option<KeepPlan>, Problem> {
    let Some(k) = keep else { return Ok(None) };
    check_name(&k.name, "/keep/name")?;
    Ok(Some(KeepPlan {
        id: new_id()?,
        ttl: ttl_ms(state, k.ttl_seconds, "/keep/ttl_seconds")?,
        name: k.name,
        with_data: k.with_data,
        scope: scope.clone(),
    }))
}

impl KeepPlan {
    /// Stores `values` for the tenant; what the answer says of it. Blocks on the disk.
    pub(super) fn keep_elements(self, values: Arc<FieldVec>) -> Result<ArrayView, Problem> {
        self.keep(ArrayData::FieldElements(values))
    }

    /// Stores each recording as an array of its own (one name and time to live for all);
    /// all or none: past a quota the ones already stored are removed again.
    pub(super) fn keep_recordings(
        self,
        recordings: Vec<Arc<Recording>>,
    ) -> Result<Vec<ArrayView>, Problem> {
        let (arrays, tenant) = self.scope.parts();
        let mut kept = Vec::with_capacity(recordings.len());
        for r in recordings {
            let data = ArrayData::Recording(r);
            match store(
                arrays,
                tenant.to_string(),
                self.name.clone(),
                self.ttl,
                data,
            ) {
                Ok(v) => kept.push(v),
                Err(e) => {
                    for v in &kept {
                        if let Err(undo) = arrays.remove(tenant, &v.id) {
                            tracing::warn!(array = %v.id, error = %undo, "a kept recording not removed after a refusal");
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(kept)
    }

    /// The key a device keeps the result under, when the job may leave it there: only
    /// when the answer does not carry the values (which would read it back at once).
    pub(super) fn device_key(&self) -> Option<String> {
        (!self.with_data).then(|| crate::arrays::device_key(&self.id))
    }

    /// Stores a result a device holds; past a quota the device's copy is dropped.
    pub(super) fn keep_held(self, held: HeldArray) -> Result<ArrayView, Problem> {
        match self.keep(ArrayData::Held(held.clone())) {
            Ok(view) => {
                held.adopt();
                Ok(view)
            }
            Err(e) => {
                held.discard();
                Err(e)
            }
        }
    }

    fn keep(self, data: ArrayData) -> Result<ArrayView, Problem> {
        let (arrays, tenant) = self.scope.parts();
        store_as(
            arrays,
            self.id,
            tenant.to_string(),
            self.name,
            self.ttl,
            data,
        )
    }
}

/// A tensor result (finite, representable in `dtype`) and what was kept of it: with no
/// plan the values as they are; with one, kept first as a resident tensor (the answer's
/// values shared with it, not copied), and left out of the answer unless `with_data`.
/// Blocks on the disk when keeping.
pub(super) fn keep_tensor(
    keep: Option<KeepPlan>,
    dtype: Dtype,
    shape: &[usize],
    values: Values,
) -> Result<(Option<Values>, Option<ArrayView>), Problem> {
    let Some(plan) = keep else {
        return Ok((Some(values), None));
    };
    let with_data = plan.with_data;
    let tensor = Arc::new(Tensor::new(dtype, shape.to_vec(), values));
    let view = plan.keep(ArrayData::Tensor(tensor.clone()))?;
    Ok((with_data.then(|| tensor.values.clone()), Some(view)))
}

/// What a job that may keep its tensor on a device (`KeptMatmulJob`, `KeptConv2dJob`)
/// came to: its values on the host, answered as any job's; or the array `keep` stored the
/// tensor a device holds as, answered without data.
pub(super) enum TensorStep {
    Host(Completed<Values>),
    Held(ArrayView, RunInfo),
}

/// Settles such a job: an operand no longer held as `Step::failed` says; a held result
/// stored as `keep`'s array (`keep` taken); one nobody asked to keep is dropped from the
/// device and is an internal error (the jobs keep only under a key from `keep`).
pub(super) async fn settle_tensor(
    done: Completed<Result<TensorResult, StepFailed>>,
    keep: &mut Option<KeepPlan>,
    step: Step,
) -> Result<TensorStep, Problem> {
    match done.output {
        Err(e) => Err(step.failed(e).await),
        Ok(TensorResult::Host(output)) => Ok(TensorStep::Host(Completed {
            output,
            run: done.run,
        })),
        Ok(TensorResult::Held(h)) => {
            let Some(plan) = keep.take() else {
                h.discard();
                let why = "a result was left on the device without a request to keep it";
                return Err(Problem::new(ErrorCode::Internal, why));
            };
            let view = blocking_if(true, move || plan.keep_held(HeldArray::Tensor(h))).await?;
            Ok(TensorStep::Held(view, done.run))
        }
    }
}
