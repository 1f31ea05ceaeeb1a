//! One reconcile pass (§3.3, in the original's order): refresh records from the inventory,
//! handle cancellations and interruptions, judge attempts, recycle and retire unusable TPUs,
//! assign pending jobs, size capacity, launch new attempts. Input: fleet, state, observation,
//! `now`; output: mutated state, actions, events and the next time a pass is needed.
//! Level-triggered and idempotent: a pass never depends on why it ran.

use std::sync::Arc;

use super::aggregate::{self, EXIT_RETRYABLE, FailureKind, Graces, Verdict};
use super::config::{DISK_RECOVERY_EVERY_SECS, EngineConfig, backoff_secs};
use super::demand::Demand;
use super::fleet_index::{EntryFacts, FleetIndex};
use super::memo::{Memo, QuietRun, is_candidate, is_pending};
use super::observe::{
    Action, ActionFailure, AttemptReport, CancelOutcome, CloudFailure, Event, Health,
    LaunchRequest, NodeInfo, NodeState, Observation, QueuedResourceInfo, RemoteErrorKind,
};
use super::observed::{ObservedIndex, Tpu};
use super::policy::{AssignInput, CapacityInput, Policy};
use super::state::{
    Attempt, AttemptStatus, Backoff, EndReason, FailureCounter, InterruptionStatus, Job, JobStatus,
    Placement, Resource, ResourceStatus, State,
};
use super::time::Timestamp;
use crate::spec::fleet::SshTransport;
use crate::spec::{Name, NameSet, ProvisioningModel, TpuEntry, names};

/// What one pass decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassOutput {
    /// Cloud and worker actions to carry out, in order.
    pub actions: Vec<Action>,
    /// Events for the log.
    pub events: Vec<Event>,
    /// The latest time the next pass should run even if nothing is observed to change.
    pub next_wake: Option<Timestamp>,
    /// Broken invariants (a bug): illegal transitions the engine refused to make.
    pub violations: Vec<String>,
}

/// Whether an attempt's remaining workers are stopped.
enum Stop {
    /// Confirmed: the TPU may take other work.
    Confirmed,
    /// A cancel is on its way; wait.
    Pending,
    /// Cancels kept failing; give up waiting and set the TPU aside.
    Unconfirmed,
}

/// How an attempt ends.
struct Finish<'s> {
    attempt_status: AttemptStatus,
    reason: EndReason,
    job_status: JobStatus,
    resource_status: ResourceStatus,
    exit_code: Option<i32>,
    summary: &'s str,
    /// Counts towards the TPU's retryable-failure counter and the job's infra retry cap.
    retryable: bool,
    /// Recycle the TPU when its counter reaches this (0 = never).
    recycle_threshold: u32,
    /// The job must be in this status (else the finish is a no-op).
    expected: JobStatus,
}

pub(crate) struct Pass<'a> {
    pub(super) index: &'a FleetIndex,
    pub(super) config: &'a EngineConfig,
    pub(super) policy: &'a dyn Policy,
    pub(super) state: &'a mut State,
    pub(super) obs: &'a Observation,
    pub(super) now: Timestamp,
    pub(super) out: PassOutput,
    /// The observation indexed: what is listed under each TPU name, queued resources by name.
    pub(super) observed: &'a ObservedIndex,
    /// What the last passes judged (a cache: see `memo`).
    pub(super) memo: &'a mut Memo,
    /// Entry facts of `obs.nodes` and `obs.queued_resources` (same order).
    pub(super) node_facts: &'a [EntryFacts],
    pub(super) qr_facts: &'a [EntryFacts],
    /// Node and QR names deleted during this pass.
    pub(super) deleted: NameSet,
    /// Attempts created by this pass's assignment (launched at the end).
    pub(super) new_launches: Vec<Action>,
    /// Desired TPUs per entry, decided with the assignment.
    pub(super) desired: Vec<u32>,
    /// TPU names pending jobs ask for.
    pub(super) named: NameSet,
    /// Running and cancelling jobs at the start of the pass.
    in_flight: Vec<(JobStatus, Name)>,
}

