//! Products whose operands a device may hold and whose result may stay there. A matmul
//! asked to keep D without answering it (`keep` with `with_data: false`) leaves D in the
//! device's cache of copies, rounded to its dtype there, instead of downloading it; a
//! later product that names it (an operand the compute precision takes as it is,
//! `Compute::keeps`) runs on that device (`Job::resident_on`) and reads it in place. So a
//! chain of layers crosses the bus with its first operands and its last answer only, as
//! the field ops' and NTT's chains do (`ops::zk::held`). The CPU twin, the shadow check
//! and a product too large to hold whole read held operands back first.

use super::gpu::{matmul_pass, run_matmul_on, MatmulPass, MatmulProvider, PassOperand};
use super::held::{HeldTensor, TensorShape};
use super::matmul::{MatmulJob, Operands, Values};
use super::on_device::round_output;
use super::{Compute, Dtype};
use crate::backend::{DeviceBuffer, DeviceError, DeviceLease, Job};
use crate::ops::zk::held::{gone, StepFailed};
use crate::wire::Array;
use std::borrow::Cow;
use std::sync::Arc;

/// A product's D: on the host (rounded to its dtype), or held on the device that made it.
#[derive(Clone)]
pub enum TensorResult {
    Host(Values),
    Held(Arc<HeldTensor>),
}

/// Where a result stays: its key in the device's cache and its shape as answered.
#[derive(Clone, Debug)]
pub struct KeepOnDevice {
    pub key: String,
    pub shape: Vec<usize>,
}

impl KeepOnDevice {
    /// `d`, a whole result, rounded to `dtype` where it lies and kept in `dev`'s cache
    /// under the key. Downloaded instead (rounded) when a value is not finite, so the
    /// answer can name the first; when the cache has no room; or on a lease without a
    /// device's handle.
    pub fn keep(
        &self,
        dev: &DeviceLease<'_>,
        mut d: DeviceBuffer<f32>,
        dtype: Dtype,
    ) -> Result<TensorResult, DeviceError> {
        let Some(device) = dev.handle() else {
            let mut out = dev.download(&d)?;
            dtype.round_all(&mut out);
            return Ok(TensorResult::Host(Values::F32(out.into())));
        };
        let non_finite = round_output(dev, &mut d, dtype)?;
        let d = Arc::new(d);
        if !non_finite && dev.keep_table(&self.key, d.clone())? {
            let meta = TensorShape {
                dtype,
                shape: self.shape.clone(),
            };
            let held = HeldTensor::new(device.clone(), self.key.clone(), meta);
            return Ok(TensorResult::Held(Arc::new(held)));
        }
        Ok(TensorResult::Host(Values::F32(dev.download(&d)?.into())))
    }
}

/// A matmul over operands some of which a device holds, whose D may stay on the device.
pub struct KeptMatmulJob {
    /// The product, checked, with the held operands' values left empty
    /// (`MatmulJob::checked`).
    template: MatmulJob,
    /// A, B and C where a device holds them.
    held: [Option<Arc<HeldTensor>>; 3],
    keep: Option<KeepOnDevice>,
}

impl KeptMatmulJob {
    /// `template`'s product with `held`'s operands in place of its empty ones (each of
    /// the shape's length, in a dtype `template.compute` keeps: `HeldTensor::serves`).
    pub fn new(
        template: MatmulJob,
        held: [Option<Arc<HeldTensor>>; 3],
        keep: Option<KeepOnDevice>,
    ) -> Self {
        Self {
            template,
            held,
            keep,
        }
    }

    pub fn shape(&self) -> super::MatmulShape {
        self.template.shape
    }

    pub fn compute(&self) -> Compute {
        self.template.compute
    }

    pub fn output(&self) -> super::Dtype {
        self.template.output
    }

    fn held_operands(&self) -> impl Iterator<Item = &Arc<HeldTensor>> {
        self.held.iter().flatten()
    }

