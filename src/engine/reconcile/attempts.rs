//! Step 6 of a pass: each running attempt judged from its workers' reports (launching,
//! running, lost, finished), with retries, backoff and the finish of its job. Assigns nothing.

use super::{CONTROLLED_INTERRUPTION, Finish, Pass, Stop, launch_request};
use crate::engine::aggregate;
use crate::engine::aggregate::{EXIT_RETRYABLE, FailureKind, Verdict};
use crate::engine::config::NOTICE_GRACE_SECS;
use crate::engine::memo::QuietRun;
use crate::engine::observe::{Action, AttemptReport, CancelOutcome, Notice, RemoteErrorKind};
use crate::engine::state::{
    Attempt, AttemptStatus, EndReason, InterruptionStatus, Job, JobStatus, Resource, ResourceStatus,
};
use crate::engine::time::Timestamp;
use crate::spec::Name;

impl<'a> Pass<'a> {
    // ----- step 6: attempts -------------------------------------------------------------

    pub(super) fn attempts(&mut self) {
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

    pub(super) fn launch_action(
        &self,
        job_id: &Name,
        attempt: &Attempt,
        resource: &Resource,
    ) -> Action {
        launch_request(&self.state.jobs[job_id], resource, &attempt.id)
    }

    /// Stops `attempt` on its workers; an attempt the controller interrupts to run again
    /// later is told why first (its notice).
    pub(super) fn cancel_action(job_id: &Name, attempt: &Attempt, resource: &Resource) -> Action {
        Action::Cancel {
            attempt_id: attempt.id,
            job_id: job_id.to_owned(),
            tpu_name: resource.tpu_name,
            zone: resource.zone,
            notice: if attempt.interrupting {
                Some(Notice::InterruptSpot)
            } else if attempt.displaced_by.is_some() {
                Some(Notice::PriorityPreemption)
            } else {
                None
            },
        }
    }

    pub(super) fn launching(&mut self, job_id: &Name, attempt: &Attempt, resource: &Resource) {
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
            // The workers copied a moved job's checkpoints before they started its command.
            if let Some(p) = self
                .state
                .jobs
                .get_mut(job_id)
                .and_then(|j| j.placement.as_mut())
            {
                p.checkpoint_from = None;
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
                    a.error_summary = crate::engine::state::last_chars(&summary, 4000);
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

    pub(super) fn bump_launch_failures(&mut self, job_id: &Name) -> u32 {
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
    pub(super) fn still_running(
        &self,
        job: &Job,
    ) -> Option<([Option<Timestamp>; 2], Option<QuietRun>)> {
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
    pub(super) fn heartbeat(
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

    pub(super) fn running(&mut self, job_id: &Name, attempt: &Attempt, resource: &Resource) {
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
        // Stopped on the cloud's notice: the TPU going away ends the attempt as a preemption
        // (the unusable-resource step, once the cloud says so); while the grace runs nothing
        // else happens, so the TPU is given to no one.
        if let Verdict::Noticed { at, .. } = &verdict {
            let until = at.unwrap_or(self.now).plus_secs(NOTICE_GRACE_SECS);
            if self.up_entry(resource).is_some() && self.now < until {
                self.wake_at(until);
                return;
            }
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
    pub(super) fn mark_lost(&mut self, job_id: &Name, summary: &str) {
        if let Some(a) = self.state.jobs.get_mut(job_id).and_then(Job::attempt_mut) {
            a.lost.get_or_insert_with(|| summary.to_owned());
        }
    }

    /// A lost attempt ends (requeued) once its workers are confirmed stopped; a TPU whose
    /// workers could not be confirmed stopped is set aside rather than given other work.
    pub(super) fn finish_lost(
        &mut self,
        job_id: &Name,
        attempt: &Attempt,
        resource: &Resource,
        summary: &str,
    ) {
        if attempt.interrupting {
            if self.workers_stopped(job_id, attempt, resource) != Stop::Pending {
                self.finish_interrupted(job_id, attempt, resource);
            }
            return;
        }
        if let Some(waiter) = attempt.displaced_by {
            match self.workers_stopped(job_id, attempt, resource) {
                Stop::Pending => {}
                Stop::Confirmed => self.finish_displaced(job_id, attempt, resource, &waiter),
                Stop::Unconfirmed => {
                    self.finish_displaced(job_id, attempt, resource, &waiter);
                    self.set_aside(&resource.id);
                }
            }
            return;
        }
        match self.workers_stopped(job_id, attempt, resource) {
            Stop::Pending => {}
            Stop::Confirmed => self.retryable_failure(job_id, attempt, resource, summary, 0),
            Stop::Unconfirmed => {
                self.retryable_failure(job_id, attempt, resource, summary, 0);
                self.set_aside(&resource.id);
            }
        }
    }

    /// An attempt displaced by a job of higher priority, its workers stopped: interrupted as
    /// by a preemption (no infrastructure retry counted), its TPU idle for the assignment
    /// (which serves the higher priority first), its job requeued.
    fn finish_displaced(
        &mut self,
        job_id: &Name,
        attempt: &Attempt,
        resource: &Resource,
        waiter: &Name,
    ) {
        let summary = format!("displaced by {waiter}, of higher priority");
        let done = self.finish(
            job_id,
            Finish::requeued_as_preempted(&summary, ResourceStatus::Idle),
        );
        if done {
            self.event(
                "job_displaced",
                Some(job_id),
                Some(&resource.id),
                Some(&attempt.id),
                format!("for={waiter}; requeued"),
            );
        }
    }

    /// A controlled interruption's attempt whose workers are stopped: interrupted as by a
    /// preemption (no infrastructure retry counted), its TPU's deletion asked for now (the
    /// record draining), the job requeued in its region.
    fn finish_interrupted(&mut self, job_id: &Name, attempt: &Attempt, resource: &Resource) {
        let request = self
            .state
            .interruption_requests
            .values()
            .find(|r| r.attempt_id == attempt.id && r.status == InterruptionStatus::Processing)
            .map(|r| r.id);
        if let Some(id) = request {
            self.interruption_deletion(&id);
        }
        let done = self.finish(
            job_id,
            Finish::requeued_as_preempted(CONTROLLED_INTERRUPTION, ResourceStatus::Draining),
        );
        let kind = if !done {
            "controlled_interruption_attempt_requeue_failed"
        } else if self
            .state
            .job(job_id)
            .is_some_and(|j| j.status == JobStatus::Pending)
        {
            "controlled_interruption_attempt_requeued"
        } else {
            "controlled_interruption_attempt_retry_suppressed"
        };
        self.event(
            kind,
            Some(job_id),
            Some(&resource.id),
            Some(&attempt.id),
            String::new(),
        );
    }

    /// After an unconfirmed stop: a managed Spot TPU is recycled (its leftovers die with it),
    /// any other is set unavailable (the next launch on it kills leftovers).
    pub(super) fn set_aside(&mut self, resource_id: &Name) {
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
    pub(super) fn judge(
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
            // Past the grace (`running`): a TPU still up is kept; one that went is the
            // unusable-resource step's preemption.
            Verdict::Noticed { summary, .. } => {
                if self.up_entry(resource).is_some() {
                    self.noticed(job_id, attempt, resource, &summary);
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

    /// An attempt its workers stopped on the cloud's notice whose TPU is still up after the
    /// grace: interrupted as by a preemption (no infrastructure retry counted), the job
    /// requeued, the TPU kept (the maintenance is over, or the notice came to nothing).
    fn noticed(&mut self, job_id: &Name, attempt: &Attempt, resource: &Resource, summary: &str) {
        let done = self.finish(
            job_id,
            Finish::requeued_as_preempted(summary, ResourceStatus::Idle),
        );
        if let Some(job) = self.state.job(job_id).filter(|_| done) {
            let detail = if job.status == JobStatus::Pending {
                format!("reason=notice; requeued; {summary}")
            } else {
                format!("reason=notice; retry disabled; {summary}")
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

    /// Whether the attempt's remaining workers are confirmed stopped (the last cancel was sent
    /// or found nothing running). Otherwise sends a cancel (`Pending`); after
    /// `max_cleanup_failures` failed cancels it gives up waiting (`Unconfirmed`).
    pub(super) fn workers_stopped(
        &mut self,
        job_id: &Name,
        attempt: &Attempt,
        resource: &Resource,
    ) -> Stop {
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
    pub(super) fn retryable_failure(
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
}
