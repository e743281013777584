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
/// directory holds nothing; an empty one is removed.
pub fn import_legacy(dir: &Path, arrays: &Arrays) -> Imported {
    let mut done = Imported::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return done;
    };
    let metas = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"));
    for path in metas {
        match import_one(&path, arrays) {
            Ok(()) => done.tables += 1,
            Err(e) => {
                done.left += 1;
                tracing::warn!(table = %path.display(), error = %e, "embedding table not imported as an array; its files are kept");
            }
        }
    }
    // Values no description claims are what a crash mid-upload left: no table.
    let _ = std::fs::remove_dir(dir);
    done
}

fn import_one(meta_path: &Path, arrays: &Arrays) -> Result<(), String> {
    let old: TableMeta =
        serde_json::from_slice(&std::fs::read(meta_path).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let dir = meta_path.parent().unwrap_or(Path::new("."));
    // An import that stopped after the array was stored but before the files went.
    let stored = arrays
        .get(&old.tenant, &old.id)
        .map_err(|e| e.to_string())?;
    if stored.is_none() {
        let values_path = meta_path.with_extension("f32");
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
        if values.iter().any(|x| !x.is_finite()) {
            return Err("a value is not finite".into());
        }
        let shape = vec![old.vocab, old.dim];
        let tensor = Tensor::new(Dtype::F32, shape, Values::F32(values.into()));
        let data = ArrayData::Tensor(Arc::new(tensor));
        let mut meta = ArrayMeta::describe(&data, old.id.clone(), old.tenant, old.name, NEVER);
        meta.created_at = old.created_at;
        meta.role = Some(ArrayRole::EmbeddingTable);
        arrays.add(meta, data).map_err(|e| e.to_string())?;
    }
    crate::durable::remove_parts(dir, &old.id, &["json", "f32"])
        .map_err(|(p, e)| format!("{}: {e}", p.display()))
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
    fn a_table_the_arrays_refuse_keeps_its_files_for_the_next_start() {
        let root = scratch("refused");
        let old = root.join("embedding-tables");
        old_table(&old, "emb_big", "alice", &[0.5; 8], 2);
        let tight = Arrays::open(
            root.join("arrays"),
            limits(16),
            ArrayMetrics::unregistered(),
        )
        .unwrap();
        assert_eq!(import_legacy(&old, &tight), Imported { tables: 0, left: 1 });
        assert!(old.join("emb_big.json").exists() && old.join("emb_big.f32").exists());
        let roomy = Arrays::open(
            root.join("arrays"),
            limits(1 << 20),
            ArrayMetrics::unregistered(),
        )
        .unwrap();
        assert_eq!(import_legacy(&old, &roomy), Imported { tables: 1, left: 0 });
        assert!(!old.exists());
    }
}
