//! The bulk wire form (docs/WIRE.md, `crate::wire`) at the API's edge.
//!
//! - `ApiBody<T>` takes a request as JSON or as `application/vnd.gpu-ops.bulk`. A bulk
//!   body's framing and buffer layout are checked and its buffers' decoded size charged
//!   before anything is decoded; then its header is parsed by `T`'s own `Deserialize`,
//!   the JSON request's, with the data section lent to the parsing thread: a bulk
//!   field that meets a buffer descriptor takes its bytes from there (`buffer`). So both
//!   forms share every check, path and code past the framing.
//! - `AnswerForm` reads `Accept`; `answer` writes a bulk answer, its buffers gathered
//!   while its header is serialized (`push_answer_buffer`) and sent from where they lie.

use super::extract::{parse, read_body, BodyLimits, INLINE_PARSE_BYTES};
use super::numbers::with_number_cap;
use super::problem::{ErrorCode, Problem};
use super::ApiJson;
use crate::pool::RunInfo;
use crate::wire::{self, BufferRef, EnvelopeWriter};
use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use axum::response::Response;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::cell::RefCell;

#[cfg(test)]
mod tests;

/// A request body as JSON or in the bulk form, by its `Content-Type`.
pub struct ApiBody<T>(pub T);

/// The request body's media type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyForm {
    Json,
    Bulk,
}

fn body_form(headers: &HeaderMap) -> Option<BodyForm> {
    let media = headers
        .get(header::CONTENT_TYPE)?
        .to_str()
        .ok()?
        .split(';')
        .next()?
        .trim()
        .to_ascii_lowercase();
    if media == wire::MEDIA_TYPE {
        Some(BodyForm::Bulk)
    } else if media == "application/json"
        || (media.starts_with("application/") && media.ends_with("+json"))
    {
        Some(BodyForm::Json)
    } else {
        None
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send + 'static> FromRequest<S> for ApiBody<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        match body_form(req.headers()) {
            Some(BodyForm::Json) => ApiJson::from_request(req, state)
                .await
                .map(|ApiJson(v)| ApiBody(v)),
            Some(BodyForm::Bulk) => bulk_request(req).await.map(ApiBody),
            None => Err(Problem::new(
                ErrorCode::UnsupportedMediaType,
                format!(
                    "send the body as JSON (Content-Type: application/json) or in the bulk form (Content-Type: {})",
                    wire::MEDIA_TYPE
                ),
            )),
        }
    }
}

async fn bulk_request<T: DeserializeOwned + Send + 'static>(req: Request) -> Result<T, Problem> {
    let limits = req
        .extensions()
        .get::<BodyLimits>()
        .cloned()
        .unwrap_or_default();
    let body = read_body(req, &limits, true).await?.into_bytes();
    if body.len() > INLINE_PARSE_BYTES {
        tokio::task::spawn_blocking(move || parse_bulk(body, &limits))
            .await
            .map_err(|e| Problem::new(ErrorCode::Internal, format!("parser task failed: {e}")))?
    } else {
        parse_bulk(body, &limits)
    }
}

/// Checks a bulk body's framing and layout, charges its buffers' decoded size, then
/// parses its header as `T` with the data section lent to the bulk fields.
fn parse_bulk<T: DeserializeOwned>(body: Bytes, limits: &BodyLimits) -> Result<T, Problem> {
    let envelope = wire::split(&body)
        .map_err(|e| Problem::new(ErrorCode::MalformedBulkBody, e.to_string()))?;
    let header = envelope.header;
    let buffers = descriptors(header)?;
    let refs: Vec<(&str, &BufferRef)> = buffers.iter().map(|(p, b)| (p.as_str(), b)).collect();
    wire::check_layout(&refs, envelope.data.len()).map_err(|e| {
        if e.path.is_empty() {
            Problem::new(ErrorCode::InvalidBuffer, e.message)
        } else {
            Problem::at(ErrorCode::InvalidBuffer, e.path, e.message)
        }
    })?;
    // Charged before any buffer is decoded: the layout check bounds each buffer by the
    // body, so this is at most twice the body (f16 and bf16 widen to f32).
    let decoded: u64 = buffers.iter().map(|(_, b)| decoded_bytes(b)).sum();
    if let Some(charge) = &limits.decoded {
        charge.take(decoded)?;
    }
    let data = body.slice(body.len() - envelope.data.len()..);
    let (parsed, stored) = DATA_SECTION.with(|lent| {
        let _restore = Lend::new(lent, data);
        with_number_cap(limits.max_numbers, || parse::<T>(header.as_bytes()))
    });
    let value = parsed?;
    // JSON numbers in the header (a field sent inline rather than as a buffer).
    if let Some(charge) = &limits.decoded {
        charge.take(stored)?;
    }
    Ok(value)
}

