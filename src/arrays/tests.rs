use super::*;
use crate::ops::linalg::Values;
use crate::ops::zk::msm::RawPoint;
use num_bigint::BigUint;

/// A fresh directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-ops-arrays-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

const ROOMY: ArrayLimits = ArrayLimits {
    tenant_bytes: 1 << 20,
    tenant_count: 100,
    server_bytes: 1 << 20,
    server_count: 100,
    read_back_wait: std::time::Duration::from_secs(60),
    tables: TableLimits::NONE,
};

fn open(dir: &std::path::Path, limits: ArrayLimits) -> Arrays {
    Arrays::open(dir.to_path_buf(), limits, ArrayMetrics::unregistered()).unwrap()
}

fn goldilocks(
    id: &str,
    tenant: &str,
    values: Vec<u64>,
    expires_at_ms: u64,
) -> (ArrayMeta, ArrayData) {
    let v = FieldVec::from_words(Field::Goldilocks, values).unwrap();
    let meta = ArrayMeta {
        id: id.into(),
        tenant: tenant.into(),
        name: None,
        kind: ArrayKind::FieldElements,
        field: Some(Field::Goldilocks),
        curve: None,
        dtype: None,
        shape: None,
        len: v.len(),
        created_at: "2026-12-03T00:00:00Z".into(),
        expires_at_ms,
        role: None,
    };
    (meta, ArrayData::FieldElements(Arc::new(v)))
}

const LATER: u64 = u64::MAX;

#[test]
fn arrays_survive_a_reopen_checked_and_stay_with_their_tenant() {
    let dir = scratch("reopen");
    let a = open(&dir, ROOMY);
    let (m, d) = goldilocks("arr_a", "alice", vec![1, 2, 0xffff_ffff_0000_0000], LATER);
    a.add(m, d).unwrap();
    // The BN254 generator (1, 2) and the identity.
    let raw: Vec<RawPoint> = vec![Some((BigUint::from(1u8), BigUint::from(2u8))), None];
    let points = Points::validate(Curve::Bn254G1, &raw).unwrap();
    let meta = ArrayMeta {
        id: "arr_p".into(),
        tenant: "bob".into(),
        name: Some("srs".into()),
        kind: ArrayKind::Points,
        field: None,
        curve: Some(Curve::Bn254G1),
        dtype: None,
        shape: None,
        len: 2,
        created_at: "2026-12-03T00:00:00Z".into(),
        expires_at_ms: LATER,
        role: None,
    };
    a.add(meta.clone(), ArrayData::Points(Arc::new(points.clone())))
        .unwrap();

    let again = open(&dir, ROOMY);
    let got = again.get("alice", "arr_a").unwrap().unwrap();
    let ArrayData::FieldElements(v) = &got.data else {
        panic!("kind changed")
    };
    assert_eq!(
        v.to_le_bytes(),
        FieldVec::from_words(Field::Goldilocks, vec![1, 2, 0xffff_ffff_0000_0000])
            .unwrap()
            .to_le_bytes()
    );
    let p = again.get("bob", "arr_p").unwrap().unwrap();
    assert_eq!(p.meta, meta);
    assert!(matches!(&p.data, ArrayData::Points(q) if **q == points));
    assert!(
        again.get("bob", "arr_a").unwrap().is_none(),
        "another tenant's array"
    );
    assert!(!again.remove("bob", "arr_a").unwrap());
    assert!(again.remove("alice", "arr_a").unwrap());
    assert!(open(&dir, ROOMY).get("alice", "arr_a").unwrap().is_none());
}

/// A tensor of `dtype` shaped `shape`, values 0.5, 1.5, … (exact in every dtype).
fn tensor(id: &str, dtype: Dtype, shape: Vec<usize>) -> (ArrayMeta, ArrayData) {
    let n: usize = shape.iter().product();
    let halves = (0..n).map(|i| i as f64 + 0.5);
    let values = match dtype {
        Dtype::F64 => Values::F64(halves.collect()),
        _ => Values::F32(halves.map(|x| x as f32).collect::<Vec<_>>().into()),
    };
    let data = ArrayData::Tensor(Arc::new(Tensor::new(dtype, shape, values)));
    let meta = ArrayMeta::describe(&data, id.into(), "t".into(), None, LATER);
    (meta, data)
}

