//! The shared array catalog on the embedded database (the same SQL runs on PostgreSQL in
//! tests/process/shared_arrays.rs): reservations within the quotas, commits, retiring,
//! and what a sweep finds.

use super::super::Store;
use crate::arrays::{ArrayError, ArrayLimits, ArrayRole, TableLimits};

fn store(tag: &str) -> Store {
    let dir = std::env::temp_dir().join(format!("gpu-ops-array-rows-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Store::open(&dir).unwrap()
}

const LIMITS: ArrayLimits = ArrayLimits {
    tenant_bytes: 100,
    tenant_count: 2,
    server_bytes: 150,
    server_count: 3,
    read_back_wait: std::time::Duration::from_secs(60),
    tables: TableLimits::NONE,
};

/// Reserves and commits `id` at time 1000, living until `expires`.
fn make(s: &Store, id: &str, tenant: &str, bytes: u64, expires: u64) -> Result<(), ArrayError> {
    s.reserve_array(
        id,
        tenant,
        &format!("{{\"id\":\"{id}\"}}"),
        None,
        bytes,
        &LIMITS,
        1000,
        5000,
    )?;
    s.commit_array(id, expires, 1000)?;
    Ok(())
}

#[test]
fn reservations_count_against_the_quotas_and_commit_into_rows_a_tenant_reads() {
    let s = store("quota");
    make(&s, "a1", "a", 60, 9000).unwrap();
    // A reservation not yet committed holds its room, and is not served.
    s.reserve_array("a2", "a", "{}", None, 30, &LIMITS, 1000, 5000)
        .unwrap();
    assert_eq!(s.array("a", "a2", 1000).unwrap(), None);
    assert!(matches!(
        make(&s, "a3", "a", 1, 9000),
        Err(ArrayError::TooMany { count: 2, cap: 2 })
    ));
    assert!(matches!(
        make(&s, "b1", "b", 61, 9000),
        Err(ArrayError::Full {
            need: 61,
            used: 90,
            cap: 150
        })
    ));
    make(&s, "b1", "b", 60, 9000).unwrap();
    // 150 of 150 bytes and 3 of 3 arrays held: the count refuses even an empty one.
    assert!(matches!(
        make(&s, "b2", "b", 0, 9000),
        Err(ArrayError::FullCount { count: 3, cap: 3 })
    ));
    s.drop_array_row("a2").unwrap();
    assert!(matches!(
        make(&s, "a4", "a", 41, 9000),
        Err(ArrayError::QuotaExceeded {
            need: 41,
            used: 60,
            quota: 100
        })
    ));
    let row = s.array("a", "a1", 2000).unwrap().unwrap();
    assert_eq!((row.meta.as_str(), row.bytes), ("{\"id\":\"a1\"}", 60));
    assert_eq!(s.array("b", "a1", 2000).unwrap(), None, "another tenant's");
    assert_eq!(s.array("a", "a1", 9000).unwrap(), None, "expired");
    assert_eq!(s.arrays_of("a", 2000).unwrap().len(), 1);
    assert_eq!(s.arrays_held(2000).unwrap(), (120, 2));
}

/// Embedding tables are held to their own limits, summed over their rows alone, and to
/// the arrays' limits like every other row.
#[test]
fn tables_are_held_to_their_own_limits_within_the_arrays() {
    let s = store("tables");
    let limits = ArrayLimits {
        tenant_bytes: 100,
        tenant_count: 10,
        server_bytes: 1000,
        server_count: 100,
        tables: TableLimits {
            tenant_bytes: 50,
            tenant_count: 2,
            server_bytes: 70,
        },
        ..LIMITS
    };
    let table = |s: &Store, id: &str, tenant: &str, bytes: u64| {
        let role = Some(ArrayRole::EmbeddingTable);
        s.reserve_array(id, tenant, "{}", role, bytes, &limits, 1000, 5000)
    };
    let plain = |s: &Store, id: &str, bytes: u64| {
        s.reserve_array(id, "a", "{}", None, bytes, &limits, 1000, 5000)
    };
    // Another array of the tenant's counts against the arrays' quota, not the tables'.
    plain(&s, "plain", 40).unwrap();
    table(&s, "t1", "a", 50).unwrap();
    assert_eq!(
        table(&s, "t2", "a", 1),
        Err(ArrayError::TableQuotaExceeded {
            need: 1,
            used: 50,
            quota: 50
        })
    );
    assert_eq!(
        table(&s, "t3", "b", 21),
        Err(ArrayError::TablesFull {
            need: 21,
            used: 50,
            cap: 70
        })
    );
    table(&s, "t3", "b", 10).unwrap();
    table(&s, "t4", "b", 0).unwrap();
    assert_eq!(
        table(&s, "t5", "b", 0),
        Err(ArrayError::TablesTooMany { count: 2, cap: 2 })
    );
    // Within the tables' own limits, but not the arrays': 90 + 20 of the tenant's 100.
    s.drop_array_row("t1").unwrap();
    plain(&s, "plain2", 50).unwrap();
    assert_eq!(
        table(&s, "t6", "a", 20),
        Err(ArrayError::QuotaExceeded {
            need: 20,
            used: 90,
            quota: 100
        })
    );
}

#[test]
fn a_lapsed_reservation_cannot_commit_and_frees_its_room() {
    let s = store("lapse");
    s.reserve_array("x", "a", "{}", None, 100, &LIMITS, 1000, 5000)
        .unwrap();
    assert!(s.commit_array("x", 9000, 5000).is_err(), "lapsed at 5000");
    // Past its reservation the room is free again, and the sweep finds the row.
    make(&s, "y", "a", 100, 9000).unwrap_err();
    s.reserve_array("y", "a", "{}", None, 100, &LIMITS, 5000, 9000)
        .unwrap();
    assert_eq!(s.expired_arrays(5000, 10).unwrap(), ["x"]);
}

#[test]
fn a_retired_array_is_refused_at_once_and_left_for_the_sweep() {
    let s = store("retire");
    make(&s, "a1", "a", 10, 9000).unwrap();
    make(&s, "a2", "a", 10, 9000).unwrap();
    assert_eq!(s.retire_array("b", "a1", 2000).unwrap(), None, "not b's");
    assert!(s.retire_array("a", "a1", 2000).unwrap().is_some());
    assert_eq!(s.retire_array("a", "a1", 2000).unwrap(), None, "once");
    assert_eq!(s.array("a", "a1", 2000).unwrap(), None);
    assert_eq!(s.expired_arrays(2000, 10).unwrap(), ["a1"]);
    assert_eq!(
        s.live_arrays(&["a1".into(), "a2".into(), "zz".into()], 2000)
            .unwrap(),
        ["a2"]
    );
    assert_eq!(
        s.expired_arrays(9000, 1).unwrap(),
        ["a1"],
        "at most the batch"
    );
    assert_eq!(s.expired_arrays(9000, 10).unwrap().len(), 2);
}
