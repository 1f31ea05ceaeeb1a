//! The observation indexed for a pass: the entry facts of every listed node and queued
//! resource, queued resources by name, and per TPU name the node of that name and the queued
//! resource whose node id it is (one lookup finds both). Carried by the engine from one pass
//! to the next and patched where the inventory changed: a listed object that is the very
//! `Arc` of the previous pass is found by its address (no name is hashed or compared) and
//! keeps its facts (they depend only on the object and the fleet, fixed for the engine's
//! life); only new and vanished objects touch the by-name tables, and the chips held per
//! quota key are recounted only for the TPU names they carry. A cache only: patched or
//! built fresh, the index of an observation is the same (a property test checks it), so no
//! pass depends on which observation came before. Its hash maps are only looked up, never
//! iterated in an order that matters.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::fleet_index::{EntryFacts, FleetIndex};
use super::observe::{NodeInfo, Observation, QueuedResourceInfo};
use crate::spec::{Name, NameMap};

/// A listed object with its entry facts.
#[derive(Debug)]
pub(crate) struct Listed<T> {
    pub info: Arc<T>,
    pub facts: EntryFacts,
}

/// What is listed under one TPU name.
#[derive(Debug, Default)]
pub(crate) struct Tpu {
    /// The node of that name (of two, the later listed).
    pub node: Option<Listed<NodeInfo>>,
    /// The queued resource whose node id it is (of two, the later listed).
    pub qr: Option<Listed<QueuedResourceInfo>>,
}

impl<T> Listed<T> {
    fn new(info: &Arc<T>, facts: EntryFacts) -> Self {
        Listed {
            info: info.clone(),
            facts,
        }
    }
}

/// A listed object, by address: its facts and the last update that listed it. Holding the
/// `Arc` keeps the address from being reused while it is a key.
#[derive(Debug)]
struct Known<T> {
    info: Arc<T>,
    facts: EntryFacts,
    seen: u64,
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
    tpus: NameMap<Tpu>,
    /// Queued resources by name (of two with one name, the later listed).
    qrs: NameMap<Listed<QueuedResourceInfo>>,
    /// Listed nodes and queued resources by address.
    known_nodes: FxHashMap<usize, Known<NodeInfo>>,
    known_qrs: FxHashMap<usize, Known<QueuedResourceInfo>>,
    /// The last update listed no two objects under one name (so each name holds the only
    /// object listed under it, and patching needs no order).
    distinct: bool,
    /// TPU names whose node or queued resource the last update found new or gone; `None`
    /// when it rebuilt the tables (any name may have changed).
    changed: Option<Vec<Name>>,
    /// The entries those objects name or are labelled for (see `changed_entries`).
    changed_entries: Vec<u32>,
    /// Chips held per quota key (as `FleetIndex::quotas`) by the listed objects, and what
    /// each TPU name contributes to them: kept from the changed names while `distinct`.
    held: Vec<i64>,
    held_by: NameMap<Held>,
}

/// The chips a TPU name's node and queued resource hold: (quota key, chips) of each.
type Held = [Option<(usize, i64)>; 2];

/// Whether a node holds its chips: it is not terminal, and the queued resource listed under
/// its name, if any, is live.
pub(crate) fn node_holds(node: &NodeInfo, qr: Option<&QueuedResourceInfo>) -> bool {
    !node.state.is_terminal() && qr.is_none_or(|q| q.state.is_live())
}

/// Whether a queued resource holds its chips: it is live and the node listed under its node
/// id does not already hold them (`node_held`).
pub(crate) fn qr_holds(qr: &QueuedResourceInfo, node_held: bool) -> bool {
    qr.state.is_live() && !node_held
}

impl Tpu {
    /// The chips this TPU's node and queued resource hold, by quota key.
    fn held(&self) -> Held {
        let qr = self.qr.as_ref();
        let node_held = self
            .node
            .as_ref()
            .is_some_and(|n| node_holds(&n.info, qr.map(|q| &*q.info)));
        let node = self
            .node
            .as_ref()
            .filter(|_| node_held)
            .and_then(|n| Some((n.facts.quota?, n.info.tpu_type.chips() as i64)));
        let qr = qr
            .filter(|q| qr_holds(&q.info, node_held))
            .and_then(|q| Some((q.facts.quota?, q.info.tpu_type.chips() as i64)));
        [node, qr]
    }
}

impl ObservedIndex {
    /// Makes this the index of `obs`, deriving facts only for objects it did not list last.
    pub fn update(&mut self, index: &FleetIndex, obs: &Observation) {
        self.stamp += 1;
        self.changed = Some(Vec::new());
        self.changed_entries.clear();
        if !(self.distinct && self.patch(index, obs)) {
            self.changed = None;
            self.rebuild(index, obs);
        }
        self.count_held(index);
    }

