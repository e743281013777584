//! cuDNN for f32 2-D convolution (cross-correlation), as an engine beside our im2col
//! launcher. Like cuBLASLt it is used only on a device where its own self-test
//! (`CONV2D_CUDNN_OP`) held it to the CPU twin; a device without the library (the
//! service's runtime image has none) keeps im2col.
//!
//! The math type is `CUDNN_FMA_MATH`: cuDNN's default lets Ampere and later run f32
//! convolutions on TF32 tensor cores, which would be outside conv2d's f32 error bound.
//! The algorithms are those that form each output as its own window's sum, as on the CPU
//! and im2col: the implicit GEMMs, the explicit GEMM and the direct one. cuDNN's
//! heuristic may pick FFT or Winograd, whose rounding spreads across a tile and breaks the
//! per-value bound where a window's sum is near zero. Of those allowed, the one a geometry
//! runs fastest with is found by timing each the first time the device meets it
//! (`measured`), as `cudnn.benchmark` does, and kept.

use super::device_engine::CudaMemory;
use super::measured::{device_ms, fastest, Chosen};
use super::CudaEngine;
use crate::backend::device::engine::{own, own_mut, EngineMemory};
use crate::backend::device::{DeviceBuffer, DeviceError, DeviceErrorKind, DeviceLease};
use cudarc::cudnn::{result, result::CudnnError, sys, ConvForward, Cudnn};
use std::ffi::c_int;
use std::sync::Arc;
use sys::cudnnConvolutionFwdAlgo_t as Algo;

/// The op name cuDNN's self-test vouches under (`/device`, `gpu_ops_kernel_verified`).
pub const CONV2D_CUDNN_OP: &str = "conv2d_cudnn";

/// One NCHW f32 convolution: `batch` images of `channels × height × width`, `out_channels`
/// filters of `channels / groups × kernel.0 × kernel.1`, the same padding on both sides
/// of each axis (cuDNN takes no other).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    pub batch: usize,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub out_channels: usize,
    pub kernel: (usize, usize),
    pub out: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub groups: usize,
}

/// A cuDNN handle on one device, on the engine's library stream.
pub struct CudnnConv {
    handle: Arc<Cudnn>,
    /// The algorithm each geometry ran fastest with, among those whose workspace fitted
    /// (a bit per `Algo`'s value) (`measured`).
    chosen: Chosen<(ConvGeometry, u8), Algo>,
}

/// The forward algorithms whose outputs are each their own window's sum, in the order
/// tried (the first is the one cuDNN's own heuristic prefers among them).
const PER_WINDOW: [Algo; 4] = [
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
    Algo::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
];

// SAFETY: the handle is used by one thread at a time (under `CudaEngine::library_lock`)
// and always on the engine's library stream; cuDNN handles may move between threads.
unsafe impl Send for CudnnConv {}
unsafe impl Sync for CudnnConv {}

/// Whether libcudnn can be loaded (a probe only: cudarc panics on a missing library).
pub fn library_available() -> bool {
    // SAFETY: only probes for the shared library.
    unsafe { sys::is_culib_present() }
}

/// cuDNN's version ("9.10.2" from 91002), where it loads.
pub fn library_version() -> Option<String> {
    // SAFETY: the library is present (checked first); the call takes no arguments.
    library_available().then(|| {
        let v = unsafe { sys::cudnnGetVersion() };
        format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
    })
}

impl CudnnConv {
    /// A handle on `engine`'s device, or why there is none.
    pub(crate) fn open(engine: &CudaEngine) -> Result<Self, String> {
        // SAFETY: only probes for the shared library.
        if !unsafe { sys::is_culib_present() } {
            return Err("libcudnn is not installed".into());
        }
        // The bindings are cuDNN 9's (enums, status codes): any other major is refused.
        let version = result::get_version();
        if !(90_000..100_000).contains(&version) {
            return Err(format!(
                "cuDNN {version} is installed; this build takes 9.x"
            ));
        }
        result::version_check().map_err(|e| format!("cuDNN version check: {:?}", e.0))?;
        engine.bind_to_thread().map_err(|e| e.to_string())?;
        let handle = Cudnn::new(engine.stream.clone()).map_err(|e| format!("cudnnCreate: {e}"))?;
        Ok(Self {
            handle,
            chosen: Chosen::default(),
        })
    }
}

