//! The kernels' field arithmetic (kernels/*.cuh), compiled for the host by build.rs,
//! against the CPU twin: the same C the GPU runs, checked bit for bit without a GPU.

use super::samples::{edge_values, random_elements};
use super::{Field, FieldBinaryJob, FieldOp, FieldVec};

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
