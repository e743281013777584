//! Operands that name a resident array (`{"array": "arr_…"}`) instead of carrying data,
//! in a JSON body and in a bulk body's header alike, and their resolution against the
//! requesting tenant's arrays (`ArrayScope`): a missing or expired array is 422
//! unknown_array, one of another kind, field or curve 422 array_mismatch, both at the
//! operand's `/array`.

use super::auth::Tenant;
use super::problem::{ErrorCode, Problem};
use super::AppState;
use crate::arrays::{ArrayData, Arrays, HeldArray, Recording, ResidentArray, Tensor};
use crate::ops::linalg::held::HeldTensor;
use crate::ops::linalg::Compute;
use crate::ops::zk::held::FieldSource;
use crate::ops::zk::msm::{Curve, Points};
use crate::ops::zk::{Field, FieldVec};
use crate::wire::{BufferRef, Dtype};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use bytes::Bytes;
use serde::Deserialize;
use std::sync::Arc;

/// Documentation form of an operand that names a resident array.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
#[serde(deny_unknown_fields)]
pub struct ArrayRefDoc {
    /// The id `POST /arrays` answered: the array's values stand here, as if sent.
    #[schema(example = "arr_5f0c3a9e1d2b4c6a8e7f9012")]
    array: String,
}

/// An operand's object form: a bulk body's buffer, or a resident array's id.
pub(super) enum ObjectOperand {
    Buffer(BufferRef, Bytes),
    Array(String),
}

/// Either object form's fields, told apart by which are present.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OperandFields {
    array: Option<String>,
    dtype: Option<Dtype>,
    shape: Option<Vec<u64>>,
    byte_offset: Option<u64>,
    byte_length: Option<u64>,
}

/// `ToSchema` for a documentation type whose schema refers to `ArrayRefDoc`: registers
/// that schema with it.
macro_rules! names_array_ref {
    ($name:ty) => {
        impl utoipa::ToSchema for $name {
            fn schemas(
                schemas: &mut Vec<(
                    String,
                    utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
                )>,
            ) {
                use crate::api::array_operands::ArrayRefDoc;
                use utoipa::PartialSchema;
                schemas.push((ArrayRefDoc::name().into(), ArrayRefDoc::schema()));
            }
        }
    };
}
pub(crate) use names_array_ref;

/// Reads an operand's object form from `map`: `{"array": id}`, or a buffer descriptor
/// (whose bytes come from the bulk body being parsed).
pub(super) fn object_operand<'de, A: serde::de::MapAccess<'de>>(
    map: A,
) -> Result<ObjectOperand, A::Error> {
    use serde::de::Error;
    let f = OperandFields::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
    if let Some(id) = f.array {
        if f.dtype.is_some()
            || f.shape.is_some()
            || f.byte_offset.is_some()
            || f.byte_length.is_some()
        {
            return Err(A::Error::custom(
                "an array reference takes only `array`, no buffer descriptor fields",
            ));
        }
        return Ok(ObjectOperand::Array(id));
    }
    let b = BufferRef {
        dtype: f.dtype.ok_or_else(|| A::Error::missing_field("dtype"))?,
        shape: f.shape.ok_or_else(|| A::Error::missing_field("shape"))?,
        byte_offset: f
            .byte_offset
            .ok_or_else(|| A::Error::missing_field("byte_offset"))?,
        byte_length: f
            .byte_length
            .ok_or_else(|| A::Error::missing_field("byte_length"))?,
    };
    let bytes = super::bulk::buffer(b.byte_offset, b.byte_length).map_err(A::Error::custom)?;
    Ok(ObjectOperand::Buffer(b, bytes))
}

/// The requesting tenant's arrays, as operands resolve against them.
#[derive(Clone)]
pub struct ArrayScope {
    arrays: Arc<Arrays>,
    tenant: String,
}

impl FromRequestParts<Arc<AppState>> for ArrayScope {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Problem> {
        let tenant = parts
            .extensions
            .get::<Tenant>()
            .map_or_else(String::new, |Tenant(t)| t.clone());
        Ok(ArrayScope::new(state.arrays.clone(), tenant))
    }
}

