//! The zk domain's WGSL kernels (`kernels/wgsl/`) for the wgpu engine: add, sub, mul,
//! pow, inv and the NTT's four kernels over the four fields here, the MSM's in
//! `wgsl_msm.rs`, under the CUDA kernels' names and with their arguments, so the
//! launchers run them unchanged. Each kernel is one module: the shared prelude, the
//! field's arithmetic (its constants computed here from the modulus), and the op's
//! entry point.

use super::{Field, FieldOp};
use crate::backend::wgpu::{Param, WgslKernel};

pub(super) const PRELUDE: &str = include_str!("../../../kernels/wgsl/prelude.wgsl");
const FP: &str = include_str!("../../../kernels/wgsl/fp.wgsl");
const GOLDILOCKS: &str = include_str!("../../../kernels/wgsl/goldilocks.wgsl");
const BINARY: &str = include_str!("../../../kernels/wgsl/field_binary.wgsl");
const POW: &str = include_str!("../../../kernels/wgsl/field_pow.wgsl");
const INV: &str = include_str!("../../../kernels/wgsl/field_inv.wgsl");
const NTT: &str = include_str!("../../../kernels/wgsl/ntt.wgsl");
const NTT_SCALE: &str = include_str!("../../../kernels/wgsl/ntt_scale.wgsl");
const NTT_BITREV: &str = include_str!("../../../kernels/wgsl/ntt_bitrev.wgsl");
const NTT_STAGE: &str = include_str!("../../../kernels/wgsl/ntt_stage.wgsl");
const NTT_TILE: &str = include_str!("../../../kernels/wgsl/ntt_tile.wgsl");
/// `ntt_tile.wgsl`'s workgroup array: 16 KiB, the workgroup memory every WebGPU
/// adapter has.
const NTT_TILE_BYTES: u32 = 16 << 10;

/// The ops these kernels serve whole: every device op of the domain.
pub fn ops() -> Vec<&'static str> {
    super::DOMAIN.device_ops.to_vec()
}

/// The modulus as little-endian u32 limbs, as many as the field's elements have.
fn limbs(field: Field) -> Vec<u32> {
    u32_limbs(&field.modulus().0, field.byte_width() / 4)
}

/// The low `n` u32 limbs of a little-endian u64 integer (a modulus here).
pub(super) fn u32_limbs(words: &[u64], n: usize) -> Vec<u32> {
    let all: Vec<u32> = words
        .iter()
        .flat_map(|w| [*w as u32, (*w >> 32) as u32])
        .collect();
    all[..n].to_vec()
}

/// R^2 mod p for R = 2^(32N): 1 doubled 64N times, reduced each time (p < 2^(32N-1),
/// so a doubled value below p fits N limbs).
fn r_squared(p: &[u32]) -> Vec<u32> {
    let mut x = vec![0u32; p.len()];
    x[0] = 1;
    for _ in 0..64 * p.len() {
        let mut carry = 0u32;
        for limb in x.iter_mut() {
            let next = *limb >> 31;
            *limb = (*limb << 1) | carry;
            carry = next;
        }
        if !less(&x, p) {
            subtract(&mut x, p);
        }
    }
    x
}

/// x -= y, limb by limb (y no longer than x, x ≥ y).
fn subtract(x: &mut [u32], y: &[u32]) {
    let mut borrow = 0u64;
    for (i, limb) in x.iter_mut().enumerate() {
        let q = u64::from(y.get(i).copied().unwrap_or(0));
        let d = u64::from(*limb).wrapping_sub(q + borrow);
        *limb = d as u32;
        borrow = (d >> 63) & 1;
    }
}

fn less(a: &[u32], b: &[u32]) -> bool {
    a.iter().rev().cmp(b.iter().rev()) == std::cmp::Ordering::Less
}

/// -p^-1 mod 2^32, by Newton's iteration (p odd).
fn mont_inv(p0: u32) -> u32 {
    let mut inv = 1u32;
    for _ in 0..5 {
        inv = inv.wrapping_mul(2u32.wrapping_sub(p0.wrapping_mul(inv)));
    }
    inv.wrapping_neg()
}

