//! `POST /zk/msm`: multi-scalar multiplication over G1 of BN254 and BLS12-381.

use super::array_operands::{object_operand, ArrayRefDoc, ArrayScope, ObjectOperand};
use super::bounded::AtMost;
use super::domain_errors::{invalid_points, msm_shape};
use super::elements::{Elements, ElementsDoc, Encoding};
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::{blocking_if, bulk, job_timeout, json_body, AnswerForm, ApiBody, AppState};
use crate::backend::BackendChoice;
use crate::ops::zk::msm::{Curve, MsmJob, PointErrors, Points, RawPoint};
use crate::ops::zk::FieldVec;
use axum::extract::State;
use axum::response::Response;
use base64::Engine;
use num_bigint::BigUint;
use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::sync::Arc;
use utoipa::ToSchema;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
/// Up to this many points the request is decoded on the runtime thread.
const INLINE_POINTS: usize = 16;

/// Σ sᵢ·Pᵢ for one scalar vector, or for each vector of a batch over the same points.
/// Most scalar vectors one `scalar_batch` takes.
pub const MAX_SCALAR_VECTORS: usize = 1 << 16;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"curve": "bn254_g1", "scalars": ["2", "3"],
    "points": [{"x": "1", "y": "2"}, null]}))]
pub struct MsmRequest {
    pub curve: Curve,
    /// One scalar per point: canonical integers below the group order r (the
    /// `bn254_fr` / `bls12_381_fr` modulus), **not** in Montgomery form. In base64, 32
    /// little-endian bytes each. Give this or `scalar_batch`.
    #[schema(value_type = Option<ElementsDoc>)]
    pub scalars: Option<Elements>,
    /// Several scalar vectors over the same points, each as `scalars`; the answer has one
    /// result per vector, in order. At most 65,536 vectors.
    #[schema(value_type = Option<Vec<ElementsDoc>>, max_items = 65536)]
    pub scalar_batch: Option<AtMost<Elements, MAX_SCALAR_VECTORS>>,
    /// Affine points with canonical coordinates (below the base field modulus q, not in
    /// Montgomery form), `null` for the identity. Each must be on the curve and, for
    /// BLS12-381, in the prime-order subgroup.
    #[schema(value_type = PointsDoc)]
    pub points: PointsIn,
    /// How scalars, points and the result are written.
    #[serde(default)]
    pub encoding: Encoding,
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

/// Documentation form of an affine point.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct AffinePointDoc {
    /// Decimal or `0x` hex (output follows `encoding`).
    #[schema(example = "1")]
    x: String,
    #[schema(example = "2")]
    y: String,
}

/// Documentation form of a point vector: a bare array or one bare base64 string.
#[derive(ToSchema)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum PointsDoc {
    /// `{x, y}` objects, `null` for the identity.
    List(Vec<Option<AffinePointDoc>>),
    /// With `"encoding": "base64"`: per point x ‖ y, each coordinate little-endian and
    /// fixed-width (32 bytes for bn254_g1, 48 for bls12_381_g1); all zero bytes for the
    /// identity (Ethereum's convention: (0, 0) is on neither curve).
    Base64(String),
    /// A resident array of points of this curve (`POST /arrays`), used without another check.
    Array(ArrayRefDoc),
}

/// Documentation form of one result point: an `{x, y}` object (or `null`) or one base64
/// string.
#[derive(ToSchema)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum PointOutDoc {
    /// The affine point (`null` for the identity).
    Affine(Option<AffinePointDoc>),
    /// With `"encoding": "base64"`: x ‖ y little-endian, all zero for the identity.
    Base64(String),
}

#[derive(Serialize, ToSchema)]
#[schema(example = json!({"curve": "bn254_g1", "encoding": "decimal", "points": 2, "result": {"x": "1368015179489954701390400359078579693043519447331113978918064868415326638035", "y": "9918110051302171585080402603319702774565515993150576347155970296011118125764"}}))]
pub struct MsmResponse {
    pub curve: Curve,
    pub encoding: Encoding,
    /// How many points each sum ran over.
    pub points: usize,
    /// Σ sᵢ·Pᵢ, when `scalars` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<PointOutDoc>)]
    pub result: Option<PointOut>,
    /// One sum per vector of `scalar_batch`, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<PointOutDoc>>)]
    pub results: Option<Vec<PointOut>>,
}

