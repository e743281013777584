//! `/embeddings/sinusoidal`: the sinusoidal position table, or its rows for a batch of
//! positions.

use super::array_operands::ArrayScope;
use super::dense_tensors::{DenseIn, DenseOut, DenseOutDoc, TensorDtype};
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::{blocking, bulk, job_timeout, json_body, AnswerForm, ApiBody, AppState};
use crate::backend::BackendChoice;
use crate::ops::linalg::sinusoidal::MAX_DIM;
use crate::ops::linalg::{Dtype, Layout, SinusoidalJob};
use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

/// Where a pair's sine and cosine go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingLayout {
    /// sin, cos, sin, cos, … (Vaswani et al.).
    #[default]
    Interleaved,
    /// All `dim / 2` sines, then all cosines (as tensor2tensor and many ports).
    Split,
}

/// Output precisions of an embedding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingDtype {
    #[default]
    F32,
    F16,
    Bf16,
}

impl From<EmbeddingDtype> for Dtype {
    fn from(d: EmbeddingDtype) -> Dtype {
        match d {
            EmbeddingDtype::F32 => Dtype::F32,
            EmbeddingDtype::F16 => Dtype::F16,
            EmbeddingDtype::Bf16 => Dtype::Bf16,
        }
    }
}

/// How the answer is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputEncoding {
    /// Nested JSON arrays of numbers.
    #[default]
    Json,
    /// Packed base64 of little-endian `out_dtype` values with a shape.
    Base64,
}

fn default_base() -> f64 {
    10_000.0
}

fn one() -> f64 {
    1.0
}

/// Row for position p, pair i: angle = (p + offset)·scale·base^(−2i/dim); sin and cos of
/// it, interleaved or split.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"num_positions": 4, "dim": 8}))]
pub struct SinusoidalRequest {
    /// The table for positions 0 … num_positions − 1 (give this or `positions`); at most
    /// 2^32.
    #[schema(minimum = 1, maximum = 4294967296_u64)]
    pub num_positions: Option<u64>,
    /// `[S]` or `[B, S]` positions: JSON integers from 0 to 2^32, or a resident tensor
    /// of them (`{"array": id}`) (give this or `num_positions`).
    #[schema(value_type = Option<PositionsDoc>)]
    pub positions: Option<DenseIn>,
    /// Even, 2 to 65536.
    #[schema(minimum = 2, maximum = 65536)]
    pub dim: usize,
    /// Above 1.
    #[serde(default = "default_base")]
    #[schema(default = 10000.0, exclusive_minimum = 1.0)]
    pub base: f64,
    /// Nonzero; multiplies position + offset.
    #[serde(default = "one")]
    #[schema(default = 1.0)]
    pub scale: f64,
    /// Added to every position; (position + offset)·scale stays within ±1e15.
    #[serde(default)]
    #[schema(default = 0.0)]
    pub offset: f64,
    #[serde(default)]
    pub layout: EmbeddingLayout,
    #[serde(default)]
    pub out_dtype: EmbeddingDtype,
    #[serde(default)]
    pub encoding: OutputEncoding,
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct SinusoidalResponse {
    /// `[num_positions, dim]`, `[S, dim]` or `[B, S, dim]`.
    #[schema(value_type = DenseOutDoc)]
    pub result: DenseOut,
    pub shape: Vec<usize>,
    pub dtype: TensorDtype,
}

/// Largest position taken.
const MAX_POSITION: f64 = 4_294_967_296.0;

/// The positions and the shape of the answer's leading dimensions.
fn positions(req: &mut SinusoidalRequest, max: usize) -> Result<(Vec<f64>, Vec<usize>), Problem> {
    // The size checks below multiply by dim: check it before anything is allocated.
    if req.dim < 2 || req.dim % 2 != 0 || req.dim > MAX_DIM {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/dim",
            format!("must be even, from 2 to {MAX_DIM}"),
        ));
    }
    match (req.num_positions, req.positions.take()) {
        (Some(n), None) if n == 0 || n as f64 > MAX_POSITION => Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/num_positions",
            "must be from 1 to 2^32",
        )),
        (Some(n), None) => {
            let rows = n.saturating_mul(req.dim as u64);
            if rows > max as u64 {
                return Err(too_large("/num_positions", rows, max));
            }
            Ok(((0..n).map(|p| p as f64).collect(), vec![n as usize]))
        }
        (None, Some(p)) => {
            let at = match p {
                DenseIn::Resident(_) => "/positions/array",
                _ => "/positions",
            };
            let p = integer_tensor(p, "/positions", max, MAX_POSITION, "2^32")?;
            let rows = (p.values.len() as u64).saturating_mul(req.dim as u64);
            if rows > max as u64 {
                return Err(too_large(at, rows, max));
            }
            Ok((p.values, p.shape))
        }
        _ => Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/num_positions",
            "give exactly one of num_positions (the table) or positions (a lookup)",
        )),
    }
}