    /// The product with every operand on the host, each held one read by `read` (its
    /// host copy first, if it was read back before). Err: which operand, and why not.
    fn filled(
        &self,
        read: impl Fn(&HeldTensor) -> Result<Values, DeviceError>,
    ) -> Result<MatmulJob, (usize, DeviceError)> {
        let mut job = self.template.clone();
        let Operands::F32 { a, b, c } = &mut job.operands else {
            return Ok(job);
        };
        let mut slots = [Some(a), Some(b), c.as_mut()];
        for (i, h) in self.held.iter().enumerate() {
            let (Some(h), Some(slot)) = (h, slots[i].take()) else {
                continue;
            };
            let values = match h.host_copy() {
                Some(v) => Values::clone(&v),
                None => read(h).map_err(|e| (i, e))?,
            };
            *slot = values.into_f32_array();
        }
        Ok(job)
    }

    /// Operand `i` (A, B, C) on `dev`, which holds every held one (`run_device`): its held
    /// copy (or its host copy, uploaded, if it was read back and evicted since), a
    /// resident array's cached upload, or a fresh upload of `host`.
    fn on_device(
        &self,
        dev: &DeviceLease<'_>,
        i: usize,
        host: &Array<f32>,
    ) -> Result<Arc<DeviceBuffer<f32>>, DeviceError> {
        if let Some(h) = &self.held[i] {
            return h.buffer_on(dev, |values| match values {
                Values::F32(v) => Ok(&v[..]),
                Values::F64(_) => Err(DeviceError::unsupported("an f64 tensor is never held")),
            });
        }
        match &self.template.device_keys[i] {
            Some(key) => dev.cached_table(key, || dev.upload(host)),
            None => Ok(Arc::new(dev.upload(host)?)),
        }
    }

    /// The whole product in one pass on `dev`, D kept under `keep` when it may stay.
    fn whole(
        &self,
        dev: &DeviceLease<'_>,
        (a, b, c): (&Array<f32>, &Array<f32>, Option<&Array<f32>>),
    ) -> Result<Result<TensorResult, StepFailed>, DeviceError> {
        let job = &self.template;
        let s = job.shape;
        let mut ins = Vec::with_capacity(3);
        for (i, host) in [Some(a), Some(b), c].into_iter().enumerate() {
            let Some(host) = host else { break };
            match self.on_device(dev, i, host) {
                Ok(buffer) => ins.push(buffer),
                Err(e) => return gone(i, e),
            }
        }
        let mut d = dev.alloc_zeros::<f32>(s.out_len())?;
        let pass = MatmulPass::of(job, s.batch);
        let provider = MatmulProvider::for_device(dev);
        let d_c = ins.get(2).map(|c| c.as_ref());
        matmul_pass(
            dev,
            provider,
            job.compute,
            &pass,
            (PassOperand::F32(&ins[0]), PassOperand::F32(&ins[1])),
            d_c,
            &mut d,
        )?;
        // Not kept for a job nobody waits for any more.
        dev.still_wanted()?;
        if let Some(keep) = &self.keep {
            return Ok(Ok(keep.keep(dev, d, job.output)?));
        }
        let mut out = dev.download(&d)?;
        job.output.round_all(&mut out);
        Ok(Ok(TensorResult::Host(Values::F32(out.into()))))
    }
}

impl Job for KeptMatmulJob {
    type Output = Result<TensorResult, StepFailed>;

