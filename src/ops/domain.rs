//! What a domain registers with the rest of the service, once: its kernel modules, the
//! ops it serves on a device, the self-tests every device passes before serving them,
//! and `gpu-ops check`'s cases. The kernel library, the start-up self-test, the check
//! and the device tests all read `ops::DOMAINS`; nothing else lists a domain's ops.

use crate::backend::cuda::kernels::KernelModule;
use crate::backend::measure::CheckLevel;
use crate::backend::verify::SelfTest;

pub struct Domain {
    /// The domain's folder under `ops/`.
    pub name: &'static str,
    /// The ops with a device path, as `Job::name` says them: what the self-tests vouch
    /// for, each named by one of them (`tests::self_tests_vouch_for_exactly_the_device_ops`).
    pub device_ops: &'static [&'static str],
    /// The domain's CUDA modules (`kernels/*.cu`).
    pub kernel_modules: fn() -> Vec<KernelModule>,
    /// One or more per device op, on our own kernels.
    pub self_tests: fn() -> Vec<Box<dyn SelfTest>>,
    /// Vendor libraries that may take the domain's kernels' work (cuBLASLt, cuDNN),
    /// checked against those kernels: run after every domain's own self-tests.
    pub library_checks: fn() -> Vec<Box<dyn SelfTest>>,
    /// `gpu-ops check`'s parity cases at a level's sizes.
    pub check_cases: fn(CheckLevel) -> Vec<Box<dyn SelfTest>>,
}

/// For a domain without vendor libraries.
pub fn no_library_checks() -> Vec<Box<dyn SelfTest>> {
    Vec::new()
}
