//! Pending work grouped by requirement: jobs with the same acceptable types, zone, TPU name
//! and regions form one class, whose compatible fleet entries are computed once. Policies work
//! on classes so a pass costs O(jobs + classes × entries), not O(jobs × entries).

use super::fleet_index::FleetIndex;
use super::state::{Job, RegionChoice, Resource};
use super::time::Timestamp;
use crate::spec::gcp::ModelSet;
use crate::spec::{EntryKind, TpuEntry, TpuRequest, TpuType};

/// Where a job may run, borrowed from the job (no allocation per job). Equality looks at
/// regions only, not at which bucket serves a region: two jobs that may run in the same
/// places are one class ([`Demand::build`] groups by the jobs' cached fingerprints, which
/// agree with this equality).
#[derive(Clone, Copy, Debug)]
pub struct Requirement<'a> {
    /// Acceptable types.
    pub tpu: &'a TpuRequest,
    /// Required zone.
    pub zone: Option<&'a str>,
    /// Required TPU name.
    pub tpu_name: Option<&'a str>,
    /// Allowed regions.
    pub regions: RegionChoice<'a>,
    /// Provisioning models of the managed TPUs it may take (adopted TPUs: any).
    pub models: ModelSet,
}

impl Requirement<'_> {
    fn regions_key(&self) -> (Option<&str>, &[super::state::BucketRegion]) {
        match self.regions {
            RegionChoice::Pinned(r) => (Some(r), &[]),
            RegionChoice::AnyOf(list) => (None, list),
        }
    }
}

impl PartialEq for Requirement<'_> {
    fn eq(&self, other: &Self) -> bool {
        let (pa, ra) = self.regions_key();
        let (pb, rb) = other.regions_key();
        self.tpu == other.tpu
            && self.zone == other.zone
            && self.tpu_name == other.tpu_name
            && pa == pb
            && self.models == other.models
            && ra.len() == rb.len()
            && ra.iter().zip(rb).all(|(a, b)| a.region == b.region)
    }
}

impl Eq for Requirement<'_> {}

/// A key equal for two jobs exactly when their requirements are equal, from the jobs'
/// cached requirement fingerprints: most jobs are grouped without reading their strings.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ClassKey<'a> {
    /// Not pinned: types, zone, TPU name and bucket regions, and the models.
    AnyOf(u128, ModelSet),
    /// Pinned to a region: types, zone and TPU name, the region and the models.
    Pinned(u128, &'a str, ModelSet),
}

impl<'a> ClassKey<'a> {
    /// The key of `job`'s requirement when it may take managed TPUs of `models`.
    pub(crate) fn of(job: &'a Job, models: ModelSet) -> ClassKey<'a> {
        let print = job.print();
        match &job.placement {
            Some(p) => ClassKey::Pinned(print.base, &p.region, models),
            None => ClassKey::AnyOf(print.with_regions, models),
        }
    }
}

impl<'a> Requirement<'a> {
    /// The requirement of `job`.
    pub fn of(job: &'a Job) -> Requirement<'a> {
        Requirement {
            tpu: &job.spec.tpu,
            zone: job.spec.zone.as_deref(),
            tpu_name: job.spec.tpu_name.as_deref(),
            regions: job.candidate_regions(),
            models: ModelSet::ALL,
        }
    }

    /// The requirement of `job` at `now`: the managed models its wait has opened to it
    /// (every model in a fleet of Spot entries only).
    pub fn at(index: &FleetIndex, job: &'a Job, now: Timestamp) -> Requirement<'a> {
        let models = if index.has_fallback {
            job.models_at(&index.fleet.policy.fallback, now).0
        } else {
            ModelSet::ALL
        };
        Requirement {
            models,
            ..Requirement::of(job)
        }
    }

    fn region_ok(&self, region: &str) -> bool {
        self.regions.accepts(region)
    }

    /// A TPU of `tpu_type` in `zone` is of a type, zone and region the job accepts.
    pub fn accepts_place(&self, tpu_type: &TpuType, zone: &str) -> bool {
        self.tpu.accepts(tpu_type)
            && self.zone.is_none_or(|z| z == zone)
            // Zones were validated on input: the region is everything before the last `-`.
            && zone.rsplit_once('-').is_some_and(|(region, _)| self.region_ok(region))
    }

    /// Job accepts entry (§3.9): type, zone and region rules on the entry's zone; with a TPU
    /// name, the adopted entry's `existing` or one of a managed entry's ordinal nodes;
    /// otherwise an adopted entry or a managed one with `count > 0`.
    pub fn accepts_entry(&self, index: &FleetIndex, entry_index: usize) -> bool {
        let entry: &TpuEntry = index.entry(entry_index);
        if !self.accepts_place(&entry.tpu_type, &entry.zone)
            || (!entry.is_adopted() && !self.models.has(entry.provisioning_model))
        {
            return false;
        }
        match (self.tpu_name, &entry.kind) {
            (None, EntryKind::Adopted { .. }) => true,
            (None, EntryKind::Managed { count }) => *count > 0,
            (Some(name), EntryKind::Adopted { existing }) => name == existing,
            (Some(name), EntryKind::Managed { .. }) => {
                index.ordinals[entry_index].iter().any(|n| n == name)
            }
        }
    }

    /// Job accepts resource (§3.9): type, zone, name and region.
    pub fn accepts_resource(&self, resource: &Resource) -> bool {
        self.accepts_place(&resource.tpu_type, &resource.zone)
            && self.tpu_name.is_none_or(|n| n == resource.tpu_name)
    }

    /// `accepts_resource`, and a managed TPU's provisioning model is one the job may take.
    pub fn accepts_tpu(&self, index: &FleetIndex, resource: &Resource) -> bool {
        self.accepts_resource(resource)
            && (self.models == ModelSet::ALL
                || resource.adopted
                || index.owns_record(resource).is_none_or(|e| {
                    let entry = index.entry(e);
                    entry.is_adopted() || self.models.has(entry.provisioning_model)
                }))
    }
}

/// One requirement and the fleet entries that satisfy it.
#[derive(Clone, Debug)]
pub struct DemandClass<'a> {
    /// The requirement.
    pub req: Requirement<'a>,
    /// Compatible entries (fleet order).
    pub entries: Vec<u32>,
    /// How many of them are managed.
    pub managed_entries: u32,
}

/// A pending job and its class.
#[derive(Clone, Copy, Debug)]
pub struct PendingJob<'a> {
    /// The job.
    pub job: &'a Job,
    /// Index into [`Demand::classes`].
    pub class: u32,
    /// False while it backs off after an infrastructure failure (still counts as demand).
    pub assignable: bool,
    /// The job's order among pending jobs (§3.9): no compatible entry last, higher priority
    /// first, fewer compatible entries first, then FIFO. Packed so sorting never touches the
    /// job; ties (same submit time) end in id order because `Demand::jobs` is in id order.
    pub order_key: (u64, i64),
}

/// Every pending job of the state, grouped by requirement.
#[derive(Clone, Debug, Default)]
pub struct Demand<'a> {
    /// Pending jobs in id order.
    pub jobs: Vec<PendingJob<'a>>,
    /// Requirement classes.
    pub classes: Vec<DemandClass<'a>>,
}

