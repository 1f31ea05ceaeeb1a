//! Facts derived once from the fleet: declared node names per entry, which entry a node or
//! queued resource belongs to (§3.2 entry match), chip quotas, and the inventory scope the
//! drivers read (zones to list, adopted TPUs to fetch by name). Pure and cheap to query.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use super::observe::{LABEL_FLEET_ENTRY, LABEL_MANAGED_BY, NodeInfo, QueuedResourceInfo};
use super::state::{Resource, State};
use crate::spec::{
    EntryKind, FleetSpec, Name, NameMap, NameSet, ProvisioningModel, QuotaKey, TpuEntry, TpuType,
    names,
};

/// Where a declared node name comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Declared {
    /// Index of the entry in `fleet.tpus` (32 bits, as the facts' other entry indexes).
    pub entry: u32,
    /// Managed ordinal (1-based); 0 for an adopted TPU.
    pub ordinal: u32,
}

/// The fleet plus everything derived from it.
#[derive(Clone, Debug)]
pub struct FleetIndex {
    /// The fleet.
    pub fleet: FleetSpec,
    /// Declared node names: adopted `existing` names and managed ordinals `1..=count`
    /// (hashed: only looked up, never iterated; `ordinals` lists them in order).
    declared: NameMap<Declared>,
    /// Managed ordinal node names per entry (empty for adopted entries), ordinal order.
    pub ordinals: Vec<Vec<Name>>,
    /// The name of each ordinal's own queued resource (`qr-<node>`), as `ordinals`.
    pub qr_names: Vec<Vec<Name>>,
    /// Per entry, its ordinals' positions in `ordinals` sorted by node name.
    pub in_name_order: Vec<Vec<usize>>,
    /// Where each entry's ordinals start when all entries' ordinals are laid end to end
    /// (one more item: the total).
    pub ordinal_start: Vec<usize>,
    /// Declared ordinals by the name of their own queued resource (hashed: only looked up).
    declared_qr: NameMap<Declared>,
    /// Entry index by id (hashed: only looked up, never iterated).
    by_id: NameMap<usize>,
    /// The same by the id's text: a label's value is looked up without the interner (whose
    /// table is shared and locked, and large in a long simulation).
    by_id_text: rustc_hash::FxHashMap<&'static str, usize>,
    /// Every quota key of the fleet with its chip limit, in key order.
    pub quotas: Vec<(QuotaKey, u32)>,
    /// Each entry's position in `quotas`.
    entry_quota: Vec<usize>,
    /// Positions in `quotas` by provisioning model and zone, with each key's quota family
    /// (an observed object's key is found without building one).
    quota_by_zone: rustc_hash::FxHashMap<(ProvisioningModel, Name), Vec<(String, usize)>>,
    /// Zones of the managed entries (listed on every pass).
    managed_zones: BTreeSet<Name>,
    /// The same zones, hashed (only looked up).
    managed_zone_set: NameSet,
    /// The adopted entries' TPUs as `(zone, name)` (fetched by name on every pass).
    adopted_tpus: Vec<(Name, Name)>,
    /// Each entry's stockout-memory pool (`zone/type/model`), formatted once.
    pool_keys: Vec<String>,
    /// Some managed entry is on-demand or reserved: jobs take those only after waiting for
    /// Spot (`policy.on_demand_after`, `reserved_after`).
    pub has_fallback: bool,
    /// Entries by region, and by region and type, each in fleet order: a requirement's
    /// entries are among those of its regions (and types), so finding them costs those
    /// entries, not the fleet (hashed: only looked up).
    by_region: rustc_hash::FxHashMap<String, Vec<u32>>,
    by_region_type: rustc_hash::FxHashMap<(String, TpuType), Vec<u32>>,
}

