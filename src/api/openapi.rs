//! The OpenAPI document: what utoipa generates from the handlers, finished by one pass
//! that makes it the wire contract generated clients rely on.
//!
//! Handlers declare their success answers and the problems only they can return
//! (`budget_not_found`, `dataset_not_ready`, …). The pass adds what every operation of a
//! kind can return, from one table (`shared_problems`), each with the problem+json schema
//! and an example rendered by `Problem` itself:
//! - every operation: 500 `internal`;
//! - behind `--api-keys-file` (declares the bearer scheme): 401 `unauthorized`, 429
//!   `tenant_rate_limited` / `tenant_concurrency_limited` (the tenant's limits);
//! - with a JSON body: 400 `malformed_json`, 408 `body_too_slow`, 413 `payload_too_large`, 415
//!   `unsupported_media_type`, 422 `invalid_request`, 503 `body_budget_exhausted`;
//! - with query or path parameters: 422 `invalid_parameter` (`ApiQuery`, `ApiPath`);
//! - a job (its request has `timeout_ms`): 503 `queue_full` / `device_unavailable` /
//!   `device_error` / `shutting_down`, 504 `deadline_exceeded`.
//!
//! It also puts the document in the shapes generators model: a non-JSON answer declared
//! without a schema is a binary string, and a `default` beside a lone `oneOf` `$ref`
//! (what utoipa emits for a `#[serde(default)]` struct field) becomes the bare `$ref`:
//! the referenced schema states every field's default.

use super::problem;
use super::problem::{ErrorCode, Problem, ProblemDocument};
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "gpu-ops", description = "GPU operations behind REST, with a CPU fallback that gives the same answers."),
    components(schemas(problem::ProblemDocument, problem::FieldIssue, crate::wire::BufferRef)),
    modifiers(&BearerAuth),
)]
struct ApiDoc;

/// A file answer: the bytes of the response's media type (`type: string, format: binary`).
pub struct Binary;

impl utoipa::PartialSchema for Binary {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .into()
    }
}

impl utoipa::ToSchema for Binary {}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("Needed when the server runs with --api-keys-file"))
                    .build(),
            ),
        );
    }
}

/// The finished document, as served at `/api-doc/openapi.json`.
pub fn document() -> Value {
    let mut base = ApiDoc::openapi();
    base.tags = Some(
        super::API_DOMAINS
            .iter()
            .map(|d| {
                utoipa::openapi::tag::TagBuilder::new()
                    .name(d.tag)
                    .description(Some(d.description))
                    .build()
            })
            .collect(),
    );
    let mut doc = serde_json::to_value(super::operations_openapi(base))
        .expect("the OpenAPI document serialises");
    let jobs = job_requests(&doc);
    let naming = array_requests(&doc);
    for op in operations_mut(&mut doc) {
        bulk_forms(op);
        add_shared_problems(op, &jobs, &naming);
        binary_answers(op);
        empty_optional_queries(op);
    }
    for_each_object(&mut doc, &mut bare_defaulted_ref);
    for_each_object(&mut doc, &mut camel_case_links);
    for (operation, events, data) in EVENT_STREAMS {
        describe_events(&mut doc, operation, events, data);
    }
    doc
}

/// `ApiQuery` reads an empty query value (`?encoding=`) as the parameter's absence: for
/// an optional parameter that is its default, which `allowEmptyValue` says.
fn empty_optional_queries(op: &mut serde_json::Map<String, Value>) {
    let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) else {
        return;
    };
    for p in params {
        let optional = p.get("required").and_then(Value::as_bool) != Some(true);
        if p.get("in").and_then(Value::as_str) == Some("query") && optional {
            p["allowEmptyValue"] = json!(true);
        }
    }
}

/// Server-sent event streams: (operation id, event names, the schema of each event's data).
const EVENT_STREAMS: &[(&str, &[&str], &str)] =
    &[("dataset_events", &["progress", "end"], "DatasetView")];

