//! hipRTC: one kernel module's source compiled for one AMD architecture (`gfx90a`) into a
//! code object, from the same expanded source and options NVRTC takes (`KernelModule`),
//! translated to clang's spelling.
//!
//! hipRTC runs LLVM in this process, and LLVM aborts the process on some internal errors
//! instead of returning one (Debian's ROCm 5.2 did so on a u128 division in `dp.cu`, since
//! replaced): nothing compiles through here in the server until a HIP engine needs it.

use super::libraries;
use std::ffi::{c_char, c_int, c_void, CString};

type Program = *mut c_void;
type CreateProgram = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileProgram = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type GetSize = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type GetBytes = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type DestroyProgram = unsafe extern "C" fn(*mut Program) -> c_int;
type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

/// NVRTC's options as clang spells them for HIP: `--std=` is `-std=`, `--fmad=false` is
/// `-ffp-contract=off`, `--device-int128` is HIP's default, `-D` and `-I` pass as they
/// are; an option with no known translation is an error, never a guess. Then the
/// architecture, and -O3 (hipRTC's own default is lower).
pub fn hiprtc_options(nvrtc_options: &[&str], arch: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for &o in nvrtc_options {
        match o {
            "--device-int128" => {}
            "--fmad=false" => out.push("-ffp-contract=off".to_string()),
            _ if o.starts_with("--std=") => out.push(o[1..].to_string()),
            _ if o.starts_with("-D") || o.starts_with("-I") => out.push(o.to_string()),
            _ => return Err(format!("NVRTC option {o} has no hipRTC translation")),
        }
    }
    out.push(format!("--offload-arch={arch}"));
    out.push("-O3".into());
    Ok(out)
}

/// Function `name` of `lib`, as type `T` (one of the signatures above).
fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
    // SAFETY: `T` is the C signature hipRTC declares for `name`.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("hipRTC lacks {name}: {e}"))
}

/// hipRTC's version, where it loads.
pub fn hiprtc_version() -> Option<(i32, i32)> {
    let version: Version = symbol(&libraries().ok()?.rtc().library, "hiprtcVersion").ok()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: hipRTC's signature; it writes two ints.
    let rc = unsafe { version(&mut major, &mut minor) };
    (rc == 0).then_some((major, minor))
}

/// `source` (headers already expanded) compiled for `arch` with NVRTC's `options`
/// translated (`hiprtc_options`): the code object (an AMDGPU ELF), or hipRTC's log.
pub fn compile(source: &str, arch: &str, options: &[&str]) -> Result<Vec<u8>, String> {
    let lib = &libraries().map_err(str::to_string)?.rtc().library;
    let options: Vec<CString> = hiprtc_options(options, arch)?
        .into_iter()
        .map(|o| CString::new(o).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let source = CString::new(source).map_err(|e| e.to_string())?;
    let create: CreateProgram = symbol(lib, "hiprtcCreateProgram")?;
    let compile: CompileProgram = symbol(lib, "hiprtcCompileProgram")?;
    let log_size: GetSize = symbol(lib, "hiprtcGetProgramLogSize")?;
    let log: GetBytes = symbol(lib, "hiprtcGetProgramLog")?;
    let code_size: GetSize = symbol(lib, "hiprtcGetCodeSize")?;
    let code: GetBytes = symbol(lib, "hiprtcGetCode")?;
    let destroy: DestroyProgram = symbol(lib, "hiprtcDestroyProgram")?;
    // One compile at a time in the process: Debian's hipRTC 5.2 crashed (SIGSEGV) when a
    // failing compile ran beside others on other threads (2026-11-29).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: each function has hipRTC's C signature; the program is destroyed on every
    // path after creation, and the log and code buffers are sized by hipRTC's answers.
    unsafe {
        let mut program: Program = std::ptr::null_mut();
        let name = c"gpu_ops.cu";
        let rc = create(
            &mut program,
            source.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if rc != 0 {
            return Err(format!("hiprtcCreateProgram returned {rc}"));
        }
        let pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let compiled = compile(program, pointers.len() as c_int, pointers.as_ptr());
        let result = if compiled != 0 {
            let mut n = 0usize;
            let text = if log_size(program, &mut n) == 0 && n > 1 {
                let mut buf = vec![0u8; n];
                log(program, buf.as_mut_ptr().cast());
                // ROCm 5.2 fills all n bytes with text, no NUL; later ones end in one.
                let end = buf.iter().position(|&b| b == 0).unwrap_or(n);
                String::from_utf8_lossy(&buf[..end]).into_owned()
            } else {
                String::new()
            };
            Err(format!("hipRTC for {arch} returned {compiled}: {text}"))
        } else {
            let mut n = 0usize;
            if code_size(program, &mut n) != 0 || n == 0 {
                Err(format!("hipRTC for {arch} gave no code object"))
            } else {
                let mut bytes = vec![0u8; n];
                match code(program, bytes.as_mut_ptr().cast()) {
                    0 => Ok(bytes),
                    rc => Err(format!("hiprtcGetCode returned {rc}")),
                }
            }
        };
        destroy(&mut program);
        result
    }
}
