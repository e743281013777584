//! Synthetic dataset jobs over HTTP: a small job runs to completion and its Parquet file
//! holds what the status says, byte-identical whatever the thread count; cancel, delete,
//! bad input, and a restart that keeps completed datasets and marks the rest interrupted.

mod common;

use clap::Parser;
use common::{problem, temp_data_dir, TestServer};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::RowAccessor;
use serde_json::{json, Value};
use std::time::Duration;

fn small(seed: u64, n: u64) -> Value {
    json!({
        "name": "small", "num_samples": n, "dataset_type": "feature_based", "seed": seed,
        "config": {
            "signal": {"duration_ms": 100},
            "chunk_ms": 50,
            "geometry": {"receivers_min": 4, "receivers_max": 4},
            "quality": {"min_receivers": 1, "min_snr_db": -50, "max_gdop": 1e9}
        }
    })
}

fn settings(data_dir: &str, threads: &str) -> gpu_ops::config::Settings {
    gpu_ops::config::Cli::try_parse_from([
        "gpu-ops",
        "--backend",
        "cpu",
        "--cpu-threads",
        threads,
        "--data-dir",
        data_dir,
    ])
    .unwrap()
    .config
    .validate()
    .unwrap()
}

async fn create(s: &TestServer, body: Value) -> Value {
    let res = s.post("/datasets/synthetic", body).send().await.unwrap();
    assert_eq!(res.status(), 202);
    assert!(res.headers()["location"]
        .to_str()
        .unwrap()
        .starts_with("/datasets/ds_"));
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["status"], "queued");
    v
}

