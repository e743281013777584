//! cuBLASLt for batched f32 matrix products, as an engine beside our own `matmul_f32`
//! kernel. It is only used on a device where its self-test passed (`MATMUL_BLASLT_OP`):
//! the library's answers are held to the CPU twin like every kernel's, and a device
//! without the library, or where it disagrees, keeps our kernel.
//!
//! Our tensors are row-major and cuBLASLt's column-major. A row-major `X` read as
//! column-major is `Xᵀ`, so `D = op(A)·op(B)` is computed as `Dᵀ = op(B)ᵀ·op(A)ᵀ`: B is
//! cuBLASLt's first operand, A its second, and `D`'s buffer comes out row-major.

use super::device_engine::CudaMemory;
use super::measured::{device_ms, fastest, Chosen};
use super::CudaEngine;
use crate::backend::device::engine::{own, own_mut};
use crate::backend::device::{DeviceBuffer, DeviceError, DeviceErrorKind, DeviceLease, Element};
use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaContext, CudaSlice, DevicePtr};
use std::ffi::{c_int, c_void};
use std::mem::size_of;
use std::sync::Arc;

/// The op name cuBLASLt's self-test vouches under (`/device`, `gpu_ops_kernel_verified`).
pub const MATMUL_BLASLT_OP: &str = "matmul_cublaslt";

/// How the products are formed: f32 accumulation; tensor cores may take the operands as
/// TF32, f16 or bf16. The caller has already rounded the operands to that precision, so
/// the down-conversion loses nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlasCompute {
    F32,
    Tf32,
    F16,
    Bf16,
}

/// How A and B are stored: f32, or packed into the 16-bit type of an f16 or bf16 product
/// (`ops::linalg` packs them on the device), which cuBLASLt's native half kernels read at
/// half the bytes. C and D are f32 either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperandStorage {
    F32,
    F16,
    Bf16,
}

impl OperandStorage {
    fn data_type(self) -> sys::cudaDataType {
        match self {
            OperandStorage::F32 => sys::cudaDataType::CUDA_R_32F,
            OperandStorage::F16 => sys::cudaDataType::CUDA_R_16F,
            OperandStorage::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        }
    }

    fn bytes(self) -> usize {
        match self {
            OperandStorage::F32 => 4,
            OperandStorage::F16 | OperandStorage::Bf16 => 2,
        }
    }
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
    pub storage: OperandStorage,
}

/// What an algorithm is chosen for: everything of a product but its scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Problem {
    shape: [usize; 6],
    trans: (bool, bool),
    compute: BlasCompute,
    storage: OperandStorage,
}

impl RowMajorProduct {
    fn problem(&self) -> Problem {
        Problem {
            shape: [
                self.m,
                self.n,
                self.k,
                self.a_batch_stride,
                self.b_batch_stride,
                self.batches,
            ],
            trans: (self.trans_a, self.trans_b),
            compute: self.compute,
            storage: self.storage,
        }
    }
}

/// Candidates asked of cuBLASLt's heuristic, timed the first time a problem is met.
const CANDIDATES: usize = 8;

/// A cuBLASLt handle and its workspace on one device.
pub struct BlasLt {
    /// The context the handle was made in, current when it is destroyed.
    ctx: Arc<CudaContext>,
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    /// The heuristic candidate each problem ran fastest with (`measured`).
    chosen: Chosen<Problem, sys::cublasLtMatmulAlgo_t>,
}

// SAFETY: the handle is used by one thread at a time (under `CudaEngine::library_lock`),
// and cuBLASLt handles may move between threads.
unsafe impl Send for BlasLt {}
unsafe impl Sync for BlasLt {}

