//! `/arrays`: resident arrays. Upload an operand once, then name it from any op as
//! `{"array": "arr_…"}` (`api::array_operands`) instead of sending it again.

use super::array_operands::ArrayScope;
use super::auth::{tenant, Tenant};
use super::byte_strings::{ByteStringDoc, ByteStringIn};
use super::dense_tensors::{DenseAnyDoc, DenseIn, TensorDtype};
use super::elements::{Elements, ElementsDoc, Encoding};
use super::msm::{PointsDoc, PointsIn};
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::rf::recording::{RecordingDoc, RecordingIn};
use super::{blocking, entropy_u64, ApiBody, ApiPath, AppState, IdParam};
use crate::arrays::{now_ms, ArrayData, ArrayKind, ArrayMeta, ArrayRole, Listing, Tensor};
use crate::ops::zk::msm::Curve;
use crate::ops::zk::Field;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// An array to keep. Field elements give `field` and `values`; points give `curve` and
/// `points`; a tensor gives `tensor` (and `dtype` for nested numbers); a recording gives
/// `iq`; bytes give `bytes`. Each takes the
/// operands' own forms and checks (`encoding`, packed tensors, the bulk form's buffers),
/// and may copy another resident array (`{"array": …}`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"kind": "points", "curve": "bn254_g1", "points": [{"x": "1", "y": "2"}, null],
    "name": "srs", "ttl_seconds": 86400}))]
