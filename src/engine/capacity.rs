//! The capacity step of a pass (§3.10): ask the policy for a desired TPU count per managed
//! entry, then create or delete queued resources and nodes to follow it, within chip quotas,
//! idle timeouts and refusal backoffs. Ordinals are recreated under their own names, never
//! substituted. Only entries whose inputs changed since the last pass are sized (the memo's
//! `SizingMemo`); the others would decide nothing again.

use std::collections::{BTreeMap, BTreeSet};

use super::fleet_index::{Declared, EntryFacts};
use super::memo::SizingInputs;
use super::observe::{Action, NodeInfo, Others, QueuedResourceInfo};
use super::observed::{Listed, node_holds, qr_holds};
use super::reconcile::Pass;
use super::state::{OthersTpus, Resource, ResourceStatus};
use crate::spec::{Name, NameSet, ProvisioningModel, TpuType};

/// What the observation and the records hold for one entry.
struct EntryInventory<'a, 's> {
    /// Nodes labelled for the entry (any ordinal): positions in the observation, in order.
    nodes: &'s [u32],
    /// Queued resources labelled for the entry, likewise.
    qrs: &'s [u32],
    /// Per declared ordinal: what is observed under its name.
    slots: &'s [Slot<'a>],
    /// Per declared ordinal: its record is busy.
    busy_ordinals: &'s [bool],
}

/// What the observation holds under a declared ordinal's name: the node of that name and the
/// queued resource whose node id it is (the last one, if several), whatever their labels.
#[derive(Clone, Copy, Default)]
struct Slot<'a> {
    node: Option<(&'a NodeInfo, EntryFacts)>,
    qr: Option<(&'a QueuedResourceInfo, EntryFacts)>,
}

/// What one declared ordinal has, looked up once (the observation does not change in a pass).
struct Ordinal<'q> {
    busy: bool,
    named: bool,
    ready: bool,
    qr: Option<&'q QueuedResourceInfo>,
}

impl Ordinal<'_> {
    fn live(&self) -> bool {
        self.ready || self.qr.is_some_and(|q| q.state.is_live())
    }
}

/// Buffers for sizing one entry, reused from entry to entry.
#[derive(Default)]
struct Scratch<'q> {
    ordinals: Vec<Ordinal<'q>>,
    in_desired: Vec<bool>,
}

/// Positions of observed objects grouped by the entry they are labelled for, in observation
/// order: one flat table, a slice per entry.
struct ByEntry {
    order: Vec<u32>,
    /// `order[start[e]..start[e + 1]]` are entry `e`'s.
    start: Vec<u32>,
}

impl ByEntry {
    fn of(&self, e: usize) -> &[u32] {
        &self.order[self.start[e] as usize..self.start[e + 1] as usize]
    }
}

/// Groups the positions of objects with `facts` by labelled entry, keeping their order (a
/// counting sort).
fn by_entry(facts: &[EntryFacts], n_entries: usize) -> ByEntry {
    let mut start = vec![0u32; n_entries + 1];
    for f in facts {
        if let Some(e) = f.labelled {
            start[e as usize + 1] += 1;
        }
    }
    for e in 0..n_entries {
        start[e + 1] += start[e];
    }
    let mut next = start.clone();
    let mut order = vec![0u32; start[n_entries] as usize];
    for (i, f) in facts.iter().enumerate() {
        if let Some(e) = f.labelled {
            order[next[e as usize] as usize] = i as u32;
            next[e as usize] += 1;
        }
    }
    ByEntry { order, start }
}

/// A listed object and its entry facts, as a slot holds them.
fn with_facts<T>(listed: &Listed<T>) -> (&T, EntryFacts) {
    (&*listed.info, listed.facts)
}

/// What the observation and the records hold under each declared ordinal: for every entry
/// (swept once, laid out as `FleetIndex::ordinal_start` says) when most entries are sized,
/// else looked up for the entry being sized.
struct OrdinalTables<'a> {
    swept: bool,
    slots: Vec<Slot<'a>>,
    busy: Vec<bool>,
}