impl Drop for BlasLt {
    fn drop(&mut self) {
        // SAFETY: the context is alive (held here); the handle was created by `open` in
        // it and is destroyed only here.
        let _ = unsafe {
            cudarc::driver::result::ctx::set_current(self.ctx.cu_ctx())
                .map(|()| lt::destroy_handle(self.handle))
        };
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
        Ok(Self {
            ctx: engine.ctx.clone(),
            handle,
            workspace,
            chosen: Chosen::default(),
        })
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

/// A column-major layout of `rows × cols` `storage` values with leading dimension `ld`,
/// batched.
fn layout(
    storage: OperandStorage,
    rows: usize,
    cols: usize,
    ld: usize,
    batches: usize,
    stride: usize,
) -> Result<Layout, CublasError> {
    let l = Layout(lt::create_matrix_layout(
        storage.data_type(),
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

/// Operands stored in 16 bits are read as they are, in f32 accumulation; f32 operands
/// are converted by the library to what the compute type names.
fn compute_type(c: BlasCompute, storage: OperandStorage) -> sys::cublasComputeType_t {
    use sys::cublasComputeType_t as T;
    if storage != OperandStorage::F32 {
        return T::CUBLAS_COMPUTE_32F;
    }
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

    /// Runs `p` on cuBLASLt: A and B hold `p.storage` values (T is f32 for f32, u16 for
    /// the packed halves), `d` holds `p.batches` row-major m × n entries, contiguous, and
    /// is read as C when `p.beta` is not 0. Unsupported on the emulated device and where
    /// the library did not open.
    pub fn blaslt_matmul<T: Element>(
        &self,
        p: &RowMajorProduct,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
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
        if size_of::<T>() != p.storage.bytes() {
            return Err(DeviceError::unsupported(format!(
                "operands of {} bytes stated as {:?}",
                size_of::<T>(),
                p.storage
            )));
        }
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
    }
}

/// The product's descriptors, each freed when dropped.
struct Described {
    first: Layout,
    second: Layout,
    out: Layout,
    desc: Desc,
    pref: Pref,
}

fn describe(p: &RowMajorProduct, workspace_bytes: usize) -> Result<Described, CublasError> {
    let (m, n, k, batches, storage) = (p.m, p.n, p.k, p.batches, p.storage);
    // cuBLASLt's first operand is op(B)ᵀ (n × k). B stored k × n row-major is n × k
    // column-major (ld n); stored n × k (transposed) it is k × n with ld k, transposed.
    let first = if p.trans_b {
        layout(storage, k, n, k, batches, p.b_batch_stride)?
    } else {
        layout(storage, n, k, n, batches, p.b_batch_stride)?
    };
    // Its second is op(A)ᵀ (k × m): A stored m × k is k × m column-major (ld k); stored
    // k × m (transposed) it is m × k with ld m, transposed.
    let second = if p.trans_a {
        layout(storage, m, k, m, batches, p.a_batch_stride)?
    } else {
        layout(storage, k, m, k, batches, p.a_batch_stride)?
    };
    let out = layout(OperandStorage::F32, n, m, n, batches, m * n)?;
    let desc = Desc(lt::create_matmul_desc(
        compute_type(p.compute, storage),
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
    // SAFETY: the preference is live; the attribute takes a u64 (size_t on 64-bit).
    unsafe {
        lt::set_matmul_pref_attribute(
            pref.0,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&(workspace_bytes as u64) as *const u64).cast(),
            size_of::<u64>(),
        )?;
    }
    Ok(Described {
        first,
        second,
        out,
        desc,
        pref,
    })
}

/// The heuristic's candidates for the product, in its order of preference (those it
/// states it can run), at most `CANDIDATES`.
fn candidates(blas: &BlasLt, l: &Described) -> Result<Vec<sys::cublasLtMatmulAlgo_t>, CublasError> {
    // SAFETY: all-zero bytes are a valid value of this plain C struct; the library
    // overwrites the first `found` entries.
    let mut results: [sys::cublasLtMatmulHeuristicResult_t; CANDIDATES] =
        unsafe { std::mem::zeroed() };
    let mut found: c_int = 0;
    // SAFETY: every descriptor is live; the array holds CANDIDATES results.
    unsafe {
        sys::cublasLtMatmulAlgoGetHeuristic(
            blas.handle,
            l.desc.0,
            l.first.0,
            l.second.0,
            l.out.0,
            l.out.0,
            l.pref.0,
            CANDIDATES as c_int,
            results.as_mut_ptr(),
            &mut found,
        )
        .result()?;
    }
    let found = (found.max(0) as usize).min(CANDIDATES);
    let usable: Vec<_> = results[..found]
        .iter()
        .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        .map(|r| r.algo)
        .collect();
    if usable.is_empty() {
        return Err(CublasError(
            sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
        ));
    }
    Ok(usable)
}

fn run(
    engine: &CudaEngine,
    blas: &BlasLt,
    p: &RowMajorProduct,
    a: &CudaMemory,
    b: &CudaMemory,
    d: &mut CudaMemory,
) -> Result<(), DeviceError> {
    let workspace_bytes = blas.workspace.len();
    let l = describe(p, workspace_bytes).map_err(failed)?;
    let stream = &engine.stream;
    let (a_ptr, b_ptr, d_ptr) = (a.address(), b.address(), d.address());
    let (w_ptr, _w_sync) = blas.workspace.device_ptr(stream);
    let launch = |algo: &sys::cublasLtMatmulAlgo_t| {
        // SAFETY: B and A hold `batches` entries of their storage type through their
        // strides (0: one entry, read by all), D holds batches·m·n f32 values and is C as
        // well (same layout, as cuBLASLt allows in place); the workspace is the size the
        // preference stated, and the algorithm came from the heuristic for these
        // descriptors.
        unsafe {
            lt::matmul(
                blas.handle,
                l.desc.0,
                (&p.alpha as *const f32).cast(),
                (&p.beta as *const f32).cast(),
                b_ptr as *const c_void,
                l.first.0,
                a_ptr as *const c_void,
                l.second.0,
                d_ptr as *const c_void,
                l.out.0,
                d_ptr as *mut c_void,
                l.out.0,
                algo,
                w_ptr as *mut c_void,
                workspace_bytes,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
    };
    let problem = p.problem();
    let algo = match blas.chosen.get(&problem) {
        Some(algo) => algo,
        None => {
            let offered = candidates(blas, &l).map_err(failed)?;
            // With beta 0 each run overwrites D whole, so the candidates can be run in
            // turn; with C in D a run would add to the last. Such a product takes the
            // heuristic's first and leaves the search to one without C.
            if p.beta != 0.0 || offered.len() == 1 {
                offered[0]
            } else {
                let chosen = fastest(&offered, |algo, times| {
                    let (ran, ms) =
                        device_ms(stream, || (0..times).try_for_each(|_| launch(&algo)))?;
                    match ran.map_err(failed) {
                        Ok(()) => Ok(Some(ms)),
                        Err(e) if e.kind == DeviceErrorKind::Unsupported => Ok(None),
                        Err(e) => Err(e),
                    }
                })?;
                let Some(chosen) = chosen else {
                    return Err(DeviceError::unsupported(
                        "cuBLASLt refused every candidate it offered",
                    ));
                };
                tracing::info!(
                    m = p.m,
                    n = p.n,
                    k = p.k,
                    batches = p.batches,
                    storage = ?p.storage,
                    compute = ?p.compute,
                    candidates = offered.len(),
                    ran = chosen.tried,
                    picked = offered.iter().position(|a| *a == chosen.algo),
                    ms = chosen.ms,
                    "cuBLASLt: algorithm chosen by measurement"
                );
                blas.chosen.keep(problem, chosen.algo);
                chosen.algo
            }
        }
    };
    launch(&algo).map_err(failed)
}
