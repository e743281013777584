//! Hot loops compiled twice: for the baseline target (SSE2 on x86-64) and for AVX2,
//! chosen at run time. Both builds perform the same IEEE operations in the same order
//! (Rust never fuses a multiply and an add on its own, and FMA is not enabled), so they
//! give bit-identical results and a dataset does not depend on the machine's vector
//! width; only the speed does.

/// `vis fn name(args) -> ret => body;` defines `name`, which runs `body` (an
/// `#[inline(always)]` function with the same signature) built for AVX2 where the CPU
/// has it and for the baseline elsewhere.
macro_rules! avx2_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $body:path;) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2, checked just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

pub(crate) use avx2_dispatch;