impl<'a> Demand<'a> {
    /// Groups `pending` (jobs with status pending) by requirement.
    pub fn build(
        index: &FleetIndex,
        pending: impl IntoIterator<Item = &'a Job>,
        now: Timestamp,
    ) -> Demand<'a> {
        Demand::build_with(index, pending, now, &mut ClassEntries::default())
    }

    /// `build`, taking the compatible entries of requirements seen before from `known` (and
    /// adding the new ones): they depend only on the requirement and the fleet.
    pub(crate) fn build_with(
        index: &FleetIndex,
        pending: impl IntoIterator<Item = &'a Job>,
        now: Timestamp,
        known: &mut ClassEntries,
    ) -> Demand<'a> {
        // Only looked up, never iterated: class ids follow job order, so hashing is safe
        // for determinism and much cheaper than ordered keys at 100k jobs.
        let mut by_req: rustc_hash::FxHashMap<ClassKey<'a>, u32> = rustc_hash::FxHashMap::default();
        let mut demand = Demand::default();
        for job in pending {
            let req = Requirement::at(index, job, now);
            let models = req.models;
            let class = *by_req.entry(ClassKey::of(job, models)).or_insert_with(|| {
                let (entries, managed_entries) = known.of(job, models, || {
                    let entries: Vec<u32> = index
                        .candidates(&req)
                        .into_iter()
                        .filter(|&e| req.accepts_entry(index, e as usize))
                        .collect();
                    let managed = entries
                        .iter()
                        .filter(|&&e| !index.entry(e as usize).is_adopted())
                        .count() as u32;
                    (entries, managed)
                });
                demand.classes.push(DemandClass {
                    req,
                    entries,
                    managed_entries,
                });
                (demand.classes.len() - 1) as u32
            });
            let assignable = job.not_before.is_none_or(|t| t <= now);
            let n_entries = demand.classes[class as usize].entries.len() as u64;
            let rank = u64::from(job.spec.priority.rank());
            demand.jobs.push(PendingJob {
                job,
                class,
                assignable,
                order_key: (
                    (u64::from(n_entries == 0) << 63)
                        | ((3 - rank) << 32)
                        | n_entries.min(u64::from(u32::MAX)),
                    job.submitted_at.0,
                ),
            });
        }
        demand
    }

    /// The class of a pending job.
    pub fn class(&self, job: &PendingJob<'_>) -> &DemandClass<'a> {
        &self.classes[job.class as usize]
    }
}

/// Compatible entries (and how many are managed) per requirement, by the jobs' requirement
/// fingerprints: what `Demand::build` derives for a class, kept for a fleet that does not
/// change (the engine keeps one; bounded, emptied when it grows large).
#[derive(Debug, Default)]
pub(crate) struct ClassEntries {
    any_of: rustc_hash::FxHashMap<(u128, ModelSet), (Vec<u32>, u32)>,
    pinned: rustc_hash::FxHashMap<(u128, String, ModelSet), (Vec<u32>, u32)>,
}

impl ClassEntries {
    /// More requirements than a queue plausibly holds classes of: start afresh.
    const MAX: usize = 1 << 14;

    fn of(
        &mut self,
        job: &Job,
        models: ModelSet,
        derive: impl FnOnce() -> (Vec<u32>, u32),
    ) -> (Vec<u32>, u32) {
        if self.any_of.len() + self.pinned.len() >= Self::MAX {
            *self = ClassEntries::default();
        }
        let print = job.print();
        let known = match &job.placement {
            Some(p) => self
                .pinned
                .entry((print.base, p.region.clone(), models))
                .or_insert_with(derive),
            None => self
                .any_of
                .entry((print.with_regions, models))
                .or_insert_with(derive),
        };
        known.clone()
    }
}
