//! `/mpc/shamir/*`: Shamir secret sharing of field vectors, with Feldman commitments.

use super::array_operands::ArrayScope;
use super::bounded::AtMost;
use super::elements::{Elements, ElementsDoc, ElementsOut, ElementsOutDoc, Encoding};
use super::msm::{PointOut, PointsDoc, PointsIn};
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::{blocking, blocking_if, bulk, job_timeout, json_body, AnswerForm, ApiBody, AppState};
use crate::backend::BackendChoice;
use crate::ops::dp::NoiseKey;
use crate::ops::mpc::feldman::{curve_of, CommitJob, ShareCheckJob, MAX_COMMITMENTS};
use crate::ops::mpc::shamir::{
    check_points, check_threshold, dealer_coefficients, CombineJob, ShareJob, MAX_SHARES,
};
use crate::ops::zk::msm::{Curve, Points};
use crate::ops::zk::{Field, FieldVec, U256};
use crate::ops::FieldPath;
use axum::extract::State;
use axum::response::Response;
use base64::Engine;
use serde::ser::SerializeSeq;
use serde::{Deserialize, Serialize, Serializer};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

/// Above this many elements a request is decoded and answered on a blocking thread.
const INLINE_ELEMENTS: usize = 16 * 1024;

/// Secrets to split among holders.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"field": "bn254_fr", "secrets": ["42", "7"], "threshold": 2, "share_count": 3}))]
pub struct ShamirSplitRequest {
    pub field: Field,
    /// The secrets: canonical elements, each shared on its own polynomial.
    #[schema(value_type = ElementsDoc)]
    pub secrets: Elements,
    /// t: how many shares recover the secrets; fewer reveal nothing about them.
    #[schema(minimum = 2, maximum = 1024)]
    pub threshold: usize,
    /// n: how many shares to make (t ≤ n ≤ 1024).
    #[schema(minimum = 2, maximum = 1024)]
    pub share_count: usize,
    /// The holders' points, one per share, distinct and nonzero, as decimal or `0x`-hex
    /// strings (in every encoding); 1, 2, …, n by default.
    #[schema(value_type = Option<Vec<String>>, max_items = 1024)]
    pub x_coordinates: Option<AtMost<String, MAX_SHARES>>,
    /// Also answer Feldman commitments to every coefficient (bn254_fr on bn254_g1,
    /// bls12_381_fr on bls12_381_g1), so each holder can check its share with
    /// `/mpc/shamir/verify`. At most 65,536 secrets × threshold.
    #[serde(default)]
    pub commitments: bool,
    #[serde(default)]
    pub encoding: Encoding,
    /// Test servers only (--dp-allow-client-seed): reproducible coefficients. Anyone who
    /// knows the seed can recover the secrets from one share.
    pub seed: Option<u64>,
    /// Where the shares are evaluated; commitments always run on the CPU.
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

/// One holder's share: its point and one value per secret.
#[derive(Serialize, ToSchema)]
pub struct ShareOut {
    /// Decimal, or `0x` hex with `"encoding": "hex"`.
    #[schema(value_type = String, example = "1")]
    pub x: String,
    #[schema(value_type = ElementsOutDoc)]
    pub values: ElementsOut,
}

#[derive(Serialize, ToSchema)]
#[schema(example = json!({"field": "bn254_fr", "encoding": "decimal", "threshold": 2, "length": 1,
    "shares": [{"x": "1", "values": ["1044"]}, {"x": "2", "values": ["2046"]}, {"x": "3", "values": ["3048"]}]}))]
pub struct ShamirSplitResponse {
    pub field: Field,
    pub encoding: Encoding,
    pub threshold: usize,
    /// Secrets shared: the length of every share's `values`.
    pub length: usize,
    /// One per holder, in the order of `x_coordinates`.
    pub shares: Vec<ShareOut>,
    /// With `"commitments": true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commitments: Option<CommitmentsOut>,
}

/// Feldman commitments: row k holds coefficient k of every secret times the curve's
/// generator (row 0 commits the secrets themselves).
#[derive(Serialize, ToSchema)]
pub struct CommitmentsOut {
    pub curve: Curve,
    /// `threshold` rows of `length` points; each row a list of `{x, y}` (or one base64
    /// string with `"encoding": "base64"`), in the form `/zk/msm` takes points.
    #[schema(value_type = Vec<PointsDoc>)]
    pub rows: Vec<PointRow>,
}

