//! `/nn/conv2d`: batched 2-D convolution on the CPU (im2col on `gemm`) or the device.

use crate::api::array_operands::ArrayScope;
use crate::api::arrays::ArrayView;
use crate::api::dense_tensors::{Dense4Doc, Dense4OutDoc, DenseIn, DenseOut, TensorDtype};
use crate::api::extract::ObjectOnly;
use crate::api::kept_results::{self, Keep, KeepPlan, TensorStep};
use crate::api::linalg::{gflops_per_second, operand, MAX_MATMUL_FLOPS};
use crate::api::openapi::Binary;
use crate::api::problem::{ErrorCode, Problem};
use crate::api::zk::steps::{devices_may_hold, Step};
use crate::api::{
    blocking, blocking_if, bulk, job_timeout, json_body, AnswerForm, ApiBody, AppState,
};
use crate::backend::BackendChoice;
use crate::ops::linalg::kept::KeepOnDevice;
use crate::ops::linalg::{Compute, Dtype};
use crate::ops::nn::kept::KeptConv2dJob;
use crate::ops::nn::{Conv2dJob, Conv2dShape, ConvTensors};
use axum::extract::State;
use axum::response::Response;
use ndarray::ArrayView3;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// Where the channels are in `input` and the answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConvLayout {
    /// `[N, C, H, W]`.
    #[default]
    Nchw,
    /// `[N, H, W, C]`.
    Nhwc,
}

