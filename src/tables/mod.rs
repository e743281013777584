//! Embedding tables kept before tables were resident arrays: `<data-dir>/embedding-tables/`
//! held each as `<id>.f32` (little-endian values) and `<id>.json` (its description, whose
//! presence committed it). At start each is imported as an array of kind tensor (f32,
//! `[V, D]`, role `embedding_table`) under the same id, tenant, name and creation time,
//! kept until it is deleted as tables were, and its old files are removed once the array
//! holds it; a table the arrays refuse (their quotas, a disk error) keeps its files and is
//! tried again at the next start.

use crate::arrays::{ArrayData, ArrayMeta, ArrayRole, Arrays, Tensor, NEVER};
use crate::ops::linalg::{Dtype, Values};
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

/// A table's description as it was stored.
#[derive(Debug, Deserialize)]
struct TableMeta {
    id: String,
    tenant: String,
    name: Option<String>,
    vocab: usize,
    dim: usize,
    /// RFC 3339, UTC.
    created_at: String,
}

/// What an import did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Imported {
    pub tables: usize,
    /// Tables left where they were: unreadable, or refused by the arrays.
    pub left: usize,
}

/// Imports every table under `dir` into `arrays` (see the module's note). A missing
/// directory holds nothing; values that no description claims (an upload a crash cut
/// short) are deleted; the directory goes once it is empty.
pub fn import_legacy(dir: &Path, arrays: &Arrays) -> Imported {
    let mut done = Imported::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return done;
    };
    let paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    for path in &paths {
        match path.extension().and_then(|x| x.to_str()) {
            Some("json") => match import_one(path, arrays) {
                Ok(()) => done.tables += 1,
                Err(e) => {
                    done.left += 1;
                    tracing::warn!(table = %path.display(), error = %e, "embedding table not imported as an array; its files are kept for the next start");
                }
            },
            Some("f32") if !path.with_extension("json").exists() => remove(path),
            _ => {}
        }
    }
    if done.left > 0 {
        tracing::warn!(
            tables = done.left,
            dir = %dir.display(),
            "embedding tables kept before tables were arrays are not served until an import succeeds"
        );
    }
    let _ = std::fs::remove_dir(dir);
    done
}

/// Removes a file the import is done with; one that stays is only untidy (a later start
/// removes it: its table is already an array, or its values are claimed by nothing).
fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %path.display(), error = %e, "an imported embedding table's old file stays");
        }
    }
}

