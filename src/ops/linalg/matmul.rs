//! `D = α·op(A)·op(B) + β·C`, batched: the job, its CPU twin on the `gemm` crate, and the
//! tolerance the device's answer is held to.

use super::precision::{Compute, Dtype};
use super::views::gemm_into;
use crate::backend::{DeviceError, DeviceLease, Job};
use crate::ops::invalid::{FieldPath, Invalid};
use crate::wire::Array;
use gemm::Parallelism;
use ndarray::parallel::prelude::*;
use ndarray::{Array3, ArrayView3, ArrayViewMut3, Axis, ShapeBuilder};

/// Shapes of one batched multiply. `op(A)` is `m × k`, `op(B)` is `k × n`; an operand
/// that is not batched is broadcast over the batch. A is stored `[m, k]`, or `[k, m]`
/// when `trans_a`; B `[k, n]`, or `[n, k]` when `trans_b`; C and D `[m, n]`; each
/// row-major, with a leading batch dimension when batched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulShape {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a_batched: bool,
    pub b_batched: bool,
    pub c_batched: bool,
    pub trans_a: bool,
    pub trans_b: bool,
}

/// Element strides of one operand: (batch, row, column) of op(X).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    pub batch: usize,
    pub row: usize,
    pub col: usize,
}

impl MatmulShape {
    pub fn a_strides(&self) -> Strides {
        let (row, col) = if self.trans_a {
            (1, self.m)
        } else {
            (self.k, 1)
        };
        Strides {
            batch: if self.a_batched { self.m * self.k } else { 0 },
            row,
            col,
        }
    }

    pub fn b_strides(&self) -> Strides {
        let (row, col) = if self.trans_b {
            (1, self.k)
        } else {
            (self.n, 1)
        };
        Strides {
            batch: if self.b_batched { self.k * self.n } else { 0 },
            row,
            col,
        }
    }

    pub fn c_batch_stride(&self) -> usize {
        if self.c_batched {
            self.m * self.n
        } else {
            0
        }
    }

    pub fn a_len(&self) -> usize {
        self.m * self.k * if self.a_batched { self.batch } else { 1 }
    }

    pub fn b_len(&self) -> usize {
        self.k * self.n * if self.b_batched { self.batch } else { 1 }
    }

    pub fn c_len(&self) -> usize {
        self.m * self.n * if self.c_batched { self.batch } else { 1 }
    }

    pub fn out_len(&self) -> usize {
        self.batch * self.m * self.n
    }

    /// Device bytes of one pass of the f32 launcher: (per batch entry, shared by the
    /// pass). Batched operands and D count per entry; a broadcast operand once. `packed`:
    /// A and B are also packed into 16 bits for the pass (cuBLASLt's f16 and bf16).
    pub fn device_bytes(&self, has_c: bool, packed: bool) -> (usize, usize) {
        let per = |batched: bool, len: usize| if batched { len } else { 0 };
        // A and B packed into 16 bits beside their f32 copies (cuBLASLt's halves).
        let width = if packed { 6 } else { 4 };
        let entry = width
            * (per(self.a_batched, self.m * self.k) + per(self.b_batched, self.k * self.n))
            + 4 * (per(self.c_batched && has_c, self.m * self.n) + self.m * self.n);
        let shared = width
            * (per(!self.a_batched, self.m * self.k) + per(!self.b_batched, self.k * self.n))
            + 4 * per(!self.c_batched && has_c, self.m * self.n);
        (entry, shared)
    }

    /// 2·batch·m·n·k: multiplies and adds.
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// Operands: f32 (already rounded to the compute precision; C as given) or f64.
#[derive(Clone, Debug)]
pub enum Operands {
    /// A bulk request's buffers are read in place (`wire::Array`) and copied only when
    /// the compute precision rounds them.
    F32 {
        a: Array<f32>,
        b: Array<f32>,
        c: Option<Array<f32>>,
    },
    F64 {
        a: Vec<f64>,
        b: Vec<f64>,
        c: Option<Vec<f64>>,
    },
}

/// D's values: f32 already rounded to the output dtype, or f64.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    F32(Array<f32>),
    F64(Vec<f64>),
}

