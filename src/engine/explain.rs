//! Why each pending job is not running, in words a user can act on: used by `plan` (and
//! later `status`). Reads the fleet, the state after a pass, the observation and the pass
//! output; pure.

use std::collections::BTreeMap;

use serde::Serialize;

use super::demand::Requirement;
use super::fleet_index::FleetIndex;
use super::observe::{Action, Observation};
use super::reconcile::PassOutput;
use super::state::{JobStatus, RegionChoice, State};
use super::time::Timestamp;
use crate::spec::{EntryKind, TpuRequest};

/// The reasons one pending job waits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// Job id.
    pub job_id: String,
    /// One sentence per reason, most important first.
    pub reasons: Vec<String>,
}

fn describe_request(req: &Requirement<'_>) -> String {
    let tpu = match req.tpu {
        TpuRequest::Any => "any TPU type".to_owned(),
        TpuRequest::OneOf(types) => types
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" or "),
    };
    let mut out = tpu;
    if let Some(z) = req.zone {
        out.push_str(&format!(" in zone {z}"));
    }
    if let Some(n) = req.tpu_name {
        out.push_str(&format!(" on TPU {n}"));
    }
    match req.regions {
        RegionChoice::Pinned(r) => {
            out.push_str(&format!(" in region {r} (pinned by its previous attempt)"))
        }
        RegionChoice::AnyOf(list) => {
            let regions: Vec<&str> = list.iter().map(|b| b.region.as_str()).collect();
            out.push_str(&format!(
                " in regions with a bucket ({})",
                regions.join(", ")
            ));
        }
    }
    out
}

/// Explains every job still pending after the pass.
pub fn explain(
    index: &FleetIndex,
    state: &State,
    observation: &Observation,
    out: &PassOutput,
    now: Timestamp,
) -> Vec<Explanation> {
    // Live requests per entry (observed and created this pass).
    let mut requests: BTreeMap<&str, u32> = BTreeMap::new();
    for q in &observation.queued_resources {
        if q.state.is_live()
            && let Some(e) = index.queued_resource_entry(q)
        {
            *requests.entry(index.entry(e).id.as_str()).or_default() += 1;
        }
    }
    for a in &out.actions {
        if let Action::CreateQueuedResource { entry_id, .. } = a {
            *requests.entry(entry_id.as_str()).or_default() += 1;
        }
    }
    let assigned_now: Vec<(&str, &str)> = out
        .events
        .iter()
        .filter(|e| e.kind == "job_assigned")
        .filter_map(|e| Some((e.job_id.as_deref()?, e.resource_id.as_deref()?)))
        .collect();
    let mut result = Vec::new();
    for job in state
        .jobs
        .values()
        .filter(|j| j.status == JobStatus::Pending)
    {
        let req = Requirement::of(job);
        let mut reasons = Vec::new();
        if let Some(t) = job.not_before.filter(|t| *t > now) {
            reasons.push(format!(
                "backing off after {} infrastructure failure(s) until {t}",
                job.infra_failures
            ));
        }
        let entries: Vec<usize> = (0..index.fleet.tpus.len())
            .filter(|&e| req.accepts_entry(index, e))
            .collect();
        if entries.is_empty() {
            reasons.push(format!("no fleet entry offers {}", describe_request(&req)));
            result.push(Explanation {
                job_id: job.id.to_string(),
                reasons,
            });
            continue;
        }
        // TPUs of compatible entries and who holds them.
        let mut holders = Vec::new();
        for r in state.resources.values() {
            if !req.accepts_resource(r) || !index.is_declared(r) {
                continue;
            }
            if let Some(owner) = &r.owner {
                let when = if assigned_now
                    .iter()
                    .any(|(j, res)| *j == owner.job_id && *res == r.id)
                {
                    "assigned this pass"
                } else {
                    "running"
                };
                holders.push(format!("{} ({when})", owner.job_id));
            }
        }
        if !holders.is_empty() {
            holders.sort();
            let shown: Vec<&str> = holders.iter().take(5).map(String::as_str).collect();
            let more = if holders.len() > 5 {
                format!(" and {} more", holders.len() - 5)
            } else {
                String::new()
            };
            reasons.push(format!(
                "every compatible TPU is taken by an earlier or higher-priority job: {}{more}",
                shown.join(", ")
            ));
        }
        let mut requested = Vec::new();
        for &e in &entries {
            let entry = index.entry(e);
            match &entry.kind {
                EntryKind::Adopted { existing } => {
                    let usable = state.resources.values().any(|r| {
                        r.adopted
                            && r.tpu_name == *existing
                            && (r.status == super::state::ResourceStatus::Idle || r.is_busy())
                    });
                    if !usable {
                        reasons.push(format!(
                            "adopted TPU {existing} ({}) is not available",
                            entry.zone
                        ));
                    }
                }
                EntryKind::Managed { count } => {
                    if let Some(b) = state.entry_backoff.get(&entry.id).filter(|b| b.until > now) {
                        reasons.push(format!(
                            "entry {} paused until {} after a refusal ({})",
                            entry.id, b.until, b.reason
                        ));
                    }
                    if let Some(note) = state.notices.get(&format!("chip_limit:{}", entry.id)) {
                        reasons.push(format!("chip limit reached: {note}"));
                    }
                    let n = requests.get(entry.id.as_str()).copied().unwrap_or(0);
                    if n > 0 {
                        requested.push(format!(
                            "{} ({} {}, {n}/{count} requested)",
                            entry.zone, entry.tpu_type, entry.id
                        ));
                    } else if *count > 0 {
                        let busy = state
                            .resources
                            .values()
                            .filter(|r| r.entry_id == entry.id && r.is_busy())
                            .count() as u32;
                        if busy >= *count {
                            reasons.push(format!(
                                "entry {} is at its count ({count} TPUs, all busy)",
                                entry.id
                            ));
                        }
                    }
                }
            }
        }
        if !requested.is_empty() {
            reasons.push(format!("capacity requested in {}", requested.join("; ")));
        }
        if reasons.is_empty() {
            reasons.push(format!(
                "waiting for capacity: {} compatible entr{}",
                entries.len(),
                if entries.len() == 1 { "y" } else { "ies" }
            ));
        }
        result.push(Explanation {
            job_id: job.id.to_string(),
            reasons,
        });
    }
    result
}