pub struct CreateArrayRequest {
    pub kind: ArrayKind,
    /// With `kind` field_elements: the elements' field.
    pub field: Option<Field>,
    /// With `kind` points: the points' curve.
    pub curve: Option<Curve>,
    /// With `kind` field_elements: canonical elements, as any op's element operand; at
    /// most --max-elements.
    #[schema(value_type = Option<ElementsDoc>)]
    pub values: Option<Elements>,
    /// With `kind` points: affine points as `/zk/msm` takes them, each checked on the
    /// curve (and, for BLS12-381, in the subgroup) here, once; at most --max-elements.
    #[schema(value_type = Option<PointsDoc>)]
    pub points: Option<PointsIn>,
    /// With `kind` tensor: rank 1 to 4, as the tensor ops take their operands (nested
    /// numbers, packed, a bulk buffer), every value finite; at most --max-tensor-elements.
    #[schema(value_type = Option<DenseAnyDoc>)]
    pub tensor: Option<DenseIn>,
    /// With `kind` tensor: its dtype. A packed tensor states its own (this must agree);
    /// nested numbers are rounded to it. Default: the packed tensor's, else f32.
    pub dtype: Option<TensorDtype>,
    /// With `kind` recording: complex samples as `/rf/features` takes them (base64 of
    /// interleaved little-endian f32 I/Q, a `cf32` buffer of one dimension in the bulk
    /// form), every value finite; at most --max-elements samples.
    #[schema(value_type = Option<RecordingDoc>)]
    pub iq: Option<RecordingIn>,
    /// With `kind` bytes: standard base64 (a `u8` buffer of one dimension in the bulk
    /// form), kept as sent: an HE public key, secret key or ciphertext, for `/he/…` to
    /// name.
    #[schema(value_type = Option<ByteStringDoc>)]
    pub bytes: Option<ByteStringIn>,
    /// How `values` or `points` are written.
    #[serde(default)]
    pub encoding: Encoding,
    /// A label for people; at most 200 characters.
    #[schema(max_length = 200)]
    pub name: Option<String>,
    /// Seconds the array lives, from now: 1 to --max-array-ttl; --array-ttl when absent.
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub ttl_seconds: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct ArrayView {
    #[schema(example = "arr_5f0c3a9e1d2b4c6a8e7f9012")]
    pub id: String,
    pub name: Option<String>,
    pub kind: ArrayKind,
    /// Set for field elements.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<Field>,
    /// Set for points.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub curve: Option<Curve>,
    /// Set for tensors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<TensorDtype>,
    /// Set for tensors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<usize>>,
    /// Elements, points, a tensor's values, or a recording's complex samples.
    pub length: usize,
    /// Bytes the quotas count: the field's width per element, x ‖ y per point (their
    /// wire form), 4 per f16, bf16 or f32 value and 8 per f64 (as held in memory: halves
    /// are held widened to f32, and stored on disk as halves), 8 per complex sample.
    pub size_bytes: u64,
    pub created_at: String,
    /// After this instant the array is gone (refused at once, deleted within seconds);
    /// null: kept until it is deleted (an embedding table whose upload gave no
    /// `ttl_seconds`).
    #[schema(required = true)]
    pub expires_at: Option<String>,
    /// `embedding_table` for a table made through `POST /embeddings/tables` (held to the
    /// tables' limits too, and listed at `/embeddings/tables`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub role: Option<ArrayRole>,
    /// Where copies are held: `host` (parsed, in this replica's memory), `disk` (under
    /// --data-dir), `object_store` (in the artifact store, when replicas share arrays:
    /// --database-url with --artifact-store), or only `device`: a field op's or NTT's
    /// result kept on the device that made it (`keep.with_data` false), read back to the
    /// host and the disk on its first read or use off that device. Until then a restart
    /// loses it, as does a fault that rebuilds the device (410 array_lost).
    pub held: Vec<&'static str>,
    /// `GET` here for the values.
    pub data_url: String,
}

#[derive(Serialize, ToSchema)]
pub struct ArrayList {
    pub arrays: Vec<ArrayView>,
}

pub(super) fn view(a: Listing) -> ArrayView {
    let Listing { meta, bytes, held } = a;
    ArrayView {
        expires_at: meta.expires_at(),
        data_url: format!("/arrays/{}/data", meta.id),
        id: meta.id,
        name: meta.name,
        kind: meta.kind,
        field: meta.field,
        curve: meta.curve,
        dtype: meta.dtype.map(TensorDtype::from),
        shape: meta.shape,
        length: meta.len,
        size_bytes: bytes,
        created_at: meta.created_at,
        role: meta.role,
        held: held.to_vec(),
    }
}

pub(super) fn not_found() -> Problem {
    Problem::new(
        ErrorCode::ArrayNotFound,
        "no such resident array for this tenant (it may have expired)",
    )
}

/// The fields the kind takes, each present (`dtype` is optional), and no other kind's:
/// the first that is wrong, by its path.
fn kind_fields(req: &CreateArrayRequest) -> Result<(), Problem> {
    let given = [
        ("/field", req.field.is_some()),
        ("/values", req.values.is_some()),
        ("/curve", req.curve.is_some()),
        ("/points", req.points.is_some()),
        ("/tensor", req.tensor.is_some()),
        ("/dtype", req.dtype.is_some()),
        ("/iq", req.iq.is_some()),
        ("/bytes", req.bytes.is_some()),
    ];
    let (takes, words): (&[&str], _) = match req.kind {
        ArrayKind::FieldElements => (&["/field", "/values"], "field and values"),
        ArrayKind::Points => (&["/curve", "/points"], "curve and points"),
        ArrayKind::Tensor => (&["/tensor", "/dtype"], "tensor (and dtype)"),
        ArrayKind::Recording => (&["/iq"], "iq"),
        ArrayKind::Bytes => (&["/bytes"], "bytes"),
    };
    let misplaced = |path: &str, why: String| Problem::at(ErrorCode::InvalidRequest, path, why);
    if let Some((path, _)) = given.iter().find(|(p, on)| *on && !takes.contains(p)) {
        let kind = req.kind.name();
        return Err(misplaced(
            path,
            format!("{kind} take {words}, not {}", &path[1..]),
        ));
    }
    let absent = |p: &str| given.iter().any(|(g, on)| *g == p && !on);
    if let Some(path) = takes.iter().find(|&&p| p != "/dtype" && absent(p)) {
        return Err(misplaced(path, format!("give the array's {}", &path[1..])));
    }
    Ok(())
}

/// The time to live asked for at `path`, within --max-array-ttl, in milliseconds.
pub(super) fn ttl_ms(state: &AppState, asked: Option<u64>, path: &str) -> Result<u64, Problem> {
    let cfg = &state.settings.config;
    let max = cfg.max_array_ttl.as_secs().max(1);
    match asked {
        None => Ok(u64::try_from(cfg.array_ttl.as_millis()).unwrap_or(u64::MAX)),
        // Saturating: --max-array-ttl may be set past what milliseconds count.
        Some(s) if (1..=max).contains(&s) => Ok(s.saturating_mul(1000)),
        Some(_) => Err(Problem::at(
            ErrorCode::InvalidParameter,
            path,
            format!("1 to {max} seconds (--max-array-ttl)"),
        )),
    }
}

/// A label of at most 200 characters, at `path`.
pub(super) fn check_name(name: &Option<String>, path: &str) -> Result<(), Problem> {
    if name.as_ref().is_some_and(|n| n.chars().count() > 200) {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            path,
            "at most 200 characters",
        ));
    }
    Ok(())
}