/// `out = relu?(conv(input, weight) + bias)`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "input": [[[[1, 2, 3], [4, 5, 6], [7, 8, 9]]]],
    "weight": [[[[1, 0], [0, -1]]]],
    "padding": [1, 1]
}))]
pub struct Conv2dRequest {
    /// `[N, C, H, W]`, or `[N, H, W, C]` with `layout` nhwc. At most
    /// --max-tensor-elements values.
    #[schema(value_type = Dense4Doc)]
    pub input: DenseIn,
    /// `[O, C/groups, KH, KW]` in either layout (PyTorch's order).
    #[schema(value_type = Dense4Doc)]
    pub weight: DenseIn,
    /// O values, added per output channel (rounded to `dtype`).
    #[schema(min_items = 1)]
    pub bias: Option<Vec<f64>>,
    #[serde(default)]
    pub layout: ConvLayout,
    /// `[rows, columns]`, each at least 1. Default `[1, 1]`.
    #[schema(min_items = 2, max_items = 2, minimum = 1)]
    pub stride: Option<Vec<usize>>,
    /// Zeros around the input: `[rows, columns]` on both sides, or `[top, bottom, left,
    /// right]`. Default none.
    #[schema(value_type = Option<PaddingDoc>)]
    pub padding: Option<Vec<usize>>,
    /// `[rows, columns]`, each at least 1. Default `[1, 1]`.
    #[schema(min_items = 2, max_items = 2, minimum = 1)]
    pub dilation: Option<Vec<usize>>,
    /// Dividing C and O: output channel o reads the input channels of group
    /// o / (O / groups). groups = C is a depthwise convolution.
    #[serde(default = "one")]
    #[schema(default = 1, minimum = 1)]
    pub groups: usize,
    /// max(·, 0) after the bias.
    #[serde(default)]
    #[schema(default = false)]
    pub relu: bool,
    /// The inputs' dtype. Packed inputs state theirs, and all must agree; nested JSON
    /// numbers are rounded to it. Default: packed `input`'s dtype, else f32.
    pub dtype: Option<TensorDtype>,
    /// Default: the inputs' dtype. f64 inputs answer in f64 (on the CPU).
    pub out_dtype: Option<TensorDtype>,
    #[serde(default)]
    pub backend: BackendChoice,
    /// Keep the output as a resident tensor (`kept` in the answer), for the next op to
    /// name as `{"array": id}`.
    #[schema(value_type = Option<Keep>)]
    pub keep: Option<ObjectOnly<Keep>>,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

fn one() -> usize {
    1
}

#[derive(Serialize, ToSchema)]
pub struct Conv2dResponse {
    /// `[N, O, OH, OW]` (nhwc: `[N, OH, OW, O]`), in the form of `input` (nested
    /// numbers, also for a resident `input`, or packed in `dtype`); absent when `keep.with_data` was false.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Dense4OutDoc>)]
    pub result: Option<DenseOut>,
    pub shape: Vec<usize>,
    pub dtype: TensorDtype,
    /// 2·N·O·OH·OW·(C/groups)·KH·KW.
    pub flops: f64,
    /// `flops` over the compute time (`x-compute-time-ms`).
    pub gflops_per_second: f64,
    /// The resident tensor the output was kept as, when the request asked to `keep` it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<ArrayView>,
}

#[utoipa::path(
    post, path = "/nn/conv2d", tag = "nn", operation_id = "conv2d",
    summary = "Batched 2-D convolution",
    description = "Cross-correlation of a batch of images with O filters (stride, padding per side, \
        dilation, groups), plus an optional bias per output channel and ReLU; NCHW or NHWC. Inputs f16, \
        bf16, f32 (f64 on the CPU), rounded to their dtype; sums in f32 (f64 for f64). CPU: im2col on \
        the gemm crate; device: an im2col kernel and the matmul kernel. Error bound: docs/TENSORS.md.",
    request_body(content((Conv2dRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The convolution", body = Conv2dResponse),
        (status = 413, description = "An input or the output over --max-tensor-elements, or more than 2^40 flops"),
        (status = 422, description = "invalid_tensor (rank, ragged, non-finite, base64, a weight whose \
            channels do not match the input's), invalid_parameter (dtype, stride, padding, dilation, groups, \
            bias, a kernel larger than the padded input, backend gpu with f64), result_not_finite (the \
            output overflows out_dtype)"),
        (status = 503, description = "queue_full, shutting_down, device_unavailable (backend gpu without a device)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn conv2d(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<Conv2dRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let (backend, layout) = (req.backend, req.layout);
    // A tensor a device holds (a kept convolution's output) is read there as the input
    // when its layout needs no transpose (NCHW), as it is (a held tensor is already in
    // its dtype, and every convolution sums in f32; `KeptConv2dJob`); else read back.
    let holding = devices_may_hold(&state, backend) && layout == ConvLayout::Nchw;
    let named = req.input.array_id();
    match holding {
        true => req
            .input
            .resolve_where_held(&arrays, Compute::F32, "/input")?,
        false => req.input.resolve(&arrays, "/input")?,
    };
    let weight_key = req.weight.resolve(&arrays, "/weight")?;
    let mut keep = kept_results::plan(req.keep.take().map(|k| k.0), &state, &arrays)?;
    let max = state.settings.config.max_tensor_elements;
    let packed = req.input.answers_packed();
    let held = req.input.held();
    let job = blocking(move || build_job(req, max))
        .await?
        .with_weight_key(weight_key);
    let (s, out_dtype) = (job.shape, job.output);
    let (oh, ow) = s.out_size().expect("the job checked the output size");
    let nchw = vec![s.batch, s.out_channels, oh, ow];
    let dtype = TensorDtype::from(out_dtype);
    let stay = keep
        .as_ref()
        .and_then(KeepPlan::device_key)
        .filter(|_| holding);
    let done = if held.is_some() || (stay.is_some() && job.input != Dtype::F64) {
        let keep_on_device = stay.map(|key| KeepOnDevice {
            key,
            shape: nchw.clone(),
        });
        let kept = KeptConv2dJob::new(job, held, keep_on_device)?;
        let done = state.pool.submit(kept, backend, timeout).await?;
        let step = Step {
            scope: arrays.clone(),
            named: vec![named],
            paths: &["/input"],
        };
        match kept_results::settle_tensor(done, &mut keep, step).await? {
            TensorStep::Host(done) => done,
            TensorStep::Held(kept, run) => {
                let body = Conv2dResponse {
                    result: None,
                    shape: nchw,
                    dtype,
                    flops: s.flops(),
                    gflops_per_second: gflops_per_second(s.flops(), run.compute_time),
                    kept: Some(kept),
                };
                return bulk::answer(form, &body, |b| json_body(b, 256), &run);
            }
        }
    } else {
        state.pool.submit(job, backend, timeout).await?
    };
    if let Some(i) = done.output.first_non_finite() {
        return Err(Problem::at(
            ErrorCode::ResultNotFinite,
            "/out_dtype",
            format!(
                "value {i} of the output (NCHW order) overflows {}",
                out_dtype.name()
            ),
        ));
    }
    let values = done.output.into_f64();
    let (shape, values) = match layout {
        ConvLayout::Nchw => (nchw, values),
        ConvLayout::Nhwc => (
            vec![s.batch, oh, ow, s.out_channels],
            swap_inner_axes(&values, s.batch, s.out_channels, oh * ow),
        ),
    };
    let rate = gflops_per_second(s.flops(), done.run.compute_time);
    let keeping = keep.is_some();
    let encode = move || {
        let (values, kept) = kept_results::keep_tensor(keep, out_dtype, &shape, values.into())?;
        let body = Conv2dResponse {
            result: values.map(|v| DenseOut::new(shape.clone(), v, dtype, packed)),
            shape,
            dtype,
            flops: s.flops(),
            gflops_per_second: rate,
            kept,
        };
        let hint = body.result.as_ref().map_or(256, DenseOut::json_bytes_hint);
        bulk::answer(form, &body, |b| json_body(b, hint), &done.run)
    };
    // Keeping writes the tensor's files: never on the runtime's threads.
    blocking_if(keeping, encode).await
}

/// `[N, A, B]` → `[N, B, A]`: NCHW ↔ NHWC, the spatial axes taken as one.
fn swap_inner_axes<T: Copy>(x: &[T], n: usize, a: usize, b: usize) -> Vec<T> {
    let x = ArrayView3::from_shape((n, a, b), x).expect("the tensor's length is its shape's");
    let swapped = x.permuted_axes([0, 2, 1]).as_standard_layout().into_owned();
    swapped.into_raw_vec_and_offset().0
}

/// A pair of at-least-1 factors (stride, dilation); `[1, 1]` when absent.
fn pair(v: Option<Vec<usize>>, path: &str) -> Result<(usize, usize), Problem> {
    match v.as_deref() {
        None => Ok((1, 1)),
        Some(&[a, b]) if a >= 1 && b >= 1 => Ok((a, b)),
        Some(_) => Err(Problem::at(
            ErrorCode::InvalidParameter,
            path,
            "two values, [rows, columns], each at least 1",
        )),
    }
}

/// Decodes the inputs and checks everything the job needs (on a blocking thread: the
/// inputs may be large).
/// An input a device holds (`DenseIn::Held`, NCHW only) is left empty in the job
/// (`Conv2dJob::checked`), for `KeptConv2dJob` to read where it is.
fn build_job(req: Conv2dRequest, max: usize) -> Result<Conv2dJob, Problem> {
    let held_input = req.input.held().is_some();
    // The small parameters first: a bad one is a 422 whatever the tensors' size.
    let stride = pair(req.stride, "/stride")?;
    let dilation = pair(req.dilation, "/dilation")?;
    let padding = match req.padding.as_deref() {
        None => [0; 4],
        Some(&[rows, cols]) => [rows, rows, cols, cols],
        Some(&[top, bottom, left, right]) => [top, bottom, left, right],
        Some(_) => {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/padding",
                "[rows, columns] or [top, bottom, left, right]",
            ))
        }
    };
    let dtype = req
        .dtype
        .or(req.input.packed_dtype())
        .unwrap_or(TensorDtype::F32);
    let input = operand(req.input, "/input", dtype, 4..=4, max)?;
    let weight = operand(req.weight, "/weight", dtype, 4..=4, max)?;
    let (n, c, h, w, x) = match (req.layout, &input.shape[..]) {
        (ConvLayout::Nchw, &[n, c, h, w]) => (n, c, h, w, input.values.into_f64()),
        (ConvLayout::Nhwc, &[n, h, w, c]) => (
            n,
            c,
            h,
            w,
            swap_inner_axes(&input.values.into_f64(), n, h * w, c),
        ),
        _ => unreachable!("decode checked the rank"),
    };
    let &[o, cg, kh, kw] = &weight.shape[..] else {
        unreachable!("decode checked the rank")
    };
    let groups = req.groups;
    if groups >= 1 && c % groups == 0 && cg != c / groups {
        return Err(Problem::at(
            ErrorCode::InvalidTensor,
            "/weight/shape",
            format!(
                "{cg} input channels per filter where the input's {c} channels in {groups} groups give {}",
                c / groups
            ),
        ));
    }
    let shape = Conv2dShape {
        batch: n,
        channels: c,
        height: h,
        width: w,
        out_channels: o,
        kernel_h: kh,
        kernel_w: kw,
        stride,
        padding,
        dilation,
        groups,
    };
    if let Some((oh, ow)) = shape.out_size() {
        let out_len = [n, o, oh, ow]
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .unwrap_or(usize::MAX);
        let too_large = |message: String| {
            Err(Problem::at(
                ErrorCode::PayloadTooLarge,
                "/weight/shape",
                message,
            ))
        };
        if out_len > max {
            return too_large(format!(
                "the output would hold {out_len} values; the server answers at most {max} (--max-tensor-elements)"
            ));
        }
        let flops = 2.0 * out_len as f64 * (cg * kh * kw) as f64;
        if flops > MAX_MATMUL_FLOPS {
            return too_large(format!(
                "{flops:e} flops; the server takes at most 2^40 per request"
            ));
        }
    }
    let input_dtype = Dtype::from(dtype);
    let output = req.out_dtype.map_or(input_dtype, Dtype::from);
    let bias = req.bias.map(|b| {
        b.into_iter()
            .map(|x| input_dtype.round_f64(x))
            .collect::<Vec<f64>>()
    });
    if let Some(i) = bias
        .as_ref()
        .and_then(|b| b.iter().position(|x| !x.is_finite()))
    {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            format!("/bias/{i}"),
            format!("overflows {}", input_dtype.name()),
        ));
    }
    let tensors = if input_dtype == Dtype::F64 {
        ConvTensors::F64 {
            input: x,
            weight: weight.values.into_f64(),
            bias,
        }
    } else {
        let narrow = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        ConvTensors::F32 {
            input: narrow(x),
            weight: narrow(weight.values.into_f64()),
            bias: bias.map(narrow),
        }
    };
    Ok(Conv2dJob::checked(
        shape,
        tensors,
        req.relu,
        (input_dtype, output),
        held_input,
    )?)
}

/// Schema of `padding`: two or four non-negative integers (three is refused).
pub struct PaddingDoc;

impl utoipa::PartialSchema for PaddingDoc {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
        let sides = |n: usize| {
            ArrayBuilder::new()
                .items(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0)),
                )
                .min_items(Some(n))
                .max_items(Some(n))
        };
        OneOfBuilder::new().item(sides(2)).item(sides(4)).into()
    }
}

impl ToSchema for PaddingDoc {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_moves_are_inverse_transposes() {
        let x: Vec<u32> = (0..2 * 3 * 4).collect();
        let last = swap_inner_axes(&x, 2, 3, 4);
        assert_eq!(&last[..6], &[0, 4, 8, 1, 5, 9]);
        assert_eq!(swap_inner_axes(&last, 2, 4, 3), x);
    }
}
