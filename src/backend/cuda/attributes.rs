//! What the driver says of a loaded kernel: the registers and local memory ptxas gave
//! each thread, its static shared memory, and the most threads a block of it may have.
//! `max_threads` is the kernel's `__launch_bounds__`, or fewer where its registers do not
//! fit that many threads into a multiprocessor's register file: the driver refuses any
//! larger block, so a launcher's block is checked against it before launching
//! (`Launch::launch`).

use cudarc::driver::sys::CUfunction_attribute_enum as Attribute;
use cudarc::driver::{result::DriverError, CudaFunction};
use serde::Serialize;

/// One loaded kernel's attributes (`cuFuncGetAttribute`).
#[derive(Clone, Debug, Serialize)]
pub struct FunctionAttributes {
    /// Registers per thread (CU_FUNC_ATTRIBUTE_NUM_REGS).
    pub registers: u32,
    /// Local memory per thread, bytes: spills and arrays kept off registers
    /// (CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES).
    pub local_bytes: u32,
    /// Static shared memory per block, bytes; a launch's dynamic shared memory comes on
    /// top (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).
    pub shared_bytes: u32,
    /// The most threads a block may have on this device
    /// (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK).
    pub max_threads: u32,
}

/// Reads `function`'s attributes from the driver (its context is bound to this thread
/// for each read).
pub fn read(function: &CudaFunction) -> Result<FunctionAttributes, DriverError> {
    // The driver reports each as a non-negative int.
    let get = |attribute| {
        function
            .get_attribute(attribute)
            .map(|v| u32::try_from(v).unwrap_or(0))
    };
    Ok(FunctionAttributes {
        registers: get(Attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
        local_bytes: get(Attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        shared_bytes: get(Attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        max_threads: get(Attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
    })
}