impl<'a> Pass<'a> {
    pub(crate) fn new(
        engine: &'a super::Engine,
        state: &'a mut State,
        obs: &'a Observation,
        observed: &'a ObservedIndex,
        memo: &'a mut Memo,
        now: Timestamp,
    ) -> Pass<'a> {
        Pass {
            index: &engine.index,
            config: &engine.config,
            policy: &*engine.policy,
            state,
            obs,
            now,
            out: PassOutput::default(),
            observed,
            memo,
            node_facts: &observed.node_facts,
            qr_facts: &observed.qr_facts,
            deleted: NameSet::default(),
            new_launches: Vec::new(),
            desired: Vec::new(),
            named: NameSet::default(),
            in_flight: Vec::new(),
        }
    }

    pub(crate) fn run(mut self) -> PassOutput {
        // One sweep over the active jobs finds the running and cancelling ones (a queue of
        // 100k jobs is memory-bound: every extra sweep costs milliseconds).
        let mut unprinted = Vec::new();
        for job in self.state.jobs.values() {
            if job.print.0.is_none() {
                unprinted.push(job.id);
            }
            if matches!(job.status, JobStatus::Running | JobStatus::Cancelling) {
                self.in_flight.push((job.status, job.id));
            }
        }
        // Only jobs read back from the store lack their print: the others keep theirs.
        for id in unprinted {
            if let Some(job) = self.state.jobs.get_mut(&id) {
                job.ensure_print();
            }
        }
        self.repair_ownership();
        self.action_failures();
        self.refresh_from_queued_resources();
        self.refresh_from_ready_nodes();
        self.adopted_disk_recovery();
        self.cancellations();
        self.interruptions();
        self.attempts();
        self.recycles();
        self.unusable_resources();
        self.assignment();
        self.capacity();
        self.launch_new_attempts();
        self.out
    }

    // ----- helpers -------------------------------------------------------------------

    pub(super) fn event(
        &mut self,
        kind: &str,
        job: Option<&Name>,
        resource: Option<&Name>,
        attempt: Option<&Name>,
        detail: String,
    ) {
        self.out.events.push(Event {
            at: self.now,
            kind: kind.to_owned(),
            job_id: job.copied(),
            resource_id: resource.copied(),
            attempt_id: attempt.copied(),
            detail,
        });
    }

    /// Emits `kind` only when the condition `key` changes to `value` (no repeats every pass).
    pub(super) fn notice(
        &mut self,
        key: String,
        value: String,
        kind: &str,
        resource: Option<&Name>,
    ) {
        if self.state.notices.get(&key) != Some(&value) {
            self.state.notices.insert(key, value.clone());
            self.event(kind, None, resource, None, value);
        }
    }

    /// Forgets the notice under `key` (formatted only when some notice stands: sizing clears
    /// one per entry on every pass).
    pub(super) fn clear_notice(&mut self, key: std::fmt::Arguments<'_>) {
        if !self.state.notices.is_empty() {
            self.state.notices.remove(&key.to_string());
        }
    }

    pub(super) fn wake_at(&mut self, at: Timestamp) {
        let at = at.max(self.now);
        self.out.next_wake = Some(self.out.next_wake.map_or(at, |w| w.min(at)));
    }

    pub(super) fn violation(&mut self, what: impl std::fmt::Display) {
        self.out.violations.push(what.to_string());
    }

    /// What is listed under the record's TPU name.
    pub(super) fn listed(&self, resource: &Resource) -> Option<&'a Tpu> {
        self.observed.tpu(&resource.tpu_name)
    }

    /// A node that counts: present and matching its declared entry.
    pub(super) fn matching_node(&self, resource: &Resource) -> Option<&'a NodeInfo> {
        let node = self.listed(resource)?.node.as_ref()?;
        (self.index.entry(node.facts.entry? as usize).id == resource.entry_id)
            .then_some(&*node.info)
    }

    pub(super) fn matching_qr(&self, resource: &Resource) -> Option<&'a QueuedResourceInfo> {
        // An entry match implies the name is `qr-<node id>`.
        let qr = self.listed(resource)?.qr.as_ref()?;
        (self.index.entry(qr.facts.entry? as usize).id == resource.entry_id).then_some(&*qr.info)
    }

    pub(super) fn transport_ok(&self, node: &NodeInfo) -> bool {
        match self.index.fleet.ssh_transport {
            SshTransport::Direct => node.public_ip,
            SshTransport::Iap => true,
        }
    }

    pub(super) fn ready(&self, node: &NodeInfo) -> bool {
        node.is_operational() && self.transport_ok(node)
    }

    /// A non-adopted declared ordinal of a managed Spot entry (eligible for recycling).
    fn recyclable(&self, resource: &Resource) -> bool {
        !resource.adopted
            && self.index.is_declared(resource)
            && self.index.entry_index(&resource.entry_id).is_some_and(|e| {
                let entry = self.index.entry(e);
                !entry.is_adopted() && entry.provisioning_model == ProvisioningModel::Spot
            })
    }

    pub(super) fn delete_qr(&mut self, name: &Name, zone: &Name) {
        if self.deleted.insert(name.to_owned()) {
            self.out.actions.push(Action::DeleteQueuedResource {
                name: name.to_owned(),
                zone: zone.to_owned(),
            });
        }
    }

    pub(super) fn delete_node(&mut self, name: &Name, zone: &Name) {
        if self.deleted.insert(name.to_owned()) {
            self.out.actions.push(Action::DeleteNode {
                name: name.to_owned(),
                zone: zone.to_owned(),
            });
        }
    }

    fn set_resource_status(&mut self, id: &Name, to: ResourceStatus) {
        if let Some(r) = self.state.resources.get_mut(id)
            && let Err(e) = r.set_status(to)
        {
            self.violation(e);
        }
    }

    /// finish_attempt (§2.1) plus the rewrite's retry cap and backoff.
    fn finish(&mut self, job_id: &Name, f: Finish<'_>) -> bool {
        let now = self.now;
        let config = *self.config;
        let Some(job) = self.state.jobs.get_mut(job_id) else {
            return false;
        };
        if job.status != f.expected {
            return false;
        }
        let (Some(attempt_id), Some(resource_id)) = (job.current_attempt, job.assigned_resource)
        else {
            self.out.violations.push(format!(
                "finish of job {job_id} without a current attempt and resource"
            ));
            return false;
        };
        let Some(attempt) = job.attempt_mut() else {
            self.out.violations.push(format!(
                "job {job_id} points at missing attempt {attempt_id}"
            ));
            return false;
        };
        if let Err(e) = attempt.end(f.attempt_status, f.reason, f.exit_code, f.summary, now) {
            self.out.violations.push(e.to_string());
            return false;
        }
        let interrupted = f.attempt_status == AttemptStatus::Interrupted;
        let mut job_status = f.job_status;
        let mut end_reason = None;
        if interrupted {
            job.interruptions += 1;
        }
        if job_status == JobStatus::Pending
            && interrupted
            && !job.spec.retry_on_infrastructure_failure
        {
            job_status = JobStatus::Failed;
            end_reason = Some("interrupted with retry_on_infrastructure_failure: false".to_owned());
        }
        if job_status == JobStatus::Pending && f.retryable && f.reason == EndReason::Lost {
            job.infra_failures += 1;
            if job.infra_failures > config.max_infra_retries {
                job_status = JobStatus::Failed;
                end_reason = Some(format!(
                    "infrastructure_retries_exhausted after {} failures",
                    job.infra_failures
                ));
            } else {
                let wait = backoff_secs(
                    config.infra_backoff_secs,
                    config.infra_backoff_max_secs,
                    job.infra_failures,
                );
                job.not_before = Some(now.plus_secs(wait));
            }
        }
        if let Err(e) = job.transition(job_status, now) {
            self.out.violations.push(e.to_string());
            return false;
        }
        if job_status.is_terminal() {
            job.end_reason = end_reason.or_else(|| Some(format!("{:?}", f.reason).to_lowercase()));
        }
        job.assigned_resource = None;
        let not_before = job.not_before;
        if let Some(t) = not_before.filter(|_| job_status == JobStatus::Pending) {
            self.wake_at(t);
        }
        // The resource.
        let Some(resource) = self.state.resources.get_mut(&resource_id) else {
            self.state.retire(job_id);
            return true;
        };
        if !resource.owned_by(job_id, &attempt_id) {
            self.out.violations.push(format!(
                "resource {resource_id} does not own attempt {attempt_id} of {job_id}"
            ));
            self.state.retire(job_id);
            return true;
        }
        let mut to = f.resource_status;
        if f.retryable {
            let count = match &resource.retryable_failures {
                Some(c) if c.job_id == *job_id => c.count + 1,
                _ => 1,
            };
            resource.retryable_failures = Some(FailureCounter {
                job_id: job_id.to_owned(),
                attempt_id: None,
                count,
            });
            if f.recycle_threshold > 0 && count >= f.recycle_threshold {
                to = ResourceStatus::Recycling;
            }
        } else {
            resource.retryable_failures = None;
        }
        if let Err(e) = resource.release(to, now) {
            self.out.violations.push(e.to_string());
        }
        if to == ResourceStatus::Recycling {
            let count = resource.retryable_failures.as_ref().map_or(0, |c| c.count);
            self.event(
                "retryable_infrastructure_recycle_scheduled",
                Some(job_id),
                Some(&resource_id),
                Some(&attempt_id),
                format!("failure_count={count}"),
            );
        }
        self.state.retire(job_id);
        true
    }

    /// Mark preempted (§3.8): an owned TPU loses its attempt; an unowned one is just gone.
    pub(super) fn mark_preempted(&mut self, resource_id: &Name) {
        let Some(resource) = self.state.resources.get(resource_id) else {
            return;
        };
        if let Some(owner) = resource.owner.clone() {
            let status = self.state.jobs.get(&owner.job_id).map(|j| j.status);
            let attempt_ok = self
                .state
                .jobs
                .get(&owner.job_id)
                .and_then(Job::attempt)
                .is_some_and(|a| a.id == owner.attempt_id);
            if attempt_ok && status == Some(JobStatus::Cancelling) {
                let done = self.finish(
                    &owner.job_id,
                    Finish {
                        attempt_status: AttemptStatus::Cancelled,
                        reason: EndReason::Cancelled,
                        job_status: JobStatus::Deactivated,
                        resource_status: ResourceStatus::Preempted,
                        exit_code: None,
                        summary: "TPU lost while cancelling",
                        retryable: false,
                        recycle_threshold: 0,
                        expected: JobStatus::Cancelling,
                    },
                );
                if done {
                    self.event(
                        "job_cancelled",
                        Some(&owner.job_id),
                        Some(resource_id),
                        Some(&owner.attempt_id),
                        "tpu lost".into(),
                    );
                }
                return;
            }
            if attempt_ok && status == Some(JobStatus::Running) {
                let done = self.finish(
                    &owner.job_id,
                    Finish {
                        attempt_status: AttemptStatus::Interrupted,
                        reason: EndReason::Preempted,
                        job_status: JobStatus::Pending,
                        resource_status: ResourceStatus::Preempted,
                        exit_code: None,
                        summary: "TPU preempted or lost",
                        retryable: false,
                        recycle_threshold: 0,
                        expected: JobStatus::Running,
                    },
                );
                if done {
                    let requeued = self
                        .state
                        .job(&owner.job_id)
                        .is_some_and(|j| j.status == JobStatus::Pending);
                    let detail = if requeued {
                        "reason=preempted; requeued"
                    } else {
                        "reason=preempted; retry disabled"
                    };
                    self.event(
                        "job_interrupted",
                        Some(&owner.job_id),
                        Some(resource_id),
                        Some(&owner.attempt_id),
                        detail.into(),
                    );
                }
                return;
            }
        }
        let now = self.now;
        // Most calls find the record released already: it is then left untouched.
        let released = self.state.resources.get(resource_id).is_some_and(|r| {
            r.status == ResourceStatus::Preempted
                && r.owner.is_none()
                && r.retryable_failures.is_none()
                && r.cancellation_failures.is_none()
                && r.idle_since.is_none()
                && r.provisioning_node_seen_at.is_none()
                && r.provisioning_node_missing_since.is_none()
        });
        if released {
            return;
        }
        if let Some(r) = self.state.resources.get_mut(resource_id) {
            r.retryable_failures = None;
            if let Err(e) = r.release(ResourceStatus::Preempted, now) {
                self.out.violations.push(e.to_string());
            }
            r.idle_since = None;
            r.provisioning_node_seen_at = None;
            r.provisioning_node_missing_since = None;
        }
    }

    // ----- step 0: ownership that does not point both ways (corrupted state) ------------

    /// A TPU owned by a job that does not run on it, or a running job whose TPU does not
    /// own it, can only come from a damaged state document. Each is reported as a violation
    /// and repaired so that nothing stays stuck and no job is lost: the TPU is released
    /// (unavailable until seen ready again) and the job requeued, pinned as before.
    fn repair_ownership(&mut self) {
        let now = self.now;
        let mut broken_tpus = Vec::new();
        // In-flight jobs proven intact by their TPU: a job is assigned one TPU, so each
        // reciprocal pair counts a distinct job.
        let mut intact = 0;
        for r in self.state.resources.values() {
            if let Some(o) = &r.owner {
                let job = self.state.jobs.get(&o.job_id).filter(|j| {
                    matches!(j.status, JobStatus::Running | JobStatus::Cancelling)
                        && j.assigned_resource == Some(r.id)
                        && j.current_attempt == Some(o.attempt_id)
                });
                match job {
                    None => broken_tpus.push(r.id),
                    Some(j) => {
                        intact += usize::from(j.attempt().is_some_and(|a| !a.status.is_terminal()));
                    }
                }
            }
        }
        for id in broken_tpus {
            let r = self.state.resources.get_mut(&id).expect("listed");
            let owner = r.owner.take().expect("owned");
            let _ = r.set_status(ResourceStatus::Unavailable);
            self.violation(format!(
                "TPU {id} was owned by {}/{} which does not run on it; released",
                owner.job_id, owner.attempt_id
            ));
        }
        if intact == self.in_flight.len() {
            return;
        }
        let mut broken_jobs = Vec::new();
        for (status, job_id) in &self.in_flight {
            let Some(job) = self.state.jobs.get(job_id) else {
                continue;
            };
            let owned = job
                .assigned_resource
                .as_ref()
                .and_then(|r| self.state.resources.get(r))
                .is_some_and(|r| {
                    job.current_attempt
                        .as_ref()
                        .is_some_and(|a| r.owned_by(job_id, a))
                })
                && job.attempt().is_some_and(|a| !a.status.is_terminal());
            if !owned {
                broken_jobs.push((*status, *job_id));
            }
        }
        for (status, job_id) in broken_jobs {
            let job = self.state.jobs.get_mut(&job_id).expect("listed");
            if let Some(a) = job.attempt_mut().filter(|a| !a.status.is_terminal()) {
                let _ = a.end(
                    AttemptStatus::Interrupted,
                    EndReason::Lost,
                    None,
                    "state damaged: the TPU did not own this attempt",
                    now,
                );
            }
            job.assigned_resource = None;
            // A cancelling job ends deactivated; a running one is requeued.
            let to = if status == JobStatus::Cancelling {
                JobStatus::Deactivated
            } else {
                JobStatus::Pending
            };
            if job.transition(to, now).is_ok() && to.is_terminal() {
                job.end_reason = Some("cancelled (state damaged)".into());
            }
            self.state.retire(&job_id);
            self.violation(format!(
                "{} job {job_id} had no TPU owning it; {}",
                status.as_str(),
                if status == JobStatus::Cancelling {
                    "deactivated"
                } else {
                    "requeued"
                }
            ));
        }
    }

    // ----- step 0: refusals of the previous pass ---------------------------------------

    fn action_failures(&mut self) {
        let failures: &'a [ActionFailure] = &self.obs.failures;
        for failure in failures {
            if let Action::CreateQueuedResource { entry_id, name, .. } = &failure.action {
                let (pause, reason) = match &failure.failure {
                    CloudFailure::AlreadyExists(_) | CloudFailure::NotFound(_) => continue,
                    CloudFailure::Stockout(m) => (true, format!("stockout: {m}")),
                    CloudFailure::QuotaExhausted(m) => (true, format!("quota exhausted: {m}")),
                    CloudFailure::RateLimited(m) => (true, format!("rate limited: {m}")),
                    CloudFailure::Unavailable(m) => (true, format!("unavailable: {m}")),
                    CloudFailure::Permanent(m) => (true, format!("refused: {m}")),
                };
                if pause {
                    let failures = self
                        .state
                        .entry_backoff
                        .get(entry_id)
                        .map_or(0, |b| b.failures)
                        + 1;
                    let wait = backoff_secs(
                        self.config.create_backoff_secs,
                        self.config.create_backoff_max_secs,
                        failures,
                    );
                    let until = self.now.plus_secs(wait);
                    self.state.entry_backoff.insert(
                        *entry_id,
                        Backoff {
                            failures,
                            until,
                            reason: reason.clone(),
                            request: *name,
                        },
                    );
                    self.event(
                        "queued_resource_create_failed",
                        None,
                        Some(name),
                        None,
                        format!("entry={entry_id}; {reason}; retry after {wait}s"),
                    );
                    self.wake_at(until);
                }
            }
        }
    }

    // ----- step 2: QR refresh ---------------------------------------------------------

    fn refresh_from_queued_resources(&mut self) {
        let qrs: &'a [Arc<QueuedResourceInfo>] = &self.obs.queued_resources;
        for (i, qr) in qrs.iter().enumerate() {
            if !qr.state.is_live() {
                continue;
            }
            let Some(entry_index) = self.qr_facts[i].entry.map(|e| e as usize) else {
                continue;
            };
            let entry = self.index.entry(entry_index);
            // The refused request now exists: the backoff has done its job.
            if self
                .state
                .entry_backoff
                .get(&entry.id)
                .is_some_and(|b| b.request == qr.name)
            {
                self.state.entry_backoff.remove(&entry.id);
            }
            // Records are looked at before being touched: the state tracks what a pass
            // changes, and most passes change nothing here.
            match self.state.resources.get(&qr.node_id) {
                None => {
                    self.state.resources.insert(
                        qr.node_id,
                        Resource::new(qr.node_id, entry, ResourceStatus::Provisioning, 1),
                    );
                }
                // A new incarnation of a TPU that was gone. Records being recycled, drained or
                // waited on are left alone (the original reset them, losing recycles: §9.1 #9).
                Some(r) if r.status.is_gone() && r.owner.is_none() => {
                    let r = self.state.resources.get_mut(&qr.node_id).expect("exists");
                    r.zone = entry.zone;
                    r.tpu_type = entry.tpu_type.clone();
                    r.entry_id = entry.id;
                    r.status = ResourceStatus::Provisioning;
                    r.idle_since = None;
                    r.provisioning_node_seen_at = None;
                    r.provisioning_node_missing_since = None;
                }
                Some(_) => {}
            }
        }
    }

    // ----- step 3: ready refresh --------------------------------------------------------

    fn refresh_from_ready_nodes(&mut self) {
        let nodes: &'a [Arc<NodeInfo>] = &self.obs.nodes;
        let now = self.now;
        for (i, node) in nodes.iter().enumerate() {
            let Some(entry_index) = self.node_facts[i].entry.map(|e| e as usize) else {
                continue;
            };
            let entry = self.index.entry(entry_index);
            let id = Resource::id_for(node.name, entry.is_adopted());
            let ready = self.ready(node);
            match self.state.resources.get(&id) {
                Some(r) if ready && needs_ready_refresh(r, entry, node) => {
                    let r = self.state.resources.get_mut(&id).expect("exists");
                    if r.zone != entry.zone {
                        r.zone.clone_from(&entry.zone);
                    }
                    if r.tpu_type != entry.tpu_type {
                        r.tpu_type.clone_from(&entry.tpu_type);
                    }
                    if r.entry_id != entry.id {
                        r.entry_id.clone_from(&entry.id);
                    }
                    r.adopted = entry.is_adopted();
                    r.worker_count = node.worker_count.max(1);
                    if r.owner.is_some() {
                        if r.status != ResourceStatus::Busy {
                            let _ = r.set_status(ResourceStatus::Busy);
                        }
                    } else if matches!(
                        r.status,
                        ResourceStatus::Deleted
                            | ResourceStatus::Preempted
                            | ResourceStatus::Provisioning
                            | ResourceStatus::Unavailable
                    ) {
                        r.retryable_failures = None;
                        r.cancellation_failures = None;
                        if let Err(e) = r.release(ResourceStatus::Idle, now) {
                            self.out.violations.push(e.to_string());
                        }
                    }
                }
                Some(_) => {}
                None => {
                    let status = if ready {
                        ResourceStatus::Idle
                    } else {
                        ResourceStatus::Unavailable
                    };
                    let mut record = Resource::new(node.name, entry, status, node.worker_count);
                    record.idle_since = (ready && !entry.is_adopted()).then_some(now);
                    self.state.resources.insert(id, record);
                }
            }
        }
    }

    // ----- step 4: adopted disk recovery -----------------------------------------------

    /// An idle adopted TPU that is READY but not healthy (a full disk makes its runtime
    /// unhealthy, and no job would ever be placed on it to clean it) gets its disk
    /// recovered: at most once per `DISK_RECOVERY_EVERY_SECS`. The previous pass's answers
    /// become events.
    fn adopted_disk_recovery(&mut self) {
        for done in &self.obs.disk_recoveries {
            let id = &done.resource_id;
            match &done.result {
                Ok(lines) if lines.iter().any(|l| l.contains(" RECOVERED ")) => self.event(
                    "adopted_tpu_disk_recovery_completed",
                    None,
                    Some(id),
                    None,
                    lines.join("; "),
                ),
                Ok(_) => {}
                Err(error) => self.event(
                    "adopted_tpu_disk_recovery_failed",
                    None,
                    Some(id),
                    None,
                    error.clone(),
                ),
            }
        }
        let nodes: &'a [Arc<NodeInfo>] = &self.obs.nodes;
        for (i, node) in nodes.iter().enumerate() {
            let Some(entry_index) = self.node_facts[i].entry.map(|e| e as usize) else {
                continue;
            };
            if !self.index.entry(entry_index).is_adopted()
                || node.state != NodeState::Ready
                || node.health == Health::Healthy
                || !self.transport_ok(node)
            {
                continue;
            }
            let id = Resource::id_for(node.name, true);
            let Some(r) = self.state.resources.get(&id) else {
                continue;
            };
            if !r.adopted
                || r.owner.is_some()
                || !matches!(r.status, ResourceStatus::Idle | ResourceStatus::Unavailable)
            {
                continue;
            }
            let key = format!("disk_recovery:{id}");
            let due = self
                .state
                .notices
                .get(&key)
                .and_then(|at| Timestamp::parse(at).ok())
                .is_none_or(|at| self.now.elapsed_since(at, DISK_RECOVERY_EVERY_SECS));
            if !due {
                continue;
            }
            let action = Action::RecoverDisk {
                resource_id: id,
                tpu_name: r.tpu_name,
                zone: r.zone,
                worker_count: r.worker_count,
            };
            self.state.notices.insert(key, self.now.to_string());
            self.out.actions.push(action);
        }
    }

    // ----- step 5: cancellations and interruptions --------------------------------------

    /// Jobs that were in `status` at the start of the pass (and still are).
    fn jobs_in(&self, status: JobStatus) -> Vec<Name> {
        self.in_flight
            .iter()
            .filter(|(s, id)| {
                *s == status && self.state.jobs.get(id).is_some_and(|j| j.status == status)
            })
            .map(|(_, id)| *id)
            .collect()
    }

    fn report(&self, attempt_id: &Name) -> Option<&'a AttemptReport> {
        self.obs.attempts.get(attempt_id)
    }

    fn graces(&self) -> Graces {
        Graces {
            partial_failure_secs: self.config.partial_failure_grace_secs,
            partial_success_secs: self.config.partial_success_grace_secs,
        }
    }

    fn cancellations(&mut self) {
        let cancelling: Vec<Name> = self.jobs_in(JobStatus::Cancelling);
        for job_id in cancelling {
            let job = &self.state.jobs[&job_id];
            let (Some(attempt), Some(resource_id)) =
                (job.attempt().cloned(), job.assigned_resource)
            else {
                continue;
            };
            let Some(resource) = self.state.resources.get(&resource_id).cloned() else {
                continue;
            };
            let report = self.report(&attempt.id);
            let statuses = report.map_or(&[][..], |r| &r.statuses[..]);
            let verdict =
                aggregate::aggregate(statuses, resource.worker_count, self.now, self.graces());
            let finished_remotely = !matches!(verdict, Verdict::Incomplete { .. });
            let outcome = report.and_then(|r| r.cancel.clone());
            let exit_code = match &verdict {
                Verdict::Succeeded => Some(0),
                Verdict::Failed { exit_code, .. } => Some(*exit_code),
                Verdict::Retryable { .. } => Some(EXIT_RETRYABLE),
                Verdict::Incomplete { .. } => None,
            };
            if finished_remotely || outcome == Some(CancelOutcome::NotRunning) {
                let done = self.finish(
                    &job_id,
                    Finish {
                        attempt_status: AttemptStatus::Cancelled,
                        reason: EndReason::Cancelled,
                        job_status: JobStatus::Deactivated,
                        resource_status: ResourceStatus::Idle,
                        exit_code,
                        summary: "cancelled",
                        retryable: false,
                        recycle_threshold: 0,
                        expected: JobStatus::Cancelling,
                    },
                );
                if done {
                    self.event(
                        "job_cancelled",
                        Some(&job_id),
                        Some(&resource_id),
                        Some(&attempt.id),
                        String::new(),
                    );
                }
                continue;
            }
            let failure = match &outcome {
                None | Some(CancelOutcome::NotRunning) => None,
                Some(CancelOutcome::Sent) => {
                    if let Some(r) = self.state.resources.get_mut(&resource_id) {
                        r.cancellation_failures = None;
                    }
                    None
                }
                Some(CancelOutcome::AttemptMismatch) => Some("attempt mismatch".to_owned()),
                Some(CancelOutcome::Error { error }) => Some(error.message.clone()),
            };
            if let Some(error) = failure {
                self.note_cancellation_failure(&job_id, &attempt, &resource, &error);
                if self
                    .state
                    .job(&job_id)
                    .is_some_and(|j| j.status != JobStatus::Cancelling)
                {
                    continue;
                }
            }
            self.out.actions.push(Action::Cancel {
                attempt_id: attempt.id,
                job_id,
                tpu_name: resource.tpu_name,
                zone: resource.zone,
            });
        }
    }

    /// Counts a failed cancel; at the threshold the attempt is given up: the job is
    /// deactivated and the TPU recycled (managed Spot) or, for adopted and on-demand TPUs
    /// that cannot be recycled, released (the next launch kills leftovers). The original
    /// never escalated those (§9.1 #8).
    fn note_cancellation_failure(
        &mut self,
        job_id: &Name,
        attempt: &Attempt,
        resource: &Resource,
        error: &str,
    ) {
        let count = match &resource.cancellation_failures {
            Some(c) if c.job_id == *job_id && c.attempt_id == Some(attempt.id) => c.count + 1,
            _ => 1,
        };
        if let Some(r) = self.state.resources.get_mut(&resource.id) {
            r.cancellation_failures = Some(FailureCounter {
                job_id: *job_id,
                attempt_id: Some(attempt.id),
                count,
            });
        }
        if count < self.config.cancel_escalation {
            self.event(
                "job_cancel_failure_recorded",
                Some(job_id),
                Some(&resource.id),
                Some(&attempt.id),
                format!("failure_count={count}; {error}"),
            );
            return;
        }
        let recyclable = self.recyclable(resource);
        let to = if recyclable {
            ResourceStatus::Recycling
        } else {
            ResourceStatus::Unavailable
        };
        let done = self.finish(
            job_id,
            Finish {
                attempt_status: AttemptStatus::Cancelled,
                reason: EndReason::Cancelled,
                job_status: JobStatus::Deactivated,
                resource_status: to,
                exit_code: None,
                summary: error,
                retryable: false,
                recycle_threshold: 0,
                expected: JobStatus::Cancelling,
            },
        );
        if done {
            let kind = if recyclable {
                "job_cancel_recycle_scheduled"
            } else {
                "job_cancel_escalated"
            };
            self.event(
                kind,
                Some(job_id),
                Some(&resource.id),
                Some(&attempt.id),
                format!("failure_count={count}; {error}"),
            );
        }
    }

    fn interruptions(&mut self) {
        let requested: Vec<Name> = self
            .state
            .interruption_requests
            .values()
            .filter(|r| r.status == InterruptionStatus::Requested)
            .map(|r| r.id)
            .collect();
        for id in requested {
            let request = self.state.interruption_requests[&id].clone();
            let rejection = self.validate_interruption(&request);
            let now = self.now;
            let req = self
                .state
                .interruption_requests
                .get_mut(&id)
                .expect("listed above");
            if let Err(reason) = rejection {
                req.error_summary = reason.clone();
                let _ = req.transition(InterruptionStatus::Rejected, now);
                self.event(
                    "controlled_interruption_rejected",
                    Some(&request.job_id),
                    Some(&request.resource_id),
                    Some(&request.attempt_id),
                    reason,
                );
                continue;
            }
            let _ = req.transition(InterruptionStatus::Processing, now);
            let qr_name =
                names::queued_resource_name(&self.state.resources[&request.resource_id].tpu_name);
            let zone = self.state.resources[&request.resource_id].zone;
            self.delete_qr(&qr_name, &zone);
            let req = self
                .state
                .interruption_requests
                .get_mut(&id)
                .expect("listed above");
            req.queued_resource_name = Some(qr_name);
            let _ = req.transition(InterruptionStatus::DeletionRequested, now);
            let done = self.finish(
                &request.job_id,
                Finish {
                    attempt_status: AttemptStatus::Interrupted,
                    reason: EndReason::Lost,
                    job_status: JobStatus::Pending,
                    resource_status: ResourceStatus::Draining,
                    exit_code: Some(EXIT_RETRYABLE),
                    summary: "controlled managed-Spot interruption",
                    retryable: false,
                    recycle_threshold: 0,
                    expected: JobStatus::Running,
                },
            );
            let kind = if !done {
                "controlled_interruption_attempt_requeue_failed"
            } else if self
                .state
                .job(&request.job_id)
                .is_some_and(|j| j.status == JobStatus::Pending)
            {
                "controlled_interruption_attempt_requeued"
            } else {
                "controlled_interruption_attempt_retry_suppressed"
            };
            self.event(
                kind,
                Some(&request.job_id),
                Some(&request.resource_id),
                Some(&request.attempt_id),
                String::new(),
            );
            self.event(
                "controlled_interruption_deletion_requested",
                Some(&request.job_id),
                Some(&request.resource_id),
                None,
                String::new(),
            );
        }
    }

    fn validate_interruption(
        &self,
        request: &super::state::InterruptionRequest,
    ) -> Result<(), String> {
        let resource = self
            .state
            .resources
            .get(&request.resource_id)
            .ok_or("unknown resource")?;
        let entry = self
            .index
            .entry_index(&resource.entry_id)
            .map(|e| self.index.entry(e))
            .ok_or("fleet entry no longer exists")?;
        if entry.is_adopted()
            || entry.provisioning_model != ProvisioningModel::Spot
            || resource.adopted
        {
            return Err("only managed Spot TPUs can be interrupted".into());
        }
        if entry.id != request.entry_id {
            return Err("the TPU's fleet entry changed".into());
        }
        if !self.index.is_declared(resource) {
            return Err("the TPU is not a declared ordinal".into());
        }
        let job = self.state.jobs.get(&request.job_id).ok_or("unknown job")?;
        let attempt = job.attempt().ok_or("the job has no current attempt")?;
        let reciprocal = resource.owned_by(&request.job_id, &request.attempt_id)
            && job.status == JobStatus::Running
            && job.assigned_resource.as_ref() == Some(&resource.id)
            && attempt.id == request.attempt_id
            && !attempt.status.is_terminal()
            && attempt.resource_id == resource.id;
        if !reciprocal {
            return Err("the TPU does not run that attempt of that job".into());
        }
        let node = self.matching_node(resource).ok_or("no matching TPU VM")?;
        if !self.ready(node) || node.state.is_terminal() || !node.spot {
            return Err("the TPU VM is not ready".into());
        }
        let qr = self
            .matching_qr(resource)
            .ok_or("no matching queued resource")?;
        if !qr.state.is_live() || qr.state.is_deleting() {
            return Err("the queued resource is not live".into());
        }
        if node
            .queued_resource
            .as_deref()
            .is_some_and(|q| q != qr.name)
        {
            return Err("the TPU points at a different queued resource".into());
        }
        Ok(())
    }

    // ----- step 6: attempts -------------------------------------------------------------

    fn attempts(&mut self) {
        // Most running jobs just keep running: a read-only sweep finds them and when to look
        // again; the others are handled one by one, in id order. (Handling one job never
        // changes whether another just keeps running: each touches only its own job, attempt
        // and TPU.) The sweep looks only at jobs whose judgement may have changed since the
        // last one (the memo); on a first pass, at every running job.
        let due = self.memo.runs.due(
            &self.state.jobs,
            &self.state.resources,
            self.observed,
            self.obs,
            self.config.heartbeat_timeout_secs,
            self.now,
        );
        // (No step before this one makes a job running: running now means running at the
        // start of the pass.)
        let ids: Vec<Name> = match due {
            Some(ids) => ids,
            None => self
                .in_flight
                .iter()
                .filter(|(status, _)| *status == JobStatus::Running)
                .map(|(_, id)| *id)
                .collect(),
        };
        let mut wakes = Vec::new();
        let mut running = Vec::new();
        for job_id in ids {
            let Some(job) = self
                .state
                .jobs
                .get(&job_id)
                .filter(|j| j.status == JobStatus::Running)
            else {
                continue;
            };
            match self.still_running(job) {
                Some((w, memo)) => {
                    wakes.extend(w.into_iter().flatten());
                    match memo {
                        Some(q) => self.memo.runs.quiet(job_id, q),
                        None => self.memo.runs.pending(job_id),
                    }
                }
                None => {
                    self.memo.runs.pending(job_id);
                    running.push(job_id);
                }
            }
        }
        wakes.extend(self.memo.runs.next_deadline());
        for t in wakes {
            self.wake_at(t);
        }
        for job_id in running {
            let job = &self.state.jobs[&job_id];
            let (Some(attempt), Some(resource_id)) =
                (job.attempt().cloned(), job.assigned_resource)
            else {
                self.violation(format!("running job {job_id} without attempt or resource"));
                continue;
            };
            let Some(resource) = self.state.resources.get(&resource_id).cloned() else {
                continue;
            };
            if !resource.owned_by(&job_id, &attempt.id) || attempt.resource_id != resource_id {
                self.violation(format!(
                    "running job {job_id} and resource {resource_id} disagree on ownership"
                ));
                continue;
            }
            match attempt.status {
                AttemptStatus::Launching => self.launching(&job_id, &attempt, &resource),
                AttemptStatus::Running => self.running(&job_id, &attempt, &resource),
                _ => self.violation(format!(
                    "running job {job_id} has ended attempt {}",
                    attempt.id
                )),
            }
        }
    }

    fn launch_action(&self, job_id: &Name, attempt: &Attempt, resource: &Resource) -> Action {
        launch_request(&self.state.jobs[job_id], resource, &attempt.id)
    }

    fn cancel_action(job_id: &Name, attempt: &Attempt, resource: &Resource) -> Action {
        Action::Cancel {
            attempt_id: attempt.id,
            job_id: job_id.to_owned(),
            tpu_name: resource.tpu_name,
            zone: resource.zone,
        }
    }

    fn launching(&mut self, job_id: &Name, attempt: &Attempt, resource: &Resource) {
        let report = self.report(&attempt.id);
        if attempt.failed_launch {
            // A hard launch failure waits for confirmed cleanup before it ends.
            let confirmed =
                report.and_then(|r| r.cancel.as_ref()) == Some(&CancelOutcome::NotRunning);
            let give_up = attempt.launch_failures
                >= self.config.max_launch_failures + self.config.max_cleanup_failures;
            if confirmed || give_up {
                let summary = attempt.error_summary.clone();
                let to = if confirmed {
                    ResourceStatus::Idle
                } else if self.recyclable(resource) {
                    ResourceStatus::Recycling
                } else {
                    ResourceStatus::Unavailable
                };
                if self.finish(
                    job_id,
                    Finish {
                        attempt_status: AttemptStatus::FailedSetup,
                        reason: EndReason::SetupFailed,
                        job_status: JobStatus::Failed,
                        resource_status: to,
                        exit_code: Some(2),
                        summary: &summary,
                        retryable: false,
                        recycle_threshold: 0,
                        expected: JobStatus::Running,
                    },
                ) {
                    self.event(
                        "job_failed",
                        Some(job_id),
                        Some(&resource.id),
                        Some(&attempt.id),
                        "exit_code=2; launch failed".into(),
                    );
                }
            } else {
                self.bump_launch_failures(job_id);
                self.event(
                    "failed_launch_cleanup_pending",
                    Some(job_id),
                    Some(&resource.id),
                    Some(&attempt.id),
                    String::new(),
                );
                self.out
                    .actions
                    .push(Self::cancel_action(job_id, attempt, resource));
            }
            return;
        }
        let statuses_present = report.is_some_and(|r| !r.statuses.is_empty());
        if report.is_some_and(|r| r.launched) || statuses_present {
            let now = self.now;
            if let Some(a) = self.state.jobs.get_mut(job_id).and_then(Job::attempt_mut)
                && let Err(e) = a.start(now)
            {
                self.out.violations.push(e.to_string());
            }
            self.event(
                "distributed_job_launched",
                Some(job_id),
                Some(&resource.id),
                Some(&attempt.id),
                format!("workers={}", resource.worker_count),
            );
            let started = self.state.jobs[job_id]
                .attempt()
                .cloned()
                .expect("current attempt");
            self.running(job_id, &started, resource);
            return;
        }
        match report.and_then(|r| r.launch_error.clone()) {
            None => self
                .out
                .actions
                .push(self.launch_action(job_id, attempt, resource)),
            Some(err) if err.kind == RemoteErrorKind::NotFound && self.recyclable(resource) => {
                let summary = format!("managed Spot TPU vanished during setup: {}", err.message);
                self.retryable_failure(job_id, attempt, resource, &summary, 1);
            }
            Some(err) if err.kind == RemoteErrorKind::Hard => {
                let summary = format!("failed_setup: {}", err.message);
                if let Some(a) = self.state.jobs.get_mut(job_id).and_then(Job::attempt_mut) {
                    a.failed_launch = true;
                    a.error_summary = super::state::last_chars(&summary, 4000);
                }
                self.out
                    .actions
                    .push(Self::cancel_action(job_id, attempt, resource));
            }
            Some(err) => {
                // Temporary (or NotFound on a TPU that cannot be recycled): retry, bounded.
                let failures = self.bump_launch_failures(job_id);
                let age_ok = !self
                    .now
                    .elapsed_since(attempt.created_at, self.config.stale_launch_secs);
                self.event(
                    "controller_temporary_access_error",
                    Some(job_id),
                    Some(&resource.id),
                    Some(&attempt.id),
                    err.message.clone(),
                );
                if failures < self.config.max_launch_failures && age_ok {
                    self.out
                        .actions
                        .push(self.launch_action(job_id, attempt, resource));
                    self.wake_at(attempt.created_at.plus_secs(self.config.stale_launch_secs));
                } else {
                    let summary =
                        format!("launch kept failing ({failures} tries): {}", err.message);
                    let threshold = if self.recyclable(resource) { 1 } else { 0 };
                    self.retryable_failure(job_id, attempt, resource, &summary, threshold);
                    if !self.recyclable(resource)
                        && let Some(r) = self.state.resources.get_mut(&resource.id)
                        && r.status == ResourceStatus::Idle
                    {
                        let _ = r.set_status(ResourceStatus::Unavailable);
                    }
                }
            }
        }
    }

    fn bump_launch_failures(&mut self, job_id: &Name) -> u32 {
        self.state
            .jobs
            .get_mut(job_id)
            .and_then(Job::attempt_mut)
            .map_or(0, |a| {
                a.launch_failures += 1;
                a.launch_failures
            })
    }

    /// The common case of `running`, decided without copying the attempt and its TPU: the
    /// attempt runs on a TPU that owns it, its workers have not all finished, and its
    /// heartbeat deadline is ahead (or its TPU is down, which the unusable-resource step
    /// handles). Then the only effect is when to look again: `Some` of the wake-ups.
    /// For a job that just keeps running: when to look again and, unless a grace period
    /// runs, what the judgement read (for the memo). `None`: the job needs handling.
    fn still_running(&self, job: &Job) -> Option<([Option<Timestamp>; 2], Option<QuietRun>)> {
        let job_id = &job.id;
        let attempt = job.attempt()?;
        let resource_id = job.assigned_resource.as_ref()?;
        let resource = self.state.resources.get(resource_id)?;
        if attempt.status != AttemptStatus::Running
            || attempt.lost.is_some()
            || attempt.resource_id != *resource_id
            || !resource.owned_by(job_id, &attempt.id)
        {
            return None;
        }
        let report = self.report(&attempt.id);
        let statuses = report.map_or(&[][..], |r| &r.statuses[..]);
        let Verdict::Incomplete { recheck_at } =
            aggregate::aggregate(statuses, resource.worker_count, self.now, self.graces())
        else {
            return None;
        };
        let (tpu_up, _, deadline) = self.heartbeat(attempt, resource, report);
        if tpu_up && self.now >= deadline {
            return None;
        }
        let memo = recheck_at.is_none().then(|| QuietRun {
            attempt: attempt.id,
            started: attempt.started_at.unwrap_or(attempt.created_at),
            resource: *resource_id,
            tpu_name: resource.tpu_name,
            deadline: tpu_up.then_some(deadline),
        });
        Some(([recheck_at, tpu_up.then_some(deadline)], memo))
    }

    /// For an attempt whose workers have not all finished: whether its TPU still looks
    /// healthy, its last sign of life, and the heartbeat deadline after it.
    fn heartbeat(
        &self,
        attempt: &Attempt,
        resource: &Resource,
        report: Option<&AttemptReport>,
    ) -> (bool, Timestamp, Timestamp) {
        let tpu_up = self.up_entry(resource).is_some();
        let heartbeat = report
            .and_then(|r| self.obs.heartbeat(r))
            .or(attempt.started_at)
            .unwrap_or(attempt.created_at);
        let deadline = heartbeat.plus_secs(self.config.heartbeat_timeout_secs);
        (tpu_up, heartbeat, deadline)
    }

    fn running(&mut self, job_id: &Name, attempt: &Attempt, resource: &Resource) {
        let report = self.report(&attempt.id);
        let statuses = report.map_or(&[][..], |r| &r.statuses[..]);
        let verdict =
            aggregate::aggregate(statuses, resource.worker_count, self.now, self.graces());
        // Already judged lost: finish once the stop is confirmed, whatever the exit codes the
        // stop itself caused (killed workers report 143).
        if let Some(summary) = attempt.lost.clone() {
            self.finish_lost(job_id, attempt, resource, &summary);
            return;
        }
        let complete = !matches!(verdict, Verdict::Incomplete { .. });
        // Workers without a final status may still run: they are stopped, and the stop
        // confirmed, before the attempt ends and its TPU can take other work.
        let mut unconfirmed = false;
        if complete && statuses.len() < resource.worker_count as usize {
            if let Verdict::Retryable {
                recycle: false,
                summary,
            } = &verdict
            {
                // Silent workers after partial success: lost, not failed.
                self.mark_lost(job_id, summary);
                let attempt = self.state.jobs[job_id]
                    .attempt()
                    .cloned()
                    .expect("current attempt");
                self.finish_lost(job_id, &attempt, resource, summary);
                return;
            }
            match self.workers_stopped(job_id, attempt, resource) {
                Stop::Pending => return,
                Stop::Confirmed => {}
                Stop::Unconfirmed => unconfirmed = true,
            }
        }
        self.judge(job_id, attempt, resource, verdict, report);
        if unconfirmed {
            self.set_aside(&resource.id);
        }
    }

    /// Records that `job_id`'s current attempt is lost (its workers are being stopped).
    fn mark_lost(&mut self, job_id: &Name, summary: &str) {
        if let Some(a) = self.state.jobs.get_mut(job_id).and_then(Job::attempt_mut) {
            a.lost.get_or_insert_with(|| summary.to_owned());
        }
    }

    /// A lost attempt ends (requeued) once its workers are confirmed stopped; a TPU whose
    /// workers could not be confirmed stopped is set aside rather than given other work.
    fn finish_lost(
        &mut self,
        job_id: &Name,
        attempt: &Attempt,
        resource: &Resource,
        summary: &str,
    ) {
        match self.workers_stopped(job_id, attempt, resource) {
            Stop::Pending => {}
            Stop::Confirmed => self.retryable_failure(job_id, attempt, resource, summary, 0),
            Stop::Unconfirmed => {
                self.retryable_failure(job_id, attempt, resource, summary, 0);
                self.set_aside(&resource.id);
            }
        }
    }

    /// After an unconfirmed stop: a managed Spot TPU is recycled (its leftovers die with it),
    /// any other is set unavailable (the next launch on it kills leftovers).
    fn set_aside(&mut self, resource_id: &Name) {
        let Some(resource) = self.state.resources.get(resource_id).cloned() else {
            return;
        };
        if resource.owner.is_some() || resource.status != ResourceStatus::Idle {
            return;
        }
        let to = if self.recyclable(&resource) {
            ResourceStatus::Recycling
        } else {
            ResourceStatus::Unavailable
        };
        self.set_resource_status(resource_id, to);
    }

    /// Ends a running attempt according to its workers' verdict.
    fn judge(
        &mut self,
        job_id: &Name,
        attempt: &Attempt,
        resource: &Resource,
        verdict: Verdict,
        report: Option<&'a AttemptReport>,
    ) {
        match verdict {
            Verdict::Incomplete { recheck_at } => {
                if let Some(t) = recheck_at {
                    self.wake_at(t);
                }
                // Silence only means a lost attempt on a TPU that still looks healthy; a TPU
                // that is gone is handled (as a preemption) by the unusable-resource step.
                let (tpu_up, heartbeat, deadline) = self.heartbeat(attempt, resource, report);
                if tpu_up && self.now >= deadline {
                    let summary = format!("no heartbeat from the workers since {heartbeat}");
                    self.mark_lost(job_id, &summary);
                    let attempt = self.state.jobs[job_id]
                        .attempt()
                        .cloned()
                        .expect("current attempt");
                    self.finish_lost(job_id, &attempt, resource, &summary);
                } else if tpu_up {
                    self.wake_at(deadline);
                }
            }
            Verdict::Succeeded => {
                if self.finish(
                    job_id,
                    Finish {
                        attempt_status: AttemptStatus::Succeeded,
                        reason: EndReason::Succeeded,
                        job_status: JobStatus::Succeeded,
                        resource_status: ResourceStatus::Idle,
                        exit_code: Some(0),
                        summary: "",
                        retryable: false,
                        recycle_threshold: 0,
                        expected: JobStatus::Running,
                    },
                ) {
                    self.event(
                        "job_succeeded",
                        Some(job_id),
                        Some(&resource.id),
                        Some(&attempt.id),
                        String::new(),
                    );
                }
            }
            Verdict::Failed {
                exit_code,
                kind,
                summary,
            } => {
                let (status, reason) = match kind {
                    FailureKind::Setup => (AttemptStatus::FailedSetup, EndReason::SetupFailed),
                    FailureKind::Command | FailureKind::Artifacts => {
                        (AttemptStatus::Failed, EndReason::ApplicationFailed)
                    }
                };
                if self.finish(
                    job_id,
                    Finish {
                        attempt_status: status,
                        reason,
                        job_status: JobStatus::Failed,
                        resource_status: ResourceStatus::Idle,
                        exit_code: Some(exit_code),
                        summary: &summary,
                        retryable: false,
                        recycle_threshold: 0,
                        expected: JobStatus::Running,
                    },
                ) {
                    self.event(
                        "job_failed",
                        Some(job_id),
                        Some(&resource.id),
                        Some(&attempt.id),
                        format!("exit_code={exit_code}; {kind:?}").to_lowercase(),
                    );
                }
            }
            Verdict::Retryable { recycle, summary } => {
                let threshold = if recycle {
                    1
                } else if self.recyclable(resource) {
                    self.config.recycle_threshold
                } else {
                    0
                };
                self.retryable_failure(job_id, attempt, resource, &summary, threshold);
            }
        }
    }

    /// Whether the attempt's remaining workers are confirmed stopped (the last cancel was sent
    /// or found nothing running). Otherwise sends a cancel (`Pending`); after
    /// `max_cleanup_failures` failed cancels it gives up waiting (`Unconfirmed`).
    fn workers_stopped(&mut self, job_id: &Name, attempt: &Attempt, resource: &Resource) -> Stop {
        match self.report(&attempt.id).and_then(|r| r.cancel.as_ref()) {
            Some(CancelOutcome::Sent | CancelOutcome::NotRunning) => Stop::Confirmed,
            Some(CancelOutcome::AttemptMismatch | CancelOutcome::Error { .. }) => {
                let failures = self
                    .state
                    .jobs
                    .get_mut(job_id)
                    .and_then(Job::attempt_mut)
                    .map_or(0, |a| {
                        a.stop_failures += 1;
                        a.stop_failures
                    });
                if failures >= self.config.max_cleanup_failures {
                    self.event(
                        "attempt_stop_unconfirmed",
                        Some(job_id),
                        Some(&resource.id),
                        Some(&attempt.id),
                        format!("{failures} failed cancels"),
                    );
                    return Stop::Unconfirmed;
                }
                self.out
                    .actions
                    .push(Self::cancel_action(job_id, attempt, resource));
                Stop::Pending
            }
            None => {
                self.out
                    .actions
                    .push(Self::cancel_action(job_id, attempt, resource));
                Stop::Pending
            }
        }
    }

    /// §3.4.1: requeue (pinned), count against the TPU and the job's retry cap.
    fn retryable_failure(
        &mut self,
        job_id: &Name,
        attempt: &Attempt,
        resource: &Resource,
        summary: &str,
        threshold: u32,
    ) {
        let threshold = if self.recyclable(resource) {
            threshold
        } else {
            0
        };
        let done = self.finish(
            job_id,
            Finish {
                attempt_status: AttemptStatus::Interrupted,
                reason: EndReason::Lost,
                job_status: JobStatus::Pending,
                resource_status: ResourceStatus::Idle,
                exit_code: Some(EXIT_RETRYABLE),
                summary,
                retryable: true,
                recycle_threshold: threshold,
                expected: JobStatus::Running,
            },
        );
        if let Some(job) = self.state.job(job_id).filter(|_| done) {
            let detail = match job.status {
                JobStatus::Pending => {
                    format!("reason=retryable_infrastructure; exit_code=75; requeued; {summary}")
                }
                _ => format!(
                    "reason=retryable_infrastructure; exit_code=75; {}",
                    job.end_reason.clone().unwrap_or_default()
                ),
            };
            self.event(
                "job_interrupted",
                Some(job_id),
                Some(&resource.id),
                Some(&attempt.id),
                detail,
            );
        }
    }

    // ----- step 7: recycles, unusable resources -----------------------------------------

    fn recycles(&mut self) {
        let ids: Vec<Name> = self
            .state
            .resources
            .values()
            .filter(|r| {
                matches!(
                    r.status,
                    ResourceStatus::Recycling | ResourceStatus::RecyclingRequested
                )
            })
            .map(|r| r.id)
            .collect();
        for id in ids {
            let resource = self.state.resources[&id].clone();
            if !self.recyclable(&resource) {
                // The original left these `recycling` and repeated the rejection every pass.
                self.event(
                    "retryable_infrastructure_recycle_rejected",
                    None,
                    Some(&id),
                    None,
                    "not a declared managed Spot TPU".into(),
                );
                self.set_resource_status(&id, ResourceStatus::Unavailable);
                continue;
            }
            let reason = if resource
                .cancellation_failures
                .as_ref()
                .is_some_and(|c| c.count >= self.config.cancel_escalation)
            {
                "stuck_cancellation"
            } else {
                "repeated_retryable_infrastructure_failure"
            };
            // Deletions are re-requested until seen happening (a lost request is not a stuck one):
            // the queued resource if there is one, else the node.
            let first = resource.status == ResourceStatus::Recycling;
            let target = match (self.matching_qr(&resource), self.matching_node(&resource)) {
                (Some(qr), _) => Some((true, !qr.state.is_deleting(), qr.name, qr.zone)),
                (None, Some(node)) => {
                    Some((false, !node.state.is_terminal(), node.name, node.zone))
                }
                (None, None) => None,
            };
            if let Some((is_qr, deletable, name, zone)) = target {
                if deletable {
                    let (kind, detail) = if is_qr {
                        self.delete_qr(&name, &zone);
                        (
                            "retryable_infrastructure_recycle_requested",
                            format!("reason={reason}"),
                        )
                    } else {
                        self.delete_node(&name, &zone);
                        (
                            "retryable_infrastructure_tpu_recycle_requested",
                            format!("reason={reason}:queued_resource_absent"),
                        )
                    };
                    if first {
                        self.event(kind, None, Some(&id), None, detail);
                        self.set_resource_status(&id, ResourceStatus::RecyclingRequested);
                    }
                }
                continue;
            }
            let now = self.now;
            if let Some(r) = self.state.resources.get_mut(&id) {
                r.retryable_failures = None;
                r.cancellation_failures = None;
                let _ = r.release(ResourceStatus::Preempted, now);
            }
            self.event(
                "retryable_infrastructure_recycle_completed",
                None,
                Some(&id),
                None,
                String::new(),
            );
        }
    }

    fn unusable_resources(&mut self) {
        // Handling one record never touches another record, so the healthy majority and the
        // long gone can be skipped up front without copying their ids; of those, only records
        // found with something to do last time, or changed since, are looked at.
        let ids: Vec<Name> = match self.memo.records.due(&self.state.resources, self.observed) {
            Some(mut ids) => {
                ids.retain(|id| !self.nothing_to_do(&self.state.resources[id]));
                ids
            }
            None => {
                let records = self.state.resources.iter();
                let busy = records.filter(|(_, r)| !self.nothing_to_do(r));
                busy.map(|(id, _)| *id).collect()
            }
        };
        self.memo.records.busy.clone_from(&ids);
        for id in ids {
            let resource = self.state.resources[&id].clone();
            if matches!(
                resource.status,
                ResourceStatus::Recycling | ResourceStatus::RecyclingRequested
            ) {
                continue;
            }
            // Records of removed entries, and ordinals above a lowered `count`, are drained.
            if self.index.owns_record(&resource).is_none()
                || (!resource.adopted && !self.index.is_declared(&resource))
            {
                self.orphaned_record(&resource);
                continue;
            }
            let qr = if resource.adopted {
                None
            } else {
                self.matching_qr(&resource)
            };
            // (a) a terminal QR ends the TPU, even if the node still looks ready.
            // Deleting and suspending requests count as terminal too: their TPU is going away.
            if let Some(qr) = qr
                && !qr.state.is_live()
            {
                if !resource.status.is_gone() || resource.owner.is_some() {
                    self.mark_preempted(&id);
                }
                continue;
            }
            let node = self
                .matching_node(&resource)
                .filter(|_| self.index.is_declared(&resource));
            // (b) healthy and in use: nothing to do.
            if let Some(n) = node
                && self.ready(n)
                && resource.status != ResourceStatus::Draining
            {
                if resource.provisioning_node_seen_at.is_some()
                    || resource.provisioning_node_missing_since.is_some()
                {
                    let r = self.state.resources.get_mut(&id).expect("exists");
                    r.provisioning_node_seen_at = None;
                    r.provisioning_node_missing_since = None;
                }
                continue;
            }
            if resource.adopted {
                // (c) adopted TPUs are never deleted.
                match node {
                    Some(n) if !n.state.is_terminal() => {
                        if resource.owner.is_none()
                            && resource.status != ResourceStatus::Unavailable
                        {
                            self.set_resource_status(&id, ResourceStatus::Unavailable);
                        }
                    }
                    _ => {
                        if resource.owner.is_some() {
                            self.mark_preempted(&id);
                        } else if resource.status != ResourceStatus::Unavailable {
                            self.set_resource_status(&id, ResourceStatus::Unavailable);
                        }
                    }
                }
                continue;
            }
            let live_qr = qr.filter(|q| q.state.is_live());
            match (node, live_qr) {
                // (d) no node yet (or any more), live QR.
                (None, Some(qr)) => {
                    if resource.owner.is_some() {
                        self.mark_preempted(&id);
                        continue;
                    }
                    if resource.status == ResourceStatus::Draining {
                        // Deletion was asked for; ask again until the request is seen deleting
                        // (a lost or refused delete must not leave it stuck here forever).
                        if !qr.state.is_deleting() {
                            self.delete_qr(&qr.name, &qr.zone);
                        }
                        continue;
                    }
                    // A provisioning request whose node was seen, or an ACTIVE request whose
                    // node is gone (it vanished: nothing will bring it back), is recycled after
                    // the grace. The original only handled the first and waited forever on
                    // the second.
                    let node_was_there = (qr.state == super::observe::QrState::Provisioning
                        && resource.provisioning_node_seen_at.is_some())
                        || qr.state == super::observe::QrState::Active;
                    if node_was_there {
                        let since = resource.provisioning_node_missing_since.unwrap_or(self.now);
                        if self.now.elapsed_since(since, self.config.orphan_grace_secs) {
                            self.delete_qr(&qr.name, &qr.zone);
                            let r = self.state.resources.get_mut(&id).expect("exists");
                            let _ = r.set_status(ResourceStatus::Draining);
                            r.provisioning_node_seen_at = None;
                            r.provisioning_node_missing_since = None;
                            self.event(
                                "orphaned_provisioning_tpu_recycling",
                                None,
                                Some(&id),
                                None,
                                format!(
                                    "missing_since={since}; grace_seconds={}",
                                    self.config.orphan_grace_secs
                                ),
                            );
                            continue;
                        }
                        self.wake_at(since.plus_secs(self.config.orphan_grace_secs));
                        if resource.provisioning_node_missing_since != Some(since) {
                            self.state
                                .resources
                                .get_mut(&id)
                                .expect("exists")
                                .provisioning_node_missing_since = Some(since);
                        }
                    }
                    if self.state.resources[&id].status != ResourceStatus::Provisioning {
                        let r = self.state.resources.get_mut(&id).expect("exists");
                        let _ = r.release(ResourceStatus::Provisioning, self.now);
                        r.idle_since = None;
                    }
                }
                // (e) node present but not ready, live QR: wait for it.
                (Some(n), Some(_))
                    if !n.is_operational()
                        && !n.state.is_terminal()
                        && resource.owner.is_none() =>
                {
                    let now = self.now;
                    let r = &self.state.resources[&id];
                    let settled = matches!(
                        r.status,
                        ResourceStatus::Provisioning | ResourceStatus::Draining
                    ) && r.provisioning_node_seen_at.is_some()
                        && r.provisioning_node_missing_since.is_none();
                    if !settled {
                        let r = self.state.resources.get_mut(&id).expect("exists");
                        if r.status != ResourceStatus::Provisioning
                            && r.status != ResourceStatus::Draining
                        {
                            let _ = r.release(ResourceStatus::Provisioning, now);
                            r.idle_since = None;
                        }
                        r.provisioning_node_seen_at.get_or_insert(now);
                        r.provisioning_node_missing_since = None;
                    }
                }
                // (f) node present otherwise.
                (Some(n), live) => {
                    if n.state.is_terminal() && resource.owner.is_some() {
                        self.mark_preempted(&id);
                        continue;
                    }
                    let draining = resource.status == ResourceStatus::Draining;
                    if !draining
                        && n.state == super::observe::NodeState::Ready
                        && n.health == super::observe::Health::UnhealthyMaintenance
                    {
                        if resource.owner.is_none()
                            && resource.status != ResourceStatus::Unavailable
                        {
                            self.set_resource_status(&id, ResourceStatus::Unavailable);
                            self.event(
                                "spot_tpu_waiting_for_maintenance",
                                None,
                                Some(&id),
                                None,
                                String::new(),
                            );
                        }
                        continue;
                    }
                    if !draining
                        && !n.state.is_terminal()
                        && n.state != super::observe::NodeState::Ready
                    {
                        if resource.owner.is_none() {
                            self.set_resource_status(&id, ResourceStatus::Unavailable);
                        }
                        continue;
                    }
                    if n.state == super::observe::NodeState::Ready
                        && resource.owner.is_some()
                        && live.is_some()
                        && n.is_operational()
                    {
                        continue; // ready but wrong transport while owned: let the run finish
                    }
                    if n.state != super::observe::NodeState::Deleting {
                        self.delete_node(&n.name, &n.zone);
                    }
                    if !draining {
                        if resource.owner.is_some() {
                            self.mark_preempted(&id);
                        }
                        let r = self.state.resources.get_mut(&id).expect("exists");
                        if r.owner.is_none() {
                            let _ = r.set_status(ResourceStatus::Draining);
                        }
                        self.event(
                            "unusable_spot_tpu_deleting",
                            None,
                            Some(&id),
                            None,
                            format!("state={:?}; health={:?}", n.state, n.health),
                        );
                    }
                }
                // (g) nothing left.
                (None, None) => {
                    if resource.owner.is_some() {
                        self.mark_preempted(&id);
                    } else if !resource.status.is_gone() {
                        self.mark_preempted(&id);
                        self.event(
                            "idle_spot_tpu_missing",
                            None,
                            Some(&id),
                            None,
                            String::new(),
                        );
                    }
                }
            }
        }
    }

    /// The unusable-resource step has nothing to do for `r`, decided with one lookup and
    /// without copying the record: either a managed TPU that is gone, runs nothing and has
    /// neither node nor queued resource (case (g) with a gone record), or the common case: a
    /// declared TPU whose node is ready behind a live request, not draining, no timers set.
    fn nothing_to_do(&self, r: &Resource) -> bool {
        let Some(tpu) = self.listed(r) else {
            return !r.adopted && r.owner.is_none() && r.status.is_gone();
        };
        !matches!(
            r.status,
            ResourceStatus::Recycling
                | ResourceStatus::RecyclingRequested
                | ResourceStatus::Draining
        ) && r.provisioning_node_seen_at.is_none()
            && r.provisioning_node_missing_since.is_none()
            && self
                .up_entry_of(r, tpu)
                .is_some_and(|e| self.index.declares(self.index.entry(e), r))
    }

    /// The entry of a ready `matching_node(r)` with, unless adopted, a live `matching_qr(r)`,
    /// found with one lookup: once the node is of the record's entry (ids are unique), the
    /// request matches when it is of the same entry.
    fn up_entry(&self, r: &Resource) -> Option<usize> {
        self.up_entry_of(r, self.listed(r)?)
    }

    /// `up_entry(r)`, given what is listed under its TPU name.
    fn up_entry_of(&self, r: &Resource, tpu: &Tpu) -> Option<usize> {
        let node = tpu.node.as_ref()?;
        let e = node.facts.entry?;
        let up = self.index.entry(e as usize).id == r.entry_id
            && self.ready(&node.info)
            && (r.adopted
                || tpu
                    .qr
                    .as_ref()
                    .is_some_and(|q| q.facts.entry == Some(e) && q.info.state.is_live()));
        up.then_some(e as usize)
    }

    /// A record whose entry was removed or changed (§9.1 #11: the original orphaned these).
    fn orphaned_record(&mut self, resource: &Resource) {
        if resource.status.is_gone() && resource.owner.is_none() {
            return;
        }
        if resource.owner.is_some() {
            self.mark_preempted(&resource.id);
        }
        if resource.adopted {
            self.set_resource_status(&resource.id, ResourceStatus::Deleted);
            return;
        }
        let qr = self
            .observed
            .qr_named(&names::queued_resource_name(&resource.tpu_name))
            .map(|q| &*q.info);
        let node = self
            .listed(resource)
            .and_then(|t| t.node.as_ref())
            .map(|n| &*n.info);
        match (qr, node) {
            (Some(q), _) if !q.state.is_deleting() => self.delete_qr(&q.name, &q.zone),
            (None, Some(n)) if n.state != super::observe::NodeState::Deleting => {
                self.delete_node(&n.name, &n.zone)
            }
            (None, None) => {
                let now = self.now;
                if let Some(r) = self.state.resources.get_mut(&resource.id) {
                    let _ = r.release(ResourceStatus::Deleted, now);
                    r.idle_since = None;
                }
                return;
            }
            _ => {}
        }
        if resource.status != ResourceStatus::Draining {
            self.set_resource_status(&resource.id, ResourceStatus::Draining);
            self.event(
                "orphaned_entry_tpu_deleting",
                None,
                Some(&resource.id),
                None,
                if self.index.owns_record(resource).is_none() {
                    format!("entry={} no longer in the fleet", resource.entry_id)
                } else {
                    format!("entry={}: beyond its count", resource.entry_id)
                },
            );
        }
    }

    // ----- step 7: assignment -------------------------------------------------------------

    /// Assignment, and the capacity plan for the state right after it: the demand is built
    /// once per pass, before any job changes, and capacity sees it with the chosen pairs
    /// already taken out.
    fn assignment(&mut self) {
        let index = self.index;
        let now = self.now;
        let kept = self
            .memo
            .assign
            .update(&self.state.jobs, &self.state.resources, index);
        let (pairs, waits, desired, named) = {
            let pending = if kept {
                self.memo.assign.pending(&self.state.jobs)
            } else {
                self.state.jobs.values().filter(|j| is_pending(j)).collect()
            };
            let demand = Demand::build_with(index, pending, now, &mut self.memo.classes);
            let waits: Vec<Timestamp> = demand
                .jobs
                .iter()
                .filter(|j| !j.assignable)
                .filter_map(|j| j.job.not_before)
                .collect();
            let candidates: Vec<&Resource> = if kept {
                self.memo.assign.idle(&self.state.resources)
            } else {
                let records = self.state.resources.values();
                records.filter(|r| is_candidate(r, index)).collect()
            };
            let pairs = self.policy.assign(&AssignInput {
                index,
                demand: &demand,
                tpus: &candidates,
            });
            let mut waiting = vec![true; demand.jobs.len()];
            let mut taken = vec![false; candidates.len()];
            let mut busy = if kept {
                self.memo.assign.busy().to_vec()
            } else {
                let mut busy = vec![0u32; index.fleet.tpus.len()];
                for r in self.state.resources.values().filter(|r| r.is_busy()) {
                    if let Some(e) = index.owns_record(r) {
                        busy[e] += 1;
                    }
                }
                busy
            };
            for &(j, t) in &pairs {
                waiting[j] = false;
                taken[t] = true;
                if let Some(e) = index.owns_record(candidates[t]) {
                    busy[e] += 1;
                }
            }
            let idle_adopted: Vec<&Resource> = candidates
                .iter()
                .zip(&taken)
                .filter(|(r, taken)| r.adopted && !**taken)
                .map(|(r, _)| *r)
                .collect();
            let capacity = CapacityInput {
                index,
                demand: &demand,
                waiting: &waiting,
                busy: &busy,
                idle_adopted: &idle_adopted,
                now,
            };
            let desired = self.policy.desired_counts(&capacity);
            let mut waits = waits;
            waits.extend(self.policy.changes_at(&capacity));
            // Names asked for by a class with a waiting job (no need to visit every job).
            let mut class_waits = vec![false; demand.classes.len()];
            for (j, w) in demand.jobs.iter().zip(&waiting) {
                class_waits[j.class as usize] |= *w;
            }
            let named: NameSet = demand
                .classes
                .iter()
                .zip(&class_waits)
                .filter(|(_, w)| **w)
                .filter_map(|(c, _)| c.req.tpu_name.map(Name::new))
                .collect();
            // Applied in job-id order, so the lookups into a large queue walk it in order;
            // `usize` is the pair's place in the policy's order, which the output keeps.
            let mut by_job: Vec<(usize, usize, usize)> = pairs
                .into_iter()
                .enumerate()
                .map(|(pos, (j, t))| (j, t, pos))
                .collect();
            by_job.sort_unstable();
            let pairs: Vec<(Name, Name, usize)> = by_job
                .into_iter()
                .map(|(j, t, pos)| (demand.jobs[j].job.id, candidates[t].id, pos))
                .collect();
            (pairs, waits, desired, named)
        };
        for t in waits {
            self.wake_at(t);
        }
        self.desired = desired;
        self.named = named;
        let (first_event, first_launch) = (self.out.events.len(), self.new_launches.len());
        let mut event_pos = Vec::with_capacity(pairs.len());
        let mut launch_pos = Vec::with_capacity(pairs.len());
        for (job_id, resource_id, pos) in pairs {
            let (events, launches) = (self.out.events.len(), self.new_launches.len());
            self.assign_job(&job_id, &resource_id);
            event_pos.resize(event_pos.len() + self.out.events.len() - events, pos);
            launch_pos.resize(launch_pos.len() + self.new_launches.len() - launches, pos);
        }
        in_order_of(&mut self.out.events, first_event, &event_pos);
        in_order_of(&mut self.new_launches, first_launch, &launch_pos);
    }

    /// assign_job (§2.1): re-checks everything, pins the placement, creates the attempt.
    fn assign_job(&mut self, job_id: &Name, resource_id: &Name) {
        let now = self.now;
        let policy = self.policy.name();
        // Both records at once (disjoint fields of the state): one lookup each.
        let State {
            jobs, resources, ..
        } = &mut *self.state;
        let (Some(job), Some(resource)) = (jobs.get_mut(job_id), resources.get_mut(resource_id))
        else {
            return;
        };
        let usable = job.status == JobStatus::Pending
            && resource.status == ResourceStatus::Idle
            && !resource.is_busy()
            && super::demand::Requirement::of(job).accepts_resource(resource);
        if !usable {
            self.out.violations.push(format!(
                "policy {policy} paired job {job_id} with unusable TPU {resource_id}"
            ));
            return;
        }
        let Some((region, _)) = resource.zone.rsplit_once('-') else {
            return;
        };
        let placement = match &job.placement {
            Some(p) => p.clone(),
            None => match job.bucket_regions.iter().find(|b| b.region == region) {
                Some(b) => Placement {
                    region: region.to_owned(),
                    bucket: b.bucket.clone(),
                },
                None => return,
            },
        };
        let attempt_id = names::attempt_id(
            job_id,
            resource_id,
            job.current_attempt.as_ref().map_or("", Name::as_str),
        );
        if let Err(e) = resource.occupy(job_id, &attempt_id) {
            self.out.violations.push(e.to_string());
            return;
        }
        if let Err(e) = job.transition(JobStatus::Running, now) {
            self.out.violations.push(e.to_string());
            return;
        }
        let priority = ["low", "normal", "high"][job.spec.priority.rank() as usize];
        let detail = format!(
            "tpu_name={}; region={}; bucket={}; priority={priority}",
            resource.tpu_name, placement.region, placement.bucket
        );
        job.placement = Some(placement);
        job.assigned_resource = Some(*resource_id);
        job.current_attempt = Some(attempt_id);
        job.not_before = None;
        job.attempts.push(Attempt {
            id: attempt_id,
            resource_id: *resource_id,
            tpu_name: resource.tpu_name,
            zone: resource.zone,
            status: AttemptStatus::Launching,
            created_at: now,
            started_at: None,
            ended_at: None,
            end_reason: None,
            exit_code: None,
            error_summary: String::new(),
            launch_failures: 0,
            failed_launch: false,
            stop_failures: 0,
            lost: None,
        });
        // Launched at the end of the pass (the original's second attempt pass).
        self.new_launches
            .push(launch_request(job, resource, &attempt_id));
        self.event(
            "job_assigned",
            Some(job_id),
            Some(resource_id),
            Some(&attempt_id),
            detail,
        );
    }

    fn launch_new_attempts(&mut self) {
        let launches = std::mem::take(&mut self.new_launches);
        self.out.actions.extend(launches);
    }
}

