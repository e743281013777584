//! Resident arrays shared by replicas: the catalog in a real PostgreSQL
//! (tests/common/pg.rs), the values in a real S3-compatible store (tests/common/s3.rs),
//! as `--database-url` with `--artifact-store` run them. An array made through one
//! replica is used, listed, read, kept from and deleted through another; the quotas hold
//! across replicas; a replica started later serves them; expiry reaches every replica
//! and the bucket. Embedding tables are shared arrays too, held to the tables' own limits
//! across replicas.

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

async fn call(req: reqwest::RequestBuilder) -> (u16, Value) {
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    call(
        reqwest::Client::new()
            .post(format!("{base}{path}"))
            .json(&body),
    )
    .await
}

async fn get(base: &str, path: &str) -> (u16, Value) {
    call(reqwest::Client::new().get(format!("{base}{path}"))).await
}

/// `post`, which must answer 200 or 201.
async fn ok(base: &str, path: &str, body: Value) -> Value {
    let (status, v) = post(base, path, body).await;
    assert!(status == 200 || status == 201, "{path}: {status} {v}");
    v
}

async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Replicas sharing a fresh database and bucket: their flags, and the bucket's objects.
struct Shared {
    store: &'static s3::ObjectServer,
    bucket: String,
    flags: Vec<String>,
}

impl Shared {
    /// `None` where PostgreSQL or the S3-compatible server is missing (the helpers say
    /// why, and fail the run where they may not skip).
    fn new(extra: &[&str]) -> Option<Self> {
        let db = pg::fresh_database()?;
        let (store, bucket) = s3::fresh_bucket()?;
        let target = format!("s3://{bucket}/shared");
        let mut flags: Vec<String> = ["--database-url", &db, "--artifact-store", &target]
            .map(String::from)
            .to_vec();
        flags.extend(extra.iter().map(|f| f.to_string()));
        Some(Self {
            store,
            bucket,
            flags,
        })
    }

    fn replica(&self) -> Replica {
        let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        Replica::start(&flags, &self.store.env())
    }

    /// The arrays' objects in the bucket.
    fn objects(&self) -> Vec<String> {
        self.store.keys(&self.bucket, "shared/arrays/")
    }
}

/// Goldilocks elements, the largest one canonical (p − 1).
fn values() -> Value {
    json!(["1", "2", "3", "18446744069414584320"])
}

