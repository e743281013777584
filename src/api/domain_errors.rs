//! Every domain error becomes a problem here, once: its code, its status (through the
//! code) and the field it names. Handlers use `?`; where the field depends on the
//! request's shape, the mapping takes that shape (`msm_shape`, `submit_refused`,
//! `charge_refused`, `invalid_points`).

use super::problem::{ErrorCode, FieldIssue, Problem};
use crate::datasets::SubmitError;
use crate::ops::invalid::{FieldPath, Invalid, Segment};
use crate::ops::mpc::secagg::round::Refusal;
use crate::ops::mpc::shamir::ShamirError;
use crate::ops::rf::ExtractError;
use crate::ops::zk::msm::{MsmShape, PointErrors};
use crate::ops::zk::ntt::NttShape;
use crate::ops::zk::{InvError, LengthMismatch, PowShape};
use crate::pool::JobError;
use crate::store::QueueRefusal;
use crate::store::{BudgetError, RoundError, StoreError};

impl From<JobError> for Problem {
    fn from(e: JobError) -> Self {
        let detail = e.to_string();
        match e {
            JobError::QueueFull {
                retry_after_secs, ..
            } => Problem {
                retry_after_secs: Some(retry_after_secs),
                ..Problem::new(ErrorCode::QueueFull, detail)
            },
            JobError::DeadlineExceeded => Problem::new(ErrorCode::DeadlineExceeded, detail),
            JobError::DeviceUnavailable(_) => Problem::new(ErrorCode::DeviceUnavailable, detail),
            JobError::NotOnDevice(_) => {
                Problem::at(ErrorCode::InvalidParameter, "/backend", detail)
            }
            JobError::DeviceFailed(_) => Problem::new(ErrorCode::DeviceError, detail),
            JobError::ShuttingDown => Problem {
                retry_after_secs: Some(1),
                ..Problem::new(ErrorCode::ShuttingDown, detail)
            },
            JobError::Internal(_) => Problem::new(ErrorCode::Internal, detail),
        }
    }
}

/// A field the maths refused: its place rendered as a JSON pointer.
impl From<Invalid> for Problem {
    fn from(e: Invalid) -> Self {
        Problem::at(ErrorCode::InvalidParameter, pointer(&e.path), e.message)
    }
}

/// A field's place as a JSON pointer.
pub(crate) fn pointer(path: &FieldPath) -> String {
    path.segments()
        .iter()
        .map(|s| match s {
            Segment::Field(name) => format!("/{name}"),
            Segment::Index(i) => format!("/{i}"),
        })
        .collect()
}

impl From<StoreError> for Problem {
    fn from(e: StoreError) -> Self {
        if e.is_unavailable() {
            let mut p = Problem::new(ErrorCode::StorageUnavailable, e.to_string());
            p.retry_after_secs = Some(1);
            p
        } else {
            Problem::new(ErrorCode::Internal, e.to_string())
        }
    }
}

/// A budget named in the path (`/dp/budgets/{id}`); `charge_refused` for one named in a
/// release's body.
impl From<BudgetError> for Problem {
    fn from(e: BudgetError) -> Self {
        match e {
            BudgetError::NotFound => Problem::new(ErrorCode::BudgetNotFound, "no such budget"),
            e @ BudgetError::Exhausted { .. } => {
                Problem::new(ErrorCode::BudgetExhausted, e.to_string())
            }
            BudgetError::Storage(e) => e.into(),
        }
    }
}

/// A charge (or refund) to the budget a release names in its `budget_id`.
pub(crate) fn charge_refused(e: BudgetError) -> Problem {
    match e {
        BudgetError::NotFound => {
            Problem::at(ErrorCode::BudgetNotFound, "/budget_id", "no such budget")
        }
        e => e.into(),
    }
}

/// `b` of `/zk/field_{add,sub,mul}`.
impl From<LengthMismatch> for Problem {
    fn from(e: LengthMismatch) -> Self {
        Problem::at(ErrorCode::LengthMismatch, "/b", e.to_string())
    }
}

