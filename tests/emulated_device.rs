//! The emulated device runs our real kernels (every `kernels/*.cu`, compiled for the host
//! by build.rs) with CUDA's execution model, on every machine. These tests show that it
//! knows every kernel the domains register, that its barrier, shared memory and argument
//! passing behave as on hardware, that its checker catches a divergent barrier, and that
//! kernels launched through it give the CPU twins' answers bit for bit.

use cudarc::driver::LaunchConfig;
use gpu_ops::backend::emulated::{self, LaunchErrorKind};
use gpu_ops::ops::kernel_library;
use gpu_ops::ops::zk::ntt::{kernel_tables, Direction, NttJob, Order};
use gpu_ops::ops::zk::samples::random_elements;
use gpu_ops::ops::zk::{tile_plan, Field, FieldBinaryJob, FieldOp, FieldVec};
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
fn every_registered_kernel_is_on_the_emulated_device() {
    let library = kernel_library();
    for module in &library.modules {
        for name in &module.entry_points {
            let params = emulated::kernel_params(name);
            assert!(
                params.is_some_and(|p| !p.is_empty()),
                "{}: {name}",
                module.name
            );
        }
    }
    assert_eq!(emulated::kernel_params("no_such_kernel"), None);
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
    match FieldVec::from_integers(
        Field::Goldilocks,
        &random_elements(Field::Goldilocks, n, seed),
    )
    .unwrap()
    {
        FieldVec::Goldilocks(w) => w,
        _ => unreachable!(),
    }
}

#[test]
fn field_kernels_match_the_cpu_twin_over_a_grid_stride() {
    // More elements than the grid has threads, so every thread loops.
    let n = 5_000usize;
    let (a, b) = (goldilocks(n, 1), goldilocks(n, 2));
    for op in FieldOp::ALL {
        let want = FieldBinaryJob::new(
            op,
            FieldVec::Goldilocks(a.clone()),
            FieldVec::Goldilocks(b.clone()),
        )
        .unwrap()
        .run_cpu();
        let mut out = vec![0u64; n];
        let (mut pa, mut pb, mut po) = (a.as_ptr(), b.as_ptr(), out.as_mut_ptr());
        let (mut len, mut stride) = (n as u64, 1u32);
        let name = format!("goldilocks_{}", op.name().trim_start_matches("field_"));
        // SAFETY: a, b and out hold n words; the kernel reads and writes no more.
        unsafe {
            emulated::launch(&name, config(4, 256, 0), args![pa, pb, po, len, stride]).unwrap()
        };
        assert_eq!(FieldVec::Goldilocks(out), want, "{name}");
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
