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
        status.reason.contains("the HIP engine opens them"),
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

/// A stand-in HIP runtime with the engine's functions: host memory for device memory,
/// and one "kernel", `add_one(unsigned *p, unsigned n)`, run on the host from the
/// `void**` arguments exactly as `hipModuleLaunchKernel` receives them. `omit` leaves
/// one function out.
fn stand_in_runtime(dir: &std::path::Path, name: &str, omit: Option<&str>) {
    let c = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static size_t in_use = 0;
/* HIP's current device is per thread: allocation fails on a thread that set none. */
static __thread int current = -1;
static unsigned last_launch[6];
void standin_last_launch(unsigned *out) { memcpy(out, last_launch, sizeof last_launch); }
int hipSetDevice(int d) { if (d < 0 || d >= 2) return 101; current = d; return 0; }
int hipDeviceGetName(char *s, int len, int d) { snprintf(s, len, "Stand-in AMD GPU %d", d); return 0; }
int hipDeviceGetAttribute(int *v, int attr, int d) { *v = attr == 63 ? 104 : 0; return 0; }
int hipDeviceGetPCIBusId(char *s, int len, int d) { snprintf(s, len, "0000:%02x:00.0", d + 3); return 0; }
int hipMemGetInfo(size_t *f, size_t *t) { *t = (size_t)1 << 30; *f = *t - in_use; return 0; }
int hipMalloc(void **p, size_t n) {
    if (current < 0) return 101;
    if (n > ((size_t)1 << 30) - in_use) return 2;
    *p = malloc(n); in_use += n; return 0;
}
int hipFree(void *p) { free(p); return 0; }
int hipMemcpyHtoDAsync(void *d, void *s, size_t n, void *st) { memcpy(d, s, n); return 0; }
int hipMemcpyDtoHAsync(void *d, void *s, size_t n, void *st) { memcpy(d, s, n); return 0; }
int hipMemcpyDtoDAsync(void *d, void *s, size_t n, void *st) { memcpy(d, s, n); return 0; }
int hipMemsetAsync(void *d, int v, size_t n, void *st) { memset(d, v, n); return 0; }
int hipHostMalloc(void **p, size_t n, unsigned flags) { *p = malloc(n); return *p ? 0 : 2; }
int hipHostFree(void *p) { free(p); return 0; }
static int registered_ranges;
int hipHostRegister(void *p, size_t n, unsigned flags) { registered_ranges++; return 0; }
int hipHostUnregister(void *p) { registered_ranges--; return 0; }
int standin_registered_ranges(void) { return registered_ranges; }
int hipStreamCreate(void **s) { *s = (void *)0x5; return 0; }
int hipStreamDestroy(void *s) { return 0; }
int hipStreamSynchronize(void *s) { return 0; }
int hipStreamWaitEvent(void *s, void *e, unsigned flags) { return 0; }
int hipEventCreateWithFlags(void **e, unsigned flags) { *e = (void *)0x6; return 0; }
int hipEventRecord(void *e, void *s) { return 0; }
int hipEventSynchronize(void *e) { return 0; }
int hipEventDestroy(void *e) { return 0; }
int hipModuleLoadData(void **m, const void *image) {
    if (memcmp(image, "\177ELF", 4) != 0) return 200;
    *m = (void *)0x7; return 0;
}
int hipModuleUnload(void *m) { return 0; }
int hipModuleGetFunction(void **f, void *m, const char *name) {
    if (strcmp(name, "add_one") != 0) return 500;
    *f = (void *)0x9; return 0;
}
int hipFuncGetAttribute(int *v, int attr, void *f) { *v = attr == 0 ? 256 : attr == 4 ? 32 : 0; return 0; }
#ifndef OMIT_hipModuleLaunchKernel
int hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned shared, void *stream,
                          void **params, void **extra) {
    unsigned dims[6] = {gx, gy, gz, bx, by, bz};
    memcpy(last_launch, dims, sizeof dims);
    unsigned *p = *(unsigned **)params[0];
    unsigned n = *(unsigned *)params[1];
    for (unsigned i = 0; i < n; i++) p[i] += 1;
    return 0;
}
#endif
const char *hipGetErrorString(int rc) { return rc == 2 ? "out of memory" : "stand-in error"; }
int hipDeviceReset(void) { return 0; }
"#;
    let source = dir.join(format!("{name}.c"));
    std::fs::write(&source, c).unwrap();
    let mut cc = std::process::Command::new("cc");
    cc.args(["-shared", "-fPIC", "-o"]).arg(dir.join(name));
    if let Some(f) = omit {
        cc.arg(format!("-DOMIT_{f}"));
    }
    let status = cc.arg(&source).status().expect("cc runs");
    assert!(status.success(), "cc built {name}");
}

