//! cuBLASLt for batched f32 matrix products, as an engine beside our own `matmul_f32`
//! kernel. It is only used on a device where its self-test passed (`MATMUL_BLASLT_OP`):
//! the library's answers are held to the CPU twin like every kernel's, and a device
//! without the library, or where it disagrees, keeps our kernel.
//!
//! Our tensors are row-major and cuBLASLt's column-major. A row-major `X` read as
//! column-major is `Xᵀ`, so `D = op(A)·op(B)` is computed as `Dᵀ = op(B)ᵀ·op(A)ᵀ`: B is
//! cuBLASLt's first operand, A its second, and `D`'s buffer comes out row-major.

use super::device_engine::CudaMemory;
use super::CudaEngine;
use crate::backend::device::engine::{own, own_mut};
use crate::backend::device::{DeviceBuffer, DeviceError, DeviceLease};
use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, DevicePtr};
use std::ffi::{c_int, c_void};
use std::mem::size_of;

/// The op name cuBLASLt's self-test vouches under (`/device`, `gpu_ops_kernel_verified`).
pub const MATMUL_BLASLT_OP: &str = "matmul_cublaslt";

/// How the products are formed: f32 storage throughout, f32 accumulation; tensor cores
/// may take the operands as TF32, f16 or bf16. The caller has already rounded the
/// operands to that precision, so the down-conversion loses nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlasCompute {
    F32,
    Tf32,
    F16,
    Bf16,
}

/// One batched row-major product: for each of `batches` entries,
/// `D = alpha·op(A)·op(B) + beta·D` with op(A) m × k and op(B) k × n. A transposed
/// operand is stored as its transpose (k × m, n × k). A batch stride of 0 broadcasts.
#[derive(Clone, Copy, Debug)]
pub struct RowMajorProduct {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub a_batch_stride: usize,
    pub b_batch_stride: usize,
    pub batches: usize,
    pub alpha: f32,
    pub beta: f32,
    pub compute: BlasCompute,
}

/// A cuBLASLt handle and its workspace on one device.
pub struct BlasLt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
}

// SAFETY: the handle is used by one thread at a time (under `CudaEngine::library_lock`),
// and cuBLASLt handles may move between threads.
unsafe impl Send for BlasLt {}
unsafe impl Sync for BlasLt {}

impl Drop for BlasLt {
    fn drop(&mut self) {
        // SAFETY: created by `open` and destroyed only here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// Whether libcublasLt can be loaded (a probe only: cudarc panics on a missing library).
pub fn library_available() -> bool {
    // SAFETY: only probes for the shared library.
    unsafe { sys::is_culib_present() }
}

/// cuBLASLt's version ("13.0.2" from 130002), where it loads.
pub fn library_version() -> Option<String> {
    // SAFETY: the library is present (checked first); the call takes no arguments.
    library_available().then(|| {
        let v = unsafe { sys::cublasLtGetVersion() };
        format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
    })
}

impl BlasLt {
    /// A handle on `engine`'s device, or why there is none (the library is missing, or
    /// refused). NVIDIA's advice for the workspace: 32 MiB on Hopper, 4 MiB before.
    pub(crate) fn open(engine: &CudaEngine, compute_major: i32) -> Result<Self, String> {
        // SAFETY: only probes for the shared library.
        if !unsafe { sys::is_culib_present() } {
            return Err("libcublasLt is not installed".into());
        }
        engine.bind_to_thread().map_err(|e| e.to_string())?;
        let bytes = if compute_major >= 9 {
            32 << 20
        } else {
            4 << 20
        };
        let workspace = engine
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| format!("cuBLASLt workspace: {e}"))?;
        let handle = lt::create_handle().map_err(|e| format!("cublasLtCreate: {e}"))?;
        Ok(Self { handle, workspace })
    }
}

/// Descriptors freed when dropped, on every path out of `run`.
struct Layout(sys::cublasLtMatrixLayout_t);
struct Desc(sys::cublasLtMatmulDesc_t);
struct Pref(sys::cublasLtMatmulPreference_t);

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}
impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

/// A column-major f32 layout of `rows × cols` with leading dimension `ld`, batched.
fn layout(
    rows: usize,
    cols: usize,
    ld: usize,
    batches: usize,
    stride: usize,
) -> Result<Layout, CublasError> {
    let l = Layout(lt::create_matrix_layout(
        sys::cudaDataType::CUDA_R_32F,
        rows as u64,
        cols as u64,
        ld as i64,
    )?);
    let count = batches as c_int;
    let stride = stride as i64;
    // SAFETY: the layout is live; each value has the size the attribute takes.
    unsafe {
        lt::set_matrix_layout_attribute(
            l.0,
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            (&count as *const c_int).cast(),
            size_of::<c_int>(),
        )?;
        lt::set_matrix_layout_attribute(
            l.0,
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            (&stride as *const i64).cast(),
            size_of::<i64>(),
        )?;
    }
    Ok(l)
}

fn compute_type(c: BlasCompute) -> sys::cublasComputeType_t {
    use sys::cublasComputeType_t as T;
    match c {
        BlasCompute::F32 => T::CUBLAS_COMPUTE_32F,
        BlasCompute::Tf32 => T::CUBLAS_COMPUTE_32F_FAST_TF32,
        BlasCompute::F16 => T::CUBLAS_COMPUTE_32F_FAST_16F,
        BlasCompute::Bf16 => T::CUBLAS_COMPUTE_32F_FAST_16BF,
    }
}

