//! `gpu-ops bench`: a load generator for a running server, as perf_analyzer is for
//! Triton. For each concurrency of a sweep it warms up, then keeps that many requests in
//! flight (each worker sends its next request when the last one answers) for a duration
//! or a count, and reports throughput, latency percentiles, the server's own queue and
//! compute times (`x-queue-time-ms`, `x-compute-time-ms`) and GFLOP/s where the answer
//! states its `flops`. A client only: it knows HTTP and JSON, nothing of the server's
//! code.

mod anchors;
pub mod bodies;
pub(crate) mod report;

pub use report::{percentile, Report, Run, Sample};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long each measured run lasts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Length {
    Duration(Duration),
    Requests(u64),
}

/// What to send, where, and how hard.
#[derive(Clone, Debug)]
pub struct Plan {
    pub url: String,
    pub path: String,
    pub body: Vec<u8>,
    /// The body's media type.
    pub content_type: String,
    /// The answer's media type asked for (`Accept`), if any.
    pub accept: Option<String>,
    pub label: String,
    pub concurrency: Vec<usize>,
    pub warmup: Length,
    pub length: Length,
    pub api_key: Option<String>,
    pub timeout: Duration,
}

/// Runs the plan: every concurrency in turn, each after its warm-up.
pub async fn run(plan: &Plan) -> Result<Report, String> {
    let client = reqwest::Client::builder()
        .timeout(plan.timeout)
        .pool_max_idle_per_host(plan.concurrency.iter().copied().max().unwrap_or(1))
        .build()
        .map_err(|e| e.to_string())?;
    // One copy of the body, shared by every request.
    let body = bytes::Bytes::from(plan.body.clone());
    let (flops, backend, answer_bytes) = probe(&client, plan, &body).await?;
    let mut runs = Vec::new();
    for &c in &plan.concurrency {
        load(&client, plan, &body, c, plan.warmup).await?;
        let started = Instant::now();
        let samples = load(&client, plan, &body, c, plan.length).await?;
        runs.push(Run::from_samples(c, started.elapsed(), &samples, flops));
    }
    let memcpy = report::memcpy_ms(plan.body.len() + answer_bytes);
    Ok(Report::new(plan, flops, backend, runs).with_transfer(answer_bytes, memcpy))
}

/// One request first: it must succeed (a bench of refusals measures nothing), and its
/// answer's `flops`, when it states them, gives the GFLOP/s; its `x-backend`, the backend
/// the comparisons are for; its length, the answer's bytes.
async fn probe(
    client: &reqwest::Client,
    plan: &Plan,
    body: &bytes::Bytes,
) -> Result<(Option<f64>, Option<String>, usize), String> {
    let res = request(client, plan, body)
        .send()
        .await
        .map_err(|e| format!("{}: {e}", plan.url))?;
    let status = res.status();
    let backend = res
        .headers()
        .get("x-backend")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = res.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!(
            "{} answered {status}: {}",
            plan.path,
            String::from_utf8_lossy(&bytes[..bytes.len().min(500)])
        ));
    }
    // A bulk answer's header is its JSON answer, buffers aside.
    let json = match crate::wire::split(&bytes) {
        Ok(envelope) if plan.accept.as_deref() == Some(crate::wire::MEDIA_TYPE) => {
            envelope.header.as_bytes()
        }
        _ => &bytes[..],
    };
    let flops = serde_json::from_slice::<serde_json::Value>(json)
        .ok()
        .and_then(|v| v.get("flops").and_then(|f| f.as_f64()));
    Ok((flops, backend, bytes.len()))
}

fn request(client: &reqwest::Client, plan: &Plan, body: &bytes::Bytes) -> reqwest::RequestBuilder {
    // A Bytes clone shares the body: nothing is copied inside the timed interval.
    let mut r = client
        .post(format!("{}{}", plan.url.trim_end_matches('/'), plan.path))
        .header("content-type", &plan.content_type)
        .body(body.clone());
    if let Some(accept) = &plan.accept {
        r = r.header("accept", accept);
    }
    match &plan.api_key {
        Some(k) => r.bearer_auth(k),
        None => r,
    }
}

