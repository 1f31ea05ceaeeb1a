//! `SortedMap`: a map keyed by [`Name`] that iterates in key (text) order, like `BTreeMap`,
//! and looks keys up by their interned hash. The state's job and TPU-record tables use it: a
//! pass looks them up thousands of times (a `BTreeMap` lookup compares long shared-prefix
//! names a dozen times; an interned name is found by pointer) and iterates them in id order.
//! Inserting a new key or removing one shifts the entries after it (O(n)), which is rare (a
//! job arrives or ends, a TPU name is first seen). Must not expose any way to put a key out of
//! order, nor any way to change a value without recording it.
//!
//! Change tracking: every mutable access and every removal is logged with the map's clock,
//! so a reader that kept a [`Revision`] learns which keys may have changed since (a superset:
//! a mutable access that changed nothing still counts) in time proportional to the changes,
//! without visiting the others. A copy or a deserialised map is a new origin: revisions of
//! another map never apply to it.

use std::fmt;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};

use indexmap::IndexMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use ustr::IdentityHasher;

use crate::spec::Name;

type Table<V> = IndexMap<Name, Entry<V>, BuildHasherDefault<IdentityHasher>>;

/// A value with its last access in the log, which is marked stale when the key is accessed
/// again or removed (so a reader finds each key once, from its last access, without looking
/// it up).
#[derive(Clone)]
struct Entry<V> {
    /// The clock at the last logged access (0: none).
    stamp: u64,
    /// That access's place in the log, counted from the log's first entry ever (meaningless
    /// while `stamp` is 0).
    logged_at: u64,
    value: Box<V>,
}

impl<V> Entry<V> {
    fn new(value: V) -> Self {
        Entry {
            stamp: 0,
            logged_at: 0,
            value: Box::new(value),
        }
    }
}

/// A logged mutable access: the clock then, the key, and whether it is still the key's last
/// access (false once the key is accessed again or removed).
#[derive(Clone, Copy, Debug)]
struct Access {
    at: u64,
    key: Name,
    last: bool,
}

/// A map from [`Name`] to `V` kept in key order (see the module doc). Values are boxed so
/// that shifting entries moves pointers, not records (a 100k-job queue stays cheap to
/// insert into).
pub struct SortedMap<V> {
    map: Table<V>,
    /// Ticks at every mutable access and removal.
    clock: u64,
    /// Keys accessed mutably (or inserted) with the clock then, oldest first (at most
    /// `TOUCHED_KEPT`; a key accessed twice is there twice, the first marked not last).
    touched: Vec<Access>,
    /// Accesses at or before this clock value are no longer in `touched`.
    touched_floor: u64,
    /// How many accesses were dropped from the front of `touched` (the place of
    /// `touched[0]` counted from the first access ever logged).
    touched_dropped: u64,
    /// Removed keys with the clock at their removal, oldest first (at most `REMOVED_KEPT`).
    removed: Vec<(u64, Name)>,
    /// Removals at or before this clock value are no longer in `removed`.
    removed_floor: u64,
    /// This map's identity for revisions: new for every copy.
    origin: u64,
}

/// A point in a map's history: which map, and its clock then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Revision {
    origin: u64,
    clock: u64,
}

/// Removals remembered for readers that lag behind.
const REMOVED_KEPT: usize = 4096;

/// Mutable accesses remembered for readers that lag behind (a pass makes tens).
const TOUCHED_KEPT: usize = 1 << 14;

/// A new origin (identities only: never part of any output).
fn new_origin() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The keys that may have changed since a revision.
#[derive(Debug)]
pub struct Changes {
    /// Keys present now whose value may differ (or that are new), each once, in no
    /// particular order.
    pub touched: Vec<Name>,
    /// Keys removed since (a key removed and inserted again is in both), oldest first.
    pub removed: Vec<Name>,
}

impl<V> Default for SortedMap<V> {
    fn default() -> Self {
        Self::from_map(IndexMap::default())
    }
}

impl<V: Clone> Clone for SortedMap<V> {
    fn clone(&self) -> Self {
        SortedMap {
            map: self.map.clone(),
            clock: self.clock,
            touched: self.touched.clone(),
            touched_floor: self.touched_floor,
            touched_dropped: self.touched_dropped,
            removed: self.removed.clone(),
            removed_floor: self.removed_floor,
            origin: new_origin(),
        }
    }
}

impl<V: PartialEq> PartialEq for SortedMap<V> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<V: Eq> Eq for SortedMap<V> {}