impl Values {
    /// The first value that is not finite (an overflow of the output dtype).
    pub fn first_non_finite(&self) -> Option<usize> {
        match self {
            Values::F32(v) => crate::wire::first_non_finite(v),
            Values::F64(v) => crate::wire::first_non_finite(v),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// As f64 (f32 values widen exactly).
    pub fn into_f64(self) -> Vec<f64> {
        match self {
            Values::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Values::F64(v) => v,
        }
    }

    /// As f32: f32 values as they are, f64 ones rounded to nearest.
    pub fn into_f32(self) -> Vec<f32> {
        self.into_f32_array().into_vec()
    }

    /// As `into_f32`, f32 values left where they lie (a bulk body's buffer stays lent).
    pub fn into_f32_array(self) -> Array<f32> {
        match self {
            Values::F32(v) => v,
            Values::F64(v) => v.into_iter().map(|x| x as f32).collect::<Vec<_>>().into(),
        }
    }
}

impl Values {
    /// Little-endian values of `dtype` (a whole number of them): f16, bf16 and f32
    /// become f32 (exactly), f64 stays f64. f32 on a little-endian host is one copy.
    pub fn from_le_bytes(bytes: &[u8], dtype: Dtype) -> Values {
        if dtype == Dtype::F32 && cfg!(target_endian = "little") {
            let mut values = vec![0f32; bytes.len() / 4];
            bytemuck::cast_slice_mut(&mut values).copy_from_slice(bytes);
            return Values::F32(values.into());
        }
        let halves = |from: fn([u8; 2]) -> f32| {
            let v: Vec<f32> = bytes.chunks_exact(2).map(|c| from([c[0], c[1]])).collect();
            Values::F32(v.into())
        };
        match dtype {
            Dtype::F16 => halves(|b| half::f16::from_le_bytes(b).to_f32()),
            Dtype::Bf16 => halves(|b| half::bf16::from_le_bytes(b).to_f32()),
            Dtype::F32 => Values::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect::<Vec<_>>()
                    .into(),
            ),
            Dtype::F64 => Values::F64(
                bytes
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect(),
            ),
        }
    }

    /// The values (representable in `dtype`) as little-endian bytes of `dtype`:
    /// borrowed where they already lie so (f32 as f32, f64 as f64, on a little-endian
    /// host), else each rounded and written.
    pub fn le_bytes(&self, dtype: Dtype) -> std::borrow::Cow<'_, [u8]> {
        use std::borrow::Cow;
        let little = cfg!(target_endian = "little");
        match self {
            Values::F32(v) if dtype == Dtype::F32 && little => {
                Cow::Borrowed(bytemuck::cast_slice(v))
            }
            Values::F64(v) if dtype == Dtype::F64 && little => {
                Cow::Borrowed(bytemuck::cast_slice(v))
            }
            Values::F32(v) => {
                Cow::Owned(encode_each(v.iter().map(|&x| f64::from(x)), v.len(), dtype))
            }
            Values::F64(v) => Cow::Owned(encode_each(v.iter().copied(), v.len(), dtype)),
        }
    }
}

impl Values {
    /// f64 values, each rounded to `dtype` and written little-endian.
    pub fn f64_le_bytes(values: &[f64], dtype: Dtype) -> Vec<u8> {
        encode_each(values.iter().copied(), values.len(), dtype)
    }
}

/// `n` values, each rounded to `dtype` and written little-endian.
fn encode_each(values: impl Iterator<Item = f64>, n: usize, dtype: Dtype) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.bytes());
    for x in values {
        match dtype {
            Dtype::F16 => out.extend(half::f16::from_f64(x).to_le_bytes()),
            Dtype::Bf16 => out.extend(half::bf16::from_f64(x).to_le_bytes()),
            Dtype::F32 => out.extend((x as f32).to_le_bytes()),
            Dtype::F64 => out.extend(x.to_le_bytes()),
        }
    }
    out
}

impl From<Vec<f64>> for Values {
    fn from(v: Vec<f64>) -> Self {
        Values::F64(v)
    }
}

