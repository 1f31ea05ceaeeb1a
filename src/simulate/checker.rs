//! Invariants checked after every simulated step (TigerBeetle-style checkers): no TPU runs
//! two attempts, no job has two active attempts, every job is in one legal, self-consistent
//! state and only moves by legal transitions, live capacity never exceeds entry counts or
//! chip limits, no job is lost, priority order holds at assignment, priority preemption
//! displaces only lower priority and no job twice in its window, and liveness once faults
//! stop. Reads the state, the pass output and the simulated cloud; changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use super::harness::StepView;
use crate::engine::demand::Requirement;
use crate::engine::observe::LABEL_FLEET_ENTRY;
use crate::engine::state::{JobStatus, ResourceStatus};
use crate::engine::{FleetIndex, Timestamp};
use crate::spec::{EntryKind, Name, QuotaKey};

/// The invariant checker of one run.
#[derive(Debug, Default)]
pub struct Invariants {
    /// Last seen status per job (for transition legality).
    last_status: BTreeMap<Name, JobStatus>,
    /// Faults stop at this time; liveness is checked after it (`None`: never).
    faults_stop: Option<Timestamp>,
    /// A pending job that fits must start within this many seconds after faults stop.
    liveness_secs: i64,
    /// Per pending job: since when capacity for it has been free (liveness).
    capacity_since: BTreeMap<Name, Timestamp>,
    /// Per job: when it was last displaced by priority preemption.
    displaced_at: BTreeMap<Name, Timestamp>,
    /// Steps checked.
    pub steps: u64,
}

impl Invariants {
    /// A checker; liveness applies `liveness_secs` after `faults_stop`.
    pub fn new(faults_stop: Option<Timestamp>, liveness_secs: i64) -> Invariants {
        Invariants {
            faults_stop,
            liveness_secs,
            ..Invariants::default()
        }
    }

    /// Checks one step.
    pub fn check(&mut self, v: &StepView<'_>) -> Result<(), String> {
        self.steps += 1;
        self.one_attempt_per_tpu(v)?;
        self.jobs_consistent(v)?;
        self.no_job_lost(v)?;
        self.capacity_within_limits(v)?;
        self.priority_order(v)?;
        self.displacements_legal(v)?;
        self.liveness(v)
    }

    /// Priority preemption displaces only a job of strictly lower priority than the waiting
    /// job it is done for, and no job twice within the fleet's window.
    fn displacements_legal(&mut self, v: &StepView<'_>) -> Result<(), String> {
        let Some(out) = v.output else { return Ok(()) };
        let window = v
            .engine
            .index()
            .fleet
            .policy
            .priority_preemption
            .window_secs;
        for e in out.events.iter().filter(|e| e.kind == "job_displacing") {
            let Some(victim) = e.job_id.as_ref() else {
                continue;
            };
            let waiter = e.detail.strip_prefix("for=").unwrap_or_default();
            let (Some(v_job), Some(w_job)) = (v.state.job(victim), v.state.job(&Name::new(waiter)))
            else {
                return Err(format!(
                    "displacements legal: {victim} displaced for unknown job {waiter:?}"
                ));
            };
            if v_job.spec.priority >= w_job.spec.priority {
                return Err(format!(
                    "displacements legal: {victim} ({:?}) displaced for {waiter} ({:?}), not of higher priority",
                    v_job.spec.priority, w_job.spec.priority
                ));
            }
            if let Some(last) = self.displaced_at.get(victim)
                && !v.now.elapsed_since(*last, window)
            {
                return Err(format!(
                    "displacements legal: {victim} displaced twice within {window} s (at {last} and {})",
                    v.now
                ));
            }
            self.displaced_at.insert(*victim, v.now);
        }
        Ok(())
    }

    fn one_attempt_per_tpu(&self, v: &StepView<'_>) -> Result<(), String> {
        for (node, runs) in v.cloud.live_runs() {
            if runs.len() > 1 {
                return Err(format!(
                    "no TPU runs two attempts: {node} runs {}",
                    runs.join(" and ")
                ));
            }
        }
        let (busy, scanned) = (v.cloud.busy_chips(), v.cloud.busy_chips_of_all_runs());
        if busy != scanned {
            return Err(format!(
                "the simulator counts {busy} busy chips on its nodes but {scanned} over its runs"
            ));
        }
        let displaced = v.cloud.attempts_displaced();
        if displaced > 0 {
            return Err(format!(
                "no TPU runs two attempts: {displaced} attempt(s) were launched over another"
            ));
        }
        let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
        for r in v.state.resources.values() {
            if let Some(o) = &r.owner
                && let Some(other) = owners.insert(&o.job_id, &r.id)
            {
                return Err(format!(
                    "no job has two active attempts: job {} owns {other} and {}",
                    o.job_id, r.id
                ));
            }
        }
        for job in v.state.jobs.values() {
            let live = job
                .attempts
                .iter()
                .filter(|a| !a.status.is_terminal())
                .count();
            if live > 1 {
                return Err(format!(
                    "no job has two active attempts: job {} has {live}",
                    job.id
                ));
            }
        }
        Ok(())
    }

