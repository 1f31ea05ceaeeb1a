//! The metrics `simulate` prints, computed from what production recorded (a store's jobs
//! and event log in a window): capacity held from the node sightings, busy time from the
//! attempts, progress lost at interruptions, waits and completion times by the same code as
//! a simulated run (`metrics::add_job_metrics`). Pure: it reads what it is handed; `tpu-runner
//! report` reads the store.

use std::collections::BTreeMap;

use super::metrics::{Metrics, Stats, add_job_metrics, capacity_cost};
use crate::engine::Timestamp;
use crate::engine::observe::Event;
use crate::engine::sightings::{self, NODE_STATE, NODE_VANISHED, QR_STATE, QR_VANISHED};
use crate::engine::state::{AttemptStatus, Job, State};
use crate::spec::{EntryKind, FleetSpec, TpuType};

/// What prices and data sizes turn chip-hours into money (a scenario's, or the defaults).
#[derive(Clone, Debug)]
pub struct Costs {
    /// Family → (spot, on-demand) USD per chip-hour.
    pub prices: BTreeMap<String, (f64, f64)>,
    /// USD per chip-hour of adopted TPUs (None: their on-demand price).
    pub adopted_usd_per_chip_hour: Option<f64>,
    /// USD per GB between regions.
    pub egress_usd_per_gb: f64,
    /// GB each attempt outside its bucket region moves.
    pub data_gb_per_attempt: f64,
}

impl Default for Costs {
    /// The simulator's defaults (scenarios/README.md).
    fn default() -> Costs {
        Costs {
            prices: super::scenario::default_prices(),
            adopted_usd_per_chip_hour: None,
            egress_usd_per_gb: super::scenario::DEFAULT_EGRESS_USD_PER_GB,
            data_gb_per_attempt: super::scenario::DEFAULT_DATA_GB_PER_ATTEMPT,
        }
    }
}

/// The metrics of the jobs submitted in `[since, until)` and of the capacity held then.
/// Progress lost: an interrupted attempt's whole run (production does not say what its
/// last checkpoint saved), as a simulated job without checkpoints loses it.
pub fn metrics(
    fleet: &FleetSpec,
    state: &State,
    events: &[(u64, Event)],
    since: Timestamp,
    until: Timestamp,
    costs: &Costs,
) -> Metrics {
    let mut m = Metrics::default();
    let jobs: Vec<&Job> = state
        .all_jobs()
        .filter(|j| j.submitted_at >= since && j.submitted_at < until)
        .collect();
    add_job_metrics(&mut m, jobs.iter().copied(), costs.data_gb_per_attempt);
    m.egress_usd = m.egress_gb * costs.egress_usd_per_gb;

    // Capacity from the node sightings: READY until it leaves READY or vanishes.
    let adopted: Vec<String> = fleet
        .tpus
        .iter()
        .filter_map(|e| match &e.kind {
            EntryKind::Adopted { existing } => Some(existing.clone()),
            _ => None,
        })
        .collect();
    let mut ready: BTreeMap<String, (Timestamp, String, u32)> = BTreeMap::new();
    let mut node_state: BTreeMap<String, String> = BTreeMap::new();
    let mut chips_of: BTreeMap<String, u32> = BTreeMap::new();
    let mut by_type: BTreeMap<String, f64> = BTreeMap::new();
    let mut first_seen: BTreeMap<String, Timestamp> = BTreeMap::new();
    let mut to_capacity = Vec::new();
    let clip = |t: Timestamp| t.max(since).min(until);
    let close = |by_type: &mut BTreeMap<String, f64>, from: Timestamp, key: &str, chips, at| {
        let secs = clip(at).secs_since(clip(from)).max(0.0);
        *by_type.entry(key.to_owned()).or_default() += secs * f64::from(chips);
    };
    for (_, e) in events.iter().filter(|(_, e)| e.at < until) {
        let Some(id) = e.resource_id.map(|n| n.to_string()) else {
            continue;
        };
        let f: BTreeMap<&str, &str> = sightings::fields(&e.detail).collect();
        let to = f.get("to").copied();
        match e.kind.as_str() {
            NODE_STATE | NODE_VANISHED => {
                if let Some((from, key, chips)) = ready.remove(&id) {
                    close(&mut by_type, from, &key, chips, e.at);
                }
                let chips = f
                    .get("type")
                    .and_then(|t| TpuType::parse(t).ok())
                    .map_or(0, |t| t.chips());
                chips_of.insert(id.clone(), chips);
                let was = node_state.remove(&id);
                if let Some(to) = to {
                    if to == "PREEMPTED" && was.as_deref() != Some("PREEMPTED") && e.at >= since {
                        m.preemptions += 1;
                    }
                    if to == "READY" {
                        let model = if adopted.contains(&id) {
                            "adopted"
                        } else if f.get("spot") == Some(&"true") {
                            "spot"
                        } else if f.get("reserved") == Some(&"true") {
                            "reserved"
                        } else {
                            "on-demand"
                        };
                        let key = format!("{}/{model}", f.get("type").unwrap_or(&""));
                        ready.insert(id.clone(), (e.at, key, chips));
                    }
                    node_state.insert(id, to.to_owned());
                }
            }
            QR_STATE | QR_VANISHED => match to {
                Some("ACTIVE") => {
                    if let Some(from) = first_seen.remove(&id)
                        && from >= since
                    {
                        to_capacity.push(e.at.secs_since(from));
                    }
                }
                Some(_) if !f.contains_key("from") && !first_seen.contains_key(&id) => {
                    first_seen.insert(id, e.at);
                }
                None => {
                    first_seen.remove(&id);
                }
                _ => {}
            },
            _ => {}
        }
    }
    for (from, key, chips) in ready.into_values() {
        close(&mut by_type, from, &key, chips, until);
    }
    m.allocated_chip_hours = by_type.values().sum::<f64>() / 3600.0;
    m.cost_usd =
        capacity_cost(&by_type, &costs.prices, costs.adopted_usd_per_chip_hour) + m.egress_usd;
    m.time_to_capacity_s = Stats::of(&to_capacity);

    // Busy and lost time from the attempts that ran in the window.
    let (mut busy, mut lost) = (0.0, 0.0);
    for job in &jobs {
        let width = match &job.spec.tpu {
            crate::spec::TpuRequest::OneOf(types) => types.first().map_or(0, TpuType::chips),
            crate::spec::TpuRequest::Any => 0,
        };
        for a in &job.attempts {
            let Some(start) = a.started_at else { continue };
            let end = a.ended_at.unwrap_or(until);
            let chips = chips_of
                .get(&a.tpu_name.to_string())
                .copied()
                .unwrap_or(width);
            let secs = clip(end).secs_since(clip(start)).max(0.0) * f64::from(chips);
            busy += secs;
            if a.status == AttemptStatus::Interrupted {
                lost += secs;
            }
        }
    }
    m.busy_chip_hours = busy / 3600.0;
    m.lost_chip_hours = lost / 3600.0;
    m.goodput_chip_hours = (m.busy_chip_hours - m.lost_chip_hours).max(0.0);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    m.utilization = ratio(m.busy_chip_hours, m.allocated_chip_hours);
    m.goodput_ratio = ratio(m.goodput_chip_hours, m.allocated_chip_hours);
    m.simulated_s = until.secs_since(since);
    m
}
