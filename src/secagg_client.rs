//! The reference secure-aggregation client: one participant of a `/secagg/rounds` round,
//! speaking the wire format of `docs/SECAGG.md` over HTTP. `gpu-ops secagg-client` runs
//! it from the command line; the tests run many in one process. It shares the protocol's
//! derivations with the server (`ops::mpc::secagg::protocol`), and nothing else: it
//! knows the server only through HTTP.
//!
//! A client checks what an honest client must before each step: that it has enough
//! neighbours, that every share sealed to it opens, that at least t clients uploaded
//! before it reveals anything; and it reveals only one of each neighbour's two secrets.

use crate::ops::mpc::secagg::masks::{apply_masks, MaskTerm};
use crate::ops::mpc::secagg::protocol::{
    fr_bytes, graph_seed_bytes, mask_public, mask_secret, pair_mask_key, quantise, random_bytes,
    random_fr, self_mask_commitment, self_mask_key, share_secret, subtracts_pair_mask, Graph,
    ShareMessage,
};
use crate::ops::mpc::secagg::round::RoundConfig;
use base64::Engine;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use x25519_dalek::{PublicKey, StaticSecret};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Http(String),
    #[error("the server answered {status} {code}: {detail}")]
    Refused {
        status: u16,
        code: String,
        detail: String,
    },
    #[error("the protocol cannot go on: {0}")]
    Protocol(String),
}

fn http(e: reqwest::Error) -> ClientError {
    ClientError::Http(e.to_string())
}

/// Where a simulated client stops (tests and demonstrations of dropouts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DropBefore {
    /// Registers, then sends no shares.
    Shares,
    /// Sends its shares, then uploads nothing.
    Input,
    /// Uploads, then reveals nothing.
    Unmask,
}

/// How to reach the server and how patiently to wait on each stage.
#[derive(Clone, Debug)]
pub struct Connection {
    pub server: String,
    pub api_key: Option<String>,
    /// Between reads of the round's stage.
    pub poll: Duration,
    /// How long to wait for one stage to close.
    pub stage_timeout: Duration,
}

impl Connection {
    pub fn new(server: impl Into<String>) -> Self {
        Self {
            server: server.into().trim_end_matches('/').to_string(),
            api_key: None,
            poll: Duration::from_millis(200),
            stage_timeout: Duration::from_secs(300),
        }
    }
}

/// The round as a client reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct RoundState {
    pub id: String,
    pub stage: String,
    pub failure: Option<String>,
    /// The round's parameters, read into the type the server keeps them in (the answer's
    /// `modulus_bits` is always 32, and `backend` is the server's affair).
    pub config: RoundConfig,
    pub clients: Vec<PublicClient>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct PublicClient {
    pub id: u32,
    pub share_key: String,
    pub mask_key: String,
    pub shared: bool,
    pub uploaded: bool,
}

/// What an honest client checks of a round's parameters before it shares anything: a
/// server that showed it a threshold of 1, or one at most half its neighbours, could
/// rebuild both of its secrets from the shares of two neighbours.
fn check_params(c: &RoundConfig) -> Result<(), ClientError> {
    let (n, t, k) = (c.clients, c.threshold, c.neighbours);
    let sound = n >= 3
        && (k == n - 1 || (k >= 2 && k < n - 1 && k % 2 == 0))
        && t >= 2
        && t <= k
        && 2 * t > k
        && c.clip.is_finite()
        && c.clip > 0.0
        && c.scale_bits <= crate::ops::mpc::secagg::round::MAX_SCALE_BITS;
    if sound {
        Ok(())
    } else {
        Err(ClientError::Protocol(format!(
            "the round's parameters are unsafe or malformed: {c:?}"
        )))
    }
}

impl RoundState {
    fn graph(&self) -> Result<Graph, ClientError> {
        let seed = graph_seed_bytes(&self.config.graph_seed).ok_or_else(|| {
            ClientError::Protocol("the round's graph_seed is not 32 bytes of hex".into())
        })?;
        Ok(Graph::new(
            self.config.clients,
            self.config.neighbours,
            &seed,
        ))
    }

    fn ids(&self, pick: impl Fn(&PublicClient) -> bool) -> BTreeSet<u32> {
        self.clients
            .iter()
            .filter(|c| pick(c))
            .map(|c| c.id)
            .collect()
    }

    fn client(&self, id: u32) -> Result<&PublicClient, ClientError> {
        self.clients
            .iter()
            .find(|c| c.id == id)
            .ok_or_else(|| ClientError::Protocol(format!("client {id} is not in the round")))
    }
}

