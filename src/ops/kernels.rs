//! The kernel library: every domain's CUDA modules and the headers they share, handed to
//! the backend at start-up. A new kernel file is registered by its domain
//! (`Domain::kernel_modules`); a new header, here.

use crate::backend::cuda::kernels::KernelLibrary;
use crate::backend::wgpu::WgslLibrary;

/// The headers the `.cu` files include: device functions shared across modules.
const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../kernels/common.cuh")),
    ("attention.cuh", include_str!("../../kernels/attention.cuh")),
    ("fp.cuh", include_str!("../../kernels/fp.cuh")),
    ("bn254_fr.cuh", include_str!("../../kernels/bn254_fr.cuh")),
    (
        "bls12_381_fr.cuh",
        include_str!("../../kernels/bls12_381_fr.cuh"),
    ),
    ("babybear.cuh", include_str!("../../kernels/babybear.cuh")),
    (
        "goldilocks.cuh",
        include_str!("../../kernels/goldilocks.cuh"),
    ),
    ("bn254_fq.cuh", include_str!("../../kernels/bn254_fq.cuh")),
    (
        "bls12_381_fq.cuh",
        include_str!("../../kernels/bls12_381_fq.cuh"),
    ),
    ("curve.cuh", include_str!("../../kernels/curve.cuh")),
    ("msm.cuh", include_str!("../../kernels/msm.cuh")),
    ("ntt.cuh", include_str!("../../kernels/ntt.cuh")),
    ("dp_noise.cuh", include_str!("../../kernels/dp_noise.cuh")),
    ("rf.cuh", include_str!("../../kernels/rf.cuh")),
    (
        "rf_features.cuh",
        include_str!("../../kernels/rf_features.cuh"),
    ),
    (
        "rf_waveform.cuh",
        include_str!("../../kernels/rf_waveform.cuh"),
    ),
];

/// Every module of every domain, with the shared headers.
pub fn kernel_library() -> KernelLibrary {
    let modules = super::DOMAINS
        .iter()
        .flat_map(|d| (d.kernel_modules)())
        .collect();
    KernelLibrary {
        headers: HEADERS,
        modules,
    }
}

/// The wgpu engine's kernels: the domains' WGSL (the field ops' so far), and the ops
/// they serve whole; every other op stays off a wgpu adapter.
pub fn wgsl_library() -> WgslLibrary {
    WgslLibrary {
        kernels: super::zk::wgsl::kernels(),
        ops: super::zk::wgsl::ops(),
        left_off: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_inlines_each_header_once_and_leaves_no_includes() {
        let library = kernel_library();
        for module in &library.modules {
            let src = library.expand(module.source);
            assert!(!src.contains("#include"));
            assert_eq!(src.matches("#define GPU_OPS_COMMON_CUH").count(), 1);
            let (name, names) = (module.name, &module.entry_points);
            assert!(!names.is_empty(), "{name} lists no kernels");
            for entry in names {
                // Written out, or stamped by a macro: KERNEL(name, ...).
                assert!(
                    src.contains(&format!("({entry},"))
                        || src.contains(&format!("({entry})"))
                        || src.contains(&format!(" {entry}("))
                        || src.contains(&format!(" {entry},")),
                    "{entry} missing from {name}"
                );
            }
        }
    }

    /// `--wgpu-ops` keeps exactly the kernels its ops launch, by the launchers' names:
    /// the field product's one per field, the NTT's four per field for both directions,
    /// and every op it has, each kernel once.
    #[test]
    fn selecting_wgpu_ops_keeps_the_kernels_they_launch() {
        let all = wgsl_library();
        let names = |lib: &WgslLibrary| -> Vec<String> {
            let mut n: Vec<String> = lib.kernels.iter().map(|k| k.name.clone()).collect();
            n.sort();
            n
        };
        let mul = all.select(&["field_mul".into()]).unwrap();
        assert_eq!(mul.ops, ["field_mul"]);
        assert_eq!(
            names(&mul),
            [
                "babybear_mul",
                "bls12_381_fr_mul",
                "bn254_fr_mul",
                "goldilocks_mul"
            ]
        );
        assert!(mul.left_off.contains(&"msm") && !mul.left_off.contains(&"field_mul"));
        assert_eq!(mul.left_off.len() + 1, all.ops.len());

        let ntt = all.select(&["intt".into()]).unwrap();
        assert_eq!(ntt.ops, ["intt"]);
        assert_eq!(ntt.kernels.len(), 16, "{:?}", names(&ntt));
        assert!(ntt.kernels.iter().all(|k| k.name.contains("_ntt_")));

        let msm = all.select(&["msm".into()]).unwrap();
        assert!(msm.kernels.iter().all(|k| k.module == "msm"));
        assert!(names(&msm).contains(&"bls12_381_g1_msm_reduce".to_string()));

        let every: Vec<String> = all.ops.iter().map(|s| s.to_string()).collect();
        assert_eq!(names(&all.select(&every).unwrap()), names(&all));
        assert_eq!(names(&all.select(&["all".into()]).unwrap()), names(&all));

        let e = all.select(&["matmul".into()]).unwrap_err();
        assert!(e.contains("\"matmul\"") && e.contains("field_mul"), "{e}");
    }

    /// Every WGSL kernel binds no more storage buffers than every WebGPU adapter allows
    /// a stage, and its scalars fit the launch's `params` uniform after the grid and
    /// block: a kernel past either would fail to open on some adapter, or at launch.
    #[test]
    fn every_wgsl_kernel_fits_the_limits_every_adapter_has() {
        use crate::backend::wgpu::{Param, MAX_BUFFERS, PARAM_WORDS};
        for k in wgsl_library().kernels {
            let buffers = k
                .params
                .iter()
                .filter(|p| matches!(p, Param::Read | Param::Write))
                .count();
            let words: usize = k
                .params
                .iter()
                .map(|p| match p {
                    Param::Scalar(bytes) => bytes / 4,
                    _ => 0,
                })
                .sum();
            assert!(buffers <= MAX_BUFFERS, "{}: {buffers} buffers", k.name);
            assert!(6 + words <= PARAM_WORDS, "{}: {words} scalar words", k.name);
            let declared = k.source.matches("var<storage").count();
            assert_eq!(declared, buffers, "{}: bindings against parameters", k.name);
        }
    }
}
