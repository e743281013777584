//! `/embeddings/tables`: resident embedding tables, kept as resident arrays of kind
//! tensor (f32, `[V, D]`, role `embedding_table`): upload once, then look rows up by id; a
//! device keeps the table cached between lookups. A lookup also takes any resident tensor
//! of rank 2 whose values are held as f32 (f16, bf16, f32) as its table.

use super::array_operands::ArrayScope;
use super::arrays::{check_name, new_id_with, ttl_ms};
use super::auth::{tenant, Tenant};
use super::dense_tensors::{Dense2Doc, DenseIn, DenseOut, DenseOutDoc, TensorDtype};
use super::embeddings::{integer_tensor, too_large, EmbeddingDtype, OutputEncoding, PositionsDoc};
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::{
    blocking, bulk, job_timeout, json_body, AnswerForm, ApiBody, ApiPath, AppState, IdParam,
};
use crate::arrays::{
    now_ms, ArrayData, ArrayMeta, ArrayRole, Listing, ResidentArray, Tensor, NEVER,
};
use crate::backend::BackendChoice;
use crate::ops::linalg::{Dtype, LookupJob, Values};
use crate::wire::Array;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// A table to keep: `[V, D]` values.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"table": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], "name": "tokens"}))]
pub struct CreateTableRequest {
    /// `[V, D]`: V rows (ids 0 … V − 1) of D values, nested or packed (any dtype; kept as
    /// f32). At most --max-tensor-elements values.
    #[schema(value_type = Dense2Doc)]
    pub table: DenseIn,
    /// A label for people; at most 200 characters.
    #[schema(max_length = 200)]
    pub name: Option<String>,
    /// Seconds the table lives, from now: 1 to --max-array-ttl. Absent: kept until it is
    /// deleted.
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub ttl_seconds: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct TableView {
    /// Also its id as a resident array (`/arrays/{id}`, and `{"array": id}` wherever an
    /// operand takes a tensor).
    #[schema(example = "emb_5f0c3a9e1d2b4c6a8e7f9012")]
    pub id: String,
    pub name: Option<String>,
    /// Rows.
    pub vocab: usize,
    /// Values per row.
    pub dim: usize,
    /// Host and disk bytes (4 per value).
    pub size_bytes: u64,
    pub created_at: String,
    /// After this instant the table is gone; null: kept until it is deleted.
    #[schema(required = true)]
    pub expires_at: Option<String>,
    /// Ordinals of the devices that hold a copy now (cached on first use, least recently
    /// used out under --gpu-table-cache-mib).
    pub resident_on: Vec<usize>,
    /// `POST` here to look rows up.
    pub lookup_url: String,
}

#[derive(Serialize, ToSchema)]
pub struct TableList {
    pub tables: Vec<TableView>,
}

fn view(state: &AppState, meta: &ArrayMeta, size_bytes: u64) -> TableView {
    let key = crate::arrays::device_key(&meta.id);
    let shape = meta.shape.as_deref().unwrap_or(&[0, 0]);
    TableView {
        id: meta.id.clone(),
        name: meta.name.clone(),
        vocab: shape[0],
        dim: shape.get(1).copied().unwrap_or(0),
        size_bytes,
        created_at: meta.created_at.clone(),
        expires_at: meta.expires_at(),
        resident_on: state
            .backends
            .gpus()
            .iter()
            .filter(|g| g.holds_table(&key))
            .map(|g| g.info.ordinal)
            .collect(),
        lookup_url: format!("/embeddings/tables/{}/lookup", meta.id),
    }
}

fn not_found() -> Problem {
    Problem::new(
        ErrorCode::EmbeddingTableNotFound,
        "no such embedding table for this tenant",
    )
}

/// The tenant's table `id`, described: an array made through `POST /embeddings/tables`
/// (the others are at `/arrays`). Its values are not read (shared, one catalog row).
fn kept_table(state: &AppState, tenant: &str, id: &str) -> Result<Listing, Problem> {
    state
        .arrays
        .listing_of(tenant, id)?
        .filter(|a| a.meta.is_table())
        .ok_or_else(not_found)
}

/// A table's rows and values: a resident tensor of rank 2 held as f32.
fn rows_of(a: &ResidentArray) -> Result<(usize, usize, Array<f32>), Problem> {
    match &a.data {
        ArrayData::Tensor(t) => match (&t.values, t.shape.as_slice()) {
            // Ids are 32-bit on both backends.
            (Values::F32(_), &[vocab, _]) if vocab as u64 > 1 << 32 => Err(Problem::new(
                ErrorCode::ArrayMismatch,
                format!("{} has {vocab} rows: a table has at most 2^32", a.meta.id),
            )),
            (Values::F32(v), &[vocab, dim]) => Ok((vocab, dim, v.clone())),
            (Values::F64(_), &[_, _]) => Err(Problem::new(
                ErrorCode::ArrayMismatch,
                format!(
                    "{} is an f64 tensor: a lookup gathers rows held as f32 (upload it as f32, f16 or bf16)",
                    a.meta.id
                ),
            )),
            (_, shape) => Err(Problem::new(
                ErrorCode::ArrayMismatch,
                format!(
                    "{} is a tensor of rank {}: a table has rank 2 ([V, D])",
                    a.meta.id,
                    shape.len()
                ),
            )),
        },
        _ => Err(Problem::new(
            ErrorCode::ArrayMismatch,
            format!(
                "{} holds {}: a table is a tensor of rank 2",
                a.meta.id,
                a.meta.kind.name()
            ),
        )),
    }
}

#[utoipa::path(
    post, path = "/embeddings/tables", tag = "embeddings", operation_id = "embedding_table_create",
    summary = "Keep an embedding table for lookups",
    description = "Stores a `[V, D]` table as a resident array (kind tensor, f32; in host memory and on disk \
        under --data-dir, so it survives a restart; in the artifact store when replicas share arrays) and \
        answers its id. Lookups by id then send only token ids; a device keeps the table cached between \
        them. It is kept until deleted unless `ttl_seconds` says otherwise. The tenant's tables together \
        stay within --max-tenant-embedding-mib and --max-tenant-embedding-tables (422 \
        embedding_quota_exceeded), all tables within --max-embedding-tables-mib (507 \
        embedding_tables_full), and, as arrays, within the arrays' quotas (422 array_quota_exceeded, \
        507 arrays_full).",
    request_body(content((CreateTableRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 201, description = "Stored", body = TableView, links(
            ("get" = (operation_id = "embedding_table_get", parameters(("id" = "$response.body#/id")))),
            ("lookup" = (operation_id = "embedding_table_lookup", parameters(("id" = "$response.body#/id")))),
            ("delete" = (operation_id = "embedding_table_delete", parameters(("id" = "$response.body#/id")))),
        )),
        (status = 413, description = "The table over --max-tensor-elements"),
        (status = 422, description = "invalid_tensor (rank, not finite), invalid_parameter (name, ttl_seconds), \
            embedding_quota_exceeded, array_quota_exceeded"),
        (status = 507, description = "embedding_tables_full, arrays_full"),
    ),
    security((), ("bearer" = []))
)]
pub async fn embedding_table_create(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    arrays: super::array_operands::ArrayScope,
    ApiBody(mut req): ApiBody<CreateTableRequest>,
) -> Result<Response, Problem> {
    req.table.resolve(&arrays, "/table")?;
    check_name(&req.name, "/name")?;
    let expires_at_ms = match req.ttl_seconds {
        None => NEVER,
        asked => now_ms().saturating_add(ttl_ms(&state, asked, "/ttl_seconds")?),
    };
    let max = state.settings.config.max_tensor_elements;
    let st = state.clone();
    let tenant = tenant(&who);
    let (meta, bytes) = blocking(move || {
        let t = req.table.decode("/table", 2..=2, max)?;
        if t.shape[0] as u64 > 1 << 32 {
            // Ids are 32-bit on both backends.
            return Err(Problem::at(
                ErrorCode::InvalidTensor,
                "/table/shape",
                "at most 2^32 rows",
            ));
        }
        let values = Values::F32(t.values.into_f32_array());
        if let Some(i) = values.first_non_finite() {
            return Err(Problem::at(
                ErrorCode::InvalidTensor,
                "/table",
                format!("value {i} (row-major) overflows f32"),
            ));
        }
        let data = ArrayData::Tensor(Arc::new(Tensor::new(Dtype::F32, t.shape, values)));
        let id = new_id_with("emb")?;
        let mut meta = ArrayMeta::describe(&data, id, tenant, req.name, expires_at_ms);
        meta.role = Some(ArrayRole::EmbeddingTable);
        let table = st.arrays.add(meta, data)?;
        Ok((table.meta.clone(), table.bytes()))
    })
    .await?;
    let v = view(&state, &meta, bytes);
    let location =
        HeaderValue::from_str(&format!("/embeddings/tables/{}", v.id)).expect("ascii id");
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(v)).into_response())
}

