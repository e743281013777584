//! Device-resident tables (NTT twiddles and scale factors, and resident arrays' copies,
//! embedding tables among them) kept between jobs.

use std::any::Any;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// What a cached entry is, for the metrics: a resident array's copy (keys
/// `array/…`, `arrays::device_key`; embedding tables are arrays) or a table the ops keep
/// (NTT twiddles and scale factors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKind {
    Array,
    Table,
}

impl CacheKind {
    pub const ALL: [CacheKind; 2] = [CacheKind::Array, CacheKind::Table];

    fn of(key: &str) -> Self {
        if key.starts_with("array/") {
            CacheKind::Array
        } else {
            CacheKind::Table
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CacheKind::Array => "array",
            CacheKind::Table => "table",
        }
    }
}

/// One kind's share of the cache: bytes held now, and lookups and evictions since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounts {
    pub bytes: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// Tables by key, least recently used first out once their bytes pass the cap. Values
/// are `Arc<DeviceBuffer<T>>` behind `Any`. A pinned entry (a kept result held only
/// here, `insert_pinned`) counts under the cap but is never evicted: it is the only
/// copy of its values until it is unpinned (read back to the host) or forgotten.
pub(super) struct TableCache {
    cap_bytes: usize,
    bytes: usize,
    /// Of `bytes`, those of pinned entries.
    pinned_bytes: usize,
    /// By `CacheKind`, in `CacheKind::ALL`'s order.
    counts: [CacheCounts; 2],
    tick: u64,
    entries: HashMap<String, Entry>,
    /// Keys whose source was deleted: a job that looked its table up before the delete
    /// must not cache it again. Keys are never reused; the oldest are let go past
    /// FORGOTTEN_KEPT.
    forgotten: HashSet<String>,
    forgotten_order: VecDeque<String>,
    /// Keys whose table a job is building now (`GpuDevice::claim_build`).
    building: HashSet<String>,
}

const FORGOTTEN_KEPT: usize = 100_000;

struct Entry {
    value: Arc<dyn Any + Send + Sync>,
    bytes: usize,
    /// When it was last used (the cache's tick).
    used: u64,
    pinned: bool,
}

impl TableCache {
    pub fn new(cap_bytes: usize) -> Self {
        Self {
            cap_bytes,
            bytes: 0,
            pinned_bytes: 0,
            counts: Default::default(),
            tick: 0,
            entries: HashMap::new(),
            forgotten: HashSet::new(),
            forgotten_order: VecDeque::new(),
            building: HashSet::new(),
        }
    }

    /// Marks `key` as being built; false if it already was.
    pub fn start_build(&mut self, key: &str) -> bool {
        self.building.insert(key.to_string())
    }

    pub fn end_build(&mut self, key: &str) {
        self.building.remove(key);
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        self.pinned_bytes = 0;
        for c in &mut self.counts {
            c.bytes = 0;
        }
    }

    /// `kind`'s bytes held and lookups so far.
    pub fn counts(&self, kind: CacheKind) -> CacheCounts {
        self.counts[kind as usize]
    }