#[test]
fn arrays_made_through_one_replica_are_served_kept_and_deleted_through_another() {
    let Some(shared) = Shared::new(&["--max-tenant-arrays", "3"]) else {
        return;
    };
    let (a, b) = (shared.replica(), shared.replica());
    let objects = || shared.objects();
    rt().block_on(async {
        let made = ok(
            &a.url,
            "/arrays",
            json!({"kind": "field_elements", "field": "goldilocks", "values": values()}),
        )
        .await;
        let id = made["id"].as_str().unwrap().to_string();
        assert_eq!(made["held"], json!(["host", "object_store"]), "{made}");
        assert_eq!(objects(), [format!("shared/arrays/{id}.bin")]);

        // Another replica lists it (not yet read there), reads it and uses it.
        let (_, listed) = get(&b.url, "/arrays").await;
        assert_eq!(listed["arrays"][0]["id"], json!(id), "{listed}");
        assert_eq!(listed["arrays"][0]["held"], json!(["object_store"]));
        let (status, data) = get(&b.url, &format!("/arrays/{id}/data")).await;
        assert_eq!((status, &data["values"]), (200, &values()), "{data}");
        let want = ok(&a.url, "/zk/ntt", json!({"field": "goldilocks", "values": values()})).await;
        let named = json!({"field": "goldilocks", "values": {"array": id}});
        assert_eq!(ok(&b.url, "/zk/ntt", named.clone()).await, want);
        let (_, shown) = get(&b.url, &format!("/arrays/{id}")).await;
        assert_eq!(shown["held"], json!(["host", "object_store"]));

        // A result kept through b is read through a.
        let mut keep = named.clone();
        keep["keep"] = json!({"with_data": false});
        let kept = ok(&b.url, "/zk/ntt", keep).await;
        let kept_id = kept["kept"]["id"].as_str().unwrap().to_string();
        let (_, kept_data) = get(&a.url, &format!("/arrays/{kept_id}/data")).await;
        assert_eq!(kept_data["values"], want["result"], "{kept_data}");

        // The tenant's count is one across the replicas: 2 held, a third fits, a fourth
        // (through either) does not.
        let third = json!({"kind": "field_elements", "field": "goldilocks", "values": ["7"]});
        ok(&a.url, "/arrays", third.clone()).await;
        let (status, refused) = post(&b.url, "/arrays", third).await;
        assert_eq!((status, &refused["code"]), (422, &json!("array_quota_exceeded")), "{refused}");
        assert_eq!(
            metric(&b.url, "gpu_ops_arrays_refused_total{reason=\"tenant_count\"}").await,
            1.0
        );
        assert_eq!(metric(&a.url, "gpu_ops_arrays").await, 3.0);

        // Deleted through b, it is refused at once through a, which made it and holds a
        // copy, and its object is gone.
        let deleted = reqwest::Client::new()
            .delete(format!("{}/arrays/{id}", b.url))
            .send()
            .await
            .unwrap();
        assert_eq!(deleted.status(), 204);
        let (status, gone) = post(&a.url, "/zk/ntt", named).await;
        assert_eq!((status, &gone["code"]), (422, &json!("unknown_array")), "{gone}");
        assert_eq!(gone["errors"][0]["path"], json!("/values/array"), "{gone}");
        assert_eq!(get(&a.url, &format!("/arrays/{id}")).await.0, 404);
        assert!(!objects().contains(&format!("shared/arrays/{id}.bin")));

        // A replica started later serves what is there, from the bucket.
        let late = shared.replica();
        let (status, again) = get(&late.url, &format!("/arrays/{kept_id}/data")).await;
        assert_eq!((status, &again["values"]), (200, &want["result"]));

        // Expiry: gone through every replica at its deadline, and from the bucket within
        // a sweep (every 5 s) of some replica.
        let brief = ok(
            &b.url,
            "/arrays",
            json!({"kind": "field_elements", "field": "goldilocks", "values": ["5"], "ttl_seconds": 1}),
        )
        .await;
        let brief = brief["id"].as_str().unwrap().to_string();
        assert_eq!(get(&a.url, &format!("/arrays/{brief}")).await.0, 200);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(get(&a.url, &format!("/arrays/{brief}")).await.0, 404);
        let deadline = Instant::now() + Duration::from_secs(30);
        while objects().contains(&format!("shared/arrays/{brief}.bin")) {
            assert!(Instant::now() < deadline, "the expired array's object stayed");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut expired = 0.0;
        for r in [&a, &b, &late] {
            expired += metric(&r.url, "gpu_ops_arrays_expired_total").await;
        }
        assert!(expired >= 1.0, "{expired}");
    });
}

/// An embedding table made through one replica is listed and serves lookups through
/// another; the tables' own count (`--max-tenant-embedding-tables`, summed over the table
/// rows of the PostgreSQL catalog) holds across replicas while other arrays still fit; a
/// table deleted through one replica frees its room and its object.
#[test]
fn embedding_tables_are_shared_arrays_held_to_their_own_limits() {
    let Some(shared) = Shared::new(&["--max-tenant-embedding-tables", "1"]) else {
        return;
    };
    let (a, b) = (shared.replica(), shared.replica());
    let objects = || shared.objects();
    rt().block_on(async {
        let table = json!({"table": [[0.5, 1.5], [2.5, 3.5], [4.5, 5.5]]});
        let made = ok(&a.url, "/embeddings/tables", table.clone()).await;
        let id = made["id"].as_str().unwrap().to_string();
        assert_eq!(made["expires_at"], Value::Null, "{made}");
        assert_eq!(objects(), [format!("shared/arrays/{id}.bin")]);
        let (_, listed) = get(&b.url, "/embeddings/tables").await;
        assert_eq!(listed["tables"][0]["id"], json!(id), "{listed}");
        let rows = ok(
            &b.url,
            &format!("/embeddings/tables/{id}/lookup"),
            json!({"ids": [2, 0]}),
        )
        .await;
        assert_eq!(rows["result"], json!([[4.5, 5.5], [0.5, 1.5]]), "{rows}");
        let (status, refused) = post(&b.url, "/embeddings/tables", table.clone()).await;
        assert_eq!(
            (status, &refused["code"]),
            (422, &json!("embedding_quota_exceeded")),
            "{refused}"
        );
        let reason = "gpu_ops_arrays_refused_total{reason=\"table_tenant_count\"}";
        assert_eq!(metric(&b.url, reason).await, 1.0);
        ok(
            &b.url,
            "/arrays",
            json!({"kind": "tensor", "tensor": [1.0]}),
        )
        .await;
        let deleted = reqwest::Client::new()
            .delete(format!("{}/embeddings/tables/{id}", b.url))
            .send()
            .await
            .unwrap();
        assert_eq!(deleted.status(), 204);
        assert!(!objects().contains(&format!("shared/arrays/{id}.bin")));
        let (status, _) = post(
            &a.url,
            &format!("/embeddings/tables/{id}/lookup"),
            json!({"ids": [0]}),
        )
        .await;
        assert_eq!(status, 404);
        ok(&a.url, "/embeddings/tables", table).await;
    });
}

/// The shared catalog goes away under a replica: whatever names, lists or makes an array
/// is answered 503 `storage_unavailable` with Retry-After, and the replica keeps serving
/// what needs no array.
#[test]
fn a_lost_catalog_is_a_503_for_arrays_not_a_crash() {
    let Some(db) = pg::fresh_database() else {
        return;
    };
    let Some((store, bucket)) = s3::fresh_bucket() else {
        return;
    };
    let target = format!("s3://{bucket}");
    let replica = Replica::start(
        &["--database-url", &db, "--artifact-store", &target],
        &store.env(),
    );
    rt().block_on(async {
        let made = ok(
            &replica.url,
            "/arrays",
            json!({"kind": "field_elements", "field": "goldilocks", "values": values()}),
        )
        .await;
        let id = made["id"].as_str().unwrap().to_string();
        let name = db.rsplit('/').next().unwrap().to_string();
        let admin = pg::cluster().unwrap().url("postgres");
        pg::with_client(&admin, move |c| {
            c.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
                .unwrap()
        });
        let named = json!({"field": "goldilocks", "values": {"array": id}});
        let res = reqwest::Client::new()
            .post(format!("{}/zk/ntt", replica.url))
            .json(&named)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 503);
        assert_eq!(res.headers()["retry-after"], "1");
        let p: Value = res.json().await.unwrap();
        assert_eq!(p["code"], "storage_unavailable", "{p}");
        for (status, what) in [
            (get(&replica.url, "/arrays").await.0, "a listing"),
            (
                get(&replica.url, &format!("/arrays/{id}")).await.0,
                "a read",
            ),
            (
                post(
                    &replica.url,
                    "/arrays",
                    json!({"kind": "field_elements", "field": "goldilocks", "values": ["1"]}),
                )
                .await
                .0,
                "an upload",
            ),
        ] {
            assert_eq!(status, 503, "{what}");
        }
        let sent = json!({"field": "goldilocks", "values": values()});
        assert_eq!(post(&replica.url, "/zk/ntt", sent).await.0, 200);
        assert_eq!(get(&replica.url, "/health/live").await.0, 200);
    });
}