#[utoipa::path(
    get, path = "/embeddings/tables", tag = "embeddings", operation_id = "embedding_table_list",
    summary = "This tenant's embedding tables, by id",
    description = "The tables made through `POST /embeddings/tables` that have not expired (other \
        tensors a lookup can take are listed at `/arrays`).",
    responses((status = 200, description = "The tables", body = TableList)),
    security((), ("bearer" = []))
)]
pub async fn embedding_table_list(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
) -> Result<Json<TableList>, Problem> {
    let arrays = state.arrays.list(&tenant(&who))?;
    let tables = arrays
        .iter()
        .filter(|a| a.meta.is_table())
        .map(|a| view(&state, &a.meta, a.bytes))
        .collect();
    Ok(Json(TableList { tables }))
}

#[utoipa::path(
    get, path = "/embeddings/tables/{id}", tag = "embeddings", operation_id = "embedding_table_get",
    summary = "An embedding table's shape and where it is resident",
    params(("id" = String, Path, description = "Table id")),
    responses(
        (status = 200, description = "The table", body = TableView),
        (status = 404, description = "embedding_table_not_found (also for another tenant's table, an \
            expired one, or an array not made as a table)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn embedding_table_get(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<Json<TableView>, Problem> {
    let t = kept_table(&state, &tenant(&who), &id)?;
    Ok(Json(view(&state, &t.meta, t.bytes)))
}

#[utoipa::path(
    delete, path = "/embeddings/tables/{id}", tag = "embeddings", operation_id = "embedding_table_delete",
    summary = "Delete an embedding table, its files and its device copies",
    params(("id" = String, Path, description = "Table id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "embedding_table_not_found (an array not made as a table is deleted at /arrays)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn embedding_table_delete(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<StatusCode, Problem> {
    let (st, t) = (state.clone(), tenant(&who));
    // Device copies go with the array (`Arrays::on_removed`).
    let removed = blocking(move || {
        kept_table(&st, &t, &id)?;
        Ok(st.arrays.remove(&t, &id)?)
    })
    .await?;
    if !removed {
        return Err(not_found());
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Row ids to look up.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ids": [[0, 2], [1, 1]]}))]
pub struct LookupRequest {
    /// `[S]` or `[B, S]` ids: JSON integers from 0 to V − 1, or a resident tensor of them
    /// (`{"array": id}`; ids below 2^24 from an f32 tensor, 2^11 from f16, 2^8 from bf16).
    #[schema(value_type = PositionsDoc)]
    pub ids: DenseIn,
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
pub struct LookupResponse {
    /// `[S, D]` or `[B, S, D]`.
    #[schema(value_type = DenseOutDoc)]
    pub result: DenseOut,
    pub shape: Vec<usize>,
    pub dtype: TensorDtype,
}

#[utoipa::path(
    post, path = "/embeddings/tables/{id}/lookup", tag = "embeddings", operation_id = "embedding_table_lookup",
    summary = "Rows of a resident embedding table",
    description = "Row `ids[…]` of the table for each id, exactly as stored (a gather), rounded to `out_dtype`. \
        The table is one made through `POST /embeddings/tables`, or any resident tensor of rank 2 in f16, \
        bf16 or f32 (`/arrays`). On a device the table is uploaded on its first use there and kept (least \
        recently used out under --gpu-table-cache-mib); later lookups send only the ids.",
    params(("id" = String, Path, description = "Table id, or the id of a resident tensor of rank 2")),
    request_body(content((LookupRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The rows", body = LookupResponse),
        (status = 404, description = "embedding_table_not_found"),
        (status = 413, description = "The answer over --max-tensor-elements"),
        (status = 422, description = "invalid_tensor (ids not JSON integers from 0 to V − 1, rank), \
            unknown_array, array_mismatch (ids naming an array that is not a tensor of rank 1 or 2; a \
            table id naming an array that is not a tensor of rank 2 in f16, bf16 or f32)"),
        (status = 503, description = "queue_full, shutting_down, device_unavailable (backend gpu without a device)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn embedding_table_lookup(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<LookupRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    req.ids.resolve(&arrays, "/ids")?;
    // Where held: a kept field result (held on a device) is no table, and is refused
    // without being read back first.
    let table = state
        .arrays
        .use_operand_where_held(&tenant(&who), &id)?
        .ok_or_else(not_found)?;
    let (vocab, dim, values) = rows_of(&table)?;
    let key = crate::arrays::device_key(&id);
    let max = state.settings.config.max_tensor_elements;
    let output = Dtype::from(req.out_dtype);
    let (backend, packed) = (req.backend, req.encoding == OutputEncoding::Base64);
    // Too many ids in a resident tensor is a fault of the array it names.
    let ids_at = match req.ids {
        DenseIn::Resident(_) => "/ids/array",
        _ => "/ids",
    };
    let (job, mut shape) = blocking(move || {
        let ids = integer_tensor(
            req.ids,
            "/ids",
            max,
            vocab as f64 - 1.0,
            &format!("{} (the rows)", vocab.saturating_sub(1)),
        )?;
        let values_out = (ids.values.len() as u64).saturating_mul(dim as u64);
        if values_out > max as u64 {
            return Err(too_large(ids_at, values_out, max));
        }
        let rows = ids.values.iter().map(|&x| x as u32).collect();
        let job = LookupJob::new(key, values, dim, rows, output)?;
        Ok((job, ids.shape))
    })
    .await?;
    shape.push(dim);
    let dtype = TensorDtype::from(output);
    let done = state.pool.submit(job, backend, timeout).await?;
    let body = LookupResponse {
        result: DenseOut::new(
            shape.clone(),
            Values::F32(done.output.into()),
            dtype,
            packed,
        ),
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
