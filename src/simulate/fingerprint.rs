//! The harness's change detector: a hash of everything a pass can change in the state, kept
//! up to date from the state tables' change tracking, so a pass that touched a dozen records
//! rehashes a dozen, not the whole state. Only ever compared with its previous value (to
//! decide whether the next interval's pass may be skipped); never part of any output.

use std::hash::{Hash, Hasher};

use rustc_hash::FxHasher;

use crate::engine::State;
use crate::engine::sorted_map::{Revision, SortedMap};
use crate::engine::state::{Job, Resource};
use crate::spec::NameMap;

/// The fingerprint of a state, updated in place.
#[derive(Debug, Default)]
pub struct Fingerprint {
    jobs: Table,
    resources: Table,
}

impl Fingerprint {
    /// The fingerprint of `state` now: equal to the last one iff (but for hash collisions)
    /// nothing a pass can change has changed.
    pub fn of(&mut self, state: &State) -> u64 {
        let mut h = FxHasher::default();
        self.jobs.update(&state.jobs, job_hash).hash(&mut h);
        self.resources
            .update(&state.resources, resource_hash)
            .hash(&mut h);
        state.finished.len().hash(&mut h);
        for (k, b) in &state.entry_backoff {
            (k, b.failures, b.until).hash(&mut h);
        }
        state.notices.len().hash(&mut h);
        for (k, m) in &state.pools {
            (k, m.waiting_since, m.granted, m.strikes, m.cool_until).hash(&mut h);
        }
        state.others.hash(&mut h);
        h.finish()
    }
}

/// The per-entry hashes of one table and their sum.
#[derive(Debug, Default)]
struct Table {
    seen: Option<Revision>,
    hashes: NameMap<u64>,
    sum: u64,
}

impl Table {
    fn update<V>(&mut self, map: &SortedMap<V>, hash: fn(&V) -> u64) -> u64 {
        let changes = self.seen.and_then(|rev| map.changes_since(rev));
        match changes {
            Some(changes) => {
                for key in changes.removed {
                    if let Some(old) = self.hashes.remove(&key) {
                        self.sum = self.sum.wrapping_sub(old);
                    }
                }
                for key in changes.touched {
                    let new = hash(&map[&key]);
                    let old = match self.hashes.get_mut(&key) {
                        Some(kept) => std::mem::replace(kept, new),
                        None => {
                            self.hashes.insert(key, new);
                            0
                        }
                    };
                    self.sum = self.sum.wrapping_sub(old).wrapping_add(new);
                }
            }
            None => {
                self.hashes.clear();
                self.sum = 0;
                for (key, value) in map.iter() {
                    let new = hash(value);
                    self.hashes.insert(*key, new);
                    self.sum = self.sum.wrapping_add(new);
                }
            }
        }
        self.seen = Some(map.revision());
        self.sum
    }
}

fn job_hash(job: &Job) -> u64 {
    let mut h = FxHasher::default();
    (
        &job.id,
        job.status,
        &job.assigned_resource,
        &job.current_attempt,
        job.not_before,
        job.infra_failures,
    )
        .hash(&mut h);
    if let Some(a) = job.attempt() {
        (
            a.status,
            a.launch_failures,
            a.stop_failures,
            a.failed_launch,
        )
            .hash(&mut h);
    }
    h.finish()
}

fn resource_hash(r: &Resource) -> u64 {
    let mut h = FxHasher::default();
    (
        &r.id,
        r.status,
        &r.owner.as_ref().map(|o| &o.attempt_id),
        r.idle_since,
        r.provisioning_node_seen_at,
        r.provisioning_node_missing_since,
    )
        .hash(&mut h);
    (
        r.retryable_failures.as_ref().map(|c| c.count),
        r.cancellation_failures.as_ref().map(|c| c.count),
    )
        .hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::Fingerprint;
    use crate::engine::{State, Timestamp, synthetic};

    /// Updated in place or computed afresh, the fingerprint is the same; it moves when a
    /// record changes, and comes back when the change is undone.
    #[test]
    fn an_updated_fingerprint_equals_a_fresh_one() {
        let fleet = synthetic::fleet(4, 3);
        let epoch = Timestamp::from_secs(1_767_225_600);
        let mut state: State = synthetic::running_instance(&fleet, 20, epoch).0;
        let mut kept = Fingerprint::default();
        let before = kept.of(&state);
        assert_eq!(kept.of(&state), before);
        let id = *state.resources.keys().next().expect("records");
        let old = state.resources[&id].idle_since;
        state.resources.get_mut(&id).expect("record").idle_since = Some(epoch);
        let changed = kept.of(&state);
        assert_ne!(changed, before);
        assert_eq!(changed, Fingerprint::default().of(&state));
        state.resources.get_mut(&id).expect("record").idle_since = old;
        assert_eq!(kept.of(&state), before);
        let job = *state.jobs.keys().next().expect("jobs");
        let removed = state.jobs.remove(&job).expect("job");
        assert_ne!(kept.of(&state), before);
        state.jobs.insert(job, removed);
        assert_eq!(kept.of(&state), before);
        assert_eq!(kept.of(&state.clone()), before);
    }
}