/// Points as received: coordinate strings, one base64 string, or a buffer of a bulk
/// body: `u64` words shaped `[n, 2, w]`, x then y of each point in `w` little-endian
/// words (4 for BN254, 6 for BLS12-381), all zero for the identity: the base64 form's
/// bytes.
pub enum PointsIn {
    List(Vec<Option<PointStrings>>),
    Base64(String),
    Buffer {
        dtype: crate::wire::Dtype,
        shape: Vec<u64>,
        bytes: bytes::Bytes,
    },
    /// `{"array": id}`: a resident array's points (`api::array_operands`), checked when
    /// the array was made.
    Array(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PointStrings {
    x: String,
    y: String,
}

impl PointsIn {
    fn approx_len(&self, curve: Curve) -> usize {
        match self {
            PointsIn::List(v) => v.len(),
            PointsIn::Base64(s) => s.len() / 4 * 3 / (2 * curve.coordinate_bytes()),
            PointsIn::Buffer { bytes, .. } => bytes.len() / (2 * curve.coordinate_bytes()),
            PointsIn::Array(_) => 0,
        }
    }

    /// The points, checked, or those of the resident array named (shared, not copied);
    /// `path` is the pointer of this list in the request.
    pub(super) fn decode(
        &self,
        curve: Curve,
        encoding: Encoding,
        max: usize,
        path: &str,
        arrays: &ArrayScope,
    ) -> Result<Arc<Points>, Problem> {
        if let PointsIn::Array(id) = self {
            return arrays.points(id, curve, path);
        }
        self.decode_inline(curve, encoding, max, path).map(Arc::new)
    }

    fn decode_inline(
        &self,
        curve: Curve,
        encoding: Encoding,
        max: usize,
        path: &str,
    ) -> Result<Points, Problem> {
        let n = self.approx_len(curve);
        if n > max {
            return Err(Problem::at(
                ErrorCode::PayloadTooLarge,
                path,
                format!("{n} points is more than the server's limit of {max} (--max-elements)"),
            ));
        }
        let checked = match (self, encoding) {
            (PointsIn::Buffer { dtype, shape, bytes }, _) => {
                let words = curve.coordinate_bytes() / 8;
                let want = [shape.first().copied().unwrap_or(0), 2, words as u64];
                if *dtype != crate::wire::Dtype::U64 {
                    return Err(Problem::at(
                        ErrorCode::InvalidRequest,
                        format!("{path}/dtype"),
                        format!("points are u64 words, not {}", dtype.name()),
                    ));
                }
                if shape[..] != want {
                    return Err(Problem::at(
                        ErrorCode::InvalidRequest,
                        format!("{path}/shape"),
                        format!(
                            "{} points are [n, 2, {words}]: x then y in {words} little-endian words each",
                            curve.name()
                        ),
                    ));
                }
                Points::from_le_bytes(curve, bytes)
            }
            (PointsIn::List(list), Encoding::Decimal | Encoding::Hex) => {
                Points::validate(curve, &parse_list(list, path)?)
            }
            (PointsIn::Base64(text), Encoding::Base64) => {
                let bytes = B64.decode(text).map_err(|e| {
                    Problem::at(
                        ErrorCode::InvalidPoint,
                        path,
                        format!("invalid base64: {e}"),
                    )
                })?;
                Points::from_le_bytes(curve, &bytes)
            }
            (PointsIn::Base64(_), _) => {
                return Err(Problem::at(
                    ErrorCode::InvalidRequest,
                    path,
                    "a string is only accepted with \"encoding\": \"base64\"; send an array of {x, y} otherwise",
                ))
            }
            (PointsIn::List(_), Encoding::Base64) => {
                return Err(Problem::at(
                    ErrorCode::InvalidRequest,
                    path,
                    "with \"encoding\": \"base64\" send one base64 string",
                ))
            }
            (PointsIn::Array(_), _) => unreachable!("decode resolves arrays"),
        };
        checked.map_err(|e| invalid_points(e, path))
    }
}

/// Coordinates of every listed point; malformed numbers are reported like bad points.
fn parse_list(list: &[Option<PointStrings>], path: &str) -> Result<Vec<RawPoint>, Problem> {
    let mut errors = PointErrors {
        listed: Vec::new(),
        count: 0,
    };
    let mut raw = Vec::with_capacity(list.len());
    for (i, p) in list.iter().enumerate() {
        let Some(p) = p else {
            raw.push(None);
            continue;
        };
        let (name, why) = match (parse_uint(&p.x), parse_uint(&p.y)) {
            (Ok(x), Ok(y)) => {
                raw.push(Some((x, y)));
                continue;
            }
            (Err(e), _) => ("x", e),
            (_, Err(e)) => ("y", e),
        };
        errors.count += 1;
        if errors.listed.len() < 16 {
            errors.listed.push((i, format!("{name}: {why}")));
        }
        raw.push(None);
    }
    if errors.count > 0 {
        return Err(invalid_points(errors, path));
    }
    Ok(raw)
}

/// A non-negative integer as decimal or `0x` hex.
fn parse_uint(s: &str) -> Result<BigUint, String> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (s, 10),
    };
    // Coordinates are below 2^384: about 116 decimal digits; refuse megabyte numbers early.
    if digits.is_empty() || digits.len() > 200 {
        return Err(format!("{s:.40}: not a decimal or 0x-hex coordinate"));
    }
    BigUint::parse_bytes(digits.as_bytes(), radix)
        .ok_or_else(|| format!("{s:.40}: not a decimal or 0x-hex coordinate"))
}

