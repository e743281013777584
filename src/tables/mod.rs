//! Resident embedding tables: what callers uploaded once to look rows up by id later.
//! The host copy of each table is kept in memory and on disk under
//! `<data-dir>/embedding-tables/` (`<id>.f32`, little-endian values, then `<id>.json`,
//! whose presence commits the table), so tables survive a restart. Devices cache their
//! own copies (`DeviceLease::cached_table`, least recently used out). Each tenant's tables
//! together stay within `--max-tenant-embedding-mib`, and all tables within
//! `--max-embedding-tables-mib`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// One table: `vocab` rows of `dim` f32 values.
#[derive(Debug, Serialize, Deserialize)]
pub struct TableMeta {
    pub id: String,
    pub tenant: String,
    pub name: Option<String>,
    pub vocab: usize,
    pub dim: usize,
    /// RFC 3339, UTC.
    pub created_at: String,
}

#[derive(Debug)]
pub struct EmbeddingTable {
    pub meta: TableMeta,
    pub values: Arc<Vec<f32>>,
}

impl EmbeddingTable {
    pub fn bytes(&self) -> u64 {
        4 * self.values.len() as u64
    }

    /// The key its device copies are cached under.
    pub fn device_key(&self) -> String {
        format!("embeddings/{}", self.meta.id)
    }
}

#[derive(Debug)]
pub enum TableError {
    /// The tenant's tables would pass its quota.
    QuotaExceeded {
        need: u64,
        used: u64,
        quota: u64,
    },
    /// The tenant holds `--max-tenant-embedding-tables` tables already.
    TooMany {
        count: usize,
        cap: usize,
    },
    /// All tables would pass the server's cap.
    Full {
        need: u64,
        used: u64,
        cap: u64,
    },
    Io(String),
}

impl std::fmt::Display for TableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableError::QuotaExceeded { need, used, quota } => write!(
                f,
                "the table takes {need} bytes; the tenant's tables take {used} of {quota} (--max-tenant-embedding-mib)"
            ),
            TableError::TooMany { count, cap } => write!(
                f,
                "the tenant has {count} tables of at most {cap} (--max-tenant-embedding-tables); delete one first"
            ),
            TableError::Full { need, used, cap } => write!(
                f,
                "the table takes {need} bytes; all tables take {used} of {cap} (--max-embedding-tables-mib)"
            ),
            TableError::Io(e) => write!(f, "{e}"),
        }
    }
}

pub struct EmbeddingTables {
    dir: PathBuf,
    tenant_quota: u64,
    cap: u64,
    /// Most tables of one tenant: each costs two files and an entry in memory however
    /// small, which the byte quota alone would admit by the hundred million.
    tenant_tables: usize,
    tables: RwLock<Catalog>,
}

/// The committed tables, and the bytes of uploads being written (by id: tenant, bytes),
/// which count against the quota and the cap until they commit or fail.
#[derive(Default)]
struct Catalog {
    tables: BTreeMap<String, Arc<EmbeddingTable>>,
    writing: BTreeMap<String, (String, u64)>,
}

impl Catalog {
    fn used(&self, tenant: Option<&str>) -> u64 {
        let mine = |t: &str| tenant.is_none_or(|want| want == t);
        let kept: u64 = self
            .tables
            .values()
            .filter(|t| mine(&t.meta.tenant))
            .map(|t| t.bytes())
            .sum();
        let writing: u64 = self
            .writing
            .values()
            .filter(|(t, _)| mine(t))
            .map(|(_, b)| b)
            .sum();
        kept + writing
    }

    /// The tenant's tables, committed and being written.
    fn count(&self, tenant: &str) -> usize {
        let kept = self.tables.values().filter(|t| t.meta.tenant == tenant);
        let writing = self.writing.values().filter(|(t, _)| t == tenant);
        kept.count() + writing.count()
    }
}

fn io(what: &Path, e: std::io::Error) -> TableError {
    TableError::Io(format!("{}: {e}", what.display()))
}

