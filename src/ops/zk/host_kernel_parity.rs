//! The kernels' field arithmetic (kernels/*.cuh), compiled for the host by build.rs,
//! against the CPU twin: the same C the GPU runs, checked bit for bit without a GPU.

use super::samples::{edge_values, random_elements};
use super::{Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob, FieldVec, U256};

extern "C" {
    fn gpu_ops_host_bn254_fr(
        op: i32,
        a: *const u32,
        b: *const u32,
        out: *mut u32,
        n: usize,
        b_stride: usize,
    );
    fn gpu_ops_host_goldilocks(
        op: i32,
        a: *const u64,
        b: *const u64,
        out: *mut u64,
        n: usize,
        b_stride: usize,
    );
}

fn op_code(op: FieldOp) -> i32 {
    match op {
        FieldOp::Add => 0,
        FieldOp::Sub => 1,
        FieldOp::Mul => 2,
    }
}

fn run_host_kernel(op: FieldOp, a: &FieldVec, b: &FieldVec) -> FieldVec {
    let n = a.len();
    let stride = usize::from(b.len() == n);
    match (a, b) {
        (FieldVec::Goldilocks(x), FieldVec::Goldilocks(y)) => {
            let mut out = vec![0u64; n];
            // SAFETY: out has n elements; b has n or 1 (stride 0) elements.
            unsafe {
                gpu_ops_host_goldilocks(
                    op_code(op),
                    x.as_ptr(),
                    y.as_ptr(),
                    out.as_mut_ptr(),
                    n,
                    stride,
                )
            };
            FieldVec::Goldilocks(out)
        }
        (FieldVec::Bn254Fr(x), FieldVec::Bn254Fr(y)) => {
            let mut out = vec![[0u64; 4]; n];
            // SAFETY: [u64; 4] is 8 u32 limbs in little-endian order on a little-endian host.
            unsafe {
                gpu_ops_host_bn254_fr(
                    op_code(op),
                    x.as_ptr().cast(),
                    y.as_ptr().cast(),
                    out.as_mut_ptr().cast(),
                    n,
                    stride,
                )
            };
            FieldVec::Bn254Fr(out)
        }
        _ => unreachable!(),
    }
}

#[test]
fn kernel_arithmetic_matches_cpu_twin_bit_for_bit() {
    const { assert!(cfg!(target_endian = "little")) };
    for field in Field::ALL {
        let edges = edge_values(field);
        let mut xs: Vec<_> = edges
            .iter()
            .flat_map(|x| edges.iter().map(move |_| *x))
            .collect();
        let mut ys: Vec<_> = edges.iter().flat_map(|_| edges.iter().copied()).collect();
        xs.extend(random_elements(field, 5000, 1));
        ys.extend(random_elements(field, 5000, 2));
        let a = FieldVec::from_integers(field, &xs).unwrap();
        let b = FieldVec::from_integers(field, &ys).unwrap();
        let b1 = FieldVec::from_integers(field, &ys[ys.len() - 1..]).unwrap();
        for op in FieldOp::ALL {
            for b in [&b, &b1] {
                let cpu = FieldBinaryJob::new(op, a.clone(), b.clone())
                    .unwrap()
                    .run_cpu();
                let host = run_host_kernel(op, &a, b);
                assert_eq!(
                    cpu,
                    host,
                    "{op:?} on {field:?} (broadcast: {})",
                    b.len() == 1
                );
            }
        }
    }
}

extern "C" {
    fn gpu_ops_host_bn254_fr_pow(
        base: *const u32,
        exp: *const u32,
        out: *mut u32,
        n: usize,
        e_stride: usize,
    );
    fn gpu_ops_host_goldilocks_pow(
        base: *const u64,
        exp: *const u64,
        out: *mut u64,
        n: usize,
        e_stride: usize,
    );
    fn gpu_ops_host_bn254_fr_inv(input: *const u32, out: *mut u32, n: usize, chunk: usize);
    fn gpu_ops_host_goldilocks_inv(input: *const u64, out: *mut u64, n: usize, chunk: usize);
}