/// The events of a `text/event-stream` answer: each an `event` name and JSON `data` of
/// one schema. OpenAPI 3.1 has no field for that (3.2's `itemSchema` is not valid 3.1), so
/// the description goes in `x-itemSchema`, 3.2's shape under an extension name. The
/// `schema` beside it has no type: generated clients then hand over the stream's text,
/// and schemathesis, which checks each parsed event against `schema`, accepts them.
fn describe_events(doc: &mut Value, operation: &str, events: &[&str], data: &str) {
    for op in operations_mut(doc) {
        if op.get("operationId").and_then(Value::as_str) != Some(operation) {
            continue;
        }
        let stream = op
            .get_mut("responses")
            .and_then(|r| r.pointer_mut("/200/content/text~1event-stream"));
        if let Some(stream) = stream {
            stream["schema"] = json!({
                "description": format!("The stream's text: events `{}`, each with `data:` one {data} as JSON", events.join("`, `"))
            });
            stream["x-itemSchema"] = json!({
                "type": "object",
                "required": ["event", "data"],
                "properties": {
                    "event": {"type": "string", "enum": events},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {"$ref": format!("#/components/schemas/{data}")}
                    }
                }
            });
        }
    }
}

/// Every operation of the document (the objects under a path that have `responses`).
fn operations_mut(doc: &mut Value) -> impl Iterator<Item = &mut Map<String, Value>> {
    doc.get_mut("paths")
        .and_then(Value::as_object_mut)
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(Value::as_object_mut)
        .filter(|op| op.contains_key("responses"))
}

/// Calls `f` on every object in `v`, outermost first.
fn for_each_object(v: &mut Value, f: &mut impl FnMut(&mut Map<String, Value>)) {
    match v {
        Value::Object(m) => {
            f(m);
            m.values_mut().for_each(|x| for_each_object(x, f));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| for_each_object(x, f)),
        _ => {}
    }
}

/// The request schemas of jobs: the ones with a deadline (`timeout_ms`).
fn job_requests(doc: &Value) -> HashSet<String> {
    doc.pointer("/components/schemas")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(_, s)| s.pointer("/properties/timeout_ms").is_some())
        .map(|(name, _)| format!("#/components/schemas/{name}"))
        .collect()
}

/// A job operation: its request schema has a deadline.
fn is_job(op: &Map<String, Value>, jobs: &HashSet<String>) -> bool {
    request_schema(op).is_some_and(|r| jobs.contains(r))
}

fn request_schema(op: &Map<String, Value>) -> Option<&str> {
    op.get("requestBody")
        .and_then(|b| b.pointer("/content/application~1json/schema/$ref"))
        .and_then(Value::as_str)
}

/// Every `$ref` inside `v`.
fn refs_in<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                out.push(r);
            }
            m.values().for_each(|x| refs_in(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| refs_in(x, out)),
        _ => {}
    }
}

/// The request schemas that may name a resident array (`ArrayRefDoc`) or keep a result
/// (`Keep`), directly or through the schemas they refer to: where arrays are shared by
/// replicas, such a request reads or writes the shared catalog.
fn array_requests(doc: &Value) -> HashSet<String> {
    let schemas = doc
        .pointer("/components/schemas")
        .and_then(Value::as_object);
    let refs: Vec<(String, Vec<&str>)> = schemas
        .into_iter()
        .flatten()
        .map(|(name, s)| {
            let mut out = Vec::new();
            refs_in(s, &mut out);
            (format!("#/components/schemas/{name}"), out)
        })
        .collect();
    let mut found: HashSet<String> = ["ArrayRefDoc", "Keep"]
        .map(|n| format!("#/components/schemas/{n}"))
        .into();
    loop {
        let more: Vec<String> = refs
            .iter()
            .filter(|(name, r)| !found.contains(name) && r.iter().any(|x| found.contains(*x)))
            .map(|(name, _)| name.clone())
            .collect();
        if more.is_empty() {
            return found;
        }
        found.extend(more);
    }
}