/// `exponent` of `/zk/field_pow`.
impl From<PowShape> for Problem {
    fn from(e: PowShape) -> Self {
        Problem::at(ErrorCode::LengthMismatch, "/exponent", e.to_string())
    }
}

/// `values` of `/zk/field_inv`: every zero listed (up to the job's cap).
impl From<InvError> for Problem {
    fn from(e: InvError) -> Self {
        match e {
            InvError::Empty => Problem::at(
                ErrorCode::LengthMismatch,
                "/values",
                "give at least one element",
            ),
            InvError::Zeros { indices, count } => {
                let issues: Vec<FieldIssue> = indices
                    .iter()
                    .map(|i| FieldIssue {
                        path: format!("/values/{i}"),
                        message: "zero has no inverse".into(),
                    })
                    .collect();
                let detail = format!(
                    "{count} zero element(s) in /values; the first {} are listed",
                    issues.len()
                );
                Problem::new(ErrorCode::NotInvertible, detail).with_errors(issues)
            }
        }
    }
}

/// The fields of `/zk/ntt` and `/zk/intt`.
impl From<NttShape> for Problem {
    fn from(e: NttShape) -> Self {
        let path = match e {
            NttShape::ZeroBatch | NttShape::Uneven { .. } => "/batch",
            NttShape::ZeroShift => "/coset_shift",
            NttShape::NotPowerOfTwo { .. } | NttShape::TooLarge { .. } => "/values",
        };
        Problem::at(ErrorCode::InvalidParameter, path, e.to_string())
    }
}

/// `/zk/msm`'s shapes; `batched` when the request has `scalar_batch`.
pub(crate) fn msm_shape(e: MsmShape, batched: bool) -> Problem {
    let path = match &e {
        MsmShape::NoPoints => "/points".to_string(),
        MsmShape::NoScalars => "/scalar_batch".to_string(),
        MsmShape::Lengths { batch, .. } if batched => format!("/scalar_batch/{batch}"),
        MsmShape::Lengths { .. } => "/scalars".to_string(),
        MsmShape::WrongField { .. } => return Problem::new(ErrorCode::Internal, e.to_string()),
    };
    let code = match e {
        MsmShape::Lengths { .. } => ErrorCode::LengthMismatch,
        _ => ErrorCode::InvalidParameter,
    };
    Problem::at(code, path, e.to_string())
}

/// Points off the curve or out of the subgroup: each listed at `{path}/i`.
pub(crate) fn invalid_points(e: PointErrors, path: &str) -> Problem {
    let issues: Vec<FieldIssue> = e
        .listed
        .iter()
        .map(|(i, m)| FieldIssue {
            path: format!("{path}/{i}"),
            message: m.clone(),
        })
        .collect();
    let detail = match issues.as_slice() {
        [one] if e.count == 1 => format!("{}: {}", one.path, one.message),
        _ => format!(
            "{} invalid point(s); the first {} are listed",
            e.count,
            issues.len()
        ),
    };
    Problem::new(ErrorCode::InvalidPoint, detail).with_errors(issues)
}

/// `/mpc/shamir/combine`: too few shares, bad points, or a share off the polynomials.
impl From<ShamirError> for Problem {
    fn from(e: ShamirError) -> Self {
        match e {
            ShamirError::Invalid(invalid) => invalid.into(),
            ShamirError::TooFewShares { .. } => {
                Problem::at(ErrorCode::InsufficientShares, "/shares", e.to_string())
            }
            ShamirError::Inconsistent { share, element, .. } => Problem::at(
                ErrorCode::InconsistentShares,
                format!("/shares/{share}/values/{element}"),
                e.to_string(),
            ),
        }
    }
}

