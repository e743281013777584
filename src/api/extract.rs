//! The request extractors. `ApiJson<T>` reads the JSON body; `ApiQuery<T>` and
//! `ApiPath<T>` read the query string and path parameters. Every rejection becomes a
//! problem with the path of the bad field (a JSON pointer into the body, or `/` and the
//! parameter's name), so parameters are refused like body fields: 422, never axum's 400.
//! Large bodies are parsed off the async runtime, numbers capped as they are read
//! (`BodyLimits`).

use super::body_pool::BodyBuf;
use super::numbers::with_number_cap;
use super::problem::{ErrorCode, Problem};
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use std::borrow::Cow;

pub struct ApiJson<T>(pub T);

/// Bodies above this are parsed on a blocking thread.
pub(super) const INLINE_PARSE_BYTES: usize = 256 * 1024;

impl<S: Send + Sync, T: DeserializeOwned + Send + 'static> FromRequest<S> for ApiJson<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, _: &S) -> Result<Self, Problem> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|m| {
                let m = m.trim().to_ascii_lowercase();
                m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
            })
            .unwrap_or(false);
        if !is_json {
            return Err(Problem::new(
                ErrorCode::UnsupportedMediaType,
                "send the body as JSON with Content-Type: application/json",
            ));
        }
        let limits = req
            .extensions()
            .get::<BodyLimits>()
            .cloned()
            .unwrap_or_default();
        let cap = limits.max_numbers;
        let bytes = read_body(req, &limits, false).await?;
        let (parsed, stored) = if bytes.len() > INLINE_PARSE_BYTES {
            tokio::task::spawn_blocking(move || with_number_cap(cap, || parse(&bytes)))
                .await
                .map_err(|e| {
                    Problem::new(ErrorCode::Internal, format!("parser task failed: {e}"))
                })?
        } else {
            with_number_cap(cap, || parse(&bytes))
        };
        let value = parsed?;
        if let Some(charge) = &limits.decoded {
            charge.take(stored)?;
        }
        Ok(ApiJson(value))
    }
}

/// What a JSON body may be: its bytes, the numbers one array of it may store as it is
/// parsed (`numbers::with_number_cap`), and the slowest it may arrive. The body
/// admission puts them in each request's extensions; without them (a router built
/// without the middleware) axum's default body limit holds.
#[derive(Clone, Debug)]
pub struct BodyLimits {
    /// The body's declared length, read before the body timeout's wrapper (which does
    /// not pass it on) hides it.
    pub declared: Option<u64>,
    /// Where the parsed values are charged, with the body's charge.
    pub decoded: Option<super::body_budget::DecodedCharge>,
    pub max_bytes: usize,
    /// Where a large body's buffer comes from and returns to (`--body-pool-bytes`).
    pub pool: Option<std::sync::Arc<super::body_pool::BodyPool>>,
    pub max_numbers: usize,
    pub min_rate: BodyRate,
    /// Counts the bodies refused as too slow.
    pub too_slow: Option<prometheus::IntCounter>,
}

/// `--min-body-rate` and `--min-body-rate-grace`: after `grace`, a body whose bytes so
/// far average under `bytes_per_second` is refused 408 and its connection closed.
#[derive(Clone, Copy, Debug, Default)]
pub struct BodyRate {
    /// 0: no minimum.
    pub bytes_per_second: u64,
    pub grace: std::time::Duration,
}

impl BodyRate {
    /// Whether `bytes` received over `elapsed` is too slow.
    fn too_slow(&self, bytes: usize, elapsed: std::time::Duration) -> bool {
        self.bytes_per_second > 0
            && elapsed > self.grace
            && (bytes as f64) < self.bytes_per_second as f64 * elapsed.as_secs_f64()
    }
}

impl Default for BodyLimits {
    fn default() -> Self {
        BodyLimits {
            declared: None,
            decoded: None,
            max_bytes: 2 << 20,
            pool: None,
            max_numbers: usize::MAX,
            min_rate: BodyRate::default(),
            too_slow: None,
        }
    }
}