/// What an operation's shape says it can return, beyond its own declarations.
fn shared_problems(op: &Map<String, Value>, job: bool, naming: bool) -> Vec<(u16, Vec<ErrorCode>)> {
    let secured = op
        .get("security")
        .and_then(Value::as_array)
        .is_some_and(|s| s.iter().any(|r| r.get("bearer").is_some()));
    let body = op.contains_key("requestBody");
    let params = op
        .get("parameters")
        .and_then(Value::as_array)
        .is_some_and(|p| !p.is_empty());
    let mut out = vec![(500, vec![ErrorCode::Internal])];
    if secured {
        out.push((401, vec![ErrorCode::Unauthorized]));
        out.push((
            429,
            vec![
                ErrorCode::TenantRateLimited,
                ErrorCode::TenantConcurrencyLimited,
            ],
        ));
    }
    if takes_bulk(op) {
        out.push((400, vec![ErrorCode::MalformedBulkBody]));
        out.push((422, vec![ErrorCode::InvalidBuffer]));
    }
    if body {
        out.push((400, vec![ErrorCode::MalformedJson]));
        out.push((408, vec![ErrorCode::BodyTooSlow]));
        out.push((413, vec![ErrorCode::PayloadTooLarge]));
        out.push((415, vec![ErrorCode::UnsupportedMediaType]));
        out.push((503, vec![ErrorCode::BodyBudgetExhausted]));
    }
    let mut unprocessable = Vec::new();
    if body {
        unprocessable.push(ErrorCode::InvalidRequest);
    }
    if params {
        unprocessable.push(ErrorCode::InvalidParameter);
    }
    if !unprocessable.is_empty() {
        out.push((422, unprocessable));
    }
    // The dataset and array catalogs may live in the shared database (`--database-url`
    // with `--artifact-store`), which can be out of reach; so may a request's array.
    // Embedding tables are arrays: every route of theirs reads the array catalog.
    let tables = op
        .get("operationId")
        .and_then(Value::as_str)
        .is_some_and(|o| o.starts_with("embedding_table_"));
    let catalog = tables
        || op
            .get("tags")
            .and_then(Value::as_array)
            .is_some_and(|t| t.iter().any(|t| t == "datasets" || t == "arrays"));
    if catalog || naming {
        out.push((503, vec![ErrorCode::StorageUnavailable]));
    }
    if job {
        out.push((
            503,
            vec![
                ErrorCode::QueueFull,
                ErrorCode::DeviceUnavailable,
                ErrorCode::DeviceError,
                ErrorCode::ShuttingDown,
            ],
        ));
        out.push((504, vec![ErrorCode::DeadlineExceeded]));
    }
    out
}

/// Where and how long a job ran, on its success answer (`add_run_headers`).
fn job_headers() -> Value {
    json!({
        "x-backend": {"description": "Where the job ran: cpu, cuda (an NVIDIA GPU), hip (an AMD GPU) or emulated (the emulated device, a test stand-in for a GPU that runs on the host's CPU)", "schema": {"type": "string", "enum": ["cpu", "cuda", "hip", "emulated"]}},
        "x-device": {"description": "GPU ordinal, when cuda", "schema": {"type": "integer", "minimum": 0}},
        "x-queue-time-ms": {"description": "Time queued, ms", "schema": {"type": "number"}},
        "x-compute-time-ms": {"description": "Time computing, ms", "schema": {"type": "number"}},
        "x-request-id": {"description": "The request's id (echoed, or generated), also in problems", "schema": {"type": "string"}},
    })
}

