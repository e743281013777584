//! Number-theoretic transforms over the four fields: the CPU twin of the `*_ntt_*`
//! kernels. ω_n = g^((p−1)/n) for the field's standard multiplicative generator g (the
//! root arkworks' radix-2 domains and Plonky3's two-adic generators are), so the twin runs
//! on those libraries (`library`) and agrees with them bit for bit. `Plan` builds the
//! kernels' tables and, in tests, is the radix-2 reference the libraries are held to.

use super::field::{Field, FieldVec};
use super::u256::U256;
use super::vector_ops::{babybear, goldilocks, Fp};
use crate::backend::{DeviceError, DeviceLease, Job};
use ark_ff::{BigInt, MontConfig, PrimeField};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

impl Field {
    /// The multiplicative generator ω is derived from (arkworks' / Plonky3's choice).
    pub fn generator(self) -> u64 {
        match self {
            Field::Bn254Fr => 5,
            Field::Bls12_381Fr => 7,
            Field::Goldilocks => 7,
            Field::BabyBear => 31,
        }
    }

    /// The largest k with 2^k dividing p − 1: NTT sizes go up to 2^k.
    pub fn two_adicity(self) -> u32 {
        match self {
            Field::Bn254Fr => 28,
            Field::Bls12_381Fr => 32,
            Field::Goldilocks => 32,
            Field::BabyBear => 27,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Order {
    #[default]
    Natural,
    BitReversed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Inverse,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Forward => "ntt",
            Direction::Inverse => "intt",
        }
    }
}

/// `batch` transforms of equal power-of-two size over consecutive slices of `values`.
#[derive(Clone, Debug)]
pub struct NttJob {
    pub direction: Direction,
    pub values: FieldVec,
    pub batch: usize,
    pub input_order: Order,
    pub output_order: Order,
    /// Evaluate on (or interpolate from) the coset shift·⟨ω⟩; never zero.
    pub coset_shift: Option<U256>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NttShape {
    #[error("batch must be at least 1")]
    ZeroBatch,
    #[error("{len} values do not split into {batch} equal transforms")]
    Uneven { len: usize, batch: usize },
    #[error("the transform size {n} is not a power of two")]
    NotPowerOfTwo { n: usize },
    #[error("the transform size {n} exceeds 2^{max_log2} (the field's two-adicity or the server's limit)")]
    TooLarge { n: usize, max_log2: u32 },
    #[error("coset_shift must not be zero")]
    ZeroShift,
}

impl NttJob {
    /// Checks the shape against the field's two-adicity and `max_log2`.
    pub fn new(
        direction: Direction,
        values: FieldVec,
        batch: usize,
        input_order: Order,
        output_order: Order,
        coset_shift: Option<U256>,
        max_log2: u32,
    ) -> Result<Self, NttShape> {
        let shape = (values.len(), batch, coset_shift.as_ref());
        Self::check_shape(values.field(), shape, max_log2)?;
        Ok(Self {
            direction,
            values,
            batch,
            input_order,
            output_order,
            coset_shift,
        })
    }

    /// `new`'s checks of `len` values of `field` in `batch` transforms with `coset_shift`.
    pub fn check_shape(
        field: Field,
        (len, batch, coset_shift): (usize, usize, Option<&U256>),
        max_log2: u32,
    ) -> Result<(), NttShape> {
        if batch == 0 {
            return Err(NttShape::ZeroBatch);
        }
        if len == 0 || len % batch != 0 {
            return Err(NttShape::Uneven { len, batch });
        }
        let n = len / batch;
        if !n.is_power_of_two() {
            return Err(NttShape::NotPowerOfTwo { n });
        }
        let max_log2 = max_log2.min(field.two_adicity());
        if n.trailing_zeros() > max_log2 {
            return Err(NttShape::TooLarge { n, max_log2 });
        }
        if coset_shift.is_some_and(|s| s.is_zero()) {
            return Err(NttShape::ZeroShift);
        }
        Ok(())
    }

    /// Size of one transform.
    pub fn size(&self) -> usize {
        self.values.len() / self.batch
    }

    /// On Plonky3 or ark-poly (`library`): the same elements as the kernels, faster than
    /// the radix-2 reference below (docs/PERFORMANCE.md).
    pub fn run_cpu(&self) -> FieldVec {
        library::run(self)
    }