/// Stores `data` as a new array of `tenant`'s, living `ttl` milliseconds from now: an
/// upload's and a kept result's way in; what the answer says of it. Blocks on the disk
/// (or the shared catalog and the artifact store).
pub(super) fn store(
    arrays: &crate::arrays::Arrays,
    tenant: String,
    name: Option<String>,
    ttl: u64,
    data: ArrayData,
) -> Result<ArrayView, Problem> {
    store_as(arrays, new_id()?, tenant, name, ttl, data)
}

/// A fresh array id: never reused, so a device's copy under it cannot outlive it.
pub(super) fn new_id() -> Result<String, Problem> {
    new_id_with("arr")
}

/// A fresh array id under `prefix` (`emb` for an embedding table).
pub(super) fn new_id_with(prefix: &str) -> Result<String, Problem> {
    Ok(format!(
        "{prefix}_{:016x}{:08x}",
        entropy_u64()?,
        entropy_u64()? as u32
    ))
}

/// As `store`, under an id made before (`new_id`).
pub(super) fn store_as(
    arrays: &crate::arrays::Arrays,
    id: String,
    tenant: String,
    name: Option<String>,
    ttl: u64,
    data: ArrayData,
) -> Result<ArrayView, Problem> {
    let meta = ArrayMeta::describe(&data, id, tenant, name, now_ms().saturating_add(ttl));
    let array = arrays.add(meta, data)?;
    Ok(view(arrays.listing(&array)))
}

#[utoipa::path(
    post, path = "/arrays", tag = "arrays", operation_id = "array_create",
    summary = "Keep an operand for later requests",
    description = "Validates the values once (canonical field elements; points on their curve and, for \
        BLS12-381, in the prime-order subgroup; tensor values and recording samples finite), keeps them parsed in host memory and on disk under \
        --data-dir (a restart keeps arrays that have not expired; when replicas share arrays, --database-url \
        with --artifact-store, in the artifact store instead, and every replica serves them), and answers their id. Any operand of \
        /zk and /mpc, any tensor operand of /linalg, /nn, /beams and /embeddings/tables, the gradients and values of /dp, the keys and ciphertexts of /he (kind bytes), and the recording of \
        /rf/features, may then be \
        `{\"array\": id}` in place of its values, in JSON and in a bulk header: the op uses the stored \
        values without parsing or checking them again. The tenant's arrays stay \
        within --max-tenant-array-mib and --max-tenant-arrays (422 array_quota_exceeded), all arrays \
        within --max-arrays-mib and --max-arrays (507 arrays_full); each lives `ttl_seconds` (--array-ttl by default).",
    request_body(content((CreateArrayRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 201, description = "Stored", body = ArrayView, links(
            ("get" = (operation_id = "array_get", parameters(("id" = "$response.body#/id")))),
            ("data" = (operation_id = "array_data", parameters(("id" = "$response.body#/id")))),
            ("delete" = (operation_id = "array_delete", parameters(("id" = "$response.body#/id")))),
        )),
        (status = 413, description = "More values, points or samples than --max-elements, a tensor of more values than --max-tensor-elements"),
        (status = 410, description = "array_lost: an operand names a result held only on a device, which lost it"),
        (status = 422, description = "invalid_request (kind and its fields), invalid_field_element, invalid_point, invalid_tensor (rank, ragged, non-finite, base64, a value that overflows dtype; a recording not whole cf32 samples, non-finite, a buffer not cf32 or not one-dimensional), invalid_parameter (name, ttl_seconds, no values, a packed tensor's dtype that is not `dtype`), unknown_array, array_mismatch, array_quota_exceeded"),
        (status = 507, description = "arrays_full"),
    ),
    security((), ("bearer" = []))
)]
pub async fn array_create(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<CreateArrayRequest>,
) -> Result<Response, Problem> {
    check_name(&req.name, "/name")?;
    kind_fields(&req)?;
    let ttl = ttl_ms(&state, req.ttl_seconds, "/ttl_seconds")?;
    DenseIn::resolve_some(&mut req.tensor, &arrays, "/tensor")?;
    if let Some(iq) = &mut req.iq {
        iq.resolve(&arrays, "/iq")?;
        let samples = iq.approx_samples();
        if samples > state.settings.config.max_elements {
            return Err(Problem::at(
                ErrorCode::PayloadTooLarge,
                "/iq",
                format!(
                    "{samples} samples is more than the server's limit of {} (--max-elements)",
                    state.settings.config.max_elements
                ),
            ));
        }
    }
    if let Some(b) = &mut req.bytes {
        b.resolve(&arrays, "/bytes")?;
    }
    let max = state.settings.config.max_elements;
    let max_tensor = state.settings.config.max_tensor_elements;
    let (st, tenant) = (state.clone(), tenant(&who));
    let v = blocking(move || {
        let given = (
            req.field, req.values, req.curve, req.points, req.tensor, req.iq,
        );
        let (data, path) = match (given, req.bytes) {
            (_, Some(b)) => {
                let b = b.bytes(crate::wire::Dtype::U8, ErrorCode::InvalidRequest, "/bytes")?;
                (ArrayData::Bytes(b), "/bytes")
            }
            (given, None) => match given {
                (Some(field), Some(values), None, None, None, None) => {
                    let v = values.decode(field, req.encoding, "/values", max, &arrays)?;
                    (ArrayData::FieldElements(Arc::new(v)), "/values")
                }
                (None, None, Some(curve), Some(points), None, None) => {
                    let p = points.decode(curve, req.encoding, max, "/points", &arrays)?;
                    (ArrayData::Points(p), "/points")
                }
                (None, None, None, None, Some(t), None) => {
                    let dtype = req.dtype.or(t.packed_dtype()).unwrap_or(TensorDtype::F32);
                    let t = super::linalg::operand(t, "/tensor", dtype, 1..=4, max_tensor)?;
                    let tensor = Tensor::new(dtype.into(), t.shape, t.values);
                    (ArrayData::Tensor(Arc::new(tensor)), "/tensor")
                }
                (None, None, None, None, None, Some(iq)) => {
                    (ArrayData::Recording(iq.decode("/iq")?), "/iq")
                }
                _ => unreachable!("kind_fields checked the kind's fields"),
            },
        };
        if data.is_empty() {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                path,
                "give at least one value",
            ));
        }
        store(&st.arrays, tenant, req.name, ttl, data)
    })
    .await?;
    let location = HeaderValue::from_str(&format!("/arrays/{}", v.id)).expect("ascii id");
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(v)).into_response())
}