#[derive(Clone, Debug)]
pub struct MatmulJob {
    pub shape: MatmulShape,
    pub operands: Operands,
    pub alpha: f64,
    pub beta: f64,
    pub compute: Compute,
    pub input: Dtype,
    pub output: Dtype,
    /// A, B and C's keys in a device's cache when they are resident arrays' (rounded
    /// to the compute precision, so the key names it): uploaded once per device, kept
    /// between jobs (`with_device_keys`).
    pub device_keys: [Option<String>; 3],
}

impl MatmulJob {
    /// Checks the operands' lengths and the precisions, and rounds f32 operands to the
    /// compute precision. Paths are the request's: `a`, `b`, `c`, `compute`, `out_dtype`.
    pub fn new(
        shape: MatmulShape,
        operands: Operands,
        alpha: f64,
        beta: f64,
        compute: Compute,
        input: Dtype,
        output: Dtype,
    ) -> Result<Self, Invalid> {
        let precision = (compute, input, output);
        Self::checked(shape, operands, [false; 3], (alpha, beta), precision)
    }

    /// `new`, the operands marked in `held` (A, B, C) left empty: a device holds their
    /// values (`kept::KeptMatmulJob`), of the shape's lengths, already representable in
    /// the compute precision.
    pub fn checked(
        shape: MatmulShape,
        operands: Operands,
        held: [bool; 3],
        (alpha, beta): (f64, f64),
        (compute, input, output): (Compute, Dtype, Dtype),
    ) -> Result<Self, Invalid> {
        let root = FieldPath::root();
        let (a, b, c) = match &operands {
            Operands::F32 { a, b, c } => (a.len(), b.len(), c.as_ref().map(|c| c.len())),
            Operands::F64 { a, b, c } => (a.len(), b.len(), c.as_ref().map(Vec::len)),
        };
        let lengths = [("a", a, shape.a_len()), ("b", b, shape.b_len())];
        for (i, (name, got, want)) in lengths
            .into_iter()
            .chain(c.map(|c| ("c", c, shape.c_len())))
            .enumerate()
        {
            if got != want && !(held[i] && got == 0) {
                return Err(Invalid::new(
                    root.field(name),
                    format!("{got} values where the shape needs {want}"),
                ));
            }
        }
        let wide = input == Dtype::F64;
        if wide != (compute == Compute::F64) || wide != (output == Dtype::F64) {
            return Err(Invalid::new(
                root.field("compute"),
                "f64 inputs compute in f64 and answer in f64; other inputs compute in \
                 f32, tf32, f16 or bf16 and answer in f32, f16 or bf16",
            ));
        }
        for (name, v) in [("alpha", alpha), ("beta", beta)] {
            // f32 work scales in f32: a factor must be 0 or a normal f32.
            let normal = wide
                || v == 0.0
                || (f64::from(f32::MIN_POSITIVE)..=f64::from(f32::MAX)).contains(&v.abs());
            if !v.is_finite() || !normal {
                return Err(Invalid::new(
                    root.field(name),
                    "must be finite, and 0 or a normal f32 (1.2e-38 to 3.4e38 in magnitude) unless the operands are f64",
                ));
            }
        }
        let operands = match operands {
            Operands::F32 { mut a, mut b, c } => {
                for (name, v) in [("a", &mut a), ("b", &mut b)] {
                    if let Some(i) = round_all(v, compute) {
                        return Err(Invalid::new(
                            root.field(name),
                            format!("value {i} overflows {} compute", compute.name()),
                        ));
                    }
                }
                Operands::F32 { a, b, c }
            }
            wide => wide,
        };
        Ok(Self {
            shape,
            operands,
            alpha,
            beta,
            compute,
            input,
            output,
            device_keys: Default::default(),
        })
    }

    /// Marks A, B and C (those `Some`) as resident arrays' (`arrays::device_key`): a
    /// device keeps each operand's upload, as rounded to this job's compute precision,
    /// and a later product over it uploads only the rest. f64 products run on the CPU.
    pub fn with_device_keys(mut self, keys: [Option<String>; 3]) -> Self {
        let compute = self.compute.name();
        self.device_keys = keys.map(|k| k.map(|k| format!("{k}/{compute}")));
        self
    }

