//! `ApiJson<T>`: the JSON body extractor. Every rejection becomes a problem with the
//! JSON-pointer path of the bad field; large bodies are parsed off the async runtime.

use super::problem::{ErrorCode, Problem};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;

pub struct ApiJson<T>(pub T);

/// Bodies above this are parsed on a blocking thread.
const INLINE_PARSE_BYTES: usize = 256 * 1024;

impl<S: Send + Sync, T: DeserializeOwned + Send + 'static> FromRequest<S> for ApiJson<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
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
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                Problem::new(
                    ErrorCode::PayloadTooLarge,
                    "the body is larger than --max-body-bytes",
                )
            } else {
                Problem::new(
                    ErrorCode::MalformedJson,
                    format!("could not read the body: {}", rejection.body_text()),
                )
            }
        })?;
        if bytes.len() > INLINE_PARSE_BYTES {
            tokio::task::spawn_blocking(move || parse(&bytes))
                .await
                .map_err(|e| {
                    Problem::new(ErrorCode::Internal, format!("parser task failed: {e}"))
                })?
        } else {
            parse(&bytes)
        }
        .map(ApiJson)
    }
}

pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
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
}
