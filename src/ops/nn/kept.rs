//! Convolutions whose input a device may hold and whose output may stay there: a layer
//! asked to keep its output without answering it (`keep` with `with_data: false`) leaves
//! it in the device's cache of copies, rounded to its dtype there, and the next layer
//! that names it as its input runs there and copies its images out where they lie, as
//! products read theirs (`ops::linalg::kept`). So a stack of convolutions crosses the bus
//! with its first input and its last answer only. (A held tensor keeps its shape: a
//! product's D, of rank 2 or 3, is no convolution's input, nor a convolution's output a
//! product's operand.) The CPU twin and the shadow check read a held input back first.

use super::conv2d::{Conv2dJob, ConvTensors};
use super::conv_launch::{conv2d_between, ConvEnds, ConvProvider};
use crate::backend::{DeviceBuffer, DeviceError, DeviceLease, Job};
use crate::ops::invalid::{FieldPath, Invalid};
use crate::ops::linalg::held::HeldTensor;
use crate::ops::linalg::kept::{kept_agree, KeepOnDevice, TensorResult};
use crate::ops::linalg::{Dtype, Values};
use crate::ops::zk::held::{gone, StepFailed};
use std::borrow::Cow;
use std::sync::Arc;

/// A convolution over images a device may hold, whose output may stay on the device.
pub struct KeptConv2dJob {
    /// The convolution, checked, its input left empty when `held` has it
    /// (`Conv2dJob::checked`).
    template: Conv2dJob,
    /// The input (NCHW, in the job's input dtype) where a device holds it.
    held: Option<Arc<HeldTensor>>,
    keep: Option<KeepOnDevice>,
}

impl KeptConv2dJob {
    /// `template` over `held`'s images when given (its own input then empty: a held
    /// tensor of the shape's length), else over its own (of the shape's length).
    pub fn new(
        template: Conv2dJob,
        held: Option<Arc<HeldTensor>>,
        keep: Option<KeepOnDevice>,
    ) -> Result<Self, Invalid> {
        let want = template.shape.input_len();
        let (sent, wide) = match &template.tensors {
            ConvTensors::F32 { input, .. } => (input.len(), false),
            ConvTensors::F64 { input, .. } => (input.len(), true),
        };
        let invalid = |why: String| Err(Invalid::new(FieldPath::root().field("input"), why));
        match &held {
            Some(_) if sent > 0 || wide => {
                return invalid("images both held on a device and sent, or held in f64".into())
            }
            Some(h) if h.len() != want => {
                return invalid(format!(
                    "{} values held where the shape needs {want}",
                    h.len()
                ))
            }
            None if sent != want => {
                return invalid(format!("{sent} values where the shape needs {want}"))
            }
            _ => {}
        }
        Ok(Self {
            template,
            held,
            keep,
        })
    }

    pub fn shape(&self) -> super::Conv2dShape {
        self.template.shape
    }

    pub fn output(&self) -> Dtype {
        self.template.output
    }

    /// The convolution with its input on the host, a held one read by `read` (its host
    /// copy first, if it was read back before).
    fn filled(
        &self,
        read: impl Fn(&HeldTensor) -> Result<Values, DeviceError>,
    ) -> Result<Conv2dJob, DeviceError> {
        let mut job = self.template.clone();
        let (Some(h), ConvTensors::F32 { input, .. }) = (&self.held, &mut job.tensors) else {
            return Ok(job);
        };
        let values = match h.host_copy() {
            Some(v) => Values::clone(&v),
            None => read(h)?,
        };
        *input = values.into_f32();
        Ok(job)
    }

    /// Bytes a device holds at once to keep the whole output: it, the weights and one
    /// image's input, windows and output.
    fn kept_bytes(&self) -> usize {
        let s = self.template.shape;
        let image = s.channels * s.height * s.width;
        let windows = s.groups * s.window() * s.positions();
        let out_image = s.out_channels * s.positions();
        4 * (s.out_len() + s.weight_len() + image + windows + out_image)
    }
}

impl Job for KeptConv2dJob {
    type Output = Result<TensorResult, StepFailed>;

    fn name(&self) -> &'static str {
        "conv2d"
    }

    /// The plain convolution's lane, apart: a kept one's device time has no download,
    /// and one over a held input no upload of it.
    fn placement_lane(&self) -> Cow<'static, str> {
        format!("{}/kept", self.template.placement_lane()).into()
    }

    fn size(&self) -> usize {
        self.template.size()
    }

    /// The bytes that cross to a device: the weights, and the input unless held there.
    fn input_bytes(&self) -> usize {
        let s = self.template.shape;
        let input = if self.held.is_some() {
            0
        } else {
            s.input_len()
        };
        (input + s.weight_len()) * self.template.input.bytes()
    }

    fn gpu_threshold(&self) -> usize {
        self.template.gpu_threshold()
    }

    fn device_refusal(&self) -> Option<String> {
        self.template.device_refusal()
    }

    fn resident_on(&self) -> Option<usize> {
        self.held.as_ref().map(|h| h.ordinal())
    }

    fn run_cpu(&self) -> Self::Output {
        let job = self.filled(|h| h.download()).map_err(|e| StepFailed {
            input: Some(0),
            message: e.message,
            not_invertible: None,
        })?;
        Ok(TensorResult::Host(job.run_cpu()))
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Self::Output, DeviceError> {
        let here = dev.device.info.ordinal;
        if let Some(h) = self.held.as_ref().filter(|h| h.ordinal() != here) {
            return Err(DeviceError::unsupported(format!(
                "the input is held on device {}, not {here}: the convolution runs on the CPU",
                h.ordinal()
            )));
        }
        let input = match &self.held {
            Some(h) => match h.buffer_on(dev, |values| match values {
                Values::F32(v) => Ok(&v[..]),
                Values::F64(_) => Err(DeviceError::unsupported("an f64 tensor is never held")),
            }) {
                Ok(buffer) => Some(buffer),
                Err(e) => return gone(0, e),
            },
            None => None,
        };
        // Kept only when the whole output fits beside a pass's work; else downloaded.
        let keep = self
            .keep
            .as_ref()
            .filter(|_| self.kept_bytes() <= dev.memory_budget());
        let mut output: Option<DeviceBuffer<f32>> = keep
            .map(|_| dev.alloc_zeros(self.template.shape.out_len()))
            .transpose()?;
        let ends = ConvEnds {
            input: input.as_deref(),
            output: output.as_mut(),
        };
        let mut host = conv2d_between(&self.template, dev, ConvProvider::for_device(dev), ends)?;
        // Not kept for a job nobody waits for any more.
        dev.still_wanted()?;
        if let (Some(keep), Some(d)) = (keep, output) {
            return Ok(Ok(keep.keep(dev, d, self.template.output)?));
        }
        self.template.output.round_all(&mut host);
        Ok(Ok(TensorResult::Host(Values::F32(host.into()))))
    }

    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        kept_agree(
            device,
            cpu,
            || self.filled(|h| h.download()),
            |job, d, c| job.agrees(d, c),
        )
    }
}
