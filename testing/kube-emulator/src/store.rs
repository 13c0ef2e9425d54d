//! Object storage: JSON objects per (group, resource, namespace, name), one resourceVersion
//! counter per emulator, a bounded per-resource event history for watch resume, and broadcast
//! channels feeding live watches.
//!
//! Owns resourceVersion assignment and event emission. Never interprets objects beyond
//! `metadata.namespace`/`metadata.name`/`metadata.resourceVersion`; semantics live in `api`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde_json::Value;
use tokio::sync::broadcast;

use crate::resources::TableKey;

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed.
    Deleted,
}

impl EventType {
    /// The wire name (`ADDED`, `MODIFIED`, `DELETED`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change of one object.
#[derive(Debug, Clone)]
pub struct Event {
    /// The resourceVersion the change was committed at.
    pub rv: u64,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (before removal, for deletes).
    pub object: Arc<Value>,
    /// The object before a MODIFIED change (selector-filtered watches turn a change that leaves
    /// or enters the selection into DELETED or ADDED, as the apiserver's watch cache does).
    pub prev: Option<Arc<Value>>,
    /// The watch line (`{"type":...,"object":...}`) encoded once and shared by every watcher
    /// that sends the event unchanged.
    pub wire: std::sync::OnceLock<axum::body::Bytes>,
}

/// An object with its (namespace, name) key, as a list page reads it.
pub type Keyed<'a> = (&'a (String, String), &'a Arc<Value>);

/// Objects of one resource plus its recent history.
#[derive(Debug)]
pub struct Table {
    /// (namespace, name) → object; cluster-scoped objects use an empty namespace.
    objects: BTreeMap<(String, String), Arc<Value>>,
    /// (label key, label value) → (namespace, name) of the objects carrying that label, so a
    /// list by an equality selector reads its matches instead of the whole resource.
    by_label: HashMap<(String, String), BTreeSet<(String, String)>>,
    /// Owner uid → (namespace, name) of the objects whose `ownerReferences` name it, so the
    /// garbage collector finds an owner's dependents without reading every object.
    by_owner: HashMap<String, BTreeSet<(String, String)>>,
    history: VecDeque<Arc<Event>>,
    /// Events at or below this resourceVersion are no longer in the history.
    compacted: u64,
    tx: broadcast::Sender<Arc<Event>>,
    /// The last [`CHANNEL_CAPACITY`] events sent, so the channel's ring never holds the last
    /// reference to one: an event leaves this queue for the store's garbage once the ring has
    /// overwritten it, and is dropped after the lock is released.
    sent: VecDeque<Arc<Event>>,
}

/// Capacity of each live watch channel; a watcher lagging by more is closed with 410.
const CHANNEL_CAPACITY: usize = 65_536;

impl Table {
    /// A new table: nothing was ever stored in it, so no event is missing from its history and a
    /// watch may resume from any resourceVersion.
    fn new() -> Self {
        Table {
            objects: BTreeMap::new(),
            by_label: HashMap::new(),
            by_owner: HashMap::new(),
            history: VecDeque::new(),
            compacted: 0,
            tx: broadcast::channel(CHANNEL_CAPACITY).0,
            sent: VecDeque::new(),
        }
    }

    /// Objects in one namespace (or all when `ns` is `None`), in name order.
    pub fn iter_ns<'a>(
        &'a self,
        ns: Option<&'a str>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Value>> + 'a> {
        match ns {
            None => Box::new(self.objects.values()),
            Some(ns) => Box::new(
                self.objects
                    .range((ns.to_string(), String::new())..)
                    .take_while(move |((n, _), _)| n == ns)
                    .map(|(_, v)| v),
            ),
        }
    }

