//! The domains: maths only, no HTTP. Each op is a job type (`backend::Job`) beside its CPU
//! twin (the oracle) and its device launcher; each domain registers its kernel modules
//! and the self-tests every device passes before it serves the domain's ops.
pub mod beams;
mod domain;
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

pub use domain::Domain;
pub use invalid::{FieldPath, Invalid};
pub use kernels::{kernel_library, wgsl_library};

/// Every domain, registered once: a new domain is one line here (and its `pub mod`).
pub const DOMAINS: &[Domain] = &[
    zk::DOMAIN,
    dp::DOMAIN,
    rf::DOMAIN,
    linalg::DOMAIN,
    nn::DOMAIN,
    beams::DOMAIN,
    mpc::DOMAIN,
    he::DOMAIN,
];

/// Every domain's self-tests (`backend::verify`), one or more per op with a device path;
/// last the vendor libraries' checks, since they compare a library with kernels the
/// self-tests before them verified.
pub fn self_tests() -> Vec<Box<dyn crate::backend::verify::SelfTest>> {
    let mut tests: Vec<_> = DOMAINS.iter().flat_map(|d| (d.self_tests)()).collect();
    tests.extend(DOMAINS.iter().flat_map(|d| (d.library_checks)()));
    tests
}

/// `gpu-ops check`'s parity cases: every op with a device path at the level's sizes
/// (production sizes at `standard`), each described for the report. They run through
/// the same `SelfTest` code as the start-up self-test; the check adds sizes and timing.
pub fn check_cases(
    level: crate::backend::measure::CheckLevel,
) -> Vec<Box<dyn crate::backend::verify::SelfTest>> {
    DOMAINS
        .iter()
        .flat_map(|d| (d.check_cases)(level))
        .collect()
}

/// Every op with a device path, in the domains' order.
pub fn device_ops() -> Vec<&'static str> {
    DOMAINS
        .iter()
        .flat_map(|d| d.device_ops.iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn self_tests_vouch_for_exactly_the_device_ops() {
        for d in DOMAINS {
            let declared: BTreeSet<&str> = d.device_ops.iter().copied().collect();
            assert_eq!(
                declared.len(),
                d.device_ops.len(),
                "{}: a repeated op",
                d.name
            );
            let tested: BTreeSet<&str> = (d.self_tests)().iter().map(|t| t.op()).collect();
            assert_eq!(tested, declared, "{}", d.name);
        }
        let all = device_ops();
        let distinct: BTreeSet<&str> = all.iter().copied().collect();
        assert_eq!(distinct.len(), all.len(), "an op in two domains");
    }
}