/// The whole body, into one buffer sized by its declared length: collected frame by
/// frame and then copied whole, a large body was held twice over while it arrived. A
/// body arriving slower than `--min-body-rate` is refused as each piece arrives (a piece
/// that never comes is `--body-idle-timeout`'s).
///
/// `for_device`: the body's buffers may be read in place by a device job (the bulk
/// form), so on a host with a GPU a large one is read into page-locked memory
/// (`body_pool::page_locked`).
pub(super) async fn read_body(
    req: Request,
    limits: &BodyLimits,
    for_device: bool,
) -> Result<BodyBuf, Problem> {
    let max_bytes = limits.max_bytes;
    let started = std::time::Instant::now();
    use futures_util::StreamExt;
    let too_large = || {
        Problem::new(
            ErrorCode::PayloadTooLarge,
            "the body is larger than --max-body-bytes",
        )
    };
    let body = req.into_body();
    let declared = limits
        .declared
        .or_else(|| axum::body::HttpBody::size_hint(&body).exact());
    if declared.is_some_and(|n| n > max_bytes as u64) {
        return Err(too_large());
    }
    let capacity = declared.unwrap_or(0) as usize;
    let mut buf = match &limits.pool {
        Some(pool) if for_device && capacity >= super::body_pool::PAGE_LOCKED_FROM => {
            // Registering a new block pins its pages: not on the runtime's threads.
            let pool = pool.clone();
            tokio::task::spawn_blocking(move || pool.take_page_locked(capacity))
                .await
                .map_err(|e| Problem::new(ErrorCode::Internal, format!("body buffer: {e}")))?
        }
        Some(pool) => pool.take(capacity),
        None => BodyBuf::unpooled(capacity),
    };
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let data = chunk.map_err(|e| {
            Problem::new(
                ErrorCode::MalformedJson,
                format!("could not read the body: {e}"),
            )
        })?;
        if buf.len() + data.len() > max_bytes {
            return Err(too_large());
        }
        buf.extend_from_slice(&data);
        let elapsed = started.elapsed();
        if limits.min_rate.too_slow(buf.len(), elapsed) {
            if let Some(c) = &limits.too_slow {
                c.inc();
            }
            return Err(Problem::new(
                ErrorCode::BodyTooSlow,
                format!(
                    "{} bytes in {:.1} s is slower than --min-body-rate ({} bytes/s)",
                    buf.len(),
                    elapsed.as_secs_f64(),
                    limits.min_rate.bytes_per_second
                ),
            ));
        }
    }
    Ok(buf)
}

/// The body as `T`. Parsed first without tracking the path, which costs on every value of
/// a large body (millions of array elements); only a body that fails is parsed again with
/// it, to name the bad field.
///
/// A body that is valid UTF-8 (checked once, whole) is read as a `str`: serde_json then
/// skips the UTF-8 check it otherwise makes on every string, which on a body of two
/// million short element strings is a call per element. Any other body goes the slice
/// way, and both ways report a failure through the same tracked re-parse.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    let parsed = match std::str::from_utf8(bytes) {
        Ok(text) => deserialize_whole(&mut serde_json::Deserializer::from_str(text)),
        Err(_) => deserialize_whole(&mut serde_json::Deserializer::from_slice(bytes)),
    };
    parsed.or_else(|_| parse_tracking_the_path(bytes))
}

fn deserialize_whole<'de, T: DeserializeOwned, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
) -> serde_json::Result<T> {
    let value = T::deserialize(&mut *de)?;
    de.end()?;
    Ok(value)
}

fn parse_tracking_the_path<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let mut path = pointer(e.path());
        let inner = e.into_inner();
        if !inner.is_data() {
            return Problem::new(ErrorCode::MalformedJson, inner.to_string());
        }
        let message = inner.to_string();
        // Serde reports a missing field at its parent's path, naming it only in the message.
        if let Some(name) = message
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
        {
            path = format!("{path}/{}", escape(name));
        }
        let message = message
            .split(" at line ")
            .next()
            .unwrap_or(&message)
            .to_string();
        Problem::at(ErrorCode::InvalidRequest, path, message)
    })?;
    de.end()
        .map_err(|e| Problem::new(ErrorCode::MalformedJson, e.to_string()))?;
    Ok(value)
}

/// The query string, deserialised into `T`. An empty value (`?format=`) counts as absent,
/// so `T`'s optional fields take their defaults; a malformed one is 422
/// `invalid_parameter` at `/name`.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        let query = parts.uri.query().unwrap_or("");
        let pairs = form_urlencoded::parse(query.as_bytes()).filter(|(_, v)| !v.is_empty());
        parameters("query", pairs).map(ApiQuery)
    }
}

/// The path parameters, deserialised into `T` (a struct naming them). A value that does
/// not parse, or is not UTF-8 once percent-decoded, is 422 `invalid_parameter` at `/name`.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        use axum::extract::rejection::RawPathParamsRejection;
        let raw = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|e| match e {
                // axum names the parameter only in its message: "… in `key`".
                RawPathParamsRejection::InvalidUtf8InPathParam(bad) => {
                    let text = bad.body_text();
                    let key = text.split('`').nth(1).unwrap_or_default();
                    Problem::at(
                        ErrorCode::InvalidParameter,
                        format!("/{}", escape(key)),
                        "path parameter: not UTF-8 once percent-decoded",
                    )
                }
                other => Problem::new(ErrorCode::Internal, other.body_text()),
            })?;
        let pairs = raw
            .iter()
            .map(|(k, v)| (Cow::Borrowed(k), Cow::Borrowed(v)));
        parameters("path", pairs).map(ApiPath)
    }
}

/// The one path parameter of `/…/{id}` routes.
#[derive(serde::Deserialize)]
pub struct IdParam {
    pub id: String,
}

