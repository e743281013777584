//! Every kernel compiles through NVRTC for the architectures we ship, with the launch
//! bound it declares, and the modules whose floats must match the CPU bit for bit without
//! FMA contraction. In CI libnvrtc comes from pinned PyPI wheels (12.9, and 13.0 as on the
//! device) and REQUIRE_NVRTC=1 makes its absence a failure; elsewhere the test says why it
//! skips.

use gpu_ops::backend::cuda::kernels::{compile, cubin_cached, nvrtc_available, nvrtc_version};
use gpu_ops::backend::emulated;
use gpu_ops::ops::kernel_library;

const SHIPPED_ARCHES: &[&str] = &["compute_80", "compute_89", "compute_90"];

/// The architectures this run compiles: every shipped one, or those `NVRTC_CHECK_ARCHES`
/// names (comma-separated, each a shipped one). CI's second run, with the device's NVRTC
/// 13.0, takes compute_90 alone (the H100's and H200's); the pinned 12.9 run compiles
/// them all.
fn checked_arches() -> &'static [&'static str] {
    static ARCHES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    ARCHES.get_or_init(|| match std::env::var("NVRTC_CHECK_ARCHES") {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .map(|a| {
                let a = a.trim();
                *SHIPPED_ARCHES.iter().find(|s| **s == a).unwrap_or_else(|| {
                    panic!("NVRTC_CHECK_ARCHES: {a} is not one of {SHIPPED_ARCHES:?}")
                })
            })
            .collect(),
        _ => SHIPPED_ARCHES.to_vec(),
    })
}

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
        let work: Vec<(&'static str, String, Vec<&'static str>, &'static str)> = library
            .modules
            .iter()
            .flat_map(|m| {
                let (source, options) = (library.expand(m.source), m.options());
                checked_arches()
                    .iter()
                    .map(move |arch| (m.name, source.clone(), options.clone(), *arch))
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
                            let Some((module, source, options, arch)) = work.get(i) else {
                                return out;
                            };
                            let started = std::time::Instant::now();
                            let ptx = compile(source, arch, options).map(|p| p.to_src());
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

/// Whether libnvrtc loads; when not, `test` says it skips, or fails under
/// REQUIRE_NVRTC=1 (CI).
fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc_available() {
        return true;
    }
    gpu_ops::skips::skip_unless_required(
        &format!("nvrtc_compile::{test}"),
        "libnvrtc cannot be loaded (is LD_LIBRARY_PATH set?)",
        "REQUIRE_NVRTC",
    );
    false
}

#[test]
fn every_kernel_compiles_for_every_shipped_architecture() {
    if !nvrtc_or_skip("every_kernel_compiles_for_every_shipped_architecture") {
        return;
    }
    eprintln!("NVRTC {:?}", nvrtc_version());
    // CI runs this with two NVRTCs (.ci/run): each run must load the one it names.
    if let Ok(want) = std::env::var("REQUIRE_NVRTC_VERSION") {
        let (major, minor) = nvrtc_version().expect("NVRTC's version");
        assert_eq!(format!("{major}.{minor}"), want, "the NVRTC loaded");
    }
    let library = kernel_library();
    for c in compiled_ptx() {
        eprintln!("{} for {}: {:.1} s", c.module, c.arch, c.seconds);
    }
    for m in &library.modules {
        let module = m.name;
        for arch in checked_arches() {
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
                // __launch_bounds__(N) is `.maxntid N, 1, 1`: NVRTC saw the bound, and it
                // is the one the emulated device holds the launchers to.
                assert_eq!(
                    ptx_maxntid(text, name),
                    emulated::kernel_max_threads(name),
                    "{module}/{arch}: {name}'s .maxntid (PTX vs the emulated device's bound)"
                );
            }
            let target = format!(".target sm_{}", arch.trim_start_matches("compute_"));
            assert!(text.contains(&target), "{module}: PTX is not for {arch}");
        }
    }
}

/// A device loads a cubin for its exact architecture (no JIT at start, and loadable by a
/// driver older than NVRTC), cached under (source and options, architecture, NVRTC
/// version): a warm start reads the file, and the same source under other options (FMA
/// contraction allowed) is another entry.
#[test]
fn cubins_are_compiled_for_the_exact_architecture_and_cached() {
    if !nvrtc_or_skip("cubins_are_compiled_for_the_exact_architecture_and_cached") {
        return;
    }
    let library = kernel_library();
    let m = library
        .modules
        .iter()
        .find(|m| m.name == "field_ops")
        .unwrap();
    let (source, options) = (library.expand(m.source), m.options());
    let dir = std::env::temp_dir().join(format!("gpu-ops-cubin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cubin = cubin_cached("field_ops", &source, &options, "sm_90", &dir).unwrap();
    assert!(!cubin.cache_hit);
    assert_eq!(&cubin.bytes[..4], b"\x7fELF", "a cubin is an ELF image");
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
        &format!("-nvrtc{major}.{minor}.cubin"),
    ] {
        assert!(name.contains(part), "{name} lacks {part}");
    }
    // A warm start reads the cache: what is planted there comes back.
    std::fs::write(&cached[0], b"\x7fELF planted").unwrap();
    let warm = cubin_cached("field_ops", &source, &options, "sm_90", &dir).unwrap();
    assert!(warm.cache_hit);
    assert_eq!(warm.bytes, b"\x7fELF planted");
    // The same source with FMA contraction allowed has its own entry.
    let fused: Vec<&str> = options
        .iter()
        .copied()
        .filter(|o| *o != "--fmad=false")
        .collect();
    assert_ne!(fused, options, "field_ops compiles with --fmad=false");
    let other = cubin_cached("field_ops", &source, &fused, "sm_90", &dir).unwrap();
    assert!(!other.cache_hit);
    assert_eq!(&other.bytes[..4], b"\x7fELF");
    assert_ne!(other.bytes, warm.bytes);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_broken_kernel_is_reported_with_the_compiler_log() {
    if !nvrtc_or_skip("a_broken_kernel_is_reported_with_the_compiler_log") {
        return;
    }
    let err = compile(
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        "compute_80",
        &[],
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

/// The threads of `.entry name`'s `.maxntid x, y, z` (what `__launch_bounds__` emits),
/// between its parameter list and its body; None without one.
fn ptx_maxntid(ptx: &str, name: &str) -> Option<u32> {
    let start = ptx.find(&format!(".entry {name}("))?;
    let entry = &ptx[start..];
    let head = &entry[entry.find(')')?..entry.find('{')?];
    let dims = head.split(".maxntid").nth(1)?.lines().next()?;
    dims.split(',')
        .map(|d| d.trim().parse::<u32>().ok())
        .product()
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
/// every entry point compiles without spilling, its registers (allocated in eights) times
/// its declared bound — the most threads the emulated device lets its launchers give a
/// block — fit a multiprocessor's 64 K registers, and its static plus dynamic shared
/// memory fits the 48 KiB a kernel gets without opting in. ptxas sizes registers for the
/// bound, so a kernel that needs more for it shows as spills.
#[test]
fn every_kernel_fits_sm80_and_sm90_without_spills() {
    let ptxas = std::env::var("PTXAS").ok().filter(|p| !p.is_empty());
    let (Some(ptxas), true) = (ptxas, nvrtc_available()) else {
        gpu_ops::skips::skip_unless_required(
            "nvrtc_compile::every_kernel_fits_sm80_and_sm90_without_spills",
            "needs PTXAS and libnvrtc",
            "REQUIRE_PTXAS",
        );
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
        .filter(|(_, sm)| checked_arches().contains(&format!("compute_{sm}").as_str()))
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
            let threads = emulated::kernel_max_threads(name)
                .unwrap_or_else(|| panic!("{name} declares no __launch_bounds__"));
            assert!(
                r.registers.div_ceil(8) * 8 * threads <= 65_536,
                "sm_{sm} {name}: {} registers × {threads} threads",
                r.registers,
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

/// Which modules compile with `--fmad=false` (`KernelModule::exact_floats`): those whose
/// ops are checked bit for bit (integers, DP's noise) or whose kernels promise the host
/// twins' floats bit for bit (RF); matmul, attention, conv2d and beams are held to
/// tolerances and keep FMA for speed.
#[test]
fn exact_modules_compile_without_fma_contraction_and_matmuls_with() {
    let library = kernel_library();
    let options = |kernel: &str| {
        let m = library
            .modules
            .iter()
            .find(|m| m.entry_points.iter().any(|e| e == kernel))
            .unwrap_or_else(|| panic!("no module has {kernel}"));
        (m.exact_floats, m.options())
    };
    for kernel in ["dp_clip_sum_f64", "rf_receive", "bn254_fr_mul", "msm_scan"] {
        let (exact, options) = options(kernel);
        assert!(
            exact && options.contains(&"--fmad=false"),
            "{kernel}: {options:?}"
        );
    }
    for kernel in [
        "matmul_f32",
        "attention_f32",
        "conv_im2col_f32",
        "beam_power_f64",
    ] {
        let (exact, options) = options(kernel);
        assert!(
            !exact && !options.iter().any(|o| o.starts_with("--fmad")),
            "{kernel}: {options:?}"
        );
    }
    let exact: Vec<&str> = library
        .modules
        .iter()
        .filter(|m| m.exact_floats)
        .map(|m| m.name)
        .collect();
    assert_eq!(
        exact,
        ["field_ops", "ntt", "msm", "dp", "rf", "mpc", "he"],
        "a module's float contract changed: say why in its kernel_module()"
    );
}

/// The functions whose device code (libdevice) is written with explicit FMAs, which
/// `--fmad=false` keeps: a line that calls one may own an `fma` in the PTX. rf.cuh's
/// RF_SINCOSPI and RF_LOG are sincospi and log on the device.
const CALLS_WITH_FMA: &[&str] = &[
    "fma",
    "fmaf",
    "__fma_rn",
    "__fmaf_rn",
    "sin",
    "cos",
    "sincos",
    "sincospi",
    "exp",
    "expf",
    "log",
    "logf",
    "pow",
    "RF_SINCOSPI",
    "RF_LOG",
];

/// Whether source line `text` calls one of CALLS_WITH_FMA.
fn calls_fma(text: &str) -> bool {
    CALLS_WITH_FMA.iter().any(|f| {
        text.match_indices(f).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + f.len()..].trim_start();
            !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && after.starts_with('(')
        })
    })
}

/// The `fma.rn.f32` / `fma.rn.f64` instructions of a PTX text compiled with
/// `--generate-line-info`, by the program's source line each sits under (the last `.loc`
/// of file 1 before it, in its function); line 0 when none.
fn fma_lines(ptx: &str) -> std::collections::BTreeMap<usize, usize> {
    let mut found = std::collections::BTreeMap::new();
    let mut line = 0;
    for text in ptx.lines().map(str::trim) {
        if text.contains(".entry ") || text.contains(".func ") {
            line = 0;
        } else if let Some(loc) = text.strip_prefix(".loc") {
            let mut words = loc.split_whitespace();
            let file = words.next();
            let at = words.next().and_then(|l| l.parse().ok());
            line = if file == Some("1") {
                at.unwrap_or(0)
            } else {
                0
            };
        } else if text.starts_with("fma.rn.f32") || text.starts_with("fma.rn.f64") {
            *found.entry(line).or_insert(0) += 1;
        }
    }
    found
}

/// NVRTC contracts `a * b + c` into one FMA by default; the host twins and the emulated
/// device are built with -ffp-contract=off, so a contraction outside the `_rn` macros
/// would differ on the device alone, and no test without a GPU would see it. In every
/// exact module's PTX, each `fma` must therefore come from a line that calls fma or a
/// math function (libdevice's own FMAs, the same on every device).
#[test]
fn exact_modules_have_no_contracted_fma() {
    if !nvrtc_or_skip("exact_modules_have_no_contracted_fma") {
        return;
    }
    let library = kernel_library();
    for m in library.modules.iter().filter(|m| m.exact_floats) {
        for arch in checked_arches() {
            let ptx = ptx_of(m.name, arch);
            if !ptx.contains("fma.rn.f") {
                continue;
            }
            // Some: compiled again with line numbers, each is traced to its source line.
            let source = library.expand(m.source);
            let mut options = m.options();
            options.push("--generate-line-info");
            let lined = compile(&source, arch, &options)
                .unwrap_or_else(|e| panic!("{}/{arch} with line info: {e}", m.name))
                .to_src();
            let lines: Vec<&str> = source.lines().collect();
            for (line, count) in fma_lines(&lined) {
                let text = line.checked_sub(1).and_then(|l| lines.get(l)).copied();
                assert!(
                    text.is_some_and(calls_fma),
                    "{}/{arch}: {count} fma at line {line} of the expanded source, {text:?}: \
                     a product and a sum contracted despite --fmad=false, or fma on a line \
                     that calls none of {CALLS_WITH_FMA:?}",
                    m.name
                );
            }
        }
    }
}

/// The option takes effect: `x * y + z` becomes one `fma` with an FMA module's options
/// and stays a product and a sum, each rounded, with an exact module's.
#[test]
fn fmad_false_keeps_a_product_and_a_sum_apart() {
    if !nvrtc_or_skip("fmad_false_keeps_a_product_and_a_sum_apart") {
        return;
    }
    let library = kernel_library();
    let options = |name: &str| {
        library
            .modules
            .iter()
            .find(|m| m.name == name)
            .unwrap()
            .options()
    };
    let source = "extern \"C\" __global__ void __launch_bounds__(32) k(float *x, double *y, \
                  float a, double b) { x[threadIdx.x] = x[threadIdx.x] * a + 1.0f; \
                  y[threadIdx.x] = y[threadIdx.x] * b + 1.0; }";
    let fused = compile(source, "compute_80", &options("linalg"))
        .unwrap()
        .to_src();
    assert!(
        fused.contains("fma.rn.f32") && fused.contains("fma.rn.f64"),
        "{fused}"
    );
    let exact = compile(source, "compute_80", &options("dp"))
        .unwrap()
        .to_src();
    assert!(!exact.contains("fma.rn"), "{exact}");
    for op in ["mul.rn.f32", "add.rn.f32", "mul.rn.f64", "add.rn.f64"] {
        assert!(exact.contains(op), "{op} missing: {exact}");
    }
}