/// `[S]` or `[B, S]` JSON integers from 0 to `top` (written `top_text` in messages), or
/// a resident tensor of them; not packed, since packed floats are not integers.
pub(super) fn integer_tensor(
    t: DenseIn,
    path: &str,
    max: usize,
    top: f64,
    top_text: &str,
) -> Result<IntegerTensor, Problem> {
    // A resident tensor holds floats rounded to its dtype when it was uploaded: an
    // integer at or above 2^(significand bits) may have been rounded to its neighbour, so
    // only those below are taken from it (every id of a table of up to 2^24 rows from an
    // f32 tensor; any position from an f64 one).
    let resident = match &t {
        DenseIn::Resident(r) => Some(r.dtype),
        _ => None,
    };
    let asked = top;
    let (top, at) = match resident {
        Some(dtype) => (top.min(exact_below(dtype) - 1.0), format!("{path}/array")),
        None => (top, path.to_string()),
    };
    let p = match t {
        DenseIn::Packed(_) => {
            return Err(Problem::at(
                ErrorCode::InvalidTensor,
                path,
                "JSON arrays of integers, or a u32 or u64 buffer in the bulk form; not packed",
            ))
        }
        DenseIn::Buffer {
            dtype,
            shape,
            bytes,
        } => integer_buffer(dtype, shape, &bytes, path, max)?,
        t => t.decode(path, 1..=2, max)?,
    };
    let p = IntegerTensor {
        shape: p.shape,
        values: p.values.into_f64(),
    };
    if let Some(i) = p
        .values
        .iter()
        .position(|&x| x < 0.0 || x.fract() != 0.0 || x > top)
    {
        let x = p.values[i];
        let why = match resident {
            Some(dtype) if x.fract() == 0.0 && x >= exact_below(dtype) && x <= asked => format!(
                "value {i} (row-major) of the resident {} tensor is {x}: integers from 2^{} up \
                 may have been rounded when it was uploaded; keep them in an f64 tensor",
                dtype.name(),
                exact_below(dtype).log2()
            ),
            Some(_) => format!(
                "value {i} (row-major) of the resident tensor is not an integer from 0 to {top_text}"
            ),
            None => format!("value {i} (row-major) is not an integer from 0 to {top_text}"),
        };
        return Err(Problem::at(ErrorCode::InvalidTensor, at, why));
    }
    Ok(p)
}

/// The first integer that a value rounded to `dtype` may not hold exactly:
/// 2^(significand bits).
fn exact_below(dtype: Dtype) -> f64 {
    let bits = match dtype {
        Dtype::Bf16 => 8,
        Dtype::F16 => 11,
        Dtype::F32 => 24,
        Dtype::F64 => 53,
    };
    f64::from(2u32).powi(bits)
}

/// A bulk body's `u32` or `u64` integers as `integer_tensor` takes them: values above
/// 2^53 become larger floats, which its range check refuses.
fn integer_buffer(
    dtype: crate::wire::Dtype,
    shape: Vec<usize>,
    bytes: &[u8],
    path: &str,
    max: usize,
) -> Result<super::dense_tensors::DenseValues, Problem> {
    use crate::wire::Dtype as W;
    let values: Vec<f64> = match dtype {
        W::U32 => bytes
            .chunks_exact(4)
            .map(|c| f64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))))
            .collect(),
        W::U64 => bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as f64)
            .collect(),
        other => {
            return Err(Problem::at(
                ErrorCode::InvalidRequest,
                format!("{path}/dtype"),
                format!("integers are u32 or u64, not {}", other.name()),
            ))
        }
    };
    super::dense_tensors::check_shape(&shape, &format!("{path}/shape"), max)?;
    DenseIn::Nested { shape, values }.decode(path, 1..=2, max)
}

