//! What a job computes: one variant per op family. Adding an op means one variant here,
//! its CPU and GPU entry points in `ops/`, and one handler.

use crate::backend::cuda::DeviceLease;
use crate::backend::DeviceError;
use crate::ops::dp::{self, Gradients, NoiseJob, PrivatizeJob, Privatized};
use crate::ops::rf::{self, ExtractError, Extraction};
use crate::ops::zk::msm::{MsmJob, Points};
use crate::ops::zk::ntt::NttJob;
use crate::ops::zk::{self, FieldBinaryJob, FieldInvJob, FieldPowJob, FieldVec};

pub enum Work {
    FieldBinary(FieldBinaryJob),
    FieldPow(FieldPowJob),
    FieldInv(FieldInvJob),
    Ntt(NttJob),
    Msm(MsmJob),
    DpPrivatize(PrivatizeJob),
    DpNoise(NoiseJob),
    RfFeatures(rf::FeaturesJob),
}

pub enum Output {
    Field(FieldVec),
    /// One sum per scalar vector of an MSM.
    Points(Points),
    Privatized(Privatized),
    Values(Vec<f64>),
    RfFeatures(Result<Extraction, ExtractError>),
}

impl Work {
    /// The op's name in metrics and logs.
    pub fn op_name(&self) -> &'static str {
        match self {
            Work::FieldBinary(j) => j.op().name(),
            Work::FieldPow(_) => "field_pow",
            Work::FieldInv(_) => "field_inv",
            Work::Ntt(j) => j.direction.name(),
            Work::Msm(_) => "msm",
            Work::DpPrivatize(_) => "dp_privatize",
            Work::DpNoise(j) => j.mechanism.name(),
            Work::RfFeatures(_) => "rf_features",
        }
    }

    pub fn elements(&self) -> usize {
        match self {
            Work::FieldBinary(j) => j.len(),
            Work::FieldPow(j) => j.len(),
            Work::FieldInv(j) => j.len(),
            Work::Ntt(j) => j.values.len(),
            Work::Msm(j) => j.terms(),
            Work::DpPrivatize(j) => j.gradients.len(),
            Work::DpNoise(j) => j.len(),
            Work::RfFeatures(j) => j.iq.len(),
        }
    }

    pub fn input_bytes(&self) -> usize {
        match self {
            Work::FieldBinary(j) => j.input_bytes(),
            Work::FieldPow(j) => j.input_bytes(),
            Work::FieldInv(j) => j.input_bytes(),
            Work::Ntt(j) => j.values.byte_len(),
            Work::Msm(j) => j.input_bytes(),
            Work::DpPrivatize(j) => match &j.gradients {
                Gradients::F32(g) => 4 * g.len(),
                Gradients::F64(g) => 8 * g.len(),
            },
            Work::DpNoise(j) => 8 * j.len(),
            Work::RfFeatures(j) => 8 * j.iq.len(),
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
                (zk::Field::Bls12_381Fr, zk::FieldOp::Mul) => 1 << 12,
                (zk::Field::Bls12_381Fr, _) => 1 << 15,
                (zk::Field::Goldilocks | zk::Field::BabyBear, _) => 1 << 17,
            },
            // 256 squarings per element: compute-bound from small sizes on.
            Work::FieldPow(_) => 1 << 10,
            Work::FieldInv(_) => 1 << 14,
            Work::Ntt(_) => 1 << 14,
            // A 2^10 MSM takes the CPU about a millisecond: less than a device round trip
            // with its seven launches.
            Work::Msm(_) => 1 << 12,
            // Sampling exact noise costs the CPU about a microsecond per value.
            Work::DpNoise(_) => 1 << 12,
            Work::DpPrivatize(_) => 1 << 18,
            // The CPU extracts a million samples in about 5 ms on one core of the
            // development machine, and its chunks run in parallel.
            Work::RfFeatures(_) => 1 << 20,
        }
    }

    /// Whether `run_cuda` can run this job; `auto` keeps the others on the CPU and
    /// `backend: cuda` refuses them.
    pub fn has_cuda_kernel(&self) -> bool {
        match self {
            Work::RfFeatures(j) => j.fits_device(),
            _ => true,
        }
    }

    pub fn run_cpu(&self) -> Output {
        match self {
            Work::FieldBinary(j) => Output::Field(j.run_cpu()),
            Work::FieldPow(j) => Output::Field(j.run_cpu()),
            Work::FieldInv(j) => Output::Field(j.run_cpu()),
            Work::Ntt(j) => Output::Field(j.run_cpu()),
            Work::Msm(j) => Output::Points(j.run_cpu()),
            Work::DpPrivatize(j) => Output::Privatized(j.run_cpu()),
            Work::DpNoise(j) => Output::Values(j.run_cpu()),
            Work::RfFeatures(j) => Output::RfFeatures(j.run_cpu()),
        }
    }

    pub fn run_cuda(&self, dev: &DeviceLease<'_>) -> Result<Output, DeviceError> {
        match self {
            Work::FieldBinary(j) => zk::run_field_binary_cuda(j, dev).map(Output::Field),
            Work::FieldPow(j) => zk::run_field_pow_cuda(j, dev).map(Output::Field),
            Work::FieldInv(j) => zk::run_field_inv_cuda(j, dev).map(Output::Field),
            Work::Ntt(j) => zk::run_ntt_cuda(j, dev).map(Output::Field),
            Work::Msm(j) => zk::run_msm_cuda(j, dev).map(Output::Points),
            Work::DpPrivatize(j) => dp::run_privatize_cuda(j, dev).map(Output::Privatized),
            Work::DpNoise(j) => dp::run_noise_cuda(j, dev).map(Output::Values),
            Work::RfFeatures(j) => j.run_cuda(dev).map(Output::RfFeatures),
        }
    }
}
