//! The observation indexed for a pass: the entry facts of every listed node and queued
//! resource, and lookups by name and by node id. Carried by the engine from one pass to the
//! next and patched where the inventory changed: a listed object that is the very `Arc` of the
//! previous pass keeps its facts (they depend only on the object and the fleet, fixed for the
//! engine's life). A cache only: patched or built fresh, the index of an observation is the
//! same (a property test checks it), so no pass depends on which observation came before.
//! Its hash maps are only looked up, never iterated in an order that matters.

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

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct ObservedIndex {
    stamp: u64,
    /// Entry facts of `Observation::nodes`, same order.
    pub node_facts: Vec<EntryFacts>,
    /// Entry facts of `Observation::queued_resources`, same order.
    pub qr_facts: Vec<EntryFacts>,
    /// Nodes by name (of two with one name, the later listed).
    pub nodes: FxHashMap<String, Listed<NodeInfo>>,
    /// Queued resources by name (of two with one name, the later listed).
    pub qrs: FxHashMap<String, Listed<QueuedResourceInfo>>,
    /// Queued resources by node id (of two for one node, the later listed).
    pub qr_by_node: FxHashMap<String, Listed<QueuedResourceInfo>>,
}

impl ObservedIndex {
    /// Makes this the index of `obs`, deriving facts only for objects it did not list last.
    pub fn update(&mut self, index: &FleetIndex, obs: &Observation) {
        self.stamp += 1;
        let stamp = self.stamp;
        self.node_facts.clear();
        for n in &obs.nodes {
            let facts = list(&mut self.nodes, &n.name, n, stamp, || index.node_facts(n));
            self.node_facts.push(facts);
        }
        self.qr_facts.clear();
        for q in &obs.queued_resources {
            let facts = list(&mut self.qrs, &q.name, q, stamp, || index.qr_facts(q));
            list(&mut self.qr_by_node, &q.node_id, q, stamp, || facts);
            self.qr_facts.push(facts);
        }
        self.nodes.retain(|_, l| l.stamp == stamp);
        self.qrs.retain(|_, l| l.stamp == stamp);
        self.qr_by_node.retain(|_, l| l.stamp == stamp);
    }
}

/// Lists `info` under `key` in this update and returns its facts: kept if `info` is the
/// object listed there before, else derived (a later object of the same key replaces an
/// earlier one, as a fresh build would).
fn list<T>(
    map: &mut FxHashMap<String, Listed<T>>,
    key: &str,
    info: &Arc<T>,
    stamp: u64,
    facts: impl FnOnce() -> EntryFacts,
) -> EntryFacts {
    let fresh = |facts: EntryFacts| Listed {
        info: info.clone(),
        facts,
        stamp,
    };
    match map.get_mut(key) {
        Some(l) if Arc::ptr_eq(&l.info, info) => {
            l.stamp = stamp;
            l.facts
        }
        Some(l) => {
            *l = fresh(facts());
            l.facts
        }
        None => {
            let f = facts();
            map.insert(key.to_owned(), fresh(f));
            f
        }
    }
}
