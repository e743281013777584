//! Datasets shared by replicas: finished files in a real S3-compatible store
//! (tests/common/s3.rs, `--artifact-store`), the catalog and queue in a real PostgreSQL
//! (tests/common/pg.rs). A replica dies mid-job and another finishes it, to the byte.

use crate::common;

use common::binary::Replica;
use common::{pg, s3};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn submit(base: &str, body: &Value) -> String {
    let res = reqwest::Client::new()
        .post(format!("{base}/datasets/synthetic"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn get(base: &str, path: &str) -> reqwest::Response {
    reqwest::get(format!("{base}{path}")).await.unwrap()
}

async fn wait_until(base: &str, id: &str, done: impl Fn(&Value) -> bool, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let v: Value = get(base, &format!("/datasets/{id}"))
            .await
            .json()
            .await
            .unwrap();
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "dataset {id} stuck at {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn completed(base: &str, id: &str) -> Value {
    let v = wait_until(
        base,
        id,
        |v| v["status"] != "queued" && v["status"] != "running",
        Duration::from_secs(180),
    )
    .await;
    assert_eq!(v["status"], "completed", "{v}");
    v
}

async fn bytes(base: &str, path: &str) -> bytes::Bytes {
    let res = get(base, path).await;
    assert_eq!(res.status(), 200, "{path}");
    res.bytes().await.unwrap()
}

fn iq_raw(seed: u64, n: u64) -> Value {
    let mut body = common::small_dataset(seed, n);
    body["dataset_type"] = json!("iq_raw");
    body
}

/// One replica with `--artifact-store`: its finished files are in the bucket, the same
/// bytes a replica keeping them under `--data-dir` serves, and a delete removes them all.
#[test]
fn finished_datasets_live_in_object_storage() {
    let Some((store, bucket)) = s3::fresh_bucket() else {
        return;
    };
    let target = format!("s3://{bucket}/prod");
    let in_bucket = Replica::start(&["--artifact-store", &target], &store.env());
    let on_disk = Replica::start(&[], &[]);
    rt().block_on(async {
        let body = iq_raw(21, 6);
        let id = submit(&in_bucket.url, &body).await;
        let reference = submit(&on_disk.url, &body).await;
        completed(&in_bucket.url, &id).await;
        completed(&on_disk.url, &reference).await;
        assert_eq!(
            bytes(&in_bucket.url, &format!("/datasets/{id}/features")).await,
            bytes(&on_disk.url, &format!("/datasets/{reference}/features")).await,
            "the features from the bucket differ"
        );
        for (n, rx) in [(0, 0), (5, 3)] {
            let data = |i: &str| format!("/datasets/{i}/samples/{n}/iq/{rx}?format=data");
            assert_eq!(
                bytes(&in_bucket.url, &data(&id)).await,
                bytes(&on_disk.url, &data(&reference)).await
            );
        }
        let missing = get(&in_bucket.url, &format!("/datasets/{id}/samples/6/iq/0")).await;
        assert_eq!(missing.status(), 404);
        let mut keys = store.keys(&bucket, &format!("prod/datasets/{id}/"));
        keys.sort();
        assert_eq!(
            keys,
            ["features.parquet", "iq.cf32", "iq.index", "iq.meta"]
                .map(|f| format!("prod/datasets/{id}/{f}"))
        );
        assert!(
            !in_bucket.data.join("datasets").join(&id).exists(),
            "the scratch copy is removed once published"
        );
        let deleted = reqwest::Client::new()
            .delete(format!("{}/datasets/{id}", in_bucket.url))
            .send()
            .await
            .unwrap();
        assert_eq!(deleted.status(), 204);
        assert!(store.keys(&bucket, "prod/").is_empty());
        assert_eq!(
            get(&in_bucket.url, &format!("/datasets/{id}"))
                .await
                .status(),
            404
        );
    });
}

/// Two replicas on one PostgreSQL and one bucket. The one running a job is SIGKILLed;
/// the other takes the job over when its lease runs out and finishes it, and the file
/// every replica serves is the one a single process writes from the same request.
#[test]
fn a_dataset_outlives_the_replica_running_it() {
    takeover(Stop::Kill);
}

/// As above, but the replica is stopped (SIGTERM): it hands the job back to the queue as
/// it shuts down, and the other takes it at once.
#[test]
fn a_replica_shutting_down_hands_its_dataset_job_on() {
    takeover(Stop::Terminate);
}

enum Stop {
    Kill,
    Terminate,
}

fn takeover(stop: Stop) {
    let Some(db) = pg::fresh_database() else {
        return;
    };
    let Some((store, bucket)) = s3::fresh_bucket() else {
        return;
    };
    let target = format!("s3://{bucket}");
    // Killed: the job waits out the lease. Stopped: a lease far longer than the test
    // waits, so only the hand-back can explain a quick takeover.
    let lease = match stop {
        // Long enough that a busy machine's heartbeats keep it, short enough to wait out.
        Stop::Kill => "4s",
        Stop::Terminate => "60s",
    };
    let flags = [
        "--database-url",
        &db,
        "--artifact-store",
        &target,
        "--dataset-lease",
        lease,
    ];
    let mut replicas = [
        Replica::start(&flags, &store.env()),
        Replica::start(&flags, &store.env()),
    ];
    let single = Replica::start(&[], &[]);
    // Long enough (seconds) to be caught running, whatever the machine's speed; the
    // killed replica's job keeps recordings too, so their segments are resumed as well.
    let mut body = match stop {
        Stop::Kill => iq_raw(33, 240),
        Stop::Terminate => common::small_dataset(33, 240),
    };
    body["config"]["signal"]["duration_ms"] = json!(500);
    body["config"]["chunk_ms"] = json!(100);
    let rt = rt();
    let id = rt.block_on(submit(&replicas[0].url, &body));
    // Whichever replica claimed it: wait until it has published its first checkpoint
    // (64 rows a part at this size), then stop it.
    rt.block_on(wait_until(
        &replicas[1].url,
        &id,
        |v| v["status"] == "running" && v["progress"]["valid"].as_u64() > Some(70),
        Duration::from_secs(60),
    ));
    let owner: String = {
        let id = id.clone();
        pg::with_client(&db, move |c| {
            c.query_one("SELECT lease_owner FROM datasets WHERE id = $1", &[&id])
                .unwrap()
                .get(0)
        })
    };
    let running_on = replicas
        .iter()
        .position(|r| owner.contains(&format!("/{}/", r.child.id())))
        .unwrap_or_else(|| panic!("owner {owner} is no replica"));
    let survivor = &replicas[1 - running_on].url.clone();
    let stopped_at = Instant::now();
    match stop {
        Stop::Kill => replicas[running_on].child.kill().unwrap(),
        Stop::Terminate => {
            let pid = replicas[running_on].child.id().to_string();
            assert!(std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success());
        }
    }
    replicas[running_on].child.wait().unwrap();
    if let Stop::Terminate = stop {
        // Handed back, not left to expire: claimed again well inside one lease.
        let id = id.clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, attempt): (String, i64) = pg::with_client(&db, {
                let id = id.clone();
                move |c| {
                    let r = c
                        .query_one("SELECT status, attempt FROM datasets WHERE id = $1", &[&id])
                        .unwrap();
                    (r.get(0), r.get(1))
                }
            });
            if attempt == 2 {
                assert!(
                    stopped_at.elapsed() < Duration::from_secs(10),
                    "taken over only after {:?} ({status})",
                    stopped_at.elapsed()
                );
                break;
            }
            assert!(Instant::now() < deadline, "never taken over ({status})");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    rt.block_on(async {
        completed(survivor, &id).await;
        let reference = submit(&single.url, &body).await;
        completed(&single.url, &reference).await;
        let want = bytes(&single.url, &format!("/datasets/{reference}/features")).await;
        assert_eq!(
            bytes(survivor, &format!("/datasets/{id}/features")).await,
            want,
            "the taken-over dataset differs from a single process's"
        );
        if let Stop::Kill = stop {
            for (n, rx) in [(0, 0), (100, 2), (239, 3)] {
                // The recording's bytes (the archive's names carry the dataset id).
                let data = |i: &str| format!("/datasets/{i}/samples/{n}/iq/{rx}?format=data");
                assert_eq!(
                    bytes(survivor, &data(&id)).await,
                    bytes(&single.url, &data(&reference)).await,
                    "recording {n}/{rx}"
                );
            }
        }
        // The survivor resumed from the published checkpoint: it made fewer samples
        // than the dataset has.
        let metrics = get(survivor, "/metrics").await.text().await.unwrap();
        let made: f64 = metrics
            .lines()
            .find(|l| l.starts_with("gpu_ops_dataset_samples_total{outcome=\"accepted\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no accepted-samples counter in {metrics}"));
        assert!(
            made <= 240.0 - 64.0,
            "the survivor made {made} of 240 samples"
        );
        // Only the finished files remain: the checkpoint's objects are gone.
        let mut keys = store.keys(&bucket, &format!("datasets/{id}/"));
        keys.sort();
        let want_keys: Vec<String> = match stop {
            Stop::Kill => vec!["features.parquet", "iq.cf32", "iq.index", "iq.meta"],
            Stop::Terminate => vec!["features.parquet"],
        }
        .into_iter()
        .map(|f| format!("datasets/{id}/{f}"))
        .collect();
        assert_eq!(keys, want_keys);
        let attempt: i64 = {
            let id = id.clone();
            pg::with_client(&db, move |c| {
                c.query_one("SELECT attempt FROM datasets WHERE id = $1", &[&id])
                    .unwrap()
                    .get(0)
            })
        };
        assert_eq!(attempt, 2, "the job was taken over once");
    });
    // A replica started afterwards serves it too, and a delete through it empties the bucket.
    let late = Replica::start(&flags, &store.env());
    rt.block_on(async {
        assert_eq!(
            bytes(&late.url, &format!("/datasets/{id}/features")).await,
            bytes(survivor, &format!("/datasets/{id}/features")).await
        );
        let deleted = reqwest::Client::new()
            .delete(format!("{}/datasets/{id}", late.url))
            .send()
            .await
            .unwrap();
        assert_eq!(deleted.status(), 204);
        assert!(store.keys(&bucket, "").is_empty(), "every object deleted");
        assert_eq!(
            get(survivor, &format!("/datasets/{id}")).await.status(),
            404
        );
    });
}
