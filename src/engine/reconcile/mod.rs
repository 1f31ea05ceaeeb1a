//! One reconcile pass (§3.3, in the original's order): refresh records from the inventory,
//! handle cancellations and interruptions, judge attempts, recycle and retire unusable TPUs,
//! assign pending jobs, size capacity, launch new attempts. Input: fleet, state, observation,
//! `now`; output: mutated state, actions, events and the next time a pass is needed.
//! Level-triggered and idempotent: a pass never depends on why it ran.

mod assignment;
mod attempts;
mod moves;
mod priority;
mod refresh;
mod requests;
mod resources;
mod stockouts;

use super::aggregate::EXIT_RETRYABLE;
use super::config::{EngineConfig, backoff_secs};
use super::fleet_index::{EntryFacts, FleetIndex};
use super::memo::Memo;
use super::observe::{Action, Event, LaunchRequest, NodeInfo, Observation, QueuedResourceInfo};
use super::observed::{ObservedIndex, Tpu};
use super::policy::Policy;
use super::state::{
    AttemptStatus, EndReason, FailureCounter, Job, JobStatus, RequirementPrint,
    RequirementPrintCache, Resource, ResourceStatus, State,
};
use super::time::Timestamp;
use crate::spec::fleet::SshTransport;
use crate::spec::{Name, NameSet};

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

/// The summary of an attempt ended by a controlled interruption (`interrupt-spot`).
const CONTROLLED_INTERRUPTION: &str = "controlled managed-Spot interruption";

/// Whether an attempt's remaining workers are stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

impl<'s> Finish<'s> {
    /// A running attempt stopped by a preemption's like (a notice, a displacement, a
    /// controlled interruption): requeued with no infrastructure retry counted, its TPU left
    /// in `resource_status`.
    fn requeued_as_preempted(summary: &'s str, resource_status: ResourceStatus) -> Self {
        Finish {
            attempt_status: AttemptStatus::Interrupted,
            reason: EndReason::Preempted,
            job_status: JobStatus::Pending,
            resource_status,
            exit_code: Some(EXIT_RETRYABLE),
            summary,
            retryable: false,
            recycle_threshold: 0,
            expected: JobStatus::Running,
        }
    }
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
    /// The TPU names the refresh steps look at (`None`: every listed object).
    pub(super) refresh_due: Option<Vec<Name>>,
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
            refresh_due: None,
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
        // Only jobs read back from the store lack their print: the others keep theirs. A
        // state read whole (a snapshot, a full reload) is printed in parts side by side.
        if !unprinted.is_empty() && unprinted.len() == self.state.jobs.len() {
            let jobs: Vec<&Job> = self.state.jobs.values().collect();
            let prints = crate::parallel::in_parts(&jobs, |_, part| {
                part.iter()
                    .map(|j| RequirementPrint::of(j))
                    .collect::<Vec<_>>()
            });
            let jobs = self.state.jobs.values_mut();
            for (job, print) in jobs.zip(prints.into_iter().flatten()) {
                job.print = RequirementPrintCache(Some(print));
            }
        } else {
            for id in unprinted {
                if let Some(job) = self.state.jobs.get_mut(&id) {
                    job.ensure_print();
                }
            }
        }
        self.repair_ownership();
        self.action_failures();
        self.refresh_from_queued_resources();
        self.refresh_from_ready_nodes();
        self.stockout_memory();
        self.adopted_disk_recovery();
        self.cancellations();
        self.interruptions();
        self.attempts();
        self.recycles();
        self.unusable_resources();
        self.assignment();
        self.priority_preemption();
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

    /// A non-adopted declared ordinal of a managed entry, of any model (eligible for
    /// recycling: tpu-runner made it and can make it again).
    fn recyclable(&self, resource: &Resource) -> bool {
        !resource.adopted
            && self.index.is_declared(resource)
            && self
                .index
                .entry_index(&resource.entry_id)
                .is_some_and(|e| !self.index.entry(e).is_adopted())
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
            // An attempt being stopped for a controlled interruption ends when its workers
            // are confirmed stopped (`attempts`), not when its TPU starts going away.
            let interrupting = self
                .state
                .jobs
                .get(&owner.job_id)
                .and_then(Job::attempt)
                .is_some_and(|a| a.interrupting);
            if attempt_ok && status == Some(JobStatus::Running) && interrupting {
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
                        summary: moves::CLOUD_PREEMPTION,
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
                    if requeued {
                        self.consider_move(&owner.job_id);
                    }
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
}

/// The launch of `attempt_id` of `job` on `resource`.
fn launch_request(job: &Job, resource: &Resource, attempt_id: &Name) -> Action {
    let bucket = job
        .placement
        .as_ref()
        .map(|p| p.bucket.to_string())
        .unwrap_or_default();
    let checkpoint_from = job
        .placement
        .as_ref()
        .and_then(|p| p.checkpoint_from.clone());
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
        checkpoint_from,
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
