//! The shared store (`--database-url`) on a real PostgreSQL (tests/common/pg.rs):
//! privacy budgets charged through real server processes at once, one of them killed
//! mid-charge; and the dataset queue's claims, leases and fencing on both engines.

use crate::common;

use common::binary::Replica;
use common::pg;
use gpu_ops::store::{
    BudgetError, Charge, DatabaseUrl, DatasetStatus, Lease, NewBudget, NewDataset, QueueCaps,
    QueueRefusal, Requeue, Store,
};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn create_budget(client: &reqwest::Client, base: &str, limit: f64) -> String {
    let res = client
        .post(format!("{base}/dp/budgets"))
        .json(&json!({"epsilon_limit": limit, "delta": 1e-5, "name": "shared"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// One charged Gaussian release: its status and, when it was released, its charge_seq.
async fn release(client: &reqwest::Client, base: &str, budget: &str) -> (u16, Option<u64>) {
    let res = client
        .post(format!("{base}/dp/gaussian"))
        .json(
            &json!({"values": [1.0, 2.0], "sensitivity": 1.0, "epsilon": 1.0,
                      "delta": 1e-5, "budget_id": budget}),
        )
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let body: Value = res.json().await.unwrap();
    (status, body["privacy"]["charge_seq"].as_u64())
}

async fn budget_detail(client: &reqwest::Client, base: &str, budget: &str) -> Value {
    let res = client
        .get(format!("{base}/dp/budgets/{budget}?history_limit=1000"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

fn history_seqs(detail: &Value) -> Vec<u64> {
    detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["seq"].as_u64().unwrap())
        .collect()
}

fn gaussian(sigma: f64) -> Charge {
    Charge {
        kind: "test",
        params: json!({"sigma": sigma}),
        rdp: Box::new(move |orders| {
            orders
                .iter()
                .map(|&a| gpu_ops::ops::dp::accountant::gaussian_rdp(a, 1.0, sigma))
                .collect()
        }),
    }
}

/// The same charges, refusals and refund on both engines give the same budget: the
/// engines only lock, read and write.
#[test]
fn budgets_on_postgres_account_exactly_as_embedded() {
    let Some(url) = pg::fresh_database() else {
        return;
    };
    let dir = std::path::PathBuf::from(common::temp_data_dir());
    let embedded = Store::open(&dir.join("embedded")).unwrap();
    let shared =
        Store::open_with(&dir.join("replica"), &DatabaseUrl::parse(&url, 4).unwrap()).unwrap();
    assert!(shared.is_shared() && !embedded.is_shared());
    let outcomes = |store: &Store| {
        let b = store
            .create_budget(NewBudget {
                tenant: "t".into(),
                name: Some("same".into()),
                epsilon_limit: 3.0,
                delta: 1e-5,
            })
            .unwrap();
        let mut spent = Vec::new();
        loop {
            match store.charge("t", &b.id, &gaussian(4.0)) {
                Ok((after, seq)) => spent.push((seq, after.epsilon_spent, after.optimal_order)),
                Err(BudgetError::Exhausted { would_be, .. }) => {
                    spent.push((0, would_be, None));
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(matches!(
            store.budget("other tenant", &b.id),
            Err(BudgetError::NotFound)
        ));
        let refunded = store.refund("t", &b.id, 2).unwrap();
        let history: Vec<(u64, String)> = store
            .charges("t", &b.id, 100)
            .unwrap()
            .into_iter()
            .map(|c| (c.seq, c.status))
            .collect();
        (
            spent,
            refunded.epsilon_spent,
            refunded.charges,
            history,
            store.budgets("t").unwrap().len(),
        )
    };
    let (a, b) = (outcomes(&embedded), outcomes(&shared));
    assert!(a.0.len() >= 3, "{a:?}");
    assert_eq!(a, b, "embedded vs PostgreSQL");
    drop(shared);
    // Reopening migrates nothing and finds the budget.
    let again =
        Store::open_with(&dir.join("replica2"), &DatabaseUrl::parse(&url, 2).unwrap()).unwrap();
    assert_eq!(again.budgets("t").unwrap().len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_postgres_schema_from_a_newer_build_is_refused() {
    let Some(url) = pg::fresh_database() else {
        return;
    };
    let dir = std::path::PathBuf::from(common::temp_data_dir());
    let db = DatabaseUrl::parse(&url, 2).unwrap();
    drop(Store::open_with(&dir, &db).unwrap());
    let newer = i64::from(Store::schema_version()) + 1;
    let versions: Vec<i64> = pg::with_client(&url, move |c| {
        c.execute(
            "INSERT INTO gpu_ops_schema (version, name) VALUES ($1, 'from the future')",
            &[&newer],
        )
        .unwrap();
        c.query("SELECT version FROM gpu_ops_schema ORDER BY version", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    });
    assert_eq!(versions, (1..=newer).collect::<Vec<_>>());
    let e = Store::open_with(&dir, &db).err().expect("refused");
    assert!(e.contains(&format!("schema version {newer}")), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three replicas charge one budget at once: the spend never passes the limit, and the
/// ledger holds exactly the releases that were answered 200, numbered without gaps.
#[test]
fn replicas_sharing_postgres_never_overspend_a_budget() {
    let Some(url) = pg::fresh_database() else {
        return;
    };
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start(&["--database-url", &url], &[]))
        .collect();
    let bases: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
    runtime().block_on(async {
        let client = reqwest::Client::new();
        let limit = 4.0;
        let budget = create_budget(&client, &bases[0], limit).await;
        let mut tasks = Vec::new();
        for i in 0..60 {
            let (client, base, budget) = (client.clone(), bases[i % 3].clone(), budget.clone());
            tasks.push(tokio::spawn(async move {
                release(&client, &base, &budget).await
            }));
        }
        let mut released = BTreeSet::new();
        let mut refused = 0;
        for t in tasks {
            match t.await.unwrap() {
                (200, Some(seq)) => assert!(released.insert(seq), "seq {seq} given twice"),
                (409, None) => refused += 1,
                other => panic!("unexpected answer {other:?}"),
            }
        }
        assert!(released.len() >= 3 && refused > 0, "{released:?} {refused}");
        for base in &bases {
            let detail = budget_detail(&client, base, &budget).await;
            assert!(detail["epsilon_spent"].as_f64().unwrap() <= limit);
            assert_eq!(detail["charges"].as_u64(), Some(released.len() as u64));
            assert_eq!(
                history_seqs(&detail),
                released.iter().copied().collect::<Vec<_>>()
            );
        }
        assert_eq!(
            released.iter().copied().collect::<Vec<_>>(),
            (1..=released.len() as u64).collect::<Vec<_>>()
        );
    });
}

/// Replica A is SIGKILLed while its charges wait on the budget's lock: every charge it
/// acknowledged before stays, none it had not acknowledged appears, and replica B charges
/// the budget at once (the dead replica holds no lock).
#[test]
fn a_replica_killed_mid_charge_loses_no_acknowledged_charge() {
    let Some(url) = pg::fresh_database() else {
        return;
    };
    let mut a = Replica::start(&["--database-url", &url], &[]);
    let b = Replica::start(&["--database-url", &url], &[]);
    let rt = runtime();
    let client = reqwest::Client::new();
    let budget = rt.block_on(create_budget(&client, &b.url, 100.0));
    let acknowledged: Vec<u64> = rt.block_on(async {
        let mut seqs = Vec::new();
        for _ in 0..3 {
            let (status, seq) = release(&client, &a.url, &budget).await;
            assert_eq!(status, 200);
            seqs.push(seq.unwrap());
        }
        seqs
    });
    assert_eq!(acknowledged, [1, 2, 3]);

    // Hold the budget's row lock from outside, as a slow replica's charge would.
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let (url, budget) = (url.clone(), budget.clone());
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let mut tx = c.transaction().unwrap();
            tx.query(
                "SELECT id FROM budgets WHERE id = $1 FOR UPDATE",
                &[&budget],
            )
            .unwrap();
            locked_tx.send(()).unwrap();
            let _ = release_rx.recv();
            tx.commit().unwrap();
        })
    };
    locked_rx.recv().unwrap();
    let in_flight: Vec<_> = (0..4)
        .map(|_| {
            let (client, base, budget) = (client.clone(), a.url.clone(), budget.clone());
            rt.spawn(async move {
                client
                    .post(format!("{base}/dp/gaussian"))
                    .json(&json!({"values": [1.0], "sensitivity": 1.0, "epsilon": 1.0,
                                  "delta": 1e-5, "budget_id": budget}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            })
        })
        .collect();
    // Wait until all four charges are inside their transactions, blocked on the lock.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = pg::with_client(&url, |c| {
            c.query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND datname = current_database()",
                &[],
            )
            .unwrap()
            .get(0)
        });
        if waiting == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "{waiting} charges waiting");
        std::thread::sleep(Duration::from_millis(50));
    }
    a.child.kill().unwrap(); // SIGKILL
    a.child.wait().unwrap();
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    for t in in_flight {
        let answer = rt.block_on(t).unwrap();
        assert!(answer.is_err(), "a killed replica answered {answer:?}");
    }

    rt.block_on(async {
        let (status, seq) = release(&client, &b.url, &budget).await;
        assert_eq!(
            (status, seq),
            (200, Some(4)),
            "B charged right after A died"
        );
        let detail = budget_detail(&client, &b.url, &budget).await;
        assert_eq!(history_seqs(&detail), [1, 2, 3, 4]);
        assert_eq!(detail["charges"].as_u64(), Some(4));
    });
}

/// The database goes away under a running replica: budget requests are answered 503
/// `storage_unavailable` with Retry-After, and the replica keeps serving the rest.
#[test]
fn a_lost_database_is_a_503_not_a_crash() {
    let Some(url) = pg::fresh_database() else {
        return;
    };
    let replica = Replica::start(&["--database-url", &url], &[]);
    let rt = runtime();
    let client = reqwest::Client::new();
    let budget = rt.block_on(create_budget(&client, &replica.url, 10.0));
    let name = url.rsplit('/').next().unwrap().to_string();
    let admin = pg::cluster().unwrap().url("postgres");
    pg::with_client(&admin, move |c| {
        c.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
            .unwrap()
    });
    rt.block_on(async {
        let res = client
            .get(format!("{}/dp/budgets/{budget}", replica.url))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 503);
        assert_eq!(res.headers()["retry-after"], "1");
        let p: Value = res.json().await.unwrap();
        assert_eq!(p["code"], "storage_unavailable", "{p}");
        let (status, _) = release(&client, &replica.url, &budget).await;
        assert_eq!(status, 503);
        let live = client
            .get(format!("{}/health/live", replica.url))
            .send()
            .await
            .unwrap();
        assert_eq!(live.status(), 200);
    });
}

#[test]
fn an_unreachable_database_fails_start_up_with_one_line() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let data = common::temp_data_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ops"))
        .args([
            "--backend",
            "cpu",
            "--bind",
            "127.0.0.1:0",
            "--data-dir",
            &data,
        ])
        .args([
            "--database-url",
            &format!("postgres://gpu:secret@127.0.0.1:{port}/gpu"),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--database-url: cannot connect"), "{err}");
    assert!(
        !err.contains("secret"),
        "the password is never logged: {err}"
    );
    let _ = std::fs::remove_dir_all(&data);
}

/// Two stores on one catalog, as two replicas see it: the embedded file opened twice
/// (SQLite takes several processes), or PostgreSQL.
fn two_catalogs(engine: &str) -> Option<(Store, Store)> {
    let dir = std::path::PathBuf::from(common::temp_data_dir());
    match engine {
        "sqlite" => Some((Store::open(&dir).unwrap(), Store::open(&dir).unwrap())),
        _ => {
            let db = DatabaseUrl::parse(&pg::fresh_database()?, 4).unwrap();
            let open = |sub: &str| {
                Store::open_with(&dir.join(sub), &db)
                    .unwrap()
                    .with_catalog_in_shared_database()
            };
            Some((open("a"), open("b")))
        }
    }
}

fn new_dataset(seed: u64) -> NewDataset {
    tenant_job("t", seed, 1)
}

fn tenant_job(tenant: &str, seed: u64, work: u64) -> NewDataset {
    NewDataset {
        tenant: tenant.into(),
        name: format!("job {seed}"),
        dataset_type: "features".into(),
        num_samples: 10,
        seed,
        config: "{}".into(),
        work,
    }
}

const LEASE: Duration = Duration::from_secs(30);

#[test]
fn workers_claim_distinct_jobs_in_queue_order() {
    for engine in ["sqlite", "postgres"] {
        let Some((a, b)) = two_catalogs(engine) else {
            continue;
        };
        for i in 0..3 {
            a.create_dataset(&format!("ds_{i}"), new_dataset(i), QueueCaps::total(16))
                .unwrap()
                .unwrap();
        }
        let first = a.claim_dataset("a", LEASE).unwrap().unwrap();
        let second = b.claim_dataset("b", LEASE).unwrap().unwrap();
        let third = a.claim_dataset("a", LEASE).unwrap().unwrap();
        assert_eq!(
            [&first.row.id, &second.row.id, &third.row.id],
            ["ds_0", "ds_1", "ds_2"],
            "{engine}"
        );
        assert_eq!(first.attempt, 1);
        assert_eq!(first.row.status, DatasetStatus::Running);
        assert!(b.claim_dataset("b", LEASE).unwrap().is_none(), "{engine}");

        // Many claimers at once: every job exactly once.
        for i in 3..43 {
            b.create_dataset(&format!("ds_{i}"), new_dataset(i), QueueCaps::total(100))
                .unwrap()
                .unwrap();
        }
        let stores = std::sync::Arc::new([a, b]);
        let claimed: Vec<String> = (0..6)
            .map(|w| {
                let stores = stores.clone();
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    while let Some(job) = stores[w % 2]
                        .claim_dataset(&format!("w{w}"), LEASE)
                        .unwrap()
                    {
                        mine.push(job.row.id);
                    }
                    mine
                })
            })
            .flat_map(|h| h.join().unwrap())
            .collect();
        let distinct: BTreeSet<_> = claimed.iter().collect();
        assert_eq!(
            (claimed.len(), distinct.len()),
            (40, 40),
            "{engine}: {claimed:?}"
        );
    }
}

#[test]
fn an_expired_lease_passes_on_and_fences_the_old_worker() {
    for engine in ["sqlite", "postgres"] {
        let Some((a, b)) = two_catalogs(engine) else {
            continue;
        };
        a.create_dataset("ds_x", new_dataset(7), QueueCaps::total(16))
            .unwrap()
            .unwrap();
        let counts = gpu_ops::store::Counts {
            valid: 3,
            attempted: 5,
            ..Default::default()
        };
        // A claims with a lease that has already run out when B looks: A is taken for dead.
        let old = a.claim_dataset("a", Duration::ZERO).unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let new = b.claim_dataset("b", LEASE).unwrap().unwrap();
        assert_eq!((new.row.id.as_str(), new.attempt), ("ds_x", 2), "{engine}");
        assert_eq!(
            a.renew_dataset_lease("ds_x", "a", old.attempt, LEASE, &counts)
                .unwrap(),
            Lease::Lost
        );
        assert!(!a
            .finish_dataset(
                "ds_x",
                "a",
                old.attempt,
                DatasetStatus::Failed,
                &counts,
                Some("stale")
            )
            .unwrap());
        // The same owner name with the old attempt is fenced too.
        assert_eq!(
            b.renew_dataset_lease("ds_x", "b", old.attempt, LEASE, &counts)
                .unwrap(),
            Lease::Lost
        );
        assert_eq!(
            b.renew_dataset_lease("ds_x", "b", new.attempt, LEASE, &counts)
                .unwrap(),
            Lease::Held { cancel: false }
        );
        assert_eq!(a.dataset("t", "ds_x").unwrap().unwrap().counts, counts);
        assert!(b
            .finish_dataset(
                "ds_x",
                "b",
                new.attempt,
                DatasetStatus::Completed,
                &counts,
                None
            )
            .unwrap());
        let row = a.dataset("t", "ds_x").unwrap().unwrap();
        assert_eq!((row.status, row.error), (DatasetStatus::Completed, None));
        assert!(a.claim_dataset("a", LEASE).unwrap().is_none());
    }
}

/// One tenant's backlog waits behind one job of every other tenant; a tenant's waiting
/// jobs and the work its queued and running jobs ask for are capped, through any replica.
#[test]
fn the_queue_serves_tenants_in_turn_within_their_caps() {
    for engine in ["sqlite", "postgres"] {
        let Some((a, b)) = two_catalogs(engine) else {
            continue;
        };
        let caps = QueueCaps {
            queued: 16,
            tenant_queued: 3,
            tenant_work: 100,
        };
        // The heavy tenant queues first, then two others.
        for i in 0..3 {
            a.create_dataset(&format!("heavy_{i}"), tenant_job("heavy", i, 10), caps)
                .unwrap()
                .unwrap();
        }
        assert_eq!(
            b.create_dataset("heavy_3", tenant_job("heavy", 3, 10), caps)
                .unwrap()
                .unwrap_err(),
            QueueRefusal::TenantFull { queued: 3 },
            "{engine}"
        );
        b.create_dataset("light_0", tenant_job("light", 10, 10), caps)
            .unwrap()
            .unwrap();
        b.create_dataset("light_1", tenant_job("light", 11, 10), caps)
            .unwrap()
            .unwrap();
        a.create_dataset("other_0", tenant_job("other", 20, 10), caps)
            .unwrap()
            .unwrap();
        // Work: 10 is pending for "other"; 91 more would pass 100, 90 does not.
        assert_eq!(
            a.create_dataset("other_big", tenant_job("other", 21, 91), caps)
                .unwrap()
                .unwrap_err(),
            QueueRefusal::TenantWork {
                work: 91,
                pending: 10,
                limit: 100
            },
            "{engine}"
        );
        let mut order = Vec::new();
        while let Some(job) = [&a, &b][order.len() % 2].claim_dataset("w", LEASE).unwrap() {
            order.push(job.row.id);
            // Each claim stamps a start time; the next tenant's must be later.
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            order,
            ["heavy_0", "light_0", "other_0", "heavy_1", "light_1", "heavy_2"],
            "{engine}: tenants in turn, each tenant's jobs in its own order"
        );
        // Running jobs still count as pending work; their slots in the queue are free.
        assert_eq!(
            a.create_dataset("other_1", tenant_job("other", 22, 91), caps)
                .unwrap()
                .unwrap_err(),
            QueueRefusal::TenantWork {
                work: 91,
                pending: 10,
                limit: 100
            },
            "{engine}"
        );
        a.create_dataset("heavy_4", tenant_job("heavy", 4, 10), caps)
            .unwrap()
            .unwrap();
    }
}

#[test]
fn cancellation_the_queue_cap_and_requeue_hold_on_both_engines() {
    for engine in ["sqlite", "postgres"] {
        let Some((a, b)) = two_catalogs(engine) else {
            continue;
        };
        for i in 0..2 {
            a.create_dataset(&format!("ds_{i}"), new_dataset(i), QueueCaps::total(2))
                .unwrap()
                .unwrap();
        }
        assert_eq!(
            b.create_dataset("ds_2", new_dataset(2), QueueCaps::total(2))
                .unwrap()
                .unwrap_err(),
            QueueRefusal::Full { queued: 2 },
            "{engine}: two jobs already wait"
        );
        // A queued job is cancelled at once and never claimed.
        assert_eq!(
            b.request_dataset_cancel("ds_0").unwrap(),
            Some(DatasetStatus::Queued)
        );
        assert_eq!(
            a.dataset("t", "ds_0").unwrap().unwrap().status,
            DatasetStatus::Cancelled
        );
        // A running job's worker hears of it at its next renewal, through any replica.
        let job = a.claim_dataset("a", LEASE).unwrap().unwrap();
        assert_eq!(job.row.id, "ds_1", "{engine}");
        assert_eq!(
            b.request_dataset_cancel("ds_1").unwrap(),
            Some(DatasetStatus::Running)
        );
        let counts = gpu_ops::store::Counts::default();
        assert_eq!(
            a.renew_dataset_lease("ds_1", "a", job.attempt, LEASE, &counts)
                .unwrap(),
            Lease::Held { cancel: true }
        );
        assert!(a
            .finish_dataset(
                "ds_1",
                "a",
                job.attempt,
                DatasetStatus::Interrupted,
                &counts,
                None
            )
            .unwrap());
        assert_eq!(b.request_dataset_cancel("ds_0").unwrap(), None);
        // Requeue: only an interrupted job, and it forgets the old cancellation.
        assert_eq!(
            b.requeue_dataset("ds_0", QueueCaps::total(2)).unwrap(),
            Requeue::NotInterrupted
        );
        assert_eq!(
            b.requeue_dataset("ds_1", QueueCaps::total(2)).unwrap(),
            Requeue::Queued
        );
        let again = a.claim_dataset("a", LEASE).unwrap().unwrap();
        assert_eq!((again.row.id.as_str(), again.attempt), ("ds_1", 2));
        assert_eq!(
            a.renew_dataset_lease("ds_1", "a", again.attempt, LEASE, &counts)
                .unwrap(),
            Lease::Held { cancel: false }
        );
    }
}
