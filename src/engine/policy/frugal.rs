//! `frugal`: the classic assignment, but capacity is requested for a waiting job in one
//! compatible entry only — the one with the most room left after the demand already placed
//! (ties in fleet order) — instead of racing every compatible entry. Fewer speculative
//! requests and less idle capacity (§9.1 #13). A job that has waited `race_after` (the
//! fleet's `policy.race_after`, 15 min by default) races like `classic`, so a stockout in the
//! chosen zone delays it but never strands it.

use super::classic::{self, desired_from, priority_order};
use super::{AssignInput, CapacityInput, Pair, Policy};
use crate::engine::state::Job;
use crate::engine::time::Timestamp;

/// One capacity request per waiting job.
#[derive(Clone, Copy, Debug)]
pub struct Frugal {
    /// Seconds a job waits on one entry before its demand races every compatible entry.
    pub race_after_secs: i64,
}

impl Default for Frugal {
    fn default() -> Self {
        Frugal {
            race_after_secs: crate::spec::policy::DEFAULT_RACE_AFTER_SECS,
        }
    }
}

impl Policy for Frugal {
    fn name(&self) -> &'static str {
        "frugal"
    }

    fn assign(&self, input: &AssignInput<'_>) -> Vec<Pair> {
        classic::Classic.assign(input)
    }

    fn desired_counts(&self, input: &CapacityInput<'_>) -> Vec<u32> {
        let index = input.index;
        let demand = input.demand;
        let room = input.room();
        let mut placed = vec![0u64; room.len()];
        // Jobs in the original's order, so higher priority places its demand first.
        for j in priority_order(demand, |j| input.waiting[j]) {
            let class = demand.class(&demand.jobs[j]);
            if input.now >= self.races_at(demand.jobs[j].job) {
                for e in input.askable(&class.entries) {
                    placed[e as usize] += 1;
                }
                continue;
            }
            // The entry with the most room, one whose pool is not cooling first.
            let best = class
                .entries
                .iter()
                .map(|&e| e as usize)
                .filter(|&e| room[e] - placed[e] as i64 > 0)
                .max_by_key(|&e| {
                    (
                        !input.cooling[e],
                        room[e] - placed[e] as i64,
                        std::cmp::Reverse(e),
                    )
                });
            if let Some(e) = best {
                placed[e] += 1;
            }
        }
        desired_from(index, input.busy, &placed)
    }

    fn changes_at(&self, input: &CapacityInput<'_>) -> Option<Timestamp> {
        let demand = input.demand;
        (0..demand.jobs.len())
            .filter(|&j| input.waiting[j])
            .map(|j| self.races_at(demand.jobs[j].job))
            .filter(|&at| at > input.now)
            .min()
    }
}

impl Frugal {
    /// When a waiting job starts racing: `race_after_secs` after it was submitted or its
    /// last attempt ended.
    fn races_at(&self, job: &Job) -> Timestamp {
        let waiting_since = job
            .attempts
            .last()
            .and_then(|a| a.ended_at)
            .unwrap_or(job.submitted_at)
            .max(job.submitted_at);
        waiting_since.plus_secs(self.race_after_secs)
    }
}
