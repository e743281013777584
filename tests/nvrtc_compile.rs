//! Every kernel compiles through NVRTC for the architectures we ship. In CI libnvrtc
//! comes from a pinned PyPI wheel and REQUIRE_NVRTC=1 makes its absence a failure;
//! elsewhere the test says why it skips.

use gpu_ops::backend::cuda::kernels::{compile, nvrtc_available, nvrtc_version};
use gpu_ops::ops::kernel_library;

const SHIPPED_ARCHES: &[&str] = &["compute_80", "compute_89", "compute_90"];

#[test]
fn every_kernel_compiles_for_every_shipped_architecture() {
    if !nvrtc_available() {
        let required = std::env::var("REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "REQUIRE_NVRTC=1 but libnvrtc cannot be loaded (is LD_LIBRARY_PATH set?)"
        );
        eprintln!("SKIP every_kernel_compiles_for_every_shipped_architecture: libnvrtc not found (set REQUIRE_NVRTC=1 to fail instead)");
        return;
    }
    eprintln!("NVRTC {:?}", nvrtc_version());
    let library = kernel_library();
    for m in &library.modules {
        let (module, source) = (m.name, library.expand(m.source));
        for arch in SHIPPED_ARCHES {
            let started = std::time::Instant::now();
            let ptx = compile(&source, arch).unwrap_or_else(|e| panic!("{module} for {arch}: {e}"));
            eprintln!(
                "{module} for {arch}: {:.1} s",
                started.elapsed().as_secs_f64()
            );
            let text = ptx.to_src();
            for name in &m.entry_points {
                assert!(
                    text.contains(&format!(".entry {name}(")),
                    "{module}/{arch}: no entry point {name}"
                );
            }
            let target = format!(".target sm_{}", arch.trim_start_matches("compute_"));
            assert!(text.contains(&target), "{module}: PTX is not for {arch}");
        }
    }
}

#[test]
fn a_broken_kernel_is_reported_with_the_compiler_log() {
    if !nvrtc_available() {
        eprintln!("SKIP a_broken_kernel_is_reported_with_the_compiler_log: libnvrtc not found");
        return;
    }
    let err = compile(
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        "compute_80",
    )
    .unwrap_err();
    assert!(err.contains("undefined_thing"), "{err}");
}
