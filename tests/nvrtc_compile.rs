//! Every kernel compiles through NVRTC for the architectures we ship. In CI libnvrtc
//! comes from a pinned PyPI wheel and REQUIRE_NVRTC=1 makes its absence a failure;
//! elsewhere the test says why it skips.

use gpu_ops::backend::cuda::kernels::{compile, cubin_cached, nvrtc_available, nvrtc_version};
use gpu_ops::backend::emulated;
use gpu_ops::ops::kernel_library;

const SHIPPED_ARCHES: &[&str] = &["compute_80", "compute_89", "compute_90"];

/// Every module's PTX for every shipped architecture, compiled once per test process and
/// shared by the tests that read it (NVRTC takes seconds a module; msm alone ~14 s an
/// architecture). The (module, architecture) pairs are compiled on as many threads as the
/// machine has: NVRTC is thread-safe across programs. Each entry keeps its compile time.
struct CompiledPtx {
    module: &'static str,
    arch: &'static str,
    ptx: Result<String, String>,
    seconds: f64,
}

fn compiled_ptx() -> &'static [CompiledPtx] {
    static PTX: std::sync::OnceLock<Vec<CompiledPtx>> = std::sync::OnceLock::new();
    PTX.get_or_init(|| {
        let library = kernel_library();
        let work: Vec<(&'static str, String, &'static str)> = library
            .modules
            .iter()
            .flat_map(|m| {
                let source = library.expand(m.source);
                SHIPPED_ARCHES
                    .iter()
                    .map(move |arch| (m.name, source.clone(), *arch))
            })
            .collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut done: Vec<(usize, CompiledPtx)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut out = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some((module, source, arch)) = work.get(i) else {
                                return out;
                            };
                            let started = std::time::Instant::now();
                            let ptx = compile(source, arch).map(|p| p.to_src());
                            let seconds = started.elapsed().as_secs_f64();
                            out.push((
                                i,
                                CompiledPtx {
                                    module,
                                    arch,
                                    ptx,
                                    seconds,
                                },
                            ));
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("compile thread"))
                .collect()
        });
        done.sort_by_key(|(i, _)| *i);
        done.into_iter().map(|(_, c)| c).collect()
    })
}

