//! A kept step over whole buffers on the device: its inputs read where they are held or
//! uploaded, its result kept under the step's key when the cache has room.

use super::super::gpu;
use super::{Field, FieldShape, FieldVec, InvError, U256};
use super::{FieldResult, FieldSource, FieldStep, HeldVector, KeptFieldJob, StepFailed};
use crate::backend::{DeviceBuffer, DeviceError, DeviceErrorKind, DeviceLease, Element};
use crate::ops::linalg::any_zero_element;
use std::sync::Arc;

/// How a field's elements are the kernels' words `T`.
pub(super) struct Words<T> {
    pub of: fn(&FieldVec) -> &[T],
    pub per_element: usize,
    pub to_host: fn(Field, Vec<T>) -> FieldVec,
    /// Exponents as the pow kernel reads them (`gpu::launch_field_pow`).
    pub exponent: fn(&[U256]) -> Vec<T>,
}

impl KeptFieldJob {
    /// The step over whole buffers: the inputs read where they are held or uploaded,
    /// the result kept under `keep` when the cache has room (else downloaded).
    pub(super) fn whole<T: Element>(
        &self,
        dev: &DeviceLease<'_>,
        words: Words<T>,
    ) -> Result<Result<FieldResult, StepFailed>, DeviceError> {
        let w = words.per_element;
        let mut ins = Vec::with_capacity(self.inputs.len());
        for (i, source) in self.inputs.iter().enumerate() {
            match on_device(dev, source, words.of) {
                Ok(b) => ins.push(b),
                Err(e) if e.kind == DeviceErrorKind::Unsupported => return gone(i, e),
                Err(e) => return Err(e),
            }
        }
        let out = match &self.step {
            FieldStep::Binary(op) => {
                let stride = u32::from(self.inputs[1].len() == self.len());
                let kernel = gpu::kernel_name(self.field(), *op);
                pair(dev, &kernel, (&ins[0], &ins[1]), (self.len(), w), stride)?
            }
            FieldStep::Pow(exponents) => {
                let stride = u32::from(exponents.len() == self.len());
                let exps = dev.upload(&(words.exponent)(exponents))?;
                let kernel = format!("{}_pow", self.field().name());
                pair(dev, &kernel, (&ins[0], &exps), (self.len(), w), stride)?
            }
            FieldStep::Inv => {
                if let FieldSource::Held(h) = &self.inputs[0] {
                    // Zeros are looked for where the operand lies, and only a refusal
                    // reads it back; an engine without that kernel (wgpu's) reads it back
                    // to look on the host.
                    let words = (w * std::mem::size_of::<T>() / 4) as u32;
                    let zeros = match dev.has_kernel("any_zero_element") {
                        true => any_zero_element(dev, &ins[0], self.len(), words)?,
                        false => true,
                    };
                    if zeros {
                        if let Some(refused) = zeros_of(dev, h)? {
                            return Ok(Err(refused));
                        }
                    }
                }
                let kernel = format!("{}_inv", self.field().name());
                gpu::invert_whole(dev, &kernel, &ins[0], self.len())?
            }
            FieldStep::Ntt { .. } => {
                let plan = self.plan().expect("an NTT step");
                let source = ins.pop().expect("one input");
                // Transformed in place only when the upload is this job's own: a held
                // or cached buffer is copied first (another stream may still read it).
                let mut out = match (&self.inputs[0], Arc::try_unwrap(source)) {
                    (FieldSource::Host { key: None, .. }, Ok(fresh)) => fresh,
                    (_, Ok(shared)) => copied(dev, &shared)?,
                    (_, Err(shared)) => copied(dev, &shared)?,
                };
                let (tw, scale) = gpu::ntt_tables(dev, &plan, words.of)?;
                gpu::ntt_in_place(dev, &plan, w, &mut out, &tw, scale.as_deref())?;
                out
            }
        };
        let out = Arc::new(out);
        // Not kept for a job nobody waits for any more.
        dev.still_wanted()?;
        if let (Some(key), Some(device)) = (&self.keep, dev.handle()) {
            if dev.keep_table(key, out.clone())? {
                let shape = FieldShape {
                    field: self.field(),
                    len: self.len(),
                };
                return Ok(Ok(FieldResult::Held(Arc::new(HeldVector::new(
                    device.clone(),
                    key.clone(),
                    shape,
                )))));
            }
        }
        let host = dev.download(&out)?;
        Ok(Ok(FieldResult::Host((words.to_host)(self.field(), host))))
    }
}

