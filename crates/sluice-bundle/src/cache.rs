//! A cache bounded in bytes, evicting the least recently used entry first.
//!
//! Owns revert's cache of verified bundles (each entry a bundle's parsed objects, without its
//! blobs and files: [`crate::VerifiedObjects`]) and of other immutable, digest-named results: the process never holds more than the
//! configured bytes, however many bundles it verifies over weeks. An entry larger than the whole
//! bound is not kept (it is pulled again when needed). Must never hold anything that is not named
//! by a digest (entries are never refreshed, only evicted).

use std::{collections::HashMap, sync::Arc};

/// Least-recently-used entries of `V`, at most `capacity` bytes in all (each entry's size is
/// given on insert).
#[derive(Debug)]
pub struct ByteLru<V> {
    capacity: u64,
    used: u64,
    tick: u64,
    entries: HashMap<String, Entry<V>>,
}

#[derive(Debug)]
struct Entry<V> {
    value: Arc<V>,
    bytes: u64,
    used_at: u64,
}

impl<V> ByteLru<V> {
    /// An empty cache holding at most `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            used: 0,
            tick: 0,
            entries: HashMap::new(),
        }
    }

    /// The entry for `key`, marked as the most recently used.
    pub fn get(&mut self, key: &str) -> Option<Arc<V>> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|e| {
            e.used_at = tick;
            e.value.clone()
        })
    }

    /// Keeps `value` (of `bytes`) under `key`, evicting the least recently used entries until
    /// it fits. Returns whether it was kept (not when it alone exceeds the capacity).
    pub fn insert(&mut self, key: String, value: Arc<V>, bytes: u64) -> bool {
        if let Some(old) = self.entries.remove(&key) {
            self.used -= old.bytes;
        }
        if bytes > self.capacity {
            return false;
        }
        while self.used + bytes > self.capacity {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used_at)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.used -= e.bytes;
            }
        }
        self.tick += 1;
        self.used += bytes;
        self.entries.insert(
            key,
            Entry {
                value,
                bytes,
                used_at: self.tick,
            },
        );
        true
    }

    /// Bytes held.
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// An estimate of the memory a JSON value holds (strings, keys and a node overhead).
pub fn json_bytes(v: &serde_json::Value) -> u64 {
    const NODE: u64 = 32;
    NODE + match v {
        serde_json::Value::String(s) => s.len() as u64,
        serde_json::Value::Array(a) => a.iter().map(json_bytes).sum(),
        serde_json::Value::Object(o) => o
            .iter()
            .map(|(k, v)| NODE + k.len() as u64 + json_bytes(v))
            .sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_to_stay_within_the_bound() {
        let mut c = ByteLru::new(100);
        assert!(c.insert("a".into(), Arc::new(1), 40));
        assert!(c.insert("b".into(), Arc::new(2), 40));
        assert_eq!(c.get("a").as_deref(), Some(&1)); // a is now more recent than b
        assert!(c.insert("c".into(), Arc::new(3), 40));
        assert_eq!(c.get("b"), None, "the least recently used entry went");
        assert_eq!(c.get("a").as_deref(), Some(&1));
        assert_eq!(c.get("c").as_deref(), Some(&3));
        assert_eq!(c.used_bytes(), 80);
        // Many entries over time never exceed the bound.
        for i in 0..1000 {
            c.insert(format!("k{i}"), Arc::new(i), 7);
            assert!(c.used_bytes() <= 100);
        }
        assert_eq!(c.len(), 14);
    }

    #[test]
    fn an_entry_larger_than_the_bound_is_not_kept() {
        let mut c = ByteLru::new(10);
        assert!(c.insert("small".into(), Arc::new(()), 5));
        assert!(!c.insert("huge".into(), Arc::new(()), 11));
        assert_eq!(
            c.len(),
            1,
            "nothing was evicted for an entry that cannot fit"
        );
        assert_eq!(c.used_bytes(), 5);
    }

    #[test]
    fn replacing_a_key_counts_its_bytes_once() {
        let mut c = ByteLru::new(10);
        c.insert("a".into(), Arc::new(1), 6);
        c.insert("a".into(), Arc::new(2), 6);
        assert_eq!(c.used_bytes(), 6);
        assert_eq!(c.get("a").as_deref(), Some(&2));
    }
}
