//! `SortedMap`: a string-keyed map that iterates in key order, like `BTreeMap`, and looks keys
//! up by hash. The state's job and TPU-record tables use it: a pass looks them up thousands of
//! times (a `BTreeMap` lookup compares long shared-prefix names a dozen times) and iterates
//! them in id order. Inserting a new key or removing one shifts the entries after it (O(n)),
//! which is rare (a job arrives or ends, a TPU name is first seen). Must not expose any way to
//! put a key out of order.

use std::borrow::Borrow;
use std::fmt;
use std::hash::BuildHasherDefault;

use indexmap::IndexMap;
use rustc_hash::FxHasher;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A map from `String` to `V` kept in key order (see the module doc). Values are boxed so
/// that shifting entries moves pointers, not records (a 100k-job queue stays cheap to
/// insert into).
#[derive(Clone, PartialEq, Eq)]
pub struct SortedMap<V> {
    map: IndexMap<String, Box<V>, BuildHasherDefault<FxHasher>>,
}

impl<V> Default for SortedMap<V> {
    fn default() -> Self {
        SortedMap {
            map: IndexMap::default(),
        }
    }
}

impl<V> SortedMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        String: Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.map.get(key).map(|v| &**v)
    }

    /// The value of `key`, mutably.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        String: Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.map.get_mut(key).map(|v| &mut **v)
    }

    /// Whether `key` is present.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        String: Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.map.contains_key(key)
    }

    /// Inserts `value` under `key` at its place in key order; returns the previous value.
    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        if let Some(old) = self.map.get_mut(&key) {
            return Some(std::mem::replace(&mut **old, value));
        }
        let at = self.map.binary_search_keys(&key).expect_err("absent key");
        self.map.shift_insert(at, key, Box::new(value));
        None
    }

    /// The value of `key`, inserting `make()` first if absent.
    pub fn get_or_insert_with(&mut self, key: &str, make: impl FnOnce() -> V) -> &mut V {
        let at = match self.map.get_index_of(key) {
            Some(at) => at,
            None => {
                let at = self
                    .map
                    .binary_search_keys(&key.to_owned())
                    .expect_err("absent key");
                self.map.shift_insert(at, key.to_owned(), Box::new(make()));
                at
            }
        };
        &mut self.map[at]
    }

    /// Removes `key`, keeping the order of the rest.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        String: Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.map.shift_remove(key).map(|v| *v)
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&String, &V)> + ExactSizeIterator {
        self.map.iter().map(|(k, v)| (k, &**v))
    }

    /// Keys in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &String> + ExactSizeIterator {
        self.map.keys()
    }

    /// Values in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.map.values().map(|v| &**v)
    }

    /// Values in key order, mutably.
    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        self.map.values_mut().map(|v| &mut **v)
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

impl<V> std::ops::Index<&str> for SortedMap<V> {
    type Output = V;
    fn index(&self, key: &str) -> &V {
        &self.map[key]
    }
}

impl<V> std::ops::Index<&String> for SortedMap<V> {
    type Output = V;
    fn index(&self, key: &String) -> &V {
        &self.map[key.as_str()]
    }
}

impl<V> FromIterator<(String, V)> for SortedMap<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(iter: I) -> Self {
        let mut map: IndexMap<String, Box<V>, BuildHasherDefault<FxHasher>> =
            iter.into_iter().map(|(k, v)| (k, Box::new(v))).collect();
        map.sort_unstable_keys();
        SortedMap { map }
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
        let entries = std::collections::BTreeMap::<String, V>::deserialize(d)?;
        Ok(entries.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::SortedMap;

    #[test]
    fn iterates_in_key_order_whatever_the_insertion_order() {
        let mut m = SortedMap::new();
        for k in ["b", "d", "a", "c"] {
            assert_eq!(m.insert(k.to_owned(), k.len()), None);
        }
        assert_eq!(m.insert("a".to_owned(), 7), Some(1));
        *m.get_or_insert_with("aa", || 0) += 2;
        *m.get_or_insert_with("a", || 0) += 1;
        assert_eq!(m.remove("c"), Some(1));
        let got: Vec<(&str, usize)> = m.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(got, [("a", 8), ("aa", 2), ("b", 1), ("d", 1)]);
        assert_eq!(m["b"], 1);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"{"a":8,"aa":2,"b":1,"d":1}"#);
        let back: SortedMap<usize> = serde_json::from_str(r#"{"d":1,"a":8,"b":1,"aa":2}"#).unwrap();
        assert_eq!(back.keys().collect::<Vec<_>>(), ["a", "aa", "b", "d"]);
    }
}
