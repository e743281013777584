//! The MSM's WGSL kernels (`kernels/wgsl/msm_*.wgsl`) under `kernels/msm.cu`'s names and
//! with its arguments, so `msm_gpu.rs`'s launcher runs them unchanged: the digit and
//! sort kernels once, and the bucket sums and the reduction per curve, over its base
//! field (`fp.wgsl` with the curve's modulus) and its XYZZ points (`curve.wgsl`).

use super::msm_gpu::DeviceCurve;
use super::wgsl::{fp_source, u32_limbs, PRELUDE};
use crate::backend::wgpu::{Param, WgslKernel};
use ark_ff::PrimeField;

const CURVE: &str = include_str!("../../../kernels/wgsl/curve.wgsl");
const MSM: &str = include_str!("../../../kernels/wgsl/msm.wgsl");
const CHUNK: &str = include_str!("../../../kernels/wgsl/msm_chunk.wgsl");
const DIGITS: &str = include_str!("../../../kernels/wgsl/msm_digits.wgsl");
const COUNT: &str = include_str!("../../../kernels/wgsl/msm_count.wgsl");
const SCAN: &str = include_str!("../../../kernels/wgsl/msm_scan.wgsl");
const SCATTER: &str = include_str!("../../../kernels/wgsl/msm_scatter.wgsl");
const BUCKETS: &str = include_str!("../../../kernels/wgsl/msm_buckets.wgsl");
const PARTIALS: &str = include_str!("../../../kernels/wgsl/msm_partials.wgsl");
const REDUCE: &str = include_str!("../../../kernels/wgsl/msm_reduce.wgsl");

/// The base field's modulus as little-endian u32 limbs.
fn base_modulus<P: DeviceCurve>() -> Vec<u32>
where
    P::BaseField: PrimeField,
{
    u32_limbs(<P::BaseField as PrimeField>::MODULUS.as_ref(), P::LIMBS)
}

/// No MSM kernel takes CUDA's dynamic shared memory (the scan's array is static).
fn msm_kernel(name: String, source: String, params: Vec<Param>) -> WgslKernel {
    WgslKernel {
        name,
        module: "msm",
        ops: vec!["msm"],
        source: format!("{PRELUDE}\n{MSM}\n{source}"),
        params,
        shared_bytes: 0,
    }
}

/// The bucket sums' two kernels and the reduction over curve `P`.
fn curve_kernels<P: DeviceCurve>() -> Vec<WgslKernel>
where
    P::BaseField: PrimeField,
{
    use Param::{Read, Scalar, Write};
    let field = format!("{}\n{CURVE}", fp_source(&base_modulus::<P>()));
    let name = |kind: &str| format!("{}_msm_{kind}", P::PREFIX);
    vec![
        msm_kernel(
            name("buckets"),
            format!("{field}\n{CHUNK}\n{BUCKETS}"),
            vec![
                Read,
                Read,
                Read,
                Read,
                Scalar(8),
                Scalar(8),
                Scalar(4),
                Write,
                Write,
                Write,
                Write,
            ],
        ),
        msm_kernel(
            name("partials"),
            format!("{field}\n{CHUNK}\n{PARTIALS}"),
            vec![
                Read,
                Read,
                Scalar(8),
                Scalar(4),
                Write,
                Write,
                Write,
                Write,
                Scalar(4),
            ],
        ),
        msm_kernel(
            name("reduce"),
            format!("{field}\n{REDUCE}"),
            vec![Read, Scalar(4), Scalar(4), Scalar(4), Write],
        ),
    ]
}

/// Every MSM kernel, under `kernels/msm.cu`'s names.
pub(super) fn kernels() -> Vec<WgslKernel> {
    use Param::{Read, Scalar, Write};
    let mut out = vec![
        msm_kernel(
            "msm_digits".into(),
            DIGITS.into(),
            vec![Read, Scalar(8), Scalar(4), Scalar(4), Scalar(4), Write],
        ),
        msm_kernel(
            "msm_count".into(),
            COUNT.into(),
            vec![Read, Scalar(8), Scalar(8), Scalar(4), Write],
        ),
        msm_kernel("msm_scan".into(), SCAN.into(), vec![Read, Write, Scalar(8)]),
        msm_kernel(
            "msm_scatter".into(),
            SCATTER.into(),
            vec![Read, Scalar(8), Scalar(8), Scalar(4), Write, Write],
        ),
    ];
    out.extend(curve_kernels::<ark_bn254::g1::Config>());
    out.extend(curve_kernels::<ark_bls12_381::g1::Config>());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The computed base-field constants are kernels/bn254_fq.cuh's, written there by hand.
    #[test]
    fn the_base_field_constants_are_the_cuda_headers() {
        let p = base_modulus::<ark_bn254::g1::Config>();
        assert_eq!(p[0], 0xd87cfd47);
        assert_eq!(p[7], 0x30644e72);
        let source = fp_source(&p);
        assert!(
            source.contains("0x538afa89u, 0xf32cfc5bu"),
            "R^2 of BN254 Fq"
        );
        assert!(source.contains("const INV: u32 = 0xe4866389u;"));
        assert_eq!(base_modulus::<ark_bls12_381::g1::Config>().len(), 12);
    }
}
