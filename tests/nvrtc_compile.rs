//! Every kernel compiles through NVRTC for the architectures we ship. In CI libnvrtc
//! comes from a pinned PyPI wheel and REQUIRE_NVRTC=1 makes its absence a failure;
//! elsewhere the test says why it skips.

use gpu_ops::backend::cuda::kernels::{compile, nvrtc_available, nvrtc_version};
use gpu_ops::backend::emulated;
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
                let params = ptx_params(&text, name)
                    .unwrap_or_else(|| panic!("{module}/{arch}: no entry point {name}"));
                // The emulated device reads each argument with the kernel's own parameter
                // types: they must be the sizes the driver takes.
                assert_eq!(
                    emulated::kernel_params(name).as_deref(),
                    Some(params.as_slice()),
                    "{module}/{arch}: {name}'s parameter sizes (emulated device vs PTX)"
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

/// The byte size of each parameter of `.entry name(...)` in a PTX text: `.param .u64 x`
/// is 8 bytes, `.param .align 8 .b8 x[40]` (a struct by value) 40.
fn ptx_params(ptx: &str, name: &str) -> Option<Vec<usize>> {
    let start = ptx.find(&format!(".entry {name}("))?;
    let list = &ptx[start..];
    let list = &list[list.find('(')? + 1..list.find(')')?];
    let sizes = list
        .split(',')
        .map(str::trim)
        .filter(|p| p.starts_with(".param"))
        .map(|p| {
            // `.param [.align N] .type [.ptr ...] name[N]`
            let mut words = p.split_whitespace().skip(1).peekable();
            if words.peek() == Some(&".align") {
                words.nth(1);
            }
            let ty = words.next().unwrap_or("");
            let scalar = match &ty[2..] {
                "8" => 1,
                "16" => 2,
                "32" => 4,
                "64" => 8,
                other => panic!("PTX parameter type {other:?} in {p:?}"),
            };
            let count = p
                .rfind('[')
                .and_then(|i| p[i + 1..p.len() - 1].parse::<usize>().ok())
                .unwrap_or(1);
            scalar * count
        })
        .collect();
    Some(sizes)
}
