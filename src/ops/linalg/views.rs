//! The tensor domains' one door to the `gemm` crate: a product of ndarray views. The CPU
//! twins keep their operands in the flat row-major buffers the wire and the device use,
//! and describe them as views (a transpose is `.t()`, a broadcast batch a zero stride, a
//! block a slice); gemm receives each view's pointer and strides as they are, with no
//! copy. The shapes are checked here once instead of argued at every call.

use gemm::Parallelism;
use ndarray::{ArrayView2, ArrayViewMut2};

/// `d = alpha · op(a) · b + beta · d`, where op conjugates `a` when `conj_a` (complex
/// values). `beta: None` overwrites `d` without reading it (it may hold anything).
///
/// # Panics
/// When the shapes do not chain: `a` is m × k, `b` k × n and `d` m × n.
pub fn gemm_into<T: Copy + 'static>(
    mut d: ArrayViewMut2<'_, T>,
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    alpha: T,
    beta: Option<T>,
    conj_a: bool,
    parallelism: Parallelism,
) {
    let ((m, k), (k_b, n)) = (a.dim(), b.dim());
    assert!(
        k == k_b && d.dim() == (m, n),
        "a product of {m}×{k} and {k_b}×{n} into {:?}",
        d.dim()
    );
    let (ds, as_, bs) = (d.strides().to_vec(), a.strides(), b.strides());
    // gemm names its scalars the other way round from BLAS: dst := alpha_g·dst +
    // beta_g·lhs·rhs; alpha_g is ignored when dst is not read.
    let (keep, read_d) = match beta {
        Some(beta) => (beta, true),
        None => (alpha, false),
    };
    // SAFETY: each pointer and its strides come from a live view of those dimensions, so
    // every element gemm reaches lies inside its buffer; `d` is borrowed mutably, so it
    // aliases neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            d.as_mut_ptr(),
            ds[1],
            ds[0],
            read_d,
            a.as_ptr(),
            as_[1],
            as_[0],
            b.as_ptr(),
            bs[1],
            bs[0],
            keep,
            alpha,
            false,
            conj_a,
            false,
            parallelism,
        )
    }
}

/// The kernels gemm runs in this process, by its own rule: AVX-512 where this crate's
/// `avx512` feature compiled them in and the CPU has AVX-512F, then AVX2 with FMA, NEON,
/// scalar ("avx512", "avx2", "neon", "scalar").
pub fn cpu_kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if cfg!(feature = "avx512") && std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("fma") {
            return "avx2";
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        return "neon";
    }
    #[allow(unreachable_code)]
    "scalar"
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, Array2};

    #[test]
    fn transposed_and_sliced_views_multiply_without_copies() {
        let a = array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]];
        let b = array![[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [9.0, 9.0]];
        let mut d = Array2::from_elem((2, 2), 10.0);
        // d = 2·a·b[..3] + 1·d
        let top = b.slice(ndarray::s![..3, ..]);
        gemm_into(
            d.view_mut(),
            a.view(),
            top,
            2.0,
            Some(1.0),
            false,
            Parallelism::None,
        );
        assert_eq!(d, array![[18.0, 20.0], [30.0, 32.0]]);
        // aᵀ·a, 3 × 3, d not read.
        let mut e = Array2::from_elem((3, 3), f64::NAN);
        gemm_into(
            e.view_mut(),
            a.t(),
            a.view(),
            1.0,
            None,
            false,
            Parallelism::None,
        );
        assert_eq!(e, a.t().dot(&a));
    }

    #[test]
    #[should_panic(expected = "a product of 2×3 and 2×2")]
    fn shapes_that_do_not_chain_are_refused() {
        let a = Array2::<f32>::zeros((2, 3));
        let b = Array2::<f32>::zeros((2, 2));
        let mut d = Array2::<f32>::zeros((2, 2));
        gemm_into(
            d.view_mut(),
            a.view(),
            b.view(),
            1.0,
            None,
            false,
            Parallelism::None,
        );
    }
}