fn key32(s: &str, what: &str) -> Result<[u8; 32], ClientError> {
    B64.decode(s)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| ClientError::Protocol(format!("{what} is not 32 bytes of base64")))
}

/// HTTP with the round's conventions: the API key, the client's token, problem+json.
struct Http<'a> {
    conn: &'a Connection,
    client: reqwest::Client,
    token: Option<String>,
}

impl Http<'_> {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.conn.server));
        if let Some(key) = &self.conn.api_key {
            req = req.bearer_auth(key);
        }
        if let Some(token) = &self.token {
            req = req.header("x-secagg-token", token);
        }
        req
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let res = req.send().await.map_err(http)?;
        let status = res.status().as_u16();
        let body: Value = res.json().await.map_err(http)?;
        if status >= 400 {
            return Err(ClientError::Refused {
                status,
                code: body["code"].as_str().unwrap_or("").to_string(),
                detail: body["detail"].as_str().unwrap_or("").to_string(),
            });
        }
        serde_json::from_value(body)
            .map_err(|e| ClientError::Http(format!("unexpected answer: {e}")))
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    async fn post<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T, ClientError> {
        self.send(self.request(reqwest::Method::POST, path).json(body))
            .await
    }

    /// Polls the round until it leaves `stage`.
    async fn wait_past(&self, round: &str, stage: &str) -> Result<RoundState, ClientError> {
        let start = Instant::now();
        loop {
            // A server restarting, or a replica going away behind a balancer, is waited
            // out like a stage that has not closed: the round is in the store.
            match self
                .get::<RoundState>(&format!("/secagg/rounds/{round}"))
                .await
            {
                Ok(state) if state.stage != stage => return Ok(state),
                Ok(_) | Err(ClientError::Http(_)) => {}
                Err(ClientError::Refused { status: 503, .. }) => {}
                Err(e) => return Err(e),
            }
            if start.elapsed() > self.conn.stage_timeout {
                return Err(ClientError::Protocol(format!(
                    "stage {stage} did not close within {:?}",
                    self.conn.stage_timeout
                )));
            }
            tokio::time::sleep(self.conn.poll).await;
        }
    }
}

/// How one client's part of a round ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It revealed its shares: the round can unmask without it doing more.
    Done { client_id: u32 },
    /// It stopped where it was told to.
    Dropped { client_id: u32 },
    /// The round went on without it, or ended, before its turn.
    LeftBehind { client_id: u32, stage: String },
}