    fn name(&self) -> &'static str {
        "matmul"
    }

    /// The plain product's lane, apart: a kept product's device time has no download,
    /// and one over held operands no upload of them.
    fn placement_lane(&self) -> Cow<'static, str> {
        format!("{}/kept", self.template.placement_lane()).into()
    }

    fn size(&self) -> usize {
        self.template.size()
    }

    /// The bytes that cross to a device: the operands not held there.
    fn input_bytes(&self) -> usize {
        let s = self.template.shape;
        let c = if self.template.has_c() { s.c_len() } else { 0 };
        [s.a_len(), s.b_len(), c]
            .iter()
            .zip(&self.held)
            .filter(|(_, h)| h.is_none())
            .map(|(len, _)| len * self.template.input.bytes())
            .sum()
    }

    fn gpu_threshold(&self) -> usize {
        self.template.gpu_threshold()
    }

    fn device_refusal(&self) -> Option<String> {
        self.template.device_refusal()
    }

    fn resident_on(&self) -> Option<usize> {
        self.held_operands().next().map(|h| h.ordinal())
    }

    fn run_cpu(&self) -> Self::Output {
        let job = self.filled(|h| h.download()).map_err(|(i, e)| StepFailed {
            input: Some(i),
            message: e.message,
            not_invertible: None,
        })?;
        Ok(TensorResult::Host(job.run_cpu()))
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Self::Output, DeviceError> {
        // An operand another device holds would need a lease there while this one is
        // held (two jobs doing that the other way round would wait for each other for
        // ever): the CPU run reads each back in turn instead.
        let here = dev.device.info.ordinal;
        if let Some(h) = self.held_operands().find(|h| h.ordinal() != here) {
            return Err(DeviceError::unsupported(format!(
                "an operand is held on device {}, not {here}: the product runs on the CPU",
                h.ordinal()
            )));
        }
        let Operands::F32 { a, b, c } = &self.template.operands else {
            return Err(DeviceError::unsupported("f64 matmul runs on the CPU only"));
        };
        let s = self.template.shape;
        let packed = MatmulProvider::for_device(dev).packs(self.template.compute);
        let (entry, shared) = s.device_bytes(c.is_some(), packed);
        if entry * s.batch + shared > dev.memory_budget() {
            // Too large to hold whole: the plain launcher's passes over host values, held
            // operands read back on this lease (another would wait for this one).
            let mut job = match self.filled(|h| h.read_on(dev)) {
                Ok(job) => job,
                Err((i, e)) => return gone(i, e),
            };
            // A held operand is not cached a second time under its array's key.
            for (key, held) in job.device_keys.iter_mut().zip(&self.held) {
                if held.is_some() {
                    *key = None;
                }
            }
            let provider = MatmulProvider::for_device(dev);
            return Ok(Ok(TensorResult::Host(run_matmul_on(&job, dev, provider)?)));
        }
        self.whole(dev, (a, b, c.as_ref()))
    }

    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        kept_agree(
            device,
            cpu,
            || self.filled(|h| h.download()).map_err(|(_, e)| e),
            |job, d, c| job.agrees(d, c),
        )
    }
}

/// The shadow check of a job that may keep its result: the device's values (a kept result
/// read back) against the CPU twin's, by `check` over the job with its held operands read
/// back (`filled`). A side that could not read an operand (deleted, or lost with its
/// device, before the check came round) computed nothing to compare, nor can a check
/// whose held values are gone since: that says nothing against the kernels, and must not
/// quarantine them.
pub fn kept_agree<J>(
    device: &Result<TensorResult, StepFailed>,
    cpu: &Result<TensorResult, StepFailed>,
    filled: impl FnOnce() -> Result<J, DeviceError>,
    check: impl FnOnce(&J, &Values, &Values) -> Result<(), String>,
) -> Result<(), String> {
    let (Ok(device), Ok(cpu)) = (device, cpu) else {
        return Ok(());
    };
    let TensorResult::Host(cpu) = cpu else {
        return Err("the CPU twin kept its result on a device".into());
    };
    let device = match device {
        TensorResult::Host(v) => Cow::Borrowed(v),
        TensorResult::Held(h) => match h.download() {
            Ok(v) => Cow::Owned(v),
            Err(e) => {
                tracing::debug!(error = %e, "a kept result was gone before its shadow check");
                return Ok(());
            }
        },
    };
    match filled() {
        Ok(job) => check(&job, &device, cpu),
        Err(e) => {
            tracing::debug!(error = %e, "a held operand was gone before the shadow check");
            Ok(())
        }
    }
}