fn list(words: &[u32]) -> String {
    words
        .iter()
        .map(|w| format!("0x{w:08x}u"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The field's arithmetic: `fe_add`, `fe_sub`, `fe_mul`, `fe_pow` and `P_MINUS_2` over
/// `Fe`, an element of `N` words.
fn field_source(field: Field) -> String {
    if field == Field::Goldilocks {
        return GOLDILOCKS.to_string();
    }
    fp_source(&limbs(field))
}

/// `fp.wgsl` for the prime `p` (little-endian u32 limbs, p < 2^(32N - 1)): the scalar
/// fields' and the curves' base fields.
pub(super) fn fp_source(p: &[u32]) -> String {
    let n = p.len();
    let exp_limbs = n.max(8);
    let mut p_minus_2 = p.to_vec();
    subtract(&mut p_minus_2, &[2]);
    p_minus_2.resize(exp_limbs, 0);
    FP.replace("{{N_PLUS_2}}", &(n + 2).to_string())
        .replace("{{EXP_LIMBS}}", &exp_limbs.to_string())
        .replace("{{N}}", &n.to_string())
        .replace("{{P}}", &list(p))
        .replace("{{R2}}", &list(&r_squared(p)))
        .replace("{{P_MINUS_2}}", &list(&p_minus_2))
        .replace("{{INV}}", &format!("0x{:08x}", mont_inv(p[0])))
}

/// A kernel over `field` that `op`'s device path launches.
fn kernel(
    name: String,
    op: &'static str,
    field: Field,
    entry: String,
    params: Vec<Param>,
) -> WgslKernel {
    WgslKernel {
        name,
        module: "field_ops",
        ops: vec![op],
        source: format!("{PRELUDE}\n{}\n{entry}", field_source(field)),
        params,
        shared_bytes: 0,
    }
}

/// The NTT's four kernels over `field`, under `kernels/ntt.cu`'s names. Its tables hold
/// the 256-bit fields' twiddles and scale factors in Montgomery form, the word fields'
/// canonical (`ntt::kernel_tables`).
fn ntt_kernels(field: Field) -> Vec<WgslKernel> {
    use Param::{Read, Scalar, Write};
    let table_mul = match field {
        Field::Bn254Fr | Field::Bls12_381Fr => "fe_mont",
        Field::Goldilocks | Field::BabyBear => "fe_mul",
    };
    let kernels = [
        (
            "scale",
            NTT_SCALE,
            vec![Write, Read, Scalar(8), Scalar(8)],
            0,
        ),
        (
            "bitrev",
            NTT_BITREV,
            vec![Write, Scalar(8), Scalar(4), Scalar(8)],
            0,
        ),
        (
            "stage",
            NTT_STAGE,
            vec![Write, Read, Scalar(8), Scalar(8), Scalar(8)],
            0,
        ),
        (
            "tile",
            NTT_TILE,
            vec![Write, Read, Scalar(8), Scalar(4), Scalar(8)],
            NTT_TILE_BYTES,
        ),
    ];
    kernels
        .into_iter()
        .map(|(kind, entry, params, shared_bytes)| {
            let source = format!("{NTT}\n{entry}").replace("{{TABLE_MUL}}", table_mul);
            WgslKernel {
                module: "ntt",
                ops: vec!["ntt", "intt"],
                shared_bytes,
                ..kernel(
                    format!("{}_ntt_{kind}", field.name()),
                    "ntt",
                    field,
                    source,
                    params,
                )
            }
        })
        .collect()
}

/// Every kernel of the domain, under `kernels/field_ops.cu`'s, `ntt.cu`'s and `msm.cu`'s
/// names.
pub fn kernels() -> Vec<WgslKernel> {
    use Param::{Read, Scalar, Write};
    let pair = || vec![Read, Read, Write, Scalar(8), Scalar(4)];
    let mut out = Vec::new();
    for field in Field::ALL {
        for op in FieldOp::ALL {
            let entry = BINARY.replace("{{OP}}", &format!("fe_{}", op.kernel_suffix()));
            out.push(kernel(
                super::gpu::kernel_name(field, op),
                op.name(),
                field,
                entry,
                pair(),
            ));
        }
        let name = |op: &str| format!("{}_{op}", field.name());
        out.push(kernel(name("pow"), "field_pow", field, POW.into(), pair()));
        let inv = vec![Read, Write, Scalar(8), Scalar(8)];
        out.push(kernel(name("inv"), "field_inv", field, INV.into(), inv));
        out.extend(ntt_kernels(field));
    }
    out.extend(super::wgsl_msm::kernels());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants match kernels/bn254_fr.cuh's, written there by hand.
    #[test]
    fn the_computed_constants_are_the_cuda_headers() {
        let p = limbs(Field::Bn254Fr);
        assert_eq!(
            r_squared(&p),
            [
                0xae216da7, 0x1bb8e645, 0xe35c59e3, 0x53fe3ab1, 0x53bb8085, 0x8c49833d, 0x7f4e44a5,
                0x0216d0b1
            ]
        );
        assert_eq!(mont_inv(p[0]), 0xefffffff);
        // BabyBear: R = 2^32, R^2 mod p by u128 arithmetic.
        let bb = limbs(Field::BabyBear);
        assert_eq!(bb.len(), 1);
        let r2 = ((1u128 << 64) % u128::from(bb[0])) as u32;
        assert_eq!(r_squared(&bb), [r2]);
        assert_eq!(bb[0].wrapping_mul(mont_inv(bb[0])), u32::MAX); // p * -p^-1 = -1
    }

    /// Every kernel but the MSM's precomputed multiples: the wgpu engine builds none
    /// (`msm_gpu::multiples` asks `has_kernel`, and llvmpipe, which bounds its loops,
    /// could not run 250 doublings and an inversion in one thread), so its MSMs over
    /// resident points run on the plain plan.
    #[test]
    fn every_cuda_kernel_has_one_under_its_name() {
        let names: Vec<String> = kernels().into_iter().map(|k| k.name).collect();
        let cuda: Vec<String> = super::super::kernel_modules()
            .into_iter()
            .flat_map(|m| m.entry_points)
            .filter(|n| !n.ends_with("_msm_multiples"))
            .collect();
        assert_eq!(names.len(), cuda.len());
        for n in cuda {
            assert!(names.contains(&n), "{n}");
        }
        for k in kernels() {
            assert!(!k.source.contains("{{"), "{}: a placeholder left", k.name);
        }
    }
}