/// One client's whole part in round `round`, contributing `values`.
pub async fn participate(
    conn: &Connection,
    round: &str,
    values: &[f32],
    drop: Option<DropBefore>,
) -> Result<Outcome, ClientError> {
    let mut http = Http {
        conn,
        client: reqwest::Client::new(),
        token: None,
    };
    let state: RoundState = http.get(&format!("/secagg/rounds/{round}")).await?;
    check_params(&state.config)?;
    let config = state.config.clone();
    // The parameters may not change under the client: every later read must show these.
    let same = |s: &RoundState| -> Result<(), ClientError> {
        if s.config == config {
            Ok(())
        } else {
            Err(ClientError::Protocol(
                "the round's parameters changed".into(),
            ))
        }
    };
    if values.len() != state.config.vector_length {
        return Err(ClientError::Protocol(format!(
            "{} values, and the round's vector_length is {}",
            values.len(),
            state.config.vector_length
        )));
    }
    if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
        return Err(ClientError::Protocol(format!("value {bad} is not finite")));
    }
    let entropy = |e: String| ClientError::Protocol(e);
    let share_secret_key = StaticSecret::from(random_bytes().map_err(entropy)?);
    let sigma = random_fr().map_err(entropy)?;
    let beta = random_fr().map_err(entropy)?;

    // advertise_keys
    let registered: Value = http
        .post(
            &format!("/secagg/rounds/{round}/keys"),
            &json!({
                "share_key": B64.encode(PublicKey::from(&share_secret_key).to_bytes()),
                "mask_key": B64.encode(mask_public(round, &sigma)),
            }),
        )
        .await?;
    let me = registered["client_id"]
        .as_u64()
        .and_then(|id| u32::try_from(id).ok())
        .filter(|id| (1..=config.clients).contains(id))
        .ok_or_else(|| ClientError::Protocol("the server gave no valid client id".into()))?;
    http.token = registered["token"].as_str().map(str::to_string);
    let left_behind = |stage: &str| {
        Ok(Outcome::LeftBehind {
            client_id: me,
            stage: stage.to_string(),
        })
    };

    // share_keys
    let state = http.wait_past(round, "advertise_keys").await?;
    same(&state)?;
    if state.stage != "share_keys" {
        return left_behind(&state.stage);
    }
    if drop == Some(DropBefore::Shares) {
        return Ok(Outcome::Dropped { client_id: me });
    }
    let graph = state.graph()?;
    let t = state.config.threshold as usize;
    let registered_ids = state.ids(|_| true);
    let holders: Vec<u32> = graph
        .neighbours(me)
        .into_iter()
        .filter(|v| registered_ids.contains(v))
        .collect();
    if holders.len() < t {
        return Err(ClientError::Protocol(format!(
            "{} registered neighbours and the threshold is {t}",
            holders.len()
        )));
    }
    let sigma_shares = share_secret(sigma, t, &holders).map_err(entropy)?;
    let beta_shares = share_secret(beta, t, &holders).map_err(entropy)?;
    let mut messages = Vec::with_capacity(holders.len());
    for (i, &v) in holders.iter().enumerate() {
        let recipient_key = key32(&state.client(v)?.share_key, "a share key")?;
        let sealed = ShareMessage {
            sender: me,
            recipient: v,
            sigma: sigma_shares[i],
            beta: beta_shares[i],
        }
        .seal(round, &share_secret_key, &recipient_key);
        messages.push(json!({"recipient": v, "ciphertext": B64.encode(sealed)}));
    }
    let commitment = self_mask_commitment(round, me, &beta);
    let _: Value = http
        .post(
            &format!("/secagg/rounds/{round}/shares"),
            &json!({"self_mask_commitment": B64.encode(commitment), "messages": messages}),
        )
        .await?;

    // masked_input
    let state = http.wait_past(round, "share_keys").await?;
    same(&state)?;
    if state.stage != "masked_input" {
        return left_behind(&state.stage);
    }
    if drop == Some(DropBefore::Input) {
        return Ok(Outcome::Dropped { client_id: me });
    }
    let shared = state.ids(|c| c.shared);
    let partners: Vec<u32> = graph
        .neighbours(me)
        .into_iter()
        .filter(|v| shared.contains(v))
        .collect();
    let received = open_inbox(&http, round, &state, me, &share_secret_key, &partners).await?;
    let mine = mask_secret(round, &sigma);
    let mut terms = vec![MaskTerm {
        key: self_mask_key(round, me, &beta),
        subtract: false,
    }];
    for &v in &partners {
        let theirs = key32(&state.client(v)?.mask_key, "a mask key")?;
        terms.push(MaskTerm {
            key: pair_mask_key(round, &mine, me, v, &theirs),
            subtract: subtracts_pair_mask(me, v),
        });
    }
    let (clip, f) = (state.config.clip, state.config.scale_bits);
    let mut q: Vec<u32> = values.iter().map(|&x| quantise(x, clip, f)).collect();
    let masked = tokio::task::spawn_blocking(move || {
        apply_masks(&mut q, &terms);
        // The bulk form (docs/WIRE.md): the words as they lie, no base64.
        let mut body = crate::wire::EnvelopeWriter::new();
        let words = q.len() as u64;
        let bytes: Vec<u8> = q.iter().flat_map(|w| w.to_le_bytes()).collect();
        let buffer = body.push(crate::wire::Dtype::U32, vec![words], bytes.into());
        body.finish_to_vec(&json!({"masked": buffer}))
    })
    .await
    .map_err(|e| ClientError::Protocol(format!("masking failed: {e}")))?
    .map_err(|e| ClientError::Protocol(format!("the masked vector's body: {e}")))?;
    let _: Value = http
        .send(
            http.request(
                reqwest::Method::POST,
                &format!("/secagg/rounds/{round}/inputs"),
            )
            .header(reqwest::header::CONTENT_TYPE, crate::wire::MEDIA_TYPE)
            .body(masked),
        )
        .await?;

    // unmasking
    let state = http.wait_past(round, "masked_input").await?;
    same(&state)?;
    if state.stage != "unmasking" {
        return left_behind(&state.stage);
    }
    if drop == Some(DropBefore::Unmask) {
        return Ok(Outcome::Dropped { client_id: me });
    }
    let uploaded = state.ids(|c| c.uploaded);
    if uploaded.len() < t {
        return Err(ClientError::Protocol(format!(
            "only {} clients uploaded and the threshold is {t}: revealing would expose a sum of too few",
            uploaded.len()
        )));
    }
    let shares: Vec<Value> = partners
        .iter()
        .map(|v| {
            let m = &received[v];
            // A survivor's β, or a dropout's σ: never both for one client.
            let (secret, value) = if uploaded.contains(v) {
                ("self_mask", m.beta)
            } else {
                ("mask_key", m.sigma)
            };
            json!({"owner": v, "secret": secret, "share": B64.encode(fr_bytes(&value))})
        })
        .collect();
    let _: Value = http
        .post(
            &format!("/secagg/rounds/{round}/unmask"),
            &json!({"shares": shares}),
        )
        .await?;
    Ok(Outcome::Done { client_id: me })
}