fn import_one(meta_path: &Path, arrays: &Arrays) -> Result<(), String> {
    let old: TableMeta =
        serde_json::from_slice(&std::fs::read(meta_path).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let values_path = meta_path.with_extension("f32");
    // An import that stopped after the array was stored but before the files went.
    let stored = arrays
        .get(&old.tenant, &old.id)
        .map_err(|e| e.to_string())?;
    if stored.is_none() {
        let bytes = std::fs::read(&values_path).map_err(|e| e.to_string())?;
        if bytes.len() as u64 != 4 * old.vocab as u64 * old.dim as u64 {
            return Err(format!(
                "{} bytes of values for {} × {}",
                bytes.len(),
                old.vocab,
                old.dim
            ));
        }
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if crate::wire::first_non_finite(&values).is_some() {
            return Err("a value is not finite".into());
        }
        let shape = vec![old.vocab, old.dim];
        let tensor = Tensor::new(Dtype::F32, shape, Values::F32(values.into()));
        let data = ArrayData::Tensor(Arc::new(tensor));
        let mut meta = ArrayMeta::describe(&data, old.id.clone(), old.tenant, old.name, NEVER);
        meta.created_at = old.created_at;
        meta.role = Some(ArrayRole::EmbeddingTable);
        // Admitted under the limits of its day: the arrays' quotas, which it never counted
        // against, do not refuse it now.
        arrays.admit(meta, data).map_err(|e| e.to_string())?;
    }
    // The description first: values left without it are removed as unclaimed.
    remove(meta_path);
    remove(&values_path);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arrays::{ArrayLimits, ArrayMetrics, TableLimits};

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpu-ops-tables-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn limits(table_bytes: u64) -> ArrayLimits {
        ArrayLimits {
            tenant_bytes: 1 << 20,
            tenant_count: 100,
            server_bytes: 1 << 20,
            server_count: 100,
            read_back_wait: std::time::Duration::from_secs(60),
            tables: TableLimits {
                tenant_bytes: table_bytes,
                ..TableLimits::NONE
            },
        }
    }

    /// A table as the old store wrote it.
    fn old_table(dir: &Path, id: &str, tenant: &str, values: &[f32], dim: usize) {
        std::fs::create_dir_all(dir).unwrap();
        let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(dir.join(format!("{id}.f32")), bytes).unwrap();
        let meta = serde_json::json!({"id": id, "tenant": tenant, "name": "tokens",
            "vocab": values.len() / dim, "dim": dim, "created_at": "2026-11-24T00:00:00Z"});
        std::fs::write(dir.join(format!("{id}.json")), meta.to_string()).unwrap();
    }

    #[test]
    fn old_tables_become_arrays_kept_until_deleted_and_their_files_go() {
        let root = scratch("import");
        let old = root.join("embedding-tables");
        old_table(&old, "emb_a", "alice", &[1.0, 2.0, 3.0, 4.0, 5.0, 6.5], 3);
        old_table(&old, "emb_b", "bob", &[9.0], 1);
        // Values without their description (a crash mid-upload) are no table.
        std::fs::write(old.join("emb_c.f32"), [0u8; 4]).unwrap();
        let arrays = Arrays::open(
            root.join("arrays"),
            limits(1 << 20),
            ArrayMetrics::unregistered(),
        )
        .unwrap();
        let done = import_legacy(&old, &arrays);
        assert_eq!(done, Imported { tables: 2, left: 0 });
        let a = arrays.get("alice", "emb_a").unwrap().unwrap();
        assert!(a.meta.is_table());
        assert_eq!(
            (
                a.meta.shape.clone(),
                a.meta.expires_at_ms,
                a.meta.created_at.as_str()
            ),
            (Some(vec![2, 3]), NEVER, "2026-11-24T00:00:00Z")
        );
        let ArrayData::Tensor(t) = &a.data else {
            panic!("not a tensor")
        };
        let Values::F32(v) = &t.values else {
            panic!("not f32")
        };
        assert_eq!(**v, [1.0, 2.0, 3.0, 4.0, 5.0, 6.5]);
        assert!(arrays.get("bob", "emb_a").unwrap().is_none());
        assert!(!old.join("emb_a.json").exists() && !old.join("emb_a.f32").exists());
        // A restart finds them among the arrays, with nothing left to import.
        let again = Arrays::open(
            root.join("arrays"),
            limits(1 << 20),
            ArrayMetrics::unregistered(),
        )
        .unwrap();
        assert_eq!(import_legacy(&old, &again), Imported::default());
        assert!(again.get("bob", "emb_b").unwrap().unwrap().meta.is_table());
    }

    #[test]
    fn old_tables_are_admitted_past_todays_quotas_and_unclaimed_values_go() {
        let root = scratch("admitted");
        let old = root.join("embedding-tables");
        old_table(&old, "emb_big", "alice", &[0.5; 8], 2);
        std::fs::write(old.join("emb_cut.f32"), [0u8; 8]).unwrap();
        // 32 bytes of table against a 16-byte table quota: kept all the same.
        let tight = Arrays::open(
            root.join("arrays"),
            limits(16),
            ArrayMetrics::unregistered(),
        )
        .unwrap();
        assert_eq!(import_legacy(&old, &tight), Imported { tables: 1, left: 0 });
        assert!(tight
            .get("alice", "emb_big")
            .unwrap()
            .unwrap()
            .meta
            .is_table());
        assert!(!old.exists(), "the values no description claimed went too");
        // Counted from now on: another table of the tenant's is refused.
        let (mut meta, data) = {
            let t = tight.get("alice", "emb_big").unwrap().unwrap();
            (t.meta.clone(), t.data.clone())
        };
        meta.id = "emb_new".into();
        assert!(tight.add(meta, data).is_err());
    }

    /// An import cut short after the array was stored finishes by removing the files.
    #[test]
    fn an_import_cut_short_finishes_at_the_next_start() {
        let root = scratch("resume");
        let old = root.join("embedding-tables");
        old_table(&old, "emb_r", "bob", &[1.0, 2.0], 1);
        let arrays = Arrays::open(
            root.join("arrays"),
            limits(1 << 20),
            ArrayMetrics::unregistered(),
        )
        .unwrap();
        assert_eq!(import_legacy(&old, &arrays).tables, 1);
        old_table(&old, "emb_r", "bob", &[7.0, 7.0], 1);
        assert_eq!(
            import_legacy(&old, &arrays),
            Imported { tables: 1, left: 0 }
        );
        let t = arrays.get("bob", "emb_r").unwrap().unwrap();
        let ArrayData::Tensor(t) = &t.data else {
            panic!("not a tensor")
        };
        let Values::F32(v) = &t.values else {
            panic!("not f32")
        };
        assert_eq!(**v, [1.0, 2.0], "the stored array stands");
        assert!(!old.exists());
    }
}