impl ArrayScope {
    pub(super) fn new(arrays: Arc<Arrays>, tenant: String) -> Self {
        Self { arrays, tenant }
    }

    /// A scope over an empty store of its own, for unit tests of the decoders.
    #[cfg(test)]
    pub(super) fn empty(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gpu-ops-scope-{}-{name}", std::process::id()));
        let limits = crate::arrays::ArrayLimits {
            tenant_bytes: 1 << 20,
            tenant_count: 10,
            server_bytes: 1 << 20,
            server_count: 10,
            read_back_wait: std::time::Duration::from_secs(60),
            tables: crate::arrays::TableLimits::NONE,
        };
        let arrays = Arrays::open(dir, limits, crate::arrays::ArrayMetrics::unregistered());
        Self::new(
            Arc::new(arrays.expect("a scratch directory")),
            String::new(),
        )
    }

    /// The store and the tenant it stands for.
    pub(super) fn parts(&self) -> (&Arrays, &str) {
        (&self.arrays, &self.tenant)
    }

    /// The array `id` names for the operand at `path`.
    fn resolve(&self, id: &str, path: &str) -> Result<Arc<ResidentArray>, Problem> {
        self.arrays
            .use_operand(&self.tenant, id)
            .map_err(|e| at_operand(e.into(), path))?
            .ok_or_else(|| unknown(id, path))
    }

    /// The array `id` names for the operand at `path`, a result a device holds left
    /// there.
    fn where_held(&self, id: &str, path: &str) -> Result<Arc<ResidentArray>, Problem> {
        self.arrays
            .use_operand_where_held(&self.tenant, id)
            .map_err(|e| at_operand(e.into(), path))?
            .ok_or_else(|| unknown(id, path))
    }

    /// The elements of `field` the array `id` holds.
    pub(super) fn field_elements(
        &self,
        id: &str,
        field: Field,
        path: &str,
    ) -> Result<Arc<FieldVec>, Problem> {
        let a = self.resolve(id, path)?;
        match &a.data {
            ArrayData::FieldElements(v) if v.field() == field => Ok(v.clone()),
            _ => Err(mismatch(&a, &format!("{} elements", field.name()), path)),
        }
    }

    /// The elements of `field` the array `id` holds, where they are held: a result a
    /// device holds stays there; host values carry the array's device key, so a device
    /// keeps its upload of them for the next use.
    pub(super) fn field_source(
        &self,
        id: &str,
        field: Field,
        path: &str,
    ) -> Result<FieldSource, Problem> {
        let a = self.where_held(id, path)?;
        match &a.data {
            ArrayData::Held(HeldArray::Field(h)) if h.field() == field => {
                Ok(FieldSource::Held(h.clone()))
            }
            ArrayData::FieldElements(v) if v.field() == field => Ok(FieldSource::Host {
                values: FieldVec::clone(v),
                key: Some(crate::arrays::device_key(id)),
            }),
            _ => Err(mismatch(&a, &format!("{} elements", field.name()), path)),
        }
    }

    /// The elements, of whichever field, the array `id` holds (as plain integers).
    pub(super) fn any_field_elements(
        &self,
        id: &str,
        path: &str,
    ) -> Result<Arc<FieldVec>, Problem> {
        let a = self.resolve(id, path)?;
        match &a.data {
            ArrayData::FieldElements(v) => Ok(v.clone()),
            _ => Err(mismatch(&a, "field elements", path)),
        }
    }

    /// The tensor the array `id` holds (its dtype and shape are the caller's to check).
    pub(super) fn tensor(&self, id: &str, path: &str) -> Result<Arc<Tensor>, Problem> {
        let a = self.resolve(id, path)?;
        match &a.data {
            ArrayData::Tensor(t) => Ok(t.clone()),
            _ => Err(mismatch(&a, "a tensor", path)),
        }
    }

