// Builds two host libraries from the CUDA sources, so tests run the exact GPU code on
// machines without a GPU:
// - the kernels' field arithmetic and noise samplers (`kernels/host/*.cpp`), checked
//   against the CPU twins;
// - the emulated device (`kernels/emu/`): every `kernels/*.cu` and `kernels/nvidia/*.cu` compiled whole for the host
//   with CUDA's execution model, and a table of its kernels (with their
//   `__launch_bounds__`) for launches by name.
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=GPU_OPS_SKIP_NATIVE");
    if std::env::var_os("GPU_OPS_SKIP_NATIVE").is_some_and(|v| v == "1") {
        // A check that never links (`--emit=metadata`: .ci/run's library without
        // openapi) needs no C++, which takes minutes on two cores; only the directory
        // `backend::emulated` names with env! is given.
        let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("emu");
        println!("cargo:rustc-env=GPU_OPS_EMU_LIBRARY_DIR={}", out.display());
        return;
    }
    cc::Build::new()
        .cpp(true)
        .file("kernels/host/field_host.cpp")
        .file("kernels/host/dp_host.cpp")
        .file("kernels/host/msm_host.cpp")
        .file("kernels/host/ntt_host.cpp")
        .file("kernels/host/rf_host.cpp")
        .flag_if_supported("-ffp-contract=off")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .compile("gpu_ops_kernel_host");
    emulated_device();
}

/// The kernel modules, by file stem: `kernels/*.cu`, the NVIDIA-only ones
/// (`kernels/nvidia/*.cu`: tensor cores and warp shuffles, which the emulated device
/// models), and the emulator's own check kernels (`kernels/emu/*.cu`, never shipped).
fn modules() -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = ["kernels", "kernels/nvidia", "kernels/emu"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).expect("kernels/ exists"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    found.sort();
    found
}

fn emu_build(out: &Path, sanitizer: Option<&str>) -> cc::Build {
    let mut b = cc::Build::new();
    b.cpp(true)
        .std("c++17")
        .include("kernels")
        .include(out)
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-pthread")
        .flag_if_supported("-Wno-unused-function")
        .flag_if_supported("-Wno-unused-parameter")
        // `#pragma unroll` is NVRTC's; the host compiler unrolls as it sees fit.
        .flag_if_supported("-Wno-unknown-pragmas")
        .opt_level(2);
    if let Some(s) = sanitizer {
        b.flag(format!("-fsanitize={s}"))
            .flag("-fno-omit-frame-pointer");
    }
    b
}

/// `GPU_OPS_EMU_SANITIZERS=address,thread` (CI sets it for its whole run): the emulated
/// device is also built under each listed checker, as a shared library the tests load
/// when `GPU_OPS_EMU_SANITIZE` names it at run time (`backend::emulated`). The checked
/// runs then reuse the one build of the crate and its tests instead of rebuilding both
/// per checker. Unset (a developer's build): only the plain device, linked in.
/// - `address`: AddressSanitizer, so a kernel that reads or writes past a device buffer
///   or a shared array fails its test;
/// - `thread`: ThreadSanitizer, each GPU thread a fiber it knows, so two threads of a
///   block touching one word between barriers (one writing) is a reported race.
///
/// Test binaries need the checker's runtime preloaded (`.ci/run` shows how).
fn sanitizers() -> Vec<&'static str> {
    let listed = std::env::var("GPU_OPS_EMU_SANITIZERS").unwrap_or_default();
    listed
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s {
            "address" => "address",
            "thread" => "thread",
            other => panic!("GPU_OPS_EMU_SANITIZERS lists {other:?}: use address and/or thread"),
        })
        .collect()
}

fn emulated_device() {
    println!("cargo:rerun-if-env-changed=GPU_OPS_EMU_SANITIZERS");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("emu");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy("kernels/emu/cuda_emu.h", out.join("cuda_emu.h")).unwrap();
    let units = emulated_units(&out);
    emu_build(&out, None)
        .file("kernels/emu/runtime.cpp")
        .files(&units)
        .compile("gpu_ops_emulated_device");
    for sanitizer in sanitizers() {
        checked_library(&out, &units, sanitizer);
    }
    // Where `backend::emulated` finds the checked builds.
    println!("cargo:rustc-env=GPU_OPS_EMU_LIBRARY_DIR={}", out.display());
}