    pub fn has_c(&self) -> bool {
        match &self.operands {
            Operands::F32 { c, .. } => c.is_some(),
            Operands::F64 { c, .. } => c.is_some(),
        }
    }

    /// The CPU twin: the `gemm` crate per batch entry (several entries at once when they
    /// are small), then the output dtype's rounding.
    pub fn run_cpu(&self) -> Values {
        match &self.operands {
            Operands::F32 { a, b, c } => {
                let mut d = self.seed(c.as_deref());
                let beta = c.is_some().then_some(self.beta as f32);
                self.gemm(d.view_mut(), a, b, self.alpha as f32, beta);
                let mut d = into_vec(d);
                self.output.round_all(&mut d);
                Values::F32(d.into())
            }
            Operands::F64 { a, b, c } => {
                let mut d = self.seed(c.as_deref());
                let beta = c.is_some().then_some(self.beta);
                self.gemm(d.view_mut(), a, b, self.alpha, beta);
                Values::F64(into_vec(d))
            }
        }
    }

    /// `values` (A, B or C as stored) as a batch × rows × columns view: a transposed
    /// operand's strides swapped, a broadcast one's batch stride zero.
    fn view<'a, T>(
        &self,
        values: &'a [T],
        rows: usize,
        columns: usize,
        strides: Strides,
    ) -> ArrayView3<'a, T> {
        let shape =
            (self.shape.batch, rows, columns).strides((strides.batch, strides.row, strides.col));
        ArrayView3::from_shape(shape, values)
            .expect("the constructor checked the operands' lengths")
    }

    /// D before the product: C broadcast over the batch, or zeros.
    fn seed<T: Copy + Default>(&self, c: Option<&[T]>) -> Array3<T> {
        let s = self.shape;
        // Zeros whose pages are advised huge before the product first writes them.
        let zeros = crate::huge_pages::zeroed_output(s.batch * s.m * s.n);
        let mut d = Array3::from_shape_vec((s.batch, s.m, s.n), zeros).expect("the shape's length");
        if let Some(c) = c {
            let strides = Strides {
                batch: s.c_batch_stride(),
                row: s.n,
                col: 1,
            };
            d.assign(&self.view(c, s.m, s.n, strides));
        }
        d
    }

    /// d[b] = alpha·op(A[b])·op(B[b]) + beta·d[b] (d read only with a beta).
    fn gemm<T: Copy + Send + Sync + 'static>(
        &self,
        mut d: ArrayViewMut3<'_, T>,
        a: &[T],
        b: &[T],
        alpha: T,
        beta: Option<T>,
    ) {
        let s = self.shape;
        let a = self.view(a, s.m, s.k, s.a_strides());
        let b = self.view(b, s.k, s.n, s.b_strides());
        let one = |bi: usize, out, parallelism| {
            let (a, b) = (a.index_axis(Axis(0), bi), b.index_axis(Axis(0), bi));
            gemm_into(out, a, b, alpha, beta, false, parallelism);
        };
        // Small entries: one thread each; large ones: every thread on one entry.
        if s.batch > 1 && s.flops() / (s.batch as f64) < (1u64 << 22) as f64 {
            d.axis_iter_mut(Axis(0))
                .into_par_iter()
                .enumerate()
                .for_each(|(bi, out)| one(bi, out, Parallelism::None));
        } else {
            let threads = rayon::current_num_threads();
            for (bi, out) in d.axis_iter_mut(Axis(0)).enumerate() {
                one(bi, out, Parallelism::Rayon(threads));
            }
        }
    }

    /// Per value of D, a bound on |device − CPU|: both sum the same exact products in
    /// f32 in different orders, so each is within γ_{k+2}·(|α|·(|A||B|) + |β||C|) of the
    /// exact sum; then each rounds to the output dtype (one ulp apart at most).
    pub fn tolerance(&self) -> Vec<f64> {
        let Operands::F32 { a, b, c } = &self.operands else {
            return vec![0.0; self.shape.out_len()];
        };
        let abs = |v: &[f32]| v.iter().map(|x| f64::from(x.abs())).collect::<Vec<_>>();
        let c_abs = c.as_deref().map(abs);
        let wide = MatmulJob {
            operands: Operands::F64 {
                a: abs(a),
                b: abs(b),
                c: c_abs,
            },
            alpha: self.alpha.abs(),
            beta: self.beta.abs(),
            compute: Compute::F64,
            input: Dtype::F64,
            output: Dtype::F64,
            shape: self.shape,
            device_keys: Default::default(),
        };
        let Values::F64(magnitude) = wide.run_cpu() else {
            unreachable!("an f64 job answers in f64")
        };
        let u = Dtype::F32.unit_roundoff();
        let gamma = (self.shape.k + 2) as f64 * u / (1.0 - (self.shape.k + 2) as f64 * u);
        let out_u = self.output.unit_roundoff();
        magnitude
            .into_iter()
            .map(|mag| 2.0 * gamma * mag * 1.01 + 2.0 * out_u * mag + f64::from(f32::MIN_POSITIVE))
            .collect()
    }
}