#[test]
fn tensors_of_every_dtype_survive_a_reopen_and_count_what_memory_holds() {
    let dir = scratch("tensors");
    let a = open(&dir, ROOMY);
    let cases = [
        ("arr_h", Dtype::F16, vec![3], 12),
        ("arr_b", Dtype::Bf16, vec![2, 1, 2], 16),
        ("arr_s", Dtype::F32, vec![2, 3], 24),
        ("arr_d", Dtype::F64, vec![1, 1, 1, 5], 40),
    ];
    for (id, dtype, shape, held) in &cases {
        let (m, d) = tensor(id, *dtype, shape.clone());
        assert_eq!(a.add(m, d).unwrap().bytes(), *held, "{id}");
    }
    // On disk each takes its dtype's width: halves are written as halves.
    assert_eq!(std::fs::metadata(dir.join("arr_h.bin")).unwrap().len(), 6);
    let again = open(&dir, ROOMY);
    for (id, dtype, shape, _) in cases {
        let got = again.get("t", id).unwrap().unwrap();
        let ArrayData::Tensor(t) = &got.data else {
            panic!("kind changed")
        };
        let (want_meta, want) = tensor(id, dtype, shape.clone());
        let ArrayData::Tensor(want) = want else {
            unreachable!()
        };
        assert_eq!(
            (t.dtype, &t.shape, &t.values),
            (dtype, &shape, &want.values)
        );
        assert_eq!(
            (got.meta.dtype, &got.meta.shape),
            (want_meta.dtype, &want_meta.shape)
        );
    }
    // A value changed on disk to an infinity is never served.
    std::fs::write(
        dir.join("arr_s.bin"),
        [f32::INFINITY.to_le_bytes(); 6].concat(),
    )
    .unwrap();
    std::fs::write(dir.join("arr_d.bin"), [0u8; 8]).unwrap();
    let tampered = open(&dir, ROOMY);
    assert!(tampered.get("t", "arr_s").unwrap().is_none(), "not finite");
    assert!(tampered.get("t", "arr_d").unwrap().is_none(), "short");
    assert!(tampered.get("t", "arr_h").unwrap().is_some());
}

#[test]
fn recordings_survive_a_reopen_and_are_checked_again() {
    use rustfft::num_complex::Complex32;
    let dir = scratch("recordings");
    let a = open(&dir, ROOMY);
    let samples: Vec<Complex32> = (0..5)
        .map(|i| Complex32::new(i as f32 - 2.5, 0.25 * i as f32))
        .collect();
    let data = ArrayData::Recording(Arc::new(Recording::from_samples(&samples)));
    for id in ["arr_r", "arr_q"] {
        let meta = ArrayMeta::describe(&data, id.into(), "t".into(), None, LATER);
        assert_eq!(a.add(meta, data.clone()).unwrap().bytes(), 40);
    }
    assert_eq!(std::fs::metadata(dir.join("arr_r.bin")).unwrap().len(), 40);
    let again = open(&dir, ROOMY);
    let got = again.get("t", "arr_r").unwrap().unwrap();
    let ArrayData::Recording(r) = &got.data else {
        panic!("kind changed")
    };
    assert_eq!((got.meta.kind, got.meta.len), (ArrayKind::Recording, 5));
    assert_eq!(r.samples(), samples);
    // A sample changed on disk to a NaN, or a cut file, is never served.
    let mut bytes = std::fs::read(dir.join("arr_r.bin")).unwrap();
    bytes[20..24].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(dir.join("arr_r.bin"), bytes).unwrap();
    std::fs::write(dir.join("arr_q.bin"), [0u8; 36]).unwrap();
    let tampered = open(&dir, ROOMY);
    assert!(tampered.get("t", "arr_r").unwrap().is_none(), "not finite");
    assert!(
        tampered.get("t", "arr_q").unwrap().is_none(),
        "not whole samples"
    );
}

#[test]
fn bytes_survive_a_reopen_as_sent_and_a_length_that_disagrees_is_not_served() {
    let dir = scratch("bytes");
    let a = open(&dir, ROOMY);
    let data = ArrayData::Bytes(bytes::Bytes::from_static(b"\x00\x01key\xff"));
    for id in ["arr_k", "arr_c"] {
        let meta = ArrayMeta::describe(&data, id.into(), "t".into(), None, LATER);
        assert_eq!(a.add(meta, data.clone()).unwrap().bytes(), 6);
    }
    let again = open(&dir, ROOMY);
    let got = again.get("t", "arr_k").unwrap().unwrap();
    assert_eq!((got.meta.kind, got.meta.len), (ArrayKind::Bytes, 6));
    assert!(matches!(&got.data, ArrayData::Bytes(b) if &b[..] == b"\x00\x01key\xff"));
    std::fs::write(dir.join("arr_c.bin"), b"short").unwrap();
    assert!(open(&dir, ROOMY).get("t", "arr_c").unwrap().is_none());
}