impl FleetIndex {
    /// Builds the index.
    pub fn new(fleet: FleetSpec) -> FleetIndex {
        let mut declared = NameMap::default();
        let mut ordinals = Vec::with_capacity(fleet.tpus.len());
        for (i, entry) in fleet.tpus.iter().enumerate() {
            match &entry.kind {
                EntryKind::Adopted { existing } => {
                    declared.insert(
                        Name::new(existing),
                        Declared {
                            entry: i as u32,
                            ordinal: 0,
                        },
                    );
                    ordinals.push(Vec::new());
                }
                EntryKind::Managed { count } => {
                    let names: Vec<Name> = (1..=*count)
                        .map(|k| Name::new(&entry.node_name(&fleet.name, k)))
                        .collect();
                    for (k, name) in names.iter().enumerate() {
                        declared.insert(
                            *name,
                            Declared {
                                entry: i as u32,
                                ordinal: k as u32 + 1,
                            },
                        );
                    }
                    ordinals.push(names);
                }
            }
        }
        let by_id = fleet
            .tpus
            .iter()
            .enumerate()
            .map(|(i, e)| (e.id, i))
            .collect();
        let by_id_text = fleet
            .tpus
            .iter()
            .enumerate()
            .map(|(i, e)| (e.id.as_str(), i))
            .collect();
        let qr_names: Vec<Vec<Name>> = ordinals
            .iter()
            .map(|names| {
                names
                    .iter()
                    .map(|n| names::queued_resource_name(n))
                    .collect()
            })
            .collect();
        let in_name_order = ordinals
            .iter()
            .map(|names| {
                let mut order: Vec<usize> = (0..names.len()).collect();
                order.sort_by_key(|&i| names[i]);
                order
            })
            .collect();
        let mut ordinal_start = vec![0];
        for names in &ordinals {
            ordinal_start.push(ordinal_start.last().copied().unwrap_or(0) + names.len());
        }
        let declared_qr = qr_names
            .iter()
            .zip(&ordinals)
            .flat_map(|(qrs, nodes)| qrs.iter().zip(nodes))
            .filter_map(|(qr, node)| Some((*qr, *declared.get(node)?)))
            .collect();
        let quotas: Vec<(QuotaKey, u32)> = fleet.chip_limits().into_iter().collect();
        let entry_quota = fleet
            .tpus
            .iter()
            .map(|e| {
                let key = e.quota_key();
                quotas.partition_point(|(k, _)| *k < key)
            })
            .collect();
        let mut quota_by_zone: rustc_hash::FxHashMap<
            (ProvisioningModel, Name),
            Vec<(String, usize)>,
        > = Default::default();
        for (i, (key, _)) in quotas.iter().enumerate() {
            quota_by_zone
                .entry((key.model, Name::new(&key.zone)))
                .or_default()
                .push((key.family.clone(), i));
        }
        let managed_zones: BTreeSet<Name> = fleet
            .tpus
            .iter()
            .filter(|e| !e.is_adopted())
            .map(|e| e.zone)
            .collect();
        let adopted_tpus = (fleet.tpus.iter())
            .filter_map(|e| match &e.kind {
                EntryKind::Adopted { existing } => Some((e.zone, Name::new(existing))),
                EntryKind::Managed { .. } => None,
            })
            .collect();
        let fleet_pools = fleet
            .tpus
            .iter()
            .map(super::state::PoolMemory::key)
            .collect();
        let has_fallback = fleet
            .tpus
            .iter()
            .any(|e| !e.is_adopted() && e.provisioning_model != ProvisioningModel::Spot);
        let mut by_region: rustc_hash::FxHashMap<String, Vec<u32>> = Default::default();
        let mut by_region_type: rustc_hash::FxHashMap<(String, TpuType), Vec<u32>> =
            Default::default();
        for (i, e) in fleet.tpus.iter().enumerate() {
            let region = region_of(&e.zone).to_owned();
            by_region_type
                .entry((region.clone(), e.tpu_type.clone()))
                .or_default()
                .push(i as u32);
            by_region.entry(region).or_default().push(i as u32);
        }
        FleetIndex {
            by_region,
            by_region_type,
            has_fallback,
            fleet,
            declared,
            ordinals,
            qr_names,
            in_name_order,
            ordinal_start,
            declared_qr,
            by_id,
            by_id_text,
            quotas,
            entry_quota,
            quota_by_zone,
            managed_zone_set: managed_zones.iter().copied().collect(),
            adopted_tpus,
            managed_zones,
            pool_keys: fleet_pools,
        }
    }

