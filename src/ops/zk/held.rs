//! Field vectors kept where a device made them. A field op or an NTT asked to keep its
//! result (`KeptFieldJob` with a key) leaves the result in the device's cache of copies,
//! pinned, instead of downloading it. The next step of a chain that names it runs on that
//! device (`Job::resident_on`) and reads it there, so an NTT → product → inverse NTT
//! crosses the bus with its first operands and its last answer only. The values come
//! back to the host when they are read (`HeldVector::download`), after which the device
//! copy is an ordinary cached copy (`release`).

use super::gpu::{self, NttPlan};
use super::ntt::{Direction, NttJob, NttShape, Order};
use super::vector_ops::{binary_threshold, LengthMismatch};
use super::{Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob, FieldVec, InvError};
use super::{PowShape, U256};
use crate::backend::{DeviceError, DeviceLease, Job};
use std::borrow::Cow;
use std::sync::Arc;

mod vector;
mod whole;

pub use whole::gone;

pub use vector::{FieldShape, HeldVector};
use whole::Words;

/// One operand of a kept step.
#[derive(Clone)]
pub enum FieldSource {
    /// Values on the host; `key`: the device key of the resident array they are, if any,
    /// so a device keeps their upload for the next use.
    Host {
        values: FieldVec,
        key: Option<String>,
    },
    /// A kept result on a device.
    Held(Arc<HeldVector>),
}

impl FieldSource {
    pub fn len(&self) -> usize {
        match self {
            FieldSource::Host { values, .. } => values.len(),
            FieldSource::Held(h) => h.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn field(&self) -> Field {
        match self {
            FieldSource::Host { values, .. } => values.field(),
            FieldSource::Held(h) => h.field(),
        }
    }

    fn byte_len(&self) -> usize {
        self.len() * self.field().byte_width()
    }

    /// The values on the host: downloaded if held.
    fn host(&self) -> Result<Cow<'_, FieldVec>, DeviceError> {
        match self {
            FieldSource::Host { values, .. } => Ok(Cow::Borrowed(values)),
            FieldSource::Held(h) => h.download().map(Cow::Owned),
        }
    }
}

/// What a kept step computes.
#[derive(Clone, Debug)]
pub enum FieldStep {
    /// `a (op) b`, `b` of `a`'s length or one element.
    Binary(FieldOp),
    /// `base ^ exponents[i]`: one exponent per element, or one for all (on the host;
    /// integers, not elements of the field).
    Pow(Arc<Vec<U256>>),
    /// `1 / x` of each element (none zero: checked on the host for values sent, on the
    /// device for a held operand).
    Inv,
    /// `batch` transforms of the one operand.
    Ntt {
        direction: Direction,
        batch: usize,
        input_order: Order,
        output_order: Order,
        coset_shift: Option<U256>,
    },
}

/// A kept step's result: on the host, or held on the device that made it.
#[derive(Clone)]
pub enum FieldResult {
    Host(FieldVec),
    Held(Arc<HeldVector>),
}

/// Why a step has no result: an operand held on a device that no longer has it
/// (`input`: its index), a result held on a device that lost it before the check, or an
/// inversion whose held operand has zeros (`not_invertible`, found where it is held).
#[derive(Clone, Debug, Default)]
pub struct StepFailed {
    pub input: Option<usize>,
    pub message: String,
    pub not_invertible: Option<InvError>,
}

/// A field op or NTT whose operands may be held on a device and whose result may stay
/// there (under `keep`, when it runs on a device and the cache has room for it).
pub struct KeptFieldJob {
    step: FieldStep,
    inputs: Vec<FieldSource>,
    keep: Option<String>,
}

impl KeptFieldJob {
    /// `a (op) b`, checked as `FieldBinaryJob::new` checks it.
    pub fn binary(
        op: FieldOp,
        a: FieldSource,
        b: FieldSource,
        keep: Option<String>,
    ) -> Result<Self, LengthMismatch> {
        LengthMismatch::check((a.field(), a.len()), (b.field(), b.len()))?;
        Ok(Self {
            step: FieldStep::Binary(op),
            inputs: vec![a, b],
            keep,
        })
    }

    /// `base ^ exponents`, checked as `FieldPowJob::new` checks it.
    pub fn pow(
        base: FieldSource,
        exponents: Vec<U256>,
        keep: Option<String>,
    ) -> Result<Self, PowShape> {
        PowShape::check(base.len(), exponents.len())?;
        Ok(Self {
            step: FieldStep::Pow(Arc::new(exponents)),
            inputs: vec![base],
            keep,
        })
    }

    /// The inverses of `values`, checked as `FieldInvJob::new` checks them where they are
    /// on the host; a held operand's zeros are counted where it is held, when it runs.
    pub fn inv(values: FieldSource, keep: Option<String>) -> Result<Self, InvError> {
        match &values {
            FieldSource::Host { values, .. } => InvError::check(values)?,
            FieldSource::Held(h) if h.is_empty() => return Err(InvError::Empty),
            FieldSource::Held(_) => {}
        }
        Ok(Self {
            step: FieldStep::Inv,
            inputs: vec![values],
            keep,
        })
    }