/// One row of points in the response's encoding.
pub struct PointRow {
    points: Points,
    encoding: Encoding,
}

impl Serialize for PointRow {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.encoding == Encoding::Base64 {
            let b64 = base64::engine::general_purpose::STANDARD;
            return s.serialize_str(&b64.encode(self.points.to_le_bytes()));
        }
        let mut seq = s.serialize_seq(Some(self.points.len()))?;
        for i in 0..self.points.len() {
            seq.serialize_element(&PointOut::of(&self.points, i, self.encoding))?;
        }
        seq.end()
    }
}

/// A point written in `encoding`'s string form.
fn x_text(x: U256, encoding: Encoding) -> String {
    let mut out = String::new();
    match encoding {
        Encoding::Hex => x.write_hex(&mut out),
        _ => x.write_decimal(&mut out),
    }
    out
}

/// A holder point: decimal or hex, canonical in `field`.
fn parse_x(text: &str, field: Field, path: &str) -> Result<U256, Problem> {
    let x = U256::parse(text).map_err(|e| {
        Problem::at(
            ErrorCode::InvalidFieldElement,
            path,
            format!("{text:.40}: {e}"),
        )
    })?;
    if x >= field.modulus() {
        return Err(Problem::at(
            ErrorCode::InvalidFieldElement,
            path,
            format!(
                "must be less than the {} modulus {}",
                field.name(),
                field.modulus()
            ),
        ));
    }
    Ok(x)
}

