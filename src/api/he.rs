//! `/he/*`: additively homomorphic aggregation of BFV ciphertexts (fhe.rs 0.1.1). The
//! aggregator sums ciphertexts it cannot read; keys and decryption exist only on servers
//! started in dealer mode (`--he-dealer-mode`), for tests and demonstrations.

use super::array_operands::ArrayScope;
use super::bounded::AtMost;
use super::byte_strings::{ByteStringDoc, ByteStringIn, ByteStringOut};
use super::integer_vectors::{U64sIn, U64sOut};
use super::openapi::Binary;
use super::problem::{ErrorCode, Problem};
use super::{blocking, bulk, job_timeout, json_body, AnswerForm, ApiBody, AppState};
use crate::backend::BackendChoice;
use crate::ops::he::params::PLAINTEXT_MODULUS;
use crate::ops::he::{check_fresh, CiphertextSumJob, ParameterSet, SumBuilder, Unfit};
use crate::wire::Dtype;
use axum::extract::State;
use axum::response::Response;
use fhe::bfv::{BfvParameters, Ciphertext, Encoding, Plaintext, PublicKey, SecretKey};
use fhe_traits::{
    DeserializeParametrized, FheDecoder, FheDecrypter, FheEncoder, FheEncrypter, FheParametrized,
    Serialize as _,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::routes;

/// Most ciphertexts one aggregate takes.
pub const MAX_CIPHERTEXTS: usize = 1024;

fn dealer_only(state: &AppState, what: &str) -> Result<(), Problem> {
    if state.settings.config.he_dealer_mode {
        Ok(())
    } else {
        Err(Problem::new(
            ErrorCode::HeDealerModeOff,
            format!("{what} needs a secret key on the server: only with --he-dealer-mode"),
        ))
    }
}

/// Bytes answered: base64 text, or a `u8` buffer in a bulk answer.
fn byte_string(bytes: Vec<u8>) -> ByteStringOut {
    ByteStringOut {
        dtype: Dtype::U8,
        bytes: bytes.into(),
    }
}

fn ciphertext_out(ct: &Ciphertext) -> ByteStringOut {
    byte_string(ct.to_bytes())
}

/// A key of `set` (`what`: "public key", "secret key") as sent at `path`, decoded by
/// fhe.rs; 422 `invalid_parameter` at `path` when it is not one.
fn key_of<K>(sent: &ByteStringIn, set: ParameterSet, path: &str, what: &str) -> Result<K, Problem>
where
    K: DeserializeParametrized + FheParametrized<Parameters = BfvParameters>,
    K::Error: std::fmt::Display,
{
    let bytes = sent.bytes(Dtype::U8, ErrorCode::InvalidParameter, path)?;
    K::from_bytes(&bytes, &set.parameters()).map_err(|e| {
        Problem::at(
            ErrorCode::InvalidParameter,
            path,
            format!("not a {what} of {set:?}: {e}"),
        )
    })
}

/// A ciphertext of `set` as fhe.rs decodes it, not yet checked for form (`check_fresh`,
/// or `SumBuilder::push`, which runs it).
fn ciphertext_of(set: ParameterSet, bytes: &[u8], path: &str) -> Result<Ciphertext, Problem> {
    Ciphertext::from_bytes(bytes, &set.parameters()).map_err(|e| {
        Problem::at(
            ErrorCode::InvalidCiphertext,
            path,
            format!("not a ciphertext of {set:?}: {e}"),
        )
    })
}

fn unfit(path: &str) -> impl FnOnce(Unfit) -> Problem + '_ {
    move |e| Problem::at(ErrorCode::InvalidCiphertext, path, e.to_string())
}

/// Runs fhe.rs on decoded input the crate accepted but may still assert on (a key's
/// polynomials are private to the crate, so their form cannot be checked beforehand): a
/// panic there is the input's fault, 422 at `path`, not the server's.
fn crate_call<T>(code: ErrorCode, path: &str, f: impl FnOnce() -> T) -> Result<T, Problem> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| {
        Problem::at(
            code,
            path,
            "fhe.rs refused it: not in the form its own encoder produces",
        )
    })
}

