//! Element-wise binary field ops: the CPU implementation, which is the oracle for the
//! GPU kernels in `kernels/field_ops.cu`.

use super::field::{Field, FieldVec, BABYBEAR_P};
use crate::backend::{Batchable, DeviceError, DeviceLease, Job};
use ark_ff::{BigInt, Fp256, MontBackend, MontConfig};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FieldOp {
    Add,
    Sub,
    Mul,
}

impl FieldOp {
    pub const ALL: [FieldOp; 3] = [FieldOp::Add, FieldOp::Sub, FieldOp::Mul];

    /// The op's name in routes, metrics and kernel names.
    pub fn name(self) -> &'static str {
        match self {
            FieldOp::Add => "field_add",
            FieldOp::Sub => "field_sub",
            FieldOp::Mul => "field_mul",
        }
    }

    pub(crate) fn kernel_suffix(self) -> &'static str {
        match self {
            FieldOp::Add => "add",
            FieldOp::Sub => "sub",
            FieldOp::Mul => "mul",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LengthMismatch {
    #[error("a is empty: give at least one element")]
    Empty,
    #[error("a has {a} elements and b has {b}: b must have as many, or exactly one to broadcast")]
    Lengths { a: usize, b: usize },
    #[error("a is a {a} vector and b a {b} vector")]
    Fields { a: &'static str, b: &'static str },
}

/// `a (op) b` element-wise, `b` either as long as `a` or a single broadcast element.
#[derive(Clone, Debug)]
pub struct FieldBinaryJob {
    op: FieldOp,
    a: FieldVec,
    b: FieldVec,
}

/// Below this many elements a job runs on one thread: splitting costs more than it saves.
const PAR_MIN_LEN: usize = 4096;

/// Up to this many elements an op runs inline (`Job::runs_inline`): a 256-bit product is
/// about 30 ns, so at most some 30 µs, and far under `PAR_MIN_LEN`, so one plain loop.
const INLINE_MAX_LEN: usize = 1024;

impl LengthMismatch {
    /// `a (op) b`'s operands, each (field, length): one field, `a` not empty, `b` as long
    /// as `a` or one element.
    pub(crate) fn check(a: (Field, usize), b: (Field, usize)) -> Result<(), Self> {
        if a.0 != b.0 {
            return Err(LengthMismatch::Fields {
                a: a.0.name(),
                b: b.0.name(),
            });
        }
        if a.1 == 0 {
            return Err(LengthMismatch::Empty);
        }
        if b.1 != a.1 && b.1 != 1 {
            return Err(LengthMismatch::Lengths { a: a.1, b: b.1 });
        }
        Ok(())
    }
}

impl FieldBinaryJob {
    pub fn new(op: FieldOp, a: FieldVec, b: FieldVec) -> Result<Self, LengthMismatch> {
        LengthMismatch::check((a.field(), a.len()), (b.field(), b.len()))?;
        Ok(Self { op, a, b })
    }

    pub fn op(&self) -> FieldOp {
        self.op
    }

    pub fn field(&self) -> Field {
        self.a.field()
    }

    pub fn len(&self) -> usize {
        self.a.len()
    }

    pub fn is_empty(&self) -> bool {
        self.a.is_empty()
    }

    pub fn inputs(&self) -> (&FieldVec, &FieldVec) {
        (&self.a, &self.b)
    }

    pub fn is_broadcast(&self) -> bool {
        self.b.len() != self.a.len()
    }

    pub fn input_bytes(&self) -> usize {
        self.a.byte_len() + self.b.byte_len()
    }

    /// One job computing all of `jobs` (same op and field) back to back, broadcast
    /// operands expanded; split its output with `FieldVec::split` by the jobs' lengths.
    pub fn concat(jobs: &[&FieldBinaryJob]) -> FieldBinaryJob {
        let a: Vec<FieldVec> = jobs.iter().map(|j| j.a.clone()).collect();
        let b: Vec<FieldVec> = jobs.iter().map(|j| j.b.expanded(j.len())).collect();
        FieldBinaryJob {
            op: jobs[0].op,
            a: FieldVec::concat(&a[0], &a[1..]),
            b: FieldVec::concat(&b[0], &b[1..]),
        }
    }

    /// Runs on the current rayon pool.
    pub fn run_cpu(&self) -> FieldVec {
        match (&self.a, &self.b) {
            (FieldVec::Goldilocks(a), FieldVec::Goldilocks(b)) => FieldVec::Goldilocks(by_op(
                self.op,
                a,
                b,
                goldilocks::add,
                goldilocks::sub,
                goldilocks::mul,
            )),
            (FieldVec::Bn254Fr(a), FieldVec::Bn254Fr(b)) => {
                let op = self.op;
                FieldVec::Bn254Fr(zip_broadcast(a, b, |x, y| {
                    fp256_canonical::<ark_bn254::FrConfig>(op, x, y)
                }))
            }
            (FieldVec::Bls12_381Fr(a), FieldVec::Bls12_381Fr(b)) => {
                let op = self.op;
                FieldVec::Bls12_381Fr(zip_broadcast(a, b, |x, y| {
                    fp256_canonical::<ark_bls12_381::FrConfig>(op, x, y)
                }))
            }
            (FieldVec::BabyBear(a), FieldVec::BabyBear(b)) => FieldVec::BabyBear(by_op(
                self.op,
                a,
                b,
                babybear::add,
                babybear::sub,
                babybear::mul,
            )),
            _ => unreachable!("FieldBinaryJob::new refuses mixed fields"),
        }
    }
}

fn zip_broadcast<T: Sync, R: Send>(a: &[T], b: &[T], f: impl Fn(&T, &T) -> R + Sync) -> Vec<R> {
    let y = (b.len() == 1).then(|| &b[0]);
    if a.len() < PAR_MIN_LEN {
        // One piece either way: a plain loop, which also keeps a job run inline off every
        // rayon pool (a parallel iterator outside one would start rayon's global pool).
        return match y {
            Some(y) => a.iter().map(|x| f(x, y)).collect(),
            None => a.iter().zip(b).map(|(x, y)| f(x, y)).collect(),
        };
    }
    match y {
        Some(y) => a
            .par_iter()
            .with_min_len(PAR_MIN_LEN)
            .map(|x| f(x, y))
            .collect(),
        None => a
            .par_iter()
            .with_min_len(PAR_MIN_LEN)
            .zip(b.par_iter())
            .map(|(x, y)| f(x, y))
            .collect(),
    }
}

/// An arkworks 256-bit prime field (BN254 Fr, BLS12-381 Fr).
pub(crate) type Fp<C> = Fp256<MontBackend<C, 4>>;

/// One op on canonical limbs with one Montgomery product at most. Modular add and sub
/// do not depend on the representation, so canonical words go straight in. For mul,
/// `Fp::new(x)` holds xR and `new_unchecked(y)` is read as the Montgomery form of yR^-1;
/// their product's internal word is xR * y * R^-1 = xy, already canonical.
fn fp256_canonical<C: MontConfig<4>>(op: FieldOp, x: &[u64; 4], y: &[u64; 4]) -> [u64; 4] {
    let word = |v: &[u64; 4]| Fp::<C>::new_unchecked(BigInt(*v));
    let r = match op {
        FieldOp::Add => word(x) + word(y),
        FieldOp::Sub => word(x) - word(y),
        FieldOp::Mul => Fp::<C>::new(BigInt(*x)) * word(y),
    };
    r.0 .0
}

/// `zip_broadcast` with the op's function chosen once, outside the loop. The functions
/// come in as their own types (not pointers), so each loop is compiled with its
/// arithmetic inlined.
fn by_op<T: Copy + Send + Sync>(
    op: FieldOp,
    a: &[T],
    b: &[T],
    add: impl Fn(T, T) -> T + Sync,
    sub: impl Fn(T, T) -> T + Sync,
    mul: impl Fn(T, T) -> T + Sync,
) -> Vec<T> {
    match op {
        FieldOp::Add => zip_broadcast(a, b, |x, y| add(*x, *y)),
        FieldOp::Sub => zip_broadcast(a, b, |x, y| sub(*x, *y)),
        FieldOp::Mul => zip_broadcast(a, b, |x, y| mul(*x, *y)),
    }
}

/// BabyBear arithmetic on canonical u32, through u64.
pub(crate) mod babybear {
    use super::BABYBEAR_P as P;

    // p < 2^31, so a + b and a + p − b fit in u32: one compare instead of a remainder.
    pub fn add(a: u32, b: u32) -> u32 {
        let s = a + b;
        if s >= P {
            s - P
        } else {
            s
        }
    }

    pub fn sub(a: u32, b: u32) -> u32 {
        if a >= b {
            a - b
        } else {
            a + P - b
        }
    }

    pub fn mul(a: u32, b: u32) -> u32 {
        ((u64::from(a) * u64::from(b)) % u64::from(P)) as u32
    }

    #[test]
    fn edges_equal_u64_remainders() {
        let edges = [0, 1, 2, 1 << 27, (1 << 30) + 7, P - 2, P - 1];
        for a in edges {
            for b in edges {
                let (x, y, p) = (u64::from(a), u64::from(b), u64::from(P));
                assert_eq!(u64::from(add(a, b)), (x + y) % p, "{a} + {b}");
                assert_eq!(u64::from(sub(a, b)), (x + p - y) % p, "{a} - {b}");
            }
        }
    }
}

/// Goldilocks arithmetic on canonical u64, on Plonky3's field (its reduction by
/// 2^64 = 2^32 − 1 mod p, where a u128 `%` is a library call): written independently of
/// the kernel's reduction, so the two check each other.
pub(crate) mod goldilocks {
    use p3_field::PrimeField64;
    use p3_goldilocks::Goldilocks;

    fn apply(a: u64, b: u64, op: impl Fn(Goldilocks, Goldilocks) -> Goldilocks) -> u64 {
        op(Goldilocks::new(a), Goldilocks::new(b)).as_canonical_u64()
    }

    pub fn add(a: u64, b: u64) -> u64 {
        apply(a, b, |x, y| x + y)
    }

    pub fn sub(a: u64, b: u64) -> u64 {
        apply(a, b, |x, y| x - y)
    }

    pub fn mul(a: u64, b: u64) -> u64 {
        apply(a, b, |x, y| x * y)
    }

    #[cfg(test)]
    mod tests {
        use crate::ops::zk::field::GOLDILOCKS_P as P;
        use proptest::prelude::*;

        fn reference(a: u64, b: u64) -> [u64; 3] {
            let (a, b, p) = (u128::from(a), u128::from(b), u128::from(P));
            [(a + b) % p, (a + p - b) % p, (a * b) % p].map(|x| x as u64)
        }

        proptest! {
            #[test]
            fn plonky3_arithmetic_equals_u128_remainders(a in 0..P, b in 0..P) {
                prop_assert_eq!([super::add(a, b), super::sub(a, b), super::mul(a, b)], reference(a, b));
            }
        }

        #[test]
        fn edges_equal_u128_remainders() {
            let edges = [0, 1, 2, (1 << 32) - 1, 1 << 32, P - (1 << 32), P - 2, P - 1];
            for a in edges {
                for b in edges {
                    assert_eq!(
                        [super::add(a, b), super::sub(a, b), super::mul(a, b)],
                        reference(a, b),
                        "{a} {b}"
                    );
                }
            }
        }
    }
}

/// Placement's prior for `op` over `field`. Provisional until measured on a GPU host
/// (docs/PERFORMANCE.md): a 256-bit multiplication pays for a launch sooner than an
/// addition or a small field does.
pub(crate) fn binary_threshold(field: Field, op: FieldOp) -> usize {
    match (field, op) {
        (Field::Bn254Fr | Field::Bls12_381Fr, FieldOp::Mul) => 1 << 12,
        (Field::Bn254Fr | Field::Bls12_381Fr, _) => 1 << 15,
        (Field::Goldilocks | Field::BabyBear, _) => 1 << 17,
    }
}

impl Job for FieldBinaryJob {
    type Output = FieldVec;

    fn name(&self) -> &'static str {
        self.op.name()
    }

    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        self.field().name().into()
    }

    fn size(&self) -> usize {
        self.len()
    }

    fn input_bytes(&self) -> usize {
        FieldBinaryJob::input_bytes(self)
    }

    fn gpu_threshold(&self) -> usize {
        binary_threshold(self.field(), self.op)
    }

    fn runs_inline(&self) -> bool {
        self.len() <= INLINE_MAX_LEN
    }

    fn run_cpu(&self) -> FieldVec {
        FieldBinaryJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<FieldVec, DeviceError> {
        super::gpu::launch_field_binary(self, dev)
    }

    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        crate::backend::verify::exactly(device, cpu)
    }
}