    /// The transforms of `values` that `step` (an `FieldStep::Ntt`) describes, checked as
    /// `NttJob::new` checks them.
    pub fn ntt(
        values: FieldSource,
        step: FieldStep,
        max_log2: u32,
        keep: Option<String>,
    ) -> Result<Self, NttShape> {
        let FieldStep::Ntt {
            batch, coset_shift, ..
        } = &step
        else {
            return Err(NttShape::ZeroBatch);
        };
        let shape = (values.len(), *batch, coset_shift.as_ref());
        NttJob::check_shape(values.field(), shape, max_log2)?;
        Ok(Self {
            step,
            inputs: vec![values],
            keep,
        })
    }

    fn field(&self) -> Field {
        self.inputs[0].field()
    }

    /// The operands held on a device.
    fn held(&self) -> impl Iterator<Item = &Arc<HeldVector>> {
        self.inputs.iter().filter_map(|s| match s {
            FieldSource::Held(h) => Some(h),
            FieldSource::Host { .. } => None,
        })
    }

    fn len(&self) -> usize {
        self.inputs[0].len()
    }

    /// A pow step's exponents, 32 bytes each (none for the other steps).
    fn exponent_bytes(&self) -> usize {
        match &self.step {
            FieldStep::Pow(e) => 32 * e.len(),
            _ => 0,
        }
    }

    /// The host job computing the same from `values` (the inputs, downloaded if held).
    fn host_job(&self, values: Vec<FieldVec>) -> Result<HostJob, StepFailed> {
        let failed = |message: String| StepFailed {
            message,
            ..Default::default()
        };
        let mut values = values.into_iter();
        let mut next = || {
            values
                .next()
                .ok_or_else(|| failed("an input is missing".into()))
        };
        Ok(match &self.step {
            FieldStep::Binary(op) => {
                let (a, b) = (next()?, next()?);
                HostJob::Binary(FieldBinaryJob::new(*op, a, b).map_err(|e| failed(e.to_string()))?)
            }
            FieldStep::Pow(exponents) => HostJob::Pow(
                FieldPowJob::new(next()?, exponents.to_vec()).map_err(|e| failed(e.to_string()))?,
            ),
            FieldStep::Inv => HostJob::Inv(FieldInvJob::new(next()?).map_err(not_invertible)?),
            FieldStep::Ntt {
                direction,
                batch,
                input_order,
                output_order,
                coset_shift,
            } => HostJob::Ntt(
                NttJob::new(
                    *direction,
                    next()?,
                    *batch,
                    *input_order,
                    *output_order,
                    *coset_shift,
                    u32::MAX,
                )
                .map_err(|e| failed(e.to_string()))?,
            ),
        })
    }

    /// The inputs on the host, downloading those held on a device.
    fn host_inputs(&self) -> Result<Vec<FieldVec>, StepFailed> {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.host().map(Cow::into_owned).map_err(|e| StepFailed {
                    input: Some(i),
                    message: e.message,
                    not_invertible: None,
                })
            })
            .collect()
    }

    fn plan(&self) -> Option<NttPlan> {
        match &self.step {
            FieldStep::Binary(_) | FieldStep::Pow(_) | FieldStep::Inv => None,
            FieldStep::Ntt {
                direction,
                batch,
                input_order,
                output_order,
                coset_shift,
            } => Some(NttPlan {
                field: self.field(),
                n: self.len() / batch,
                direction: *direction,
                input_order: *input_order,
                output_order: *output_order,
                coset_shift: *coset_shift,
            }),
        }
    }
}

enum HostJob {
    Binary(FieldBinaryJob),
    Pow(FieldPowJob),
    Inv(FieldInvJob),
    Ntt(NttJob),
}

/// The step's refusal for an operand with zeros.
fn not_invertible(e: InvError) -> StepFailed {
    StepFailed {
        input: None,
        message: "an inverse of zero".into(),
        not_invertible: Some(e),
    }
}

impl HostJob {
    fn run_cpu(&self) -> FieldVec {
        match self {
            HostJob::Binary(j) => j.run_cpu(),
            HostJob::Pow(j) => j.run_cpu(),
            HostJob::Inv(j) => j.run_cpu(),
            HostJob::Ntt(j) => j.run_cpu(),
        }
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<FieldVec, DeviceError> {
        match self {
            HostJob::Binary(j) => gpu::launch_field_binary(j, dev),
            HostJob::Pow(j) => gpu::launch_field_pow(j, dev),
            HostJob::Inv(j) => gpu::launch_field_inv(j, dev),
            HostJob::Ntt(j) => gpu::launch_ntt(j, dev),
        }
    }
}

impl Job for KeptFieldJob {
    type Output = Result<FieldResult, StepFailed>;

