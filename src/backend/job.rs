//! What an executor runs. Each operation's job type lives in `ops/<domain>/`, beside its
//! CPU twin and its device launcher, and implements [`Job`]; the pool runs any job through
//! this trait and hands the caller the job's own output type, so nothing above the ops
//! enumerates them.

use super::device::{DeviceError, DeviceLease};
use std::fmt::Debug;
use std::hash::Hash;

pub trait Job: Send + Sync + 'static {
    /// Clone: a shadow check keeps a copy of a sampled device output.
    type Output: Clone + Send + 'static;

    /// The op's name in metrics and logs (`field_add`, `ntt_forward`, …).
    fn name(&self) -> &'static str;

    /// Work items (elements, terms, values, samples): counted in metrics, and the size
    /// axis of placement's cost model.
    fn size(&self) -> usize;

    /// What besides the size makes one job of this op cost differently from another on
    /// a side (the field, the dtype, a shape class): placement measures each lane apart.
    /// "" for an op with one lane.
    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("")
    }

    /// Bytes of input, for the bytes-processed metric.
    fn input_bytes(&self) -> usize;

    /// Placement's prior, used only until anything of this op has been measured on this
    /// host (and as the whole rule under `--placement threshold`): under this `size` the
    /// job stays on the CPU. Written before any GPU was measured; measurements decide.
    fn gpu_threshold(&self) -> usize;

    /// Why `run_device` cannot take this job (a shape its kernels do not cover), if so:
    /// `auto` then keeps it on the CPU, and `backend: cuda` is refused with this reason.
    fn device_refusal(&self) -> Option<String> {
        None
    }

    /// Whether this instance's CPU run takes microseconds and stays on the calling
    /// thread (no rayon fan-out at this size). Such a job runs on the worker that took it
    /// from the queue instead of hopping to the compute threads and back
    /// (`--cpu-inline-small-jobs`): for the smallest requests that hop, and the wake-ups
    /// around it, cost more than the arithmetic.
    fn runs_inline(&self) -> bool {
        false
    }

    /// The device (by ordinal) that holds operands of this job no other side has: kept
    /// results not read back yet. `auto` and `gpu` run the job there while it is
    /// usable, so those operands cross no bus; elsewhere the job reads them back first.
    fn resident_on(&self) -> Option<usize> {
        None
    }

    /// The CPU twin: the oracle every device result is held to.
    fn run_cpu(&self) -> Self::Output;

    /// The device launcher, on a leased device.
    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Self::Output, DeviceError>;

    /// Whether a device output agrees with the CPU twin's: integers bit for bit, floats
    /// within the op's documented tolerance. The self-test and the shadow checks hold
    /// every device to it; `Err` says where they part.
    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String>;
}

/// A job whose small instances may share one run: concatenated, run once, and the output
/// split back, each caller getting exactly what its own job would have returned.
pub trait Batchable: Job + Sized {
    /// Jobs are concatenated only within one lane (e.g. one field and one op).
    type Lane: Hash + Eq + Clone + Debug + Send + Sync + 'static;

    fn lane(&self) -> Self::Lane;

    /// One job over every input, in order. `jobs` is non-empty and of one lane.
    fn concat(jobs: Vec<Self>) -> Self;

    /// The concatenated job's output cut into consecutive parts of the given sizes
    /// (each part's job `size`).
    fn split(output: Self::Output, sizes: &[usize]) -> Vec<Self::Output>;
}