/// Reorders `items[start..]` by `pos` (one per item), keeping equal positions in order.
fn in_order_of<T>(items: &mut Vec<T>, start: usize, pos: &[usize]) {
    let tail = items.split_off(start);
    let mut tagged: Vec<(usize, T)> = pos.iter().copied().zip(tail).collect();
    tagged.sort_by_key(|(p, _)| *p);
    items.extend(tagged.into_iter().map(|(_, t)| t));
}

/// The launch of `attempt_id` of `job` on `resource`.
fn launch_request(job: &Job, resource: &Resource, attempt_id: &Name) -> Action {
    let bucket = job
        .placement
        .as_ref()
        .map(|p| p.bucket.clone())
        .unwrap_or_default();
    Action::Launch(Box::new(LaunchRequest {
        attempt_id: *attempt_id,
        job_id: job.id,
        resource_id: resource.id,
        tpu_name: resource.tpu_name,
        zone: resource.zone,
        tpu_type: resource.tpu_type.clone(),
        worker_count: resource.worker_count,
        command: job.spec.command.clone(),
        checkpoint_dir: format!("{bucket}/jobs/{}/checkpoints", job.id),
        bundle: bundle_uri(&job.spec.bundle, &bucket),
        bucket,
        env: job.spec.env.clone(),
        caches: job.spec.caches.clone(),
    }))
}

