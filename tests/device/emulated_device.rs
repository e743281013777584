//! The emulated device runs our real kernels (every `kernels/*.cu`, compiled for the host
//! by build.rs) with CUDA's execution model, on every machine. These tests show that it
//! knows every kernel the domains register, that its barrier, shared memory and argument
//! passing behave as on hardware, that its checker catches a divergent barrier, and that
//! kernels launched through it give the CPU twins' answers bit for bit. It refuses a block
//! above a kernel's `__launch_bounds__`, as a device does.

use gpu_ops::backend::device::LaunchConfig;
use gpu_ops::backend::device::{DeviceErrorKind, GpuDevice};
use gpu_ops::backend::emulated::{self, LaunchErrorKind};
use gpu_ops::ops::dp::plan::{calibrate_gaussian, calibrate_laplace};
use gpu_ops::ops::dp::privatize::clip_factors;
use gpu_ops::ops::dp::{Clipping, Gradients, Mechanism, NoiseJob, NoiseKey, SgdPlan};
use gpu_ops::ops::kernel_library;
use gpu_ops::ops::zk::ntt::{kernel_tables, Direction, NttJob, Order};
use gpu_ops::ops::zk::samples::random_elements;
use gpu_ops::ops::zk::{
    tile_plan, Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob, FieldVec,
};
use std::ffi::c_void;

/// A launch's arguments as the driver takes them: one pointer per argument.
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        &mut [$(std::ptr::addr_of_mut!($a) as *mut c_void),*]
    };
}

fn config(grid: u32, block: u32, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: shared,
    }
}

#[test]
fn every_registered_kernel_is_on_the_emulated_device_with_its_launch_bound() {
    let library = kernel_library();
    let names = emulated::kernel_names();
    for module in &library.modules {
        for name in &module.entry_points {
            let params = emulated::kernel_params(name);
            assert!(
                params.is_some_and(|p| !p.is_empty()),
                "{}: {name}",
                module.name
            );
            // build.rs fails a kernel without __launch_bounds__; each bound is a block a
            // device can run.
            let bound = emulated::kernel_max_threads(name);
            assert!(
                bound.is_some_and(|b| (1..=1024).contains(&b)),
                "{name}: {bound:?}"
            );
            assert!(names.contains(name), "{name} is not listed");
        }
    }
    assert_eq!(emulated::kernel_params("no_such_kernel"), None);
    assert_eq!(emulated::kernel_max_threads("no_such_kernel"), None);
    assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted, each once");
}

/// The bounds the launchers' blocks were read from (`docs/GPU.md`): msm_scan runs one
/// block of 1024, the NTT tile up to 512 threads (`tile_plan`), attention 128 (both
/// kernels: four warps on the tensor cores'), and every
/// other kernel `DeviceLease::launch_config`'s 256.
#[test]
fn each_kernel_declares_the_largest_block_its_launcher_uses() {
    for name in emulated::kernel_names() {
        let want = if name.starts_with("emu_check_") || name == "msm_scan" {
            1024
        } else if name.ends_with("_ntt_tile") {
            512
        } else if name == "attention_f32" || name.starts_with("attention_mma_") {
            128
        } else {
            256
        };
        assert_eq!(emulated::kernel_max_threads(&name), Some(want), "{name}");
    }
    // The tile launcher never asks for more than the bound, whatever the field and size.
    for (element_bytes, log_n) in [(32, 20), (8, 24), (4, 24), (32, 1), (8, 3)] {
        let (_, threads) = tile_plan(1 << log_n, element_bytes);
        assert!(
            threads <= 512,
            "{element_bytes}-byte elements, 2^{log_n}: {threads}"
        );
    }
}