    /// The entries `req` may accept, a superset in fleet order: those of its regions and,
    /// when it names types, of those types (`Requirement::accepts_entry` decides).
    pub fn candidates(&self, req: &super::demand::Requirement<'_>) -> Vec<u32> {
        let regions: Vec<&str> = match req.regions {
            super::state::RegionChoice::Pinned(r) => vec![r],
            super::state::RegionChoice::AnyOf(list) => {
                list.iter().map(|b| b.region.as_str()).collect()
            }
        };
        let mut out: Vec<u32> = Vec::new();
        for region in regions {
            match req.tpu {
                crate::spec::TpuRequest::Any => {
                    out.extend(self.by_region.get(region).into_iter().flatten())
                }
                crate::spec::TpuRequest::OneOf(types) => {
                    for t in types {
                        out.extend(
                            self.by_region_type
                                .get(&(region.to_owned(), t.clone()))
                                .into_iter()
                                .flatten(),
                        );
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Where declared node `name` comes from.
    pub fn declared(&self, name: &Name) -> Option<Declared> {
        self.declared.get(name).copied()
    }

    /// The declared ordinal whose own queued resource is named `name`.
    pub fn declared_qr(&self, name: &Name) -> Option<Declared> {
        self.declared_qr.get(name).copied()
    }

    /// The entry at `index`.
    pub fn entry(&self, index: usize) -> &TpuEntry {
        &self.fleet.tpus[index]
    }

    /// The stockout-memory pool of the entry at `index` (`PoolMemory::key`).
    pub fn pool_key(&self, index: usize) -> &str {
        &self.pool_keys[index]
    }

    /// The runner name.
    pub fn runner(&self) -> &str {
        &self.fleet.name
    }

    /// The entry index of `entry_id`.
    pub fn entry_index(&self, entry_id: &Name) -> Option<usize> {
        self.by_id.get(entry_id).copied()
    }

    /// Entry match for a queued resource: its node id must be a declared managed ordinal of
    /// an entry with the same zone, type, model and labels, and the name must be `qr-<node>`.
    pub fn queued_resource_entry(&self, qr: &QueuedResourceInfo) -> Option<usize> {
        self.qr_facts(qr).entry.map(|e| e as usize)
    }

    /// Everything the fleet says about an observed node (see `EntryFacts`), its labels read
    /// once.
    pub fn node_facts(&self, node: &NodeInfo) -> EntryFacts {
        let declared = self.declared(&node.name);
        let label_entry = self.label_entry(&node.labels);
        let same_place = |e: &TpuEntry| e.zone == node.zone && e.tpu_type == node.tpu_type;
        let entry = declared.and_then(|d| {
            let entry = self.entry(d.entry as usize);
            let model_ok = entry.provisioning_model == node.model();
            // Entry ids are unique: the `fleet-entry` label names this entry exactly when it
            // resolves to its index.
            let labels_ok = entry.is_adopted() || label_entry == Some(d.entry as usize);
            (same_place(entry) && model_ok && labels_ok).then_some(d.entry)
        });
        EntryFacts {
            declared,
            entry,
            labelled: self.labelled(label_entry, same_place),
            quota: self
                .quota_at(node.model(), &node.tpu_type, node.zone)
                .map(|k| k as u32),
        }
    }

    /// Everything the fleet says about an observed queued resource (declared by its node id).
    pub fn qr_facts(&self, qr: &QueuedResourceInfo) -> EntryFacts {
        let declared = self.declared(&qr.node_id);
        let label_entry = self.label_entry(&qr.labels);
        let same_place = |e: &TpuEntry| e.zone == qr.zone && e.tpu_type == qr.tpu_type;
        let entry = declared.and_then(|d| {
            let entry = self.entry(d.entry as usize);
            let ok = !entry.is_adopted()
                && d.ordinal > 0
                && qr.name.strip_prefix(names::QR_PREFIX) == Some(qr.node_id.as_str())
                && same_place(entry)
                && qr.model() == entry.provisioning_model
                && label_entry == Some(d.entry as usize);
            ok.then_some(d.entry)
        });
        EntryFacts {
            declared,
            entry,
            labelled: self.labelled(label_entry, same_place),
            quota: self
                .quota_at(qr.model(), &qr.tpu_type, qr.zone)
                .map(|k| k as u32),
        }
    }

    /// The entry named by the `fleet-entry` label of an object labelled `managed-by` this
    /// runner.
    fn label_entry(&self, labels: &BTreeMap<String, String>) -> Option<usize> {
        if labels.get(LABEL_MANAGED_BY).map(String::as_str) != Some(self.runner()) {
            return None;
        }
        let id = labels.get(LABEL_FLEET_ENTRY)?;
        self.by_id_text.get(id.as_str()).copied()
    }

    /// The managed entry an object is labelled for, any ordinal (including ones above
    /// `count`, so a lowered count drains the extra TPUs) and any provisioning model (so
    /// TPUs of an entry whose model changed are drained too): labelled by this runner for a
    /// managed entry of the same zone and type.
    fn labelled(
        &self,
        label_entry: Option<usize>,
        same_place: impl Fn(&TpuEntry) -> bool,
    ) -> Option<u32> {
        let e = label_entry?;
        let entry = self.entry(e);
        (!entry.is_adopted() && same_place(entry)).then_some(e as u32)
    }

    /// True when a record still belongs to the fleet: its entry exists with the same zone and
    /// type, and it is adopted exactly when the entry is (the record's name must match the
    /// adopted entry's `existing`).
    pub fn owns_record(&self, resource: &Resource) -> Option<usize> {
        let index = self.entry_index(&resource.entry_id)?;
        entry_owns(self.entry(index), resource).then_some(index)
    }

    /// True when the record is declared: owned and, if managed, one of ordinals `1..=count`.
    /// (Entry ids are unique, so the declared name's entry is the record's entry.)
    pub fn is_declared(&self, resource: &Resource) -> bool {
        self.declared
            .get(&resource.tpu_name)
            .is_some_and(|d| self.declares(self.entry(d.entry as usize), resource))
    }

    /// Whether `entry`, the one declaring the record's name, declares the record itself.
    pub(crate) fn declares(&self, entry: &TpuEntry, resource: &Resource) -> bool {
        entry.id == resource.entry_id && entry_owns(entry, resource)
    }

    /// What the drivers read for the next observation: every node and queued resource
    /// labelled for this runner in the zones of the managed entries and of live managed
    /// records (one list per zone and kind, so the cost of a read grows with zones, not with
    /// ordinals), plus adopted TPUs by exact name (they carry no labels of ours). Records whose
    /// entry was removed keep their zone listed, so their TPUs are cleaned up, not orphaned.
    /// Sweeps every record; the engine keeps what they add from pass to pass instead
    /// (`Engine::inventory_scope`).
    pub fn inventory_scope<'s>(&'s self, state: &'s State) -> InventoryScope<'s> {
        let adds = state.resources.values().filter_map(|r| self.scope_add(r));
        self.scope_with(adds)
    }

    /// What record `r` adds to the fleet's own inventory scope, if anything: a live adopted
    /// TPU to fetch by name, or the zone of a live managed record that no entry lists (its
    /// entry was removed or changed).
    pub(crate) fn scope_add(&self, r: &Resource) -> Option<ScopeAdd> {
        if r.status.is_gone() {
            None
        } else if r.adopted {
            Some(ScopeAdd::Adopted(r.zone, r.tpu_name))
        } else if !self.managed_zone_set.contains(&r.zone) {
            Some(ScopeAdd::Zone(r.zone))
        } else {
            None
        }
    }

    /// The fleet's inventory scope widened by what records add (repeats allowed).
    pub(crate) fn scope_with(
        &self,
        adds: impl IntoIterator<Item = ScopeAdd>,
    ) -> InventoryScope<'_> {
        // The managed zones, copied only when a record adds one.
        let mut zones = Cow::Borrowed(&self.managed_zones);
        let mut adopted: BTreeSet<(&str, &str)> = (self.adopted_tpus.iter())
            .map(|(zone, name)| (zone.as_str(), name.as_str()))
            .collect();
        for add in adds {
            match add {
                ScopeAdd::Adopted(zone, name) => {
                    adopted.insert((zone.as_str(), name.as_str()));
                }
                ScopeAdd::Zone(zone) => {
                    zones.to_mut().insert(zone);
                }
            }
        }
        InventoryScope {
            runner: self.runner(),
            zones,
            adopted,
        }
    }

    /// The position in `quotas` of entry `index`'s quota key.
    pub fn quota_of(&self, index: usize) -> usize {
        self.entry_quota[index]
    }

    /// The position in `quotas` of the quota key of an object of `tpu_type` in `zone`, if
    /// the fleet has one.
    pub(crate) fn quota_at(
        &self,
        model: ProvisioningModel,
        tpu_type: &TpuType,
        zone: Name,
    ) -> Option<usize> {
        let family = tpu_type.quota_family();
        self.quota_by_zone
            .get(&(model, zone))?
            .iter()
            .find(|(f, _)| f == family)
            .map(|&(_, i)| i)
    }
}

/// Which fleet entry an observed node or queued resource belongs to, derived once per listed
/// object (the observation index carries them from pass to pass).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntryFacts {
    /// Where its node name (a queued resource's node id) is declared.
    pub declared: Option<Declared>,
    /// Entry match (§3.2). A node: managed entries need the same zone, type, provisioning
    /// model and the runner's labels; adopted entries the exact name, zone, type and model. A
    /// queued resource: its node id a declared managed ordinal of an entry with the same
    /// zone, type, model and labels, and its name `qr-<node>`.
    pub entry: Option<u32>,
    /// The managed entry it is labelled for, any ordinal and model.
    pub labelled: Option<u32>,
    /// The position in `FleetIndex::quotas` of the quota key whose chips it holds, if the
    /// fleet has that key (whoever created it).
    pub quota: Option<u32>,
}

// Every pass copies the facts of the whole listing (`observed`) and sweeps them (sizing):
// indexes of 32 bits keep them at 36 bytes (with `usize` ones they took 56).
const _: () = assert!(std::mem::size_of::<EntryFacts>() <= 36);

impl EntryFacts {
    /// Every entry the facts name (a matched `entry` is always the declaring one).
    pub fn entries(self) -> impl Iterator<Item = u32> {
        let declared = self.declared.map(|d| d.entry);
        declared.into_iter().chain(self.labelled)
    }
}

/// Whether `entry` owns `resource`: same zone and type, and adopted exactly when the entry is
/// (an adopted record must carry the entry's `existing` name).
fn entry_owns(entry: &TpuEntry, resource: &Resource) -> bool {
    entry.zone == resource.zone
        && entry.tpu_type == resource.tpu_type
        && match &entry.kind {
            EntryKind::Adopted { existing } => resource.adopted && *existing == resource.tpu_name,
            EntryKind::Managed { .. } => !resource.adopted,
        }
}

/// What a driver reads for one observation (original §3.2 fetched every declared name; a
/// list per zone reads the same objects in far fewer calls).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InventoryScope<'a> {
    /// Runner name: list objects whose `managed-by` label is this.
    pub runner: &'a str,
    /// Zones to list (the fleet's managed zones, borrowed, unless a record adds one).
    pub zones: Cow<'a, BTreeSet<Name>>,
    /// Adopted TPUs to fetch by exact name, as `(zone, name)`.
    pub adopted: BTreeSet<(&'a str, &'a str)>,
}

/// What a record adds to the fleet's own inventory scope (`FleetIndex::scope_add`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ScopeAdd {
    /// An adopted TPU to fetch by name: `(zone, name)`.
    Adopted(Name, Name),
    /// A zone to list that no managed entry lists.
    Zone(Name),
}

/// A zone's region: everything before its last `-` (zones are validated on input).
pub(crate) fn region_of(zone: &str) -> &str {
    zone.rsplit_once('-').map_or(zone, |(region, _)| region)
}

#[cfg(test)]
mod tests {
    use super::FleetIndex;
    use crate::engine::demand::Requirement;
    use crate::engine::{Timestamp, synthetic};
    use crate::spec::gcp::ModelSet;