/// The bytes a buffer's values take once decoded: f16 and bf16 become f32, the rest keep
/// their width.
fn decoded_bytes(b: &BufferRef) -> u64 {
    let width = b.dtype.width().max(4);
    b.elements().unwrap_or(0).saturating_mul(width)
}

/// Every buffer descriptor in a header, with its JSON pointer: each object with a
/// `byte_offset` or `byte_length` member, which must then be a whole descriptor.
fn descriptors(header: &str) -> Result<Vec<(String, BufferRef)>, Problem> {
    let root: serde_json::Value = parse(header.as_bytes())?;
    let mut found = Vec::new();
    let mut stack = vec![(String::new(), &root)];
    while let Some((path, value)) = stack.pop() {
        match value {
            serde_json::Value::Object(members)
                if members.contains_key("byte_offset") || members.contains_key("byte_length") =>
            {
                let b = serde_path_to_error::deserialize::<_, BufferRef>(value).map_err(|e| {
                    let at = e.path().to_string();
                    let at = if at == "." {
                        String::new()
                    } else {
                        format!("/{at}")
                    };
                    Problem::at(
                        ErrorCode::InvalidBuffer,
                        format!("{path}{at}"),
                        e.into_inner().to_string(),
                    )
                })?;
                found.push((path, b));
            }
            serde_json::Value::Object(members) => stack.extend(members.iter().map(|(k, v)| {
                (
                    format!("{path}/{}", k.replace('~', "~0").replace('/', "~1")),
                    v,
                )
            })),
            serde_json::Value::Array(items) => stack.extend(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (format!("{path}/{i}"), v)),
            ),
            _ => {}
        }
    }
    Ok(found)
}

thread_local! {
    /// The data section of the bulk body whose header this thread is parsing.
    static DATA_SECTION: RefCell<Option<Bytes>> = const { RefCell::new(None) };
    /// The answer whose header this thread is serializing.
    static ANSWER: RefCell<Option<EnvelopeWriter>> = const { RefCell::new(None) };
}

/// Lends a value to a thread-local for one scope, restoring what was there.
struct Lend<'a, V: 'static> {
    slot: &'a RefCell<Option<V>>,
    before: Option<V>,
}

impl<'a, V> Lend<'a, V> {
    fn new(slot: &'a RefCell<Option<V>>, value: V) -> Self {
        let before = slot.replace(Some(value));
        Lend { slot, before }
    }
}

impl<V> Drop for Lend<'_, V> {
    fn drop(&mut self) {
        self.slot.replace(self.before.take());
    }
}

/// The bytes of the buffer at `byte_offset` of the body being parsed (its layout already
/// checked), or why there are none: a JSON body has no data section.
pub(super) fn buffer(byte_offset: u64, byte_length: u64) -> Result<Bytes, String> {
    DATA_SECTION.with(|lent| match &*lent.borrow() {
        Some(data) => {
            let end = byte_offset.saturating_add(byte_length);
            if end > data.len() as u64 {
                return Err(format!(
                    "{byte_length} bytes from {byte_offset} run past the data section"
                ));
            }
            Ok(data.slice(byte_offset as usize..end as usize))
        }
        None => Err(format!(
            "byte_offset and byte_length describe a buffer of an {} body; a JSON body carries its values inline",
            wire::MEDIA_TYPE
        )),
    })
}

/// For an object that is either a packed array or a buffer descriptor: the described
/// buffer's bytes, or `None` when it has neither `byte_offset` nor `byte_length` (the
/// packed form). `packed_fields` says whether it also has the packed form's `encoding`
/// or `data`, which a descriptor may not.
pub(super) fn described_buffer<E: serde::de::Error>(
    byte_offset: Option<u64>,
    byte_length: Option<u64>,
    packed_fields: bool,
) -> Result<Option<Bytes>, E> {
    match (byte_offset, byte_length) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) if packed_fields => Err(E::custom(
            "a buffer descriptor (byte_offset, byte_length) takes no encoding or data",
        )),
        (Some(offset), Some(length)) => buffer(offset, length).map(Some).map_err(E::custom),
        (None, Some(_)) => Err(E::missing_field("byte_offset")),
        (Some(_), None) => Err(E::missing_field("byte_length")),
    }
}