impl<'a> Pass<'a> {
    pub(super) fn capacity(&mut self) {
        let others = others_tpus(&self.obs.others);
        if others != self.state.others {
            self.state.others = others;
        }
        let desired = std::mem::take(&mut self.desired);
        let named = std::mem::take(&mut self.named);
        // Free chips per quota key, counted when a sizing first wants more TPUs.
        let mut free = None;
        let index = self.index;
        let n_entries = index.fleet.tpus.len();
        let counts = |e: usize| (index.ordinals[e].len() as u32, desired.get(e).copied());
        for e in (0..n_entries).filter(|&e| !index.entry(e).is_adopted()) {
            if let (count, Some(asked)) = counts(e)
                && asked > count
            {
                self.violation(format!(
                    "policy {} asked for {asked} TPUs of entry {} (count {count})",
                    self.policy.name(),
                    index.entry(e).id
                ));
            }
        }
        // Only entries whose inputs may have changed are sized; the others would decide
        // nothing again and only repeat their wake-up (see `SizingMemo`). Sizing an entry
        // never changes what a later one reads: it deletes objects and touches records only
        // under names listed for it or unlisted, which, on a pass that skips entries (no two
        // objects share a name), no other entry's listed objects carry.
        let due = self.memo.sizing.due(&SizingInputs {
            index,
            state: self.state,
            observed: self.observed,
            desired: &desired,
            named: &named,
            deleted: &self.deleted,
            now: self.now,
        });
        // Objects labelled for each entry, in observation order: one counting sort over the
        // observation's facts (flat tables, a slice per entry: a table per entry was an
        // allocation each).
        let nodes = by_entry(self.node_facts, n_entries);
        let qrs = by_entry(self.qr_facts, n_entries);
        let mut tables = self.ordinal_tables(&due);
        let mut scratch = Scratch::default();
        for (e, due) in due.into_iter().enumerate() {
            if index.entry(e).is_adopted() {
                continue;
            }
            if !due {
                if let Some(at) = self.memo.sizing.kept_wake(e) {
                    self.wake_at(at);
                }
                continue;
            }
            let (slots, busy_ordinals) = self.ordinals_of(e, &mut tables);
            let (count, asked) = counts(e);
            let seen = EntryInventory {
                nodes: nodes.of(e),
                qrs: qrs.of(e),
                slots,
                busy_ordinals,
            };
            let actions = self.out.actions.len();
            let events = self.out.events.len();
            let wake = self.out.next_wake.take();
            let asked = asked.unwrap_or(0).min(count);
            let wanted = self.size_entry(e, asked, &named, &seen, &mut free, &mut scratch);
            let own_wake = self.out.next_wake;
            self.out.next_wake = wake;
            if let Some(at) = own_wake {
                self.wake_at(at);
            }
            let acted = self.out.actions.len() > actions || self.out.events.len() > events;
            self.memo.sizing.sized(e, acted, own_wake, wanted);
        }
    }