#[test]
fn files_changed_on_disk_are_checked_again_and_never_served() {
    let dir = scratch("tampered");
    let a = open(&dir, ROOMY);
    let (m, d) = goldilocks("arr_t", "t", vec![5, 6], LATER);
    a.add(m, d).unwrap();
    // The modulus itself is not a canonical element.
    let mut bytes = std::fs::read(dir.join("arr_t.bin")).unwrap();
    bytes[8..16].copy_from_slice(&0xffff_ffff_0000_0001u64.to_le_bytes());
    std::fs::write(dir.join("arr_t.bin"), &bytes).unwrap();
    // Values without metadata (a crash mid-write) are deleted at load.
    std::fs::write(dir.join("arr_orphan.bin"), [0u8; 8]).unwrap();
    let again = open(&dir, ROOMY);
    assert!(again.get("t", "arr_t").unwrap().is_none());
    assert!(!dir.join("arr_orphan.bin").exists());
}

#[test]
fn quotas_and_the_cap_refuse_what_would_pass_them_and_count_refusals() {
    let dir = scratch("quota");
    let limits = ArrayLimits {
        tenant_bytes: 40,
        tenant_count: 2,
        server_bytes: 64,
        server_count: 100,
        read_back_wait: std::time::Duration::from_secs(60),
        tables: TableLimits::NONE,
    };
    let a = open(&dir, limits);
    let (m, d) = goldilocks("arr_1", "a", vec![0; 4], LATER);
    a.add(m, d).unwrap();
    let (m, d) = goldilocks("arr_2", "a", vec![0; 2], LATER);
    assert_eq!(
        a.add(m, d).unwrap_err(),
        ArrayError::QuotaExceeded {
            need: 16,
            used: 32,
            quota: 40
        }
    );
    let (m, d) = goldilocks("arr_3", "b", vec![0; 4], LATER);
    a.add(m, d).unwrap();
    let (m, d) = goldilocks("arr_4", "c", vec![0; 1], LATER);
    assert_eq!(
        a.add(m, d).unwrap_err(),
        ArrayError::Full {
            need: 8,
            used: 64,
            cap: 64
        }
    );
    let (m, d) = goldilocks("arr_5", "a", vec![], LATER);
    a.add(m, d).unwrap();
    let (m, d) = goldilocks("arr_6", "a", vec![], LATER);
    assert_eq!(
        a.add(m, d).unwrap_err(),
        ArrayError::TooMany { count: 2, cap: 2 }
    );
    let refused = |r: &str| a.metrics.refused.with_label_values(&[r]).get();
    assert_eq!(
        (
            refused("tenant_bytes"),
            refused("server_bytes"),
            refused("tenant_count")
        ),
        (1, 1, 1)
    );
    assert_eq!(a.metrics.bytes.with_label_values(&["host"]).get(), 64);
    assert_eq!(a.metrics.count.get(), 3);
    // A deletion makes room.
    a.remove("a", "arr_1").unwrap();
    let (m, d) = goldilocks("arr_4", "c", vec![0; 1], LATER);
    a.add(m, d).unwrap();
}

#[test]
fn the_server_count_cap_holds_across_tenants_and_a_deletion_makes_room() {
    let dir = scratch("server-count");
    let limits = ArrayLimits {
        server_count: 2,
        ..ROOMY
    };
    let a = open(&dir, limits);
    for (id, tenant) in [("arr_1", "a"), ("arr_2", "b")] {
        let (m, d) = goldilocks(id, tenant, vec![1], LATER);
        a.add(m, d).unwrap();
    }
    let (m, d) = goldilocks("arr_3", "c", vec![1], LATER);
    assert_eq!(
        a.add(m, d).unwrap_err(),
        ArrayError::FullCount { count: 2, cap: 2 }
    );
    assert_eq!(
        a.metrics.refused.with_label_values(&["server_count"]).get(),
        1
    );
    a.remove("b", "arr_2").unwrap();
    let (m, d) = goldilocks("arr_3", "c", vec![1], LATER);
    a.add(m, d).unwrap();
    assert_eq!(a.metrics.count.get(), 2);
}

