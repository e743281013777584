//! `/embeddings/tables`: resident embedding tables. Upload once, then look rows up by id;
//! a device keeps the table cached between lookups.

use super::array_operands::ArrayScope;
use super::auth::{tenant, Tenant};
use super::dense_tensors::{Dense2Doc, DenseIn, DenseOut, DenseOutDoc, TensorDtype};
use super::embeddings::{integer_tensor, too_large, EmbeddingDtype, OutputEncoding, PositionsDoc};
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::{
    blocking, bulk, entropy_u64, job_timeout, json_body, AnswerForm, ApiBody, ApiPath, AppState,
    IdParam,
};
use crate::backend::BackendChoice;
use crate::ops::linalg::{Dtype, LookupJob, Values};
use crate::tables::{EmbeddingTable, TableMeta};
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
}

#[derive(Serialize, ToSchema)]
pub struct TableView {
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

fn view(state: &AppState, t: &EmbeddingTable) -> TableView {
    let key = t.device_key();
    TableView {
        id: t.meta.id.clone(),
        name: t.meta.name.clone(),
        vocab: t.meta.vocab,
        dim: t.meta.dim,
        size_bytes: t.bytes(),
        created_at: t.meta.created_at.clone(),
        resident_on: state
            .backends
            .gpus()
            .iter()
            .filter(|g| g.holds_table(&key))
            .map(|g| g.info.ordinal)
            .collect(),
        lookup_url: format!("/embeddings/tables/{}/lookup", t.meta.id),
    }
}

fn not_found() -> Problem {
    Problem::new(
        ErrorCode::EmbeddingTableNotFound,
        "no such embedding table for this tenant",
    )
}

#[utoipa::path(
    post, path = "/embeddings/tables", tag = "embeddings", operation_id = "embedding_table_create",
    summary = "Keep an embedding table for lookups",
    description = "Stores a `[V, D]` table (as f32, in host memory and on disk under --data-dir, so it \
        survives a restart) and answers its id. Lookups by id then send only token ids; a device keeps \
        the table cached between them. The tenant's tables together stay within \
        --max-tenant-embedding-mib (422 embedding_quota_exceeded), all tables within \
        --max-embedding-tables-mib (507 embedding_tables_full).",
    request_body(content((CreateTableRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 201, description = "Stored", body = TableView, links(
            ("get" = (operation_id = "embedding_table_get", parameters(("id" = "$response.body#/id")))),
            ("lookup" = (operation_id = "embedding_table_lookup", parameters(("id" = "$response.body#/id")))),
            ("delete" = (operation_id = "embedding_table_delete", parameters(("id" = "$response.body#/id")))),
        )),
        (status = 413, description = "The table over --max-tensor-elements"),
        (status = 422, description = "invalid_tensor (rank, not finite), invalid_parameter (name), embedding_quota_exceeded"),
        (status = 507, description = "embedding_tables_full"),
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
    if req.name.as_ref().is_some_and(|n| n.chars().count() > 200) {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/name",
            "at most 200 characters",
        ));
    }
    let max = state.settings.config.max_tensor_elements;
    let st = state.clone();
    let tenant = tenant(&who);
    let table = blocking(move || {
        let t = req.table.decode("/table", 2..=2, max)?;
        let (vocab, dim) = (t.shape[0], t.shape[1]);
        if vocab as u64 > 1 << 32 {
            // Ids are 32-bit on both backends.
            return Err(Problem::at(
                ErrorCode::InvalidTensor,
                "/table/shape",
                "at most 2^32 rows",
            ));
        }
        let id = format!("emb_{:016x}{:08x}", entropy_u64()?, entropy_u64()? as u32);
        let meta = TableMeta {
            id,
            tenant,
            name: req.name,
            vocab,
            dim,
            created_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        };
        let values: Vec<f32> = t.values.into_f32();
        if let Some(i) = values.iter().position(|x| !x.is_finite()) {
            return Err(Problem::at(
                ErrorCode::InvalidTensor,
                "/table",
                format!("value {i} (row-major) overflows f32"),
            ));
        }
        Ok(st.tables.add(meta, values)?)
    })
    .await?;
    let v = view(&state, &table);
    let location =
        HeaderValue::from_str(&format!("/embeddings/tables/{}", v.id)).expect("ascii id");
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(v)).into_response())
}