/// `source` as a buffer on `dev` (which holds every held operand: `run_device`): its held
/// copy, a resident array's cached upload, or a fresh upload.
fn on_device<T: Element>(
    dev: &DeviceLease<'_>,
    source: &FieldSource,
    words: fn(&FieldVec) -> &[T],
) -> Result<Arc<DeviceBuffer<T>>, DeviceError> {
    match source {
        FieldSource::Held(h) => h.buffer_on(dev, |v| Ok(words(v))),
        FieldSource::Host {
            values,
            key: Some(key),
        } => dev.cached_table(key, || dev.upload(words(values))),
        FieldSource::Host { values, key: None } => Ok(Arc::new(dev.upload(words(values))?)),
    }
}

/// The binary and pow kernels' launch over whole buffers: `out[i] = x[i] (op) y[i * stride]`
/// for `n` elements of `per_element` words each.
fn pair<T: Element>(
    dev: &DeviceLease<'_>,
    kernel: &str,
    (x, y): (&DeviceBuffer<T>, &DeviceBuffer<T>),
    (n, per_element): (usize, usize),
    stride: u32,
) -> Result<DeviceBuffer<T>, DeviceError> {
    let mut out = dev.alloc_zeros::<T>(n * per_element)?;
    let n64 = n as u64;
    let mut launch = dev.launch(kernel)?;
    launch.arg(x).arg(y).arg(&mut out).arg(&n64).arg(&stride);
    // SAFETY: the kernel reads n elements of x, n (or 1, stride 0) of y, and writes n of
    // out; the buffers hold those words.
    unsafe { launch.launch(dev.launch_config(n)) }?;
    Ok(out)
}

/// A copy of `table` on the device, for a step that writes over it.
fn copied<T: Element>(
    dev: &DeviceLease<'_>,
    table: &DeviceBuffer<T>,
) -> Result<DeviceBuffer<T>, DeviceError> {
    let mut copy = dev.alloc_zeros::<T>(table.len())?;
    dev.copy(table, &mut copy)?;
    Ok(copy)
}

/// The refusal of an inversion whose held operand `h` has zeros, naming them: `h` read
/// back on `dev` (its device's lease) to find them; `None` when it has none (looked for
/// on the host where the engine has no kernel for it).
fn zeros_of(dev: &DeviceLease<'_>, h: &HeldVector) -> Result<Option<StepFailed>, DeviceError> {
    let values = match h.host_copy() {
        Some(v) => FieldVec::clone(&v),
        None => match h.read_on(dev) {
            Ok(v) => v,
            Err(e) => return gone::<()>(0, e).map(Result::err),
        },
    };
    match InvError::check(&values) {
        Err(e) => Ok(Some(super::not_invertible(e))),
        Ok(()) if dev.has_kernel("any_zero_element") => Err(DeviceError::fatal(
            "the device found a zero in a vector whose values read back have none",
        )),
        Ok(()) => Ok(None),
    }
}

/// The step's answer when operand `input` is no longer held: not a device failure.
/// (Any step's: a product's too, `ops::linalg::kept`.)
pub fn gone<R>(input: usize, e: DeviceError) -> Result<Result<R, StepFailed>, DeviceError> {
    if e.kind != DeviceErrorKind::Unsupported {
        return Err(e);
    }
    Ok(Err(StepFailed {
        input: Some(input),
        message: e.message,
        not_invertible: None,
    }))
}