impl<V> SortedMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    fn from_map(map: Table<V>) -> Self {
        SortedMap {
            map,
            clock: 0,
            touched: Vec::new(),
            touched_floor: 0,
            touched_dropped: 0,
            removed: Vec::new(),
            removed_floor: 0,
            origin: new_origin(),
        }
    }

    /// Logs entry `at` as changed now.
    fn stamp(&mut self, at: usize) {
        self.clock += 1;
        if self.touched.len() == TOUCHED_KEPT {
            let forget = TOUCHED_KEPT / 2;
            self.touched_floor = self.touched[forget - 1].at;
            self.touched.drain(..forget);
            self.touched_dropped += forget as u64;
        }
        let (key, entry) = self.map.get_index_mut(at).expect("in range");
        let (key, before) = (*key, (entry.stamp, entry.logged_at));
        entry.stamp = self.clock;
        entry.logged_at = self.touched_dropped + self.touched.len() as u64;
        self.unmark(before);
        self.touched.push(Access {
            at: self.clock,
            key,
            last: true,
        });
    }

    /// Marks the access logged at `(stamp, logged_at)` (an entry's last) as no longer its
    /// key's last, if the log still holds it.
    fn unmark(&mut self, (stamp, logged_at): (u64, u64)) {
        let place = logged_at.checked_sub(self.touched_dropped);
        let access = place.and_then(|p| self.touched.get_mut(usize::try_from(p).ok()?));
        // A new entry's `(0, 0)` names no access: the clock starts at 1.
        if let Some(access) = access.filter(|a| stamp != 0 && a.at == stamp) {
            access.last = false;
        }
    }

    /// Where this map is in its history.
    pub fn revision(&self) -> Revision {
        Revision {
            origin: self.origin,
            clock: self.clock,
        }
    }

    /// The keys that may have changed since `since`; `None` when that is unknown (a revision
    /// of another map, or older than the removals remembered): the reader must look at
    /// everything.
    pub fn changes_since(&self, since: Revision) -> Option<Changes> {
        if since.origin != self.origin
            || since.clock < self.removed_floor
            || since.clock < self.touched_floor
        {
            return None;
        }
        let from = self.touched.partition_point(|a| a.at <= since.clock);
        // Each present key once: from its last access, in the order of last accesses.
        let touched = self.touched[from..]
            .iter()
            .filter(|a| a.last)
            .map(|a| a.key)
            .collect();
        let from = self.removed.partition_point(|(at, _)| *at <= since.clock);
        let removed = self.removed[from..].iter().map(|(_, k)| *k).collect();
        Some(Changes { touched, removed })
    }

    /// The value of `key`.
    pub fn get(&self, key: &Name) -> Option<&V> {
        self.map.get(key).map(|e| &*e.value)
    }

    /// The value of `key`, mutably.
    pub fn get_mut(&mut self, key: &Name) -> Option<&mut V> {
        let (at, _, _) = self.map.get_full(key)?;
        self.stamp(at);
        Some(&mut *self.map[at].value)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &Name) -> bool {
        self.map.contains_key(key)
    }

    /// Inserts `value` under `key` at its place in key order; returns the previous value.
    pub fn insert(&mut self, key: Name, value: V) -> Option<V> {
        if let Some(old) = self.get_mut(&key) {
            return Some(std::mem::replace(old, value));
        }
        let at = self.map.binary_search_keys(&key).expect_err("absent key");
        self.map.shift_insert(at, key, Entry::new(value));
        self.stamp(at);
        None
    }

    /// The value of `key`, inserting `make()` first if absent.
    pub fn get_or_insert_with(&mut self, key: &Name, make: impl FnOnce() -> V) -> &mut V {
        let at = match self.map.get_index_of(key) {
            Some(at) => at,
            None => {
                let at = self.map.binary_search_keys(key).expect_err("absent key");
                self.map.shift_insert(at, *key, Entry::new(make()));
                at
            }
        };
        self.stamp(at);
        &mut self.map[at].value
    }

    /// Removes `key`, keeping the order of the rest.
    pub fn remove(&mut self, key: &Name) -> Option<V> {
        let (_, key, entry) = self.map.shift_remove_full(key)?;
        self.unmark((entry.stamp, entry.logged_at));
        self.clock += 1;
        if self.removed.len() == REMOVED_KEPT {
            let forget = REMOVED_KEPT / 2;
            self.removed_floor = self.removed[forget - 1].0;
            self.removed.drain(..forget);
        }
        self.removed.push((self.clock, key));
        Some(*entry.value)
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&Name, &V)> + ExactSizeIterator {
        self.map.iter().map(|(k, e)| (k, &*e.value))
    }

    /// Keys in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &Name> + ExactSizeIterator {
        self.map.keys()
    }

    /// Values in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.map.values().map(|e| &*e.value)
    }

    /// Values in key order, mutably.
    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        // Every entry may change: readers from before must look at everything.
        self.clock += 1;
        self.touched_dropped += self.touched.len() as u64;
        self.touched.clear();
        self.touched_floor = self.clock;
        self.map.values_mut().map(|e| &mut *e.value)
    }

    /// The entries of those of `keys` present, in key order (found by hash and ordered by
    /// position: no text is compared, which matters for long names sharing a prefix).
    pub fn in_key_order(&self, keys: impl IntoIterator<Item = Name>) -> Vec<(&Name, &V)> {
        let mut at: Vec<usize> = keys
            .into_iter()
            .filter_map(|k| self.map.get_index_of(&k))
            .collect();
        at.sort_unstable();
        at.dedup();
        at.into_iter()
            .map(|i| {
                let (k, e) = self.map.get_index(i).expect("in range");
                (k, &*e.value)
            })
            .collect()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl<V> std::ops::Index<&Name> for SortedMap<V> {
    type Output = V;
    fn index(&self, key: &Name) -> &V {
        &self.map[key].value
    }
}

impl<V> FromIterator<(Name, V)> for SortedMap<V> {
    fn from_iter<I: IntoIterator<Item = (Name, V)>>(iter: I) -> Self {
        let mut map: Table<V> = iter.into_iter().map(|(k, v)| (k, Entry::new(v))).collect();
        map.sort_unstable_keys();
        Self::from_map(map)
    }
}

impl<V: fmt::Debug> fmt::Debug for SortedMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<V: Serialize> Serialize for SortedMap<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for SortedMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let entries = std::collections::BTreeMap::<Name, V>::deserialize(d)?;
        Ok(entries.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::SortedMap;
    use crate::spec::Name;

    fn n(text: &str) -> Name {
        Name::new(text)
    }

    #[test]
    fn iterates_in_key_order_whatever_the_insertion_order() {
        let mut m = SortedMap::new();
        for k in ["b", "d", "a", "c"] {
            assert_eq!(m.insert(n(k), k.len()), None);
        }
        assert_eq!(m.insert(n("a"), 7), Some(1));
        *m.get_or_insert_with(&n("aa"), || 0) += 2;
        *m.get_or_insert_with(&n("a"), || 0) += 1;
        assert_eq!(m.remove(&n("c")), Some(1));
        let got: Vec<(&str, usize)> = m.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(got, [("a", 8), ("aa", 2), ("b", 1), ("d", 1)]);
        assert_eq!(m[&n("b")], 1);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"{"a":8,"aa":2,"b":1,"d":1}"#);
        let back: SortedMap<usize> = serde_json::from_str(r#"{"d":1,"a":8,"b":1,"aa":2}"#).unwrap();
        assert_eq!(back.keys().collect::<Vec<_>>(), ["a", "aa", "b", "d"]);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u8, u32),
        Bump(u8),
        Touch(u8),
        GetOrInsert(u8),
        Remove(u8),
        /// Every value reached mutably and changed.
        TouchAll,
        /// The map copied (another origin).
        Copy,
        Mark,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0..12u8, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (0..12u8).prop_map(Op::Bump),
            (0..12u8).prop_map(Op::Touch),
            (0..12u8).prop_map(Op::GetOrInsert),
            (0..12u8).prop_map(Op::Remove),
            Just(Op::TouchAll),
            Just(Op::Copy),
            Just(Op::Mark),
        ]
    }

    proptest::proptest! {
        /// Every key whose value changed, appeared or went away since a revision is reported.
        #[test]
        fn changes_since_reports_every_change(ops in proptest::collection::vec(op(), 0..200)) {
            use std::collections::{BTreeMap, BTreeSet};
            let mut m: SortedMap<u32> = SortedMap::new();
            let mut marks: Vec<(super::Revision, BTreeMap<Name, u32>)> = Vec::new();
            // Marks before the last `values_mut` or copy must look at everything.
            let mut all_touched_after = 0;
            for op in ops {
                let key = |k: u8| n(&format!("k{k:02}"));
                match op {
                    Op::Insert(k, v) => { m.insert(key(k), v); }
                    Op::Bump(k) => {
                        if let Some(v) = m.get_mut(&key(k)) {
                            *v = v.wrapping_add(1);
                        }
                    }
                    Op::Touch(k) => { let _ = m.get_mut(&key(k)); }
                    Op::GetOrInsert(k) => { *m.get_or_insert_with(&key(k), || 5) += 1; }
                    Op::Remove(k) => { m.remove(&key(k)); }
                    Op::TouchAll => {
                        m.values_mut().for_each(|v| *v = v.wrapping_add(1));
                        all_touched_after = marks.len();
                    }
                    Op::Copy => { m = m.clone(); all_touched_after = marks.len(); }
                    Op::Mark => {
                        marks.push((m.revision(), m.iter().map(|(k, v)| (*k, *v)).collect()))
                    }
                }
                // An access is marked its key's last exactly when the key is present with
                // that access's stamp (the rule readers once checked by looking keys up).
                for a in &m.touched {
                    let last = m.map.get(&a.key).is_some_and(|e| e.stamp == a.at);
                    proptest::prop_assert_eq!(a.last, last, "{:?}", a);
                }
            }
            let now: BTreeMap<Name, u32> = m.iter().map(|(k, v)| (*k, *v)).collect();
            for (i, (rev, then)) in marks.iter().enumerate() {
                let Some(changes) = m.changes_since(*rev) else {
                    proptest::prop_assert!(i < all_touched_after, "same map, few removals");
                    continue;
                };
                let touched: BTreeSet<Name> = changes.touched.iter().copied().collect();
                let removed: BTreeSet<Name> = changes.removed.iter().copied().collect();
                for (k, v) in &now {
                    if then.get(k) != Some(v) {
                        proptest::prop_assert!(touched.contains(k), "{k} changed");
                    }
                }
                for k in then.keys().filter(|k| !now.contains_key(*k)) {
                    proptest::prop_assert!(removed.contains(k), "{k} removed");
                }
                proptest::prop_assert!(changes.touched.iter().all(|k| now.contains_key(k)));
                proptest::prop_assert_eq!(touched.len(), changes.touched.len(), "each key once");
                proptest::prop_assert!(m.clone().changes_since(*rev).is_none());
            }
            let unchanged = m.changes_since(m.revision()).expect("same map");
            proptest::prop_assert!(unchanged.touched.is_empty() && unchanged.removed.is_empty());
        }
    }

    /// Across the log dropping its older half, a recent reader still finds each changed key
    /// once, and an older one must look at everything.
    #[test]
    fn a_long_log_keeps_the_last_access_of_each_key() {
        let mut m = SortedMap::new();
        let keys: Vec<Name> = (0..50).map(|i| n(&format!("k{i}"))).collect();
        for (i, k) in keys.iter().enumerate() {
            m.insert(*k, i);
        }
        let start = m.revision();
        let mut recent = start;
        for round in 0..super::TOUCHED_KEPT / 10 {
            // A few rounds before the log first drops its older half.
            if round == super::TOUCHED_KEPT / 10 - 8 {
                recent = m.revision();
            }
            for k in &keys[..10] {
                *m.get_mut(k).unwrap() += 1;
            }
        }
        m.remove(&keys[3]);
        *m.get_mut(&keys[20]).unwrap() += 1;
        assert!(m.changes_since(start).is_none());
        let changes = m.changes_since(recent).expect("recent");
        let mut expected: Vec<Name> = keys[..10]
            .iter()
            .copied()
            .filter(|k| *k != keys[3])
            .collect();
        expected.push(keys[20]);
        assert_eq!(changes.touched, expected);
        assert_eq!(changes.removed, [keys[3]]);
    }

    #[test]
    fn readers_older_than_the_removals_kept_must_look_at_everything() {
        let mut m = SortedMap::new();
        let start = m.revision();
        for i in 0..super::REMOVED_KEPT + 1 {
            m.insert(n(&format!("k{i}")), i);
            m.remove(&n(&format!("k{i}")));
        }
        assert!(m.changes_since(start).is_none());
        let recent = m.revision();
        m.insert(n("x"), 1);
        m.remove(&n("x"));
        let changes = m.changes_since(recent).expect("recent");
        assert_eq!(changes.removed, ["x"]);
        assert!(changes.touched.is_empty());
    }
}