/// A block above the kernel's `__launch_bounds__` is refused before any thread runs, as
/// a device refuses it: directly, and through a device lease, where the refusal is the
/// job's own error (`Unsupported`: the job moves to the CPU, the device stays healthy).
#[test]
fn a_block_above_the_kernels_launch_bound_is_refused() {
    let (a, b) = (goldilocks(512, 1), goldilocks(512, 2));
    let mut out = vec![0u64; 512];
    let (mut pa, mut pb, mut po) = (a.as_ptr(), b.as_ptr(), out.as_mut_ptr());
    let (mut n, mut stride) = (512u64, 1u32);
    for block in [257u32, 512, 1024] {
        // SAFETY: refused before any thread runs (a, b and out hold n elements anyway).
        let err = unsafe {
            emulated::launch(
                "goldilocks_add",
                config(1, block, 0),
                args![pa, pb, po, n, stride],
            )
        }
        .unwrap_err();
        assert_eq!(err.kind, LaunchErrorKind::AboveLaunchBounds, "{err}");
        assert!(
            err.message.contains(&block.to_string()) && err.message.contains("(256)"),
            "{err}"
        );
    }
    // A block of three dimensions counts all its threads: 16 × 8 × 4 = 512.
    let three_d = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (16, 8, 4),
        shared_mem_bytes: 0,
    };
    // SAFETY: as above.
    let err = unsafe { emulated::launch("goldilocks_add", three_d, args![pa, pb, po, n, stride]) }
        .unwrap_err();
    assert_eq!(err.kind, LaunchErrorKind::AboveLaunchBounds, "{err}");
    // At the bound it runs.
    // SAFETY: a, b and out hold n elements.
    unsafe {
        emulated::launch(
            "goldilocks_add",
            config(2, 256, 0),
            args![pa, pb, po, n, stride],
        )
    }
    .unwrap();

    let device = GpuDevice::emulated(0, 64 << 20);
    let lease = device.lease().expect("the emulated device");
    let (x, y) = (lease.upload(&a).unwrap(), lease.upload(&b).unwrap());
    let mut sum = lease.alloc_zeros::<u64>(b.len()).unwrap();
    let mut launch = lease.launch("goldilocks_add").unwrap();
    launch.arg(&x).arg(&y).arg(&mut sum).arg(&n).arg(&stride);
    // SAFETY: refused before the device sees it.
    let err = unsafe { launch.launch(config(1, 512, 0)) }.unwrap_err();
    assert_eq!(err.kind, DeviceErrorKind::Unsupported, "{err}");
    for part in ["goldilocks_add", "512 threads", "limit of 256"] {
        assert!(err.message.contains(part), "{err} lacks {part:?}");
    }
}

#[test]
fn the_barrier_holds_every_thread_and_shared_memory_is_the_blocks() {
    let (blocks, threads) = (3u32, 256u32);
    let mut out = vec![0u32; (blocks * threads) as usize];
    let mut p = out.as_mut_ptr();
    // SAFETY: `out` has a word per thread of the grid.
    unsafe {
        emulated::launch(
            "emu_check_shared_exchange",
            config(blocks, threads, 0),
            args![p],
        )
    }
    .unwrap();
    for b in 0..blocks {
        for t in 0..threads {
            let want = ((t + 1) % threads) * 3 + b;
            assert_eq!(
                out[(b * threads + t) as usize],
                want,
                "block {b} thread {t}"
            );
        }
    }
}

#[test]
fn dynamic_shared_memory_has_the_launchs_size_and_no_more_than_48_kib() {
    let threads = 128u32;
    let mut out = vec![0u32; threads as usize];
    let mut p = out.as_mut_ptr();
    // SAFETY: `out` has a word per thread; the launch gives a word of shared memory each.
    unsafe {
        emulated::launch(
            "emu_check_dynamic_shared",
            config(1, threads, 4 * threads),
            args![p],
        )
    }
    .unwrap();
    let want: Vec<u32> = (0..threads).map(|t| threads - 1 - t + 100).collect();
    assert_eq!(out, want);
    // SAFETY: refused before any thread runs.
    let err = unsafe {
        emulated::launch(
            "emu_check_dynamic_shared",
            config(1, threads, 48 * 1024 + 4),
            args![p],
        )
    }
    .unwrap_err();
    assert_eq!(err.kind, LaunchErrorKind::InvalidLaunch, "{err}");
}

#[test]
fn a_barrier_that_some_threads_never_reach_is_reported() {
    let mut out = vec![0u32; 64];
    let mut p = out.as_mut_ptr();
    // SAFETY: `out` has a word per thread.
    let err =
        unsafe { emulated::launch("emu_check_divergent_barrier", config(1, 64, 0), args![p]) }
            .unwrap_err();
    assert_eq!(err.kind, LaunchErrorKind::BarrierDivergence, "{err}");
}

