//! Steps 0 to 4 of a pass: repair ownership a damaged state left one-sided, read the
//! previous pass's refusals, refresh the records from queued resources and ready nodes, and
//! recover adopted TPUs' disks. Decides nothing about jobs.

use std::sync::Arc;

use super::Pass;
use crate::engine::config::{DISK_RECOVERY_EVERY_SECS, backoff_secs};
use crate::engine::observe::{
    Action, ActionFailure, CloudFailure, Health, NodeInfo, NodeState, QrState, QueuedResourceInfo,
};
use crate::engine::state::{
    AttemptStatus, Backoff, EndReason, JobStatus, Resource, ResourceStatus,
};
use crate::engine::time::Timestamp;
use crate::spec::{Name, TpuEntry};

impl<'a> Pass<'a> {
    // ----- step 0: ownership that does not point both ways (corrupted state) ------------

    /// A TPU owned by a job that does not run on it, or a running job whose TPU does not
    /// own it, can only come from a damaged state document. Each is reported as a violation
    /// and repaired so that nothing stays stuck and no job is lost: the TPU is released
    /// (unavailable until seen ready again) and the job requeued, pinned as before.
    pub(super) fn repair_ownership(&mut self) {
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

    // ----- step 1: refusals of the previous pass ---------------------------------------

    pub(super) fn action_failures(&mut self) {
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
                    if let (CloudFailure::Stockout(m), Some(e)) =
                        (&failure.failure, self.index.entry_index(entry_id))
                    {
                        self.stockout_refused(e, m);
                    }
                }
            }
        }
    }

    // ----- step 2: QR refresh ---------------------------------------------------------

    /// Brings the records up to date with the live queued resources: every listed one when
    /// the memo cannot tell what changed, else only those under the TPU names it names (see
    /// `RefreshMemo`), with the entries' backoffs checked apart. The names are kept for the
    /// ready refresh that follows.
    pub(super) fn refresh_from_queued_resources(&mut self) {
        match self.memo.refresh.due(&self.state.resources, self.observed) {
            None => {
                let qrs: &'a [Arc<QueuedResourceInfo>] = &self.obs.queued_resources;
                for (qr, facts) in qrs.iter().zip(self.qr_facts) {
                    self.refresh_from_queued_resource(qr, facts.entry);
                }
            }
            Some(names) => {
                let observed = self.observed;
                // A backoff's refused request now listed may be under a name with no change.
                let live = |request: &Name| {
                    let qr = observed.qr_named(request)?;
                    let entry = qr.facts.entry.filter(|_| qr.info.state.is_live())?;
                    Some(self.index.entry(entry as usize).id)
                };
                let done: Vec<Name> = (self.state.entry_backoff.iter())
                    .filter(|(entry, b)| live(&b.request) == Some(**entry))
                    .map(|(entry, _)| *entry)
                    .collect();
                for entry in &done {
                    self.state.entry_backoff.remove(entry);
                }
                for name in &names {
                    if let Some(qr) = observed.tpu(name).and_then(|t| t.qr.as_ref()) {
                        self.refresh_from_queued_resource(&qr.info, qr.facts.entry);
                    }
                }
                self.refresh_due = Some(names);
            }
        }
    }

    /// Step 2 for one listed queued resource (`entry`: its matched entry).
    fn refresh_from_queued_resource(&mut self, qr: &QueuedResourceInfo, entry: Option<u32>) {
        if !qr.state.is_live() {
            return;
        }
        let Some(entry_index) = entry.map(|e| e as usize) else {
            return;
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
                r.capacity_wait_since = None;
            }
            Some(_) => {}
        }
        // A provisioning TPU whose request waits for capacity is a stockout users are
        // shown, with since when.
        let r = &self.state.resources[&qr.node_id];
        let since = (r.status == ResourceStatus::Provisioning
            && qr.state == QrState::WaitingForResources)
            .then(|| r.capacity_wait_since.unwrap_or(self.now));
        if r.capacity_wait_since != since {
            self.state
                .resources
                .get_mut(&qr.node_id)
                .expect("exists")
                .capacity_wait_since = since;
        }
    }

    // ----- step 3: ready refresh --------------------------------------------------------

    /// Brings the records up to date with the listed nodes: all of them, or only those
    /// under the names the queued-resource refresh was given (see `RefreshMemo`).
    pub(super) fn refresh_from_ready_nodes(&mut self) {
        match self.refresh_due.take() {
            None => {
                let nodes: &'a [Arc<NodeInfo>] = &self.obs.nodes;
                for (node, facts) in nodes.iter().zip(self.node_facts) {
                    self.refresh_from_node(node, facts.entry);
                }
            }
            Some(names) => {
                let observed = self.observed;
                for name in &names {
                    if let Some(node) = observed.tpu(name).and_then(|t| t.node.as_ref()) {
                        self.refresh_from_node(&node.info, node.facts.entry);
                    }
                }
            }
        }
    }

    /// Step 3 for one listed node (`entry`: its matched entry).
    fn refresh_from_node(&mut self, node: &NodeInfo, entry: Option<u32>) {
        let now = self.now;
        {
            let Some(entry_index) = entry.map(|e| e as usize) else {
                return;
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
    pub(super) fn adopted_disk_recovery(&mut self) {
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