/// A bulk field whose only object form is a buffer descriptor (element vectors, points):
/// the descriptor read from `map`, and its bytes.
pub(super) fn descriptor_in<'de, A: serde::de::MapAccess<'de>>(
    map: A,
) -> Result<(BufferRef, Bytes), A::Error> {
    use serde::Deserialize;
    let b = BufferRef::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
    let bytes = buffer(b.byte_offset, b.byte_length).map_err(serde::de::Error::custom)?;
    Ok((b, bytes))
}

/// How the client asked to be answered (`Accept`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerForm {
    Json,
    Bulk,
}

impl AnswerForm {
    /// The bulk form when `Accept` names it at least as high as JSON (by q-value; a type
    /// named exactly wins a tie with `*/*` or `application/*`), else JSON.
    pub fn from_headers(headers: &HeaderMap) -> AnswerForm {
        let (mut bulk, mut json) = (0.0f32, 0.0f32);
        for value in headers.get_all(header::ACCEPT) {
            let Ok(value) = value.to_str() else { continue };
            for range in value.split(',') {
                let mut parts = range.split(';');
                let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
                let q = parts
                    .filter_map(|p| p.trim().strip_prefix("q="))
                    .find_map(|q| q.trim().parse::<f32>().ok())
                    .unwrap_or(1.0);
                if media == wire::MEDIA_TYPE {
                    bulk = bulk.max(q);
                } else if matches!(media.as_str(), "application/json" | "application/*" | "*/*") {
                    json = json.max(q);
                }
            }
        }
        if bulk > 0.0 && bulk >= json {
            AnswerForm::Bulk
        } else {
            AnswerForm::Json
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for AnswerForm {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        Ok(AnswerForm::from_headers(&parts.headers))
    }
}

/// Whether this thread is serializing a bulk answer (bulk fields then write buffers).
pub(super) fn answering() -> bool {
    ANSWER.with(|slot| slot.borrow().is_some())
}

/// Adds a buffer to the bulk answer this thread is serializing, returning its
/// descriptor; `None` when no bulk answer is being written.
pub(super) fn push_answer_buffer(
    dtype: wire::Dtype,
    shape: Vec<u64>,
    bytes: Bytes,
) -> Option<BufferRef> {
    ANSWER.with(|slot| {
        slot.borrow_mut()
            .as_mut()
            .map(|writer| writer.push(dtype, shape, bytes))
    })
}

/// `body` as a bulk answer's chunks: its bulk fields (those that call
/// `push_answer_buffer` as they are serialized) as buffers after its JSON header.
fn bulk_chunks<H: Serialize>(body: &H) -> Result<Vec<Bytes>, Problem> {
    let (header, writer) = ANSWER.with(|slot| {
        let lend = Lend::new(slot, EnvelopeWriter::new());
        let header = serde_json::to_vec(body);
        let writer = slot.replace(None);
        drop(lend);
        (header, writer)
    });
    let header = header.map_err(|e| Problem::internal(e.to_string()))?;
    Ok(writer.unwrap_or_default().finish_json(header))
}

/// `body` as a bulk answer, sent chunk by chunk from where its buffers lie.
fn bulk_body<H: Serialize>(body: &H) -> Result<Body, Problem> {
    let chunks = bulk_chunks(body)?;
    let stream =
        futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::convert::Infallible>));
    Ok(Body::from_stream(stream))
}

/// A job's answer in the form asked for, with the run's headers: `json` is the JSON
/// answer's bytes, made only when that form was asked for.
pub(super) fn answer<H: Serialize>(
    form: AnswerForm,
    body: &H,
    json: impl FnOnce(&H) -> Result<Vec<u8>, Problem>,
    run: &RunInfo,
) -> Result<Response, Problem> {
    let mut res = reply(form, body, json)?;
    super::add_run_headers(res.headers_mut(), run);
    Ok(res)
}

/// An answer that is not a job's (a round's sum, a key pair) in the form asked for.
pub(super) fn reply<H: Serialize>(
    form: AnswerForm,
    body: &H,
    json: impl FnOnce(&H) -> Result<Vec<u8>, Problem>,
) -> Result<Response, Problem> {
    let (body, media) = match form {
        AnswerForm::Json => (Body::from(json(body)?), "application/json"),
        AnswerForm::Bulk => (bulk_body(body)?, wire::MEDIA_TYPE),
    };
    let mut res = Response::new(body);
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(media),
    );
    headers.insert(header::VARY, header::HeaderValue::from_static("accept"));
    Ok(res)
}