/// `libgpu_ops_emu_<sanitizer>.so`: the runtime and every unit built under the checker.
/// `-Bsymbolic` binds the library's calls to its own definitions, never to the plain
/// device linked into the same process.
fn checked_library(out: &Path, units: &[PathBuf], sanitizer: &str) {
    let objects_dir = out.join(sanitizer);
    std::fs::create_dir_all(&objects_dir).unwrap();
    let mut build = emu_build(out, Some(sanitizer));
    build.pic(true).out_dir(&objects_dir).files(units);
    let mut objects = if sanitizer == "thread" {
        // The runtime's own bookkeeping (which fiber runs, the barrier's counts) is not
        // the kernels' memory: only the kernels are instrumented; the runtime calls
        // ThreadSanitizer's fiber and synchronisation hooks.
        emu_build(out, None)
            .pic(true)
            .out_dir(objects_dir.join("runtime"))
            .define("GPU_OPS_EMU_TSAN", "1")
            .file("kernels/emu/runtime.cpp")
            .compile_intermediates()
    } else {
        build.file("kernels/emu/runtime.cpp");
        Vec::new()
    };
    objects.extend(build.compile_intermediates());
    let library = out.join(format!("libgpu_ops_emu_{sanitizer}.so"));
    let status = build
        .get_compiler()
        .to_command()
        .args(["-shared", "-pthread", "-Wl,-Bsymbolic"])
        .arg(format!("-fsanitize={sanitizer}"))
        .arg("-o")
        .arg(&library)
        .args(&objects)
        .status()
        .expect("the C++ compiler runs");
    assert!(status.success(), "linking {} failed", library.display());
}

/// Every kernel module as a host C++ unit with its table of kernels, and the registry of
/// the tables, written under `out`.
fn emulated_units(out: &Path) -> Vec<PathBuf> {
    let mut units = Vec::new();
    let mut tables = Vec::new();
    for (module, path) in modules() {
        let source = std::fs::read_to_string(&path).unwrap();
        let unit = out.join(format!("{module}.cpp"));
        let body = format!("#include \"cuda_emu.h\"\n{}", host_shared_memory(&source));
        std::fs::write(&unit, &body).unwrap();
        // The unit preprocessed once more with GPU_OPS_EMU_SCAN, where cuda_emu.h marks
        // each kernel and its bound, names its kernels and their __launch_bounds__.
        let expanded = emu_build(out, None)
            .define("GPU_OPS_EMU_SCAN", None)
            .file(&unit)
            .expand();
        let kernels = kernels_of(&module, &String::from_utf8_lossy(&expanded));
        assert!(!kernels.is_empty(), "{module}.cu defines no kernels");
        let entries: Vec<String> = kernels
            .iter()
            .map(|(k, bound)| format!("EMU_KERNEL({k}, {bound})"))
            .collect();
        let table = format!(
            "{body}\nextern const emu_kernel emu_kernels_{module}[] = {{\n    {}\n}};\nextern const size_t emu_kernels_{module}_count = {};\n",
            entries.join(",\n    "),
            kernels.len()
        );
        std::fs::write(&unit, table).unwrap();
        units.push(unit);
        tables.push(module);
    }
    let registry = out.join("registry.cpp");
    let declarations: String = tables
        .iter()
        .map(|m| {
            format!(
                "extern const emu_kernel emu_kernels_{m}[];\nextern const size_t emu_kernels_{m}_count;\n"
            )
        })
        .collect();
    std::fs::write(
        &registry,
        format!(
            "#include \"cuda_emu.h\"\n{declarations}\
             extern const emu_kernel *const emu_modules[] = {{{}}};\n\
             extern const size_t emu_module_sizes[] = {{{}}};\n\
             extern const size_t emu_module_count = {};\n",
            tables
                .iter()
                .map(|m| format!("emu_kernels_{m}"))
                .collect::<Vec<_>>()
                .join(", "),
            tables
                .iter()
                .map(|m| format!("emu_kernels_{m}_count"))
                .collect::<Vec<_>>()
                .join(", "),
            tables.len()
        ),
    )
    .unwrap();
    units.push(registry);
    units
}

