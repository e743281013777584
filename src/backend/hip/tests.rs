//! The start-up path against missing, partial and stand-in ROCm libraries: stand-ins are
//! built here from C with the machine's `cc`, each exporting some of HIP's functions.

use super::*;

/// A shared library `name` in `dir` exporting `functions`, each `int f(...)` returning
/// its given value and, for hipGetDeviceCount and hipRuntimeGetVersion, writing it.
fn stand_in(dir: &std::path::Path, name: &str, functions: &[(&str, i32)]) {
    let mut c = String::new();
    for (f, value) in functions {
        match *f {
            "hipGetDeviceCount" => {
                c += &format!("int {f}(int *n) {{ *n = {value}; return 0; }}\n");
            }
            "hipRuntimeGetVersion" => {
                c += &format!("int {f}(int *v) {{ *v = {value}; return 0; }}\n");
            }
            _ => c += &format!("int {f}() {{ return {value}; }}\n"),
        }
    }
    let source = dir.join(format!("{name}.c"));
    std::fs::write(&source, c).unwrap();
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(name))
        .arg(&source)
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc built {name}");
}

/// Only `dir`, not the loader's path: a real ROCm on the machine must not stand in.
fn only(dir: &std::path::Path) -> Search {
    Search {
        dirs: vec![dir.to_path_buf()],
        loader_path: false,
    }
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-ops-hip-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const RUNTIME: &[(&str, i32)] = &[
    ("hipInit", 0),
    ("hipGetDeviceCount", 2),
    ("hipRuntimeGetVersion", 60_241_134),
];

fn with_rtc(runtime: &[(&'static str, i32)]) -> Vec<(&'static str, i32)> {
    let mut all = runtime.to_vec();
    all.extend(RTC_SYMBOLS.iter().map(|s| (*s, 0)));
    all
}

#[test]
fn a_missing_runtime_is_named_with_where_it_was_looked_for() {
    let dir = scratch("missing");
    let Err(why) = load_from(&["libgpu-ops-no-such-hip.so"], RTC_NAMES, &only(&dir)) else {
        panic!("a library that does not exist loaded");
    };
    assert!(why.starts_with("no HIP runtime"), "{why}");
    assert!(why.contains("libgpu-ops-no-such-hip.so"), "{why}");
    assert!(why.contains(&dir.display().to_string()), "{why}");
    let status = probe(Err(&why));
    assert_eq!((status.runtime, status.devices), (None, 0));
    assert!(
        status.reason.ends_with("AMD GPUs are not used"),
        "{}",
        status.reason
    );
}

#[test]
fn a_library_that_is_not_hip_is_refused_by_the_function_it_lacks() {
    let dir = scratch("partial");
    // Loads, but lacks hipRuntimeGetVersion.
    // (Each stand-in has its own name: a library once loaded is not written over.)
    stand_in(&dir, "libamdhip64-partial.so", &RUNTIME[..2]);
    let Err(why) = load_from(&["libamdhip64-partial.so"], &["libhiprtc.so"], &only(&dir)) else {
        panic!("a runtime without hipRuntimeGetVersion was taken");
    };
    assert!(why.contains("lacks hipRuntimeGetVersion"), "{why}");

    // A whole runtime, and neither a hipRTC library nor hipRTC's functions in it.
    stand_in(&dir, "libamdhip64.so", RUNTIME);
    let Err(why) = load_from(&["libamdhip64.so"], &["libhiprtc-absent.so"], &only(&dir)) else {
        panic!("a runtime without hipRTC was taken");
    };
    assert!(why.starts_with("no hipRTC"), "{why}");

    // hipRTC's own library (ROCm 6), missing one function.
    let mut partial = RTC_SYMBOLS.to_vec();
    partial.retain(|s| *s != "hiprtcGetCode");
    let partial: Vec<(&str, i32)> = partial.into_iter().map(|s| (s, 0)).collect();
    stand_in(&dir, "libhiprtc.so", &partial);
    let Err(why) = load_from(&["libamdhip64.so"], &["libhiprtc.so"], &only(&dir)) else {
        panic!("a hipRTC without hiprtcGetCode was taken");
    };
    assert!(why.contains("lacks hiprtcGetCode"), "{why}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_whole_library_set_is_probed_for_its_devices() {
    let dir = scratch("whole");
    // ROCm 5's layout: hipRTC's functions in the runtime itself.
    stand_in(&dir, "libamdhip64.so", &with_rtc(RUNTIME));
    let libraries = load_from(&["libamdhip64.so"], &["libhiprtc.so"], &only(&dir)).unwrap();
    assert!(libraries.rtc.is_none(), "hipRTC is the runtime's");
    let status = probe(Ok(&libraries));
    assert_eq!(status.devices, 2);
    assert!(
        status.runtime.as_deref().unwrap().contains("HIP 6.2"),
        "{status:?}"
    );
    assert!(
        status.reason.contains("no HIP engine yet"),
        "{}",
        status.reason
    );

    // A runtime without a device: hipInit fails (hipErrorNoDevice).
    let no_device = [("hipInit", 100), RUNTIME[1], RUNTIME[2]];
    stand_in(&dir, "libamdhip64.so.6", &with_rtc(&no_device));
    let libraries = load_from(&["libamdhip64.so.6"], &[], &only(&dir)).unwrap();
    let status = probe(Ok(&libraries));
    assert_eq!(status.devices, 0);
    assert!(
        status.reason.contains("no AMD GPU (hipInit returned 100, "),
        "{}",
        status.reason
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nvrtc_options_are_translated_to_clangs() {
    assert_eq!(
        hiprtc_options(
            &["--std=c++17", "--device-int128", "--fmad=false", "-DX=1"],
            "gfx90a"
        )
        .unwrap(),
        [
            "-std=c++17",
            "-ffp-contract=off",
            "-DX=1",
            "--offload-arch=gfx90a",
            "-O3"
        ]
    );
    let unknown = hiprtc_options(&["--use_fast_math"], "gfx90a").unwrap_err();
    assert!(unknown.contains("--use_fast_math"), "{unknown}");
}