/// The PTX of `module` for `arch`, from the shared compile.
fn ptx_of(module: &str, arch: &str) -> &'static str {
    let c = compiled_ptx()
        .iter()
        .find(|c| c.module == module && c.arch == arch)
        .unwrap_or_else(|| panic!("{module} for {arch} was not compiled"));
    c.ptx
        .as_deref()
        .unwrap_or_else(|e| panic!("{module} for {arch}: {e}"))
}

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
    for c in compiled_ptx() {
        eprintln!("{} for {}: {:.1} s", c.module, c.arch, c.seconds);
    }
    for m in &library.modules {
        let module = m.name;
        for arch in SHIPPED_ARCHES {
            let text = ptx_of(module, arch);
            for name in &m.entry_points {
                let params = ptx_params(text, name)
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

/// A device loads a cubin for its exact architecture (no JIT at start, and loadable by a
/// driver older than NVRTC), cached under (source, architecture, NVRTC and driver
/// versions): a warm start reads the file, and another driver gets its own.
#[test]
fn cubins_are_compiled_for_the_exact_architecture_and_cached() {
    if !nvrtc_available() {
        let required = std::env::var("REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        assert!(!required, "REQUIRE_NVRTC=1 but libnvrtc cannot be loaded");
        eprintln!(
            "SKIP cubins_are_compiled_for_the_exact_architecture_and_cached: libnvrtc not found"
        );
        return;
    }
    let library = kernel_library();
    let m = library
        .modules
        .iter()
        .find(|m| m.name == "field_ops")
        .unwrap();
    let source = library.expand(m.source);
    let dir = std::env::temp_dir().join(format!("gpu-ops-cubin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cubin = cubin_cached("field_ops", &source, "sm_90", "13.0", &dir).unwrap();
    assert_eq!(&cubin[..4], b"\x7fELF", "a cubin is an ELF image");
    let cached: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    let name = cached[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let (major, minor) = nvrtc_version().unwrap();
    for part in [
        "field_ops-",
        "-sm_90-",
        &format!("-nvrtc{major}.{minor}-"),
        "-driver13.0.cubin",
    ] {
        assert!(name.contains(part), "{name} lacks {part}");
    }
    // A warm start reads the cache: what is planted there comes back.
    std::fs::write(&cached[0], b"\x7fELF planted").unwrap();
    let warm = cubin_cached("field_ops", &source, "sm_90", "13.0", &dir).unwrap();
    assert_eq!(warm, b"\x7fELF planted");
    // Another driver has its own entry.
    let other = cubin_cached("field_ops", &source, "sm_90", "12.8", &dir).unwrap();
    assert_eq!(&other[..4], b"\x7fELF");
    assert_ne!(other, warm);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    let _ = std::fs::remove_dir_all(&dir);
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

/// The most threads per block each kernel is launched with (the launchers' configs).
fn block_threads(kernel: &str) -> u32 {
    if kernel == "msm_scan" {
        1024
    } else if kernel.ends_with("_ntt_tile") {
        512
    } else {
        256
    }
}

/// The most dynamic shared memory each kernel is launched with.
fn dynamic_shared_bytes(kernel: &str) -> u64 {
    if kernel.ends_with("_ntt_tile") {
        gpu_ops::ops::zk::TILE_BYTES as u64
    } else if kernel == "rf_chunk_reduce" {
        8 * gpu_ops::ops::rf::gpu::MAX_REDUCE_SEGMENT as u64
    } else {
        0
    }
}

/// One entry point's resources, from `ptxas -v`.
#[derive(Debug, Default)]
struct Resources {
    registers: u32,
    shared: u64,
    spill_stores: u64,
    spill_loads: u64,
}

/// `ptxas -v`'s report, by entry point.
fn ptxas_report(log: &str) -> std::collections::BTreeMap<String, Resources> {
    let mut out = std::collections::BTreeMap::<String, Resources>::new();
    let mut current = String::new();
    let number_before = |line: &str, unit: &str| -> Option<u64> {
        let at = line.find(unit)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            current = rest.trim().to_string();
        } else if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = rest.split('\'').next().unwrap_or_default().to_string();
        }
        let r = out.entry(current.clone()).or_default();
        if line.contains("spill stores") {
            r.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            r.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
        }
        if line.contains("Used ") && line.contains("registers") {
            r.registers = number_before(line, "registers").unwrap_or(0) as u32;
            r.shared = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    out
}

/// `ptxas -v` (from a pinned wheel in CI: PTXAS, REQUIRE_PTXAS=1) for sm_80 and sm_90:
/// every entry point compiles without spilling, its registers times its launch's threads
/// fit a multiprocessor's 64 K registers, and its static plus dynamic shared memory fits
/// the 48 KiB a kernel gets without opting in.
#[test]
fn every_kernel_fits_sm80_and_sm90_without_spills() {
    let ptxas = std::env::var("PTXAS").ok().filter(|p| !p.is_empty());
    let required = std::env::var("REQUIRE_PTXAS").is_ok_and(|v| v == "1");
    let (Some(ptxas), true) = (ptxas, nvrtc_available()) else {
        assert!(
            !required,
            "REQUIRE_PTXAS=1 but PTXAS is unset or libnvrtc is missing"
        );
        eprintln!("SKIP every_kernel_fits_sm80_and_sm90_without_spills: needs PTXAS and libnvrtc (set REQUIRE_PTXAS=1 to fail instead)");
        return;
    };
    let library = kernel_library();
    let dir = std::env::temp_dir().join(format!("gpu-ops-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Every ptxas run at once (the machine's cores share them), then each report in turn.
    let runs: Vec<_> = library
        .modules
        .iter()
        .flat_map(|m| ["80", "90"].map(|sm| (m, sm)))
        .map(|(m, sm)| {
            let file = dir.join(format!("{}-{sm}.ptx", m.name));
            std::fs::write(&file, ptx_of(m.name, &format!("compute_{sm}"))).unwrap();
            let child = std::process::Command::new(&ptxas)
                .args([&format!("-arch=sm_{sm}"), "-v", "-o", "/dev/null"])
                .arg(&file)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {ptxas}: {e}"));
            (m, sm, child)
        })
        .collect();
    for (m, sm, child) in runs {
        let run = child.wait_with_output().expect("ptxas output");
        let log = String::from_utf8_lossy(&run.stderr).into_owned()
            + &String::from_utf8_lossy(&run.stdout);
        assert!(run.status.success(), "ptxas {}/sm_{sm}: {log}", m.name);
        let report = ptxas_report(&log);
        for name in &m.entry_points {
            let r = report.get(name).unwrap_or_else(|| {
                panic!("{}/sm_{sm}: ptxas says nothing of {name}: {log}", m.name)
            });
            eprintln!("sm_{sm} {name}: {r:?}");
            assert_eq!(
                (r.spill_stores, r.spill_loads),
                (0, 0),
                "sm_{sm} {name} spills"
            );
            assert!(
                r.registers * block_threads(name) <= 65_536,
                "sm_{sm} {name}: {} registers × {} threads",
                r.registers,
                block_threads(name)
            );
            assert!(
                r.shared + dynamic_shared_bytes(name) <= 48 * 1024,
                "sm_{sm} {name}: {} bytes of static shared memory + {} dynamic",
                r.shared,
                dynamic_shared_bytes(name)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