#[utoipa::path(
    get, path = "/embeddings/tables", tag = "embeddings", operation_id = "embedding_table_list",
    summary = "This tenant's embedding tables, by id",
    responses((status = 200, description = "The tables", body = TableList)),
    security((), ("bearer" = []))
)]
pub async fn embedding_table_list(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
) -> Json<TableList> {
    let tables = state.tables.list(&tenant(&who));
    Json(TableList {
        tables: tables.iter().map(|t| view(&state, t)).collect(),
    })
}

#[utoipa::path(
    get, path = "/embeddings/tables/{id}", tag = "embeddings", operation_id = "embedding_table_get",
    summary = "An embedding table's shape and where it is resident",
    params(("id" = String, Path, description = "Table id")),
    responses(
        (status = 200, description = "The table", body = TableView),
        (status = 404, description = "embedding_table_not_found (also for another tenant's table)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn embedding_table_get(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<Json<TableView>, Problem> {
    let t = state.tables.get(&tenant(&who), &id).ok_or_else(not_found)?;
    Ok(Json(view(&state, &t)))
}

#[utoipa::path(
    delete, path = "/embeddings/tables/{id}", tag = "embeddings", operation_id = "embedding_table_delete",
    summary = "Delete an embedding table, its files and its device copies",
    params(("id" = String, Path, description = "Table id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "embedding_table_not_found"),
    ),
    security((), ("bearer" = []))
)]
pub async fn embedding_table_delete(
    State(state): State<Arc<AppState>>,
    who: Option<Extension<Tenant>>,
    ApiPath(IdParam { id }): ApiPath<IdParam>,
) -> Result<StatusCode, Problem> {
    let (st, t) = (state.clone(), tenant(&who));
    let removed = blocking(move || Ok(st.tables.remove(&t, &id)?)).await?;
    let table = removed.ok_or_else(not_found)?;
    let key = table.device_key();
    for g in state.backends.gpus() {
        g.forget_table(&key);
        crate::pool::export_device_cache(&state.metrics, g);
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
        On a device the table is uploaded on its first use there and kept (least recently used out under \
        --gpu-table-cache-mib); later lookups send only the ids.",
    params(("id" = String, Path, description = "Table id")),
    request_body(content((LookupRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The rows", body = LookupResponse),
        (status = 404, description = "embedding_table_not_found"),
        (status = 413, description = "The answer over --max-tensor-elements"),
        (status = 422, description = "invalid_tensor (ids not JSON integers from 0 to V − 1, rank), \
            unknown_array, array_mismatch (ids naming an array that is not a tensor of rank 1 or 2)"),
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
    let table = state.tables.get(&tenant(&who), &id).ok_or_else(not_found)?;
    let max = state.settings.config.max_tensor_elements;
    let (vocab, dim) = (table.meta.vocab, table.meta.dim);
    let output = Dtype::from(req.out_dtype);
    let (backend, packed) = (req.backend, req.encoding == OutputEncoding::Base64);
    let (job, mut shape) = blocking(move || {
        let ids = integer_tensor(
            req.ids,
            "/ids",
            max,
            vocab as f64 - 1.0,
            &format!("{} (the rows)", vocab - 1),
        )?;
        let values = (ids.values.len() as u64).saturating_mul(dim as u64);
        if values > max as u64 {
            return Err(too_large("/ids", values, max));
        }
        let rows = ids.values.iter().map(|&x| x as u32).collect();
        let job = LookupJob::new(table.device_key(), table.values.clone(), dim, rows, output)?;
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