    /// The ordinal tables: swept for every entry when most entries are due (a lookup per
    /// ordinal costs more then), else empty.
    fn ordinal_tables(&self, due: &[bool]) -> OrdinalTables<'a> {
        let index = self.index;
        let swept = due.iter().filter(|d| **d).count() * 4 > due.len();
        let n_ordinals = if swept {
            index.ordinal_start[index.fleet.tpus.len()]
        } else {
            0
        };
        let mut tables = OrdinalTables {
            swept,
            slots: vec![Slot::default(); n_ordinals],
            busy: vec![false; n_ordinals],
        };
        if !swept {
            return tables;
        }
        let ordinal_at =
            |d: Declared| index.ordinal_start[d.entry as usize] + d.ordinal as usize - 1;
        for (n, seen) in self.obs.nodes.iter().zip(self.node_facts) {
            if let Some(d) = seen.declared.filter(|d| d.ordinal > 0) {
                tables.slots[ordinal_at(d)].node = Some((n, *seen));
            }
        }
        for (q, seen) in self.obs.queued_resources.iter().zip(self.qr_facts) {
            if let Some(d) = seen.declared.filter(|d| d.ordinal > 0) {
                tables.slots[ordinal_at(d)].qr = Some((q, *seen));
            }
        }
        // Sizing never changes whether a record is busy (it only deletes or re-provisions
        // idle ones), so the table stays true through the step.
        for (id, _) in self.state.resources.iter().filter(|(_, r)| r.is_busy()) {
            if let Some(d) = index.declared(id)
                && d.ordinal > 0
            {
                tables.busy[ordinal_at(d)] = true;
            }
        }
        tables
    }

    /// Entry `e`'s ordinals in the tables, or looked up one by one into them.
    fn ordinals_of<'t>(
        &self,
        e: usize,
        tables: &'t mut OrdinalTables<'a>,
    ) -> (&'t [Slot<'a>], &'t [bool]) {
        let index = self.index;
        if tables.swept {
            let range = index.ordinal_start[e]..index.ordinal_start[e + 1];
            return (&tables.slots[range.clone()], &tables.busy[range]);
        }
        tables.slots.clear();
        tables.busy.clear();
        for name in &index.ordinals[e] {
            let tpu = self.observed.tpu(name);
            tables.slots.push(Slot {
                node: tpu.and_then(|t| t.node.as_ref()).map(with_facts),
                qr: tpu.and_then(|t| t.qr.as_ref()).map(with_facts),
            });
            let record = self.state.resources.get(name);
            tables.busy.push(record.is_some_and(Resource::is_busy));
        }
        (&tables.slots, &tables.busy)
    }

    /// Chips still free per quota key (as `FleetIndex::quotas`): the limit minus chips of
    /// live inventory, whoever created it.
    fn remaining_chips(&self) -> Vec<i64> {
        let index = self.index;
        let mut reserved = match self.observed.held_chips() {
            Some(held) => held.to_vec(),
            None => self.held_by_listing(),
        };
        // Someone else's TPUs in a fleet zone hold the same quota.
        for held in &self.state.others {
            if let Some(k) = index.quota_at(held.model, &held.tpu_type, held.zone) {
                reserved[k] += i64::from(held.count) * held.tpu_type.chips() as i64;
            }
        }
        index
            .quotas
            .iter()
            .zip(reserved)
            .map(|((_, limit), used)| (i64::from(*limit) - used).max(0))
            .collect()
    }

    /// Chips held per quota key, counted over the listing object by object (when two
    /// listed objects share a name, so the observation index keeps no count).
    fn held_by_listing(&self) -> Vec<i64> {
        let mut held = vec![0i64; self.index.quotas.len()];
        let node_counts = |node: &NodeInfo| {
            let tpu = self.observed.tpu(&node.name);
            node_holds(node, tpu.and_then(|t| t.qr.as_ref()).map(|q| &*q.info))
        };
        for (node, facts) in self.obs.nodes.iter().zip(self.node_facts) {
            if let Some(k) = facts.quota
                && node_counts(node)
            {
                held[k as usize] += node.tpu_type.chips() as i64;
            }
        }
        for (qr, facts) in self.obs.queued_resources.iter().zip(self.qr_facts) {
            let tpu = self.observed.tpu(&qr.node_id);
            let node_held = tpu
                .and_then(|t| t.node.as_ref())
                .is_some_and(|n| node_counts(&n.info));
            if let Some(k) = facts.quota
                && qr_holds(qr, node_held)
            {
                held[k as usize] += qr.tpu_type.chips() as i64;
            }
        }
        held
    }

    fn idle_timeout_elapsed(&mut self, resource_id: &Name) -> bool {
        let timeout = self.index.fleet.idle_timeout_seconds as i64;
        if timeout == 0 {
            return true;
        }
        let now = self.now;
        let Some(r) = self.state.resources.get(resource_id) else {
            return true;
        };
        match r.idle_since {
            Some(since) if now.elapsed_since(since, timeout) => true,
            Some(since) => {
                self.wake_at(since.plus_secs(timeout));
                false
            }
            None => {
                let r = self.state.resources.get_mut(resource_id).expect("exists");
                r.idle_since = Some(now);
                self.wake_at(now.plus_secs(timeout));
                false
            }
        }
    }

    fn mark_deleted(&mut self, resource_id: &Name) {
        let now = self.now;
        if let Some(r) = self.state.resources.get_mut(resource_id)
            && r.owner.is_none()
        {
            let _ = r.release(ResourceStatus::Deleted, now);
            r.idle_since = None;
        }
    }

    /// Sizes entry `e` towards `desired` TPUs; true when it wanted more than it holds (it
    /// then read `free`, counted on first use, and spent from it what it created).
    fn size_entry(
        &mut self,
        e: usize,
        desired: u32,
        named: &NameSet,
        seen: &EntryInventory<'a, '_>,
        free: &mut Option<Vec<i64>>,
        scratch: &mut Scratch<'a>,
    ) -> bool {
        // Nodes and queued resources labelled for the entry, in observation order, with facts.
        let (obs, node_facts, qr_facts) = (self.obs, self.node_facts, self.qr_facts);
        let matching_nodes = || {
            let at = |&i: &u32| (&*obs.nodes[i as usize], node_facts[i as usize]);
            seen.nodes.iter().map(at)
        };
        let matching_qrs = || {
            let at = |&i: &u32| (&*obs.queued_resources[i as usize], qr_facts[i as usize]);
            seen.qrs.iter().map(at)
        };
        let busy_ordinals = seen.busy_ordinals;
        let e32 = e as u32;
        let index = self.index;
        let entry = index.entry(e);
        let ordinals: &[Name] = &index.ordinals[e];
        let qr_names: &[Name] = &index.qr_names[e];
        let busy_name =
            |p: &Pass<'_>, name: &Name| p.state.resources.get(name).is_some_and(Resource::is_busy);

        let Scratch {
            ordinals: facts,
            in_desired,
        } = scratch;
        facts.clear();
        facts.extend(
            ordinals
                .iter()
                .zip(qr_names)
                .zip(busy_ordinals)
                .zip(seen.slots)
                .map(|(((name, qr_name), &busy), slot)| {
                    Ordinal {
                        busy,
                        named: !named.is_empty() && named.contains(name),
                        // Ready: its node, labelled for the entry, is ready, and no ended request
                        // stands behind it.
                        ready: slot
                            .node
                            .is_some_and(|(n, s)| s.labelled == Some(e32) && self.ready(n))
                            && slot.qr.is_none_or(|(q, _)| q.state.is_live()),
                        // Its own request: named `qr-<name>`, labelled for the entry.
                        qr: slot
                            .qr
                            .filter(|(q, s)| s.labelled == Some(e32) && q.name == *qr_name)
                            .map(|(q, _)| q),
                    }
                }),
        );
        // Ordinal preference: busy, named by a pending job, live, then the rest (minus ones
        // behind a terminal queued resource, which must be cleaned up first). The first
        // `desired` of them form the desired set.
        in_desired.clear();
        in_desired.resize(facts.len(), false);
        let mut chosen = 0;
        let tiers: [fn(&Ordinal<'_>) -> bool; 4] = [
            |o| o.busy,
            |o| o.named,
            |o| o.live(),
            |o| o.qr.is_none_or(|q| q.state.is_live()),
        ];
        'tiers: for tier in tiers {
            for (i, o) in facts.iter().enumerate() {
                if chosen == desired as usize {
                    break 'tiers;
                }
                if !in_desired[i] && tier(o) {
                    in_desired[i] = true;
                    chosen += 1;
                }
            }
        }
        // Whether an object, by the declaration of its node name, is an ordinal of this entry
        // in the desired set.
        let desired_has = |seen: &EntryFacts| {
            seen.declared.is_some_and(|d| {
                d.entry as usize == e && d.ordinal > 0 && in_desired[d.ordinal as usize - 1]
            })
        };

        if desired == 0 {
            let mut just_deleted = NameSet::default();
            for (node, _) in matching_nodes() {
                if self.ready(node)
                    && !busy_name(self, &node.name)
                    && self.idle_timeout_elapsed(&node.name)
                {
                    self.delete_node(&node.name, &node.zone);
                    self.mark_deleted(&node.name);
                    just_deleted.insert(node.name);
                    self.event(
                        "idle_spot_tpu_deleted",
                        None,
                        Some(&node.name),
                        None,
                        "reason=no_pending_or_running_jobs".into(),
                    );
                }
            }
            for (qr, _) in matching_qrs().filter(|(q, _)| !q.state.is_deleting()) {
                let node = self
                    .observed
                    .tpu(&qr.node_id)
                    .and_then(|t| t.node.as_ref())
                    .map(|n| &*n.info);
                let drop = match node {
                    None => true,
                    Some(n) => !self.ready(n) || just_deleted.contains(&n.name),
                };
                if drop && !busy_name(self, &qr.node_id) {
                    self.delete_qr(&qr.name, &qr.zone);
                    self.event(
                        "idle_spot_queued_resource_deleted",
                        None,
                        Some(&qr.node_id),
                        None,
                        String::new(),
                    );
                }
            }
            self.clear_notice(format_args!("chip_limit:{}", entry.id));
            return false;
        }

        // Ready nodes outside the desired set: kept until their idle timeout.
        let mut retained = BTreeSet::new();
        for (node, node_seen) in matching_nodes() {
            if desired_has(&node_seen) || !self.ready(node) || busy_name(self, &node.name) {
                continue;
            }
            if self.idle_timeout_elapsed(&node.name) {
                self.delete_node(&node.name, &node.zone);
                self.mark_deleted(&node.name);
                self.event(
                    "undeclared_spot_tpu_deleted",
                    None,
                    Some(&node.name),
                    None,
                    "reason=capacity_target_reduced".into(),
                );
            } else {
                retained.insert(node.name);
            }
        }
        for (qr, qr_seen) in matching_qrs().filter(|(q, _)| !q.state.is_deleting()) {
            // In the desired set, its node id is this entry's ordinal: its own request?
            let outside = !desired_has(&qr_seen)
                || qr_seen
                    .declared
                    .is_none_or(|d| qr.name != qr_names[d.ordinal as usize - 1]);
            if outside && !retained.contains(&qr.node_id) && !busy_name(self, &qr.node_id) {
                self.delete_qr(&qr.name, &qr.zone);
                self.event(
                    "undeclared_spot_queued_resource_deleted",
                    None,
                    Some(&qr.node_id),
                    None,
                    String::new(),
                );
            }
        }
        // Clean up desired ordinals whose TPU or request ended (in name order).
        for &i in index.in_name_order[e].iter().filter(|&&i| in_desired[i]) {
            let name = &ordinals[i];
            let node_terminal = seen.slots[i]
                .node
                .is_some_and(|(n, _)| n.state.is_terminal());
            if let Some(qr) = facts[i].qr
                && !qr.state.is_deleting()
                && (node_terminal || !qr.state.is_live())
            {
                self.delete_qr(&qr.name, &qr.zone);
                let reason = if node_terminal {
                    "reason=tpu_not_ready"
                } else {
                    "reason=queued_resource_terminal"
                };
                self.event(
                    "queued_resource_deleted",
                    None,
                    Some(name),
                    None,
                    reason.into(),
                );
            }
        }
        let current = facts
            .iter()
            .zip(in_desired.iter())
            .filter(|(o, d)| {
                **d && (o.ready
                    || o.qr
                        .is_some_and(|q| q.state.is_live() && !self.deleted.contains(&q.name)))
            })
            .count() as u32;
        let mut missing = desired.saturating_sub(current);
        if missing == 0 {
            self.clear_notice(format_args!("chip_limit:{}", entry.id));
            return false;
        }
        let chips = entry.chips_per_tpu() as i64;
        let quota = index.quota_of(e);
        let remaining = free.get_or_insert_with(|| self.remaining_chips());
        let available = remaining[quota];
        let allowed = (available / chips.max(1)) as u32;
        if missing > allowed {
            self.notice(
                format!("chip_limit:{}", entry.id),
                format!(
                    "entry={}; chip_limit={}; available_chips={available}; wanted {missing} more TPUs",
                    entry.id, entry.chip_limit
                ),
                "tpu_chip_limit_reached",
                None,
            );
            missing = allowed;
        } else {
            self.clear_notice(format_args!("chip_limit:{}", entry.id));
        }
        if let Some(backoff) = self.state.entry_backoff.get(&entry.id).cloned()
            && backoff.until > self.now
        {
            self.wake_at(backoff.until);
            return true;
        }
        for (i, name) in ordinals.iter().enumerate() {
            if missing == 0 {
                break;
            }
            if !in_desired[i] {
                continue;
            }
            let qr_name = qr_names[i];
            // Anything listed under the name: its node, or a request for it.
            let present = self.observed.tpu(name).is_some()
                || self.observed.qr_named(&qr_name).is_some()
                || self.deleted.contains(name)
                || self.deleted.contains(&qr_name);
            if present {
                continue;
            }
            let Some(runtime) = entry.runtime.clone() else {
                break;
            };
            self.out.actions.push(Action::CreateQueuedResource {
                name: qr_name,
                node_id: *name,
                zone: entry.zone,
                tpu_type: entry.tpu_type.clone(),
                runtime,
                entry_id: entry.id,
                model: entry.provisioning_model,
                reservation: entry.reservation.clone(),
            });
            self.track_provisioning(e, name);
            remaining[quota] -= chips;
            self.event(
                "queued_resource_created",
                None,
                Some(name),
                None,
                match entry.provisioning_model {
                    crate::spec::ProvisioningModel::Spot => format!("entry={}", entry.id),
                    model => format!("entry={}; model={}", entry.id, model.as_str()),
                },
            );
            missing -= 1;
        }
        true
    }

    /// Record a TPU being provisioned under `name` (new or reset).
    fn track_provisioning(&mut self, e: usize, name: &Name) {
        let entry = self.index.entry(e);
        let r = self.state.resources.get_or_insert_with(name, || {
            Resource::new(*name, entry, ResourceStatus::Provisioning, 1)
        });
        if r.owner.is_none() {
            r.status = ResourceStatus::Provisioning;
            r.idle_since = None;
            r.provisioning_node_seen_at = None;
            r.provisioning_node_missing_since = None;
            r.capacity_wait_since = None;
        }
    }
}

