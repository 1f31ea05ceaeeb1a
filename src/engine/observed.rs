//! The observation indexed for a pass: the entry facts of every listed node and queued
//! resource, queued resources by name, and per TPU name the node of that name and the queued
//! resource whose node id it is (one lookup finds both). Carried by the engine from one pass
//! to the next and patched where the inventory changed: the listing is walked side by side
//! with the last one (`in_step`), so an object that is the very `Arc` listed before pairs off
//! by position (or, listed elsewhere this time, by its address in a small map of what the
//! walk left over) and keeps its facts (they depend only on the object and the fleet, fixed
//! for the engine's life); only new and vanished objects touch
//! the by-name tables, and the chips held per quota key are recounted only for the TPU names
//! they carry. A cache only: patched or built fresh, the index of an observation is the same
//! (a property test checks it, and so does every chaos step's pass with empty caches), so no
//! pass depends on which observation came before. Its hash maps are only looked up, never
//! iterated in an order that matters.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::fleet_index::{EntryFacts, FleetIndex};
use super::in_step::{self, Step};
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

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct ObservedIndex {
    /// Entry facts of `Observation::nodes`, same order.
    pub node_facts: Vec<EntryFacts>,
    /// Entry facts of `Observation::queued_resources`, same order.
    pub qr_facts: Vec<EntryFacts>,
    /// Per TPU (node) name, what is listed under it.
    tpus: NameMap<Tpu>,
    /// Queued resources by name (of two with one name, the later listed).
    qrs: NameMap<Listed<QueuedResourceInfo>>,
    /// The listing the facts are of (the last update's), walked against the next one.
    listed_nodes: Vec<Arc<NodeInfo>>,
    listed_qrs: Vec<Arc<QueuedResourceInfo>>,
    /// The next update's facts while it carries them over (kept for their buffers).
    next_node_facts: Vec<EntryFacts>,
    next_qr_facts: Vec<EntryFacts>,
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
    /// What `carry` leaves over (kept for its buffers).
    leftovers: Leftovers,
}

/// The positions a walk leaves over on each side, and the leftovers before by address.
#[derive(Debug, Default)]
struct Leftovers {
    after: Vec<usize>,
    before: Vec<usize>,
    by_addr: FxHashMap<usize, usize>,
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
            .and_then(|n| Some((n.facts.quota? as usize, n.info.tpu_type.chips() as i64)));
        let qr = qr
            .filter(|q| qr_holds(&q.info, node_held))
            .and_then(|q| Some((q.facts.quota? as usize, q.info.tpu_type.chips() as i64)));
        [node, qr]
    }
}

