//! `classic`: tpu-runner 0.1.12's policy. Assignment by priority, then most constrained
//! (fewest compatible entries), then FIFO, with augmenting paths that never drop an earlier
//! job; capacity races every pending job across every compatible managed entry (those
//! whose pool is not cooling, with the stockout memory on):
//! desired = min(count, max(keep_warm_count, busy + demand)).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::matching::{ClassGraph, greedy_match};
use super::{AssignInput, CapacityInput, Pair, Policy};
use crate::engine::demand::Demand;
use crate::engine::fleet_index::{FleetIndex, region_of};
use crate::engine::state::{RegionChoice, Resource};
use crate::spec::EntryKind;

/// The original's policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct Classic;

impl Policy for Classic {
    fn name(&self) -> &'static str {
        "classic"
    }

    fn assign(&self, input: &AssignInput<'_>) -> Vec<Pair> {
        let order = priority_order(input.demand, |j| input.demand.jobs[j].assignable);
        match_in_order(input.index, input.demand, &order, input.tpus)
    }

    fn desired_counts(&self, input: &CapacityInput<'_>) -> Vec<u32> {
        let demand = input.demand;
        // (1) Jobs the matcher can place on idle adopted TPUs need no new capacity.
        let on_adopted: BTreeSet<usize> = if input.idle_adopted.is_empty() {
            BTreeSet::new()
        } else {
            let order = priority_order(demand, |j| input.waiting[j]);
            match_in_order(input.index, demand, &order, input.idle_adopted)
                .into_iter()
                .map(|(j, _)| j)
                .collect()
        };
        // (2) Racing demand: each waiting job adds one to every compatible managed entry that
        // still has room (count - busy). That is order-independent: an entry's demand is the
        // number of compatible waiting jobs, capped by its room.
        let mut per_class = vec![0u64; demand.classes.len()];
        for (j, job) in demand.jobs.iter().enumerate() {
            if input.waiting[j] && !on_adopted.contains(&j) {
                per_class[job.class as usize] += 1;
            }
        }
        let mut compatible = vec![0u64; input.index.fleet.tpus.len()];
        for (class, n) in demand.classes.iter().zip(&per_class) {
            if *n > 0 {
                for e in input.askable(&class.entries) {
                    compatible[e as usize] += n;
                }
            }
        }
        desired_from(input.index, input.busy, &compatible)
    }
}

/// (3) desired = min(count, max(keep_warm_count, busy + min(count - busy, demand))).
pub(super) fn desired_from(index: &FleetIndex, busy: &[u32], compatible_jobs: &[u64]) -> Vec<u32> {
    index
        .fleet
        .tpus
        .iter()
        .enumerate()
        .map(|(e, entry)| match entry.kind {
            EntryKind::Adopted { .. } => 1,
            EntryKind::Managed { count } => {
                let room = count.saturating_sub(busy[e]);
                let demand = compatible_jobs[e].min(room as u64) as u32;
                count.min(entry.keep_warm_count.max(busy[e] + demand))
            }
        })
        .collect()
}

/// Indices of `demand.jobs` passing `keep`, in the original's order: jobs with a compatible
/// entry first, higher priority first, fewer compatible entries first, then FIFO, then id.
pub(super) fn priority_order(demand: &Demand<'_>, keep: impl Fn(usize) -> bool) -> Vec<usize> {
    // The index breaks ties: `demand.jobs` is in id order.
    let mut keyed: Vec<((u64, i64), u32)> = (0..demand.jobs.len())
        .filter(|&j| keep(j))
        .map(|j| (demand.jobs[j].order_key, j as u32))
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, j)| j as usize).collect()
}

