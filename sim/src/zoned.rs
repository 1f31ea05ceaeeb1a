//! `ZonedTable`: the simulated cloud's nodes or queued resources by name, plus the names in
//! each zone in name order, kept in step (a zone is listed, and a capacity pool scanned,
//! without visiting every object). Only inserting and removing change membership, so the
//! index cannot drift from the table. Not for iteration in an order that matters: `values`
//! follows the hash map.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

/// An object that lives in one zone.
pub(crate) trait InZone {
    fn zone(&self) -> &str;
}

/// Objects by name, with a per-zone name index (see the module doc).
#[derive(Debug)]
pub(crate) struct ZonedTable<T> {
    by_name: FxHashMap<String, T>,
    by_zone: BTreeMap<String, BTreeSet<String>>,
}

impl<T> Default for ZonedTable<T> {
    fn default() -> Self {
        ZonedTable {
            by_name: FxHashMap::default(),
            by_zone: BTreeMap::new(),
        }
    }
}

impl<T: InZone> ZonedTable<T> {
    /// Inserts `object` under `name` (replacing any object of that name).
    pub(crate) fn insert(&mut self, name: String, object: T) {
        self.remove(&name);
        self.by_zone
            .entry(object.zone().to_owned())
            .or_default()
            .insert(name.clone());
        self.by_name.insert(name, object);
    }

    pub(crate) fn remove(&mut self, name: &str) -> Option<T> {
        let object = self.by_name.remove(name)?;
        if let Some(names) = self.by_zone.get_mut(object.zone()) {
            names.remove(name);
        }
        Some(object)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&T> {
        self.by_name.get(name)
    }

    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut T> {
        self.by_name.get_mut(name)
    }

    pub(crate) fn contains_key(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Every object, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.by_name.values()
    }

    /// The objects of `zone`, in name order.
    pub(crate) fn in_zone<'a>(&'a self, zone: &str) -> impl Iterator<Item = (&'a String, &'a T)> {
        self.by_zone
            .get(zone)
            .into_iter()
            .flatten()
            .map(|name| (name, &self.by_name[name]))
    }
}

impl<T> std::ops::Index<&str> for ZonedTable<T> {
    type Output = T;
    fn index(&self, name: &str) -> &T {
        &self.by_name[name]
    }
}
