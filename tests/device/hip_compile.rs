//! Every kernel module compiles for AMD GPUs through hipRTC, the compile path a HIP engine
//! uses, for gfx90a (MI200) and gfx1030 (RDNA2): each registered entry point is in the
//! code object with the parameter sizes and launch bound the emulated device holds the
//! launchers to, and the field, NTT and MSM kernels spill no vector register to memory.
//! In CI hipRTC comes from Debian's ROCm 5.2 packages (`hipcc`) and REQUIRE_HIPRTC=1
//! makes its absence a failure; elsewhere the test says why it skips. No AMD GPU is
//! needed, and none has run these kernels.

use gpu_ops::backend::emulated;
use gpu_ops::backend::hip::{compile, hiprtc_available, hiprtc_version};
use gpu_ops::ops::kernel_library;

const ARCHES: &[&str] = &["gfx90a", "gfx1030"];

/// Modules whose kernels must not spill a vector register (the field, NTT and
/// MSM kernels), and whether any scratch at all is allowed: the MSM kernels call the
/// outlined curve functions (`FIELD_FN_OUTLINED`), whose frames live in scratch.
const NO_SPILLS: &[(&str, bool)] = &[("field_ops", false), ("ntt", false), ("msm", true)];
/// The most scratch an MSM kernel may use per lane (call frames; 1,056 bytes measured
/// for bls12_381_g1_msm_reduce under Debian's hipRTC 5.2, 2026-11-29).
const MSM_SCRATCH_BYTES: u64 = 1536;

/// One kernel's entry in a code object's AMDGPU metadata.
#[derive(Debug, Default)]
struct KernelMeta {
    name: String,
    /// (size, value_kind) of each argument; hidden ones are the runtime's own.
    args: Vec<(usize, String)>,
    max_flat_workgroup_size: Option<u32>,
    /// None when the metadata lacks the field or it does not read as a number: the spill
    /// and scratch checks then fail rather than pass on nothing.
    private_segment_fixed_size: Option<u64>,
    vgpr_count: Option<u64>,
    vgpr_spill_count: Option<u64>,
    sgpr_spill_count: Option<u64>,
}

