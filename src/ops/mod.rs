//! The domains: maths only, no HTTP. Each op is a job type (`backend::Job`) beside its CPU
//! twin (the oracle) and its device launcher; each domain registers its kernel modules
//! and the self-tests every device passes before it serves the domain's ops.
pub mod beams;
pub mod dp;
pub mod he;
pub mod invalid;
mod kernels;
pub mod linalg;
pub mod mpc;
pub mod nn;
pub mod rf;
#[cfg(test)]
pub(crate) mod testing;
pub mod zk;

pub use invalid::{FieldPath, Invalid};
pub use kernels::kernel_library;

/// Every domain's self-tests (`backend::verify`), one or more per op with a device path.
pub fn self_tests() -> Vec<Box<dyn crate::backend::verify::SelfTest>> {
    let mut tests = zk::self_test::self_tests();
    tests.extend(dp::self_test::self_tests());
    tests.extend(rf::self_test::self_tests());
    tests.extend(linalg::self_test::self_tests());
    tests.extend(nn::self_test::self_tests());
    tests.extend(beams::self_test::self_tests());
    tests.extend(mpc::self_test::self_tests());
    tests.extend(he::self_test::self_tests());
    // Last: the kernels' self-tests above ran on our own kernels, before cuBLASLt and
    // cuDNN may take their work.
    tests.push(linalg::self_test::blaslt_check());
    tests.push(nn::self_test::cudnn_check());
    tests
}

/// `gpu-ops check`'s parity cases: every op with a device path at the level's sizes
/// (production sizes at `standard`), each described for the report. They run through
/// the same `SelfTest` code as the start-up self-test; the check adds sizes and timing.
pub fn check_cases(
    level: crate::backend::measure::CheckLevel,
) -> Vec<Box<dyn crate::backend::verify::SelfTest>> {
    let mut cases = zk::check_cases::check_cases(level);
    cases.extend(dp::check_cases::check_cases(level));
    cases.extend(rf::check_cases::check_cases(level));
    cases.extend(linalg::check_cases::check_cases(level));
    cases.extend(nn::check_cases::check_cases(level));
    cases.extend(beams::check_cases::check_cases(level));
    cases.extend(mpc::check_cases::check_cases(level));
    cases.extend(he::check_cases::check_cases(level));
    cases
}
