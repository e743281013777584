//! The shipped scrape config, alert rules and Grafana dashboard against a real Prometheus
//! scraping a real server: every dashboard query and every rule must parse and evaluate,
//! and every dashboard panel must show data after traffic (GPU-only panels excepted on
//! hosts without a GPU). Needs `prometheus` on PATH or PROMETHEUS_BIN; skips without it
//! unless REQUIRE_PROMETHEUS=1 (CI), which makes its absence a failure.

use crate::common;

use common::TestServer;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Panels whose description says this read NVML gauges, which exist only with a GPU.
const GPU_ONLY: &str = "Only on GPU hosts";

fn prometheus_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("PROMETHEUS_BIN") {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The shipped config, pointed at `target`, scraping and evaluating every second.
fn config_for(target: &str, dir: &Path) -> PathBuf {
    let shipped =
        std::fs::read_to_string(format!("{ROOT}/deploy/prometheus/prometheus.yml")).unwrap();
    let targets = r#"targets: ["gpu-ops:8080", "gpu-ops-cpu:8080"]"#;
    assert!(shipped.contains(targets) && shipped.contains("scrape_interval: 15s"));
    let rules = format!("{ROOT}/deploy/prometheus/rules/*.yml");
    let text = shipped
        .replace(targets, &format!(r#"targets: ["{target}"]"#))
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("evaluation_interval: 15s", "evaluation_interval: 1s")
        .replace("- rules/*.yml", &format!("- {rules}"));
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn query(client: &reqwest::Client, base: &str, expr: &str) -> Value {
    let res = client
        .get(format!("{base}/api/v1/query"))
        .query(&[("query", expr)])
        .send()
        .await
        .unwrap();
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["status"], "success", "query failed: {expr}\n{body}");
    body
}

/// Grafana's variables as a dashboard user would see them with "All" selected.
fn grafana_to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$instance", ".*")
}

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_and_alert_queries_work_against_a_real_prometheus() {
    let Some(bin) = prometheus_bin() else {
        gpu_ops::skips::skip_unless_required(
            "observability::dashboard_and_alert_queries_work_against_a_real_prometheus",
            "no prometheus binary (install Debian's `prometheus` or set PROMETHEUS_BIN)",
            "REQUIRE_PROMETHEUS",
        );
        return;
    };
    let server = TestServer::start(&[]).await;
    let target = server.url.trim_start_matches("http://").to_string();
    let dir = PathBuf::from(common::temp_data_dir());
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let config = config_for(&target, &dir);
    let _prom = Killed(
        Command::new(&bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );
    let client = reqwest::Client::new();
    let start = Instant::now();
    while !client
        .get(format!("{base}/-/ready"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "prometheus never became ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Prometheus applies discovered targets a few seconds after start: wait for the
    // first scrape, so the traffic below spans several.
    let start = Instant::now();
    while query(&client, &base, r#"up{job="gpu-ops"} == 1"#).await["data"]["result"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "prometheus never scraped the server"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Traffic over several scrapes: successes, client errors, DP charges.
    let budget: Value = server
        .post(
            "/dp/budgets",
            json!({"epsilon_limit": 1000.0, "delta": 1e-5}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for _ in 0..6 {
        let ok = json!({"field": "goldilocks", "a": ["1", "2"], "b": ["3"]});
        assert_eq!(
            server
                .post("/zk/field_add", ok)
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        let bad = json!({"field": "goldilocks", "a": ["x"], "b": ["3"]});
        assert_eq!(
            server
                .post("/zk/field_mul", bad)
                .send()
                .await
                .unwrap()
                .status(),
            422
        );
        let release = json!({"values": [1.0, 2.0], "sensitivity": 1.0, "epsilon": 0.5, "budget_id": budget["id"]});
        assert_eq!(
            server
                .post("/dp/laplace", release)
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // Wait until the last of it has been scraped.
    let want = server.metric("gpu_ops_http_requests_total").await;
    let start = Instant::now();
    loop {
        let got = query(&client, &base, "sum(gpu_ops_http_requests_total)").await;
        let v = got["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse::<f64>().ok());
        // rate() needs two samples of a series inside its window.
        let rated = query(&client, &base, "sum(rate(gpu_ops_http_requests_total[1m]))").await;
        if v.is_some_and(|v| v >= want) && !rated["data"]["result"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "prometheus never scraped the traffic: {got}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let has_gpu = !server
        .state
        .backends
        .healthy_gpus()
        .collect::<Vec<_>>()
        .is_empty();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{ROOT}/deploy/grafana/dashboards/gpu-ops.json")).unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        let Some(targets) = panel["targets"].as_array() else {
            continue;
        };
        let gpu_only = panel["description"]
            .as_str()
            .unwrap_or("")
            .contains(GPU_ONLY);
        for t in targets {
            let expr = grafana_to_promql(t["expr"].as_str().unwrap());
            let result = query(&client, &base, &expr).await;
            let series = result["data"]["result"].as_array().unwrap();
            if !gpu_only || has_gpu {
                assert!(
                    !series.is_empty(),
                    "panel {:?} shows nothing after traffic: {expr}",
                    panel["title"]
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} dashboard queries");

    // Every rule is loaded, evaluates without error, and its expression runs.
    let start = Instant::now();
    let rules = loop {
        let body: Value = client
            .get(format!("{base}/api/v1/rules"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let rules: Vec<Value> = body["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect();
        if !rules.is_empty()
            && rules.iter().all(|r| {
                r["lastEvaluation"]
                    .as_str()
                    .is_some_and(|t| !t.starts_with("0001"))
            })
        {
            break rules;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "rules never evaluated: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for name in [
        "GpuOpsTargetDown",
        "GpuOpsQueueSaturated",
        "GpuOpsFallbackRateHigh",
        "GpuOpsHigh5xxRate",
        "GpuOpsGpuMemoryNearFull",
        "GpuOpsDeviceUnhealthy",
    ] {
        assert!(
            rules.iter().any(|r| r["name"] == name),
            "alert {name} not loaded"
        );
    }
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
        query(&client, &base, rule["query"].as_str().unwrap()).await;
        // Healthy traffic fires nothing.
        assert_eq!(rule["state"], "inactive", "{rule}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