#[utoipa::path(
    get, path = "/arrays", tag = "arrays", operation_id = "array_list",
    summary = "This tenant's resident arrays, by id",
    responses((status = 200, description = "The arrays that have not expired", body = ArrayList)),
    security((), ("bearer" = []))
)]
pub async fn array_list(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
) -> Result<Json<ArrayList>, Problem> {
    let arrays = state.arrays.list(&tenant(&who))?;
    Ok(Json(ArrayList {
        arrays: arrays.into_iter().map(view).collect(),
    }))
}

#[utoipa::path(
    get, path = "/arrays/{id}", tag = "arrays", operation_id = "array_get",
    summary = "A resident array's kind, length and expiry",
    params(("id" = String, Path, description = "Array id")),
    responses(
        (status = 200, description = "The array", body = ArrayView),
        (status = 404, description = "array_not_found (also for another tenant's array, or an expired one)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn array_get(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<Json<ArrayView>, Problem> {
    let a = state
        .arrays
        .get(&tenant(&who), &id)?
        .ok_or_else(not_found)?;
    Ok(Json(view(state.arrays.listing(&a))))
}

#[utoipa::path(
    delete, path = "/arrays/{id}", tag = "arrays", operation_id = "array_delete",
    summary = "Delete a resident array and its files",
    description = "Requests that named the array before it was deleted finish with its values; later ones \
        get 422 unknown_array.",
    params(("id" = String, Path, description = "Array id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "array_not_found"),
    ),
    security((), ("bearer" = []))
)]
pub async fn array_delete(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<StatusCode, Problem> {
    let (st, t) = (state.clone(), tenant(&who));
    let removed = blocking(move || Ok(st.arrays.remove(&t, &id)?)).await?;
    if !removed {
        return Err(not_found());
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The arrays domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "arrays",
    description: "Resident arrays: operands uploaded once and named by id from any op",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(utoipa_axum::routes!(array_create, array_list))
        .routes(utoipa_axum::routes!(array_get, array_delete))
        .routes(utoipa_axum::routes!(super::array_data::array_data))
}