/// `concurrency` workers, each with one request in flight, until `length` is reached.
/// A request that got no HTTP answer (connection refused or reset, timeout) is a sample of
/// status 0: counted among the errors, never ending the run.
async fn load(
    client: &reqwest::Client,
    plan: &Plan,
    body: &bytes::Bytes,
    concurrency: usize,
    length: Length,
) -> Result<Vec<Sample>, String> {
    let started = Instant::now();
    let issued = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (client, plan, body) = (client.clone(), plan.clone(), body.clone());
        let (issued, samples) = (issued.clone(), samples.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let more = match length {
                    Length::Duration(d) => started.elapsed() < d,
                    Length::Requests(n) => issued.fetch_add(1, Ordering::Relaxed) < n,
                };
                if !more {
                    return;
                }
                let sent = Instant::now();
                let (status, queue_ms, compute_ms) =
                    match request(&client, &plan, &body).send().await {
                        Ok(res) => {
                            let header = |name: &str| {
                                res.headers()
                                    .get(name)
                                    .and_then(|v| v.to_str().ok())
                                    .and_then(|v| v.parse::<f64>().ok())
                            };
                            let (queue_ms, compute_ms) =
                                (header("x-queue-time-ms"), header("x-compute-time-ms"));
                            let status = res.status().as_u16();
                            // The whole answer is part of the latency a client sees.
                            match res.bytes().await {
                                Ok(_) => (status, queue_ms, compute_ms),
                                Err(_) => (0, None, None),
                            }
                        }
                        Err(_) => (0, None, None),
                    };
                samples.lock().expect("not poisoned").push(Sample {
                    latency_ms: sent.elapsed().as_secs_f64() * 1e3,
                    status,
                    queue_ms,
                    compute_ms,
                });
            }
        }));
    }
    for w in workers {
        w.await.map_err(|e| e.to_string())?;
    }
    let samples = std::mem::take(&mut *samples.lock().expect("not poisoned"));
    Ok(samples)
}

/// "1,4,16" → [1, 4, 16].
pub fn parse_list(s: &str, what: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| match x.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{what}: {x:?} is not a positive integer")),
        })
        .collect()
}

/// "10s", "500ms", "2m" → a duration; "200" (a bare number) → a request count.
pub fn parse_length(s: &str) -> Result<Length, String> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Length::Requests(n));
    }
    humantime::parse_duration(s)
        .map(Length::Duration)
        .map_err(|_| format!("{s:?}: a request count (200) or a duration (10s, 500ms, 2m)"))
}

/// `gpu-ops bench`'s arguments.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// An operation the bench builds bodies for (matmul, attention, conv2d,
    /// embeddings_sinusoidal, beam_channels, beam_sweep, field_add, ntt), with --shape.
    #[arg(long, conflicts_with = "body")]
    pub op: Option<String>,
    /// The op's shape, comma-separated (matmul: M,N,K or B,M,N,K; attention: B,H,S,D;
    /// conv2d: N,C,H,W,O,KH,KW; embeddings_sinusoidal: P,DIM; beam_*: B,N_T,N_R;
    /// field_add, ntt: N).
    #[arg(long, requires = "op")]
    pub shape: Option<String>,
    /// How a built body's tensors and vectors travel: nested JSON numbers and decimal
    /// strings, base64 inside JSON, or the bulk form both ways (docs/WIRE.md).
    #[arg(long, value_enum, default_value = "base64", conflicts_with = "body")]
    pub wire: bodies::Wire,
    /// Any operation: a JSON body from this file ("-": standard input), POSTed to --path.
    #[arg(long, requires = "path")]
    pub body: Option<std::path::PathBuf>,
    /// The route for --body (e.g. /linalg/matmul).
    #[arg(long)]
    pub path: Option<String>,
    /// The backend a built body asks for.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Requests in flight, one run each: "1,4,16".
    #[arg(long, default_value = "1")]
    pub concurrency: String,
    /// Each run's length: a duration ("10s") or a request count ("200").
    #[arg(long, default_value = "10s")]
    pub duration: String,
    /// Unmeasured load before each run: a duration or a request count.
    #[arg(long, default_value = "2s")]
    pub warmup: String,
    /// Per-request timeout.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Bearer key for a server with --api-keys-file.
    #[arg(long, env = "GPU_OPS_API_KEY")]
    pub api_key: Option<String>,
    /// Also write the report as JSON to this file ("-": standard output, instead of the
    /// table).
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

impl BenchArgs {
    /// The plan these arguments describe.
    pub fn plan(&self) -> Result<Plan, String> {
        let (path, body, label) = match (&self.op, &self.body) {
            (Some(op), None) => {
                let shape = parse_list(self.shape.as_deref().unwrap_or(""), "--shape")?;
                let (path, body) = bodies::body(op, &shape, &self.backend, self.wire)?;
                let wire = format!("{:?}", self.wire).to_lowercase();
                let label = format!("{op} {} ({wire})", self.shape.as_deref().unwrap_or(""));
                (path.to_string(), body, label)
            }
            (None, Some(file)) => {
                let bytes = if file.as_os_str() == "-" {
                    let mut b = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
                        .map_err(|e| e.to_string())?;
                    b
                } else {
                    std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?
                };
                let path = self.path.clone().expect("clap requires --path with --body");
                let body = bodies::Rendered {
                    bytes,
                    content_type: "application/json",
                    accept: None,
                };
                (path.clone(), body, format!("{path} ({})", file.display()))
            }
            _ => return Err("give --op with --shape, or --body with --path".into()),
        };
        Ok(Plan {
            url: self.url.clone(),
            path,
            body: body.bytes,
            content_type: body.content_type.into(),
            accept: body.accept.map(String::from),
            label,
            concurrency: parse_list(&self.concurrency, "--concurrency")?,
            warmup: parse_length(&self.warmup)?,
            length: parse_length(&self.duration)?,
            api_key: self.api_key.clone(),
            timeout: self.timeout,
        })
    }
}
