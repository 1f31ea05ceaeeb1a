//! What production lived through, made a scenario: the jobs submitted in a window (as
//! `simulate::captured` jobs, with their observed work and outcome) and per pool the capacity
//! the controller saw (a stepwise schedule from the queued-resource sightings, a preemption
//! rate from the node sightings, the provisioning time and request failures fitted to what
//! was seen), with what could not be seen stated. Pure: it reads a store's export and events
//! handed to it and returns text; `tpu-runner capture` does the reading and writing.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::captured::{CapturedJob, Outcome};
use crate::engine::Timestamp;
use crate::engine::commands::JOB_CREATED;
use crate::engine::observe::Event;
use crate::engine::observe::POLICY_EVENT;
use crate::engine::sightings::{self, NODE_STATE, NODE_VANISHED, QR_STATE, QR_VANISHED};
use crate::engine::state::{Job, JobStatus, State};
use crate::spec::FleetSpec;

/// A captured scenario.
#[derive(Debug)]
pub struct Capture {
    /// `scenario.yaml`.
    pub scenario: String,
    /// `jobs.jsonl`.
    pub jobs: String,
    /// Jobs written.
    pub job_count: usize,
    /// Pools with capacity seen.
    pub pools: usize,
    /// What the replay cannot know or assumes, one sentence each (also in the scenario's
    /// description).
    pub notes: Vec<String>,
}

/// One pool's sightings, replayed in time order.
#[derive(Default)]
struct Pool {
    /// Queued resources by id and their last state.
    qrs: BTreeMap<String, String>,
    /// Nodes by id: their last state and since when READY.
    nodes: BTreeMap<String, (String, Option<Timestamp>)>,
    /// Capacity steps (seconds from the window's start, slices; `u32::MAX` unlimited).
    steps: Vec<(u64, u32)>,
    /// Seconds nodes were READY.
    ready_secs: f64,
    /// Nodes seen going PREEMPTED.
    preemptions: u32,
    /// Seconds requests waited for resources, and how many failed meanwhile.
    waiting_secs: f64,
    failures: u32,
    /// Since when the current number of waiting requests holds.
    waiting_since: Option<Timestamp>,
    /// When each queued resource was seen PROVISIONING.
    provisioning_since: BTreeMap<String, Timestamp>,
}

const WAITING: &[&str] = &["ACCEPTED", "WAITING_FOR_RESOURCES"];
const HELD: &[&str] = &["PROVISIONING", "ACTIVE"];

impl Pool {
    fn count(&self, states: &[&str]) -> u32 {
        self.qrs
            .values()
            .filter(|s| states.contains(&s.as_str()))
            .count() as u32
    }

    /// The capacity the pool showed: while a request waits, exactly what it held (the cloud
    /// gave all it had); otherwise nothing bounds it as far as was seen.
    fn capacity(&self) -> u32 {
        if self.count(WAITING) > 0 {
            self.count(HELD)
        } else {
            u32::MAX
        }
    }

    fn step(&mut self, at_secs: u64) {
        let value = self.capacity();
        match self.steps.last_mut() {
            Some(last) if last.1 == value => {}
            Some(last) if last.0 == at_secs => last.1 = value,
            _ => self.steps.push((at_secs, value)),
        }
    }
}