/// Matches jobs (`order`, indices into `demand.jobs`) to `tpus` with the class-graph matcher,
/// then picks concrete TPUs: preferred class first, adopted first, lowest id.
pub(super) fn match_in_order(
    index: &FleetIndex,
    demand: &Demand<'_>,
    order: &[usize],
    tpus: &[&Resource],
) -> Vec<Pair> {
    if order.is_empty() || tpus.is_empty() {
        return Vec::new();
    }
    // TPU classes: same type and zone (and name, when some job pins that name; and model,
    // when the fleet has managed entries that are not Spot) are interchangeable for every
    // job. Class ids follow preference: adopted first, lowest id.
    let pinned: BTreeSet<&str> = demand
        .classes
        .iter()
        .filter_map(|c| c.req.tpu_name)
        .collect();
    type Key<'k> = (
        &'k crate::spec::TpuType,
        &'k str,
        Option<&'k str>,
        Option<crate::spec::ProvisioningModel>,
    );
    let mut class_of_key: BTreeMap<Key<'_>, usize> = BTreeMap::new();
    let mut members: Vec<VecDeque<usize>> = Vec::new();
    let mut ranked: Vec<usize> = (0..tpus.len()).collect();
    ranked.sort_by(|&a, &b| (!tpus[a].adopted, &tpus[a].id).cmp(&(!tpus[b].adopted, &tpus[b].id)));
    for t in ranked {
        let r = tpus[t];
        let name = pinned
            .contains(r.tpu_name.as_str())
            .then_some(r.tpu_name.as_str());
        // A managed TPU's model decides which jobs may take it.
        let model = (index.has_fallback && !r.adopted)
            .then(|| {
                index
                    .owns_record(r)
                    .map(|e| index.entry(e).provisioning_model)
            })
            .flatten();
        let c = *class_of_key
            .entry((&r.tpu_type, r.zone.as_str(), name, model))
            .or_insert_with(|| {
                members.push(VecDeque::new());
                members.len() - 1
            });
        members[c].push_back(t);
    }
    // TPU classes by zone, name and region (ascending ids), so that a job class checks only
    // the classes of its pinned TPU or zone, else of its regions: the pins of a sweep queue
    // make thousands of job classes, each of which would otherwise check every TPU class.
    let mut by_zone: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut by_name: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut by_region: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (c, m) in members.iter().enumerate() {
        let r = tpus[m[0]];
        by_zone.entry(r.zone.as_str()).or_default().push(c);
        by_name.entry(r.tpu_name.as_str()).or_default().push(c);
        by_region.entry(region_of(&r.zone)).or_default().push(c);
    }
    // Otherwise the classes of the regions it may run in, in class order.
    let in_regions = |regions: RegionChoice<'_>| -> Vec<usize> {
        let mut classes: Vec<usize> = match regions {
            RegionChoice::Pinned(region) => by_region.get(region).cloned().unwrap_or_default(),
            RegionChoice::AnyOf(list) => list
                .iter()
                .flat_map(|b| by_region.get(b.region.as_str()).into_iter().flatten())
                .copied()
                .collect(),
        };
        classes.sort_unstable();
        classes.dedup();
        classes
    };
    // Job classes: the demand classes that occur, with their compatible TPU classes.
    let mut job_class_of: Vec<Option<u32>> = vec![None; demand.classes.len()];
    let mut compat: Vec<Vec<u32>> = Vec::new();
    let job_classes: Vec<u32> = order
        .iter()
        .map(|&j| {
            let dc = demand.jobs[j].class;
            *job_class_of[dc as usize].get_or_insert_with(|| {
                let req = demand.classes[dc as usize].req;
                let regional;
                let candidates = match (req.tpu_name, req.zone) {
                    (Some(name), _) => by_name.get(name).map_or(&[][..], Vec::as_slice),
                    (None, Some(zone)) => by_zone.get(zone).map_or(&[][..], Vec::as_slice),
                    (None, None) => {
                        regional = in_regions(req.regions);
                        &regional
                    }
                };
                compat.push(
                    candidates
                        .iter()
                        .filter(|&&c| req.accepts_tpu(index, tpus[members[c][0]]))
                        .map(|&c| c as u32)
                        .collect(),
                );
                (compat.len() - 1) as u32
            })
        })
        .collect();
    let graph = ClassGraph {
        compat,
        capacity: members.iter().map(|m| m.len() as u32).collect(),
    };
    let classes = greedy_match(&graph, &job_classes);
    order
        .iter()
        .zip(classes)
        .filter_map(|(&j, c)| {
            c.map(|c| {
                (
                    j,
                    members[c as usize]
                        .pop_front()
                        .expect("class has a free TPU"),
                )
            })
        })
        .collect()
}
