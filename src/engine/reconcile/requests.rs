//! Step 5 of a pass: cancellations and interruption requests (users' and the controller's
//! own), checked against their targets. Launches nothing.

use super::{CONTROLLED_INTERRUPTION, Finish, Pass};
use crate::engine::aggregate;
use crate::engine::aggregate::{EXIT_RETRYABLE, Graces, Verdict};
use crate::engine::observe::{Action, AttemptReport, CancelOutcome};
use crate::engine::state::{
    Attempt, AttemptStatus, EndReason, FailureCounter, InterruptionStatus, Job, JobStatus,
    Resource, ResourceStatus,
};
use crate::spec::{Name, ProvisioningModel, names};

impl<'a> Pass<'a> {
    // ----- step 5: cancellations and interruptions --------------------------------------

    /// Jobs that were in `status` at the start of the pass (and still are).
    pub(super) fn jobs_in(&self, status: JobStatus) -> Vec<Name> {
        self.in_flight
            .iter()
            .filter(|(s, id)| {
                *s == status && self.state.jobs.get(id).is_some_and(|j| j.status == status)
            })
            .map(|(_, id)| *id)
            .collect()
    }

    pub(super) fn report(&self, attempt_id: &Name) -> Option<&'a AttemptReport> {
        self.obs.attempts.get(attempt_id)
    }

    pub(super) fn graces(&self) -> Graces {
        Graces {
            partial_failure_secs: self.config.partial_failure_grace_secs,
            partial_success_secs: self.config.partial_success_grace_secs,
        }
    }

    pub(super) fn cancellations(&mut self) {
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
                Verdict::Retryable { .. } | Verdict::Noticed { .. } => Some(EXIT_RETRYABLE),
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
                notice: None,
            });
        }
    }

    /// Counts a failed cancel; at the threshold the attempt is given up: the job is
    /// deactivated and the TPU recycled (managed Spot) or, for adopted and on-demand TPUs
    /// that cannot be recycled, released (the next launch kills leftovers). The original
    /// never escalated those (§9.1 #8).
    pub(super) fn note_cancellation_failure(
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

    pub(super) fn interruptions(&mut self) {
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
            // The attempt's workers are stopped first, with the notice a Spot preemption gives
            // (`attempts` sends the cancel); the TPU's deletion is asked for once they are, so
            // the command has its time to save, and the job is requeued then too, never while
            // its workers may still run beside its next attempt.
            if let Some(a) = self
                .state
                .jobs
                .get_mut(&request.job_id)
                .and_then(Job::attempt_mut)
                .filter(|a| a.id == request.attempt_id)
            {
                a.lost
                    .get_or_insert_with(|| CONTROLLED_INTERRUPTION.to_owned());
                a.interrupting = true;
            }
            self.event(
                "controlled_interruption_attempt_stopping",
                Some(&request.job_id),
                Some(&request.resource_id),
                Some(&request.attempt_id),
                String::new(),
            );
        }
        // A request whose attempt ended some other way while it was being stopped (it
        // finished, was cancelled, its TPU went): its TPU's deletion is asked for now.
        let ended: Vec<Name> = self
            .state
            .interruption_requests
            .values()
            .filter(|r| r.status == InterruptionStatus::Processing)
            .filter(|r| {
                !self
                    .state
                    .jobs
                    .get(&r.job_id)
                    .and_then(Job::attempt)
                    .is_some_and(|a| a.id == r.attempt_id && !a.status.is_terminal())
            })
            .map(|r| r.id)
            .collect();
        for id in ended {
            self.interruption_deletion(&id);
        }
    }

    /// Asks for the deletion of the queued resource interruption request `id` takes away,
    /// once its attempt's workers are stopped.
    pub(super) fn interruption_deletion(&mut self, id: &Name) {
        let Some(request) = self
            .state
            .interruption_requests
            .get(id)
            .filter(|r| r.status == InterruptionStatus::Processing)
            .cloned()
        else {
            return;
        };
        let Some(resource) = self.state.resources.get(&request.resource_id) else {
            return;
        };
        let qr_name = names::queued_resource_name(&resource.tpu_name);
        let zone = resource.zone;
        self.delete_qr(&qr_name, &zone);
        let now = self.now;
        let req = self
            .state
            .interruption_requests
            .get_mut(id)
            .expect("found above");
        req.queued_resource_name = Some(qr_name);
        let _ = req.transition(InterruptionStatus::DeletionRequested, now);
        self.event(
            "controlled_interruption_deletion_requested",
            Some(&request.job_id),
            Some(&request.resource_id),
            None,
            String::new(),
        );
    }

    pub(super) fn validate_interruption(
        &self,
        request: &crate::engine::state::InterruptionRequest,
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
}