/// `llvm-readelf --notes` of a code object, read into its kernels. The metadata is
/// msgpack in an ELF note; readelf prints it as YAML, of which only the kernel list's
/// scalar fields and argument sizes are read here.
fn kernels_of(code_object: &[u8], readelf: &str, tag: &str) -> Vec<KernelMeta> {
    let path = std::env::temp_dir().join(format!("gpu-ops-hip-{tag}-{}.co", std::process::id()));
    std::fs::write(&path, code_object).unwrap();
    let out = std::process::Command::new(readelf)
        .arg("--notes")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{readelf}: {e}"));
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success(), "{readelf} --notes {tag}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut kernels: Vec<KernelMeta> = Vec::new();
    let mut in_kernels = false;
    for line in text.lines() {
        if line.starts_with("amdhsa.kernels:") {
            in_kernels = true;
            continue;
        }
        if in_kernels && !line.starts_with(' ') {
            in_kernels = false;
        }
        if !in_kernels {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let item = line.trim_start().strip_prefix("- ");
        let field = item.unwrap_or(line.trim_start());
        if indent == 2 && item.is_some() {
            kernels.push(KernelMeta::default());
        }
        let Some(k) = kernels.last_mut() else {
            continue;
        };
        let Some((key, value)) = field.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let number = || value.parse::<u64>().ok();
        match (indent, key) {
            // An argument's first field opens it: `- .address_space`, `- .offset`, …
            (6, _) if item.is_some() => {
                k.args.push((0, String::new()));
                if key == ".size" {
                    k.args.last_mut().unwrap().0 = number().unwrap_or(0) as usize;
                }
            }
            (8, ".size") => k.args.last_mut().unwrap().0 = number().unwrap_or(0) as usize,
            (8, ".value_kind") => k.args.last_mut().unwrap().1 = value.to_string(),
            (4, ".name") => k.name = value.to_string(),
            (4, ".max_flat_workgroup_size") => {
                k.max_flat_workgroup_size = number().map(|n| n as u32)
            }
            (4, ".private_segment_fixed_size") => k.private_segment_fixed_size = number(),
            (4, ".vgpr_count") => k.vgpr_count = number(),
            (4, ".vgpr_spill_count") => k.vgpr_spill_count = number(),
            (4, ".sgpr_spill_count") => k.sgpr_spill_count = number(),
            _ => {}
        }
    }
    kernels
}

/// llvm-readelf: `LLVM_READELF`, else Debian's versioned one or the plain name on PATH.
fn readelf() -> Option<String> {
    let candidates = std::env::var("LLVM_READELF")
        .ok()
        .into_iter()
        .chain(["llvm-readelf-15", "llvm-readelf"].map(String::from));
    candidates.into_iter().find(|c| {
        std::process::Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn every_kernel_compiles_for_amd_gpus_with_its_entry_points_and_no_spills() {
    let readelf = readelf();
    let found = (readelf.is_some(), "llvm-readelf not found");
    if !hiprtc_or_skip(
        "every_kernel_compiles_for_amd_gpus_with_its_entry_points_and_no_spills",
        Some(found),
    ) {
        return;
    }
    let readelf = readelf.unwrap();
    eprintln!("hipRTC {:?}", hiprtc_version());
    let library = kernel_library();
    for (module, _) in NO_SPILLS {
        assert!(
            library.modules.iter().any(|m| m.name == *module),
            "NO_SPILLS names {module}, which the kernel library has no longer"
        );
    }
    let work: Vec<(&str, String, Vec<&str>, &str)> = library
        .amd_modules()
        .flat_map(|m| {
            let (source, options) = (library.expand(m.source), m.options());
            ARCHES
                .iter()
                .map(move |a| (m.name, source.clone(), options.clone(), *a))
        })
        .collect();
    // One after another: hipRTC compiles one program at a time in a process (`compile`).
    let done: Vec<(usize, Result<Vec<u8>, String>, f64)> = work
        .iter()
        .enumerate()
        .map(|(i, (_, source, options, arch))| {
            let started = std::time::Instant::now();
            let code = compile(source, arch, options);
            (i, code, started.elapsed().as_secs_f64())
        })
        .collect();

    let mut failures = Vec::new();
    for (i, code, seconds) in &done {
        let (module, _, _, arch) = &work[*i];
        eprintln!("{module} for {arch}: {seconds:.1} s");
        let code = match code {
            Ok(code) => code,
            Err(e) => {
                failures.push(format!("{module}/{arch} does not compile: {e}"));
                continue;
            }
        };
        let kernels = kernels_of(code, &readelf, &format!("{module}-{arch}"));
        let m = library.modules.iter().find(|m| m.name == *module).unwrap();
        for name in &m.entry_points {
            let Some(k) = kernels.iter().find(|k| &k.name == name) else {
                failures.push(format!(
                    "{module}/{arch}: no kernel {name} in the code object"
                ));
                continue;
            };
            let sizes: Vec<usize> = k
                .args
                .iter()
                .filter(|(_, kind)| !kind.starts_with("hidden_"))
                .map(|(size, _)| *size)
                .collect();
            // The emulated device reads each argument with the kernel's own parameter
            // types: HIP's kernarg layout must have the same sizes.
            if emulated::kernel_params(name).as_deref() != Some(sizes.as_slice()) {
                failures.push(format!(
                    "{module}/{arch}: {name}'s parameter sizes {sizes:?}, the emulated device's {:?}",
                    emulated::kernel_params(name)
                ));
            }
            if k.max_flat_workgroup_size != emulated::kernel_max_threads(name) {
                failures.push(format!(
                    "{module}/{arch}: {name}'s max_flat_workgroup_size {:?}, its __launch_bounds__ {:?}",
                    k.max_flat_workgroup_size,
                    emulated::kernel_max_threads(name)
                ));
            }
        }
        for k in &kernels {
            let shown = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
            eprintln!(
                "  {:<34} vgpr {:>3} scratch {:>5} B  spills v{} s{}",
                k.name,
                shown(k.vgpr_count),
                shown(k.private_segment_fixed_size),
                shown(k.vgpr_spill_count),
                shown(k.sgpr_spill_count)
            );
            let Some((_, scratch_allowed)) = NO_SPILLS.iter().find(|(n, _)| n == module) else {
                continue;
            };
            let (Some(spills), Some(scratch)) = (k.vgpr_spill_count, k.private_segment_fixed_size)
            else {
                failures.push(format!(
                    "{module}/{arch}: {}'s metadata has no .vgpr_spill_count or .private_segment_fixed_size",
                    k.name
                ));
                continue;
            };
            if spills > 0 {
                failures.push(format!(
                    "{module}/{arch}: {} spills {spills} vector registers",
                    k.name
                ));
            }
            let budget = if *scratch_allowed {
                MSM_SCRATCH_BYTES
            } else {
                0
            };
            if scratch > budget {
                failures.push(format!(
                    "{module}/{arch}: {} uses {scratch} bytes of scratch a lane (at most {budget})",
                    k.name
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Whether `test` can run: hipRTC loads and `also` (what else it needs) is present. When
/// not, it says why it skips, or fails under REQUIRE_HIPRTC=1.
fn hiprtc_or_skip(test: &str, also: Option<(bool, &str)>) -> bool {
    let why = if !hiprtc_available() {
        "hipRTC (libamdhip64) not found"
    } else if let Some((false, missing)) = also {
        missing
    } else {
        return true;
    };
    gpu_ops::skips::skip_unless_required(&format!("hip_compile::{test}"), why, "REQUIRE_HIPRTC");
    false
}

#[test]
fn a_broken_kernel_is_reported_with_hiprtcs_log() {
    if !hiprtc_or_skip("a_broken_kernel_is_reported_with_hiprtcs_log", None) {
        return;
    }
    let err = compile(
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        "gfx90a",
        &[],
    )
    .unwrap_err();
    assert!(err.contains("undefined_thing"), "{err}");
}

/// Kernels that hold on both vendors: AMD's wavefronts are 64 wide (32 on RDNA), so no
/// kernel may use a warp intrinsic or take a lane or warp from `threadIdx` with a literal
/// 32; block-wide work synchronises with `__syncthreads` (docs/GPU.md, "AMD GPUs"). Text
/// is checked with comments removed. The NVIDIA-only sources (`kernels/nvidia/`: tensor
/// cores, warps of 32) are exempt, and the library never hands them to hipRTC.
#[test]
fn no_kernel_assumes_a_warp_of_32() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let forbidden = [
        "__shfl",
        "__ballot",
        "__any_sync",
        "__all_sync",
        "__activemask",
        "__syncwarp",
        "__match_",
        "__reduce_",
        "warpSize",
        "__lanemask",
    ];
    let lane_of = ["% 32", "%32", "& 31", "&31", "/ 32", "/32", ">> 5", ">>5"];
    let mut found = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let ext = path.extension().and_then(|e| e.to_str());
        if !matches!(ext, Some("cu" | "cuh")) {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let at = format!("{}:{}", path.file_name().unwrap().to_string_lossy(), i + 1);
            for f in forbidden.iter().filter(|f| code.contains(*f)) {
                found.push(format!("{at}: {f}"));
            }
            if code.contains("threadIdx") && lane_of.iter().any(|p| code.contains(p)) {
                found.push(format!(
                    "{at}: a lane or warp from threadIdx with a literal 32: {}",
                    code.trim()
                ));
            }
        }
    }
    let library = kernel_library();
    for m in library.modules.iter().filter(|m| m.nvidia_only) {
        assert!(
            library.amd_modules().all(|a| a.name != m.name),
            "{} is NVIDIA-only but offered to AMD",
            m.name
        );
    }
    for m in library.amd_modules() {
        assert!(
            !m.source.contains("mma.sync") && !m.source.contains("__shfl"),
            "{} uses NVIDIA-only instructions but is compiled for AMD",
            m.name
        );
    }
    assert!(
        files >= 20,
        "read only {files} kernel sources from {}",
        dir.display()
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The engine's compile path: each module compiled by `gpu-ops hip-compile` in a child
/// process, then read from the kernel cache on the next start.
#[test]
fn the_engine_compiles_in_a_child_process_and_caches_the_code_object() {
    use gpu_ops::backend::hip::discover::{code_object, Compiler};
    if !hiprtc_or_skip(
        "the_engine_compiles_in_a_child_process_and_caches_the_code_object",
        None,
    ) {
        return;
    }
    let library = kernel_library();
    let dir = std::env::temp_dir().join(format!("gpu-ops-hip-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let compiler = Compiler {
        cache_dir: dir.clone(),
        exe: env!("CARGO_BIN_EXE_gpu-ops").into(),
    };
    let field = library
        .modules
        .iter()
        .find(|m| m.name == "field_ops")
        .unwrap();
    let (code, hit) = code_object(&library, field, "gfx90a", &compiler).unwrap();
    assert!(!hit && code.starts_with(b"\x7fELF"), "a fresh code object");
    let (again, hit) = code_object(&library, field, "gfx90a", &compiler).unwrap();
    assert!(hit && again == code, "the cached one, the same bytes");
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let named = files[0].starts_with("field_ops-") && files[0].contains("-gfx90a-hiprtc");
    assert!(named && files[0].ends_with(".hsaco"), "{files:?}");
    // An architecture hipRTC does not know: the child's log is the error.
    let err = code_object(&library, field, "gfx9999", &compiler).unwrap_err();
    assert!(err.contains("compiling field_ops for gfx9999"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A compiler that crashes (LLVM aborting inside hipRTC) is one module's error with its
/// last words, not the end of the process that asked.
#[test]
fn a_compiler_crash_is_an_error_not_the_servers_end() {
    use gpu_ops::backend::hip::discover::{code_object, Compiler};
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("gpu-ops-hip-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let crasher = dir.join("crash.sh");
    std::fs::write(
        &crasher,
        "#!/bin/sh\necho 'LLVM ERROR: unsupported libcall legalization' >&2\nkill -SEGV $$\n",
    )
    .unwrap();
    std::fs::set_permissions(&crasher, std::fs::Permissions::from_mode(0o755)).unwrap();
    let library = kernel_library();
    let ntt = library.modules.iter().find(|m| m.name == "ntt").unwrap();
    let compiler = Compiler {
        cache_dir: dir.join("cache"),
        exe: crasher,
    };
    let err = code_object(&library, ntt, "gfx90a", &compiler).unwrap_err();
    assert!(err.contains("compiling ntt for gfx90a"), "{err}");
    assert!(err.contains("LLVM ERROR: unsupported libcall"), "{err}");
    assert!(err.contains("signal"), "{err}");
    assert!(
        std::fs::read_dir(dir.join("cache"))
            .unwrap()
            .next()
            .is_none(),
        "nothing cached, nothing left behind"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