impl Batchable for FieldBinaryJob {
    type Lane = (Field, FieldOp);

    fn lane(&self) -> Self::Lane {
        (self.field(), self.op)
    }

    fn concat(jobs: Vec<Self>) -> Self {
        FieldBinaryJob::concat(&jobs.iter().collect::<Vec<_>>())
    }

    fn split(output: FieldVec, sizes: &[usize]) -> Vec<FieldVec> {
        output.split(sizes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::zk::samples::edge_values;
    use crate::ops::zk::U256;
    use num_bigint::BigUint;
    use proptest::prelude::*;

    fn big(v: U256) -> BigUint {
        BigUint::from_slice(
            &v.0.iter()
                .flat_map(|l| [*l as u32, (*l >> 32) as u32])
                .collect::<Vec<_>>(),
        )
    }

    fn oracle(op: FieldOp, field: Field, x: U256, y: U256) -> BigUint {
        let p = big(field.modulus());
        let (x, y) = (big(x), big(y));
        match op {
            FieldOp::Add => (x + y) % &p,
            FieldOp::Sub => (x + &p - y) % &p,
            FieldOp::Mul => (x * y) % &p,
        }
    }

    /// A canonical element from random limbs: reduce by the independent bigint.
    fn element(field: Field, limbs: [u64; 4]) -> U256 {
        let r = big(U256(limbs)) % big(field.modulus());
        let mut out = [0u64; 4];
        for (i, d) in r.to_u64_digits().into_iter().enumerate() {
            out[i] = d;
        }
        U256(out)
    }

    fn check(op: FieldOp, field: Field, xs: &[U256], ys: &[U256]) {
        let a = FieldVec::from_integers(field, xs).unwrap();
        let b = FieldVec::from_integers(field, ys).unwrap();
        let out = FieldBinaryJob::new(op, a, b).unwrap().run_cpu();
        for i in 0..xs.len() {
            let y = if ys.len() == 1 { ys[0] } else { ys[i] };
            assert_eq!(
                big(out.get(i)),
                oracle(op, field, xs[i], y),
                "{op:?} {field:?} at {i}"
            );
        }
    }

    proptest! {
        #[test]
        fn every_op_matches_an_independent_bigint_oracle(
            pairs in prop::collection::vec((any::<[u64; 4]>(), any::<[u64; 4]>()), 1..64),
        ) {
            for field in Field::ALL {
                let xs: Vec<U256> = pairs.iter().map(|p| element(field, p.0)).collect();
                let ys: Vec<U256> = pairs.iter().map(|p| element(field, p.1)).collect();
                for op in FieldOp::ALL {
                    check(op, field, &xs, &ys);
                    check(op, field, &xs, &ys[..1]);
                }
            }
        }
    }

    #[test]
    fn edge_values_in_every_combination() {
        for field in Field::ALL {
            let e = edge_values(field);
            let xs: Vec<U256> = e.iter().flat_map(|x| e.iter().map(move |_| *x)).collect();
            let ys: Vec<U256> = e.iter().flat_map(|_| e.iter().copied()).collect();
            for op in FieldOp::ALL {
                check(op, field, &xs, &ys);
            }
        }
    }

    #[test]
    fn large_inputs_split_across_threads_give_the_same_answer() {
        let xs: Vec<U256> = (0..3 * PAR_MIN_LEN as u64)
            .map(|i| U256::from_u64(i * 7919))
            .collect();
        let ys: Vec<U256> = (0..3 * PAR_MIN_LEN as u64)
            .map(|i| U256::from_u64(i ^ 0xdead_beef))
            .collect();
        check(FieldOp::Mul, Field::Goldilocks, &xs, &ys);
        check(FieldOp::Sub, Field::Bn254Fr, &xs, &ys);
    }

    #[test]
    fn refuses_mismatched_lengths_empty_and_mixed_fields() {
        let g = |n: u64| {
            FieldVec::from_integers(Field::Goldilocks, &vec![U256::from_u64(1); n as usize])
                .unwrap()
        };
        assert_eq!(
            FieldBinaryJob::new(FieldOp::Add, g(3), g(2)).unwrap_err(),
            LengthMismatch::Lengths { a: 3, b: 2 }
        );
        assert_eq!(
            FieldBinaryJob::new(FieldOp::Add, g(0), g(0)).unwrap_err(),
            LengthMismatch::Empty
        );
        let bn = FieldVec::from_integers(Field::Bn254Fr, &[U256::ZERO]).unwrap();
        assert!(FieldBinaryJob::new(FieldOp::Add, g(1), bn).is_err());
        assert!(FieldBinaryJob::new(FieldOp::Add, g(3), g(1))
            .unwrap()
            .is_broadcast());
    }
}