/// Adds the shared problem responses to `op`, merging into what the handler declared:
/// its description is kept and the codes it did not name are appended.
fn add_shared_problems(
    op: &mut Map<String, Value>,
    jobs: &HashSet<String>,
    naming: &HashSet<String>,
) {
    let job = is_job(op, jobs);
    let names_arrays = request_schema(op).is_some_and(|r| naming.contains(r));
    if job {
        if let Some(ok) = op.get_mut("responses").and_then(|r| r.get_mut("200")) {
            ok["headers"] = job_headers();
        }
    }
    for (status, codes) in shared_problems(op, job, names_arrays) {
        let responses = op
            .entry("responses")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("responses is an object");
        let entry = responses
            .entry(status.to_string())
            .or_insert_with(|| json!({"description": ""}));
        let description = entry["description"].as_str().unwrap_or("").to_string();
        let missing: Vec<String> = codes
            .iter()
            .filter(|c| !description.contains(c.as_str()))
            .map(|c| format!("`{}`: {}", c.as_str(), c.title()))
            .collect();
        if !missing.is_empty() {
            let text = missing.join("; ");
            entry["description"] = Value::String(if description.is_empty() {
                text
            } else {
                format!("{description}; {text}")
            });
        }
    }
    // The field an `invalid_parameter` example blames: the operation's first parameter,
    // else `timeout_ms`.
    let field = example_field(op);
    let responses = op
        .get_mut("responses")
        .and_then(Value::as_object_mut)
        .expect("responses is an object");
    for (status, response) in responses.iter_mut() {
        let Ok(status) = status.parse::<u16>() else {
            continue;
        };
        if status >= 400 {
            complete_problem(status, response, &field);
        }
    }
}

/// The JSON pointer an example problem of `op` names: its first parameter, or a body field.
fn example_field(op: &Map<String, Value>) -> String {
    match op
        .get("parameters")
        .and_then(|p| p.get(0))
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
    {
        Some(name) => format!("/{name}"),
        None => "/timeout_ms".to_string(),
    }
}

/// Every problem response: the problem+json schema and an example of the first code its
/// description names (or the status' first code).
fn complete_problem(status: u16, response: &mut Value, field: &str) {
    let description = response["description"].as_str().unwrap_or("").to_string();
    let mut of_status = ErrorCode::ALL
        .iter()
        .copied()
        .filter(|c| c.status().as_u16() == status);
    let named = of_status
        .clone()
        .filter_map(|c| description.find(c.as_str()).map(|at| (at, c)))
        .min_by_key(|(at, _)| *at)
        .map(|(_, c)| c);
    let Some(code) = named.or_else(|| of_status.next()) else {
        return;
    };
    let content = response
        .as_object_mut()
        .expect("a response is an object")
        .entry("content")
        .or_insert_with(|| json!({}));
    let media = content
        .as_object_mut()
        .expect("content is an object")
        .entry("application/problem+json")
        .or_insert_with(|| json!({}));
    media["schema"] = json!({"$ref": "#/components/schemas/ProblemDocument"});
    if media.get("example").is_none() {
        media["example"] = example(code, status, field);
    }
    if description.contains(ErrorCode::QueueFull.as_str()) {
        response["headers"]["retry-after"] = json!({
            "description": "With queue_full (and a job's shutting_down): seconds to wait before retrying",
            "schema": {"type": "integer", "minimum": 0}
        });
    }
}

/// A problem document exactly as the server renders it (`field`: the pointer an
/// `invalid_parameter` example names).
fn example(code: ErrorCode, status: u16, field: &str) -> Value {
    let mut problem = match code {
        ErrorCode::InvalidParameter => Problem::at(code, field, "out of range"),
        ErrorCode::InvalidRequest => Problem::at(code, "/field", "missing field `field`"),
        _ => Problem::new(code, code.title()),
    };
    if problem.status().as_u16() != status {
        problem.status = axum::http::StatusCode::from_u16(status).ok();
    }
    let doc: ProblemDocument =
        problem.document(Some("0d9f4b52-8c1e-4c39-9d5a-3b1f0e2a7c44".to_string()));
    serde_json::to_value(doc).expect("a problem serialises")
}

/// A non-JSON answer declared without a schema is a file: `type: string, format: binary`.
fn binary_answers(op: &mut Map<String, Value>) {
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    for (_, response) in responses.iter_mut() {
        let Some(content) = response.get_mut("content").and_then(Value::as_object_mut) else {
            continue;
        };
        for (media, body) in content.iter_mut() {
            let text = media.ends_with("json") || media.starts_with("text/");
            if !text && body.get("schema").is_none() {
                body["schema"] = json!({"type": "string", "format": "binary"});
            }
        }
    }
}