/// cuDNN 9's status families: a failed execution (5000s) is a device failure, a failed
/// device allocation (4004) the device's memory; anything else (bad or unsupported
/// parameters, internal refusals) is `Unsupported`, and the caller runs im2col instead.
fn failed(e: CudnnError) -> DeviceError {
    let message = format!("cuDNN: {:?}", e.0);
    match e.0 as u32 {
        5000..=5999 => DeviceError::fatal(message),
        4004 => DeviceError::out_of_memory(message),
        _ => DeviceError::unsupported(message),
    }
}

/// An allocation shorter than the f32 values its buffer says it holds: never, as buffers
/// are allocated at their length; refused rather than read past.
fn too_short() -> DeviceError {
    DeviceError::fatal("a device buffer shorter than its length")
}

fn int(x: usize) -> Result<c_int, DeviceError> {
    c_int::try_from(x).map_err(|_| DeviceError::unsupported("a dimension over 2^31 for cuDNN"))
}

impl DeviceLease<'_> {
    /// Whether cuDNN opened on this device and the operator allows it (its self-test is
    /// `GpuDevice::op_verified(CONV2D_CUDNN_OP)`).
    pub fn has_cudnn(&self) -> bool {
        let engine = self.engine().as_any().downcast_ref::<CudaEngine>();
        engine.is_some_and(|c| c.cudnn.is_some()) && self.device.vendor_libraries_allowed()
    }

    /// `y = conv(x, w)` for `g`: x holds batch·C·H·W values, w O·(C/groups)·KH·KW, y
    /// batch·O·OH·OW; cuDNN's workspace may take up to `workspace_room` bytes (what the
    /// caller's buffers leave of its budget). Unsupported on the emulated device and where
    /// cuDNN did not open.
    pub fn cudnn_conv2d(
        &self,
        g: &ConvGeometry,
        x: &DeviceBuffer<f32>,
        w: &DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
        workspace_room: usize,
    ) -> Result<(), DeviceError> {
        let Some(engine) = self.engine().as_any().downcast_ref::<CudaEngine>() else {
            return Err(DeviceError::unsupported("cuDNN runs on a CUDA device only"));
        };
        let Some(conv) = engine.cudnn.as_ref() else {
            return Err(DeviceError::unsupported(
                "cuDNN did not open on this device",
            ));
        };
        let (x, w, y) = (
            own::<CudaMemory>(engine.id, &*x.memory)?,
            own::<CudaMemory>(engine.id, &*w.memory)?,
            own_mut::<CudaMemory>(engine.id, &mut *y.memory)?,
        );
        // The f32 views of the byte allocations cuDNN's typed calls take.
        let f32s = |m: &CudaMemory| m.bytes() / std::mem::size_of::<f32>();
        let (nx, nw, ny) = (f32s(x), f32s(w), f32s(y));
        // SAFETY: each allocation holds exactly that many f32 values (its buffer's).
        let (x, w, mut y) = unsafe {
            (
                x.slice().transmute::<f32>(nx).ok_or_else(too_short)?,
                w.slice().transmute::<f32>(nw).ok_or_else(too_short)?,
                y.slice_mut()
                    .transmute_mut::<f32>(ny)
                    .ok_or_else(too_short)?,
            )
        };
        engine.bind_to_thread()?;
        let _handle = engine.library_lock();
        let h = &conv.handle;
        let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let x_desc = h
            .create_4d_tensor::<f32>(
                nchw,
                [
                    int(g.batch)?,
                    int(g.channels)?,
                    int(g.height)?,
                    int(g.width)?,
                ],
            )
            .map_err(failed)?;
        let w_desc = h
            .create_4d_filter::<f32>(
                nchw,
                [
                    int(g.out_channels)?,
                    int(g.channels / g.groups)?,
                    int(g.kernel.0)?,
                    int(g.kernel.1)?,
                ],
            )
            .map_err(failed)?;
        let y_desc = h
            .create_4d_tensor::<f32>(
                nchw,
                [
                    int(g.batch)?,
                    int(g.out_channels)?,
                    int(g.out.0)?,
                    int(g.out.1)?,
                ],
            )
            .map_err(failed)?;
        let mut conv_desc = h
            .create_conv2d::<f32>(
                [int(g.padding.0)?, int(g.padding.1)?],
                [int(g.stride.0)?, int(g.stride.1)?],
                [int(g.dilation.0)?, int(g.dilation.1)?],
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            )
            .map_err(failed)?;
        conv_desc
            .set_math_type(sys::cudnnMathType_t::CUDNN_FMA_MATH)
            .map_err(failed)?;
        conv_desc.set_group_count(int(g.groups)?).map_err(failed)?;
        let op = ConvForward {
            conv: &conv_desc,
            x: &x_desc,
            w: &w_desc,
            y: &y_desc,
        };
        // The allowed algorithms cuDNN takes for this geometry whose workspace fits the
        // room the caller left, with their workspaces.
        let mut refusal = DeviceError::unsupported("cuDNN took no per-window algorithm");
        let mut fitting = Vec::with_capacity(PER_WINDOW.len());
        let mut over_budget = false;
        for algo in PER_WINDOW {
            match op.get_workspace_size(algo).map_err(failed) {
                Ok(bytes) if bytes <= workspace_room => fitting.push((algo, bytes)),
                Ok(bytes) => {
                    over_budget = true;
                    refusal = DeviceError::unsupported(format!(
                        "cuDNN's workspace ({bytes} bytes) is over the {workspace_room} bytes \
                         the job's memory budget leaves it"
                    ));
                }
                // A refusal for the budget says more than an algorithm cuDNN lacks.
                Err(e) if e.kind == DeviceErrorKind::Unsupported => {
                    if !over_budget {
                        refusal = e;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        // A choice is the geometry's among the algorithms that fit: where the room leaves
        // fewer of them, another search finds the best of those.
        let problem = (*g, fitting.iter().fold(0u8, |m, (a, _)| m | 1 << *a as u32));
        let known = match fitting.as_slice() {
            [(only, _)] => Some(*only),
            _ => conv.chosen.get(&problem),
        };
        let bytes = match known {
            Some(algo) => fitting.iter().find(|(a, _)| *a == algo).map(|(_, b)| *b),
            None => fitting.iter().map(|(_, b)| *b).max(),
        };
        let Some(bytes) = bytes else {
            return Err(refusal);
        };
        // SAFETY: cuDNN writes its workspace before it reads it; nothing else reads it.
        let mut workspace = unsafe { engine.stream.alloc::<u8>(bytes.max(1)) }?;
        let mut launch = |algo: Algo| {
            // SAFETY: the descriptors describe exactly these buffers (NCHW f32, the
            // lengths above), and the workspace is at least the size cuDNN asked for it.
            unsafe { op.launch(algo, Some(&mut workspace), (1.0f32, 0.0f32), &x, &w, &mut y) }
                .map_err(failed)
        };
        self.clocked(|| {
            engine.on_library_stream(self.stream(), |stream| {
                let algo = match known {
                    Some(algo) => algo,
                    None => {
                        let algos: Vec<Algo> = fitting.iter().map(|(a, _)| *a).collect();
                        // beta is 0: every run overwrites y whole, so they may run in turn.
                        let chosen = fastest(&algos, |algo, times| {
                            let (ran, ms) =
                                device_ms(stream, || (0..times).try_for_each(|_| launch(algo)))?;
                            match ran {
                                Ok(()) => Ok(Some(ms)),
                                Err(e) if e.kind == DeviceErrorKind::Unsupported => {
                                    refusal = e;
                                    Ok(None)
                                }
                                Err(e) => Err(e),
                            }
                        })?;
                        let Some(chosen) = chosen else {
                            return Err(refusal);
                        };
                        tracing::info!(
                            geometry = ?g,
                            candidates = algos.len(),
                            ran = chosen.tried,
                            picked = ?chosen.algo,
                            ms = chosen.ms,
                            "cuDNN: convolution algorithm chosen by measurement"
                        );
                        conv.chosen.keep(problem, chosen.algo);
                        chosen.algo
                    }
                };
                launch(algo)
            })?
        })
    }
}
