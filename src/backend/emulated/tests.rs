//! The emulated engine's streams as the launchers meet them, through `DeviceEngine`: work
//! of two streams really runs at once, an event really orders it, a buffer freed under
//! queued work waits for it, and a launch that fails while it runs fails the stream's
//! host waits.

use super::order::EmulatedStream;
use super::{EmulatedEngine, Fault};
use crate::backend::device::engine::{
    DeviceEngine, EngineMemory, EngineStream, KernelArgs, LaunchConfig,
};
use crate::backend::device::DeviceError;

/// Threads of the block the check kernels are launched with: one per output word.
const THREADS: u32 = 256;

fn idle(stream: &dyn EngineStream) -> bool {
    let stream = stream.as_any().downcast_ref::<EmulatedStream>().unwrap();
    stream.queue().is_idle()
}

/// Queues check kernel `name` on `stream`, one block of `THREADS` writing `out`.
fn launch(
    engine: &EmulatedEngine,
    stream: &dyn EngineStream,
    name: &str,
    out: &dyn EngineMemory,
) -> Result<(), DeviceError> {
    let slot = out.address_slot();
    let mut args = KernelArgs {
        pointers: vec![slot],
        sizes: vec![std::mem::size_of::<*mut u8>()],
        last_output: Some(slot),
        buffers: vec![(out, true)],
    };
    let config = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the check kernels take one `unsigned *` and write a word per thread; `out`
    // holds THREADS words.
    unsafe { engine.launch(stream, name, config, &mut args) }
}

fn read_words(
    engine: &EmulatedEngine,
    stream: &dyn EngineStream,
    memory: &dyn EngineMemory,
) -> Result<Vec<u32>, DeviceError> {
    let mut words = vec![0u32; THREADS as usize];
    // SAFETY: `words` holds the buffer's bytes.
    unsafe {
        engine.read(
            stream,
            memory,
            words.as_mut_ptr().cast(),
            THREADS as usize * 4,
        )?
    };
    Ok(words)
}

/// A slow kernel on stream A does not hold up stream B or the host (as on a GPU, and not
/// as when the emulated device ran each operation as it was queued); B's copy of A's
/// output, queued after waiting for A's event, really runs after A's kernel.
#[test]
fn two_streams_run_at_once_and_an_event_orders_them() {
    let engine = EmulatedEngine::new(1 << 20);
    let (a, b) = (engine.new_stream().unwrap(), engine.new_stream().unwrap());
    let bytes = THREADS as usize * 4;
    let (x, mut y, mut z) = (
        DeviceEngine::alloc(&engine, bytes).unwrap(),
        DeviceEngine::alloc(&engine, bytes).unwrap(),
        DeviceEngine::alloc(&engine, bytes).unwrap(),
    );
    engine.inject("emu_check_shared_exchange", Fault::SlowMs(2_000), 1);
    launch(&engine, &*a, "emu_check_shared_exchange", &*x).unwrap();
    assert!(
        !idle(&*a),
        "the launch returned while the kernel waits to run"
    );

    let words: Vec<u32> = (0..THREADS).map(|i| i * 7).collect();
    // SAFETY: `words` holds the buffer's bytes.
    unsafe { engine.write(&*b, &mut *y, words.as_ptr().cast(), bytes) }.unwrap();
    assert_eq!(read_words(&engine, &*b, &*y).unwrap(), words);
    assert!(
        !idle(&*a),
        "stream B's upload and download finished while A's kernel still ran"
    );

    let done = engine.record(&*a).unwrap();
    engine.wait(&*b, &*done).unwrap();
    engine.copy(&*b, &*x, &mut *z).unwrap();
    let exchanged: Vec<u32> = (0..THREADS).map(|t| ((t + 1) % THREADS) * 3).collect();
    assert_eq!(read_words(&engine, &*b, &*z).unwrap(), exchanged);
    assert!(
        idle(&*a),
        "B's host wait came after A's kernel, through the event"
    );
}

/// Freeing a buffer that queued work still uses waits for that work, as `cuMemFree`
/// does: the kernel never writes freed memory.
#[test]
fn a_buffer_freed_under_queued_work_waits_for_it() {
    let engine = EmulatedEngine::new(1 << 20);
    let a = engine.new_stream().unwrap();
    let x = DeviceEngine::alloc(&engine, THREADS as usize * 4).unwrap();
    engine.inject("emu_check_shared_exchange", Fault::SlowMs(300), 1);
    launch(&engine, &*a, "emu_check_shared_exchange", &*x).unwrap();
    assert!(!idle(&*a));
    drop(x);
    assert!(idle(&*a), "the free waited for the kernel");
    assert_eq!(engine.memory().0, 1 << 20, "and gave its bytes back");
}

/// A launch the driver takes but that fails while it runs (here a barrier not every
/// thread reaches) is reported by the stream's next host wait and every later one, and
/// the stream's later work does not run: a CUDA context's sticky error.
#[test]
fn a_launch_that_fails_while_it_runs_fails_the_streams_host_waits() {
    let engine = EmulatedEngine::new(1 << 20);
    let a = engine.new_stream().unwrap();
    let bytes = THREADS as usize * 4;
    let (x, mut y) = (
        DeviceEngine::alloc(&engine, bytes).unwrap(),
        DeviceEngine::alloc(&engine, bytes).unwrap(),
    );
    launch(&engine, &*a, "emu_check_divergent_barrier", &*x).unwrap();
    let failed = engine.synchronize(&*a).unwrap_err();
    assert!(failed.message.contains("barrier"), "{failed}");
    engine.zero(&*a, &mut *y).unwrap();
    assert!(engine.synchronize(&*a).is_err());
    let words = [5u32; THREADS as usize];
    // SAFETY: `words` holds the buffer's bytes.
    let upload = unsafe { engine.write(&*a, &mut *y, words.as_ptr().cast(), bytes) };
    assert!(
        upload.is_err(),
        "a pageable upload waits, and reports it too"
    );
    // Another stream is not this one's failure (once the host has waited for this one,
    // failed or not, its work is over and the order check lets B write the buffer).
    assert!(engine.synchronize(&*a).is_err());
    let b = engine.new_stream().unwrap();
    // SAFETY: as above.
    unsafe { engine.write(&*b, &mut *y, words.as_ptr().cast(), bytes) }.unwrap();
    assert_eq!(read_words(&engine, &*b, &*y).unwrap(), words);
}