/// The emulated `mma.sync` reads each lane's fragments as PTX lays them out: a 16 × 8
/// product of small multiples of a power of two (exact in f16, bf16 and f32, so the
/// order of the sums cannot matter) equals the naive product, for both input types.
#[test]
fn the_emulated_mma_follows_ptxs_fragment_layout() {
    let a: Vec<f32> = (0..256)
        .map(|e| ((e / 16 * 7 + e % 16 * 3) % 11) as f32 / 4.0 - 1.25)
        .collect();
    let b: Vec<f32> = (0..128)
        .map(|e| ((e / 8 * 5 + e % 8 * 9) % 13) as f32 / 8.0 - 0.75)
        .collect();
    let mut want = vec![0f32; 128];
    for (e, w) in want.iter_mut().enumerate() {
        let (i, j) = (e / 8, e % 8);
        *w = 1.0 + (0..16).map(|k| a[i * 16 + k] * b[k * 8 + j]).sum::<f32>();
    }
    for bf16 in [0u32, 1] {
        let bits = |x: &[f32]| -> Vec<u16> {
            x.iter()
                .map(|&v| match bf16 {
                    1 => half::bf16::from_f32(v).to_bits(),
                    _ => half::f16::from_f32(v).to_bits(),
                })
                .collect()
        };
        let (ha, hb) = (bits(&a), bits(&b));
        let mut out = vec![0f32; 128];
        let (mut pa, mut pb, mut po, mut flag) = (ha.as_ptr(), hb.as_ptr(), out.as_mut_ptr(), bf16);
        // SAFETY: one warp; A holds 256 values, B 128, out 128.
        unsafe {
            emulated::launch(
                "emu_check_warp_mma",
                config(1, 32, 0),
                args![pa, pb, po, flag],
            )
        }
        .unwrap();
        assert_eq!(out, want, "bf16 = {bf16}");
    }
}

/// The emulated `ldmatrix.x4` hands lane `l` = 4·g + t, in register i, matrix i's row g,
/// columns 2t and 2t + 1 (with `.trans`, rows 2t and 2t + 1 of column g), the lower in the
/// lower half: PTX's layout, the one the tensor cores' fragments take. A row outside the
/// launch's shared memory fails the launch.
#[test]
fn the_emulated_ldmatrix_follows_ptxs_layout() {
    let m: Vec<u16> = (0..256).collect();
    let mut out = vec![0u32; 128];
    let (mut pm, mut po) = (m.as_ptr(), out.as_mut_ptr());
    for trans in [0u32, 1] {
        let (mut flag, mut global) = (trans, 0u32);
        // SAFETY: one warp; `m` holds four 8×8 matrices (512 bytes, the shared memory
        // given), `out` four words a lane.
        unsafe {
            emulated::launch(
                "emu_check_ldmatrix",
                config(1, 32, 512),
                args![pm, po, flag, global],
            )
        }
        .unwrap();
        for lane in 0..32u32 {
            let (g, t) = (lane / 4, lane % 4);
            for i in 0..4u32 {
                let at = |row: u32, col: u32| i * 64 + row * 8 + col;
                let (lo, hi) = if trans == 1 {
                    (at(2 * t, g), at(2 * t + 1, g))
                } else {
                    (at(g, 2 * t), at(g, 2 * t + 1))
                };
                assert_eq!(
                    out[(4 * lane + i) as usize],
                    lo | (hi << 16),
                    "trans {trans}, lane {lane}, register {i}"
                );
            }
        }
    }
    // Rows named outside the launch's shared memory: refused, as a GPU faults.
    let (mut flag, mut global) = (0u32, 1u32);
    // SAFETY: as above.
    let err = unsafe {
        emulated::launch(
            "emu_check_ldmatrix",
            config(1, 32, 512),
            args![pm, po, flag, global],
        )
    }
    .unwrap_err();
    assert_eq!(err.kind, LaunchErrorKind::InvalidLaunch, "{err}");
    assert!(err.message.contains("shared memory"), "{err}");
}

