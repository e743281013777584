//! Starts a real server on an ephemeral port for HTTP tests.
#![allow(dead_code)]

pub mod binary;
pub mod pg;
pub mod s3;

use clap::Parser;
use gpu_ops::api::AppState;
use gpu_ops::config::{Cli, Settings};
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    pub url: String,
    pub state: Arc<AppState>,
    pub client: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    pub handle: Option<JoinHandle<std::io::Result<()>>>,
}

/// Where `TestServer::shared` keeps its server's address and state.
pub type SharedServer = std::sync::OnceLock<(String, Arc<AppState>)>;

/// A fresh, empty data directory for one test server.
pub fn temp_data_dir() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gpu-ops-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir.to_string_lossy().into_owned()
}

pub fn settings(args: &[&str]) -> Settings {
    let data = temp_data_dir();
    let mut all = vec![
        "gpu-ops",
        "--backend",
        "cpu",
        "--cpu-threads",
        "2",
        "--data-dir",
        &data,
    ];
    all.extend_from_slice(args);
    Cli::try_parse_from(all)
        .expect("test flags parse")
        .config
        .validate()
        .expect("test settings are valid")
}

impl TestServer {
    pub async fn start(args: &[&str]) -> Self {
        Self::start_with(settings(args), |r| r).await
    }

    /// `extend` may add routes before the middleware is applied.
    pub async fn start_with(
        settings: Settings,
        extend: impl FnOnce(axum::Router) -> axum::Router,
    ) -> Self {
        Self::start_at(settings, "127.0.0.1:0", extend).await
    }

    /// On a given address: a restarted server takes its predecessor's port.
    pub async fn start_at(
        settings: Settings,
        addr: &str,
        extend: impl FnOnce(axum::Router) -> axum::Router,
    ) -> Self {
        let app = gpu_ops::App::start(settings).expect("app starts");
        app.discovery_finished().await;
        let state = app.state.clone();
        let router = gpu_ops::api::with_middleware(
            extend(gpu_ops::api::routes(state.clone())),
            state.clone(),
        );
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(app.serve_router(listener, router, async move {
            let _ = rx.await;
        }));
        Self {
            url,
            state,
            client: reqwest::Client::new(),
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }

    /// A server that lives as long as the test binary, on its own thread and runtime,
    /// started with `args` by the first caller of `slot`. For tests that only send
    /// requests and read what no other test moves: they share one start instead of
    /// paying one each (with `--emulate-device`, a start runs every op's self-test on
    /// the emulated device, seconds under AddressSanitizer). Each caller gets its own
    /// client: pooled connections belong to the runtime that opened them, and each
    /// test has its own.
    pub fn shared(slot: &'static SharedServer, args: &'static [&'static str]) -> Self {
        let (url, state) = slot.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("shared-test-server".into())
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .expect("the shared server's runtime");
                    runtime.block_on(async {
                        let server = TestServer::start(args).await;
                        tx.send((server.url.clone(), server.state.clone()))
                            .expect("the first caller waits");
                        std::future::pending::<()>().await
                    })
                })
                .expect("the shared server's thread");
            rx.recv().expect("the shared server starts")
        });
        Self {
            url: url.clone(),
            state: state.clone(),
            client: reqwest::Client::new(),
            shutdown: None,
            handle: None,
        }
    }

    pub fn post(&self, path: &str, body: serde_json::Value) -> reqwest::RequestBuilder {
        self.client.post(format!("{}{path}", self.url)).json(&body)
    }

    pub fn delete(&self, path: &str) -> reqwest::RequestBuilder {
        self.client.delete(format!("{}{path}", self.url))
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
    }

    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.text().await.unwrap()
    }

    /// The value of one sample line, e.g. `gpu_ops_jobs_total{...}`, or 0.
    pub async fn metric(&self, name_and_labels_prefix: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with(name_and_labels_prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Polls a metric (the worker records outcomes after the reply) for up to a second;
    /// returns its last value.
    pub async fn wait_for_metric(&self, name_and_labels: &str, want: f64) -> f64 {
        // A deadline only so that a test whose metric never gets there ends: on a loaded
        // machine a state may take seconds to come, and the tests assert the state.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let v = self.metric(name_and_labels).await;
            if v == want || std::time::Instant::now() >= deadline {
                return v;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    pub fn trigger_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Asserts a problem+json response and returns its body.
pub async fn problem(res: reqwest::Response, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(res.status().as_u16(), status, "status");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let id = res
        .headers()
        .get("x-request-id")
        .map(|v| v.to_str().unwrap().to_string());
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["status"], status);
    assert!(body["title"].is_string() && body["type"].is_string() && body["detail"].is_string());
    assert_eq!(
        body["request_id"].as_str().map(str::to_string),
        id,
        "request id in body and header"
    );
    body
}

/// A small feature-based dataset request (100 ms recordings, four receivers, every
/// sample accepted): `n` samples from `seed`.
pub fn small_dataset(seed: u64, n: u64) -> serde_json::Value {
    serde_json::json!({
        "name": "small", "num_samples": n, "dataset_type": "feature_based", "seed": seed,
        "config": {
            "signal": {"duration_ms": 100},
            "chunk_ms": 50,
            "geometry": {"receivers_min": 4, "receivers_max": 4},
            "quality": {"min_receivers": 1, "min_snr_db": -50, "max_gdop": 1e9}
        }
    })
}
