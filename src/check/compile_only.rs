//! `gpu-ops check --compile-only --arch sm_90`: every kernel module compiled to a cubin
//! for each architecture into `<data-dir>/kernel-cache`, here, with this machine's NVRTC
//! (no GPU needed). A device whose NVRTC has the same major.minor then loads the cubins
//! without compiling: on a lent GPU with minutes of budget, that is a minute saved.

use super::CheckArgs;
use crate::backend::cuda;

pub fn run(args: &CheckArgs) -> Result<(), String> {
    let (major, minor) = cuda::kernels::nvrtc_version()
        .ok_or("--compile-only needs libnvrtc (none could be loaded; set LD_LIBRARY_PATH)")?;
    let cache = args.data_dir.join("kernel-cache");
    let library = crate::ops::kernel_library();
    let mut failed = Vec::new();
    for sm in &args.arch {
        if !valid_arch(sm) {
            return Err(format!(
                "--arch {sm:?}: expected a real architecture such as sm_90"
            ));
        }
        let started = std::time::Instant::now();
        let for_arch = library.for_nvidia_arch(sm);
        for m in cuda::cubins_for(&for_arch, sm, &cache) {
            match &m.cubin {
                Ok(c) => println!(
                    "{sm} {:<10} {:>8} bytes  {:>6.2} s  {}",
                    m.module,
                    c.bytes.len(),
                    m.seconds,
                    if c.cache_hit { "cached" } else { "compiled" }
                ),
                Err(e) => {
                    println!("{sm} {:<10} FAILED: {e}", m.module);
                    failed.push(format!("{} for {sm}", m.module));
                }
            }
        }
        println!(
            "{sm}: {} modules with NVRTC {major}.{minor} in {:.1} s, into {}",
            for_arch.modules.len(),
            started.elapsed().as_secs_f64(),
            cache.display()
        );
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("could not compile {}", failed.join(", ")))
    }
}

/// `sm_` and digits, with an optional `a` suffix (sm_90a).
fn valid_arch(sm: &str) -> bool {
    sm.strip_prefix("sm_").is_some_and(|v| {
        let digits = v.strip_suffix('a').unwrap_or(v);
        digits.len() >= 2 && digits.bytes().all(|b| b.is_ascii_digit())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_real_architectures_are_taken() {
        for ok in ["sm_80", "sm_90", "sm_90a", "sm_100"] {
            assert!(super::valid_arch(ok), "{ok}");
        }
        for bad in ["compute_90", "sm_", "sm_9", "90", "sm_9x", ""] {
            assert!(!super::valid_arch(bad), "{bad}");
        }
    }
}