#[test]
fn the_engine_allocates_copies_and_launches_through_the_runtime() {
    use crate::backend::DeviceErrorKind;
    use engine::{Api, HipEngine};
    let dir = scratch("engine");
    stand_in_runtime(&dir, "libamdhip64.so", None);
    let loaded = open_first(&["libamdhip64.so"], &only(&dir)).unwrap();
    let api = Api::load(&loaded).unwrap();
    let entry = vec!["add_one".to_string()];
    let code = b"\x7fELF a stand-in code object".to_vec();
    let opened = HipEngine::open(api, 1, vec![("test", code, &entry, 0.25)]).unwrap();
    assert_eq!(opened.name, "Stand-in AMD GPU 1");
    assert_eq!(opened.pci_bus_id, "0000:04:00.0");
    assert_eq!((opened.compute_units, opened.memory_total), (104, 1 << 30));
    let e = opened.engine;
    assert_eq!(e.module_loads.len(), 1);
    assert!(e.module_loads[0].seconds >= 0.25);

    // Up, through a launch whose arguments are read as HIP passes them, and back.
    let host: Vec<u32> = (0..1000).collect();
    let bytes = std::mem::size_of_val(&host[..]);
    let m = e.alloc(bytes).unwrap();
    let stream = e.new_stream().unwrap();
    // SAFETY: `host` holds `bytes` bytes.
    unsafe { e.write(&stream, &m, host.as_ptr().cast(), bytes) }.unwrap();
    let n = host.len() as u32;
    let mut params = [m.address_slot(), (&n as *const u32).cast_mut().cast()];
    // SAFETY: add_one's arguments, in order; it touches n values of the buffer.
    unsafe { e.launch(&stream, "add_one", (4, 1, 1), (256, 1, 1), 0, &mut params) }.unwrap();
    let read = |m: &engine::HipMemory| {
        let mut back = vec![0u32; host.len()];
        // SAFETY: `back` has room for `bytes` bytes.
        unsafe { e.read(&stream, m, back.as_mut_ptr().cast(), bytes) }.unwrap();
        back
    };
    assert_eq!(read(&m), (1..=1000).collect::<Vec<u32>>());
    let mut other = e.alloc(bytes).unwrap();
    e.copy(&stream, &m, &mut other).unwrap();
    assert_eq!(read(&other), read(&m));
    e.zero(&stream, &mut other).unwrap();
    // Events order a second stream after the first.
    let second = e.new_stream().unwrap();
    let done = e.record(&stream).unwrap();
    e.wait(&second, &done).unwrap();
    e.synchronize(&second).unwrap();
    assert!(read(&other).iter().all(|&x| x == 0));
    let (free, total) = e.memory().unwrap();
    assert_eq!(total - free, 2 * bytes as u64, "two buffers in use");

    let limits = e.kernel_limits("add_one");
    assert_eq!(
        (limits.max_threads, limits.registers),
        (Some(256), Some(32))
    );
    assert_eq!(e.max_threads("add_one"), Some(256));

    // Errors keep their kinds: out of memory is the job's, an unknown kernel fatal.
    let oom = e.alloc(2 << 30).err().unwrap();
    assert_eq!(oom.kind, DeviceErrorKind::OutOfMemory);
    assert!(oom.message.contains("out of memory"), "{}", oom.message);
    // SAFETY: refused before anything is launched.
    let missing = unsafe { e.launch(&stream, "nope", (1, 1, 1), (1, 1, 1), 0, &mut []) };
    assert_eq!(missing.unwrap_err().kind, DeviceErrorKind::Fatal);
}

