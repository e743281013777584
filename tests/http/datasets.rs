//! Synthetic dataset jobs over HTTP: a small job runs to completion and its Parquet file
//! holds what the status says, byte-identical whatever the thread count; cancel, delete,
//! bad input, and a restart that keeps completed datasets and marks the rest interrupted;
//! iq_raw recordings as SigMF that agree with the Parquet row; size and disk limits; and
//! datasets that belong to their tenant; resume from a checkpoint, refused across
//! generator versions; the memory budget and each tenant's share of the queue.

use crate::common;

use clap::Parser;
use common::{problem, small_dataset as small, temp_data_dir, TestServer};
use gpu_ops::ops::rf::generate::GENERATOR_VERSION;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::RowAccessor;
use serde_json::{json, Value};
use std::time::Duration;

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

/// A size refusal names `/num_samples` and says `why`.
fn assert_num_samples_refused(p: &Value, why: &str) {
    assert_eq!(p["errors"][0]["path"], "/num_samples", "{p}");
    assert!(
        p["errors"][0]["message"].as_str().unwrap().contains(why),
        "{p}"
    );
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

/// `GET /datasets/{id}`.
async fn view(s: &TestServer, id: &str) -> Value {
    s.get(&format!("/datasets/{id}"))
        .await
        .json()
        .await
        .unwrap()
}

/// Polls until the job leaves queued/running (or `want` is reached), up to 60 s.
async fn wait_for(s: &TestServer, id: &str, want: &[&str]) -> Value {
    for _ in 0..600 {
        let v = view(s, id).await;
        if want.contains(&v["status"].as_str().unwrap()) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("dataset {id} never reached {want:?}");
}

/// Shuts the server down and waits until the worker has recorded job `id` interrupted.
async fn stop_while_running(s: &mut TestServer, id: &str) {
    s.trigger_shutdown();
    s.handle.take().unwrap().await.unwrap().unwrap();
    for _ in 0..100 {
        let row = s.state.store.dataset("", id).unwrap().unwrap();
        if row.status.name() == "interrupted" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
        let generator = meta
            .key_value_metadata()
            .and_then(|kv| kv.iter().find(|e| e.key == "gpu_ops.generator_version"))
            .and_then(|e| e.value.clone());
        assert_eq!(generator, Some(GENERATOR_VERSION.to_string()));
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
    let mut long = small(1, 1000);
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
    let res = s.delete(&format!("/datasets/{id}")).send().await.unwrap();
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
    let cases = [
        (small(1, 0), "invalid_parameter", "/num_samples"),
        (small(1, 2_000_000), "invalid_parameter", "/num_samples"),
        (
            bad_freq,
            "invalid_parameter",
            "/config/propagation/frequency_mhz",
        ),
        (unknown, "invalid_request", "/config/bogus"),
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
    let mut long = small(2, 1000);
    long["config"]["signal"]["duration_ms"] = json!(1000);
    long["config"]["chunk_ms"] = json!(200);
    let running = create(&a, long).await;
    let running_id = running["id"].as_str().unwrap().to_string();
    wait_for(&a, &running_id, &["running"]).await;
    stop_while_running(&mut a, &running_id).await;

    let b = TestServer::start_with(settings(&dir, "2"), |r| r).await;
    let v = view(&b, &running_id).await;
    assert_eq!(v["status"], "interrupted", "{v}");
    assert!(v["error"].as_str().unwrap().contains("resume"));
    assert_eq!(parquet_bytes(&b, &done_id).await, before);
}

fn iq_raw(seed: u64, n: u64) -> Value {
    let mut body = small(seed, n);
    body["dataset_type"] = json!("iq_raw");
    body
}

/// The meta and data files of a `.sigmf` archive, checking its layout.
fn unpack(archive: &[u8], stem: &str) -> (Value, Vec<u8>) {
    let mut tar = tar::Archive::new(archive);
    let (mut meta, mut data, mut names) = (None, None, Vec::new());
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().to_string_lossy().to_string();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
        if name.ends_with(".sigmf-meta") {
            meta = Some(serde_json::from_slice(&bytes).unwrap());
        } else if name.ends_with(".sigmf-data") {
            data = Some(bytes);
        }
        names.push(name);
    }
    assert_eq!(
        names,
        [
            format!("{stem}/"),
            format!("{stem}/{stem}.sigmf-meta"),
            format!("{stem}/{stem}.sigmf-data")
        ]
    );
    (meta.unwrap(), data.unwrap())
}

#[tokio::test]
async fn iq_raw_recordings_are_sigmf_and_agree_with_the_parquet_row() {
    use base64::Engine;
    use sha2::Digest;
    let s = TestServer::start(&[]).await;
    let job = create(&s, iq_raw(11, 3)).await;
    let id = job["id"].as_str().unwrap().to_string();
    let done = wait_for(&s, &id, &["completed", "failed"]).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["dataset_type"], "iq_raw");
    let url = format!("/datasets/{id}/samples/{{n}}/iq/{{rx}}");
    assert_eq!(done["iq_url"], url);
    let bytes = parquet_bytes(&s, &id).await;
    let reader = SerializedFileReader::new(bytes).unwrap();
    let names: Vec<String> = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let col = |name: &str| names.iter().position(|n| n == name).unwrap();
    let row = reader.get_row_iter(None).unwrap().nth(1).unwrap().unwrap();

    let path = format!("/datasets/{id}/samples/1/iq/2");
    let res = s.get(&path).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/x-tar");
    let stem = format!("{id}_sample1_rx2");
    assert_eq!(
        res.headers()["content-disposition"],
        format!("attachment; filename=\"{stem}.sigmf\"")
    );
    let (meta, data) = unpack(&res.bytes().await.unwrap(), &stem);
    // 100 ms at 200 kHz, 8 bytes per complex sample.
    assert_eq!(data.len(), 20_000 * 8);
    let g = &meta["global"];
    assert_eq!(g["core:datatype"], "cf32_le");
    assert_eq!(g["core:sample_rate"], 200_000.0);
    assert_eq!(g["core:version"], "1.2.0");
    let sha: String = sha2::Sha512::digest(&data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(g["core:sha512"], sha);
    assert_eq!(
        g["gpu_ops:sample_index"],
        row.get_long(col("sample_index")).unwrap()
    );
    assert_eq!(
        g["gpu_ops:transmitter"]["lat"],
        row.get_double(col("tx_lat")).unwrap()
    );
    let point = &g["core:geolocation"]["coordinates"];
    assert_eq!(point[0], row.get_double(col("rx2_lon")).unwrap());
    assert_eq!(point[1], row.get_double(col("rx2_lat")).unwrap());
    assert_eq!(
        g["gpu_ops:receiver_truth"]["carrier_offset_hz"],
        row.get_double(col("rx2_carrier_offset_hz")).unwrap()
    );
    assert_eq!(meta["annotations"][0]["core:sample_count"], 20_000);
    assert_eq!(
        meta["annotations"][0]["core:label"],
        g["gpu_ops:transmitter"]["modulation"]
    );

    // The data and meta alone are the archive's files.
    let alone = s.get(&format!("{path}?format=data")).await;
    assert_eq!(alone.headers()["content-type"], "application/octet-stream");
    assert_eq!(alone.bytes().await.unwrap(), data);
    let alone: Value = s
        .get(&format!("{path}?format=meta"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(alone, meta);

    // The recording is the one the features in the Parquet row came from.
    let res = s
        .post(
            "/rf/features",
            json!({"sample_rate_hz": 200_000.0, "encoding": "base64", "chunk_ms": 50,
                   "iq": base64::engine::general_purpose::STANDARD.encode(&data)}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let f: Value = res.json().await.unwrap();
    for (feature, stat) in [
        ("snr_db", "mean"),
        ("rssi_dbm", "max"),
        ("frequency_offset_hz", "min"),
    ] {
        assert_eq!(
            f["features"][feature][stat].as_f64().unwrap(),
            row.get_double(col(&format!("rx2_{feature}_{stat}")))
                .unwrap(),
            "{feature} {stat}"
        );
    }

    for (path, status, code) in [
        (
            format!("/datasets/{id}/samples/3/iq/0"),
            404,
            "sample_not_found",
        ),
        (
            format!("/datasets/{id}/samples/0/iq/4"),
            404,
            "sample_not_found",
        ),
        // A path parameter that does not parse is refused like a body field.
        (
            format!("/datasets/{id}/samples/x/iq/0"),
            422,
            "invalid_parameter",
        ),
        (
            format!("/datasets/{id}/samples/0/iq/99999999999"),
            422,
            "invalid_parameter",
        ),
        (
            "/datasets/%FF/features".to_string(),
            422,
            "invalid_parameter",
        ),
        (
            format!("/datasets/{id}/samples/0/iq/0?format=wav"),
            422,
            "invalid_parameter",
        ),
        (
            "/datasets/ds_nope/samples/0/iq/0".to_string(),
            404,
            "dataset_not_found",
        ),
    ] {
        problem(s.get(&path).await, status, code).await;
    }
    let features_only = create(&s, small(11, 1)).await;
    let fid = features_only["id"].as_str().unwrap();
    let done = wait_for(&s, fid, &["completed"]).await;
    assert!(done.get("iq_url").is_none());
    problem(
        s.get(&format!("/datasets/{fid}/samples/0/iq/0")).await,
        404,
        "sample_not_found",
    )
    .await;
}

#[tokio::test]
async fn size_and_disk_limits_refuse_a_job_up_front() {
    let s = TestServer::start(&["--max-dataset-bytes", "10000000"]).await;
    // 100 ms × 200 kHz × 4 receivers × 8 bytes = 640 kB per sample: 15 fit in 10 MB.
    let res = s
        .post("/datasets/synthetic", iq_raw(1, 16))
        .send()
        .await
        .unwrap();
    let p = problem(res, 422, "dataset_too_large").await;
    assert_num_samples_refused(&p, "at most 15 samples");
    create(&s, iq_raw(1, 15)).await;

    // 5 million one-second 7-receiver recordings (56 TB) fit no test machine's disk.
    let s = TestServer::start(&[
        "--max-dataset-bytes",
        "1000000000000000000",
        "--max-tenant-dataset-work",
        "10000000000000000000",
    ])
    .await;
    let mut huge = iq_raw(1, 5_000_000);
    huge["config"] = json!({});
    let res = s.post("/datasets/synthetic", huge).send().await.unwrap();
    let p = problem(res, 507, "insufficient_storage").await;
    assert_num_samples_refused(&p, "free");
}

/// `--dataset-memory-mib`: a job whose one sample cannot fit is refused at submission
/// with the figure, `iq_raw` (every recording kept) sooner than features (one at a time).
#[tokio::test]
async fn a_sample_past_the_memory_budget_is_refused_with_the_figure() {
    let s = TestServer::start(&["--dataset-memory-mib", "16"]).await;
    // 1.5 s at 200 kHz: 300 000 complex samples per recording, 8 bytes each. Features
    // hold four recordings' worth at a time (9.6 MB), iq_raw with 4 receivers seven (16.8 MB).
    let long = |mut body: Value, ms: u64| {
        body["config"]["signal"]["duration_ms"] = json!(ms);
        body
    };
    let p = problem(
        s.post("/datasets/synthetic", long(iq_raw(1, 1), 1500))
            .send()
            .await
            .unwrap(),
        422,
        "dataset_sample_too_large",
    )
    .await;
    assert_eq!(p["errors"][0]["path"], "/config/signal/duration_ms", "{p}");
    let why = p["errors"][0]["message"].as_str().unwrap();
    assert!(
        why.contains("up to 17 MiB") && why.contains("--dataset-memory-mib is 16"),
        "{p}"
    );
    let feature = create(&s, long(small(1, 1), 1500)).await;
    let p = problem(
        s.post("/datasets/synthetic", long(small(1, 1), 3000))
            .send()
            .await
            .unwrap(),
        422,
        "dataset_sample_too_large",
    )
    .await;
    assert!(
        p["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("at most 2621.440 ms"),
        "{p}"
    );
    // The admitted one runs to the end within the budget.
    wait_for(&s, feature["id"].as_str().unwrap(), &["completed"]).await;
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains(
            "gpu_ops_dataset_submissions_refused_total{code=\"dataset_sample_too_large\"} 2"
        ),
        "{metrics}"
    );
}

/// A tenant's waiting jobs and the work its queued and running jobs ask for are capped:
/// 429 with Retry-After while others' work is pending, 422 for a job past it alone.
#[tokio::test]
async fn a_tenant_queue_share_and_its_pending_work_are_capped() {
    // small(): 4 receivers × 20 000 complex samples = 80 000 per sample.
    let s = TestServer::start(&[
        "--max-tenant-queued-datasets",
        "1",
        "--max-tenant-dataset-work",
        "200000000",
    ])
    .await;
    let p = problem(
        s.post("/datasets/synthetic", small(1, 2501))
            .send()
            .await
            .unwrap(),
        422,
        "dataset_work_too_large",
    )
    .await;
    assert_num_samples_refused(&p, "at most 2500 samples");
    // 2000 samples (160 M) keep the worker busy while the rest is submitted.
    let running = create(&s, small(1, 2000)).await;
    let running = running["id"].as_str().unwrap().to_string();
    wait_for(&s, &running, &["running"]).await;
    let waiting = create(&s, small(2, 5)).await;
    let res = s
        .post("/datasets/synthetic", small(3, 5))
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["retry-after"], "60");
    problem(res, 429, "tenant_dataset_queue_full").await;
    // Its place freed, the queue takes work up to the limit with the running job's.
    let res = s
        .post(
            &format!("/datasets/{}/cancel", waiting["id"].as_str().unwrap()),
            json!({}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let p = problem(
        s.post("/datasets/synthetic", small(4, 501))
            .send()
            .await
            .unwrap(),
        429,
        "tenant_dataset_work_pending",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("160000000"), "{p}");
    create(&s, small(4, 500)).await;
    let metrics = s.get("/metrics").await.text().await.unwrap();
    for code in [
        "dataset_work_too_large",
        "tenant_dataset_queue_full",
        "tenant_dataset_work_pending",
    ] {
        assert!(
            metrics.contains(&format!(
                "gpu_ops_dataset_submissions_refused_total{{code=\"{code}\"}} 1"
            )),
            "{code}: {metrics}"
        );
    }
    let res = s
        .post(&format!("/datasets/{running}/cancel"), json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
}

#[tokio::test]
async fn a_tenant_quota_counts_the_datasets_that_keep_files() {
    use gpu_ops::datasets::estimate_bytes;
    use gpu_ops::ops::rf::scenario::Scenario;
    let one: Scenario = serde_json::from_value(small(1, 2)["config"].clone()).unwrap();
    let each = estimate_bytes(&one, false, 2);
    // Room for one two-sample dataset and a half, not two.
    let quota = (each * 3 / 2).to_string();
    let s = TestServer::start(&["--max-tenant-dataset-bytes", &quota]).await;
    let first = create(&s, small(1, 2)).await;
    let id = first["id"].as_str().unwrap().to_string();
    let p = problem(
        s.post("/datasets/synthetic", small(2, 2))
            .send()
            .await
            .unwrap(),
        422,
        "dataset_quota_exceeded",
    )
    .await;
    assert_num_samples_refused(&p, "--max-tenant-dataset-bytes");
    // A smaller one fits beside it.
    let fits = create(&s, small(3, 1)).await;
    wait_for(&s, &id, &["completed"]).await;
    wait_for(&s, fits["id"].as_str().unwrap(), &["completed"]).await;
    // Deleting the first frees its share.
    let res = s.delete(&format!("/datasets/{id}")).send().await.unwrap();
    assert_eq!(res.status(), 204);
    create(&s, small(2, 2)).await;
}

#[tokio::test]
async fn datasets_belong_to_their_tenant() {
    let keys = std::env::temp_dir().join(format!("gpu-ops-ds-keys-{}", std::process::id()));
    std::fs::write(
        &keys,
        "key-alice-0123456789 alice\nkey-bobby-0123456789 bob\n",
    )
    .unwrap();
    let s = TestServer::start(&["--api-keys-file", keys.to_str().unwrap()]).await;
    let (alice, bob) = ("key-alice-0123456789", "key-bobby-0123456789");
    let res = s
        .post("/datasets/synthetic", iq_raw(3, 1))
        .bearer_auth(alice)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    problem(
        s.post("/datasets/synthetic", small(3, 1))
            .send()
            .await
            .unwrap(),
        401,
        "unauthorized",
    )
    .await;
    let get = |path: String, key: &'static str| {
        let c = s.client.get(format!("{}{path}", s.url)).bearer_auth(key);
        async move { c.send().await.unwrap() }
    };
    for _ in 0..600 {
        let v: Value = get(format!("/datasets/{id}"), alice)
            .await
            .json()
            .await
            .unwrap();
        if v["status"] == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        get(format!("/datasets/{id}/samples/0/iq/0"), alice)
            .await
            .status(),
        200
    );
    for path in ["", "/features", "/events", "/samples/0/iq/0"] {
        problem(
            get(format!("/datasets/{id}{path}"), bob).await,
            404,
            "dataset_not_found",
        )
        .await;
    }
    let res = s
        .post(&format!("/datasets/{id}/cancel"), json!({}))
        .bearer_auth(bob)
        .send()
        .await
        .unwrap();
    problem(res, 404, "dataset_not_found").await;
    let res = s
        .delete(&format!("/datasets/{id}"))
        .bearer_auth(bob)
        .send()
        .await
        .unwrap();
    problem(res, 404, "dataset_not_found").await;
    let bobs: Value = get("/datasets".into(), bob).await.json().await.unwrap();
    assert_eq!(bobs["datasets"], json!([]));
    let alices: Value = get("/datasets".into(), alice).await.json().await.unwrap();
    assert_eq!(alices["datasets"][0]["id"], id.as_str());
    assert_eq!(alices["datasets"][0]["status"], "completed");
    let _ = std::fs::remove_file(keys);
}

#[tokio::test]
async fn an_interrupted_job_resumes_from_its_checkpoint_to_the_same_file() {
    // 2000 samples seal a part every 125 rows.
    let body = || {
        let mut b = small(31, 2000);
        b["config"]["signal"]["duration_ms"] = json!(40);
        b["config"]["chunk_ms"] = json!(20);
        b
    };
    let dir = temp_data_dir();
    let mut a = TestServer::start_with(settings(&dir, "2"), |r| r).await;
    let id = create(&a, body()).await["id"].as_str().unwrap().to_string();
    for _ in 0..3000 {
        let v = view(&a, &id).await;
        assert_ne!(
            v["status"], "completed",
            "finished before it could be interrupted"
        );
        if v["progress"]["valid"].as_u64().unwrap() >= 400 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_while_running(&mut a, &id).await;

    let b = TestServer::start_with(settings(&dir, "2"), |r| r).await;
    let v = view(&b, &id).await;
    assert_eq!(v["status"], "interrupted", "{v}");
    let checkpoint: Value = serde_json::from_slice(
        &std::fs::read(format!("{dir}/datasets/{id}/checkpoint.json")).unwrap(),
    )
    .unwrap();
    let recovered = checkpoint["counts"]["valid"].as_u64().unwrap();
    assert!(recovered >= 375 && recovered % 125 == 0, "{checkpoint}");
    assert_eq!(checkpoint["generator"], GENERATOR_VERSION);
    // A checkpoint from before generator versions were recorded (version 1) is refused:
    // resuming would mix two generators' samples.
    let path = format!("{dir}/datasets/{id}/checkpoint.json");
    let mut old = checkpoint.clone();
    old.as_object_mut().unwrap().remove("generator");
    std::fs::write(&path, serde_json::to_vec(&old).unwrap()).unwrap();
    let refused = problem(
        b.post(&format!("/datasets/{id}/resume"), json!({}))
            .send()
            .await
            .unwrap(),
        409,
        "dataset_not_resumable",
    )
    .await;
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("generator version 1"),
        "{refused}"
    );
    std::fs::write(&path, serde_json::to_vec(&checkpoint).unwrap()).unwrap();
    let res = b
        .post(&format!("/datasets/{id}/resume"), json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let again = b
        .post(&format!("/datasets/{id}/resume"), json!({}))
        .send()
        .await
        .unwrap();
    problem(again, 409, "dataset_not_resumable").await;
    let done = wait_for(&b, &id, &["completed", "failed"]).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["progress"]["valid"], 2000);
    // Only what was left was generated again.
    assert_eq!(
        b.metric("gpu_ops_dataset_samples_total{outcome=\"accepted\"}")
            .await,
        (2000 - recovered) as f64
    );
    let resumed = parquet_bytes(&b, &id).await;
    // Once completed (and recorded so), only the file is kept.
    for left in ["features.parts", "checkpoint.json"] {
        let path = format!("{dir}/datasets/{id}/{left}");
        for _ in 0..100 {
            if !std::path::Path::new(&path).exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!std::path::Path::new(&path).exists(), "{left} left behind");
    }
    problem(
        b.post(&format!("/datasets/{id}/resume"), json!({}))
            .send()
            .await
            .unwrap(),
        409,
        "dataset_not_resumable",
    )
    .await;

    let c = TestServer::start_with(settings(&temp_data_dir(), "2"), |r| r).await;
    let whole = create(&c, body()).await["id"].as_str().unwrap().to_string();
    let done = wait_for(&c, &whole, &["completed", "failed"]).await;
    assert_eq!(
        done["progress"],
        json!({"valid": 2000, "attempted": done["progress"]["attempted"], "target": 2000, "rejected": done["progress"]["rejected"]})
    );
    assert!(
        parquet_bytes(&c, &whole).await == resumed,
        "the resumed file differs from an uninterrupted run"
    );
}

/// Progress streams: a tenant may hold --max-tenant-event-streams at once (429
/// too_many_streams past it, a place given back when one closes), and the streams of one
/// job read the same shared poll to the job's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_streams_are_capped_per_tenant_and_share_one_poll() {
    let dir = temp_data_dir();
    let mut settings = settings(&dir, "1");
    settings.config.max_tenant_event_streams = 2;
    let s = TestServer::start_with(settings, |r| r).await;
    let mut long = small(3, 1000);
    long["config"]["signal"]["duration_ms"] = json!(1000);
    long["config"]["chunk_ms"] = json!(200);
    let job = create(&s, long).await;
    let id = job["id"].as_str().unwrap().to_string();
    let events = format!("{}/datasets/{id}/events", s.url);
    let first = s.client.get(&events).send().await.unwrap();
    let second = s.client.get(&events).send().await.unwrap();
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    assert_eq!(s.state.progress_streams(""), 2);
    let res = s.client.get(&events).send().await.unwrap();
    assert_eq!(res.headers()["retry-after"], "1");
    problem(res, 429, "too_many_streams").await;
    drop(second);
    // The server notices the closed stream at its next event (every 500 ms).
    let mut third = None;
    for _ in 0..50 {
        let res = s.client.get(&events).send().await.unwrap();
        if res.status() == 200 {
            third = Some(res);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let third = third.expect("a place given back once a stream closed");
    let res = s
        .post(&format!("/datasets/{id}/cancel"), json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    // Both open streams follow the one poll to the same last reading, then close.
    let (a, b) = tokio::join!(first.text(), third.text());
    let last = |text: &str| {
        assert!(text.contains("event: end"), "{text}");
        text.lines()
            .rev()
            .find_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str::<Value>(d).unwrap()["status"].clone())
            .unwrap()
    };
    assert_eq!(last(&a.unwrap()), "cancelled");
    assert_eq!(last(&b.unwrap()), "cancelled");
    for _ in 0..50 {
        if s.state.progress_streams("") == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.state.progress_streams(""), 0);
}