/// The TPUs of `others` that hold chips, counted by pool, by the rule the runner's own follow:
/// a node holds chips unless it is terminal or its queued resource is not live; a live queued
/// resource holds them unless its node already counts.
pub(crate) fn others_tpus(others: &Others) -> Vec<OthersTpus> {
    if others.is_empty() {
        return Vec::new();
    }
    let live_qr: rustc_hash::FxHashMap<(Name, Name), bool> = others
        .queued_resources
        .iter()
        .map(|q| ((q.zone, q.node_id), q.state.is_live()))
        .collect();
    let holding: rustc_hash::FxHashSet<(Name, Name)> = others
        .nodes
        .iter()
        .filter(|n| {
            !n.state.is_terminal() && live_qr.get(&(n.zone, n.name)).is_none_or(|live| *live)
        })
        .map(|n| (n.zone, n.name))
        .collect();
    let mut counts: BTreeMap<(Name, TpuType, ProvisioningModel), u32> = BTreeMap::new();
    let nodes = others
        .nodes
        .iter()
        .filter(|n| holding.contains(&(n.zone, n.name)))
        .map(|n| (n.zone, n.tpu_type.clone(), n.model()));
    let requests = others
        .queued_resources
        .iter()
        .filter(|q| q.state.is_live() && !holding.contains(&(q.zone, q.node_id)))
        .map(|q| (q.zone, q.tpu_type.clone(), q.model()));
    for key in nodes.chain(requests) {
        *counts.entry(key).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|((zone, tpu_type, model), count)| OthersTpus {
            zone,
            tpu_type,
            model,
            count,
        })
        .collect()
}