    /// The candidates of a requirement hold every entry it accepts, and every declared TPU
    /// record it accepts is one of theirs: over a fleet of many entries and a queue pinned
    /// to zones and TPUs, the index finds what scanning the whole fleet finds.
    #[test]
    fn candidates_hold_every_entry_and_record_a_requirement_accepts() {
        let epoch = Timestamp::from_secs(1_767_225_600);
        let fleet = synthetic::fleet(60, 3);
        let (state, _) = synthetic::planning_instance(&fleet, 0, 180, epoch);
        let jobs = synthetic::varied_pending_jobs(&fleet, 3_000, epoch);
        let index = FleetIndex::new(fleet);
        let mut pinned = 0;
        for job in &jobs {
            let mut req = Requirement::of(job);
            for models in [ModelSet::ALL, ModelSet::SPOT] {
                req.models = models;
                let scanned: Vec<u32> = (0..index.fleet.tpus.len())
                    .filter(|&e| req.accepts_entry(&index, e))
                    .map(|e| e as u32)
                    .collect();
                let candidates = index.candidates(&req);
                let found: Vec<u32> = candidates
                    .iter()
                    .copied()
                    .filter(|&e| req.accepts_entry(&index, e as usize))
                    .collect();
                assert_eq!(found, scanned, "{}", job.id);
                for r in state.resources.values() {
                    if req.accepts_resource(r) && index.is_declared(r) {
                        let e = index.entry_index(&r.entry_id).expect("declared") as u32;
                        assert!(candidates.contains(&e), "{}: {}", job.id, r.id);
                    }
                }
            }
            pinned += usize::from(job.spec.zone.is_some());
        }
        assert!(pinned > 300, "the queue is varied: {pinned} pinned");
    }
}