/// A refusal of the problem (no algorithm for it, a value it does not take) is
/// `Unsupported`, and the caller runs our kernel instead; a failed allocation is the
/// device's memory; anything else is a device failure.
fn failed(e: CublasError) -> DeviceError {
    use sys::cublasStatus_t as S;
    let message = format!("cuBLASLt: {e}");
    match e.0 {
        S::CUBLAS_STATUS_NOT_SUPPORTED | S::CUBLAS_STATUS_INVALID_VALUE => {
            DeviceError::unsupported(message)
        }
        S::CUBLAS_STATUS_ALLOC_FAILED => DeviceError::out_of_memory(message),
        _ => DeviceError::fatal(message),
    }
}

impl DeviceLease<'_> {
    /// Whether cuBLASLt opened on this device and the operator allows it (its self-test
    /// is a separate question: `GpuDevice::op_verified`).
    pub fn has_blaslt(&self) -> bool {
        let engine = self.engine().as_any().downcast_ref::<CudaEngine>();
        engine.is_some_and(|c| c.blaslt.is_some()) && self.device.vendor_libraries_allowed()
    }

    /// Runs `p` on cuBLASLt: `d` holds `p.batches` row-major m × n entries, contiguous,
    /// and is read as C when `p.beta` is not 0. Unsupported on the emulated device and
    /// where the library did not open.
    pub fn blaslt_matmul(
        &self,
        p: &RowMajorProduct,
        a: &DeviceBuffer<f32>,
        b: &DeviceBuffer<f32>,
        d: &mut DeviceBuffer<f32>,
    ) -> Result<(), DeviceError> {
        let Some(engine) = self.engine().as_any().downcast_ref::<CudaEngine>() else {
            return Err(DeviceError::unsupported(
                "cuBLASLt runs on a CUDA device only",
            ));
        };
        let Some(blas) = engine.blaslt.as_ref() else {
            return Err(DeviceError::unsupported(
                "cuBLASLt did not open on this device",
            ));
        };
        let (a, b, d) = (
            own::<CudaMemory>(engine.id, &*a.memory)?,
            own::<CudaMemory>(engine.id, &*b.memory)?,
            own_mut::<CudaMemory>(engine.id, &mut *d.memory)?,
        );
        if p.batches > c_int::MAX as usize {
            return Err(DeviceError::unsupported(
                "over 2^31 batch entries in one pass",
            ));
        }
        engine.bind_to_thread()?;
        let _handle = engine.library_lock();
        self.clocked(|| engine.on_library_stream(self.stream(), |_| run(engine, blas, p, a, b, d)))?
            .map_err(failed)
    }
}

fn run(
    engine: &CudaEngine,
    blas: &BlasLt,
    p: &RowMajorProduct,
    a: &CudaMemory,
    b: &CudaMemory,
    d: &mut CudaMemory,
) -> Result<(), CublasError> {
    let (m, n, k, batches) = (p.m, p.n, p.k, p.batches);
    // cuBLASLt's first operand is op(B)ᵀ (n × k). B stored k × n row-major is n × k
    // column-major (ld n); stored n × k (transposed) it is k × n with ld k, transposed.
    let first = if p.trans_b {
        layout(k, n, k, batches, p.b_batch_stride)?
    } else {
        layout(n, k, n, batches, p.b_batch_stride)?
    };
    // Its second is op(A)ᵀ (k × m): A stored m × k is k × m column-major (ld k); stored
    // k × m (transposed) it is m × k with ld m, transposed.
    let second = if p.trans_a {
        layout(m, k, m, batches, p.a_batch_stride)?
    } else {
        layout(k, m, k, batches, p.a_batch_stride)?
    };
    let out = layout(n, m, n, batches, m * n)?;
    let desc = Desc(lt::create_matmul_desc(
        compute_type(p.compute),
        sys::cudaDataType::CUDA_R_32F,
    )?);
    for (attr, trans) in [
        (
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            p.trans_b,
        ),
        (
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            p.trans_a,
        ),
    ] {
        // cublasOperation_t, a C enum: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let op: i32 = i32::from(trans);
        // SAFETY: the descriptor is live; the attribute takes a cublasOperation_t (an int).
        unsafe {
            lt::set_matmul_desc_attribute(
                desc.0,
                attr,
                (&op as *const i32).cast(),
                size_of::<i32>(),
            )?;
        }
    }
    let pref = Pref(lt::create_matmul_pref()?);
    let workspace_bytes = blas.workspace.len();
    // SAFETY: the preference is live; the attribute takes a u64 (size_t on 64-bit).
    unsafe {
        lt::set_matmul_pref_attribute(
            pref.0,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&(workspace_bytes as u64) as *const u64).cast(),
            size_of::<u64>(),
        )?;
    }
    // SAFETY: every descriptor is live and describes the buffers passed below.
    let heuristic = unsafe {
        lt::get_matmul_algo_heuristic(blas.handle, desc.0, first.0, second.0, out.0, out.0, pref.0)?
    };
    let stream = &engine.stream;
    let (a_ptr, b_ptr, d_ptr) = (a.address(), b.address(), d.address());
    let (w_ptr, _w_sync) = blas.workspace.device_ptr(stream);
    // SAFETY: B and A hold `batches` entries through their strides (0: one entry, read
    // by all), D holds batches·m·n values and is C as well (same layout, as cuBLASLt
    // allows in place); the workspace is the size the preference stated.
    unsafe {
        lt::matmul(
            blas.handle,
            desc.0,
            (&p.alpha as *const f32).cast(),
            (&p.beta as *const f32).cast(),
            b_ptr as *const c_void,
            first.0,
            a_ptr as *const c_void,
            second.0,
            d_ptr as *const c_void,
            out.0,
            d_ptr as *mut c_void,
            out.0,
            &heuristic.algo,
            w_ptr as *mut c_void,
            workspace_bytes,
            stream.cu_stream() as sys::cudaStream_t,
        )
    }
}