/// Deserialises name/value pairs the way a query string is, with the bad parameter's name.
fn parameters<'a, T: DeserializeOwned>(
    kind: &str,
    pairs: impl Iterator<Item = (Cow<'a, str>, Cow<'a, str>)>,
) -> Result<T, Problem> {
    let pairs: Vec<_> = pairs.collect();
    let encoded = serde_urlencoded::to_string(&pairs).unwrap_or_default();
    let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(encoded.as_bytes()));
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = pointer(e.path());
        let message = e.into_inner().to_string();
        let path = if path.is_empty() {
            // Serde names a missing or duplicated parameter only in its message.
            message
                .split('`')
                .nth(1)
                .map_or_else(String::new, |name| format!("/{}", escape(name)))
        } else {
            path
        };
        Problem::at(
            ErrorCode::InvalidParameter,
            path,
            format!("{kind} parameter: {message}"),
        )
    })
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn pointer(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|s| match s {
            Segment::Seq { index } => Some(format!("/{index}")),
            Segment::Map { key } => Some(format!("/{}", escape(key))),
            Segment::Enum { .. } => None,
            Segment::Unknown => Some("/?".into()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Req {
        field: String,
        items: Vec<Inner>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Inner {
        n: u32,
    }

    fn err(body: &str) -> Problem {
        parse::<Req>(body.as_bytes()).unwrap_err()
    }

    #[test]
    fn syntax_errors_are_400_and_shape_errors_422_with_a_pointer() {
        assert_eq!(err("{").code, ErrorCode::MalformedJson);
        assert_eq!(
            err(r#"{"field":"x","items":[]} trailing"#).code,
            ErrorCode::MalformedJson
        );
        let p = err(r#"{"field":"x","items":[{"n":1},{"n":"two"}]}"#);
        assert_eq!(p.code, ErrorCode::InvalidRequest);
        assert_eq!(p.errors[0].path, "/items/1/n");
        assert_eq!(err(r#"{"items":[]}"#).errors[0].path, "/field");
        assert_eq!(
            err(r#"{"field":"x","items":[],"extra/1":0}"#).errors[0].path,
            "/extra~11"
        );
    }

    #[test]
    fn bodies_that_are_not_utf8_are_read_as_bytes_with_the_same_answers() {
        // Valid UTF-8 is read as a str, anything else as a slice: the same values and the
        // same problems either way.
        let ok = parse::<Req>(r#"{"field":"h\u00e9 é","items":[{"n":1}]}"#.as_bytes()).unwrap();
        assert_eq!((ok.field.as_str(), ok.items.len()), ("hé é", 1));
        let mut bad = br#"{"field":"x","items":[{"n":1}],"#.to_vec();
        bad.extend_from_slice(b"\"\xff\": 1}");
        let p = parse::<Req>(&bad).unwrap_err();
        assert_eq!(p.code, ErrorCode::MalformedJson, "{p:?}");
        let mut bad_value = br#"{"field":""#.to_vec();
        bad_value.extend_from_slice(b"\xc3\x28\", \"items\": []}");
        assert_eq!(
            parse::<Req>(&bad_value).unwrap_err().code,
            ErrorCode::MalformedJson
        );
        let shape = br#"{"field":"x","items":[{"n":"one"}]}"#;
        let mut shape_not_utf8 = shape.to_vec();
        shape_not_utf8.extend_from_slice(b" \xff");
        assert_eq!(
            parse::<Req>(shape).unwrap_err().errors[0].path,
            "/items/0/n"
        );
        assert_eq!(
            parse::<Req>(&shape_not_utf8).unwrap_err().errors[0].path,
            "/items/0/n"
        );
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Params {
        n: Option<u64>,
        format: Option<String>,
    }

    async fn query(uri: &str) -> Result<Params, Problem> {
        let (mut parts, ()) = axum::http::Request::get(uri).body(()).unwrap().into_parts();
        ApiQuery::<Params>::from_request_parts(&mut parts, &())
            .await
            .map(|ApiQuery(p)| p)
    }

    #[tokio::test]
    async fn query_errors_are_422_at_the_parameter_and_empty_values_are_absent() {
        let p = query("/x?n=7&format=").await.unwrap();
        assert_eq!((p.n, p.format), (Some(7), None));
        for bad in ["/x?n=99999999999999999999", "/x?n=-1", "/x?n=seven"] {
            let e = query(bad).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidParameter, "{bad}");
            assert_eq!(e.errors[0].path, "/n", "{bad}");
        }
        let e = query("/x?format=a&format=b").await.unwrap_err();
        assert_eq!(
            (e.code, e.errors[0].path.as_str()),
            (ErrorCode::InvalidParameter, "/format")
        );
    }
}

/// A request object nested in another: serde's derived structs also take a JSON array of
/// the fields in order (`[null, null]` for two optional ones), which the schema does not
/// allow. This takes objects only, and keeps the error paths inside them.
#[derive(Clone, Debug, Default)]
pub struct ObjectOnly<T>(pub T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Fields<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Fields(std::marker::PhantomData))
            .map(ObjectOnly)
    }
}
