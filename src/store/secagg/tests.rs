use super::*;

#[test]
fn expiry_deletes_stale_rounds_with_their_rows_and_keeps_fresh_ones() {
    let dir = std::env::temp_dir().join(format!("gpu-ops-secagg-expiry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir).unwrap();
    let config = RoundConfig {
        clients: 3,
        threshold: 2,
        neighbours: 2,
        vector_length: 4,
        clip: 1.0,
        scale_bits: 8,
        graph_seed: "00".repeat(32),
        backend: Default::default(),
    };
    for id in ["r1", "r2"] {
        store.create_round(id, "coordinator", &config).unwrap();
        store
            .register_client(id, &format!("{id}-token"), "sk", "mk")
            .unwrap();
    }
    assert_eq!(store.secagg_row_counts(), [2, 2, 0, 0]);
    // A registration is a change: it moves the round's stamp past its creation.
    let created = store.round("r1").unwrap().updated_at;
    std::thread::sleep(std::time::Duration::from_millis(5));
    store
        .register_client("r1", "r1-second", "sk2", "mk2")
        .unwrap();
    let touched = store.round("r1").unwrap().updated_at;
    assert!(touched > created, "{touched} after {created}");
    store.expire_rounds(&touched).unwrap();
    assert!(store.round("r1").is_ok(), "changed at the cutoff: kept");
    assert!(
        matches!(store.round("r2"), Err(RoundError::NotFound)),
        "older: gone"
    );
    store.create_round("r2", "coordinator", &config).unwrap();
    store.register_client("r2", "r2-token", "sk", "mk").unwrap();
    assert_eq!(store.secagg_row_counts(), [2, 3, 0, 0]);
    // Nothing was changed before the epoch; everything before the far future.
    assert_eq!(store.expire_rounds("1970-01-01T00:00:00.000Z").unwrap(), 0);
    assert_eq!(store.secagg_row_counts(), [2, 3, 0, 0]);
    assert_eq!(store.expire_rounds("9999-01-01T00:00:00.000Z").unwrap(), 2);
    assert_eq!(store.secagg_row_counts(), [0, 0, 0, 0]);
    assert!(matches!(store.round("r1"), Err(RoundError::NotFound)));
    let _ = std::fs::remove_dir_all(dir);
}