    /// Objects carrying every `(key, value)` label of `labels` (every object when `labels` is
    /// empty), in one namespace (or all when `ns` is `None`), in (namespace, name) order, with
    /// their keys, starting strictly after `after` (a list's continue key), so a page costs its
    /// own length and not the whole resource. Callers still match the whole selector.
    pub fn iter_keyed<'a>(
        &'a self,
        ns: Option<&'a str>,
        labels: &[(String, String)],
        after: Option<&(String, String)>,
    ) -> Box<dyn Iterator<Item = Keyed<'a>> + 'a> {
        use std::ops::Bound;
        let lower = match (after, ns) {
            (Some(a), Some(ns)) if a.0.as_str() < ns => {
                Bound::Included((ns.to_string(), String::new()))
            }
            (Some(a), _) => Bound::Excluded(a.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_string(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let in_ns = move |k: &(String, String)| ns.is_none_or(|ns| k.0 == ns);
        static EMPTY: BTreeSet<(String, String)> = BTreeSet::new();
        let narrowest = labels
            .iter()
            .map(|l| self.by_label.get(l).unwrap_or(&EMPTY))
            .min_by_key(|set| set.len());
        match narrowest {
            None => Box::new(
                self.objects
                    .range((lower, Bound::Unbounded))
                    .take_while(move |(k, _)| in_ns(k)),
            ),
            Some(set) => Box::new(
                set.range((lower, Bound::Unbounded))
                    .take_while(move |k| in_ns(k))
                    .filter_map(|k| self.objects.get_key_value(k)),
            ),
        }
    }

    /// The object at (namespace, name).
    pub fn get(&self, ns: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects.get(&(ns.to_string(), name.to_string()))
    }

    fn index(&mut self, k: &(String, String), obj: &Value, add: bool) {
        let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) else {
            return;
        };
        for (lk, lv) in labels {
            let Some(lv) = lv.as_str() else { continue };
            let entry = (lk.clone(), lv.to_string());
            if add {
                self.by_label.entry(entry).or_default().insert(k.clone());
            } else if let Some(set) = self.by_label.get_mut(&entry) {
                set.remove(k);
                if set.is_empty() {
                    self.by_label.remove(&entry);
                }
            }
        }
    }

    fn index_owners(&mut self, k: &(String, String), obj: &Value, add: bool) {
        for uid in owner_uids(obj) {
            if add {
                self.by_owner
                    .entry(uid.to_string())
                    .or_default()
                    .insert(k.clone());
            } else if let Some(set) = self.by_owner.get_mut(uid) {
                set.remove(k);
                if set.is_empty() {
                    self.by_owner.remove(uid);
                }
            }
        }
    }

    /// (namespace, name) of the objects with an owner reference to `uid`.
    pub fn owned_by(&self, uid: &str) -> Vec<(String, String)> {
        self.by_owner
            .get(uid)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn insert(&mut self, k: (String, String), obj: Arc<Value>) -> Option<Arc<Value>> {
        let prev = self.objects.insert(k.clone(), obj.clone());
        let same = |ptr: &str| {
            prev.as_deref()
                .is_some_and(|p| p.pointer(ptr) == obj.pointer(ptr))
        };
        if !same("/metadata/labels") {
            if let Some(p) = &prev {
                self.index(&k, p, false);
            }
            self.index(&k, &obj, true);
        }
        if !same("/metadata/ownerReferences") {
            if let Some(p) = &prev {
                self.index_owners(&k, p, false);
            }
            self.index_owners(&k, &obj, true);
        }
        prev
    }

    fn take(&mut self, k: &(String, String)) -> Option<Arc<Value>> {
        let old = self.objects.remove(k)?;
        self.index(k, &old, false);
        self.index_owners(k, &old, false);
        Some(old)
    }

    /// Events after `rv`, or `None` when some of them were already dropped from the history.
    pub fn events_since(&self, rv: u64) -> Option<Vec<Arc<Event>>> {
        if rv < self.compacted {
            return None;
        }
        Some(self.history.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    /// A live feed of events committed from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// The oldest resourceVersion a watch may resume from.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }
}

/// Everything behind the store lock.
#[derive(Debug, Default)]
pub struct Inner {
    rv: u64,
    tables: HashMap<TableKey, Table>,
    history_limit: usize,
    /// What a write released: old events and removed objects, dropped after the lock is
    /// released (freeing a pod's JSON tree is costly, and the lock serialises every write).
    garbage: Garbage,
}

/// Values whose last reference a write released.
#[derive(Debug, Default)]
struct Garbage {
    events: Vec<Arc<Event>>,
    objects: Vec<Arc<Value>>,
}

/// The uids an object's `ownerReferences` name.
fn owner_uids(obj: &Value) -> impl Iterator<Item = &str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

/// Reads `metadata.namespace`/`metadata.name`.
pub fn key_of(obj: &Value) -> (String, String) {
    let m = obj.get("metadata");
    let s = |k: &str| {
        m.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (s("namespace"), s("name"))
}

impl Inner {
    /// The last committed resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// The table for `key`, created empty on first use.
    pub fn table_mut(&mut self, key: &TableKey) -> &mut Table {
        self.tables.entry(key.clone()).or_insert_with(Table::new)
    }

    /// The table for `key`, if any object was ever stored in it.
    pub fn table(&self, key: &TableKey) -> Option<&Table> {
        self.tables.get(key)
    }

    /// The stored object at (namespace, name).
    pub fn get(&self, key: &TableKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.tables.get(key)?.get(ns, name).cloned()
    }

    /// Ensures the table exists and returns a live feed plus the events after `rv`
    /// (`None` when they were compacted away).
    pub fn watch_from(
        &mut self,
        key: &TableKey,
        rv: u64,
    ) -> (broadcast::Receiver<Arc<Event>>, Option<Vec<Arc<Event>>>) {
        let t = self.table_mut(key);
        (t.subscribe(), t.events_since(rv))
    }

    fn emit(
        &mut self,
        key: &TableKey,
        kind: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        let limit = self.history_limit;
        let rv = self.rv;
        let t = self.table_mut(key);
        let ev = Arc::new(Event {
            rv,
            kind,
            object,
            prev,
            wire: std::sync::OnceLock::new(),
        });
        t.history.push_back(ev.clone());
        while t.history.len() > limit {
            if let Some(old) = t.history.pop_front() {
                t.compacted = old.rv;
            }
        }
        t.sent.push_back(ev.clone());
        let overwritten = (t.sent.len() > CHANNEL_CAPACITY)
            .then(|| t.sent.pop_front())
            .flatten();
        let _ = t.tx.send(ev);
        self.garbage.events.extend(overwritten);
    }

    /// Stores `obj` at a new resourceVersion (written into `metadata.resourceVersion`) and
    /// emits ADDED or MODIFIED.
    pub fn put(&mut self, key: &TableKey, mut obj: Value) -> Arc<Value> {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let k = key_of(&obj);
        let obj = Arc::new(obj);
        let prev = self.table_mut(key).insert(k, obj.clone());
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.emit(key, kind, obj.clone(), prev);
        obj
    }

    /// Removes the object, emits DELETED carrying the object at a new resourceVersion.
    pub fn remove(&mut self, key: &TableKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        let old = self
            .table_mut(key)
            .take(&(ns.to_string(), name.to_string()))?;
        self.rv += 1;
        let mut last = (*old).clone();
        last["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let last = Arc::new(last);
        self.emit(key, EventType::Deleted, last.clone(), None);
        self.garbage.objects.push(old);
        Some(last)
    }

    /// Drops a whole table (its CRD was deleted); live watches end.
    pub fn drop_table(&mut self, key: &TableKey) {
        self.tables.remove(key);
    }
}

/// Exclusive access to the store; what the writes released is dropped after the lock is.
pub struct WriteGuard<'a>(Option<RwLockWriteGuard<'a, Inner>>);

impl std::ops::Deref for WriteGuard<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        self.0.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for WriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        self.0.as_mut().expect("held until dropped")
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        let garbage = self.0.as_mut().map(|g| std::mem::take(&mut g.garbage));
        drop(self.0.take());
        drop(garbage);
    }
}

/// The store: one lock around all tables.
#[derive(Debug)]
pub struct Store {
    inner: RwLock<Inner>,
}

impl Store {
    /// An empty store keeping up to `history_limit` events per resource for watch resume.
    pub fn new(history_limit: usize) -> Self {
        Store {
            inner: RwLock::new(Inner {
                history_limit: history_limit.max(1),
                ..Inner::default()
            }),
        }
    }

    /// Shared access.
    pub fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Exclusive access.
    pub fn write(&self) -> WriteGuard<'_> {
        WriteGuard(Some(self.inner.write().unwrap_or_else(|p| p.into_inner())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> TableKey {
        TableKey {
            group: "".into(),
            plural: "configmaps".into(),
        }
    }

    #[test]
    fn resource_versions_increase_and_history_compacts() {
        let store = Store::new(2);
        let mut w = store.write();
        let a = w.put(&key(), json!({"metadata": {"name": "a", "namespace": "n"}}));
        assert_eq!(a["metadata"]["resourceVersion"], "1");
        w.put(&key(), json!({"metadata": {"name": "b", "namespace": "n"}}));
        w.put(
            &key(),
            json!({"metadata": {"name": "a", "namespace": "n", "labels": {"x": "y"}}}),
        );
        let t = w.table(&key()).unwrap();
        // Only two events kept: rv 2 and 3; resuming from 1 still works (nothing after 1 lost),
        // resuming from 0 does not.
        assert_eq!(t.events_since(1).unwrap().len(), 2);
        assert!(t.events_since(0).is_none());
        let gone = w.remove(&key(), "n", "a").unwrap();
        assert_eq!(gone["metadata"]["resourceVersion"], "4");
        let evs = w.table(&key()).unwrap().events_since(3).unwrap();
        assert_eq!(evs[0].kind, EventType::Deleted);
        assert_eq!(w.table(&key()).unwrap().iter_ns(Some("n")).count(), 1);
        assert_eq!(w.table(&key()).unwrap().iter_ns(Some("m")).count(), 0);
    }

    #[test]
    fn a_resource_first_written_after_other_writes_can_be_watched_from_earlier_versions() {
        let store = Store::new(2);
        let mut w = store.write();
        for n in ["a", "b", "c"] {
            w.put(&key(), json!({"metadata": {"name": n, "namespace": "n"}}));
        }
        let other = TableKey {
            group: "x.io".into(),
            plural: "things".into(),
        };
        let (_rx, evs) = w.watch_from(&other, 1);
        assert_eq!(
            evs.map(|e| e.len()),
            Some(0),
            "no event of a new resource was ever dropped"
        );
    }

    fn names<'a>(it: impl Iterator<Item = Keyed<'a>>) -> Vec<String> {
        it.map(|(k, _)| format!("{}/{}", k.0, k.1)).collect()
    }

    #[test]
    fn a_page_starts_after_its_continue_key_in_and_across_namespaces() {
        let store = Store::new(10);
        let mut w = store.write();
        for (ns, n, app) in [
            ("a", "1", "web"),
            ("a", "2", "db"),
            ("b", "1", "web"),
            ("b", "2", "web"),
            ("c", "1", "web"),
        ] {
            w.put(
                &key(),
                json!({"metadata": {"name": n, "namespace": ns, "labels": {"app": app}}}),
            );
        }
        let t = w.table(&key()).unwrap();
        let web = [("app".to_string(), "web".to_string())];
        let after = |ns: &str, n: &str| (ns.to_string(), n.to_string());
        assert_eq!(
            names(t.iter_keyed(None, &[], Some(&after("a", "2")))),
            ["b/1", "b/2", "c/1"]
        );
        assert_eq!(
            names(t.iter_keyed(None, &web, Some(&after("a", "1")))),
            ["b/1", "b/2", "c/1"]
        );
        assert_eq!(
            names(t.iter_keyed(Some("b"), &web, Some(&after("b", "1")))),
            ["b/2"]
        );
        // A key before the namespace starts at its first object; one past it yields nothing.
        assert_eq!(
            names(t.iter_keyed(Some("b"), &[], Some(&after("a", "9")))),
            ["b/1", "b/2"]
        );
        assert!(names(t.iter_keyed(Some("b"), &web, Some(&after("c", "0")))).is_empty());
        assert_eq!(names(t.iter_keyed(Some("a"), &web, None)), ["a/1"]);
    }

    #[test]
    fn the_owner_index_follows_changed_and_removed_owner_references() {
        let store = Store::new(10);
        let mut w = store.write();
        let owned = |uid: &str| json!({"metadata": {"name": "p", "namespace": "n", "ownerReferences": [{"uid": uid}]}});
        w.put(&key(), owned("u1"));
        assert_eq!(
            w.table(&key()).unwrap().owned_by("u1"),
            [("n".to_string(), "p".to_string())]
        );
        w.put(&key(), owned("u2"));
        let t = w.table(&key()).unwrap();
        assert!(
            t.owned_by("u1").is_empty(),
            "the old owner no longer lists it"
        );
        assert_eq!(t.owned_by("u2").len(), 1);
        w.remove(&key(), "n", "p");
        assert!(w.table(&key()).unwrap().owned_by("u2").is_empty());
    }

    #[test]
    fn what_a_write_released_is_freed_once_the_lock_is() {
        let store = Store::new(1);
        let first = store
            .write()
            .put(&key(), json!({"metadata": {"name": "a", "namespace": "n"}}));
        let removed = store.write().remove(&key(), "n", "a").unwrap();
        let mut rx = store.write().table_mut(&key()).subscribe();
        assert_eq!(removed["metadata"]["resourceVersion"], "2");
        // Until the channel's ring overwrites them, the two events keep both versions alive.
        {
            let w = store.write();
            assert!(Arc::strong_count(&first) > 1);
            assert_eq!(
                w.garbage.objects.len(),
                0,
                "handed over when the guard dropped"
            );
        }
        {
            let mut w = store.write();
            for i in 0..CHANNEL_CAPACITY {
                w.put(
                    &key(),
                    json!({"metadata": {"name": format!("b{}", i % 3), "namespace": "n"}}),
                );
            }
            assert!(
                !w.garbage.events.is_empty(),
                "the overwritten events wait for the unlock"
            );
        }
        assert_eq!(
            Arc::strong_count(&first),
            1,
            "the ADDED event and the object were freed"
        );
        assert_eq!(
            Arc::strong_count(&removed),
            1,
            "the DELETED event was freed"
        );
        // A receiver still reads the ring's events: the queue only ever drops what it lost.
        assert_eq!(rx.try_recv().unwrap().rv, 3);
        let w = store.write();
        let t = w.table(&key()).unwrap();
        assert_eq!(t.sent.len(), CHANNEL_CAPACITY);
        assert!(w.garbage.events.is_empty());
    }
}
