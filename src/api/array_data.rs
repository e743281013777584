//! `GET /arrays/{id}/data`: a resident array's values, in JSON or the bulk form.

use super::arrays::not_found;
use super::auth::{tenant, Tenant};
use super::byte_strings::ByteStringOut;
use super::dense_tensors::{DenseAnyOutDoc, DenseOut, TensorDtype};
use super::elements::{ElementsOut, ElementsOutDoc, Encoding};
use super::extract::ApiQuery;
use super::msm::{AffinePointDoc, PointOut};
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::IdParam;
use super::{blocking, bulk, json_body, AnswerForm, ApiPath, AppState};
use crate::arrays::{ArrayData, ArrayKind};
use crate::ops::zk::msm::{Curve, Points};
use crate::ops::zk::Field;
use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use serde::{Deserialize, Serialize, Serializer};
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ArrayDataQuery {
    /// How the values are written in a JSON answer (decimal by default, also when
    /// empty; a tensor: decimal as nested numbers, base64 packed in its dtype; a
    /// recording: base64 only, its default); a bulk
    /// answer (`Accept: application/vnd.gpu-ops.bulk`) carries them as one buffer.
    #[param(inline)]
    pub encoding: Option<Encoding>,
}

/// A resident array's values.
#[derive(Serialize, ToSchema)]
pub struct ArrayDataResponse {
    pub id: String,
    pub kind: ArrayKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<Field>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub curve: Option<Curve>,
    pub encoding: Encoding,
    /// Field elements, as an op answers them.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<ElementsOutDoc>)]
    pub values: Option<ElementsOut>,
    /// Points as `/zk/msm` takes them: `{x, y}` objects (`null` for the identity), one
    /// base64 string, or in a bulk answer one u64 buffer shaped `[n, 2, words]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<PointsOutDoc>)]
    pub points: Option<PointsOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<TensorDtype>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<usize>>,
    /// A tensor: nested numbers, or packed in its dtype (`encoding` base64); in a bulk
    /// answer one buffer of its dtype.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<DenseAnyOutDoc>)]
    pub tensor: Option<DenseOut>,
    /// A recording: base64 of its interleaved little-endian f32 I/Q (`cf32_le`), as
    /// `/rf/iq` answers one; in a bulk answer one `cf32` buffer `[samples]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub iq: Option<ByteStringOut>,
    /// Bytes: base64; in a bulk answer one `u8` buffer.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub bytes: Option<ByteStringOut>,
}

/// Documentation form of points in an answer.
#[derive(ToSchema)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum PointsOutDoc {
    /// `{x, y}` objects in `encoding` (decimal or hex), `null` for the identity.
    List(Vec<Option<AffinePointDoc>>),
    /// With `"encoding": "base64"`: x ‖ y per point, little-endian, all zero for the
    /// identity.
    Base64(String),
}

/// Points written as `/zk/msm` reads them.
pub struct PointsOut {
    points: Arc<Points>,
    encoding: Encoding,
}

impl Serialize for PointsOut {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let p = &self.points;
        if bulk::answering() {
            let words = (p.curve().coordinate_bytes() / 8) as u64;
            let shape = vec![p.len() as u64, 2, words];
            let bytes = bytes::Bytes::from(p.to_le_bytes());
            return bulk::push_answer_buffer(crate::wire::Dtype::U64, shape, bytes).serialize(s);
        }
        if self.encoding == Encoding::Base64 {
            return super::packed::base64_json_string(&p.to_le_bytes()).serialize(s);
        }
        let mut seq = s.serialize_seq(Some(p.len()))?;
        for i in 0..p.len() {
            seq.serialize_element(&PointOut::of(p, i, self.encoding))?;
        }
        seq.end()
    }
}