/// The capture of `state` (a store's export: active and finished jobs) and `events` between
/// `since` and `until`, for `fleet` (written beside the scenario as `fleet_file`).
pub fn capture(
    fleet: &FleetSpec,
    fleet_file: &str,
    state: &State,
    events: &[(u64, Event)],
    since: Timestamp,
    until: Timestamp,
) -> Capture {
    let mut notes = Vec::new();
    let secs = |at: Timestamp| at.secs_since(since).max(0.0);
    let horizon = until.secs_since(since).max(1.0);

    // Jobs.
    let all: Vec<&Job> = state
        .all_jobs()
        .filter(|j| j.submitted_at >= since && j.submitted_at < until)
        .collect();
    let mut jobs: Vec<CapturedJob> = Vec::new();
    let (mut never_ran, mut unfinished_unstarted) = (0, 0);
    for job in &all {
        let started: Vec<_> = job
            .attempts
            .iter()
            .filter(|a| a.started_at.is_some())
            .collect();
        let outcome = match job.status {
            JobStatus::Succeeded => Outcome::Succeeded,
            JobStatus::Failed => Outcome::Failed,
            JobStatus::Deactivated if started.is_empty() => {
                never_ran += 1;
                continue;
            }
            JobStatus::Deactivated => Outcome::Cancelled,
            JobStatus::Pending | JobStatus::Running | JobStatus::Cancelling => Outcome::Unfinished,
        };
        let work = started.last().map(|a| {
            let end = a.ended_at.unwrap_or(until).min(until);
            end.secs_since(a.started_at.expect("started")).max(0.0)
        });
        if work.is_none() && outcome == Outcome::Unfinished {
            unfinished_unstarted += 1;
        }
        jobs.push(CapturedJob {
            id: job.id.to_string(),
            at_secs: secs(job.submitted_at),
            types: super::captured::types_of(&job.spec, fleet),
            regions: job
                .bucket_regions
                .iter()
                .map(|b| b.region.clone())
                .collect(),
            priority: job.spec.priority,
            work_secs: work.unwrap_or(f64::NAN),
            outcome,
            attempts: job.attempts.len() as u32,
            waited_secs: started
                .first()
                .and_then(|a| a.started_at)
                .map(|at| at.secs_since(job.submitted_at)),
        });
    }
    // A job that never started has no observed work: it gets the median of those that did.
    let mut observed: Vec<f64> = jobs
        .iter()
        .filter(|j| j.outcome == Outcome::Succeeded)
        .map(|j| j.work_secs)
        .collect();
    observed.sort_by(f64::total_cmp);
    let median_work = observed.get(observed.len() / 2).copied().unwrap_or(3600.0);
    for j in &mut jobs {
        if j.work_secs.is_nan() {
            j.work_secs = median_work;
        }
    }
    jobs.sort_by(|a, b| {
        a.at_secs
            .total_cmp(&b.at_secs)
            .then_with(|| a.id.cmp(&b.id))
    });
    notes.push(format!(
        "{} jobs submitted in the window: work is each job's last attempt's run time (a job that checkpointed redoes less; a job with no attempt started gets the median, {:.0} s: {unfinished_unstarted} of them); application failures fail every attempt; {never_ran} cancelled before running are left out",
        jobs.len(),
        median_work
    ));
    let created = events
        .iter()
        .filter(|(_, e)| e.kind == JOB_CREATED && since <= e.at && e.at < until)
        .count();
    if created < jobs.len() {
        notes.push(format!(
            "{} jobs have no `job_created` event (submitted before events were recorded, or compacted): their submission time is the store's",
            jobs.len() - created
        ));
    }

    // Capacity per pool, from the sightings.
    let mut pools: BTreeMap<(String, String), Pool> = BTreeMap::new();
    let mut provisioning: Vec<f64> = Vec::new();
    for (_, e) in events.iter().filter(|(_, e)| since <= e.at && e.at < until) {
        let node = matches!(e.kind.as_str(), NODE_STATE | NODE_VANISHED);
        let qr = matches!(e.kind.as_str(), QR_STATE | QR_VANISHED);
        if !node && !qr {
            continue;
        }
        let f: BTreeMap<&str, &str> = sightings::fields(&e.detail).collect();
        let (Some(zone), Some(tpu_type)) = (f.get("zone"), f.get("type")) else {
            continue;
        };
        let Some(id) = e.resource_id.map(|n| n.to_string()) else {
            continue;
        };
        let pool = pools
            .entry((zone.to_string(), tpu_type.to_string()))
            .or_default();
        let to = f.get("to").map(|s| s.to_string());
        if node {
            let old = pool.nodes.remove(&id);
            if let Some((_, Some(ready))) = &old {
                pool.ready_secs += e.at.secs_since(*ready).max(0.0);
            }
            if let Some(to) = to {
                let was = old.as_ref().map(|(s, _)| s.as_str());
                if to == "PREEMPTED" && was != Some("PREEMPTED") {
                    pool.preemptions += 1;
                }
                let ready = (to == "READY").then_some(e.at);
                pool.nodes.insert(id, (to, ready));
            }
            continue;
        }
        // The time requests spent waiting so far.
        if let Some(from) = pool.waiting_since.take() {
            pool.waiting_secs += e.at.secs_since(from).max(0.0) * f64::from(pool.count(WAITING));
        }
        match to {
            Some(to) => {
                if to == "FAILED" && pool.qrs.get(&id).is_none_or(|s| s != "FAILED") {
                    pool.failures += 1;
                }
                if to == "PROVISIONING" {
                    pool.provisioning_since.entry(id.clone()).or_insert(e.at);
                }
                if to == "ACTIVE"
                    && let Some(from) = pool.provisioning_since.remove(&id)
                {
                    provisioning.push(e.at.secs_since(from));
                }
                pool.qrs.insert(id, to);
            }
            None => {
                pool.qrs.remove(&id);
                pool.provisioning_since.remove(&id);
            }
        }
        pool.waiting_since = Some(e.at);
        pool.step(secs(e.at) as u64);
    }
    for pool in pools.values_mut() {
        for (_, ready) in pool.nodes.values() {
            if let Some(ready) = ready {
                pool.ready_secs += until.secs_since(*ready).max(0.0);
            }
        }
        if let Some(from) = pool.waiting_since {
            pool.waiting_secs += until.secs_since(from).max(0.0) * f64::from(pool.count(WAITING));
        }
    }
    notes.push(
        "capacity is only seen while requests were made: a pool is unlimited except while one of its requests waited for resources, when it is what the pool held; pools never asked for are assumed unlimited".into(),
    );
    let (waited, failed) = pools
        .values()
        .fold((0.0, 0), |(w, f), p| (w + p.waiting_secs, f + p.failures));
    let qr_failure_per_hour = if waited > 0.0 {
        f64::from(failed) / (waited / 3600.0)
    } else {
        0.0
    };
    let provisioning_fit = lognormal(&provisioning);
    // Assignment to running on every worker: the launch call and the runner's set-up.
    let setups: Vec<f64> = all
        .iter()
        .flat_map(|j| &j.attempts)
        .filter_map(|a| Some(a.started_at?.secs_since(a.created_at)))
        .collect();
    let setup_fit = lognormal(&setups);
    if setup_fit.is_some() {
        notes.push(
            "API calls take no time in the replay: what they took is folded into the fitted set-up (assignment to running) and provisioning times".into(),
        );
    }

    // The policy: the fleet file's, checked against what the controllers recorded.
    let digest = fleet.policy.digest();
    let mut ran: Vec<String> = events
        .iter()
        .filter(|(_, e)| e.kind == POLICY_EVENT && since <= e.at && e.at < until)
        .map(|(_, e)| e.detail.clone())
        .collect();
    ran.sort();
    ran.dedup();
    let others: Vec<&String> = ran
        .iter()
        .filter(|d| !d.contains(&format!("digest={digest}")))
        .collect();
    let interval = format!(
        "interval={}ms",
        fleet.policy.engine.reconcile_interval_secs * 1000
    );
    if ran
        .iter()
        .any(|d| d.contains("interval=") && !d.contains(&interval))
    {
        notes.push(format!(
            "a controller passed at another interval than the fleet's {} s (`controller --interval`): the replay passes at the fleet's",
            fleet.policy.engine.reconcile_interval_secs
        ));
    }
    if ran.is_empty() {
        notes.push(format!(
            "no controller recorded its policy in the window: the fleet file's is assumed ({})",
            fleet.policy.describe()
        ));
    } else if !others.is_empty() {
        notes.push(format!(
            "the controllers also ran other policies than the fleet file's ({}): {}",
            fleet.policy.describe(),
            others
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }

    // The scenario.
    let q = |s: &str| serde_json::to_string(s).expect("a string serialises");
    let mut y = String::new();
    let _ = writeln!(
        y,
        "# Captured by `tpu-runner capture` from {since} to {until}."
    );
    let _ = writeln!(
        y,
        "# Replay: tpu-runner simulate scenario.yaml [--policy NAME]"
    );
    let _ = writeln!(y, "name: {}", q(&format!("capture-{}", fleet.name)));
    let _ = writeln!(y, "description: {}", q(&notes.join(". ")));
    let _ = writeln!(y, "fleet: {}", q(fleet_file));
    // Room after the window for what was still waiting to finish; a replay ends early once
    // nothing is left to do.
    let _ = writeln!(
        y,
        "horizon_hours: {}",
        (horizon + horizon.max(3600.0)) / 3600.0
    );
    let _ = writeln!(y, "seeds: [1, 2, 3, 4, 5]");
    let mut widths: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for e in &fleet.tpus {
        let w = widths.entry(e.tpu_type.chips()).or_default();
        if !w.contains(&e.tpu_type.to_string()) {
            w.push(e.tpu_type.to_string());
        }
    }
    let _ = writeln!(y, "types_by_width:");
    for (w, types) in &widths {
        let _ = writeln!(y, "  {w}: [{}]", types.join(", "));
    }
    let _ = writeln!(y, "cloud:");
    if let Some((median, sigma)) = provisioning_fit {
        let _ = writeln!(
            y,
            "  provisioning: {{median_secs: {median:.3}, sigma: {sigma:.3}}}  # fitted to {} requests seen provisioning",
            provisioning.len()
        );
    }
    if let Some((median, sigma)) = setup_fit {
        let _ = writeln!(
            y,
            "  workers:  # set-up fitted to {} attempts (assignment to running)\n    setup: {{median_secs: {median:.3}, sigma: {sigma:.3}}}\n    setup_warm: {{median_secs: {median:.3}, sigma: {sigma:.3}}}",
            setups.len()
        );
        let zero = "{median_secs: 0, sigma: 0}";
        let _ = writeln!(
            y,
            "  api_latency: {{read: {zero}, mutation: {zero}, remote: {zero}}}"
        );
    }
    let _ = writeln!(
        y,
        "  qr_failure_per_hour: {qr_failure_per_hour:.4}  # {failed} failures in {:.2} request-hours waiting",
        waited / 3600.0
    );
    let _ = writeln!(
        y,
        "  default_pool: {{capacity: unlimited, preemption_per_hour: 0}}"
    );
    let seen: Vec<_> = pools
        .iter()
        .filter(|((zone, t), _)| {
            fleet
                .tpus
                .iter()
                .any(|e| e.zone == *zone && e.tpu_type.to_string() == *t)
        })
        .collect();
    if !seen.is_empty() {
        let _ = writeln!(y, "  pools:");
    }
    for ((zone, t), p) in &seen {
        let rate = if p.ready_secs > 0.0 {
            f64::from(p.preemptions) / (p.ready_secs / 3600.0)
        } else {
            0.0
        };
        let steps: Vec<String> = p
            .steps
            .iter()
            .map(|(at, n)| {
                if *n == u32::MAX {
                    format!("[{at}, unlimited]")
                } else {
                    format!("[{at}, {n}]")
                }
            })
            .collect();
        let steps = if steps.is_empty() {
            "[0, unlimited]".to_owned()
        } else {
            steps.join(", ")
        };
        let _ = writeln!(
            y,
            "    - zone: {zone}\n      type: {t}\n      capacity: {{schedule: [{steps}]}}\n      preemption_per_hour: {rate:.4}  # {} preemptions in {:.2} node-hours READY",
            p.preemptions,
            p.ready_secs / 3600.0
        );
    }
    let _ = writeln!(
        y,
        "workload:\n  - kind: jobs\n    name: captured\n    file: jobs.jsonl"
    );
    let mut lines = String::new();
    for j in &jobs {
        lines.push_str(&serde_json::to_string(j).expect("plain data serialises"));
        lines.push('\n');
    }
    Capture {
        scenario: y,
        jobs: lines,
        job_count: jobs.len(),
        pools: seen.len(),
        notes,
    }
}

/// The median and log-normal shape of positive durations (at least two).
fn lognormal(values: &[f64]) -> Option<(f64, f64)> {
    let logs: Vec<f64> = values
        .iter()
        .filter(|v| **v > 0.0)
        .map(|v| v.ln())
        .collect();
    if logs.len() < 2 {
        return None;
    }
    let mean = logs.iter().sum::<f64>() / logs.len() as f64;
    let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (logs.len() - 1) as f64;
    Some((mean.exp(), var.sqrt()))
}