impl<'de> Deserialize<'de> for PointsIn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PointsVisitor)
    }
}

struct PointsVisitor;

impl<'de> Visitor<'de> for PointsVisitor {
    type Value = PointsIn;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of {x, y} objects or nulls, or a base64 string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<PointsIn, E> {
        Ok(PointsIn::Base64(v.to_string()))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<PointsIn, A::Error> {
        Ok(match object_operand(map)? {
            ObjectOperand::Array(id) => PointsIn::Array(id),
            ObjectOperand::Buffer(b, bytes) => PointsIn::Buffer {
                dtype: b.dtype,
                shape: b.shape,
                bytes,
            },
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PointsIn, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(p) = seq.next_element::<Option<PointStrings>>()? {
            out.push(p);
        }
        Ok(PointsIn::List(out))
    }
}

/// One result point in the response's encoding.
pub enum PointOut {
    Identity,
    Affine { x: String, y: String },
    Base64(String),
}

impl PointOut {
    pub(super) fn of(results: &Points, i: usize, encoding: Encoding) -> PointOut {
        let text = |v: BigUint| match encoding {
            Encoding::Hex => format!("0x{v:x}"),
            _ => v.to_string(),
        };
        match (encoding, results.coordinates(i)) {
            (Encoding::Base64, _) => {
                let width = 2 * results.curve().coordinate_bytes();
                PointOut::Base64(B64.encode(&results.to_le_bytes()[i * width..(i + 1) * width]))
            }
            (_, None) => PointOut::Identity,
            (_, Some((x, y))) => PointOut::Affine {
                x: text(x),
                y: text(y),
            },
        }
    }
}

impl Serialize for PointOut {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PointOut::Identity => s.serialize_none(),
            PointOut::Base64(b) => s.serialize_str(b),
            PointOut::Affine { x, y } => {
                let mut st = s.serialize_struct("Point", 2)?;
                st.serialize_field("x", x)?;
                st.serialize_field("y", y)?;
                st.end()
            }
        }
    }
}

#[utoipa::path(
    post, path = "/zk/msm", tag = "zk", operation_id = "msm", summary = "Multi-scalar multiplication Σ sᵢ·Pᵢ",
    description = "Over bn254_g1 or bls12_381_g1, one scalar vector (`scalars` → `result`) or several over the same \
        points (`scalar_batch` → `results`). Every point is checked: canonical coordinates, on the curve, and for \
        BLS12-381 in the prime-order subgroup; a bad one is refused with 422 invalid_point naming its index. \
        The result is the affine sum, `null` for the identity. The CPU backend is arkworks' Pippenger; the CUDA \
        backend a bucket method with signed windows. Both give the same point (affine form is unique).",
    request_body(content((MsmRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The sum(s)", body = MsmResponse),
        (status = 413, description = "More points or scalars than --max-elements"),
        (status = 410, description = "array_lost: an operand names a result held only on a device, which lost it"),
        (status = 422, description = "invalid_request, invalid_point, invalid_field_element, length_mismatch, invalid_parameter",
            example = json!({"type": "urn:gpu-ops:problem:invalid_point", "title": "A point is malformed, not on the curve, or outside the prime-order subgroup",
                "status": 422, "detail": "/points/1: not on the curve y² = x³ + 3", "code": "invalid_point",
                "request_id": "0d9f4b52-8c1e-4c39-9d5a-3b1f0e2a7c44", "errors": [{"path": "/points/1", "message": "not on the curve y² = x³ + 3"}]})),
    ),
    security((), ("bearer" = []))
)]
pub async fn msm(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(req): ApiBody<MsmRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let (curve, encoding, backend) = (req.curve, req.encoding, req.backend);
    let batched = req.scalar_batch.is_some();
    let max = state.settings.config.max_elements;
    let multiples = state.settings.config.msm_precompute_factor;
    let large = req.points.approx_len(curve) > INLINE_POINTS;
    // Resident points stay on a device after their first upload there.
    let device_key = match &req.points {
        PointsIn::Array(id) => Some(crate::arrays::device_key(id)),
        _ => None,
    };
    let build = move || -> Result<MsmJob, Problem> {
        let scalars = decode_scalars(
            req.scalars,
            req.scalar_batch,
            (curve, encoding, max),
            &arrays,
        )?;
        let points = req
            .points
            .decode(curve, encoding, max, "/points", &arrays)?;
        let job = MsmJob::new(points, scalars).map_err(|e| msm_shape(e, batched))?;
        Ok(match device_key {
            Some(key) => job
                .with_device_key(key)
                .with_precomputed_multiples(multiples),
            None => job,
        })
    };
    let job = blocking_if(large, build).await?;
    let n_points = job.points().len();
    let done = state.pool.submit(job, backend, timeout).await?;
    let sums = done.output;
    let mut out: Vec<PointOut> = (0..sums.len())
        .map(|i| PointOut::of(&sums, i, encoding))
        .collect();
    let (result, results) = if batched {
        (None, Some(out))
    } else {
        (out.pop(), None)
    };
    let body = MsmResponse {
        curve,
        encoding,
        points: n_points,
        result,
        results,
    };
    // The sums are a few points: a bulk answer carries them in its header as JSON does.
    bulk::answer(form, &body, |b| json_body(b, 256), &done.run)
}

fn decode_scalars(
    scalars: Option<Elements>,
    scalar_batch: Option<AtMost<Elements, MAX_SCALAR_VECTORS>>,
    (curve, encoding, max): (Curve, Encoding, usize),
    arrays: &ArrayScope,
) -> Result<Vec<FieldVec>, Problem> {
    let field = curve.scalar_field();
    let vectors = match (scalars, scalar_batch) {
        (Some(s), None) => vec![s.decode(field, encoding, "/scalars", max, arrays)?],
        (None, Some(batch)) => {
            if batch.len() > MAX_SCALAR_VECTORS {
                return Err(Problem::at(
                    ErrorCode::InvalidParameter,
                    "/scalar_batch",
                    format!("at most {MAX_SCALAR_VECTORS} scalar vectors"),
                ));
            }
            let per_element = match encoding {
                Encoding::Base64 => field.byte_width(),
                _ => 1,
            };
            let total: usize = batch.iter().map(|s| s.approx_len() / per_element).sum();
            if total > max {
                return Err(too_many(total, max));
            }
            batch
                .into_vec()
                .into_iter()
                .enumerate()
                .map(|(k, s)| {
                    let path = format!("/scalar_batch/{k}");
                    s.decode(field, encoding, &path, max, arrays)
                })
                .collect::<Result<_, _>>()?
        }
        (Some(_), Some(_)) => {
            return Err(Problem::at(
                ErrorCode::InvalidRequest,
                "/scalar_batch",
                "give scalars (one vector) or scalar_batch (several), not both",
            ))
        }
        (None, None) => {
            return Err(Problem::at(
                ErrorCode::InvalidRequest,
                "/scalars",
                "give scalars (one vector) or scalar_batch (several)",
            ))
        }
    };
    let total: usize = vectors.iter().map(FieldVec::len).sum();
    if total > max {
        return Err(too_many(total, max));
    }
    Ok(vectors)
}

fn too_many(n: usize, max: usize) -> Problem {
    Problem::at(
        ErrorCode::PayloadTooLarge,
        "/scalar_batch",
        format!("{n} scalars in all is more than the server's limit of {max} (--max-elements)"),
    )
}
