//! A projection of a watch: every object reduced, once per change, to a key and the value a
//! reader needs. Readers that look at every object on every pass (a tick reads every pod of the
//! cluster) then read small values instead of re-parsing objects; a watch's relist is built
//! aside and swapped in whole when complete, so a reader never sees half a list.

use std::collections::BTreeMap;

use kube::runtime::watcher;

/// Objects of one watch, each held as `key → value`.
#[derive(Debug)]
pub struct Projection<K, V> {
    /// Whether every object was listed once: until then what is held is not the cluster
    /// (an empty projection is "not known yet", never "none").
    synced: bool,
    /// The current entries.
    entries: BTreeMap<K, V>,
    /// What a relist is building, swapped in when the list is complete.
    building: Option<BTreeMap<K, V>>,
}

impl<K, V> Default for Projection<K, V> {
    fn default() -> Self {
        Self {
            synced: false,
            entries: BTreeMap::new(),
            building: None,
        }
    }
}

impl<K: Ord, V> Projection<K, V> {
    /// Follows one watch event. `key` places an object (`None`: never held), `value` reduces
    /// it (`None`: not held now, e.g. a pod being deleted when only live pods count).
    pub fn follow<T>(
        &mut self,
        event: &watcher::Event<T>,
        key: impl Fn(&T) -> Option<K>,
        value: impl Fn(&T) -> Option<V>,
    ) {
        self.follow_by(event, key, value, |_, _| true);
    }

    /// [`Projection::follow`], where an object replaces the entry it finds only when
    /// `replaces(held, new)`; a reader that also records what it wrote itself (see
    /// [`Projection::insert_by`]) keeps its newer knowledge against a lagging watch.
    pub fn follow_by<T>(
        &mut self,
        event: &watcher::Event<T>,
        key: impl Fn(&T) -> Option<K>,
        value: impl Fn(&T) -> Option<V>,
        replaces: impl Fn(&V, &V) -> bool,
    ) {
        match event {
            watcher::Event::Init => self.building = Some(BTreeMap::new()),
            watcher::Event::InitApply(o) => {
                if let (Some(b), Some(k)) = (self.building.as_mut(), key(o))
                    && let Some(v) = value(o)
                {
                    insert_by(b, k, v, &replaces);
                }
            }
            watcher::Event::InitDone => {
                if let Some(b) = self.building.take() {
                    self.entries = b;
                }
                self.synced = true;
            }
            watcher::Event::Apply(o) => {
                if let Some(k) = key(o) {
                    match value(o) {
                        Some(v) => insert_by(&mut self.entries, k, v, &replaces),
                        None => {
                            self.entries.remove(&k);
                        }
                    }
                }
            }
            watcher::Event::Delete(o) => {
                if let Some(k) = key(o) {
                    self.entries.remove(&k);
                }
            }
        }
    }

    /// Records what the reader knows before its watch does (an object it just created), on
    /// the same terms as [`Projection::follow_by`].
    pub fn insert_by(&mut self, key: K, value: V, replaces: impl Fn(&V, &V) -> bool) {
        insert_by(&mut self.entries, key, value, &replaces);
    }

    /// Whether the watch has listed every object once.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The current entries, in key order.
    pub fn entries(&self) -> &BTreeMap<K, V> {
        &self.entries
    }
}

fn insert_by<K: Ord, V>(
    map: &mut BTreeMap<K, V>,
    key: K,
    value: V,
    replaces: &impl Fn(&V, &V) -> bool,
) {
    match map.entry(key) {
        std::collections::btree_map::Entry::Vacant(e) => {
            e.insert(value);
        }
        std::collections::btree_map::Entry::Occupied(mut e) => {
            if replaces(e.get(), &value) {
                e.insert(value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use watcher::Event;

    /// (name, value, version); the value `None` is an object the projection does not hold.
    type Obj = (&'static str, Option<u32>, u32);

    fn follow(p: &mut Projection<&'static str, (u32, u32)>, e: Event<Obj>) {
        p.follow_by(
            &e,
            |o| Some(o.0),
            |o| o.1.map(|v| (v, o.2)),
            |held, new| new.1 >= held.1,
        );
    }

    #[test]
    fn a_relist_is_swapped_in_whole_and_only_then_is_the_projection_synced() {
        let mut p = Projection::default();
        follow(&mut p, Event::Init);
        follow(&mut p, Event::InitApply(("a", Some(1), 1)));
        assert!(!p.synced(), "half a list is not the cluster");
        assert!(
            p.entries().is_empty(),
            "nothing is read before the list completes"
        );
        follow(&mut p, Event::InitApply(("b", None, 1)));
        follow(&mut p, Event::InitDone);
        assert!(p.synced());
        assert_eq!(p.entries().keys().copied().collect::<Vec<_>>(), vec!["a"]);

        // A relist that no longer sees `a` drops it only when the new list is complete.
        follow(&mut p, Event::Init);
        follow(&mut p, Event::InitApply(("c", Some(3), 2)));
        assert!(p.entries().contains_key("a"));
        follow(&mut p, Event::InitDone);
        assert_eq!(p.entries().keys().copied().collect::<Vec<_>>(), vec!["c"]);
    }

    #[test]
    fn changes_replace_or_remove_entries_and_older_versions_lose() {
        let mut p = Projection::default();
        follow(&mut p, Event::Init);
        follow(&mut p, Event::InitDone);
        follow(&mut p, Event::Apply(("a", Some(1), 5)));
        p.insert_by("b", (7, 9), |held, new| new.1 >= held.1);
        // The watch brings an older `b` than the one recorded: the record stays.
        follow(&mut p, Event::Apply(("b", Some(6), 8)));
        assert_eq!(p.entries()["b"], (7, 9));
        follow(&mut p, Event::Apply(("a", Some(2), 6)));
        assert_eq!(p.entries()["a"], (2, 6));
        // An object that stops projecting (say, a pod being deleted) leaves; so does a delete.
        follow(&mut p, Event::Apply(("a", None, 7)));
        follow(&mut p, Event::Delete(("b", Some(7), 10)));
        assert!(p.entries().is_empty());
    }
}