/// A shuffle hands each lane its partner's value, in every warp of the block; a lane
/// that returns while the rest of its warp waits at a shuffle fails the launch.
#[test]
fn warp_shuffles_exchange_values_and_a_missing_lane_is_reported() {
    let mut out = vec![0f32; 96];
    let (mut p, mut diverge) = (out.as_mut_ptr(), 0u32);
    // SAFETY: `out` has a word per thread.
    unsafe {
        emulated::launch(
            "emu_check_warp_shuffle",
            config(1, 96, 0),
            args![p, diverge],
        )
    }
    .unwrap();
    let want: Vec<f32> = (0..96u32).map(|t| (t ^ 5) as f32).collect();
    assert_eq!(out, want);
    diverge = 1;
    // SAFETY: as above.
    let err = unsafe {
        emulated::launch(
            "emu_check_warp_shuffle",
            config(1, 96, 0),
            args![p, diverge],
        )
    }
    .unwrap_err();
    assert_eq!(err.kind, LaunchErrorKind::WarpDivergence, "{err}");
    assert!(err.message.contains("warp"), "{err}");
}

/// Runs the racy check kernel: the child process of the race checker's test.
#[test]
#[ignore = "run by a_shared_memory_race_is_reported_under_thread_sanitizer in a child process"]
fn race_probe() {
    let mut out = vec![0u32; 64];
    let mut p = out.as_mut_ptr();
    // SAFETY: `out` has a word per thread.
    unsafe { emulated::launch("emu_check_shared_race", config(1, 64, 0), args![p]) }.unwrap();
}

/// A kernel writes a buffer and another thread copies it as a stream's copy does, ordered
/// only by a Rust channel, which ThreadSanitizer cannot see: to it, as to a GPU, the copy
/// and the kernel are unordered. The child process of the race checker's copy test.
#[test]
#[ignore = "run by a_copy_beside_a_kernel_is_reported_under_thread_sanitizer in a child process"]
fn copy_race_probe() {
    let mut out = vec![0u32; 64];
    let at = out.as_mut_ptr() as usize;
    let (written, wait) = std::sync::mpsc::channel::<()>();
    let copier = std::thread::spawn(move || {
        wait.recv().unwrap();
        let mut copy = vec![0u32; 64];
        // SAFETY: `out` outlives the thread (joined below) and holds 64 words.
        unsafe { emulated::copy_bytes(copy.as_mut_ptr().cast(), at as *const u8, 256) };
        copy
    });
    let mut p = out.as_mut_ptr();
    // SAFETY: `out` has a word per thread.
    unsafe { emulated::launch("emu_check_shared_exchange", config(1, 64, 0), args![p]) }.unwrap();
    written.send(()).unwrap();
    copier.join().unwrap();
}

/// Runs `probe` of this module in a child process (a report ends the process) and checks
/// that ThreadSanitizer reported a race naming `frame`.
fn assert_race_reported(probe: &str, frame: &str) {
    // The child inherits TSAN_OPTIONS (.ci/run's); a report makes its exit status nonzero
    // either way.
    // The probe's full test name: this module's path without the binary's crate name.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let probe = format!("{module}::{probe}");
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", &probe, "--nocapture"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(
        stdout.contains("1 passed") || stdout.contains("running 1 test"),
        "the probe did not run: {stdout}"
    );
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(
        !child.status.success(),
        "the race went unreported: {stderr}"
    );
    assert!(
        stderr.contains("ThreadSanitizer: data race") && stderr.contains(frame),
        "{stderr}"
    );
}

/// Whether the race checker runs; says so when it does not.
fn under_thread_sanitizer() -> bool {
    let on = emulated::sanitizer() == "thread";
    if !on {
        eprintln!(
            "the race checker runs under GPU_OPS_EMU_SANITIZE=thread (.ci/run's last step); this run has {}",
            emulated::sanitizer()
        );
    }
    on
}

/// Under ThreadSanitizer (`GPU_OPS_EMU_SANITIZE=thread`, a CI step), two threads of a
/// block touching one shared word between barriers, one writing, is a reported race. The
/// racy kernel runs in a child process, since the report ends it.
#[test]
fn a_shared_memory_race_is_reported_under_thread_sanitizer() {
    if under_thread_sanitizer() {
        assert_race_reported("race_probe", "emu_check_shared_race");
    }
}

/// Under ThreadSanitizer, a stream's copy (`emulated::copy_bytes`, in the checked
/// library) of bytes a kernel wrote with nothing ordering the two is a reported race:
/// the checker sees the streams' copies, not only the kernels (.ci/run ignores what the
/// uninstrumented Rust side does).
#[test]
fn a_copy_beside_a_kernel_is_reported_under_thread_sanitizer() {
    if under_thread_sanitizer() {
        assert_race_reported("copy_race_probe", "emu_copy");
    }
}