    /// The radix-2 transform over this module's own arithmetic (the twin before issue 22):
    /// the independent oracle the library transforms are tested against, and the
    /// baseline `cargo bench --bench ntt` measures them beside.
    pub fn run_reference(&self) -> FieldVec {
        match &self.values {
            FieldVec::Bn254Fr(v) => {
                FieldVec::Bn254Fr(self.run::<Fp<ark_bn254::FrConfig>, _>(v, from_limbs, to_limbs))
            }
            FieldVec::Bls12_381Fr(v) => FieldVec::Bls12_381Fr(
                self.run::<Fp<ark_bls12_381::FrConfig>, _>(v, from_limbs, to_limbs),
            ),
            FieldVec::Goldilocks(v) => {
                FieldVec::Goldilocks(self.run::<Gl, _>(v, |x| Gl(*x), |x| x.0))
            }
            FieldVec::BabyBear(v) => FieldVec::BabyBear(self.run::<Bb, _>(v, |x| Bb(*x), |x| x.0)),
        }
    }

    fn run<T: NttArith, W: Sync + Send>(
        &self,
        v: &[W],
        from: impl Fn(&W) -> T + Sync,
        to: impl Fn(T) -> W + Sync + Send,
    ) -> Vec<W> {
        let field = self.values.field();
        let n = self.size();
        let plan = Plan::<T>::new(field, n, self.direction, self.coset_shift);
        let mut data: Vec<T> = v.par_iter().with_min_len(4096).map(&from).collect();
        data.chunks_mut(n).for_each(|poly| {
            if self.input_order == Order::BitReversed {
                bit_reverse(poly);
            }
            plan.transform(poly);
            if self.output_order == Order::BitReversed {
                bit_reverse(poly);
            }
        });
        data.into_par_iter().with_min_len(4096).map(to).collect()
    }
}

/// What one transform of size n needs: twiddles ω^k (k < n/2, ω inverted for INTT), the
/// coset powers, and n^-1 for INTT.
struct Plan<T> {
    direction: Direction,
    twiddles: Vec<T>,
    shift: Option<T>,
    n_inv: T,
}

impl<T: NttArith> Plan<T> {
    fn new(field: Field, n: usize, direction: Direction, shift: Option<U256>) -> Self {
        let p_minus_1 = sub_small(field.modulus(), 1);
        let p_minus_2 = sub_small(field.modulus(), 2);
        let g = T::from_u64(field.generator());
        let omega = g.pow(&shr(p_minus_1, n.trailing_zeros()));
        let omega = match direction {
            Direction::Forward => omega,
            Direction::Inverse => omega.pow(&p_minus_2),
        };
        let mut twiddles = Vec::with_capacity(n / 2);
        let mut w = T::one();
        for _ in 0..n / 2 {
            twiddles.push(w);
            w = w.mul(omega);
        }
        let shift = shift.map(|s| {
            let s = T::from_u256(&s);
            match direction {
                Direction::Forward => s,
                Direction::Inverse => s.pow(&p_minus_2),
            }
        });
        let n_inv = T::from_u64(n as u64).pow(&p_minus_2);
        Self {
            direction,
            twiddles,
            shift,
            n_inv,
        }
    }

    /// Natural order in, natural order out.
    fn transform(&self, a: &mut [T]) {
        let n = a.len();
        if self.direction == Direction::Forward {
            self.scale_by_shift_powers(a);
        }
        bit_reverse(a);
        let mut len = 2;
        while len <= n {
            let step = n / len;
            let half = len / 2;
            let butterflies = |chunk: &mut [T]| {
                let (lo, hi) = chunk.split_at_mut(half);
                for (j, (u, v)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                    let t = v.mul(self.twiddles[j * step]);
                    let x = *u;
                    *u = x.add(t);
                    *v = x.sub(t);
                }
            };
            if n >= 1 << 14 {
                a.par_chunks_mut(len).for_each(butterflies);
            } else {
                a.chunks_mut(len).for_each(butterflies);
            }
            len *= 2;
        }
        if self.direction == Direction::Inverse {
            a.iter_mut().for_each(|x| *x = x.mul(self.n_inv));
            self.scale_by_shift_powers(a);
        }
    }

