//! `ZonedTable`: the simulated cloud's nodes or queued resources by name, plus the names in
//! each zone in name order, kept in step (a zone is listed, and a capacity pool scanned,
//! without visiting every object). Only inserting and removing change membership, so the
//! indexes cannot drift from the table. Not for iteration in an order that matters: `values`
//! follows the storage slots.

use std::collections::BTreeMap;

use ustr::{Ustr, UstrMap};

/// An object that lives in one zone.
pub(crate) trait InZone {
    fn zone(&self) -> Ustr;
}

/// Objects by name, with a per-zone name index (see the module doc). Objects live in slots;
/// both indexes point at slots, so listing a zone reads its objects without hashing names.
/// Names and zones are interned: found by pointer, ordered by text.
#[derive(Debug)]
pub(crate) struct ZonedTable<T> {
    slots: Vec<Option<T>>,
    /// Empty slots, reused before the table grows.
    free: Vec<usize>,
    by_name: UstrMap<usize>,
    /// Per zone (only looked up), its names in order with their slots and when it last
    /// changed.
    by_zone: UstrMap<Zone>,
    /// Ticks at every change (insert, remove, mutable access).
    clock: u64,
}

/// One zone's objects.
#[derive(Debug, Default)]
struct Zone {
    /// Names in text order (`Ustr` orders by text), with their slots: a tree, since one zone
    /// may hold a backlog of 100k queued resources, inserted and removed one by one.
    names: BTreeMap<Ustr, usize>,
    /// The table's clock at the last change to an object of the zone.
    changed: u64,
}

impl<T> Default for ZonedTable<T> {
    fn default() -> Self {
        ZonedTable {
            slots: Vec::new(),
            free: Vec::new(),
            by_name: UstrMap::default(),
            by_zone: UstrMap::default(),
            clock: 0,
        }
    }
}

impl<T: InZone> ZonedTable<T> {
    /// Inserts `object` under `name` (replacing any object of that name).
    pub(crate) fn insert(&mut self, name: Ustr, object: T) {
        self.remove(name);
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.clock += 1;
        let zone = self.by_zone.entry(object.zone()).or_default();
        zone.changed = self.clock;
        zone.names.insert(name, slot);
        self.slots[slot] = Some(object);
        self.by_name.insert(name, slot);
    }

    pub(crate) fn remove(&mut self, name: Ustr) -> Option<T> {
        let slot = self.by_name.remove(&name)?;
        let object = self.slots[slot].take().expect("indexed slots are full");
        self.free.push(slot);
        self.clock += 1;
        if let Some(zone) = self.by_zone.get_mut(&object.zone()) {
            zone.changed = self.clock;
            zone.names.remove(&name);
        }
        Some(object)
    }

    pub(crate) fn get(&self, name: Ustr) -> Option<&T> {
        self.by_name.get(&name).map(|&slot| self.full(slot))
    }

    /// The slot of `name`: it keeps the object until the object is removed (a later object
    /// may reuse it, so a holder checks it still has the one it expects).
    pub(crate) fn slot_of(&self, name: Ustr) -> Option<usize> {
        self.by_name.get(&name).copied()
    }

    /// The object in `slot`, if any.
    pub(crate) fn at(&self, slot: usize) -> Option<&T> {
        self.slots.get(slot)?.as_ref()
    }

    /// The object named `name`, to change (its zone counts as changed).
    pub(crate) fn get_mut(&mut self, name: Ustr) -> Option<&mut T> {
        let slot = *self.by_name.get(&name)?;
        let object = self.slots[slot].as_mut()?;
        self.clock += 1;
        if let Some(zone) = self.by_zone.get_mut(&object.zone()) {
            zone.changed = self.clock;
        }
        Some(object)
    }

    /// When an object of `zone` last changed (0: never): equal values mean an equal listing.
    pub(crate) fn zone_version(&self, zone: Ustr) -> u64 {
        self.by_zone.get(&zone).map_or(0, |z| z.changed)
    }

    pub(crate) fn contains_key(&self, name: Ustr) -> bool {
        self.by_name.contains_key(&name)
    }

    /// Every object, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }

    /// The objects of `zone`, in name order.
    pub(crate) fn in_zone(&self, zone: Ustr) -> impl Iterator<Item = (Ustr, &T)> {
        self.by_zone
            .get(&zone)
            .into_iter()
            .flat_map(|z| &z.names)
            .map(|(&name, &slot)| (name, self.full(slot)))
    }
}

impl<T> ZonedTable<T> {
    fn full(&self, slot: usize) -> &T {
        self.slots[slot].as_ref().expect("indexed slots are full")
    }
}

impl<T> std::ops::Index<Ustr> for ZonedTable<T> {
    type Output = T;
    fn index(&self, name: Ustr) -> &T {
        self.full(self.by_name[&name])
    }
}
