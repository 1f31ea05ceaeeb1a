//! The observation indexed for a pass: the entry facts of every listed node and queued
//! resource, queued resources by name, and per TPU name the node of that name and the queued
//! resource whose node id it is (one lookup finds both). Carried by the engine from one pass
//! to the next and patched where the inventory changed: a listed object that is the very
//! `Arc` of the previous pass keeps its facts (they depend only on the object and the fleet,
//! fixed for the engine's life). A cache only: patched or built fresh, the index of an
//! observation is the same (a property test checks it), so no pass depends on which
//! observation came before. Its hash maps are only looked up, never iterated in an order that
//! matters.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::fleet_index::{EntryFacts, FleetIndex};
use super::observe::{NodeInfo, Observation, QueuedResourceInfo};

/// A listed object with its entry facts.
#[derive(Debug)]
pub(crate) struct Listed<T> {
    pub info: Arc<T>,
    pub facts: EntryFacts,
    /// The last update that listed it.
    stamp: u64,
}

/// What is listed under one TPU name.
#[derive(Debug, Default)]
pub(crate) struct Tpu {
    /// The node of that name (of two, the later listed).
    pub node: Option<Listed<NodeInfo>>,
    /// The queued resource whose node id it is (of two, the later listed).
    pub qr: Option<Listed<QueuedResourceInfo>>,
}

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct ObservedIndex {
    stamp: u64,
    /// Entry facts of `Observation::nodes`, same order.
    pub node_facts: Vec<EntryFacts>,
    /// Entry facts of `Observation::queued_resources`, same order.
    pub qr_facts: Vec<EntryFacts>,
    /// Per TPU (node) name, what is listed under it.
    tpus: FxHashMap<String, Tpu>,
    /// Queued resources by name (of two with one name, the later listed).
    qrs: FxHashMap<String, Option<Listed<QueuedResourceInfo>>>,
}

impl ObservedIndex {
    /// Makes this the index of `obs`, deriving facts only for objects it did not list last.
    pub fn update(&mut self, index: &FleetIndex, obs: &Observation) {
        self.stamp += 1;
        let stamp = self.stamp;
        self.node_facts.clear();
        for n in &obs.nodes {
            let facts = list_under(
                &mut self.tpus,
                &n.name,
                |t| &mut t.node,
                n,
                stamp,
                || index.node_facts(n),
            );
            self.node_facts.push(facts);
        }
        self.qr_facts.clear();
        for q in &obs.queued_resources {
            let facts = list_under(
                &mut self.qrs,
                &q.name,
                |l| l,
                q,
                stamp,
                || index.qr_facts(q),
            );
            list_under(
                &mut self.tpus,
                &q.node_id,
                |t| &mut t.qr,
                q,
                stamp,
                || facts,
            );
            self.qr_facts.push(facts);
        }
        self.tpus.retain(|_, t| {
            forget_unlisted(&mut t.node, stamp);
            forget_unlisted(&mut t.qr, stamp);
            t.node.is_some() || t.qr.is_some()
        });
        self.qrs.retain(|_, l| {
            forget_unlisted(l, stamp);
            l.is_some()
        });
    }

    /// What is listed under TPU name `name`.
    pub fn tpu(&self, name: &str) -> Option<&Tpu> {
        self.tpus.get(name)
    }

    /// The queued resource named `name`.
    pub fn qr_named(&self, name: &str) -> Option<&Listed<QueuedResourceInfo>> {
        self.qrs.get(name)?.as_ref()
    }
}

/// Empties `slot` unless update `stamp` listed its object.
fn forget_unlisted<T>(slot: &mut Option<Listed<T>>, stamp: u64) {
    if slot.as_ref().is_some_and(|l| l.stamp != stamp) {
        *slot = None;
    }
}

/// Lists `info` in the `part` of the value under `key` (created empty if absent): see `list`.
fn list_under<V: Default, T>(
    map: &mut FxHashMap<String, V>,
    key: &str,
    part: impl Fn(&mut V) -> &mut Option<Listed<T>>,
    info: &Arc<T>,
    stamp: u64,
    facts: impl FnOnce() -> EntryFacts,
) -> EntryFacts {
    if let Some(value) = map.get_mut(key) {
        return list(part(value), info, stamp, facts);
    }
    let mut value = V::default();
    let facts = list(part(&mut value), info, stamp, facts);
    map.insert(key.to_owned(), value);
    facts
}

/// Lists `info` in `slot` for this update and returns its facts: kept if `info` is the object
/// listed there before, else derived (a later object for the same slot replaces an earlier
/// one, as a fresh build would).
fn list<T>(
    slot: &mut Option<Listed<T>>,
    info: &Arc<T>,
    stamp: u64,
    facts: impl FnOnce() -> EntryFacts,
) -> EntryFacts {
    match slot {
        Some(l) if Arc::ptr_eq(&l.info, info) => {
            l.stamp = stamp;
            l.facts
        }
        _ => {
            let facts = facts();
            *slot = Some(Listed {
                info: info.clone(),
                facts,
                stamp,
            });
            facts
        }
    }
}
