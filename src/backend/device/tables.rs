//! Device-resident tables (NTT twiddles and scale factors, resident embedding tables)
//! kept between jobs.

use std::any::Any;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// Tables by key, least recently used first out once their bytes pass the cap. Values
/// are `Arc<DeviceBuffer<T>>` behind `Any`.
pub(super) struct TableCache {
    cap_bytes: usize,
    bytes: usize,
    tick: u64,
    entries: HashMap<String, (Arc<dyn Any + Send + Sync>, usize, u64)>,
    /// Keys whose source was deleted: a job that looked its table up before the delete
    /// must not cache it again. Keys are never reused; the oldest are let go past
    /// FORGOTTEN_KEPT.
    forgotten: HashSet<String>,
    forgotten_order: VecDeque<String>,
}

const FORGOTTEN_KEPT: usize = 100_000;

impl TableCache {
    pub fn new(cap_bytes: usize) -> Self {
        Self {
            cap_bytes,
            bytes: 0,
            tick: 0,
            entries: HashMap::new(),
            forgotten: HashSet::new(),
            forgotten_order: VecDeque::new(),
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// Removes `key` for good: later inserts under it are ignored.
    pub fn forget(&mut self, key: &str) {
        self.remove(key);
        if self.forgotten.insert(key.to_string()) {
            self.forgotten_order.push_back(key.to_string());
            if self.forgotten_order.len() > FORGOTTEN_KEPT {
                if let Some(old) = self.forgotten_order.pop_front() {
                    self.forgotten.remove(&old);
                }
            }
        }
    }

    pub fn remove(&mut self, key: &str) {
        if let Some((_, b, _)) = self.entries.remove(key) {
            self.bytes -= b;
        }
    }

    /// A new cap; the least recently used go until the rest fit.
    pub fn set_cap(&mut self, cap_bytes: usize) {
        self.cap_bytes = cap_bytes;
        self.evict_until(0);
    }

    /// Evicts the least recently used until `room` more bytes fit under the cap.
    fn evict_until(&mut self, room: usize) {
        while self.bytes + room > self.cap_bytes {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.2)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.remove(&oldest);
        }
    }

    pub fn get(&mut self, key: &str) -> Option<Arc<dyn Any + Send + Sync>> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|e| {
            e.2 = tick;
            e.0.clone()
        })
    }

    pub fn insert(&mut self, key: String, value: Arc<dyn Any + Send + Sync>, bytes: usize) {
        if let Some((_, old, _)) = self.entries.remove(&key) {
            self.bytes -= old;
        }
        if bytes > self.cap_bytes || self.forgotten.contains(&key) {
            return;
        }
        self.evict_until(bytes);
        self.tick += 1;
        self.bytes += bytes;
        self.entries.insert(key, (value, bytes, self.tick));
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
}