/// Where the workers fetch the job's bundle: `sha256:<hex>` (what submit records after
/// uploading it to every candidate bucket) names `<bucket>/bundles/<hex>.tar.gz`; a `gs://`
/// object is used as it is; anything else (a local path not yet submitted) names none.
fn bundle_uri(bundle: &str, bucket: &str) -> Option<String> {
    if let Some(hex) = bundle.strip_prefix("sha256:") {
        return Some(format!("{bucket}/bundles/{hex}.tar.gz"));
    }
    bundle.starts_with("gs://").then(|| bundle.to_owned())
}

/// Whether refreshing record `r` from its ready `node` of `entry` would change it (the ready
/// refresh touches only the records it changes).
fn needs_ready_refresh(r: &Resource, entry: &TpuEntry, node: &NodeInfo) -> bool {
    r.zone != entry.zone
        || r.tpu_type != entry.tpu_type
        || r.entry_id != entry.id
        || r.adopted != entry.is_adopted()
        || r.worker_count != node.worker_count.max(1)
        || if r.owner.is_some() {
            r.status != ResourceStatus::Busy
        } else {
            matches!(
                r.status,
                ResourceStatus::Deleted
                    | ResourceStatus::Preempted
                    | ResourceStatus::Provisioning
                    | ResourceStatus::Unavailable
            )
        }
}