#[test]
fn a_runtime_without_an_engine_function_or_a_bad_module_is_refused_by_name() {
    use engine::{Api, HipEngine};
    let dir = scratch("engine-partial");
    stand_in_runtime(&dir, "libamdhip64.so", Some("hipModuleLaunchKernel"));
    let loaded = open_first(&["libamdhip64.so"], &only(&dir)).unwrap();
    let Err(why) = Api::load(&loaded) else {
        panic!("a runtime without hipModuleLaunchKernel was taken");
    };
    assert!(why.contains("lacks hipModuleLaunchKernel"), "{why}");

    let dir = scratch("engine-module");
    stand_in_runtime(&dir, "libamdhip64.so", None);
    // Kept loaded while its functions are called.
    let loaded = open_first(&["libamdhip64.so"], &only(&dir)).unwrap();
    let api = Api::load(&loaded).unwrap();
    let entry = vec!["add_one".to_string()];
    let not_elf = b"not a code object".to_vec();
    let Err(why) = HipEngine::open(api, 0, vec![("field", not_elf, &entry, 0.0)]) else {
        panic!("a module that is not a code object loaded");
    };
    assert!(
        why.contains("loading field") && why.contains("(200)"),
        "{why}"
    );
    let code = b"\x7fELF".to_vec();
    let unknown = vec!["field_add".to_string()];
    let Err(why) = HipEngine::open(api, 0, vec![("field", code, &unknown, 0.0)]) else {
        panic!("a kernel the module lacks was found");
    };
    assert!(why.contains("kernel field_add"), "{why}");
    let Err(why) = HipEngine::open(api, 5, Vec::new()) else {
        panic!("device 5 of 2 opened");
    };
    assert!(why.starts_with("AMD device 5: selecting it"), "{why}");
}

#[test]
fn the_architecture_is_found_in_the_properties_whatever_their_layout() {
    let mut props = vec![0u8; 4096];
    props[..18].copy_from_slice(b"AMD Instinct MI210");
    // A string that only contains "gfx" is not the name.
    props[300..310].copy_from_slice(b"xgfx90a\0\0\0");
    let at = 1000;
    props[at..at + 21].copy_from_slice(b"gfx90a:sramecc+:xnack");
    assert_eq!(discover::arch_in(&props).as_deref(), Some("gfx90a"));
    let mut rdna = vec![0u8; 64];
    rdna[8..15].copy_from_slice(b"gfx1030");
    assert_eq!(discover::arch_in(&rdna).as_deref(), Some("gfx1030"));
    assert_eq!(discover::arch_in(b"\0gfx\0"), None, "no name after gfx");
    assert_eq!(discover::arch_in(&[0u8; 100]), None);
}

