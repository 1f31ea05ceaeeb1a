//! `ZonedTable`: the simulated cloud's nodes or queued resources by name, plus the names in
//! each zone in name order, kept in step (a zone is listed, and a capacity pool scanned,
//! without visiting every object). Only inserting and removing change membership, so the
//! indexes cannot drift from the table. Not for iteration in an order that matters: `values`
//! follows the storage slots. Each zone also keeps a bounded log of the names it changed,
//! so that a reader holding an older listing can bring it up to date object by object.

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
    /// The names changed, with the clock of each change, oldest first: every change after
    /// `log_from` (older entries are dropped as the log outgrows the zone).
    log: Vec<(u64, Ustr)>,
    log_from: u64,
}

/// Log entries a zone keeps at least (beyond twice its size, half the log is dropped).
const LOG_KEPT: usize = 64;

impl Zone {
    /// Notes a change of `name` at `clock` (a change of the name logged last moves that
    /// entry to `clock`: the log still names every change after any version).
    fn note(&mut self, clock: u64, name: Ustr) {
        self.changed = clock;
        match self.log.last_mut() {
            Some(last) if last.1 == name => last.0 = clock,
            _ => self.log.push((clock, name)),
        }
        if self.log.len() > LOG_KEPT.max(2 * self.names.len()) {
            let cut = self.log.len() / 2;
            self.log_from = self.log[cut - 1].0;
            self.log.drain(..cut);
        }
    }
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
        zone.names.insert(name, slot);
        zone.note(self.clock, name);
        self.slots[slot] = Some(object);
        self.by_name.insert(name, slot);
    }

    pub(crate) fn remove(&mut self, name: Ustr) -> Option<T> {
        let slot = self.by_name.remove(&name)?;
        let object = self.slots[slot].take().expect("indexed slots are full");
        self.free.push(slot);
        self.clock += 1;
        if let Some(zone) = self.by_zone.get_mut(&object.zone()) {
            zone.names.remove(&name);
            zone.note(self.clock, name);
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
            zone.note(self.clock, name);
        }
        Some(object)
    }

    /// When an object of `zone` last changed (0: never): equal values mean an equal listing.
    pub(crate) fn zone_version(&self, zone: Ustr) -> u64 {
        self.by_zone.get(&zone).map_or(0, |z| z.changed)
    }

    /// The names of `zone` changed since its version `since` (inserted, removed or accessed
    /// mutably; in order of change, possibly repeated); `None` when the zone's log no longer
    /// reaches back that far.
    pub(crate) fn changed_since(
        &self,
        zone: Ustr,
        since: u64,
    ) -> Option<impl Iterator<Item = Ustr>> {
        let log = match self.by_zone.get(&zone) {
            Some(z) if since >= z.log_from => &z.log[z.log.partition_point(|&(c, _)| c <= since)..],
            Some(_) => return None,
            None => &[][..],
        };
        Some(log.iter().map(|&(_, name)| name))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Object(Ustr);

    impl InZone for Object {
        fn zone(&self) -> Ustr {
            self.0
        }
    }

    fn changed(table: &ZonedTable<Object>, zone: Ustr, since: u64) -> Option<Vec<&'static str>> {
        Some(
            table
                .changed_since(zone, since)?
                .map(|n| n.as_str())
                .collect(),
        )
    }

    #[test]
    fn the_log_names_what_changed_since_a_version() {
        let (a, b) = (Ustr::from("zone-a"), Ustr::from("zone-b"));
        let mut table = ZonedTable::default();
        table.insert(Ustr::from("x"), Object(a));
        let v1 = table.zone_version(a);
        table.insert(Ustr::from("y"), Object(a));
        table.insert(Ustr::from("z"), Object(b));
        table.get_mut(Ustr::from("x"));
        let v2 = table.zone_version(a);
        table.remove(Ustr::from("y"));
        assert_eq!(changed(&table, a, 0), Some(vec!["x", "y", "x", "y"]));
        assert_eq!(changed(&table, a, v1), Some(vec!["y", "x", "y"]));
        assert_eq!(changed(&table, a, v2), Some(vec!["y"]));
        // Changes of one name in a row are logged once, at the last.
        let v3 = table.zone_version(a);
        table.get_mut(Ustr::from("x"));
        let v4 = table.zone_version(a);
        table.get_mut(Ustr::from("x"));
        assert_eq!(changed(&table, a, v2), Some(vec!["y", "x"]));
        assert_eq!(changed(&table, a, v3), Some(vec!["x"]));
        assert_eq!(changed(&table, a, v4), Some(vec!["x"]));
        assert_eq!(changed(&table, a, table.zone_version(a)), Some(vec![]));
        assert_eq!(changed(&table, b, 0), Some(vec!["z"]));
        assert_eq!(changed(&table, Ustr::from("zone-c"), 0), Some(vec![]));
    }

    #[test]
    fn a_log_that_outgrew_its_zone_answers_only_recent_versions() {
        let zone = Ustr::from("zone-a");
        let names = [Ustr::from("x"), Ustr::from("y")];
        let mut table = ZonedTable::default();
        table.insert(names[0], Object(zone));
        table.insert(names[1], Object(zone));
        let first = table.zone_version(zone);
        let mut versions = vec![first];
        for i in 0..1000 {
            table.get_mut(names[i % 2]);
            versions.push(table.zone_version(zone));
        }
        assert_eq!(changed(&table, zone, first), None);
        // Whatever it still answers is every change since, and it answers the recent ones.
        let answered: Vec<usize> = (versions.iter().enumerate())
            .filter_map(|(i, v)| Some((i, table.changed_since(zone, *v)?.count())))
            .map(|(i, count)| {
                assert_eq!(count, versions.len() - 1 - i);
                i
            })
            .collect();
        assert!(answered.len() >= LOG_KEPT / 2 && answered.len() <= LOG_KEPT + 1);
        assert_eq!(answered.last(), Some(&1000));
    }
}