/// Exponents: edge cases (0, 1, 2, p-1, p, 2^256-1) then arbitrary 256-bit values.
fn exponents(field: Field, n: usize) -> Vec<U256> {
    let p = field.modulus();
    let mut p_minus_1 = p;
    p_minus_1.0[0] -= 1;
    let mut e = vec![
        U256::ZERO,
        U256::from_u64(1),
        U256::from_u64(2),
        p_minus_1,
        p,
        U256([u64::MAX; 4]),
    ];
    let mut s = 0x1234_5678_9abc_def1u64;
    while e.len() < n {
        e.push(U256(std::array::from_fn(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        })));
    }
    e
}

#[test]
fn kernel_pow_and_batch_inversion_match_cpu_twin_bit_for_bit() {
    for field in Field::ALL {
        let mut xs = edge_values(field);
        xs.extend(random_elements(field, 300, 3));
        let n = xs.len();
        let base = FieldVec::from_integers(field, &xs).unwrap();
        let exps = exponents(field, n);
        let e_words: Vec<u64> = exps.iter().flat_map(|e| e.0).collect();
        for broadcast in [false, true] {
            let job = FieldPowJob::new(
                base.clone(),
                if broadcast {
                    exps[n - 1..].to_vec()
                } else {
                    exps.clone()
                },
            )
            .unwrap();
            let ew = if broadcast {
                &e_words[4 * (n - 1)..]
            } else {
                &e_words[..]
            };
            let stride = usize::from(!broadcast);
            let host = match &base {
                FieldVec::Bn254Fr(b) => {
                    let mut out = vec![[0u64; 4]; n];
                    // SAFETY: n elements of 8 u32 limbs each; exponents n (or 1) of 8 limbs.
                    unsafe {
                        gpu_ops_host_bn254_fr_pow(
                            b.as_ptr().cast(),
                            ew.as_ptr().cast(),
                            out.as_mut_ptr().cast(),
                            n,
                            stride,
                        )
                    };
                    FieldVec::Bn254Fr(out)
                }
                FieldVec::Goldilocks(b) => {
                    let mut out = vec![0u64; n];
                    // SAFETY: n elements; exponents n (or 1) of 4 words.
                    unsafe {
                        gpu_ops_host_goldilocks_pow(
                            b.as_ptr(),
                            ew.as_ptr(),
                            out.as_mut_ptr(),
                            n,
                            stride,
                        )
                    };
                    FieldVec::Goldilocks(out)
                }
            };
            assert_eq!(
                job.run_cpu(),
                host,
                "pow on {field:?} (broadcast: {broadcast})"
            );
        }
        let nonzero: Vec<U256> = xs.into_iter().filter(|x| *x != U256::ZERO).collect();
        let v = FieldVec::from_integers(field, &nonzero).unwrap();
        let cpu = FieldInvJob::new(v.clone()).unwrap().run_cpu();
        for chunk in [1usize, 7, 64, 100_000] {
            let m = nonzero.len();
            let host = match &v {
                FieldVec::Bn254Fr(x) => {
                    let mut out = vec![[0u64; 4]; m];
                    // SAFETY: m elements of 8 u32 limbs in and out.
                    unsafe {
                        gpu_ops_host_bn254_fr_inv(
                            x.as_ptr().cast(),
                            out.as_mut_ptr().cast(),
                            m,
                            chunk,
                        )
                    };
                    FieldVec::Bn254Fr(out)
                }
                FieldVec::Goldilocks(x) => {
                    let mut out = vec![0u64; m];
                    // SAFETY: m elements in and out.
                    unsafe { gpu_ops_host_goldilocks_inv(x.as_ptr(), out.as_mut_ptr(), m, chunk) };
                    FieldVec::Goldilocks(out)
                }
            };
            assert_eq!(cpu, host, "inv on {field:?}, chunk {chunk}");
        }
    }
}