    fn jobs_consistent(&mut self, v: &StepView<'_>) -> Result<(), String> {
        for job in v.state.jobs.values() {
            if job.status.is_terminal() {
                return Err(format!(
                    "every job is in exactly one legal state: terminal job {} is still active",
                    job.id
                ));
            }
            match job.status {
                JobStatus::Pending
                    if job.assigned_resource.is_some()
                        || job.attempts.iter().any(|a| !a.status.is_terminal()) =>
                {
                    return Err(format!(
                        "pending job {} still holds a TPU or an active attempt",
                        job.id
                    ));
                }
                JobStatus::Running | JobStatus::Cancelling => {
                    let (Some(rid), Some(attempt)) = (&job.assigned_resource, job.attempt()) else {
                        return Err(format!(
                            "{} job {} has no TPU or attempt",
                            job.status.as_str(),
                            job.id
                        ));
                    };
                    if attempt.status.is_terminal() || attempt.resource_id != *rid {
                        return Err(format!(
                            "job {} runs ended or foreign attempt {}",
                            job.id, attempt.id
                        ));
                    }
                    let owned = v.state.resources.get(rid).is_some_and(|r| {
                        r.owned_by(&job.id, &attempt.id) && r.status != ResourceStatus::Idle
                    });
                    if !owned {
                        return Err(format!(
                            "job {} and TPU {rid} disagree on ownership",
                            job.id
                        ));
                    }
                }
                _ => {}
            }
        }
        for job in v.state.finished.values() {
            if !job.status.is_terminal() {
                return Err(format!(
                    "finished job {} is {}",
                    job.id,
                    job.status.as_str()
                ));
            }
            if job.attempts.iter().any(|a| !a.status.is_terminal()) {
                return Err(format!(
                    "finished job {} has an attempt that never ended",
                    job.id
                ));
            }
        }
        for job in v.state.all_jobs() {
            let previous = self.last_status.insert(job.id, job.status);
            if let Some(prev) = previous
                && prev != job.status
                && !legal_path(prev, job.status)
            {
                return Err(format!(
                    "illegal transition of job {}: {} -> {}",
                    job.id,
                    prev.as_str(),
                    job.status.as_str()
                ));
            }
        }
        if let Some(out) = v.output
            && !out.violations.is_empty()
        {
            return Err(format!(
                "the engine refused illegal transitions: {}",
                out.violations.join("; ")
            ));
        }
        Ok(())
    }

    fn no_job_lost(&self, v: &StepView<'_>) -> Result<(), String> {
        if v.submitted.len() != v.state.jobs.len() + v.state.finished.len() {
            for id in v.submitted {
                if v.state.job(id).is_none() {
                    return Err(format!("no job lost: job {id} was submitted but is gone"));
                }
            }
            return Err(format!(
                "no job lost: {} submitted but the state holds {}",
                v.submitted.len(),
                v.state.jobs.len() + v.state.finished.len()
            ));
        }
        Ok(())
    }

    fn capacity_within_limits(&self, v: &StepView<'_>) -> Result<(), String> {
        let index: &FleetIndex = v.engine.index();
        // Live capacity per entry (by label) and chips per quota key.
        let per_entry: BTreeMap<String, BTreeSet<String>> =
            v.cloud.live_capacity_by_label(LABEL_FLEET_ENTRY);
        let mut chips: BTreeMap<QuotaKey, u64> = BTreeMap::new();
        for e in &index.fleet.tpus {
            let live = per_entry.get(e.id.as_str()).map_or(0, BTreeSet::len) as u32;
            if let EntryKind::Managed { count } = e.kind {
                if live > count {
                    return Err(format!(
                        "entry counts never exceeded: entry {} has {live} live TPUs, count {count}",
                        e.id
                    ));
                }
                *chips.entry(e.quota_key()).or_default() +=
                    u64::from(live) * u64::from(e.chips_per_tpu());
            } else {
                *chips.entry(e.quota_key()).or_default() += u64::from(e.chips_per_tpu());
            }
        }
        for (key, limit) in &index.quotas {
            let used = chips.get(key).copied().unwrap_or(0);
            if used > u64::from(*limit) {
                return Err(format!(
                    "chip limits never exceeded: {} {} {} holds {used} chips, limit {limit}",
                    key.model.as_str(),
                    key.family,
                    key.zone
                ));
            }
        }
        Ok(())
    }