/// The source with its shared memory made host memory: a `__shared__` array becomes an
/// `EMU_SHARED` function static (cuda_emu.h: of thread storage, and a host thread runs one
/// block at a time, so the statics are the block's shared memory), and `extern __shared__
/// T name[];` a pointer to the launch's dynamic shared memory. Nothing else changes.
fn host_shared_memory(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("extern __shared__") {
        out.push_str(&rest[..at]);
        let end = at + rest[at..].find("[];").expect("extern __shared__ T name[];");
        let decl = rest[at + "extern __shared__".len()..end].trim();
        let decl = match decl.strip_prefix("__align__(") {
            Some(r) => r[r.find(')').unwrap() + 1..].trim(),
            None => decl,
        };
        let (ty, name) = decl
            .rsplit_once(char::is_whitespace)
            .expect("a type and a name");
        out.push_str(&format!(
            "{ty} *{name} = ({ty} *)emu_dynamic_shared();",
            ty = ty.trim()
        ));
        rest = &rest[end + "[];".len()..];
    }
    out.push_str(rest);
    out.replace("__shared__", "EMU_SHARED")
}

/// The kernels of a module's unit preprocessed with GPU_OPS_EMU_SCAN, where cuda_emu.h
/// turns `__global__` into `emu_scan_global` and `__launch_bounds__(n)` into
/// `emu_scan_bounds(n)`: each kernel's name and the first argument of its bound, as text
/// the table's C++ evaluates (`EMU_KERNEL(name, bound)`). A kernel without a bound fails
/// the build: NVRTC would then give it as many registers as it likes, and a launch of the
/// block its launcher asks for could fail for want of them on the first GPU it meets.
fn kernels_of(module: &str, expanded: &str) -> Vec<(String, String)> {
    const GLOBAL: &str = "emu_scan_global";
    const BOUNDS: &str = "emu_scan_bounds";
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = expanded[at..].find(GLOBAL) {
        let start = at + i;
        at = start + GLOBAL.len();
        // `[extern "C"] emu_scan_global void [emu_scan_bounds(...)] name(`, the bound on
        // either side of `void`.
        let mut rest = &expanded[at..];
        let mut bound = None;
        let name = loop {
            rest = rest.trim_start();
            if let Some(r) = rest.strip_prefix("void").filter(|r| !r.starts_with(ident)) {
                rest = r;
            } else if let Some(r) = rest.strip_prefix(BOUNDS) {
                let (args, after) = parenthesised(r.trim_start())
                    .unwrap_or_else(|| panic!("{module}.cu: an unbalanced __launch_bounds__"));
                bound = Some(first_argument(args).to_string());
                rest = after;
            } else {
                break rest.chars().take_while(|&c| ident(c)).collect::<String>();
            }
        };
        assert!(
            !name.is_empty() && rest[name.len()..].trim_start().starts_with('('),
            "{module}.cu: a __global__ declaration build.rs cannot read: write \
             `extern \"C\" __global__ void __launch_bounds__(N) name(...)`"
        );
        assert!(
            expanded[..start].trim_end().ends_with("extern \"C\""),
            "{module}.cu: kernel {name} is not extern \"C\": launchers find kernels by name"
        );
        let bound = bound.unwrap_or_else(|| {
            panic!(
                "{module}.cu: kernel {name} declares no __launch_bounds__: give it the largest \
                 block its launchers use (docs/GPU.md)"
            )
        });
        found.push((name, bound));
    }
    found.sort();
    found.dedup_by(|a, b| a.0 == b.0);
    found
}

/// The text inside the parentheses `text` starts with, and what follows them.
fn parenthesised(text: &str) -> Option<(&str, &str)> {
    let inner = text.strip_prefix('(')?;
    let mut depth = 1;
    for (i, c) in inner.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&inner[..i], &inner[i + 1..]));
                }
            }
            _ => {}
        }
    }
    None
}

/// A macro argument list's first argument (a bound's thread count; the optional second is
/// the minimum blocks per multiprocessor).
fn first_argument(args: &str) -> &str {
    let mut depth = 0;
    for (i, c) in args.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => return args[..i].trim(),
            _ => {}
        }
    }
    args.trim()
}