/// `/rf/features`: the recording or its chunking.
impl From<ExtractError> for Problem {
    fn from(e: ExtractError) -> Self {
        let path = match e {
            ExtractError::TooShort { .. } => "/iq",
            ExtractError::ChunkTooSmall(_) => "/chunk_ms",
        };
        Problem::at(ErrorCode::InvalidParameter, path, e.to_string())
    }
}

/// A refused dataset submission or resume; `pointer` names the field a disk or quota
/// refusal is about, when the request has a body.
pub(crate) fn submit_refused(e: SubmitError, pointer: Option<&str>) -> Problem {
    let at = |code, e: SubmitError| match pointer {
        Some(p) => Problem::at(code, p, e.to_string()),
        None => Problem::new(code, e.to_string()),
    };
    match e {
        SubmitError::NoSpace { .. } => at(ErrorCode::InsufficientStorage, e),
        SubmitError::QuotaExceeded { .. } => at(ErrorCode::DatasetQuotaExceeded, e),
        SubmitError::Queue(why) => Problem {
            retry_after_secs: Some(60),
            ..Problem::new(
                match why {
                    QueueRefusal::Full { .. } => ErrorCode::QueueFull,
                    QueueRefusal::TenantFull { .. } => ErrorCode::TenantDatasetQueueFull,
                    QueueRefusal::TenantWork { .. } => ErrorCode::TenantDatasetWorkPending,
                },
                e.to_string(),
            )
        },
        SubmitError::Storage(m) => Problem::internal(m),
        SubmitError::Catalog(e) => e.into(),
        SubmitError::NotResumable(_) => Problem::new(ErrorCode::DatasetNotResumable, e.to_string()),
    }
}

/// A resident array the store refused.
impl From<crate::arrays::ArrayError> for Problem {
    fn from(e: crate::arrays::ArrayError) -> Self {
        use crate::arrays::ArrayError;
        let code = match e {
            ArrayError::QuotaExceeded { .. } | ArrayError::TooMany { .. } => {
                ErrorCode::ArrayQuotaExceeded
            }
            ArrayError::Full { .. } | ArrayError::FullCount { .. } => ErrorCode::ArraysFull,
            ArrayError::TableQuotaExceeded { .. } | ArrayError::TablesTooMany { .. } => {
                ErrorCode::EmbeddingQuotaExceeded
            }
            ArrayError::TablesFull { .. } => ErrorCode::EmbeddingTablesFull,
            ArrayError::Io(_) => ErrorCode::Internal,
            ArrayError::Lost { .. } => ErrorCode::ArrayLost,
            ArrayError::DeviceBusy { .. } => ErrorCode::DeadlineExceeded,
            ArrayError::Storage { unavailable, .. } => {
                if unavailable {
                    let mut p = Problem::new(ErrorCode::StorageUnavailable, e.to_string());
                    p.retry_after_secs = Some(1);
                    return p;
                }
                ErrorCode::Internal
            }
        };
        Problem::new(code, e.to_string())
    }
}

/// Secure-aggregation rounds: the state machine's refusals.
impl From<RoundError> for Problem {
    fn from(e: RoundError) -> Self {
        let detail = e.to_string();
        match e {
            RoundError::NotFound => Problem::new(ErrorCode::SecaggRoundNotFound, detail),
            RoundError::BadToken => Problem::new(ErrorCode::SecaggTokenInvalid, detail),
            RoundError::Storage(e) => e.into(),
            RoundError::Refused(r) => match r {
                Refusal::WrongStage { .. } => Problem::new(ErrorCode::SecaggWrongStage, detail),
                Refusal::AlreadySubmitted { .. } => {
                    Problem::new(ErrorCode::SecaggAlreadySubmitted, detail)
                }
                Refusal::Full { .. } => Problem::new(ErrorCode::SecaggRoundFull, detail),
                Refusal::TooFew(_) => Problem::new(ErrorCode::SecaggTooFewClients, detail),
                Refusal::Invalid(invalid) => invalid.into(),
            },
        }
    }
}
