//! The kernels' field arithmetic (kernels/*.cuh), compiled for the host by build.rs,
//! against the CPU twin: the same C the GPU runs, checked bit for bit without a GPU.

use super::samples::{edge_values, random_elements};
use super::{Field, FieldBinaryJob, FieldInvJob, FieldOp, FieldPowJob, FieldVec, U256};
use std::ffi::c_void;

extern "C" {
    fn gpu_ops_host_field_binary(
        field: i32,
        op: i32,
        a: *const c_void,
        b: *const c_void,
        out: *mut c_void,
        n: usize,
        b_stride: usize,
    );
    fn gpu_ops_host_field_pow(
        field: i32,
        base: *const c_void,
        exp: *const c_void,
        out: *mut c_void,
        n: usize,
        e_stride: usize,
    );
    fn gpu_ops_host_field_inv(
        field: i32,
        input: *const c_void,
        out: *mut c_void,
        n: usize,
        chunk: usize,
    );
    fn gpu_ops_host_ntt(
        field: i32,
        x: *mut c_void,
        tw: *const c_void,
        n: u64,
        total: u64,
        log_tile: u32,
    ) -> i32;
}

/// The C side's field numbering (kernels/host/field_host.cpp).
fn field_code(f: Field) -> i32 {
    match f {
        Field::Bn254Fr => 0,
        Field::Bls12_381Fr => 1,
        Field::Goldilocks => 2,
        Field::BabyBear => 3,
    }
}

fn op_code(op: FieldOp) -> i32 {
    match op {
        FieldOp::Add => 0,
        FieldOp::Sub => 1,
        FieldOp::Mul => 2,
    }
}

/// A zeroed vector of `n` elements of `field`, and a pointer to its storage.
fn zeros(field: Field, n: usize) -> FieldVec {
    match field {
        Field::Bn254Fr => FieldVec::Bn254Fr(vec![[0; 4]; n]),
        Field::Bls12_381Fr => FieldVec::Bls12_381Fr(vec![[0; 4]; n]),
        Field::Goldilocks => FieldVec::Goldilocks(vec![0; n]),
        Field::BabyBear => FieldVec::BabyBear(vec![0; n]),
    }
}

/// Element storage as the C code reads it: 8 u32 limbs, a u64 or a u32 per element, in
/// little-endian order (this test only builds on little-endian hosts).
fn ptr(v: &FieldVec) -> *const c_void {
    match v {
        FieldVec::Bn254Fr(x) | FieldVec::Bls12_381Fr(x) => x.as_ptr().cast(),
        FieldVec::Goldilocks(x) => x.as_ptr().cast(),
        FieldVec::BabyBear(x) => x.as_ptr().cast(),
    }
}

fn ptr_mut(v: &mut FieldVec) -> *mut c_void {
    match v {
        FieldVec::Bn254Fr(x) | FieldVec::Bls12_381Fr(x) => x.as_mut_ptr().cast(),
        FieldVec::Goldilocks(x) => x.as_mut_ptr().cast(),
        FieldVec::BabyBear(x) => x.as_mut_ptr().cast(),
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
                let mut host = zeros(field, a.len());
                let stride = usize::from(b.len() == a.len());
                // SAFETY: a and out hold a.len() elements; b a.len() or 1 (stride 0).
                unsafe {
                    gpu_ops_host_field_binary(
                        field_code(field),
                        op_code(op),
                        ptr(&a),
                        ptr(b),
                        ptr_mut(&mut host),
                        a.len(),
                        stride,
                    )
                };
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
        for broadcast in [false, true] {
            let e = if broadcast {
                exps[n - 1..].to_vec()
            } else {
                exps.clone()
            };
            // 256-bit exponents as 4 u64 words: also 8 little-endian u32 limbs.
            let words: Vec<u64> = e.iter().flat_map(|x| x.0).collect();
            let job = FieldPowJob::new(base.clone(), e).unwrap();
            let mut host = zeros(field, n);
            // SAFETY: base and out hold n elements; exponents n (or 1) of 32 bytes.
            unsafe {
                gpu_ops_host_field_pow(
                    field_code(field),
                    ptr(&base),
                    words.as_ptr().cast(),
                    ptr_mut(&mut host),
                    n,
                    usize::from(!broadcast),
                )
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
            let mut host = zeros(field, v.len());
            // SAFETY: in and out hold v.len() elements.
            unsafe {
                gpu_ops_host_field_inv(
                    field_code(field),
                    ptr(&v),
                    ptr_mut(&mut host),
                    v.len(),
                    chunk,
                )
            };
            assert_eq!(cpu, host, "inv on {field:?}, chunk {chunk}");
        }
    }
}

/// The NTT kernels' index maps and butterflies (tile stages, then wide stages) with the
/// twiddles the launcher uploads, against the CPU twin's forward NTT; tiles from the
/// launcher's plan and smaller ones, so both stage kinds and their hand-over run.
#[test]
fn ntt_kernel_stages_match_cpu_twin() {
    use super::gpu::tile_plan;
    use super::ntt::{kernel_tables, Direction, NttJob, Order};
    for field in Field::ALL {
        for (log_n, batch) in [(1u32, 3usize), (3, 2), (10, 2), (13, 1), (14, 1)] {
            let n = 1usize << log_n;
            let values =
                FieldVec::from_integers(field, &random_elements(field, n * batch, 3)).unwrap();
            let job = NttJob::new(
                Direction::Forward,
                values.clone(),
                batch,
                Order::Natural,
                Order::Natural,
                None,
                30,
            )
            .unwrap();
            let want = job.run_cpu();
            let element_bytes = values.byte_len() / values.len();
            let (planned, _) = tile_plan(n, element_bytes);
            let (tw, _) = kernel_tables(field, n, Direction::Forward, None);
            for log_tile in [planned, planned.min(2), 1] {
                let mut x = values.clone();
                // SAFETY: x holds n·batch elements, tw n/2 (or none for n = 1); tiles of
                // 2^log_tile ≤ n divide every polynomial.
                let rc = unsafe {
                    gpu_ops_host_ntt(
                        field_code(field),
                        ptr_mut(&mut x),
                        ptr(&tw),
                        n as u64,
                        (n * batch) as u64,
                        log_tile,
                    )
                };
                assert_eq!(rc, 0);
                assert!(
                    x == want,
                    "{field:?} n=2^{log_n} batch={batch} tile=2^{log_tile}"
                );
            }
        }
    }
}