impl EmbeddingTables {
    /// The tables under `dir` (created if missing). A table whose files do not agree is
    /// skipped with a warning, never served.
    pub fn open(dir: PathBuf, tenant_quota: u64, cap: u64) -> Result<Self, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut tables = Catalog::default();
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            if path.extension().is_some_and(|x| x == "json") {
                match load(&path) {
                    Ok(t) => {
                        tables.tables.insert(t.meta.id.clone(), Arc::new(t));
                    }
                    Err(e) => tracing::warn!("embedding table {} skipped: {e}", path.display()),
                }
            }
        }
        Ok(Self {
            dir,
            tenant_quota,
            cap,
            tenant_tables: usize::MAX,
            tables: RwLock::new(tables),
        })
    }

    /// At most `cap` tables per tenant (`--max-tenant-embedding-tables`); tables already
    /// stored past it are kept and served, and new ones refused until the count is under.
    pub fn with_tenant_table_cap(mut self, cap: usize) -> Self {
        self.tenant_tables = cap;
        self
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Catalog> {
        self.tables.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(&self) -> std::sync::RwLockWriteGuard<'_, Catalog> {
        self.tables.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores a table for `tenant` under a new id, within the quota and the cap.
    pub fn add(
        &self,
        meta: TableMeta,
        values: Vec<f32>,
    ) -> Result<Arc<EmbeddingTable>, TableError> {
        let table = EmbeddingTable {
            meta,
            values: Arc::new(values),
        };
        let need = table.bytes();
        let (id, tenant) = (table.meta.id.clone(), table.meta.tenant.clone());
        // Reserve the room first, so two uploads cannot both fit in the room of one; write
        // the files without the lock, so lookups never wait for a disk.
        {
            let mut catalog = self.write_lock();
            let count = catalog.count(&tenant);
            if count >= self.tenant_tables {
                return Err(TableError::TooMany {
                    count,
                    cap: self.tenant_tables,
                });
            }
            let used = catalog.used(Some(&tenant));
            if used + need > self.tenant_quota {
                return Err(TableError::QuotaExceeded {
                    need,
                    used,
                    quota: self.tenant_quota,
                });
            }
            let all = catalog.used(None);
            if all + need > self.cap {
                return Err(TableError::Full {
                    need,
                    used: all,
                    cap: self.cap,
                });
            }
            catalog.writing.insert(id.clone(), (tenant, need));
        }
        let written = self.write(&table);
        let mut catalog = self.write_lock();
        catalog.writing.remove(&id);
        written?;
        let table = Arc::new(table);
        catalog.tables.insert(id, table.clone());
        Ok(table)
    }

    /// The values, then the metadata that commits them, written whole
    /// (`crate::durable`): a 201 survives a crash. On failure nothing of the table is left.
    fn write(&self, table: &EmbeddingTable) -> Result<(), TableError> {
        let values: Vec<u8> = table.values.iter().flat_map(|x| x.to_le_bytes()).collect();
        let meta = serde_json::to_vec(&table.meta).expect("metadata serializes");
        let parts: [(&str, &[u8]); 2] = [("f32", &values), ("json", &meta)];
        crate::durable::write_parts(&self.dir, &table.meta.id, &parts).map_err(|(p, e)| io(&p, e))
    }

    /// The tenant's table `id`.
    pub fn get(&self, tenant: &str, id: &str) -> Option<Arc<EmbeddingTable>> {
        self.read()
            .tables
            .get(id)
            .filter(|t| t.meta.tenant == tenant)
            .cloned()
    }

    /// The tenant's tables, by id.
    pub fn list(&self, tenant: &str) -> Vec<Arc<EmbeddingTable>> {
        self.read()
            .tables
            .values()
            .filter(|t| t.meta.tenant == tenant)
            .cloned()
            .collect()
    }

    /// Removes the tenant's table `id` and its files; false when there is none.
    pub fn remove(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<Arc<EmbeddingTable>>, TableError> {
        let mut catalog = self.write_lock();
        if catalog
            .tables
            .get(id)
            .is_none_or(|t| t.meta.tenant != tenant)
        {
            return Ok(None);
        }
        // The metadata first: a crash between the two leaves values no table claims.
        crate::durable::remove_parts(&self.dir, id, &["json", "f32"])
            .map_err(|(p, e)| io(&p, e))?;
        Ok(catalog.tables.remove(id))
    }
}

fn load(meta_path: &Path) -> Result<EmbeddingTable, String> {
    let meta: TableMeta =
        serde_json::from_slice(&std::fs::read(meta_path).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let bytes = std::fs::read(meta_path.with_extension("f32")).map_err(|e| e.to_string())?;
    if bytes.len() as u64 != 4 * meta.vocab as u64 * meta.dim as u64 {
        return Err(format!(
            "{} bytes of values for {} × {}",
            bytes.len(),
            meta.vocab,
            meta.dim
        ));
    }
    let values = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(EmbeddingTable {
        meta,
        values: Arc::new(values),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of this test's own.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpu-ops-tables-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn meta(id: &str, tenant: &str, vocab: usize, dim: usize) -> TableMeta {
        TableMeta {
            id: id.into(),
            tenant: tenant.into(),
            name: None,
            vocab,
            dim,
            created_at: "2026-11-24T00:00:00Z".into(),
        }
    }

    #[test]
    fn tables_survive_a_reopen_and_stay_with_their_tenant() {
        let dir = scratch("reopen");
        let t = EmbeddingTables::open(dir.clone(), 1 << 20, 1 << 20).unwrap();
        t.add(
            meta("emb_a", "alice", 2, 3),
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.5],
        )
        .unwrap();
        t.add(meta("emb_b", "bob", 1, 1), vec![9.0]).unwrap();
        let again = EmbeddingTables::open(dir.clone(), 1 << 20, 1 << 20).unwrap();
        let a = again.get("alice", "emb_a").unwrap();
        assert_eq!(*a.values, [1.0, 2.0, 3.0, 4.0, 5.0, 6.5]);
        assert!(again.get("bob", "emb_a").is_none());
        assert_eq!(again.list("bob").len(), 1);
        assert!(again.remove("bob", "emb_a").unwrap().is_none());
        assert!(again.remove("alice", "emb_a").unwrap().is_some());
        let third = EmbeddingTables::open(dir.clone(), 1 << 20, 1 << 20).unwrap();
        assert!(third.get("alice", "emb_a").is_none());
        // Values without their metadata (a crash mid-upload) are no table.
        std::fs::write(dir.join("emb_c.f32"), [0u8; 4]).unwrap();
        std::fs::write(dir.join("emb_d.json"), b"{not json").unwrap();
        let fourth = EmbeddingTables::open(dir.clone(), 1 << 20, 1 << 20).unwrap();
        assert_eq!(fourth.list("alice").len() + fourth.list("bob").len(), 1);
    }

    #[test]
    fn quota_and_cap_refuse_what_would_pass_them() {
        let t = EmbeddingTables::open(scratch("quota"), 40, 60).unwrap();
        t.add(meta("emb_1", "a", 8, 1), vec![0.0; 8]).unwrap();
        assert!(matches!(
            t.add(meta("emb_2", "a", 3, 1), vec![0.0; 3]),
            Err(TableError::QuotaExceeded {
                need: 12,
                used: 32,
                quota: 40
            })
        ));
        t.add(meta("emb_3", "b", 5, 1), vec![0.0; 5]).unwrap();
        assert!(matches!(
            t.add(meta("emb_4", "c", 3, 1), vec![0.0; 3]),
            Err(TableError::Full {
                need: 12,
                used: 52,
                cap: 60
            })
        ));
        t.remove("a", "emb_1").unwrap();
        t.add(meta("emb_4", "c", 3, 1), vec![0.0; 3]).unwrap();
    }

    #[test]
    fn a_tenant_holds_at_most_its_count_of_tables_however_small() {
        let t = EmbeddingTables::open(scratch("count"), 1 << 20, 1 << 20)
            .unwrap()
            .with_tenant_table_cap(3);
        for n in 0..3 {
            t.add(meta(&format!("emb_{n}"), "a", 1, 1), vec![0.0])
                .unwrap();
        }
        assert!(matches!(
            t.add(meta("emb_3", "a", 1, 1), vec![0.0]),
            Err(TableError::TooMany { count: 3, cap: 3 })
        ));
        // Another tenant's count is its own; a deletion makes room.
        t.add(meta("emb_b", "b", 1, 1), vec![0.0]).unwrap();
        t.remove("a", "emb_0").unwrap();
        t.add(meta("emb_3", "a", 1, 1), vec![0.0]).unwrap();
    }
}