#[utoipa::path(
    post, path = "/mpc/shamir/split", tag = "mpc", operation_id = "shamir_split",
    summary = "Split secrets into n shares, any t of which recover them",
    description = "Each secret s_j becomes the constant term of a polynomial of degree t − 1 whose other \
        coefficients are uniform from ChaCha20 under a fresh key from the OS; share i is every polynomial at \
        x_i. The server sees the secrets: this is for a dealer that may (see docs/SECURITY.md). Shares are \
        bit-identical on the CPU and CUDA backends.",
    request_body(content((ShamirSplitRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The shares (and commitments)", body = ShamirSplitResponse),
        (status = 403, description = "seed_not_allowed"),
        (status = 413, description = "More secrets than --max-elements, secrets × share_count over --max-elements, or with commitments secrets × threshold over 65,536"),
        (status = 410, description = "array_lost: an operand names a result held only on a device, which lost it"),
        (status = 422, description = "invalid_request, invalid_field_element, invalid_parameter (threshold, share_count, x_coordinates, empty secrets, commitments for a field without a curve)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn shamir_split(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(req): ApiBody<ShamirSplitRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let (field, encoding, t, n) = (req.field, req.encoding, req.threshold, req.share_count);
    check_threshold(t, n)?;
    let xs = holder_points(field, n, req.x_coordinates.as_deref())?;
    let key = super::dp::random_key(&state, req.seed, |s| {
        NoiseKey::derive(b"gpu-ops/mpc/shamir/client-seed/v1", s)
    })?;
    let max = state.settings.config.max_elements;
    let large = req.secrets.approx_len() > INLINE_ELEMENTS;
    let commitments = req.commitments;
    let build = move || -> Result<(ShareJob, Option<CommitJob>), Problem> {
        let secrets = req
            .secrets
            .decode(field, encoding, "/secrets", max, &arrays)?;
        if secrets.is_empty() {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/secrets",
                "give at least one secret",
            ));
        }
        if secrets.len().saturating_mul(n) > max {
            return Err(Problem::at(
                ErrorCode::PayloadTooLarge,
                "/secrets",
                format!("{} secrets × {n} shares: give at most {} secrets (the shares' values are bounded by --max-elements, {max})", secrets.len(), max / n),
            ));
        }
        if commitments && secrets.len().saturating_mul(t) > MAX_COMMITMENTS {
            return Err(Problem::at(
                ErrorCode::PayloadTooLarge,
                "/commitments",
                format!(
                    "{} secrets × threshold {t}: at most {MAX_COMMITMENTS} commitments per split",
                    secrets.len()
                ),
            ));
        }
        let coeffs = Arc::new(dealer_coefficients(&secrets, t, &key));
        let commit = commitments
            .then(|| CommitJob::new(coeffs.clone()))
            .transpose()?;
        let xs = FieldVec::from_integers(field, &xs).expect("points were checked");
        Ok((ShareJob::new(coeffs, secrets.len(), xs), commit))
    };
    let (job, commit) = blocking_if(large, build).await?;
    let m = job.secrets();
    let points = job.points().clone();
    let (shares, rows) = tokio::join!(state.pool.submit(job, req.backend, timeout), async {
        match commit {
            Some(c) => Some(state.pool.submit(c, BackendChoice::Auto, timeout).await),
            None => None,
        }
    });
    let (shares, rows) = (shares?, rows.transpose()?);
    let run = shares.run;
    let encode = move || {
        let values = shares.output;
        let body = ShamirSplitResponse {
            field,
            encoding,
            threshold: t,
            length: m,
            shares: (0..points.len())
                .zip(values)
                .map(|(i, values)| ShareOut {
                    x: x_text(points.get(i), encoding),
                    values: ElementsOut { values, encoding },
                })
                .collect(),
            commitments: rows.map(|r| commitment_rows(r.output, m, encoding)),
        };
        // About 80 bytes a decimal 256-bit value.
        let hint = m.saturating_mul(body.shares.len()).saturating_mul(80);
        bulk::answer(form, &body, |b| json_body(b, hint), &run)
    };
    blocking_if(large, encode).await
}

/// The holders' points: given (checked canonical, nonzero, distinct, n of them) or 1..n.
fn holder_points(field: Field, n: usize, given: Option<&[String]>) -> Result<Vec<U256>, Problem> {
    let at = |i: usize| FieldPath::root().field("x_coordinates").index(i);
    let Some(given) = given else {
        // n ≤ 1024 is below every field's modulus.
        return Ok((1..=n as u64).map(U256::from_u64).collect());
    };
    if given.len() != n {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/x_coordinates",
            format!(
                "{} points for share_count {n}: give one per share",
                given.len()
            ),
        ));
    }
    let xs = given
        .iter()
        .enumerate()
        .map(|(i, text)| parse_x(text, field, &format!("/x_coordinates/{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    check_points(&xs, at)?;
    Ok(xs)
}

/// `threshold` rows of `m` points from the commitments, row after row.
fn commitment_rows(points: Points, m: usize, encoding: Encoding) -> CommitmentsOut {
    let curve = points.curve();
    let rows = match points {
        Points::Bn254G1(p) => p
            .chunks(m)
            .map(|c| Points::Bn254G1(c.to_vec()))
            .collect::<Vec<_>>(),
        Points::Bls12_381G1(p) => p
            .chunks(m)
            .map(|c| Points::Bls12_381G1(c.to_vec()))
            .collect(),
    };
    CommitmentsOut {
        curve,
        rows: rows
            .into_iter()
            .map(|points| PointRow { points, encoding })
            .collect(),
    }
}

/// A share as a holder sends it back.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareIn {
    /// The holder's point: decimal or `0x` hex, in every encoding.
    #[schema(example = "1")]
    pub x: String,
    /// One value per secret, in `encoding`.
    #[schema(value_type = ElementsDoc)]
    pub values: Elements,
}

/// Shares to combine.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"field": "bn254_fr", "threshold": 2,
    "shares": [{"x": "1", "values": ["1044"]}, {"x": "3", "values": ["3048"]}]}))]