#[test]
fn an_expired_array_is_refused_at_once_and_its_files_go_with_the_sweep() {
    let dir = scratch("expiry");
    let a = open(&dir, ROOMY);
    let soon = now_ms() + 60_000;
    let (m, d) = goldilocks("arr_old", "t", vec![1], soon);
    a.add(m, d).unwrap();
    let (m, d) = goldilocks("arr_new", "t", vec![2], LATER);
    a.add(m, d).unwrap();
    assert_eq!(a.sweep(soon - 1), 0);
    assert!(dir.join("arr_old.json").exists());
    assert_eq!(a.sweep(soon), 1);
    assert!(!dir.join("arr_old.json").exists() && !dir.join("arr_old.bin").exists());
    assert_eq!(a.metrics.expired.get(), 1);
    assert_eq!(a.list("t").unwrap().len(), 1);

    // Already expired when stored (a clock behind the deadline), or at a restart: gone.
    let (m, d) = goldilocks("arr_past", "t", vec![3], 1);
    a.add(m, d).unwrap();
    assert!(a.get("t", "arr_past").unwrap().is_none());
    assert!(a.list("t").unwrap().iter().all(|x| x.meta.id != "arr_past"));
    let again = open(&dir, ROOMY);
    assert!(!dir.join("arr_past.json").exists());
    assert_eq!(again.list("t").unwrap().len(), 1);
}

/// Embedding tables are held to the tables' limits (their own bytes and count) besides
/// the arrays', and other arrays do not count against the tables'.
#[test]
fn tables_are_held_to_their_own_limits_within_the_arrays() {
    let dir = scratch("tables");
    let limits = ArrayLimits {
        tables: TableLimits {
            tenant_bytes: 32,
            tenant_count: 2,
            server_bytes: 48,
        },
        ..ROOMY
    };
    let a = open(&dir, limits);
    let table = |id: &str, tenant: &str, words: usize| {
        let (mut m, d) = goldilocks(id, tenant, vec![0; words], LATER);
        m.role = Some(ArrayRole::EmbeddingTable);
        a.add(m, d)
    };
    let (m, d) = goldilocks("arr_plain", "a", vec![0; 100], LATER);
    a.add(m, d).unwrap();
    table("emb_1", "a", 4).unwrap();
    assert_eq!(
        table("emb_2", "a", 1).unwrap_err(),
        ArrayError::TableQuotaExceeded {
            need: 8,
            used: 32,
            quota: 32
        }
    );
    assert_eq!(
        table("emb_3", "b", 3).unwrap_err(),
        ArrayError::TablesFull {
            need: 24,
            used: 32,
            cap: 48
        }
    );
    table("emb_3", "b", 1).unwrap();
    table("emb_4", "b", 0).unwrap();
    assert_eq!(
        table("emb_5", "b", 0).unwrap_err(),
        ArrayError::TablesTooMany { count: 2, cap: 2 }
    );
    // A restart keeps the role, so the tables' sums hold across it.
    let again = open(&dir, limits);
    let t = again.get("a", "emb_1").unwrap().unwrap();
    assert!(t.meta.is_table());
    assert!(!again
        .get("a", "arr_plain")
        .unwrap()
        .unwrap()
        .meta
        .is_table());
    let (mut m, d) = goldilocks("emb_6", "a", vec![0; 1], LATER);
    m.role = Some(ArrayRole::EmbeddingTable);
    assert!(matches!(
        again.add(m, d),
        Err(ArrayError::TableQuotaExceeded { .. })
    ));
}

/// An expiry past year 9999 (a huge --max-array-ttl) reads as kept until deleted, never as
/// a date that cannot be formatted.
#[test]
fn an_expiry_past_year_9999_reads_as_never() {
    let (mut m, _) = goldilocks("arr_far", "a", vec![1], NEVER);
    assert_eq!(m.expires_at(), None);
    m.expires_at_ms = u64::MAX;
    assert_eq!(m.expires_at(), None);
    m.expires_at_ms = NEVER - 1;
    assert_eq!(m.expires_at().as_deref(), Some("9999-12-31T23:59:59.998Z"));
}
