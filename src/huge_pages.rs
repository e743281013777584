//! The binary's allocator: the system's, asking the kernel for transparent huge pages on
//! every large allocation before it is first touched.
//!
//! A large request's buffers (its body, the decoded operands, the answer) are fresh
//! mappings that glibc returns when the request ends, so each one is faulted in again
//! 4 KiB at a time: a `perf` profile of a 256 MB bulk `field_add` put 40 % of the server's
//! samples in page faults and zeroing (docs/PERFORMANCE.md). Advised, such a mapping
//! faults 2 MiB at a time. glibc does the same for its own mappings under
//! `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (the image sets it), which a server started
//! any other way would lack. The advice covers only the whole 2 MiB-aligned pages inside
//! an allocation, so it adds no memory of its own; where the host's setting is `never`,
//! the kernel ignores it.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations from this size up are advised. With 4 MiB or 32 MiB (tried, 2026-11-28) a
/// 24 MB JSON body of one-number rows peaked at 3.84× its size, past the 3× that
/// `tests/process/server.rs` holds it to (3.02× unadvised; which block grew was not
/// traced); from 128 MiB it peaks as unadvised, and the buffers of a request of hundreds
/// of megabytes, where the faults cost most, are still advised.
pub const ADVISED_BYTES: usize = 128 << 20;
/// Outputs a job writes whole right after allocating them are advised from this size up
/// (`zeroed_output`): every page of them is touched at once, so huge pages cost no memory
/// beyond the values, while a fresh 4 MiB matmul output otherwise took 1024 first-touch
/// faults inside the product, about 15 % of a 1024³ f32 product's time on a 2-core
/// AVX-512 host (docs/PERFORMANCE.md, 2026-12-07).
pub const WRITTEN_WHOLE_BYTES: usize = 2 << 20;
const HUGE_PAGE: usize = 2 << 20;

pub struct HugePageHint;

// SAFETY: every call is the system allocator's; `advise` only gives the kernel advice on
// pages inside the block just returned, which it neither reads nor writes.
unsafe impl GlobalAlloc for HugePageHint {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        advise(p, new_size);
        p
    }
}

/// `len` zeros in a fresh vector whose whole 2 MiB pages are advised as huge pages before
/// anything touches them (from `WRITTEN_WHOLE_BYTES` up): for an output its job writes
/// entirely. Fresh zeroed memory from the kernel is untouched until written, so the
/// advice decides how it is faulted in; memory glibc reuses is already there.
pub fn zeroed_output<T: Clone + Default>(len: usize) -> Vec<T> {
    let v = vec![T::default(); len];
    advise_from(
        v.as_ptr() as *mut u8,
        std::mem::size_of_val(v.as_slice()),
        WRITTEN_WHOLE_BYTES,
    );
    v
}

/// `madvise(MADV_HUGEPAGE)` on the 2 MiB-aligned part of `[p, p + size)`; a failure (a
/// kernel without transparent huge pages) leaves the block as it was.
fn advise(p: *mut u8, size: usize) {
    advise_from(p, size, ADVISED_BYTES)
}

/// `advise`, for blocks of at least `threshold` bytes.
fn advise_from(p: *mut u8, size: usize, threshold: usize) {
    if p.is_null() || size < threshold {
        return;
    }
    let start = (p as usize).next_multiple_of(HUGE_PAGE);
    let end = (p as usize + size) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        #[cfg(target_os = "linux")]
        // SAFETY: the range lies inside the block just allocated; advice changes no contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The `VmFlags` of the mapping that holds `addr`, from /proc/self/smaps.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, hi)) = range.split_once('-') {
                    if let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                    {
                        inside = lo <= addr && addr < hi;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.trim().to_string();
                }
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    fn thp_available() -> bool {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"))
    }

    #[test]
    fn large_blocks_are_advised_and_small_ones_are_not() {
        if !thp_available() {
            crate::skips::skip(
                "huge_pages::tests::large_blocks_are_advised_and_small_ones_are_not",
                "this kernel has no transparent huge pages",
            );
            return;
        }
        let large = Layout::from_size_align(ADVISED_BYTES, 8).unwrap();
        let small = Layout::from_size_align(ADVISED_BYTES - 1, 8).unwrap();
        unsafe {
            let p = HugePageHint.alloc(large);
            let inner = (p as usize).next_multiple_of(HUGE_PAGE);
            assert!(
                vm_flags(inner).split(' ').any(|f| f == "hg"),
                "{}",
                vm_flags(inner)
            );
            HugePageHint.dealloc(p, large);
            let q = HugePageHint.alloc_zeroed(small);
            assert!(!vm_flags(q as usize).split(' ').any(|f| f == "hg"));
            HugePageHint.dealloc(q, small);
        }
    }

    /// An output written whole is advised (from 2 MiB up), zeros all the same.
    #[test]
    fn outputs_written_whole_are_advised_from_two_mib() {
        if !thp_available() {
            crate::skips::skip(
                "huge_pages::tests::outputs_written_whole_are_advised_from_two_mib",
                "this kernel has no transparent huge pages",
            );
            return;
        }
        let v: Vec<f32> = zeroed_output(2 * WRITTEN_WHOLE_BYTES / 4);
        assert!(v.iter().all(|&x| x == 0.0));
        let inner = (v.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
        assert!(
            vm_flags(inner).split(' ').any(|f| f == "hg"),
            "{}",
            vm_flags(inner)
        );
    }
}