#[test]
fn a_hip_device_takes_uploads_launches_and_downloads_through_its_lease() {
    use crate::backend::device::{DeviceErrorKind, GpuDevice, GpuInfo, GpuVendor};
    use crate::backend::BackendKind;
    use engine::{Api, HipEngine};
    let dir = scratch("lease");
    stand_in_runtime(&dir, "libamdhip64.so", None);
    let loaded = open_first(&["libamdhip64.so"], &only(&dir)).unwrap();
    let api = Api::load(&loaded).unwrap();
    let entry = vec!["add_one".to_string()];
    let opened = HipEngine::open(api, 0, vec![("test", b"\x7fELF".to_vec(), &entry, 0.0)]).unwrap();
    let info = GpuInfo {
        ordinal: 0,
        vendor: GpuVendor::Amd,
        name: opened.name.clone(),
        uuid: format!("HIP-{}", opened.pci_bus_id),
        compute_capability: "gfx90a".into(),
        sm_count: opened.compute_units,
        memory_total_bytes: opened.memory_total,
        cuda_version: String::new(),
        nvrtc_version: String::new(),
        hiprtc_version: String::new(),
        kernel_arch: "gfx90a".into(),
        emulated: false,
        adapter: None,
    };
    let dev = GpuDevice::new(info, Box::new(opened.engine));
    assert_eq!(dev.label(), "hip:0");
    assert_eq!(dev.backend_kind(), BackendKind::Hip);
    type LastLaunch = unsafe extern "C" fn(*mut u32);
    // SAFETY: the stand-in's own function, with this signature.
    let last_launch = unsafe { loaded.library.get::<LastLaunch>(b"standin_last_launch") }.unwrap();
    type RegisteredRanges = unsafe extern "C" fn() -> i32;
    // SAFETY: the stand-in's own function, with this signature.
    let registered_ranges = unsafe {
        loaded
            .library
            .get::<RegisteredRanges>(b"standin_registered_ranges")
    }
    .unwrap();
    // On a thread that never selected the device: the lease (and each allocation) does.
    std::thread::scope(|s| {
        s.spawn(|| {
            let lease = dev.lease().unwrap();
            let mut buf = lease.upload(&[1u32, 2, 3]).unwrap();
            let n = 3u32;
            let config = |threads| crate::backend::device::LaunchConfig {
                grid_dim: (2, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            {
                let mut launch = lease.launch("add_one").unwrap();
                launch.arg(&mut buf).arg(&n);
                // SAFETY: add_one's arguments in order; it touches n values of the buffer.
                unsafe { launch.launch(config(128)) }.unwrap();
            }
            assert_eq!(lease.download(&buf).unwrap(), [2, 3, 4]);
            let mut dims = [0u32; 6];
            // SAFETY: writes six unsigned ints.
            unsafe { last_launch(dims.as_mut_ptr()) };
            assert_eq!(dims, [2, 1, 1, 128, 1, 1], "grid then block, as configured");
            // Over the kernel's limit (256, from the runtime): the job's error, before the
            // runtime sees it.
            {
                let mut launch = lease.launch("add_one").unwrap();
                launch.arg(&mut buf).arg(&n);
                // SAFETY: refused before the launch.
                let refused = unsafe { launch.launch(config(512)) }.unwrap_err();
                assert_eq!(refused.kind, DeviceErrorKind::Unsupported, "{refused}");
            }
            let mut zeroed = lease.alloc_zeros::<u32>(3).unwrap();
            lease.copy(&buf, &mut zeroed).unwrap();
            assert_eq!(lease.download(&zeroed).unwrap(), [2, 3, 4]);
            lease.zero(&mut zeroed).unwrap();
            assert_eq!(lease.download(&zeroed).unwrap(), [0, 0, 0]);
            // Page-locked staging: queued copies from and into hipHostMalloc'd memory,
            // there once the stream is waited for; a range past the buffer is refused.
            let (engine, stream) = (lease.engine(), lease.stream());
            let pinned = engine
                .pinned_host(64)
                .unwrap()
                .expect("HIP has page-locked memory");
            let words = [5u32, 6, 7];
            // SAFETY: 12 bytes into a 64-byte buffer no copy uses yet.
            unsafe {
                std::ptr::copy_nonoverlapping(words.as_ptr().cast(), pinned.as_mut_ptr(), 12)
            };
            // SAFETY: both ranges inside the pinned buffer and the 12-byte device buffer;
            // the host reads the result only after the stream is waited for.
            unsafe {
                engine
                    .upload_pinned(stream, &mut *zeroed.memory, 0, &*pinned, 0..12)
                    .unwrap();
                engine
                    .download_pinned(stream, &*zeroed.memory, 0, &*pinned, 16..28)
                    .unwrap();
            }
            lease.synchronize().unwrap();
            // SAFETY: 12 bytes the download wrote, aligned for u32, the copy finished.
            let back =
                unsafe { std::slice::from_raw_parts(pinned.as_mut_ptr().add(16).cast::<u32>(), 3) };
            assert_eq!(back, words);
            // SAFETY: refused before any copy.
            let past =
                unsafe { engine.upload_pinned(stream, &mut *zeroed.memory, 0, &*pinned, 60..72) };
            assert!(past.is_err());
            // The caller's memory registered (a request body's block): copies queue from
            // it as from hipHostMalloc'd memory, and dropping it unregisters the range.
            let mut body = vec![0u32, 9, 8, 7];
            // SAFETY: the vector outlives the registration, dropped first below.
            let registered = unsafe { engine.register_host(body.as_mut_ptr().cast(), 16) }
                .unwrap()
                .expect("HIP registers host memory");
            // SAFETY: the stand-in's own function, with this signature.
            let ranges = unsafe { registered_ranges() };
            assert_eq!(ranges, 1);
            // SAFETY: bytes 4..16 of the registered vector into the 12-byte buffer; read
            // back after the stream is waited for.
            unsafe {
                engine
                    .upload_pinned(stream, &mut *zeroed.memory, 0, &*registered, 4..16)
                    .unwrap()
            };
            lease.synchronize().unwrap();
            assert_eq!(lease.download(&zeroed).unwrap(), [9, 8, 7]);
            drop(registered);
            // SAFETY: as above.
            assert_eq!(unsafe { registered_ranges() }, 0, "unregistered on drop");
            drop(body);
            // A buffer handed to another engine is refused there, never read as its own.
            let emulated = GpuDevice::emulated(1, 1 << 20);
            let other = emulated.lease().unwrap();
            let foreign = |e: crate::backend::device::DeviceError| {
                assert!(e.message.contains("another device"), "{e}");
            };
            foreign(other.download(&buf).unwrap_err());
            let mut theirs = other.upload(&[7u32, 8, 9]).unwrap();
            foreign(other.copy(&buf, &mut theirs).unwrap_err());
            foreign(lease.copy(&theirs, &mut zeroed).unwrap_err());
            foreign(other.zero(&mut zeroed).unwrap_err());
            {
                let mut launch = other.launch("goldilocks_add").unwrap();
                launch.arg(&mut buf).arg(&n);
                // SAFETY: refused before the launch.
                foreign(unsafe { launch.launch(config(32)) }.unwrap_err());
            }
            assert_eq!(other.download(&theirs).unwrap(), [7, 8, 9]);
            assert_eq!(lease.download(&buf).unwrap(), [2, 3, 4]);
        });
    });
}

#[test]
fn rocm_smi_feeds_the_gpu_gauges_of_the_devices_it_matches_by_pci_address() {
    use smi::{bdf_id, Watched};
    assert_eq!(bdf_id("0000:03:00.0"), Some(0x300));
    assert_eq!(
        bdf_id("0001:c1:1f.7"),
        Some((1 << 32) | (0xc1 << 8) | (0x1f << 3) | 7)
    );
    assert_eq!(bdf_id("not a bus id"), None);
    let dir = scratch("smi");
    let c = r#"
#include <stdint.h>
int rsmi_init(uint64_t flags) { return 0; }
int rsmi_num_monitor_devices(uint32_t *n) { *n = 2; return 0; }
int rsmi_dev_pci_id_get(uint32_t i, uint64_t *id) { *id = i == 0 ? 0x300 : 0x400; return 0; }
int rsmi_dev_busy_percent_get(uint32_t i, uint32_t *p) { *p = i == 1 ? 42 : 0; return 0; }
int rsmi_dev_memory_usage_get(uint32_t i, int type, uint64_t *b) { *b = type == 0 ? 1ull << 30 : 0; return 0; }
int rsmi_dev_memory_total_get(uint32_t i, int type, uint64_t *b) { *b = type == 0 ? 64ull << 30 : 0; return 0; }
int rsmi_dev_temp_metric_get(uint32_t i, uint32_t sensor, uint32_t metric, int64_t *t) { *t = 55500; return 0; }
#ifndef OMIT_POWER
int rsmi_dev_power_ave_get(uint32_t i, uint32_t sensor, uint64_t *uw) { *uw = 300000000; return 0; }
#endif
"#;
    let source = dir.join("smi.c");
    std::fs::write(&source, c).unwrap();
    for (name, omit) in [
        ("librocm_smi64.so", None),
        ("partial.so", Some("-DOMIT_POWER")),
    ] {
        let mut cc = std::process::Command::new("cc");
        cc.args(["-shared", "-fPIC", "-o"]).arg(dir.join(name));
        cc.args(omit).arg(&source);
        assert!(cc.status().expect("cc runs").success());
    }
    let loaded = open_first(&["librocm_smi64.so"], &only(&dir)).unwrap();
    let metrics = crate::metrics::Metrics::new();
    let watched = [
        // SMI's device 1 (bus 04) is our ordinal 0; bus 09 is not SMI's.
        Watched {
            ordinal: 0,
            uuid: "HIP-0000:04:00.0".into(),
            pci_bus_id: "0000:04:00.0".into(),
        },
        Watched {
            ordinal: 1,
            uuid: "HIP-0000:09:00.0".into(),
            pci_bus_id: "0000:09:00.0".into(),
        },
    ];
    assert_eq!(smi::sample_once(&loaded, &watched, &metrics), Ok(1));
    let labels = ["0", "HIP-0000:04:00.0"];
    let gauge = |g: &prometheus::GaugeVec| g.with_label_values(&labels).get();
    assert_eq!(gauge(&metrics.gpu_utilization), 0.42);
    assert_eq!(gauge(&metrics.gpu_memory_used), (1u64 << 30) as f64);
    assert_eq!(gauge(&metrics.gpu_memory_total), (64u64 << 30) as f64);
    assert_eq!(gauge(&metrics.gpu_temperature), 55.5);
    assert_eq!(gauge(&metrics.gpu_power), 300.0);
    let none = smi::sample_once(&loaded, &watched[1..], &metrics).unwrap_err();
    assert!(none.contains("knows none"), "{none}");
    let partial = open_first(&["partial.so"], &only(&dir)).unwrap();
    let why = smi::sample_once(&partial, &watched, &metrics).unwrap_err();
    assert!(why.contains("lacks rsmi_dev_power_ave_get"), "{why}");
}