#[test]
fn a_launch_with_the_wrong_number_of_arguments_is_refused() {
    let (mut a, mut n) = (std::ptr::null_mut::<u64>(), 0u64);
    // SAFETY: refused before any thread runs.
    let err =
        unsafe { emulated::launch("goldilocks_add", config(1, 32, 0), args![a, n]) }.unwrap_err();
    assert_eq!(err.kind, LaunchErrorKind::ArgumentCount, "{err}");
    // SAFETY: as above.
    let err =
        unsafe { emulated::launch("no_such_kernel", config(1, 32, 0), args![a]) }.unwrap_err();
    assert_eq!(err.kind, LaunchErrorKind::UnknownKernel, "{err}");
}

fn goldilocks(n: usize, seed: u64) -> Vec<u64> {
    match elements(Field::Goldilocks, n, seed) {
        FieldVec::Goldilocks(w) => w,
        _ => unreachable!(),
    }
}

fn elements(field: Field, n: usize, seed: u64) -> FieldVec {
    FieldVec::from_integers(field, &random_elements(field, n, seed)).unwrap()
}

/// A field vector's words as the kernels read them (the launchers pass the same).
fn words(v: &FieldVec) -> *mut c_void {
    match v {
        FieldVec::Bn254Fr(l) | FieldVec::Bls12_381Fr(l) => l.as_ptr() as *mut c_void,
        FieldVec::Goldilocks(w) => w.as_ptr() as *mut c_void,
        FieldVec::BabyBear(w) => w.as_ptr() as *mut c_void,
    }
}

/// As `words`, for a vector the kernel writes.
fn words_mut(v: &mut FieldVec) -> *mut c_void {
    match v {
        FieldVec::Bn254Fr(l) | FieldVec::Bls12_381Fr(l) => l.as_mut_ptr().cast(),
        FieldVec::Goldilocks(w) => w.as_mut_ptr().cast(),
        FieldVec::BabyBear(w) => w.as_mut_ptr().cast(),
    }
}

/// More elements than the grid has threads, so every thread loops.
const GRID_STRIDED: usize = 5_000;

#[test]
fn field_kernels_match_the_cpu_twin_for_every_field_op_and_broadcast() {
    for field in Field::ALL {
        let a = elements(field, GRID_STRIDED, 1);
        for (b, stride) in [
            (elements(field, GRID_STRIDED, 2), 1u32),
            (elements(field, 1, 3), 0),
        ] {
            for op in FieldOp::ALL {
                let want = FieldBinaryJob::new(op, a.clone(), b.clone())
                    .unwrap()
                    .run_cpu();
                // Overwritten by the kernel: `a` and the result differ.
                let mut out = a.clone();
                let (mut pa, mut pb, mut po) = (words(&a), words(&b), words_mut(&mut out));
                let (mut n, mut stride) = (GRID_STRIDED as u64, stride);
                let name = format!("{}_{}", field.name(), &op.name()["field_".len()..]);
                // SAFETY: a and out hold n elements, b n or one; the kernel reads and
                // writes no more.
                unsafe {
                    emulated::launch(&name, config(4, 256, 0), args![pa, pb, po, n, stride])
                        .unwrap()
                };
                assert_eq!(out, want, "{name}, b stride {stride}");
            }
        }
    }
}

#[test]
fn pow_and_batch_inversion_kernels_match_the_cpu_twin() {
    for field in Field::ALL {
        let base = elements(field, GRID_STRIDED, 4);
        let exponents = random_elements(Field::Bn254Fr, GRID_STRIDED, 5);
        let want = FieldPowJob::new(base.clone(), exponents.clone())
            .unwrap()
            .run_cpu();
        // Every exponent as 256 little-endian bits, whatever the field's word size.
        let exps: Vec<u64> = exponents.iter().flat_map(|e| e.0).collect();
        let mut out = base.clone();
        let (mut pb, mut pe) = (words(&base), exps.as_ptr() as *mut c_void);
        let mut po = words_mut(&mut out);
        let (mut n, mut stride) = (GRID_STRIDED as u64, 1u32);
        let name = format!("{}_pow", field.name());
        // SAFETY: base and out hold n elements and exps n 256-bit exponents.
        unsafe {
            emulated::launch(&name, config(4, 256, 0), args![pb, pe, po, n, stride]).unwrap()
        };
        assert_eq!(out, want, "{name}");

        let want = FieldInvJob::new(base.clone()).unwrap().run_cpu();
        let mut out = base.clone();
        let (mut pi, mut po) = (words(&base), words_mut(&mut out));
        // Chunks of 7 with a short last one: 5000 = 714 × 7 + 2.
        let (mut n, mut chunk) = (GRID_STRIDED as u64, 7u64);
        let name = format!("{}_inv", field.name());
        // SAFETY: in and out hold n nonzero elements.
        unsafe { emulated::launch(&name, config(2, 128, 0), args![pi, po, n, chunk]).unwrap() };
        assert_eq!(out, want, "{name}");
    }
}