/// An owned array's values in row-major order (it was built in that layout).
fn into_vec<T>(d: Array3<T>) -> Vec<T> {
    let (values, offset) = d.into_raw_vec_and_offset();
    debug_assert_eq!(offset.unwrap_or(0), 0);
    values
}

/// Rounds `v` to `compute` in place (nothing to do for f32); the first value that
/// overflows it, if any.
fn round_all(v: &mut Array<f32>, compute: Compute) -> Option<usize> {
    if matches!(compute, Compute::F32 | Compute::F64) {
        return None;
    }
    // Rounding writes: a lent operand is copied here, once.
    v.make_mut()
        .par_iter_mut()
        .with_min_len(1 << 14)
        .enumerate()
        .filter_map(|(i, x)| {
            *x = compute.round(*x);
            (!x.is_finite()).then_some(i)
        })
        .min()
}

impl Job for MatmulJob {
    type Output = Values;

    fn name(&self) -> &'static str {
        "matmul"
    }

    /// The compute precision, and whether the product is batched.
    fn placement_lane(&self) -> std::borrow::Cow<'static, str> {
        let shape = if self.shape.batch > 1 {
            "batched"
        } else {
            "single"
        };
        format!("{}/{shape}", self.compute.name()).into()
    }

    fn size(&self) -> usize {
        self.shape.out_len()
    }

    fn input_bytes(&self) -> usize {
        let s = self.shape;
        let c = if self.has_c() { s.c_len() } else { 0 };
        (s.a_len() + s.b_len() + c) * self.input.bytes()
    }

    /// Outputs of at least 2^16 values (a 256 × 256 product) go to the device on `auto`.
    fn gpu_threshold(&self) -> usize {
        1 << 16
    }

    fn device_refusal(&self) -> Option<String> {
        (self.compute == Compute::F64)
            .then(|| "f64 matmul runs on the CPU only; use backend auto or cpu".into())
    }

    fn run_cpu(&self) -> Values {
        MatmulJob::run_cpu(self)
    }

    fn run_device(&self, dev: &DeviceLease<'_>) -> Result<Values, DeviceError> {
        super::gpu::launch_matmul(self, dev)
    }

    fn agrees(&self, device: &Values, cpu: &Values) -> Result<(), String> {
        let (Values::F32(d), Values::F32(c)) = (device, cpu) else {
            return Err("the device answered a different dtype".into());
        };
        if d.len() != c.len() {
            return Err(format!("{} values where the CPU has {}", d.len(), c.len()));
        }
        let tol = self.tolerance();
        // Below the output dtype's normal range its values are a fixed step apart, and at
        // the top one side may round to the largest finite value, the other to infinity.
        let (step, largest) = self.output.subnormal_step_and_max();
        match (0..d.len()).find(|&i| {
            let (x, y) = (f64::from(d[i]), f64::from(c[i]));
            let at_the_edge = x.signum() == y.signum() && x.abs().min(y.abs()) >= largest;
            !(x == y || (x - y).abs() <= tol[i] + step || at_the_edge)
        }) {
            None => Ok(()),
            Some(i) => Err(format!(
                "value {i}: device {} against CPU {} (tolerance {:e})",
                d[i], c[i], tol[i]
            )),
        }
    }
}