/// JSON integers in f64 (exact below 2^53), with their shape.
pub(super) struct IntegerTensor {
    pub shape: Vec<usize>,
    pub values: Vec<f64>,
}

pub(super) fn too_large(path: &str, values: u64, max: usize) -> Problem {
    Problem::at(
        ErrorCode::PayloadTooLarge,
        path,
        format!("the answer would hold {values} values; the server answers at most {max} (--max-tensor-elements)"),
    )
}

/// Schema of `positions`: an array of integers, or an array of equally long arrays of
/// them (which JSON Schema cannot state), each from 0 to 2^32; or a resident tensor of
/// them (`{"array": id}`, integers below 2^24 from an f32 tensor, 2^11 from f16, 2^8
/// from bf16, 2^53 from f64).
pub struct PositionsDoc;

impl utoipa::PartialSchema for PositionsDoc {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Ref, Type};
        let rank1 = || {
            ArrayBuilder::new()
                .items(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0))
                        .maximum(Some(MAX_POSITION as u64)),
                )
                .min_items(Some(1))
        };
        OneOfBuilder::new()
            .item(rank1())
            .item(ArrayBuilder::new().items(rank1()).min_items(Some(1)))
            .item(Ref::from_schema_name("ArrayRefDoc"))
            .into()
    }
}

super::array_operands::names_array_ref!(PositionsDoc);

#[utoipa::path(
    post, path = "/embeddings/sinusoidal", tag = "embeddings", operation_id = "embeddings_sinusoidal",
    summary = "Sinusoidal position embeddings",
    description = "The sinusoidal embedding table for positions 0 … num_positions − 1, or its rows for `[S]` / \
        `[B, S]` positions: angle = (p + offset)·scale·base^(−2i/dim) for pair i, its sine and cosine \
        interleaved or split, computed in f64 and rounded once to `out_dtype` (so within half an ulp of \
        the dtype of the closed form, up to f64's error in the angle).",
    request_body(content((SinusoidalRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The embeddings", body = SinusoidalResponse),
        (status = 413, description = "The answer over --max-tensor-elements"),
        (status = 422, description = "invalid_tensor (positions not integers from 0 to 2^32, rank), \
            invalid_parameter (dim, base, scale, offset, both or neither of num_positions and positions), \
            unknown_array, array_mismatch (positions naming an array that is not a tensor of rank 1 or 2)"),
        (status = 503, description = "queue_full, shutting_down, device_unavailable (backend gpu without a device)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn embeddings_sinusoidal(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<SinusoidalRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    DenseIn::resolve_some(&mut req.positions, &arrays, "/positions")?;
    let max = state.settings.config.max_tensor_elements;
    let (backend, encoding) = (req.backend, req.encoding);
    let (job, mut shape) = blocking(move || {
        let (positions, shape) = positions(&mut req, max)?;
        let layout = match req.layout {
            EmbeddingLayout::Interleaved => Layout::Interleaved,
            EmbeddingLayout::Split => Layout::Split,
        };
        let output = Dtype::from(req.out_dtype);
        let job = SinusoidalJob::new(
            &positions, req.dim, req.base, req.scale, req.offset, layout, output,
        )?;
        Ok((job, shape))
    })
    .await?;
    shape.push(job.dim());
    let dtype = TensorDtype::from(job.output);
    let done = state.pool.submit(job, backend, timeout).await?;
    let packed = encoding == OutputEncoding::Base64;
    let body = SinusoidalResponse {
        result: DenseOut::new(shape.clone(), done.output, dtype, packed),
        shape,
        dtype,
    };
    bulk::answer(
        form,
        &body,
        |body| json_body(body, body.result.json_bytes_hint()),
        &done.run,
    )
}

/// The embeddings domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "embeddings",
    description: "Sinusoidal position embeddings",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(embeddings_sinusoidal))
        .routes(routes!(
            super::embedding_tables::embedding_table_create,
            super::embedding_tables::embedding_table_list
        ))
        .routes(routes!(
            super::embedding_tables::embedding_table_get,
            super::embedding_tables::embedding_table_delete
        ))
        .routes(routes!(super::embedding_tables::embedding_table_lookup))
}