fn values_below_t(values: &[u64], slots: usize, path: &str) -> Result<(), Problem> {
    if values.is_empty() || values.len() > slots {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            path,
            format!("between 1 and {slots} values (the set's slots)"),
        ));
    }
    below_t(values, path)
}

/// Slot values and weights live in Z/t: each below t, else 422 at the first that is not.
fn below_t(values: &[u64], path: &str) -> Result<(), Problem> {
    match values.iter().position(|&v| v >= PLAINTEXT_MODULUS) {
        Some(i) => Err(Problem::at(
            ErrorCode::InvalidParameter,
            format!("{path}/{i}"),
            format!("below the plaintext modulus {PLAINTEXT_MODULUS}"),
        )),
        None => Ok(()),
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeKeysRequest {
    pub parameters: ParameterSet,
}

#[derive(Serialize, ToSchema)]
pub struct HeKeysResponse {
    pub parameters: ParameterSet,
    pub slots: usize,
    pub plaintext_modulus: u64,
    /// fhe.rs's own serialisation, standard base64; a `u8` buffer in a bulk answer.
    #[schema(value_type = String)]
    pub public_key: ByteStringOut,
    /// fhe.rs's own serialisation, standard base64; a `u8` buffer in a bulk answer.
    /// Whoever holds it decrypts everything.
    #[schema(value_type = String)]
    pub secret_key: ByteStringOut,
}

#[utoipa::path(
    post, path = "/he/keys", tag = "he", operation_id = "he_keys",
    summary = "A BFV key pair (dealer mode only)",
    request_body = HeKeysRequest,
    responses(
        (status = 200, description = "Keys", content((HeKeysResponse = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
        (status = 403, description = "he_dealer_mode_off"),
    ),
    security((), ("bearer" = []))
)]
pub async fn he_keys(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    super::ApiJson(req): super::ApiJson<HeKeysRequest>,
) -> Result<Response, Problem> {
    dealer_only(&state, "key generation")?;
    let set = req.parameters;
    blocking(move || {
        let par = set.parameters();
        let mut rng = rand::rng();
        let sk = SecretKey::random(&par, &mut rng);
        let pk = PublicKey::new(&sk, &mut rng);
        let body = HeKeysResponse {
            parameters: set,
            slots: set.degree(),
            plaintext_modulus: PLAINTEXT_MODULUS,
            public_key: byte_string(pk.to_bytes()),
            secret_key: byte_string(sk.to_bytes()),
        };
        let hint = (body.public_key.bytes.len() + body.secret_key.bytes.len()) / 3 * 4 + 256;
        bulk::reply(form, &body, |b| json_body(b, hint))
    })
    .await
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeEncryptRequest {
    pub parameters: ParameterSet,
    /// Standard base64, as `/he/keys` gives it; in the bulk form a `u8` buffer; or
    /// `{"array": id}`, a resident array of kind bytes.
    #[schema(value_type = ByteStringDoc)]
    pub public_key: ByteStringIn,
    /// Slot values, each below the plaintext modulus; at most the set's slots (the rest
    /// are 0). In the bulk form a `u64` buffer.
    #[schema(value_type = Vec<u64>)]
    pub values: U64sIn,
}

#[derive(Serialize, ToSchema)]
pub struct HeCiphertextResponse {
    pub parameters: ParameterSet,
    /// Standard base64; a `u8` buffer in a bulk answer.
    #[schema(value_type = String)]
    pub ciphertext: ByteStringOut,
}

#[utoipa::path(
    post, path = "/he/encrypt", tag = "he", operation_id = "he_encrypt",
    summary = "Encrypt slot values under a public key (the server sees them)",
    request_body(content((HeEncryptRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The ciphertext", body = HeCiphertextResponse),
        (status = 422, description = "invalid_parameter, unknown_array, array_mismatch"),
    ),
    security((), ("bearer" = []))
)]
pub async fn he_encrypt(
    State(_state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<HeEncryptRequest>,
) -> Result<Response, Problem> {
    req.public_key.resolve(&arrays, "/public_key")?;
    let set = req.parameters;
    let values = req.values.into_values("/values")?;
    values_below_t(&values, set.degree(), "/values")?;
    blocking(move || {
        let par = set.parameters();
        let pk: PublicKey = key_of(&req.public_key, set, "/public_key", "public key")?;
        let pt = Plaintext::try_encode(&values, Encoding::simd(), &par)
            .map_err(|e| Problem::new(ErrorCode::Internal, e.to_string()))?;
        let ct = crate_call(ErrorCode::InvalidParameter, "/public_key", || {
            pk.try_encrypt(&pt, &mut rand::rng())
        })?
        .map_err(|e| Problem::at(ErrorCode::InvalidParameter, "/public_key", e.to_string()))?;
        let body = HeCiphertextResponse {
            parameters: set,
            ciphertext: ciphertext_out(&ct),
        };
        let hint = body.ciphertext.bytes.len() / 3 * 4 + 64;
        bulk::reply(form, &body, |b| json_body(b, hint))
    })
    .await
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeAggregateRequest {
    pub parameters: ParameterSet,
    /// Standard base64 of each ciphertext; in the bulk form each a `u8` buffer; each may
    /// be `{"array": id}`, a resident array of kind bytes.
    #[schema(value_type = Vec<ByteStringDoc>, max_items = 1024)]
    pub ciphertexts: AtMost<ByteStringIn, MAX_CIPHERTEXTS>,
    /// One plaintext scalar per ciphertext (below the plaintext modulus); slot sums are
    /// Σ w·m mod 65537.
    #[schema(value_type = Option<Vec<u64>>)]
    pub weights: Option<AtMost<u64, MAX_CIPHERTEXTS>>,
    #[serde(default)]
    pub backend: BackendChoice,
    pub timeout_ms: Option<u64>,
}

#[utoipa::path(
    post, path = "/he/aggregate", tag = "he", operation_id = "he_aggregate",
    summary = "Sum ciphertexts without any key",
    request_body(content((HeAggregateRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The sum", body = HeCiphertextResponse),
        (status = 422, description = "invalid_ciphertext, invalid_parameter, unknown_array, array_mismatch"),
    ),
    security((), ("bearer" = []))
)]
pub async fn he_aggregate(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(req): ApiBody<HeAggregateRequest>,
) -> Result<Response, Problem> {
    let timeout = job_timeout(req.timeout_ms)?;
    let set = req.parameters;
    if req.ciphertexts.is_empty() || req.ciphertexts.len() > MAX_CIPHERTEXTS {
        return Err(Problem::at(
            ErrorCode::InvalidParameter,
            "/ciphertexts",
            format!("between 1 and {MAX_CIPHERTEXTS} ciphertexts"),
        ));
    }
    if let Some(w) = &req.weights {
        if w.len() != req.ciphertexts.len() {
            return Err(Problem::at(
                ErrorCode::InvalidParameter,
                "/weights",
                "one weight per ciphertext",
            ));
        }
        below_t(w, "/weights")?;
    }
    let weights = req.weights.map(AtMost::into_vec);
    let job = blocking(move || {
        // One ciphertext decoded at a time, its base64 dropped once laid out.
        let mut sum = SumBuilder::new(&set.parameters(), req.ciphertexts.len());
        for (i, mut sent) in req.ciphertexts.into_vec().into_iter().enumerate() {
            let path = format!("/ciphertexts/{i}");
            sent.resolve(&arrays, &path)?;
            let bytes = sent.bytes(Dtype::U8, ErrorCode::InvalidParameter, &path)?;
            sum.push(ciphertext_of(set, &bytes, &path)?)
                .map_err(unfit(&path))?;
        }
        Ok(sum.finish(weights))
    })
    .await?;
    let count = job.count();
    let done = state.pool.submit(job, req.backend, timeout).await?;
    let run = done.run;
    state
        .metrics
        .he_ciphertexts
        .with_label_values(&[set.name()])
        .inc_by(count as u64);
    blocking(move || {
        let par = set.parameters();
        let ct = CiphertextSumJob::to_ciphertext(&done.output, &par)
            .map_err(|e| Problem::new(ErrorCode::Internal, e))?;
        let body = HeCiphertextResponse {
            parameters: set,
            ciphertext: ciphertext_out(&ct),
        };
        let hint = body.ciphertext.bytes.len() / 3 * 4 + 64;
        bulk::answer(form, &body, |b| json_body(b, hint), &run)
    })
    .await
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeDecryptRequest {
    pub parameters: ParameterSet,
    /// Standard base64, as `/he/keys` gives it; in the bulk form a `u8` buffer; or
    /// `{"array": id}`, a resident array of kind bytes.
    #[schema(value_type = ByteStringDoc)]
    pub secret_key: ByteStringIn,
    /// Standard base64; in the bulk form a `u8` buffer; or `{"array": id}`.
    #[schema(value_type = ByteStringDoc)]
    pub ciphertext: ByteStringIn,
}

#[derive(Serialize, ToSchema)]
pub struct HeDecryptResponse {
    pub parameters: ParameterSet,
    /// Every slot, mod the plaintext modulus; a `u64` buffer in a bulk answer.
    #[schema(value_type = Vec<u64>)]
    pub values: U64sOut,
}

#[utoipa::path(
    post, path = "/he/decrypt", tag = "he", operation_id = "he_decrypt",
    summary = "Decrypt with a secret key given to the server (dealer mode only)",
    request_body(content((HeDecryptRequest = "application/json"), (inline(Binary) = "application/vnd.gpu-ops.bulk"))),
    responses(
        (status = 200, description = "The slots", body = HeDecryptResponse),
        (status = 403, description = "he_dealer_mode_off"),
        (status = 422, description = "invalid_ciphertext, invalid_parameter, unknown_array, array_mismatch"),
    ),
    security((), ("bearer" = []))
)]
pub async fn he_decrypt(
    State(state): State<Arc<AppState>>,
    form: AnswerForm,
    arrays: ArrayScope,
    ApiBody(mut req): ApiBody<HeDecryptRequest>,
) -> Result<Response, Problem> {
    dealer_only(&state, "decryption")?;
    req.secret_key.resolve(&arrays, "/secret_key")?;
    req.ciphertext.resolve(&arrays, "/ciphertext")?;
    let set = req.parameters;
    blocking(move || {
        let sk: SecretKey = key_of(&req.secret_key, set, "/secret_key", "secret key")?;
        let sent = req
            .ciphertext
            .bytes(Dtype::U8, ErrorCode::InvalidParameter, "/ciphertext")?;
        let ct = ciphertext_of(set, &sent, "/ciphertext")?;
        check_fresh(&ct, set.moduli(), set.degree()).map_err(unfit("/ciphertext"))?;
        let pt = crate_call(ErrorCode::InvalidParameter, "/secret_key", || {
            sk.try_decrypt(&ct)
        })?
        .map_err(|e| Problem::at(ErrorCode::InvalidCiphertext, "/ciphertext", e.to_string()))?;
        let values = Vec::<u64>::try_decode(&pt, Encoding::simd())
            .map_err(|e| Problem::new(ErrorCode::Internal, e.to_string()))?;
        let hint = values.len() * 6 + 64;
        let body = HeDecryptResponse {
            parameters: set,
            values: U64sOut(values),
        };
        bulk::reply(form, &body, |b| json_body(b, hint))
    })
    .await
}

/// The he domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "he",
    description:
        "Homomorphic encryption: sums of BFV ciphertexts (fhe.rs) that the server cannot read",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(he_keys))
        .routes(routes!(he_encrypt))
        .routes(routes!(he_aggregate))
        .routes(routes!(he_decrypt))
}
