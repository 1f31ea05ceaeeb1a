//! The peers' capacity policies, kept as baselines to compare tpu-runner's with on the same
//! traces (docs/policies.md, "Peers as baselines"). Each waiting job has one request at a
//! time, in the peer's order of its compatible entries, and moves on as the peer would:
//! `skypilot-failover` and `dstack-offers` go cheapest first and leave an entry whose
//! request was refused or not granted within a minute (their creates fail at once where a
//! queued resource waits: the stockout memory with a one-minute wait, see
//! `StockoutMemory::fail_fast`); `kueue-flavors` goes in fleet order (the flavor order) and
//! leaves a flavor only when it has no room, never on a stockout (Kueue #2560). When every
//! entry is ruled out, the first in order is asked again. A TPU the cloud granted is kept
//! for a waiting job before any entry is asked anew, as the peers use the instance a
//! request got: leaving an on-demand TPU still being created for a cheaper Spot entry whose
//! one-minute cooldown ended would trade them back and forth while the job waits for ever.
//! Assignment is `classic`'s. Pure.

use super::classic::{self, desired_from, priority_order};
use super::{AssignInput, CapacityInput, Pair, Policy};
use crate::spec::{PolicyName, TpuEntry};

/// How a peer orders a job's compatible entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// Cheapest TPU-hour first (list price × chips), then fleet order (SkyPilot's
    /// optimizer, dstack's offers).
    Price,
    /// Fleet order (Kueue's flavors).
    Fleet,
}

/// One request per waiting job, tried entry after entry in a peer's order.
#[derive(Clone, Copy, Debug)]
pub struct Sequential {
    name: PolicyName,
    order: Order,
    /// Leaves an entry whose request was refused or is stocked out.
    moves_on_stockout: bool,
}

impl Sequential {
    /// The baseline named `name` (`None` for tpu-runner's own policies).
    pub fn of(name: PolicyName) -> Option<Sequential> {
        let (order, moves_on_stockout) = match name {
            PolicyName::SkypilotFailover
            | PolicyName::SkypilotEagerNextRegion
            | PolicyName::DstackOffers => (Order::Price, true),
            PolicyName::KueueFlavors => (Order::Fleet, false),
            PolicyName::Classic | PolicyName::Frugal => return None,
        };
        Some(Sequential {
            name,
            order,
            moves_on_stockout,
        })
    }
}

/// USD per hour one more TPU of `entry` costs at list price (unknown families last): a
/// reservation's nothing, as it is paid for whether used or not.
fn hourly_price(entry: &TpuEntry) -> f64 {
    use crate::spec::ProvisioningModel;
    let spot = match entry.provisioning_model {
        ProvisioningModel::Reserved => return 0.0,
        model => model == ProvisioningModel::Spot,
    };
    crate::spec::prices::per_chip_hour(entry.tpu_type.quota_family(), spot)
        .map_or(f64::MAX, |p| p * f64::from(entry.chips_per_tpu()))
}

impl Policy for Sequential {
    fn name(&self) -> &'static str {
        self.name.as_str()
    }

    fn assign(&self, input: &AssignInput<'_>) -> Vec<Pair> {
        classic::Classic.assign(input)
    }

    fn desired_counts(&self, input: &CapacityInput<'_>) -> Vec<u32> {
        let index = input.index;
        let demand = input.demand;
        let room = input.room();
        let price: Vec<f64> = index.fleet.tpus.iter().map(hourly_price).collect();
        let mut placed = vec![0u64; room.len()];
        // TPUs granted and not yet running a job: a job keeps to one before asking anew.
        let mut granted = input.granted.to_vec();
        // Each class's entries in the peer's order, worked out once.
        let mut ordered: Vec<Option<Vec<usize>>> = vec![None; demand.classes.len()];
        for j in priority_order(demand, |j| input.waiting[j]) {
            let c = demand.jobs[j].class as usize;
            let entries = ordered[c].get_or_insert_with(|| {
                let mut es: Vec<usize> = demand.classes[c]
                    .entries
                    .iter()
                    .map(|&e| e as usize)
                    .collect();
                if self.order == Order::Price {
                    es.sort_by(|&a, &b| price[a].total_cmp(&price[b]).then(a.cmp(&b)));
                }
                es
            });
            let free = |e: usize| room[e] - placed[e] as i64 > 0;
            let open = |e: usize| !self.moves_on_stockout || !(input.cooling[e] || input.paused[e]);
            let on_its_way = |e: usize| granted.get(e).is_some_and(|g| *g > 0);
            let pick = (entries.iter().copied())
                .find(|&e| free(e) && on_its_way(e))
                .or_else(|| entries.iter().copied().find(|&e| free(e) && open(e)))
                .or_else(|| entries.iter().copied().find(|&e| free(e)));
            if let Some(e) = pick {
                placed[e] += 1;
                if let Some(g) = granted.get_mut(e) {
                    *g = g.saturating_sub(1);
                }
            }
        }
        desired_from(index, input.busy, &placed)
    }

    fn reads_granted(&self) -> bool {
        true
    }
}
