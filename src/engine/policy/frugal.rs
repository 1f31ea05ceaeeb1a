//! `frugal`: the classic assignment, but capacity is requested for each waiting job in one
//! compatible entry only — the one with the most room left after the demand already placed
//! (ties in fleet order) — instead of racing every compatible entry. Fewer speculative
//! requests and less idle capacity (§9.1 #13), at the price of waiting on one zone.

use super::classic::{self, desired_from, priority_order};
use super::{AssignInput, CapacityInput, Pair, Policy};
use crate::spec::EntryKind;

/// One capacity request per waiting job.
#[derive(Clone, Copy, Debug, Default)]
pub struct Frugal;

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
        let room: Vec<i64> = index
            .fleet
            .tpus
            .iter()
            .enumerate()
            .map(|(e, entry)| match entry.kind {
                EntryKind::Managed { count } => i64::from(count) - i64::from(input.busy[e]),
                EntryKind::Adopted { .. } => 0,
            })
            .collect();
        let mut placed = vec![0u64; room.len()];
        // Jobs in the original's order, so higher priority places its demand first.
        for j in priority_order(demand, |j| input.waiting[j]) {
            let class = demand.class(&demand.jobs[j]);
            let best = class
                .entries
                .iter()
                .map(|&e| e as usize)
                .filter(|&e| room[e] - placed[e] as i64 > 0)
                .max_by_key(|&e| (room[e] - placed[e] as i64, std::cmp::Reverse(e)));
            if let Some(e) = best {
                placed[e] += 1;
            }
        }
        desired_from(index, input.busy, &placed)
    }
}