    /// Brings the chips held up to date: from the changed names' TPUs after a patch, from
    /// every TPU after a rebuild.
    fn count_held(&mut self, index: &FleetIndex) {
        if !self.distinct {
            return;
        }
        let add = |held: &mut [i64], h: &Held, sign: i64| {
            for (k, chips) in h.iter().flatten() {
                held[*k] += sign * chips;
            }
        };
        match &self.changed {
            Some(names) => {
                for name in names {
                    if let Some(old) = self.held_by.remove(name) {
                        add(&mut self.held, &old, -1);
                    }
                    if let Some(new) = self.tpus.get(name).map(Tpu::held)
                        && new != [None, None]
                    {
                        add(&mut self.held, &new, 1);
                        self.held_by.insert(*name, new);
                    }
                }
            }
            None => {
                self.held = vec![0; index.quotas.len()];
                self.held_by.clear();
                for (name, tpu) in &self.tpus {
                    let h = tpu.held();
                    if h != [None, None] {
                        add(&mut self.held, &h, 1);
                        self.held_by.insert(*name, h);
                    }
                }
            }
        }
    }

    /// Patches the tables where `obs` differs from the last observation; false (tables left
    /// for `rebuild`) if two objects now share a name, where only listing order decides.
    fn patch(&mut self, index: &FleetIndex, obs: &Observation) -> bool {
        let stamp = self.stamp;
        let new_nodes = seen_or_new(
            &mut self.known_nodes,
            &obs.nodes,
            stamp,
            &mut self.node_facts,
        );
        let new_qrs = seen_or_new(
            &mut self.known_qrs,
            &obs.queued_resources,
            stamp,
            &mut self.qr_facts,
        );
        // Vanished objects leave their names first: every name then holds only objects
        // listed now, so a new object finding its slot taken shares its name.
        let changed = self.changed.get_or_insert_default();
        let entries = &mut self.changed_entries;
        for (gone, facts) in forget_unseen(&mut self.known_nodes, stamp) {
            changed.push(gone.name);
            entries.extend(facts.entries());
            clear_tpu(&mut self.tpus, &gone.name, |t| &mut t.node, &gone);
        }
        for (gone, facts) in forget_unseen(&mut self.known_qrs, stamp) {
            changed.push(gone.node_id);
            entries.extend(facts.entries());
            entries.extend(index.declared_qr(&gone.name).map(|d| d.entry as u32));
            clear_tpu(&mut self.tpus, &gone.node_id, |t| &mut t.qr, &gone);
            if self
                .qrs
                .get(&gone.name)
                .is_some_and(|l| Arc::ptr_eq(&l.info, &gone))
            {
                self.qrs.remove(&gone.name);
            }
        }
        for i in new_nodes {
            let n = &obs.nodes[i];
            let facts = index.node_facts(n);
            self.node_facts[i] = facts;
            changed.push(n.name);
            entries.extend(facts.entries());
            let slot = &mut self.tpus.entry(n.name).or_default().node;
            if slot.is_some() {
                return false;
            }
            *slot = Some(Listed::new(n, facts));
            remember(&mut self.known_nodes, n, facts, stamp);
        }
        for i in new_qrs {
            let q = &obs.queued_resources[i];
            let facts = index.qr_facts(q);
            self.qr_facts[i] = facts;
            changed.push(q.node_id);
            entries.extend(facts.entries());
            entries.extend(index.declared_qr(&q.name).map(|d| d.entry as u32));
            let slot = &mut self.tpus.entry(q.node_id).or_default().qr;
            if slot.is_some() || self.qrs.contains_key(&q.name) {
                return false;
            }
            *slot = Some(Listed::new(q, facts));
            self.qrs.insert(q.name, Listed::new(q, facts));
            remember(&mut self.known_qrs, q, facts, stamp);
        }
        true
    }