/// The shares sealed to this client: exactly one from each partner, each opening.
async fn open_inbox(
    http: &Http<'_>,
    round: &str,
    state: &RoundState,
    me: u32,
    mine: &StaticSecret,
    partners: &[u32],
) -> Result<BTreeMap<u32, ShareMessage>, ClientError> {
    let inbox: Value = http.get(&format!("/secagg/rounds/{round}/inbox")).await?;
    let mut received = BTreeMap::new();
    for m in inbox["messages"].as_array().into_iter().flatten() {
        let sender = m["sender"].as_u64().unwrap_or(0) as u32;
        let sealed = B64
            .decode(m["ciphertext"].as_str().unwrap_or(""))
            .map_err(|_| {
                ClientError::Protocol(format!("client {sender}'s message is not base64"))
            })?;
        let key = key32(&state.client(sender)?.share_key, "a share key")?;
        let opened =
            ShareMessage::open(round, mine, sender, me, &key, &sealed).ok_or_else(|| {
                ClientError::Protocol(format!(
                    "client {sender}'s message to this client does not open"
                ))
            })?;
        received.insert(sender, opened);
    }
    let senders: Vec<u32> = received.keys().copied().collect();
    if senders != partners {
        return Err(ClientError::Protocol(format!(
            "shares came from {senders:?}, and the neighbours that shared are {partners:?}"
        )));
    }
    Ok(received)
}

/// The coordinator's side, for tests and the CLI's `--create`.
pub struct Coordinator {
    pub round: String,
    pub token: String,
    http: reqwest::Client,
    conn: Connection,
}

impl Coordinator {
    /// Opens a round with the create request's fields (`docs/SECAGG.md`).
    pub async fn create(conn: &Connection, params: &Value) -> Result<Self, ClientError> {
        let http = Http {
            conn,
            client: reqwest::Client::new(),
            token: None,
        };
        let created: Value = http.post("/secagg/rounds", params).await?;
        Ok(Self {
            round: created["id"].as_str().unwrap_or("").to_string(),
            token: created["coordinator_token"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            http: http.client,
            conn: conn.clone(),
        })
    }

    fn http(&self) -> Http<'_> {
        Http {
            conn: &self.conn,
            client: self.http.clone(),
            token: Some(self.token.clone()),
        }
    }

    pub async fn state(&self) -> Result<RoundState, ClientError> {
        self.http()
            .get(&format!("/secagg/rounds/{}", self.round))
            .await
    }

    /// Waits until the round leaves `stage`.
    pub async fn wait_past(&self, stage: &str) -> Result<RoundState, ClientError> {
        self.http().wait_past(&self.round, stage).await
    }

    pub async fn advance(&self) -> Result<RoundState, ClientError> {
        self.http()
            .post(
                &format!("/secagg/rounds/{}/advance", self.round),
                &json!({}),
            )
            .await
    }

    /// The result, once the round has one (waits while it aggregates).
    pub async fn result(&self) -> Result<Value, ClientError> {
        let start = Instant::now();
        loop {
            match self
                .http()
                .get(&format!("/secagg/rounds/{}/result", self.round))
                .await
            {
                Err(ClientError::Refused { code, .. })
                    if code == "secagg_wrong_stage"
                        && start.elapsed() < self.conn.stage_timeout =>
                {
                    let state = self.state().await?;
                    if state.stage == "failed" {
                        return Err(ClientError::Protocol(format!(
                            "the round failed: {}",
                            state.failure.unwrap_or_default()
                        )));
                    }
                    tokio::time::sleep(self.conn.poll).await;
                }
                other => return other,
            }
        }
    }
}

mod cli;
pub use cli::{run_cli, CliArgs};