/// Whether the operation takes the bulk form (its handler declares the media type).
fn takes_bulk(op: &Map<String, Value>) -> bool {
    op.get("requestBody")
        .and_then(|b| b.get("content"))
        .and_then(|c| c.get(crate::wire::MEDIA_TYPE))
        .is_some()
}

/// An operation that takes the bulk form (its handler declares it as a second request
/// media type, `ApiBody`) answers in it too when `Accept` asks; so does one whose 200
/// answer declares the bulk media type itself (a GET, a key pair: `bulk::reply`). Both
/// are described here, once, with the JSON schema their header follows (`x-bulk-header`).
fn bulk_forms(op: &mut Map<String, Value>) {
    let media = crate::wire::MEDIA_TYPE;
    let json_request = op
        .get("requestBody")
        .and_then(|b| b.pointer("/content/application~1json/schema"))
        .cloned();
    let bulk_request = op
        .get_mut("requestBody")
        .and_then(|b| b.get_mut("content"))
        .and_then(|c| c.get_mut(media));
    let takes_bulk = match (json_request, bulk_request) {
        (Some(json_request), Some(request)) => {
            request["schema"] = json!({
                "type": "string",
                "format": "binary",
                "description": "The bulk form (docs/WIRE.md): an 8-byte little-endian header length N, N bytes of JSON \
                    (the JSON request, `x-bulk-header`, with any tensor or element vector replaced by a BufferRef), \
                    then the buffers, each 64-byte aligned, tiling the rest of the body.",
                "x-bulk-header": json_request,
            });
            true
        }
        _ => false,
    };
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    // The 200 answer comes in the bulk form when asked; a created resource's view
    // (201, a table's) is JSON whatever the request's form.
    for (status, response) in responses.iter_mut() {
        if status != "200" {
            continue;
        }
        let Some(content) = response.get_mut("content").and_then(Value::as_object_mut) else {
            continue;
        };
        if !takes_bulk && !content.contains_key(media) {
            continue;
        }
        let Some(json_answer) = content
            .get("application/json")
            .and_then(|c| c.get("schema"))
            .cloned()
        else {
            continue;
        };
        content.insert(
            media.into(),
            json!({"schema": {
                "type": "string",
                "format": "binary",
                "description": "With `Accept: application/vnd.gpu-ops.bulk`: the JSON answer (`x-bulk-header`) \
                    as the header, each tensor or element vector a BufferRef, then the buffers (docs/WIRE.md).",
                "x-bulk-header": json_answer,
            }}),
        );
    }
}

/// `{"oneOf": [{"$ref": …}], "default": …}` → `{"$ref": …}` (description kept).
fn bare_defaulted_ref(m: &mut Map<String, Value>) {
    let lone_ref = m
        .get("oneOf")
        .and_then(Value::as_array)
        .filter(|o| o.len() == 1 && o[0].get("$ref").is_some())
        .map(|o| o[0]["$ref"].clone());
    if let (Some(r), true) = (lone_ref, m.contains_key("default")) {
        let inner = m.remove("oneOf").expect("checked above");
        m.remove("default");
        m.insert("$ref".into(), r);
        if let Some(d) = inner[0]
            .get("description")
            .filter(|_| !m.contains_key("description"))
        {
            m.insert("description".into(), d.clone());
        }
    }
}

/// utoipa 5 writes a link's fields in snake case; OpenAPI spells them in camel case.
fn camel_case_links(m: &mut Map<String, Value>) {
    let Some(links) = m.get_mut("links").and_then(Value::as_object_mut) else {
        return;
    };
    for link in links.values_mut().filter_map(Value::as_object_mut) {
        for (snake, camel) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(x) = link.remove(snake) {
                link.insert(camel.into(), x);
            }
        }
    }
}

#[cfg(test)]
mod tests;