    /// Builds the tables afresh (facts of objects listed before are kept).
    fn rebuild(&mut self, index: &FleetIndex, obs: &Observation) {
        let stamp = self.stamp;
        let old_nodes = std::mem::take(&mut self.known_nodes);
        let old_qrs = std::mem::take(&mut self.known_qrs);
        self.tpus.clear();
        self.qrs.clear();
        self.distinct = true;
        self.node_facts.clear();
        for n in &obs.nodes {
            let facts = old_nodes
                .get(&addr(n))
                .map_or_else(|| index.node_facts(n), |k| k.facts);
            let slot = &mut self.tpus.entry(n.name).or_default().node;
            self.distinct &= slot.is_none();
            *slot = Some(Listed::new(n, facts));
            remember(&mut self.known_nodes, n, facts, stamp);
            self.node_facts.push(facts);
        }
        self.qr_facts.clear();
        for q in &obs.queued_resources {
            let facts = old_qrs
                .get(&addr(q))
                .map_or_else(|| index.qr_facts(q), |k| k.facts);
            let slot = &mut self.tpus.entry(q.node_id).or_default().qr;
            self.distinct &= slot.is_none();
            *slot = Some(Listed::new(q, facts));
            let by_name = Listed::new(q, facts);
            self.distinct &= self.qrs.insert(q.name, by_name).is_none();
            remember(&mut self.known_qrs, q, facts, stamp);
            self.qr_facts.push(facts);
        }
    }

    /// The TPU names under which the last update found a new or vanished node or queued
    /// resource (in no particular order, possibly repeated); `None`: any name may have changed.
    pub fn changed(&self) -> Option<&[Name]> {
        self.changed.as_deref()
    }

    /// The entries the objects found new or gone by the last update name (their node name or
    /// node id, or their own queued resource name, is declared for it) or are labelled or
    /// matched for (in no particular order, possibly repeated); meaningful only when
    /// `changed` is known.
    pub fn changed_entries(&self) -> &[u32] {
        &self.changed_entries
    }

    /// Chips held per quota key (as `FleetIndex::quotas`) by the listed nodes and queued
    /// resources (`node_holds`, `qr_holds`); `None` when two listed objects share a name
    /// (the caller counts the listing itself).
    pub fn held_chips(&self) -> Option<&[i64]> {
        self.distinct.then_some(&self.held[..])
    }

    /// What is listed under TPU name `name`.
    pub fn tpu(&self, name: &Name) -> Option<&Tpu> {
        self.tpus.get(name)
    }

    /// The queued resource named `name`.
    pub fn qr_named(&self, name: &Name) -> Option<&Listed<QueuedResourceInfo>> {
        self.qrs.get(name)
    }
}

/// Records `info`, with its facts, as listed by update `seen`.
fn remember<T>(
    known: &mut FxHashMap<usize, Known<T>>,
    info: &Arc<T>,
    facts: EntryFacts,
    seen: u64,
) {
    let known_info = Known {
        info: info.clone(),
        facts,
        seen,
    };
    known.insert(addr(info), known_info);
}

fn addr<T>(object: &Arc<T>) -> usize {
    Arc::as_ptr(object) as usize
}

/// Marks the objects of `listed` seen by update `stamp` and sets `facts` to theirs, in order;
/// returns the positions of objects not known yet (their facts still to derive).
fn seen_or_new<T>(
    known: &mut FxHashMap<usize, Known<T>>,
    listed: &[Arc<T>],
    stamp: u64,
    facts: &mut Vec<EntryFacts>,
) -> Vec<usize> {
    facts.clear();
    let mut new = Vec::new();
    for (i, object) in listed.iter().enumerate() {
        match known.get_mut(&addr(object)) {
            // Listed twice in one observation: the tables cannot say which came later.
            Some(k) if k.seen == stamp => {
                new.push(i);
                facts.push(k.facts);
            }
            Some(k) => {
                k.seen = stamp;
                facts.push(k.facts);
            }
            None => {
                new.push(i);
                facts.push(EntryFacts::default());
            }
        }
    }
    new
}

/// Removes the objects update `stamp` did not list, returning them with their facts.
fn forget_unseen<T>(
    known: &mut FxHashMap<usize, Known<T>>,
    stamp: u64,
) -> Vec<(Arc<T>, EntryFacts)> {
    let mut gone = Vec::new();
    known.retain(|_, k| {
        let keep = k.seen == stamp;
        if !keep {
            gone.push((k.info.clone(), k.facts));
        }
        keep
    });
    gone
}

/// Empties the `part` of TPU `name` if it holds `object`, and drops the TPU once empty.
fn clear_tpu<T>(
    tpus: &mut NameMap<Tpu>,
    name: &Name,
    part: impl Fn(&mut Tpu) -> &mut Option<Listed<T>>,
    object: &Arc<T>,
) {
    let Some(tpu) = tpus.get_mut(name) else {
        return;
    };
    let slot = part(tpu);
    if slot.as_ref().is_some_and(|l| Arc::ptr_eq(&l.info, object)) {
        *slot = None;
    }
    if tpu.node.is_none() && tpu.qr.is_none() {
        tpus.remove(name);
    }
}