    /// a[j] *= s^j (s already inverted for INTT).
    fn scale_by_shift_powers(&self, a: &mut [T]) {
        if let Some(s) = self.shift {
            let mut p = T::one();
            for x in a.iter_mut() {
                *x = x.mul(p);
                p = p.mul(s);
            }
        }
    }
}

pub fn bit_reverse<T>(a: &mut [T]) {
    let n = a.len();
    if n <= 2 {
        return;
    }
    let bits = n.trailing_zeros();
    for i in 0..n {
        let j = reversed_index(i, bits);
        if i < j {
            a.swap(i, j);
        }
    }
}

/// `i`'s `bits` low bits in reverse order: where index `i` of a transform of 2^bits goes
/// in bit-reversed order (and back, as reversal is an involution).
pub(crate) fn reversed_index(i: usize, bits: u32) -> usize {
    if bits == 0 {
        return i;
    }
    i.reverse_bits() >> (usize::BITS - bits)
}

fn sub_small(v: U256, k: u64) -> U256 {
    let mut r = v;
    let (lo, borrow) = r.0[0].overflowing_sub(k);
    r.0[0] = lo;
    // Moduli are odd and far above k: no borrow past limb 0 for the fields here.
    debug_assert!(!borrow);
    r
}

fn shr(v: U256, k: u32) -> U256 {
    let mut r = U256::ZERO;
    for i in 0..4 {
        let lo = v.0[i] >> k;
        let hi = if k > 0 && i + 1 < 4 {
            v.0[i + 1] << (64 - k)
        } else {
            0
        };
        r.0[i] = lo | hi;
    }
    r
}

/// The arithmetic an NTT needs, over each field's CPU representation.
trait NttArith: Copy + Send + Sync {
    fn one() -> Self;
    fn from_u64(v: u64) -> Self;
    fn from_u256(v: &U256) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn pow(self, e: &U256) -> Self;
}

fn from_limbs<C: MontConfig<4>>(x: &[u64; 4]) -> Fp<C> {
    Fp::<C>::from_bigint(BigInt(*x)).expect("canonical by construction")
}

fn to_limbs<C: MontConfig<4>>(x: Fp<C>) -> [u64; 4] {
    x.into_bigint().0
}

impl<C: MontConfig<4>> NttArith for Fp<C> {
    fn one() -> Self {
        <Self as ark_ff::One>::one()
    }
    fn from_u64(v: u64) -> Self {
        Self::from(v)
    }
    fn from_u256(v: &U256) -> Self {
        from_limbs(&v.0)
    }
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn sub(self, o: Self) -> Self {
        self - o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
    fn pow(self, e: &U256) -> Self {
        ark_ff::Field::pow(&self, e.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Gl(u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bb(u32);

/// Square-and-multiply over 256 exponent bits.
fn pow_bits<T: Copy>(x: T, e: &U256, one: T, mul: impl Fn(T, T) -> T) -> T {
    let mut acc = one;
    for i in (0..256).rev() {
        acc = mul(acc, acc);
        if (e.0[i / 64] >> (i % 64)) & 1 == 1 {
            acc = mul(acc, x);
        }
    }
    acc
}

impl NttArith for Gl {
    fn one() -> Self {
        Gl(1)
    }
    fn from_u64(v: u64) -> Self {
        Gl(v % super::field::GOLDILOCKS_P)
    }
    fn from_u256(v: &U256) -> Self {
        Gl(v.0[0])
    }
    fn add(self, o: Self) -> Self {
        Gl(goldilocks::add(self.0, o.0))
    }
    fn sub(self, o: Self) -> Self {
        Gl(goldilocks::sub(self.0, o.0))
    }
    fn mul(self, o: Self) -> Self {
        Gl(goldilocks::mul(self.0, o.0))
    }
    fn pow(self, e: &U256) -> Self {
        pow_bits(self, e, Gl(1), |a, b| a.mul(b))
    }
}

impl NttArith for Bb {
    fn one() -> Self {
        Bb(1)
    }
    fn from_u64(v: u64) -> Self {
        Bb((v % u64::from(super::field::BABYBEAR_P)) as u32)
    }
    fn from_u256(v: &U256) -> Self {
        Bb(v.0[0] as u32)
    }
    fn add(self, o: Self) -> Self {
        Bb(babybear::add(self.0, o.0))
    }
    fn sub(self, o: Self) -> Self {
        Bb(babybear::sub(self.0, o.0))
    }
    fn mul(self, o: Self) -> Self {
        Bb(babybear::mul(self.0, o.0))
    }
    fn pow(self, e: &U256) -> Self {
        pow_bits(self, e, Bb(1), |a, b| a.mul(b))
    }
}

/// What the GPU launcher uploads, from one plan: the twiddles ω_n^k (k < n/2; ω inverted
/// for INTT) as canonical integers, and the element-wise scaling — s^j before an NTT on a
/// coset, or n^-1·s^-j after an INTT — or None when there is nothing to scale (a plain NTT).
pub fn device_tables(
    field: Field,
    n: usize,
    direction: Direction,
    shift: Option<U256>,
) -> (FieldVec, Option<FieldVec>) {
    tables_in(field, n, direction, shift, false)
}

/// `device_tables` as the kernels take them: the 256-bit fields' words in Montgomery form
/// (t·R mod p, ark's internal representation), so one Montgomery product multiplies by t.
/// The small fields' words are canonical, as their kernels multiply directly.
pub fn kernel_tables(
    field: Field,
    n: usize,
    direction: Direction,
    shift: Option<U256>,
) -> (FieldVec, Option<FieldVec>) {
    tables_in(field, n, direction, shift, true)
}

fn tables_in(
    field: Field,
    n: usize,
    direction: Direction,
    shift: Option<U256>,
    montgomery: bool,
) -> (FieldVec, Option<FieldVec>) {
    fn tables<T: NttArith, W>(
        field: Field,
        n: usize,
        d: Direction,
        shift: Option<U256>,
        to: impl Fn(T) -> W,
    ) -> (Vec<W>, Option<Vec<W>>) {
        let plan = Plan::<T>::new(field, n, d, shift);
        let scale = (d == Direction::Inverse || shift.is_some()).then(|| {
            let s = plan.shift.unwrap_or(T::one());
            let mut p = match d {
                Direction::Forward => T::one(),
                Direction::Inverse => plan.n_inv,
            };
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                out.push(to(p));
                p = p.mul(s);
            }
            out
        });
        (plan.twiddles.into_iter().map(&to).collect(), scale)
    }
    fn wrap<W>(
        (tw, scale): (Vec<W>, Option<Vec<W>>),
        variant: fn(Vec<W>) -> FieldVec,
    ) -> (FieldVec, Option<FieldVec>) {
        (variant(tw), scale.map(variant))
    }
    match field {
        Field::Bn254Fr => wrap(
            tables::<Fp<ark_bn254::FrConfig>, _>(field, n, direction, shift, |x| {
                if montgomery {
                    (x.0).0
                } else {
                    to_limbs(x)
                }
            }),
            FieldVec::Bn254Fr,
        ),
        Field::Bls12_381Fr => wrap(
            tables::<Fp<ark_bls12_381::FrConfig>, _>(field, n, direction, shift, |x| {
                if montgomery {
                    (x.0).0
                } else {
                    to_limbs(x)
                }
            }),
            FieldVec::Bls12_381Fr,
        ),
        Field::Goldilocks => wrap(
            tables::<Gl, _>(field, n, direction, shift, |x| x.0),
            FieldVec::Goldilocks,
        ),
        Field::BabyBear => wrap(
            tables::<Bb, _>(field, n, direction, shift, |x| x.0),
            FieldVec::BabyBear,
        ),
    }
}

impl Job for NttJob {
    type Output = FieldVec;

    fn name(&self) -> &'static str {
        self.direction.name()
    }

    /// The field, and whether the transforms are batched (many short ones cost unlike one long one).
    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        let shape = if self.batch > 1 { "batched" } else { "single" };
        format!("{}/{shape}", self.values.field().name()).into()
    }

    fn size(&self) -> usize {
        self.values.len()
    }

    fn input_bytes(&self) -> usize {
        self.values.byte_len()
    }

    fn gpu_threshold(&self) -> usize {
        1 << 14
    }

    fn run_cpu(&self) -> FieldVec {
        NttJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<FieldVec, DeviceError> {
        super::gpu::launch_ntt(self, dev)
    }

    fn agrees(&self, device: &Self::Output, cpu: &Self::Output) -> Result<(), String> {
        crate::backend::verify::exactly(device, cpu)
    }
}

mod library;

#[cfg(test)]
mod tests;
