//! Assignment and capacity policies behind one trait, so the simulator can compare them on
//! the same workload. `classic` reproduces tpu-runner 0.1.12's decisions; `frugal` requests
//! capacity in one entry per job instead of racing all; `peers` holds SkyPilot's, dstack's
//! and Kueue's policies as baselines. Built from the fleet's `policy:`
//! section by [`of_spec`]. Policies are pure functions of their inputs.

mod classic;
mod frugal;
pub mod matching;
mod peers;

use std::fmt;

pub use classic::Classic;
pub use frugal::Frugal;
pub use peers::Sequential;

use super::demand::Demand;
use super::fleet_index::FleetIndex;
use super::state::Resource;
use super::time::Timestamp;
use crate::spec::{PolicyName, PolicySpec};

/// What a policy sees when assigning: pending jobs (by class) and the idle TPUs.
#[derive(Clone, Copy, Debug)]
pub struct AssignInput<'a> {
    /// The fleet.
    pub index: &'a FleetIndex,
    /// Pending jobs; only `assignable` ones may be assigned.
    pub demand: &'a Demand<'a>,
    /// Idle, declared, unowned TPUs (adopted first, then by id).
    pub tpus: &'a [&'a Resource],
}

/// What a policy sees when sizing capacity.
#[derive(Clone, Copy, Debug)]
pub struct CapacityInput<'a> {
    /// The fleet.
    pub index: &'a FleetIndex,
    /// Pending jobs.
    pub demand: &'a Demand<'a>,
    /// Per pending job (same order as `demand.jobs`): still waiting after this pass's
    /// assignment.
    pub waiting: &'a [bool],
    /// Per entry: busy resources.
    pub busy: &'a [u32],
    /// Idle, declared, unowned adopted TPUs still free after assignment.
    pub idle_adopted: &'a [&'a Resource],
    /// Per entry: its pool is cooling after stockout signals (the stockout memory); ask
    /// it only when no other compatible entry is left.
    pub cooling: &'a [bool],
    /// Per entry: its capacity requests are paused after a refusal.
    pub paused: &'a [bool],
    /// Per entry: TPUs whose request the cloud granted, not yet running a job (their node
    /// on its way or idle); only for policies that ask (`Policy::reads_granted`), else
    /// empty.
    pub granted: &'a [u32],
    /// The pass's time (for policies that change behaviour as jobs wait).
    pub now: Timestamp,
}

impl<'a> CapacityInput<'a> {
    /// Per entry: TPUs it may still add (count − busy; 0 for adopted entries).
    pub fn room(&self) -> Vec<i64> {
        self.index
            .fleet
            .tpus
            .iter()
            .enumerate()
            .map(|(e, entry)| match entry.kind {
                crate::spec::EntryKind::Managed { count } => {
                    i64::from(count) - i64::from(self.busy[e])
                }
                crate::spec::EntryKind::Adopted { .. } => 0,
            })
            .collect()
    }

    /// The entries of `entries` to ask: those with room whose pool is not cooling, or, when
    /// no entry with room is free of cooling, all of them (the stockout memory orders
    /// requests, it never strands a job).
    pub fn askable<'e>(&self, entries: &'e [u32]) -> impl Iterator<Item = u32> + use<'a, 'e> {
        let (index, busy, cooling) = (self.index, self.busy, self.cooling);
        let has_room = move |e: usize| match index.entry(e).kind {
            crate::spec::EntryKind::Managed { count } => count > busy[e],
            crate::spec::EntryKind::Adopted { .. } => false,
        };
        let avoid_cooling = cooling.iter().any(|c| *c)
            && entries
                .iter()
                .any(|&e| has_room(e as usize) && !cooling[e as usize]);
        entries
            .iter()
            .copied()
            .filter(move |&e| !avoid_cooling || !cooling[e as usize])
    }
}

/// A pair chosen by a policy: indices into `demand.jobs` and `tpus`.
pub type Pair = (usize, usize);

/// An assignment and capacity policy.
pub trait Policy: fmt::Debug + Send + Sync {
    /// Name used on the command line and in reports.
    fn name(&self) -> &'static str;
    /// Which pending jobs go to which idle TPUs. Must never give a TPU twice, never pair
    /// incompatible ones and never pick a job that is not assignable.
    fn assign(&self, input: &AssignInput<'_>) -> Vec<Pair>;
    /// Desired TPU count per fleet entry (entry order); adopted entries are ignored. Must not
    /// exceed the entry's `count`.
    fn desired_counts(&self, input: &CapacityInput<'_>) -> Vec<u32>;
    /// The earliest time after `input.now` at which `desired_counts` could answer otherwise
    /// for the same input, if its answer depends on time: a pass must run by then (the
    /// simulator skips passes that have nothing to do, and would otherwise decide late).
    fn changes_at(&self, input: &CapacityInput<'_>) -> Option<Timestamp> {
        let _ = input;
        None
    }
    /// Whether `desired_counts` reads `CapacityInput::granted` (counted only then).
    fn reads_granted(&self) -> bool {
        false
    }
}

/// The policy `spec` names, with its parameters.
pub fn of_spec(spec: &PolicySpec) -> Box<dyn Policy> {
    match spec.name {
        PolicyName::Classic => Box::new(Classic),
        PolicyName::Frugal => Box::new(Frugal {
            race_after_secs: spec.race_after_secs,
        }),
        PolicyName::SkypilotFailover
        | PolicyName::SkypilotEagerNextRegion
        | PolicyName::DstackOffers
        | PolicyName::KueueFlavors => Box::new(Sequential::of(spec.name).expect("a baseline")),
    }
}