    /// The tensor the array `id` holds, where it is held: a product a device holds stays
    /// there when `compute` takes its values as they are (`HeldTensor::serves`); any
    /// other is read back (`tensor`).
    pub(super) fn tensor_where_held(
        &self,
        id: &str,
        compute: Compute,
        path: &str,
    ) -> Result<TensorOperand, Problem> {
        let a = self.where_held(id, path)?;
        match &a.data {
            ArrayData::Held(HeldArray::Tensor(h)) if h.serves(compute) => {
                Ok(TensorOperand::Held(h.clone()))
            }
            ArrayData::Tensor(t) => Ok(TensorOperand::Host(t.clone())),
            // A held tensor is never f64, and f64 products take f64 operands only: refused
            // where it lies, not read back (to the host and disk) for a request that fails.
            ArrayData::Held(HeldArray::Tensor(h)) if compute == Compute::F64 => Err(Problem::at(
                ErrorCode::ArrayMismatch,
                format!("{path}/array"),
                format!(
                    "the array is a {} tensor held on a device; compute f64 takes f64 tensors",
                    h.dtype().name()
                ),
            )),
            ArrayData::Held(HeldArray::Tensor(_)) => {
                let read = self.arrays.materialised(a.clone());
                let a = read.map_err(|e| at_operand(e.into(), path))?;
                match &a.data {
                    ArrayData::Tensor(t) => Ok(TensorOperand::Host(t.clone())),
                    _ => Err(mismatch(&a, "a tensor", path)),
                }
            }
            _ => Err(mismatch(&a, "a tensor", path)),
        }
    }

    /// The bytes the array `id` holds.
    pub(super) fn bytes(&self, id: &str, path: &str) -> Result<bytes::Bytes, Problem> {
        let a = self.resolve(id, path)?;
        match &a.data {
            ArrayData::Bytes(b) => Ok(b.clone()),
            _ => Err(mismatch(&a, "bytes", path)),
        }
    }

    /// The IQ recording the array `id` holds.
    pub(super) fn recording(&self, id: &str, path: &str) -> Result<Arc<Recording>, Problem> {
        let a = self.resolve(id, path)?;
        match &a.data {
            ArrayData::Recording(r) => Ok(r.clone()),
            _ => Err(mismatch(&a, "a recording", path)),
        }
    }

    /// The points of `curve` the array `id` holds.
    pub(super) fn points(
        &self,
        id: &str,
        curve: Curve,
        path: &str,
    ) -> Result<Arc<Points>, Problem> {
        let a = self.resolve(id, path)?;
        match &a.data {
            ArrayData::Points(p) if p.curve() == curve => Ok(p.clone()),
            _ => Err(mismatch(&a, &format!("{} points", curve.name()), path)),
        }
    }
}

/// A resident tensor, where it is held.
pub(super) enum TensorOperand {
    Host(Arc<Tensor>),
    Held(Arc<HeldTensor>),
}

fn unknown(id: &str, path: &str) -> Problem {
    Problem::at(
        ErrorCode::UnknownArray,
        format!("{path}/array"),
        format!("{id:.40}: no resident array of this tenant has this id (it may have expired)"),
    )
}

/// A refusal about the array an operand names (lost, or held by a busy device), pointed
/// at that operand.
fn at_operand(p: Problem, path: &str) -> Problem {
    if p.code != ErrorCode::ArrayLost && p.code != ErrorCode::DeadlineExceeded {
        return p;
    }
    Problem::at(p.code, format!("{path}/array"), p.detail)
}

/// What an array holds, in words.
pub(super) fn describe(a: &ResidentArray) -> String {
    match &a.data {
        ArrayData::FieldElements(v) => format!("{} {} elements", v.len(), v.field().name()),
        ArrayData::Points(p) => format!("{} {} points", p.len(), p.curve().name()),
        ArrayData::Tensor(t) => format!("a {} tensor shaped {:?}", t.dtype.name(), t.shape),
        ArrayData::Recording(r) => format!("a recording of {} samples", r.len()),
        ArrayData::Bytes(b) => format!("{} bytes", b.len()),
        ArrayData::Held(h) => h.describe(),
    }
}

pub(super) fn mismatch(a: &ResidentArray, want: &str, path: &str) -> Problem {
    Problem::at(
        ErrorCode::ArrayMismatch,
        format!("{path}/array"),
        format!(
            "{} holds {}; this operand takes {want}",
            a.meta.id,
            describe(a)
        ),
    )
}
