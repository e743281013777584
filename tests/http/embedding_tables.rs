//! `/embeddings/tables` over HTTP: upload, list, get, lookups of `[S]` and `[B, S]` ids
//! in each output form, delete; tables kept across a restart; tenants apart; quota,
//! server cap and each refusal with its code and path.

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
    let mut s = TestServer::start_with(settings(), |r| r).await;
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
    assert_eq!(list["tables"], json!([]));
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