pub struct ShamirCombineRequest {
    pub field: Field,
    /// t, as at the split.
    #[schema(minimum = 2, maximum = 1024)]
    pub threshold: usize,
    /// At least `threshold` shares with distinct points. The first `threshold` recover the
    /// secrets; each further one is checked against them.
    #[schema(max_items = 1024)]
    pub shares: Vec<ShareIn>,
    #[serde(default)]
    pub encoding: Encoding,
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
#[schema(example = json!({"field": "bn254_fr", "encoding": "decimal", "length": 1, "shares_used": 2, "shares_checked": 0, "secrets": ["42"]}))]
pub struct ShamirCombineResponse {
    pub field: Field,
    pub encoding: Encoding,
    pub length: usize,
    /// The first `threshold` shares, which the secrets were interpolated from.
    pub shares_used: usize,
    /// Further shares, each found on the same polynomials.
    pub shares_checked: usize,
    #[schema(value_type = ElementsOutDoc)]
    pub secrets: ElementsOut,
}

#[utoipa::path(
    post, path = "/mpc/shamir/combine", tag = "mpc", operation_id = "shamir_combine",
    summary = "Recover secrets from any t shares",
    description = "Lagrange interpolation at 0 from the first `threshold` shares, batched over every secret; each \
        share beyond them is compared with the value those predict at its point, and a share off the \
        polynomials is refused with 422 inconsistent_shares naming it and the first differing value. Fewer \
        than `threshold` shares: 422 insufficient_shares. Bit-identical on the CPU and CUDA backends.",
    request_body(content((ShamirCombineRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The secrets", body = ShamirCombineResponse),
        (status = 413, description = "A share longer than --max-elements"),
        (status = 410, description = "array_lost: an operand names a result held only on a device, which lost it"),
        (status = 422, description = "invalid_request, invalid_field_element, invalid_parameter (zero or repeated x, ragged shares), insufficient_shares, inconsistent_shares"),
    ),
    security((), ("bearer" = []))
)]
pub async fn shamir_combine(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(req): ApiBody<ShamirCombineRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let (field, encoding) = (req.field, req.encoding);
    let max = state.settings.config.max_elements;
    let total: usize = req.shares.iter().map(|s| s.values.approx_len()).sum();
    let large = total > INLINE_ELEMENTS;
    let threshold = req.threshold;
    let build = move || -> Result<CombineJob, Problem> {
        if req.shares.len() > MAX_SHARES {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/shares",
                format!("at most {MAX_SHARES} shares"),
            ));
        }
        let mut xs = Vec::with_capacity(req.shares.len());
        let mut values = Vec::with_capacity(req.shares.len());
        for (i, share) in req.shares.into_iter().enumerate() {
            xs.push(parse_x(&share.x, field, &format!("/shares/{i}/x"))?);
            values.push(share.values.decode(
                field,
                encoding,
                &format!("/shares/{i}/values"),
                max,
                &arrays,
            )?);
        }
        Ok(CombineJob::new(threshold, &xs, values)?)
    };
    let job = blocking_if(large, build).await?;
    let checked = job.extra_shares();
    let finisher = job.clone();
    let done = state.pool.submit(job, req.backend, timeout).await?;
    let run = done.run;
    let checks = state.metrics.shamir_share_checks.clone();
    let encode = move || {
        let finished = finisher.finish(done.output);
        let result = if finished.is_ok() {
            "consistent"
        } else {
            "inconsistent"
        };
        // A refused set counts once: its first share off the polynomials.
        let counted = if finished.is_ok() { checked } else { 1 };
        checks
            .with_label_values(&["combine", result])
            .inc_by(counted as u64);
        let secrets = finished?;
        let body = ShamirCombineResponse {
            field,
            encoding,
            length: secrets.len(),
            shares_used: threshold,
            shares_checked: checked,
            secrets: ElementsOut {
                values: secrets,
                encoding,
            },
        };
        let hint = body.length.saturating_mul(80);
        bulk::answer(form, &body, |b| json_body(b, hint), &run)
    };
    blocking_if(large, encode).await
}

/// One share and the dealer's commitments.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShamirVerifyRequest {
    /// bn254_fr or bls12_381_fr: the fields with a commitment curve.
    pub field: Field,
    pub share: ShareIn,
    /// The split's `commitments.rows`: `threshold` rows of one point per value.
    #[schema(value_type = Vec<PointsDoc>, min_items = 1, max_items = 1024)]
    pub commitments: Vec<PointsIn>,
    #[serde(default)]
    pub encoding: Encoding,
    /// Where the check's multi-scalar multiplication runs.
    #[serde(default)]
    pub backend: BackendChoice,
    #[schema(minimum = 1, maximum = 9223372036854775807_u64)]
    pub timeout_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
#[schema(example = json!({"valid": true, "curve": "bn254_g1", "threshold": 2, "length": 1}))]
pub struct ShamirVerifyResponse {
    /// Whether every value of the share lies on the committed polynomials.
    pub valid: bool,
    pub curve: Curve,
    /// Rows of commitments: the polynomials' degree plus one.
    pub threshold: usize,
    pub length: usize,
}