/// The NTT launcher's steps for a natural-order forward transform: bit-reverse, the
/// first stages of each tile in shared memory, then the wide stages.
fn ntt_on_the_emulated_device(x: &mut [u64], n: usize) {
    let (tw, _) = kernel_tables(Field::Goldilocks, n, Direction::Forward, None);
    let FieldVec::Goldilocks(tw) = tw else {
        unreachable!()
    };
    let (log_tile, threads) = tile_plan(n, 8);
    let total = x.len() as u64;
    let (mut px, mut ptw) = (x.as_mut_ptr(), tw.as_ptr());
    let (mut n64, mut log_n, mut total_v) = (n as u64, n.trailing_zeros(), total);
    // SAFETY (all three launches): x holds `total` words and tw the n/2 twiddles.
    unsafe {
        emulated::launch(
            "goldilocks_ntt_bitrev",
            config(8, 256, 0),
            args![px, n64, log_n, total_v],
        )
        .unwrap();
        let (mut log_tile_v, mut tiles) = (log_tile, total >> log_tile);
        emulated::launch(
            "goldilocks_ntt_tile",
            config(tiles as u32, threads, 8 << log_tile),
            args![px, ptw, n64, log_tile_v, tiles],
        )
        .unwrap();
        let mut half = 1u64 << log_tile;
        while half < n as u64 {
            emulated::launch(
                "goldilocks_ntt_stage",
                config(8, 256, 0),
                args![px, ptw, n64, half, total_v],
            )
            .unwrap();
            half <<= 1;
        }
    }
}

#[test]
fn ntt_kernels_match_the_cpu_twin_through_tiles_and_wide_stages() {
    // 2^13 Goldilocks elements: the first 12 stages in 32 KiB tiles, one wide stage.
    let (n, batch) = (1usize << 13, 2usize);
    assert!(tile_plan(n, 8).0 < n.trailing_zeros());
    let mut x = goldilocks(n * batch, 3);
    let want = NttJob::new(
        Direction::Forward,
        FieldVec::Goldilocks(x.clone()),
        batch,
        Order::Natural,
        Order::Natural,
        None,
        20,
    )
    .unwrap()
    .run_cpu();
    ntt_on_the_emulated_device(&mut x, n);
    assert_eq!(FieldVec::Goldilocks(x), want);
}

/// Deterministic gradients in [-2, 2): a splitmix64 stream.
fn gradients(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
        })
        .collect()
}