#[utoipa::path(
    get, path = "/arrays/{id}/data", tag = "arrays", operation_id = "array_data",
    summary = "A resident array's values",
    description = "The values as stored (a result held only on a device is read back first, then kept on the host and disk), in JSON (`encoding`) or, with `Accept: application/vnd.gpu-ops.bulk`, \
        as one buffer of the bulk form: field elements in their field's dtype, points as u64 words `[n, 2, w]`, \
        a tensor in its dtype and shape, a recording as cf32 `[samples]`, bytes as u8 `[length]`.",
    params(("id" = String, Path, description = "Array id"), ArrayDataQuery),
    responses(
        (status = 200, description = "The values", body = ArrayDataResponse,
            content((ArrayDataResponse = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
        (status = 404, description = "array_not_found"),
        (status = 410, description = "array_lost: the array was held only on a device, which lost it"),
        (status = 422, description = "invalid_parameter (encoding: hex for a tensor; other than base64 for a recording)"),
        (status = 504, description = "deadline_exceeded: the array is held only on a device with no lease free within --job-timeout; still held there"),
    ),
    security((), ("bearer" = []))
)]
pub async fn array_data(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
    ApiQuery(q): ApiQuery<ArrayDataQuery>,
    form: AnswerForm,
) -> Result<Response, Problem> {
    let a = state
        .arrays
        .get(&tenant(&who), &id)?
        .ok_or_else(not_found)?;
    // A result held on a device is read back now, and kept on the host from then on.
    let a = state.arrays.materialised(a)?;
    let encoding = q.encoding.unwrap_or_default();
    if matches!(a.data, ArrayData::Tensor(_)) && encoding == Encoding::Hex {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/encoding",
            "a tensor reads back as decimal (nested numbers) or base64 (packed)",
        ));
    }
    let recording = matches!(a.data, ArrayData::Recording(_) | ArrayData::Bytes(_));
    if recording && q.encoding.is_some_and(|e| e != Encoding::Base64) {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/encoding",
            "a recording (cf32_le) or bytes read back as base64, the default for them",
        ));
    }
    // Recordings and bytes are base64 whatever the default for other kinds.
    let encoding = if recording {
        Encoding::Base64
    } else {
        encoding
    };
    blocking(move || {
        let (mut values, mut points, mut tensor, mut iq) = (None, None, None, None);
        let mut bytes = None;
        match &a.data {
            ArrayData::FieldElements(v) => {
                values = Some(ElementsOut {
                    values: (**v).clone(),
                    encoding,
                })
            }
            ArrayData::Points(p) => {
                points = Some(PointsOut {
                    points: p.clone(),
                    encoding,
                })
            }
            ArrayData::Tensor(t) => {
                let (shape, values) = (t.shape.clone(), t.values.clone());
                let packed = encoding == Encoding::Base64;
                tensor = Some(DenseOut::new(shape, values, t.dtype.into(), packed))
            }
            ArrayData::Recording(r) => {
                iq = Some(ByteStringOut {
                    dtype: crate::wire::Dtype::Cf32,
                    bytes: r.le_bytes(),
                })
            }
            ArrayData::Bytes(b) => {
                bytes = Some(ByteStringOut {
                    dtype: crate::wire::Dtype::U8,
                    bytes: b.clone(),
                })
            }
            ArrayData::Held(_) => {
                let why = "the array's values were not read back from the device holding them";
                return Err(Problem::new(ErrorCode::Internal, why));
            }
        };
        let base64 = |b: &ByteStringOut| b.bytes.len() / 3 * 4 + 4;
        let hint = values.as_ref().map_or(256, ElementsOut::json_size_hint)
            + tensor.as_ref().map_or(0, DenseOut::json_bytes_hint)
            + iq.as_ref().map_or(0, base64)
            + bytes.as_ref().map_or(0, base64);
        let body = ArrayDataResponse {
            id: a.meta.id.clone(),
            kind: a.meta.kind,
            field: a.meta.field,
            curve: a.meta.curve,
            encoding,
            values,
            points,
            dtype: a.meta.dtype.map(TensorDtype::from),
            shape: a.meta.shape.clone(),
            tensor,
            iq,
            bytes,
        };
        bulk::reply(form, &body, |b| json_body(b, hint))
    })
    .await
}