#[utoipa::path(
    post, path = "/mpc/shamir/verify", tag = "mpc", operation_id = "shamir_verify",
    summary = "Check a share against the dealer's Feldman commitments",
    description = "valid when y_j·G = Σ_k x^k·C_kj for every value j, checked at once with fresh random weights ρ_j: \
        Σ_j ρ_j·y_j·G − Σ_kj ρ_j·x^k·C_kj must be the identity, one multi-scalar multiplication over the \
        commitments (the same MSM as /zk/msm, on the CPU or CUDA). A share wrong anywhere passes with \
        probability at most 1/r. Every commitment point is checked on the curve and in the subgroup.",
    request_body(content((ShamirVerifyRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "Whether the share is consistent", body = ShamirVerifyResponse),
        (status = 413, description = "More values or points than --max-elements, or rows × values over 65,536 commitments"),
        (status = 410, description = "array_lost: an operand names a result held only on a device, which lost it"),
        (status = 422, description = "invalid_request, invalid_field_element, invalid_point, invalid_parameter (field without a curve, zero x, empty values, commitments' shape)"),
    ),
    security((), ("bearer" = []))
)]
pub async fn shamir_verify(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(req): ApiBody<ShamirVerifyRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let (field, encoding) = (req.field, req.encoding);
    let Some(curve) = curve_of(field) else {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/field",
            "commitments exist for bn254_fr (bn254_g1) and bls12_381_fr (bls12_381_g1) only",
        ));
    };
    let max = state.settings.config.max_elements;
    let build = move || -> Result<(ShareCheckJob, usize, usize), Problem> {
        let x = parse_x(&req.share.x, field, "/share/x")?;
        check_points(&[x], |_| FieldPath::root().field("share").field("x"))?;
        let values = req
            .share
            .values
            .decode(field, encoding, "/share/values", max, &arrays)?;
        if values.is_empty() {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/share/values",
                "a share holds at least one value",
            ));
        }
        if req.commitments.is_empty() || req.commitments.len() > MAX_SHARES {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/commitments",
                format!("give 1 to {MAX_SHARES} rows"),
            ));
        }
        // Before any point is decoded: each costs an on-curve (and subgroup) check.
        if req.commitments.len().saturating_mul(values.len()) > MAX_COMMITMENTS {
            return Err(Problem::at(
                ErrorCode::PayloadTooLarge,
                "/commitments",
                format!(
                    "{} rows × {} values: at most {MAX_COMMITMENTS} commitments, as a split makes",
                    req.commitments.len(),
                    values.len()
                ),
            ));
        }
        let mut rows = Vec::with_capacity(req.commitments.len());
        for (k, row) in req.commitments.iter().enumerate() {
            let path = format!("/commitments/{k}");
            let points = row.decode(curve, encoding, max, &path, &arrays)?;
            if points.len() != values.len() {
                return Err(Problem::at(
                    ErrorCode::InvalidParameter,
                    path,
                    format!(
                        "{} points for {} values: one per value",
                        points.len(),
                        values.len()
                    ),
                ));
            }
            rows.push(Arc::unwrap_or_clone(points));
        }
        let (t, m) = (rows.len(), values.len());
        // Drawn now that the share is fixed: the weights must be unknown to whoever made it.
        let key = NoiseKey::from_os().map_err(Problem::internal)?;
        Ok((
            ShareCheckJob::new(Points::concat(rows), x, &values, &key)?,
            t,
            m,
        ))
    };
    let (job, threshold, length) = blocking(build).await?;
    let done = state.pool.submit(job, req.backend, timeout).await?;
    let valid = ShareCheckJob::holds(&done.output);
    let result = if valid { "consistent" } else { "inconsistent" };
    state
        .metrics
        .shamir_share_checks
        .with_label_values(&["verify", result])
        .inc();
    let body = ShamirVerifyResponse {
        valid,
        curve,
        threshold,
        length,
    };
    bulk::answer(form, &body, |b| json_body(b, 256), &done.run)
}

/// The mpc domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "mpc",
    description: "Multi-party computation: Shamir secret sharing with Feldman commitments",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(shamir_split))
        .routes(routes!(shamir_combine))
        .routes(routes!(shamir_verify))
}