    fn count(&mut self, key: &str) -> &mut CacheCounts {
        &mut self.counts[CacheKind::of(key) as usize]
    }

    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// The keys under `key` (`key/…`), sorted.
    pub fn keys_under(&self, key: &str) -> Vec<String> {
        let under = format!("{key}/");
        let mut keys: Vec<String> = self
            .entries
            .keys()
            .filter(|k| k.starts_with(&under))
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    /// Removes `key` and every key under it (`key/…`: the forms one source is kept in)
    /// for good: later inserts under them are ignored.
    pub fn forget(&mut self, key: &str) {
        let mut gone = self.keys_under(key);
        if self.entries.contains_key(key) {
            gone.push(key.to_string());
        }
        for k in gone {
            self.remove(&k);
        }
        if self.forgotten.insert(key.to_string()) {
            self.forgotten_order.push_back(key.to_string());
            if self.forgotten_order.len() > FORGOTTEN_KEPT {
                if let Some(old) = self.forgotten_order.pop_front() {
                    self.forgotten.remove(&old);
                }
            }
        }
    }

    /// Whether `key`, or a key it is under (`a` for `a/b`), was forgotten.
    fn is_forgotten(&self, key: &str) -> bool {
        let prefixes = key.match_indices('/').map(|(i, _)| &key[..i]);
        self.forgotten.contains(key) || prefixes.into_iter().any(|p| self.forgotten.contains(p))
    }

    pub fn remove(&mut self, key: &str) {
        if let Some(e) = self.entries.remove(key) {
            self.bytes -= e.bytes;
            if e.pinned {
                self.pinned_bytes -= e.bytes;
            }
            self.count(key).bytes -= e.bytes;
        }
    }

    /// Bytes of pinned entries now.
    pub fn pinned_bytes(&self) -> usize {
        self.pinned_bytes
    }

    /// Bytes that unpinned entries may take: the cap less the pinned entries'.
    pub fn room(&self) -> usize {
        self.cap_bytes.saturating_sub(self.pinned_bytes)
    }

    /// A new cap; the least recently used go until the rest fit.
    pub fn set_cap(&mut self, cap_bytes: usize) {
        self.cap_bytes = cap_bytes;
        self.evict_until(0);
    }

    /// Evicts the least recently used unpinned entries until `room` more bytes fit under
    /// the cap, or none is left.
    fn evict_until(&mut self, room: usize) {
        while self.bytes + room > self.cap_bytes {
            let Some(oldest) = self
                .entries
                .iter()
                .filter(|(_, e)| !e.pinned)
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.remove(&oldest);
            self.count(&oldest).evictions += 1;
        }
    }

    pub fn get(&mut self, key: &str) -> Option<Arc<dyn Any + Send + Sync>> {
        self.tick += 1;
        let tick = self.tick;
        let found = self.entries.get_mut(key).map(|e| {
            e.used = tick;
            e.value.clone()
        });
        let counts = self.count(key);
        match found {
            Some(_) => counts.hits += 1,
            None => counts.misses += 1,
        }
        found
    }

    pub fn insert(&mut self, key: String, value: Arc<dyn Any + Send + Sync>, bytes: usize) {
        self.put(key, value, bytes, false);
    }

    /// As `insert`, pinned: false (and nothing kept) when the unpinned entries' room
    /// cannot hold it, or the key was forgotten.
    pub fn insert_pinned(
        &mut self,
        key: String,
        value: Arc<dyn Any + Send + Sync>,
        bytes: usize,
    ) -> bool {
        self.put(key, value, bytes, true)
    }

    /// Lets the entry under `key` be evicted again (its values are on the host now).
    pub fn unpin(&mut self, key: &str) {
        if let Some(e) = self.entries.get_mut(key) {
            if e.pinned {
                e.pinned = false;
                self.pinned_bytes -= e.bytes;
            }
        }
    }

    fn put(
        &mut self,
        key: String,
        value: Arc<dyn Any + Send + Sync>,
        bytes: usize,
        pinned: bool,
    ) -> bool {
        self.remove(&key);
        // Refused before anything is evicted when it could not fit beside the pinned
        // entries even with every other one gone; otherwise evicting makes room.
        if bytes > self.room() || self.is_forgotten(&key) {
            return false;
        }
        self.evict_until(bytes);
        self.tick += 1;
        self.bytes += bytes;
        if pinned {
            self.pinned_bytes += bytes;
        }
        self.count(&key).bytes += bytes;
        let used = self.tick;
        self.entries.insert(
            key,
            Entry {
                value,
                bytes,
                used,
                pinned,
            },
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(v: u32) -> Arc<dyn Any + Send + Sync> {
        Arc::new(v)
    }

    #[test]
    fn table_cache_evicts_the_least_recently_used_and_keeps_its_byte_count() {
        let mut c = TableCache::new(100);
        c.insert("a".into(), value(1), 40);
        c.insert("b".into(), value(2), 40);
        assert!(c.get("a").is_some()); // b is now the oldest
        c.insert("c".into(), value(3), 40);
        assert!(c.get("b").is_none());
        assert_eq!(
            c.get("a").and_then(|v| v.downcast::<u32>().ok()).as_deref(),
            Some(&1)
        );
        assert!(c.get("c").is_some());
        assert_eq!(c.bytes, 80);
        // Replacing a key does not count it twice; an oversized table is not kept.
        c.insert("c".into(), value(4), 50);
        assert_eq!(c.bytes, 90);
        c.insert("huge".into(), value(5), 101);
        assert!(c.get("huge").is_none());
        assert_eq!(c.bytes, 90);
        // Removing a key and lowering the cap keep the count; the cap evicts the oldest.
        c.remove("a");
        assert!(!c.contains("a") && c.contains("c"));
        assert_eq!(c.bytes, 50);
        c.insert("d".into(), value(6), 30);
        c.set_cap(40);
        assert!(!c.contains("c") && c.contains("d"));
        assert_eq!(c.bytes, 30);
        // A forgotten key stays out, even when a late job inserts it again.
        c.forget("d");
        c.insert("d".into(), value(7), 10);
        assert!(!c.contains("d"));
        assert_eq!(c.bytes, 0);
    }

    #[test]
    fn a_pinned_entry_is_never_evicted_until_unpinned() {
        let mut c = TableCache::new(100);
        assert!(c.insert_pinned("array/kept".into(), value(1), 60));
        c.insert("t1".into(), value(2), 30);
        // Room for t2 comes from t1, the only unpinned entry, however recently used.
        assert!(c.get("t1").is_some());
        c.insert("t2".into(), value(3), 40);
        assert!(c.contains("array/kept") && !c.contains("t1") && c.contains("t2"));
        // A second pinned entry that fits only by evicting the first is refused, and
        // evicts nothing on the way.
        assert!(!c.insert_pinned("array/other".into(), value(4), 50));
        assert!(!c.contains("array/other") && c.contains("array/kept") && c.contains("t2"));
        assert_eq!(c.pinned_bytes(), 60);
        // A lower cap cannot push out a pinned entry either.
        c.set_cap(50);
        assert!(c.contains("array/kept") && !c.contains("t2"));
        // Unpinned, it is an ordinary copy: the next insert that needs room evicts it.
        c.unpin("array/kept");
        assert_eq!(c.pinned_bytes(), 0);
        c.insert("t3".into(), value(5), 10);
        assert!(!c.contains("array/kept") && c.contains("t3"));
        // Forgetting takes a pinned entry too.
        c.set_cap(100);
        assert!(c.insert_pinned("array/p".into(), value(6), 10));
        c.forget("array/p");
        assert!(!c.contains("array/p"));
        assert_eq!(c.bytes, 10);
    }

    #[test]
    fn table_cache_counts_arrays_and_tables_apart() {
        let mut c = TableCache::new(100);
        c.insert("array/arr_1".into(), value(1), 60);
        c.insert("ntt/twiddles".into(), value(2), 30);
        assert!(c.get("array/arr_1").is_some());
        assert!(c.get("array/arr_2").is_none());
        assert!(c.get("ntt/twiddles").is_some());
        let arrays = c.counts(CacheKind::Array);
        assert_eq!((arrays.bytes, arrays.hits, arrays.misses), (60, 1, 1));
        let tables = c.counts(CacheKind::Table);
        assert_eq!((tables.bytes, tables.hits, tables.misses), (30, 1, 0));
        // A third entry evicts the least recently used (the array, looked up first).
        c.insert("emb/t".into(), value(3), 50);
        let arrays = c.counts(CacheKind::Array);
        assert_eq!((arrays.bytes, arrays.evictions), (0, 1));
        assert_eq!(c.counts(CacheKind::Table).bytes, 80);
        assert_eq!(c.counts(CacheKind::Table).evictions, 0);
        // Forgetting a key takes the forms kept under it, now and later.
        c.insert("array/arr_3/f16".into(), value(4), 5);
        c.insert("array/arr_3x".into(), value(5), 5);
        c.forget("array/arr_3");
        assert!(!c.contains("array/arr_3/f16") && c.contains("array/arr_3x"));
        c.insert("array/arr_3/bf16".into(), value(6), 5);
        assert!(!c.contains("array/arr_3/bf16"));
        c.remove("array/arr_3x");
        // Removing by hand is no eviction; clearing keeps the lookups counted.
        c.remove("emb/t");
        assert_eq!(c.counts(CacheKind::Table).bytes, 30);
        c.clear();
        let tables = c.counts(CacheKind::Table);
        assert_eq!((tables.bytes, tables.hits, tables.evictions), (0, 1, 0));
    }
}