    fn name(&self) -> &'static str {
        match &self.step {
            FieldStep::Binary(op) => op.name(),
            FieldStep::Pow(_) => "field_pow",
            FieldStep::Inv => "field_inv",
            FieldStep::Ntt { direction, .. } => direction.name(),
        }
    }

    /// The plain op's lane, apart: a kept step's device time has no download, and a
    /// step over held operands no upload.
    fn placement_lane(&self) -> Cow<'static, str> {
        let field = self.field().name();
        match &self.step {
            FieldStep::Binary(_) | FieldStep::Pow(_) | FieldStep::Inv => {
                format!("{field}/kept").into()
            }
            FieldStep::Ntt { batch, .. } => {
                let shape = if *batch > 1 { "batched" } else { "single" };
                format!("{field}/{shape}/kept").into()
            }
        }
    }

    fn size(&self) -> usize {
        self.len()
    }

    fn input_bytes(&self) -> usize {
        self.inputs.iter().map(FieldSource::byte_len).sum::<usize>() + self.exponent_bytes()
    }

    fn gpu_threshold(&self) -> usize {
        match &self.step {
            FieldStep::Binary(op) => binary_threshold(self.field(), *op),
            // As `FieldPowJob`'s: 256 squarings an element pay for their copies early.
            FieldStep::Pow(_) => 1 << 10,
            // As `FieldInvJob`'s.
            FieldStep::Inv => 1 << 14,
            FieldStep::Ntt { .. } => 1 << 14,
        }
    }

    fn resident_on(&self) -> Option<usize> {
        self.held().next().map(|h| h.ordinal())
    }

    fn run_cpu(&self) -> Self::Output {
        let job = self.host_job(self.host_inputs()?)?;
        Ok(FieldResult::Host(job.run_cpu()))
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Self::Output, DeviceError> {
        // An operand another device holds would need a lease there while this one is
        // held: two jobs doing that the other way round would wait for each other for
        // ever. The CPU run reads each back in turn instead (`fallback`).
        let here = dev.device.info.ordinal;
        if let Some(h) = self.held().find(|h| h.ordinal() != here) {
            return Err(DeviceError::unsupported(format!(
                "an operand is held on device {}, not {here}: the step runs on the CPU",
                h.ordinal()
            )));
        }
        let width = self.field().byte_width();
        let whole = self.len() * width * (self.inputs.len() + 1) + self.exponent_bytes();
        if whole > dev.memory_budget() {
            // Too large to hold whole: the plain launchers' passes, the result downloaded,
            // held operands read back on this lease (another would wait for this one).
            let mut values = Vec::with_capacity(self.inputs.len());
            for (i, source) in self.inputs.iter().enumerate() {
                values.push(match source {
                    FieldSource::Host { values, .. } => values.clone(),
                    FieldSource::Held(h) => match h.host_copy() {
                        Some(v) => FieldVec::clone(&v),
                        None => match h.read_on(dev) {
                            Ok(v) => v,
                            Err(e) => return gone(i, e),
                        },
                    },
                });
            }
            let job = match self.host_job(values) {
                Ok(job) => job,
                Err(e) => return Ok(Err(e)),
            };
            return Ok(Ok(FieldResult::Host(job.run_device(dev)?)));
        }
        if self.field() == Field::BabyBear {
            let words = Words {
                of: gpu::u32_words,
                per_element: 1,
                to_host: |_, v| FieldVec::BabyBear(v),
                exponent: gpu::exponent_limbs,
            };
            self.whole(dev, words)
        } else {
            let words = Words {
                of: gpu::u64_words,
                per_element: width / 8,
                to_host: gpu::from_u64,
                // Four u64 words an exponent, beside any field's elements.
                exponent: |e| e.iter().flat_map(|e| e.0).collect(),
            };
            self.whole(dev, words)
        }
    }

    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        // An inversion's zeros are the kernels' finding: both sides must agree on them.
        let zeros = |r: &Self::Output| r.as_ref().err().and_then(|e| e.not_invertible.clone());
        if zeros(device) != zeros(cpu) {
            return Err(format!(
                "zeros: the device found {:?}, the CPU {:?}",
                zeros(device),
                zeros(cpu)
            ));
        }
        // A side that could not read an operand (deleted, or lost with its device, before
        // the check came round) computed nothing to compare: that says nothing against
        // the kernels, and must not quarantine them.
        let (Ok(device), Ok(cpu)) = (device, cpu) else {
            return Ok(());
        };
        let FieldResult::Host(cpu) = cpu else {
            return Err("the CPU twin kept its result on a device".into());
        };
        let device = match device {
            FieldResult::Host(v) => Cow::Borrowed(v),
            FieldResult::Held(h) => match h.download() {
                Ok(v) => Cow::Owned(v),
                // Deleted (or its device rebuilt) before the check came round: nothing is
                // left to compare, which says nothing against the kernels.
                Err(e) => {
                    tracing::debug!(error = %e, "a kept result was gone before its shadow check");
                    return Ok(());
                }
            },
        };
        crate::backend::verify::exactly(&*device, cpu)
    }
}