    fn priority_order(&self, v: &StepView<'_>) -> Result<(), String> {
        let Some(out) = v.output else { return Ok(()) };
        let assigned: Vec<(&Name, &Name)> = out
            .events
            .iter()
            .filter(|e| e.kind == "job_assigned")
            .filter_map(|e| Some((e.job_id.as_ref()?, e.resource_id.as_ref()?)))
            .collect();
        if assigned.is_empty() {
            return Ok(());
        }
        for (job_id, resource_id) in assigned {
            let (Some(job), Some(resource)) =
                (v.state.job(job_id), v.state.resources.get(resource_id))
            else {
                continue;
            };
            let rank = job.spec.priority.rank();
            for other in v.state.jobs.values() {
                if other.status == JobStatus::Pending
                    && other.spec.priority.rank() > rank
                    && other.not_before.is_none_or(|t| t <= v.now)
                    && Requirement::at(v.engine.index(), other, v.now)
                        .accepts_tpu(v.engine.index(), resource)
                {
                    return Err(format!(
                        "priority order held at assignment: {job_id} ({:?}) got {resource_id} while {} ({:?}) could use it and waits",
                        job.spec.priority, other.id, other.spec.priority
                    ));
                }
            }
        }
        Ok(())
    }

    /// Once faults stopped, a pending job that fits must start within `liveness_secs` of the
    /// moment spot capacity for it became (and stayed) free.
    fn liveness(&mut self, v: &StepView<'_>) -> Result<(), String> {
        let Some(stop) = self.faults_stop else {
            return Ok(());
        };
        if v.now < stop {
            return Ok(());
        }
        let index = v.engine.index();
        let cloud = v.cloud;
        let pools: BTreeMap<(&str, String, tpu_runner_sim::PoolModel), usize> = cloud
            .config()
            .pools
            .iter()
            .enumerate()
            .map(|(i, p)| ((p.zone.as_str(), p.accelerator.clone(), p.model), i))
            .collect();
        let live = cloud.live_per_pool();
        let free = |e: usize| -> bool {
            let entry = index.entry(e);
            let key = (
                entry.zone.as_str(),
                entry.tpu_type.to_string(),
                crate::backend::sim::pool_model(entry.provisioning_model),
            );
            match &entry.kind {
                EntryKind::Adopted { .. } => v
                    .state
                    .resources
                    .values()
                    .any(|r| r.entry_id == entry.id && r.status == ResourceStatus::Idle),
                EntryKind::Managed { count } => {
                    let busy = v
                        .state
                        .resources
                        .values()
                        .filter(|r| r.entry_id == entry.id && r.is_busy())
                        .count() as u32;
                    busy < *count
                        && pools
                            .get(&key)
                            .is_some_and(|&p| cloud.available_slices()[p] > live[p])
                }
            }
        };
        let mut waiting = BTreeSet::new();
        for job in v
            .state
            .jobs
            .values()
            .filter(|j| j.status == JobStatus::Pending)
        {
            let req = Requirement::at(index, job, v.now);
            if !(0..index.fleet.tpus.len()).any(|e| req.accepts_entry(index, e) && free(e)) {
                continue;
            }
            waiting.insert(job.id);
            let capacity_since = *self.capacity_since.entry(job.id).or_insert(v.now);
            let since = capacity_since
                .max(stop)
                .max(job.submitted_at)
                .max(job.not_before.unwrap_or(job.submitted_at));
            if v.now.elapsed_since(since, self.liveness_secs) {
                return Err(format!(
                    "liveness: job {} has waited since {since} although capacity for it was free and faults had stopped ({} s bound)",
                    job.id, self.liveness_secs
                ));
            }
        }
        self.capacity_since.retain(|id, _| waiting.contains(id));
        Ok(())
    }
}

/// Legal job moves between two steps: one pass makes at most one move per job, except a
/// requeue that is reassigned in the same pass (running → pending → running, unobservable).
fn legal_path(from: JobStatus, to: JobStatus) -> bool {
    from.can_become(to)
}
