//! `/embeddings/tables` over HTTP: upload, list, get, lookups of `[S]` and `[B, S]` ids
//! in each output form, delete; tables kept across a restart (and those the store kept
//! before tables were arrays, imported at start); tenants apart; quota, server cap and
//! each refusal with its code and path; a table is a resident array, and any resident
//! tensor of rank 2 in f16, bf16 or f32 serves lookups.

use crate::common;

use base64::Engine;
use clap::Parser;
use common::{problem, TestServer};
use gpu_ops::config::Cli;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

async fn create(s: &TestServer, body: Value) -> reqwest::Response {
    s.post("/embeddings/tables", body).send().await.unwrap()
}

async fn lookup(s: &TestServer, id: &str, body: Value) -> reqwest::Response {
    s.post(&format!("/embeddings/tables/{id}/lookup"), body)
        .send()
        .await
        .unwrap()
}

/// The id of a new resident array made from `body` (`POST /arrays`).
async fn array_id(s: &TestServer, body: Value) -> String {
    let res = s.post("/arrays", body).send().await.unwrap();
    assert_eq!(res.status(), 201);
    res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn table(vocab: usize, dim: usize) -> Vec<Vec<f64>> {
    (0..vocab)
        .map(|r| {
            (0..dim)
                .map(|c| r as f64 * 10.0 + c as f64 + 0.125)
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn a_table_serves_lookups_until_it_is_deleted() {
    let s = TestServer::start(&[]).await;
    let res = create(&s, json!({"table": table(5, 3), "name": "tokens"})).await;
    assert_eq!(res.status(), 201);
    let location = res.headers()["location"].to_str().unwrap().to_string();
    let t: Value = res.json().await.unwrap();
    let id = t["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("emb_"), "{t}");
    assert_eq!(location, format!("/embeddings/tables/{id}"));
    assert_eq!(
        (
            t["vocab"].as_u64(),
            t["dim"].as_u64(),
            t["size_bytes"].as_u64()
        ),
        (Some(5), Some(3), Some(60))
    );
    assert_eq!(t["name"], "tokens");
    assert_eq!(t["resident_on"], json!([]));
    // [S] and [B, S] ids.
    let res = lookup(&s, &id, json!({"ids": [4, 0, 4]})).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-backend"], "cpu");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["shape"], json!([3, 3]));
    assert_eq!(
        body["result"],
        json!([
            [40.125, 41.125, 42.125],
            [0.125, 1.125, 2.125],
            [40.125, 41.125, 42.125]
        ])
    );
    let body: Value = lookup(
        &s,
        &id,
        json!({"ids": [[1, 2], [3, 3]], "out_dtype": "bf16", "encoding": "base64"}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(body["shape"], json!([2, 2, 3]));
    assert_eq!(body["result"]["dtype"], "bf16");
    let bytes = B64
        .decode(body["result"]["data"].as_str().unwrap())
        .unwrap();
    let first = half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f64();
    assert_eq!(first, half::bf16::from_f64(10.125).to_f64());
    // Listed and fetched; then deleted, and gone everywhere.
    let list: Value = s.get("/embeddings/tables").await.json().await.unwrap();
    assert_eq!(list["tables"][0]["id"], id.as_str());
    let got: Value = s
        .get(&format!("/embeddings/tables/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(got["vocab"], 5);
    let res = s
        .delete(&format!("/embeddings/tables/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    for res in [
        s.get(&format!("/embeddings/tables/{id}")).await,
        lookup(&s, &id, json!({"ids": [0]})).await,
        s.delete(&format!("/embeddings/tables/{id}"))
            .send()
            .await
            .unwrap(),
    ] {
        problem(res, 404, "embedding_table_not_found").await;
    }
}

#[tokio::test]
async fn tables_survive_a_restart_and_stay_with_their_tenant() {
    let data = std::env::temp_dir().join(format!("gpu-ops-emb-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let keys = std::env::temp_dir().join(format!("gpu-ops-emb-keys-{}", std::process::id()));
    std::fs::write(
        &keys,
        "key-alice-0123456789 alice\nkey-bobby-0123456789 bob\n",
    )
    .unwrap();
    let settings = || {
        Cli::try_parse_from([
            "gpu-ops",
            "--backend",
            "cpu",
            "--data-dir",
            data.to_str().unwrap(),
            "--api-keys-file",
            keys.to_str().unwrap(),
        ])
        .unwrap()
        .config
        .validate()
        .unwrap()
    };
    let (alice, bob) = ("key-alice-0123456789", "key-bobby-0123456789");
    // A table as the store kept them before tables were arrays: imported at start.
    let old = data.join("embedding-tables");
    std::fs::create_dir_all(&old).unwrap();
    let values: Vec<u8> = [0.5f32, 1.5, 2.5, 3.5]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    std::fs::write(old.join("emb_0123456789abcdef01234567.f32"), values).unwrap();
    let meta = json!({"id": "emb_0123456789abcdef01234567", "tenant": "bob", "name": null,
        "vocab": 2, "dim": 2, "created_at": "2026-11-24T00:00:00Z"});
    std::fs::write(
        old.join("emb_0123456789abcdef01234567.json"),
        meta.to_string(),
    )
    .unwrap();
    let mut s = TestServer::start_with(settings(), |r| r).await;
    assert!(
        !old.exists(),
        "the old table's files are gone once imported"
    );
    let res = s
        .post("/embeddings/tables", json!({"table": table(3, 2)}))
        .bearer_auth(alice)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    s.trigger_shutdown();
    drop(s);
    let s = TestServer::start_with(settings(), |r| r).await;
    let body: Value = s
        .post(
            &format!("/embeddings/tables/{id}/lookup"),
            json!({"ids": [2]}),
        )
        .bearer_auth(alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["result"], json!([[20.125, 21.125]]));
    let res = s
        .post(
            &format!("/embeddings/tables/{id}/lookup"),
            json!({"ids": [2]}),
        )
        .bearer_auth(bob)
        .send()
        .await
        .unwrap();
    problem(res, 404, "embedding_table_not_found").await;
    // Bob's imported table, served after both restarts, kept until deleted.
    let list: Value = s
        .client
        .get(format!("{}/embeddings/tables", s.url))
        .bearer_auth(bob)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tables = list["tables"].as_array().unwrap();
    assert_eq!(tables.len(), 1, "{list}");
    assert_eq!(tables[0]["id"], "emb_0123456789abcdef01234567");
    assert_eq!(
        (
            &tables[0]["vocab"],
            &tables[0]["created_at"],
            &tables[0]["expires_at"]
        ),
        (&json!(2), &json!("2026-11-24T00:00:00Z"), &Value::Null)
    );
    let body: Value = s
        .post(
            "/embeddings/tables/emb_0123456789abcdef01234567/lookup",
            json!({"ids": [1, 0]}),
        )
        .bearer_auth(bob)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["result"], json!([[2.5, 3.5], [0.5, 1.5]]));
}

#[tokio::test]
async fn quota_cap_and_refusals() {
    // 1 MiB per tenant and 1 MiB in all: 200,000 values (800 kB) fit once.
    let s = TestServer::start(&[
        "--max-tenant-embedding-mib",
        "1",
        "--max-embedding-tables-mib",
        "1",
        "--max-tensor-elements",
        "300000",
    ])
    .await;
    let packed = |rows: usize| {
        json!({"encoding": "base64", "dtype": "f32", "shape": [rows, 1000],
               "data": B64.encode(vec![0u8; rows * 1000 * 4])})
    };
    assert_eq!(
        create(&s, json!({"table": packed(200)})).await.status(),
        201
    );
    problem(
        create(&s, json!({"table": packed(100)})).await,
        422,
        "embedding_quota_exceeded",
    )
    .await;
    let id = {
        let list: Value = s.get("/embeddings/tables").await.json().await.unwrap();
        list["tables"][0]["id"].as_str().unwrap().to_string()
    };
    let cases = [
        (
            create(&s, json!({"table": [1, 2, 3]})).await,
            422,
            "invalid_tensor",
            "/table",
        ),
        (
            create(&s, json!({"table": [[1e300]]})).await,
            422,
            "invalid_tensor",
            "/table",
        ),
        (
            create(&s, json!({"table": [[1]], "name": "x".repeat(201)})).await,
            422,
            "invalid_parameter",
            "/name",
        ),
        (
            create(&s, json!({"table": packed(400)})).await,
            413,
            "payload_too_large",
            "/table/shape",
        ),
        (
            lookup(&s, &id, json!({"ids": [200]})).await,
            422,
            "invalid_tensor",
            "/ids",
        ),
        (
            lookup(&s, &id, json!({"ids": [1.5]})).await,
            422,
            "invalid_tensor",
            "/ids",
        ),
        (
            lookup(&s, &id, json!({"ids": [[[1]]]})).await,
            422,
            "invalid_tensor",
            "/ids",
        ),
        (
            lookup(&s, &id, json!({"ids": vec![1; 301]})).await,
            413,
            "payload_too_large",
            "/ids",
        ),
        (
            lookup(&s, &id, json!({"ids": [1], "backend": "cuda"})).await,
            503,
            "device_unavailable",
            "",
        ),
    ];
    for (res, status, code, path) in cases {
        let p = problem(res, status, code).await;
        if !path.is_empty() {
            assert_eq!(p["errors"][0]["path"], path, "{p}");
        }
    }
    // The server's cap: another tenant's table does not fit beside the first.
    let keys = std::env::temp_dir().join(format!("gpu-ops-emb-cap-keys-{}", std::process::id()));
    std::fs::write(
        &keys,
        "key-alice-0123456789 alice\nkey-bobby-0123456789 bob\n",
    )
    .unwrap();
    let s = TestServer::start(&[
        "--max-tenant-embedding-mib",
        "1",
        "--max-embedding-tables-mib",
        "1",
        "--max-tensor-elements",
        "300000",
        "--api-keys-file",
        keys.to_str().unwrap(),
    ])
    .await;
    let res = s
        .post("/embeddings/tables", json!({"table": packed(200)}))
        .bearer_auth("key-alice-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let res = s
        .post("/embeddings/tables", json!({"table": packed(100)}))
        .bearer_auth("key-bobby-0123456789")
        .send()
        .await
        .unwrap();
    problem(res, 507, "embedding_tables_full").await;
}

/// `--max-tenant-embedding-tables 50`: the 51st table of a tenant, however small, is
/// refused with 422; the tenant's tables stay served, and a deletion makes room.
#[tokio::test]
async fn a_tenant_past_its_count_of_tables_is_refused() {
    let s = TestServer::start(&["--max-tenant-embedding-tables", "50"]).await;
    let tiny = json!({"table": [[1.0]]});
    let mut ids = Vec::new();
    for _ in 0..50 {
        let res = create(&s, tiny.clone()).await;
        assert_eq!(res.status(), 201);
        let v: Value = res.json().await.unwrap();
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let p = problem(
        create(&s, tiny.clone()).await,
        422,
        "embedding_quota_exceeded",
    )
    .await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("--max-tenant-embedding-tables"),
        "{p}"
    );
    let res = s
        .delete(&format!("/embeddings/tables/{}", ids[0]))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success());
    assert_eq!(create(&s, tiny).await.status(), 201);
}

/// A table is a resident array of kind tensor: listed at `/arrays` with its role, named as
/// an operand by `{"array": id}`, and deleted from either route. A lookup takes any
/// resident tensor of rank 2 held as f32 as its table; an f64 tensor, another rank or
/// another kind is 422 array_mismatch. `ttl_seconds` bounds a table's life.
#[tokio::test]
async fn a_table_is_a_resident_array_and_a_tensor_array_serves_lookups() {
    let s = TestServer::start(&[]).await;
    let res = create(&s, json!({"table": table(4, 2), "ttl_seconds": 3600})).await;
    assert_eq!(res.status(), 201);
    let t: Value = res.json().await.unwrap();
    let id = t["id"].as_str().unwrap().to_string();
    assert!(t["expires_at"].is_string(), "{t}");
    let a: Value = s.get(&format!("/arrays/{id}")).await.json().await.unwrap();
    assert_eq!(
        (
            &a["kind"],
            &a["dtype"],
            &a["shape"],
            &a["role"],
            &a["size_bytes"]
        ),
        (
            &json!("tensor"),
            &json!("f32"),
            &json!([4, 2]),
            &json!("embedding_table"),
            &json!(32)
        ),
        "{a}"
    );
    assert_eq!(a["expires_at"], t["expires_at"]);
    // The table as a matmul operand: [1, 4] × [4, 2] picks row 2.
    let body: Value = s
        .post(
            "/linalg/matmul",
            json!({"a": [[0, 0, 1, 0]], "b": {"array": id}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["result"], json!([[20.125, 21.125]]), "{body}");
    // A tensor uploaded through /arrays, in bf16 (held as f32), serves lookups and is not
    // listed among the tables.
    let weights = array_id(
        &s,
        json!({"kind": "tensor", "dtype": "bf16", "tensor": [[1.5, 2.5], [3.5, 4.5], [5.5, 6.5]]}),
    )
    .await;
    let body: Value = lookup(&s, &weights, json!({"ids": [2, 0]}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["result"], json!([[5.5, 6.5], [1.5, 2.5]]), "{body}");
    problem(
        lookup(&s, &weights, json!({"ids": [3]})).await,
        422,
        "invalid_tensor",
    )
    .await;
    let list: Value = s.get("/embeddings/tables").await.json().await.unwrap();
    assert_eq!(list["tables"].as_array().unwrap().len(), 1, "{list}");
    for res in [
        s.get(&format!("/embeddings/tables/{weights}")).await,
        s.delete(&format!("/embeddings/tables/{weights}"))
            .send()
            .await
            .unwrap(),
    ] {
        problem(res, 404, "embedding_table_not_found").await;
    }
    // Tensors a lookup cannot gather from.
    for body in [
        json!({"kind": "tensor", "dtype": "f64", "tensor": [[1.0, 2.0]]}),
        json!({"kind": "tensor", "tensor": [1.0, 2.0]}),
        json!({"kind": "field_elements", "field": "goldilocks", "values": ["1"]}),
    ] {
        let other = array_id(&s, body).await;
        problem(
            lookup(&s, &other, json!({"ids": [0]})).await,
            422,
            "array_mismatch",
        )
        .await;
    }
    // Deleted as an array, the table is gone from the tables' routes too.
    let res = s.delete(&format!("/arrays/{id}")).send().await.unwrap();
    assert_eq!(res.status(), 204);
    problem(
        lookup(&s, &id, json!({"ids": [0]})).await,
        404,
        "embedding_table_not_found",
    )
    .await;
    // A time to live of 0, or past --max-array-ttl (30 days), is refused at its field.
    for ttl in [0, 30 * 24 * 3600 + 1] {
        let p = problem(
            create(&s, json!({"table": [[1.0]], "ttl_seconds": ttl})).await,
            422,
            "invalid_parameter",
        )
        .await;
        assert_eq!(p["errors"][0]["path"], "/ttl_seconds", "{p}");
    }
}