/// Polls until the job leaves queued/running (or `want` is reached), up to 60 s.
async fn wait_for(s: &TestServer, id: &str, want: &[&str]) -> Value {
    for _ in 0..600 {
        let v: Value = s
            .get(&format!("/datasets/{id}"))
            .await
            .json()
            .await
            .unwrap();
        if want.contains(&v["status"].as_str().unwrap()) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("dataset {id} never reached {want:?}");
}

async fn parquet_bytes(s: &TestServer, id: &str) -> bytes::Bytes {
    let res = s.get(&format!("/datasets/{id}/features")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()["content-type"],
        "application/vnd.apache.parquet"
    );
    res.bytes().await.unwrap()
}

#[tokio::test]
async fn a_job_completes_and_its_file_does_not_depend_on_threads() {
    let mut files = Vec::new();
    for threads in ["1", "2"] {
        let dir = temp_data_dir();
        let s = TestServer::start_with(settings(&dir, threads), |r| r).await;
        let job = create(&s, small(5, 6)).await;
        let id = job["id"].as_str().unwrap().to_string();
        assert_eq!(job["seed"], 5);
        assert_eq!(job["progress"]["target"], 6);
        if threads == "1" {
            // Server-sent events follow the job to its end, then the stream closes.
            let text = s
                .get(&format!("/datasets/{id}/events"))
                .await
                .text()
                .await
                .unwrap();
            assert!(text.contains("event: end"), "{text}");
            let last = text
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap();
            let v: Value = serde_json::from_str(last).unwrap();
            assert_eq!(v["status"], "completed", "{v}");
        }
        let done = wait_for(&s, &id, &["completed", "failed"]).await;
        assert_eq!(done["status"], "completed", "{done}");
        let p = &done["progress"];
        assert_eq!(p["valid"], 6);
        let rejected: u64 = ["too_few_receivers", "low_snr", "high_gdop"]
            .iter()
            .map(|k| p["rejected"][k].as_u64().unwrap())
            .sum();
        assert_eq!(p["attempted"].as_u64().unwrap(), 6 + rejected);
        assert_eq!(done["features_url"], format!("/datasets/{id}/features"));
        let bytes = parquet_bytes(&s, &id).await;
        let reader = SerializedFileReader::new(bytes.clone()).unwrap();
        let meta = reader.metadata().file_metadata();
        assert_eq!(meta.num_rows(), 6);
        let names: Vec<String> = meta
            .schema_descr()
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        for want in [
            "sample_index",
            "tx_modulation",
            "gdop",
            "rx3_snr_db_mean",
            "rx3_signal_present_max",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing");
        }
        assert!(!names.iter().any(|n| n.starts_with("rx4_")));
        let indices: Vec<i64> = reader
            .get_row_iter(None)
            .unwrap()
            .map(|r| r.unwrap().get_long(0).unwrap())
            .collect();
        assert!(indices.windows(2).all(|w| w[0] < w[1]), "{indices:?}");
        assert_eq!(
            s.metric("gpu_ops_dataset_samples_total{outcome=\"accepted\"}")
                .await,
            6.0
        );
        assert_eq!(
            s.wait_for_metric("gpu_ops_dataset_jobs_total{status=\"completed\"}", 1.0)
                .await,
            1.0
        );
        let listed: Value = s.get("/datasets").await.json().await.unwrap();
        assert_eq!(listed["datasets"].as_array().unwrap().len(), 1);
        files.push(bytes);
    }
    assert!(
        files[0] == files[1],
        "one thread and two give different files"
    );
}

#[tokio::test]
async fn cancel_delete_and_bad_input() {
    let s = TestServer::start(&["--max-dataset-samples", "1000000"]).await;
    let mut long = small(1, 1_000_000);
    long["config"]["signal"]["duration_ms"] = json!(1000);
    long["config"]["chunk_ms"] = json!(200);
    let job = create(&s, long).await;
    let id = job["id"].as_str().unwrap();
    wait_for(&s, id, &["running"]).await;
    let res = s
        .post(&format!("/datasets/{id}/cancel"), json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let v = wait_for(&s, id, &["cancelled"]).await;
    assert!(v.get("features_url").is_none());
    problem(
        s.get(&format!("/datasets/{id}/features")).await,
        409,
        "dataset_not_ready",
    )
    .await;
    let res = s
        .post(&format!("/datasets/{id}/cancel"), json!({}))
        .send()
        .await
        .unwrap();
    problem(res, 409, "dataset_finished").await;
    let res = s
        .client
        .delete(format!("{}/datasets/{id}", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    problem(
        s.get(&format!("/datasets/{id}")).await,
        404,
        "dataset_not_found",
    )
    .await;

    let mut bad_freq = small(1, 1);
    bad_freq["config"]["propagation"] = json!({"frequency_mhz": 0});
    let mut unknown = small(1, 1);
    unknown["config"]["bogus"] = json!(1);
    let mut iq = small(1, 1);
    iq["dataset_type"] = json!("iq_raw");
    let cases = [
        (small(1, 0), "invalid_parameter", "/num_samples"),
        (small(1, 2_000_000), "invalid_parameter", "/num_samples"),
        (
            bad_freq,
            "invalid_parameter",
            "/config/propagation/frequency_mhz",
        ),
        (unknown, "invalid_request", "/config/bogus"),
        (iq, "invalid_parameter", "/dataset_type"),
    ];
    for (body, code, path) in cases {
        let res = s
            .post("/datasets/synthetic", body.clone())
            .send()
            .await
            .unwrap();
        let p = problem(res, 422, code).await;
        assert_eq!(p["errors"][0]["path"], path, "{p}");
    }
}

#[tokio::test]
async fn a_restart_keeps_completed_datasets_and_marks_the_rest_interrupted() {
    let dir = temp_data_dir();
    let mut a = TestServer::start_with(settings(&dir, "2"), |r| r).await;
    let done = create(&a, small(9, 3)).await;
    let done_id = done["id"].as_str().unwrap().to_string();
    wait_for(&a, &done_id, &["completed"]).await;
    let before = parquet_bytes(&a, &done_id).await;
    let mut long = small(2, 1_000_000);
    long["config"]["signal"]["duration_ms"] = json!(1000);
    long["config"]["chunk_ms"] = json!(200);
    let running = create(&a, long).await;
    let running_id = running["id"].as_str().unwrap().to_string();
    wait_for(&a, &running_id, &["running"]).await;
    a.trigger_shutdown();
    a.handle.take().unwrap().await.unwrap().unwrap();
    // The worker records the interruption as it stops.
    for _ in 0..100 {
        let row = a.state.store.dataset("", &running_id).unwrap().unwrap();
        if row.status.name() == "interrupted" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let b = TestServer::start_with(settings(&dir, "2"), |r| r).await;
    let v: Value = b
        .get(&format!("/datasets/{running_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["status"], "interrupted", "{v}");
    assert!(v["error"].as_str().unwrap().contains("resubmit"));
    assert_eq!(parquet_bytes(&b, &done_id).await, before);
}