impl ObservedIndex {
    /// Makes this the index of `obs`, deriving facts only for objects it did not list last.
    pub fn update(&mut self, index: &FleetIndex, obs: &Observation) {
        self.changed = Some(Vec::new());
        self.changed_entries.clear();
        let nodes = carry(
            (&self.listed_nodes, &self.node_facts),
            &obs.nodes,
            &mut self.next_node_facts,
            &mut self.leftovers,
            |n| index.node_facts(n),
        );
        let qrs = carry(
            (&self.listed_qrs, &self.qr_facts),
            &obs.queued_resources,
            &mut self.next_qr_facts,
            &mut self.leftovers,
            |q| index.qr_facts(q),
        );
        std::mem::swap(&mut self.node_facts, &mut self.next_node_facts);
        std::mem::swap(&mut self.qr_facts, &mut self.next_qr_facts);
        if !(self.distinct && self.patch(index, obs, &nodes, &qrs)) {
            self.changed = None;
            self.rebuild(obs);
        }
        in_step::keep(&mut self.listed_nodes, &obs.nodes);
        in_step::keep(&mut self.listed_qrs, &obs.queued_resources);
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

    /// Patches the tables where `obs` differs from the last observation (`nodes`, `qrs`:
    /// what the walk found new and gone); false (tables left for `rebuild`) if two objects
    /// now share a name, where only listing order decides.
    fn patch(
        &mut self,
        index: &FleetIndex,
        obs: &Observation,
        nodes: &Carried<NodeInfo>,
        qrs: &Carried<QueuedResourceInfo>,
    ) -> bool {
        // Vanished objects leave their names first: every name then holds only objects
        // listed now, so a new object finding its slot taken shares its name.
        let changed = self.changed.get_or_insert_default();
        let entries = &mut self.changed_entries;
        for (gone, facts) in &nodes.gone {
            changed.push(gone.name);
            entries.extend(facts.entries());
            clear_tpu(&mut self.tpus, &gone.name, |t| &mut t.node, gone);
        }
        for (gone, facts) in &qrs.gone {
            changed.push(gone.node_id);
            entries.extend(facts.entries());
            entries.extend(index.declared_qr(&gone.name).map(|d| d.entry));
            clear_tpu(&mut self.tpus, &gone.node_id, |t| &mut t.qr, gone);
            if self
                .qrs
                .get(&gone.name)
                .is_some_and(|l| Arc::ptr_eq(&l.info, gone))
            {
                self.qrs.remove(&gone.name);
            }
        }
        for &i in &nodes.new {
            let (n, facts) = (&obs.nodes[i], self.node_facts[i]);
            changed.push(n.name);
            entries.extend(facts.entries());
            let slot = &mut self.tpus.entry(n.name).or_default().node;
            if slot.is_some() {
                return false;
            }
            *slot = Some(Listed::new(n, facts));
        }
        for &i in &qrs.new {
            let (q, facts) = (&obs.queued_resources[i], self.qr_facts[i]);
            changed.push(q.node_id);
            entries.extend(facts.entries());
            entries.extend(index.declared_qr(&q.name).map(|d| d.entry));
            let slot = &mut self.tpus.entry(q.node_id).or_default().qr;
            if slot.is_some() || self.qrs.contains_key(&q.name) {
                return false;
            }
            *slot = Some(Listed::new(q, facts));
            self.qrs.insert(q.name, Listed::new(q, facts));
        }
        true
    }

    /// Builds the tables afresh from `obs` and the facts carried for it.
    fn rebuild(&mut self, obs: &Observation) {
        self.tpus.clear();
        self.qrs.clear();
        self.distinct = true;
        for (n, &facts) in obs.nodes.iter().zip(&self.node_facts) {
            let slot = &mut self.tpus.entry(n.name).or_default().node;
            self.distinct &= slot.is_none();
            *slot = Some(Listed::new(n, facts));
        }
        for (q, &facts) in obs.queued_resources.iter().zip(&self.qr_facts) {
            let slot = &mut self.tpus.entry(q.node_id).or_default().qr;
            self.distinct &= slot.is_none();
            *slot = Some(Listed::new(q, facts));
            let by_name = Listed::new(q, facts);
            self.distinct &= self.qrs.insert(q.name, by_name).is_none();
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

/// What walking a listing against the last one found: the positions of objects not listed
/// last time, and of the second listing of an object listed twice (their facts derived
/// afresh; `patch` finds the second one's slot taken and leaves the tables to `rebuild`), and
/// the objects listed last time and no longer, with their facts (in the last listing's order).
struct Carried<T> {
    new: Vec<usize>,
    gone: Vec<(Arc<T>, EntryFacts)>,
}

fn addr<T>(object: &Arc<T>) -> usize {
    Arc::as_ptr(object) as usize
}

/// Sets `facts` to the facts of `after`'s objects, in order: carried over from `before` (the
/// last listing, with its facts) for an object listed there, the very same `Arc`; derived by
/// `derive` for any other, and for the second listing of an object `after` lists twice. The
/// walk pairs the objects kept in place; the few it leaves over on both sides are matched by
/// address.
fn carry<T>(
    before: (&[Arc<T>], &[EntryFacts]),
    after: &[Arc<T>],
    facts: &mut Vec<EntryFacts>,
    leftovers: &mut Leftovers,
    derive: impl Fn(&T) -> EntryFacts,
) -> Carried<T> {
    let (before, before_facts) = before;
    facts.clear();
    facts.resize(after.len(), EntryFacts::default());
    let Leftovers {
        after: rest_after,
        before: rest_before,
        by_addr: left,
    } = leftovers;
    rest_after.clear();
    rest_before.clear();
    left.clear();
    in_step::walk(before, after, |step| match step {
        Step::Pairs(i, j, n) => facts[i..i + n].copy_from_slice(&before_facts[j..j + n]),
        Step::After(i) => rest_after.push(i),
        Step::Before(j) => rest_before.push(j),
    });
    // Left over on both sides: the same object, listed elsewhere than last time.
    let matched = !rest_after.is_empty() && !rest_before.is_empty();
    if matched {
        left.extend(rest_before.iter().map(|&j| (addr(&before[j]), j)));
    }
    let mut new = Vec::new();
    for &i in rest_after.iter() {
        // An object listed twice now finds its address taken (paired, or removed here) the
        // second time: it counts as new, as `Carried` says.
        match left.remove(&addr(&after[i])) {
            Some(j) => facts[i] = before_facts[j],
            None => {
                facts[i] = derive(&after[i]);
                new.push(i);
            }
        }
    }
    let gone = rest_before
        .iter()
        .copied()
        .filter(|&j| !matched || left.contains_key(&addr(&before[j])))
        .map(|j| (before[j].clone(), before_facts[j]))
        .collect();
    Carried { new, gone }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::engine::observe::{NodeState, QrState};
    use crate::engine::{Timestamp, synthetic};

    /// An object's address and facts, as a table holds them.
    type Seen = Option<(usize, EntryFacts)>;

    fn seen<T>(listed: &Option<Listed<T>>) -> Seen {
        listed.as_ref().map(|l| (addr(&l.info), l.facts))
    }

    /// The tables of `ix`: per TPU name its node and queued resource, and the queued
    /// resources by name.
    type Tables = (
        BTreeMap<Name, (Seen, Seen)>,
        BTreeMap<Name, (usize, EntryFacts)>,
    );

    fn tables(ix: &ObservedIndex) -> Tables {
        let tpus = ix
            .tpus
            .iter()
            .map(|(n, t)| (*n, (seen(&t.node), seen(&t.qr))));
        let qrs = ix.qrs.iter().map(|(n, l)| (*n, (addr(&l.info), l.facts)));
        (tpus.collect(), qrs.collect())
    }

    /// One edit of a listing: `op` at position `at` (and `to`), `pick` choosing from the pool.
    fn edit<T: Clone>(
        list: &mut Vec<Arc<T>>,
        pool: &[Arc<T>],
        changed: impl Fn(&T) -> T,
        (op, at, to, pick): (u8, usize, usize, usize),
    ) {
        let n = list.len();
        let (at, to) = (at % n.max(1), to % (n + 1));
        match op {
            // Gone.
            0 if n > 0 => {
                list.remove(at);
            }
            // New: a fresh object (maybe one listed before, in a new allocation).
            1 => list.insert(to, Arc::new((*pool[pick % pool.len()]).clone())),
            // Changed: the same name in a new state.
            2 if n > 0 => list[at] = Arc::new(changed(&list[at])),
            // Moved: the very same object elsewhere in the listing.
            3 if n > 0 => {
                let object = list.remove(at);
                list.insert(to.min(n - 1), object);
            }
            // Listed twice: the very same object again.
            4 if n > 0 => list.insert(to, list[at].clone()),
            // Two objects under one name.
            5 if n > 0 => list.insert(to, Arc::new((*list[at]).clone())),
            _ => {}
        }
    }

    /// What may change between two indexes' tables, by TPU name and by queued-resource name.
    fn differing<'t, K: Ord, V: PartialEq>(
        before: &'t BTreeMap<K, V>,
        after: &'t BTreeMap<K, V>,
    ) -> impl Iterator<Item = (&'t K, [Option<&'t V>; 2])> {
        let keys = before.keys().chain(after.keys());
        keys.map(|k| (k, [before.get(k), after.get(k)]))
            .filter(|(_, [b, a])| b != a)
    }

    proptest::proptest! {
        /// Patched from one observation to the next, the index is the index built afresh
        /// for the observation: the same facts in listing order, tables and chips held. It
        /// patches whenever neither observation lists two objects under one name, and then
        /// reports every TPU name whose node or queued resource changed, and every entry
        /// those objects name.
        #[test]
        fn patched_is_built_afresh(
            steps in proptest::collection::vec(
                proptest::collection::vec(
                    (proptest::bool::ANY, 0u8..8, 0usize..64, 0usize..64, 0usize..64),
                    1..4,
                ),
                1..40,
            ),
        ) {
            let epoch = Timestamp::from_secs(1_767_225_600);
            let fleet = synthetic::fleet(6, 2);
            let (_, mut obs) = synthetic::planning_instance(&fleet, 0, 12, epoch);
            let index = FleetIndex::new(fleet);
            let pool = (obs.nodes.clone(), obs.queued_resources.clone());
            let mut kept = ObservedIndex::default();
            kept.update(&index, &obs);
            let mut before = tables(&kept);
            for edits in steps {
                for (nodes, op, at, to, pick) in edits {
                    let step = (op, at, to, pick);
                    if nodes {
                        let preempted = |n: &NodeInfo| NodeInfo {
                            state: NodeState::Preempted,
                            ..n.clone()
                        };
                        edit(&mut obs.nodes, &pool.0, preempted, step);
                    } else {
                        let failed = |q: &QueuedResourceInfo| QueuedResourceInfo {
                            state: QrState::Failed,
                            ..q.clone()
                        };
                        edit(&mut obs.queued_resources, &pool.1, failed, step);
                    }
                }
                let was_distinct = kept.distinct;
                kept.update(&index, &obs);
                let mut fresh = ObservedIndex::default();
                fresh.update(&index, &obs);
                proptest::prop_assert_eq!(&kept.node_facts, &fresh.node_facts);
                proptest::prop_assert_eq!(&kept.qr_facts, &fresh.qr_facts);
                proptest::prop_assert_eq!(kept.held_chips(), fresh.held_chips());
                let after = tables(&fresh);
                proptest::prop_assert_eq!(&tables(&kept), &after);
                proptest::prop_assert_eq!(kept.changed().is_some(), was_distinct && fresh.distinct);
                if let Some(changed) = kept.changed() {
                    let entries = kept.changed_entries();
                    for (name, sides) in differing(&before.0, &after.0) {
                        proptest::prop_assert!(changed.contains(name), "{} not reported", name);
                        let objects = sides.into_iter().flatten().flat_map(|(n, q)| [n, q]);
                        for (_, facts) in objects.flatten() {
                            for e in facts.entries() {
                                let reported = entries.contains(&e);
                                proptest::prop_assert!(reported, "entry {} of {}", e, name);
                            }
                        }
                    }
                    for (name, _) in differing(&before.1, &after.1) {
                        if let Some(d) = index.declared_qr(name) {
                            proptest::prop_assert!(entries.contains(&d.entry), "entry of {}", name);
                        }
                    }
                }
                before = after;
            }
        }
    }
}
