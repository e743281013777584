//! What a job computes: one variant per op family. Adding an op means one variant here,
//! its CPU and GPU entry points in `ops/`, and one handler.

use crate::backend::cuda::DeviceLease;
use crate::backend::DeviceError;
use crate::ops::zk::{self, FieldBinaryJob, FieldVec};

pub enum Work {
    FieldBinary(FieldBinaryJob),
}

pub enum Output {
    Field(FieldVec),
}

impl Work {
    /// The op's name in metrics and logs.
    pub fn op_name(&self) -> &'static str {
        match self {
            Work::FieldBinary(j) => j.op().name(),
        }
    }

    pub fn elements(&self) -> usize {
        match self {
            Work::FieldBinary(j) => j.len(),
        }
    }

    pub fn input_bytes(&self) -> usize {
        match self {
            Work::FieldBinary(j) => j.input_bytes(),
        }
    }

    /// Under this many elements `auto` uses the CPU: a device round trip (two uploads,
    /// a launch, a download) costs tens of microseconds before any arithmetic.
    /// Provisional until measured on a GPU host (docs/PERFORMANCE.md).
    pub fn gpu_min_elements(&self) -> usize {
        match self {
            Work::FieldBinary(j) => match (j.field(), j.op()) {
                (zk::Field::Bn254Fr, zk::FieldOp::Mul) => 1 << 12,
                (zk::Field::Bn254Fr, _) => 1 << 15,
                (zk::Field::Goldilocks, _) => 1 << 17,
            },
        }
    }

    pub fn run_cpu(&self) -> Output {
        match self {
            Work::FieldBinary(j) => Output::Field(j.run_cpu()),
        }
    }

    pub fn run_cuda(&self, dev: &DeviceLease<'_>) -> Result<Output, DeviceError> {
        match self {
            Work::FieldBinary(j) => zk::run_field_binary_cuda(j, dev).map(Output::Field),
        }
    }
}