#[test]
fn dp_privatize_kernels_match_the_cpu_twin_bit_for_bit() {
    // Three layers of uneven widths, the middle one three segments of 4096 columns (the
    // last short), more (row, segment) items than the grid has blocks.
    let (rows, cols) = (12usize, 9000usize);
    let clipping = Clipping::Layers(vec![(100, 0.5), (8700, 1.0), (200, 2.0)]);
    let g = gradients(rows * cols, 7);
    let job = SgdPlan::new(1.1, &clipping, rows, cols).unwrap().job(
        Gradients::F64(g.clone().into()),
        rows,
        cols,
        rows as f64,
        NoiseKey::from_seed(11),
    );
    let want = job.run_cpu();

    // Two chunks of rows, 7 then 5, as the launcher streams them: each chunk's segment
    // partials, folded into its norms and factors, then its clipped rows into the running
    // column sums.
    let layers = job.layers();
    let seg_bounds: Vec<u64> = vec![0, 1, 4, 5];
    let segments = 5;
    let mut partials = vec![0f64; 7 * segments];
    let mut sq = vec![0f64; rows * layers];
    let mut factors = vec![0f64; rows * layers];
    let mut sums = vec![0f64; cols];
    let (mut cols_v, mut layers_v) = (cols as u64, layers as u32);
    let (mut pb, mut psb, mut pc) = (
        job.bounds.as_ptr(),
        seg_bounds.as_ptr(),
        job.clip_norms.as_ptr(),
    );
    let (mut pp, mut psum) = (partials.as_mut_ptr(), sums.as_mut_ptr());
    for chunk in [0..7usize, 7..rows] {
        let mut pg = g[chunk.start * cols..].as_ptr();
        let mut ps = sq[chunk.start * layers..].as_mut_ptr();
        let mut pf = factors[chunk.start * layers..].as_mut_ptr();
        let mut n = chunk.len() as u64;
        // SAFETY: pg holds the chunk's n × cols values, bounds and seg_bounds layers + 1,
        // clip layers, partials 7 × segments (the largest chunk's), ps and pf the chunk's
        // n × layers, sums cols; one block of exactly 256 threads per (row, segment), as
        // the launcher runs it.
        unsafe {
            emulated::launch(
                "dp_sq_partials_f64",
                config(16, 256, 0),
                args![pg, n, cols_v, pb, psb, layers_v, pp],
            )
            .unwrap();
            emulated::launch(
                "dp_fold_norms",
                config(1, 32, 0),
                args![pp, n, psb, layers_v, pc, ps, pf],
            )
            .unwrap();
            emulated::launch(
                "dp_clip_sum_f64",
                config(2, 128, 0),
                args![pg, n, cols_v, pb, layers_v, pf, psum],
            )
            .unwrap();
        }
    }
    assert_eq!(
        factors,
        clip_factors(&sq, &job.clip_norms),
        "the CPU's factors"
    );
    let key = job.key.words();
    let mut out = vec![0f64; cols];
    let (mut psum, mut pk, mut po) = (sums.as_ptr(), key.as_ptr(), out.as_mut_ptr());
    let (mut inv_grid, mut grid) = (1.0 / job.plan.grid, job.plan.grid);
    let (mut t, mut c, mut divisor) = (job.plan.t, job.plan.c, job.divisor);
    // SAFETY: sums and out hold cols, key 8 words.
    unsafe {
        emulated::launch(
            "dp_snap_noise",
            config(2, 128, 0),
            args![psum, cols_v, pk, inv_grid, grid, t, c, divisor, po],
        )
        .unwrap()
    };
    assert_eq!(out, want.gradient);
}

#[test]
fn dp_release_kernels_match_the_cpu_twin_bit_for_bit() {
    let values: Vec<f64> = gradients(3_000, 9).iter().map(|v| v * 100.0).collect();
    let gaussian = calibrate_gaussian(values.len(), 1.0, 1.0, 1e-5).unwrap();
    let laplace = calibrate_laplace(values.len(), 1.0, 1.0).unwrap();
    for mechanism in [
        Mechanism::Gaussian(gaussian.plan),
        Mechanism::Laplace(laplace.plan),
    ] {
        let job = NoiseJob {
            values: values.clone(),
            mechanism,
            key: NoiseKey::from_seed(13),
        };
        let want = job.run_cpu();
        let key = job.key.words();
        // The values from index 1 000 on, as a streamed chunk: each value's noise is its
        // index's in the whole release.
        let from = 1_000;
        let mut out = vec![0f64; values.len() - from];
        let (mut px, mut pk, mut po) = (values[from..].as_ptr(), key.as_ptr(), out.as_mut_ptr());
        let (mut n, mut first, mut grid) = (out.len() as u64, from as u64, mechanism.grid());
        let mut inv_grid = 1.0 / grid;
        // SAFETY: x and out hold n values, key 8 words.
        let launched = unsafe {
            match mechanism {
                Mechanism::Gaussian(p) => {
                    let (mut t, mut c) = (p.t, p.c);
                    emulated::launch(
                        "dp_gaussian_release",
                        config(4, 256, 0),
                        args![px, n, first, pk, inv_grid, grid, t, c, po],
                    )
                }
                Mechanism::Laplace(p) => {
                    let mut t = p.t;
                    emulated::launch(
                        "dp_laplace_release",
                        config(4, 256, 0),
                        args![px, n, first, pk, inv_grid, grid, t, po],
                    )
                }
            }
        };
        launched.unwrap();
        assert_eq!(out, want[from..], "{}", mechanism.name());
    }
}
