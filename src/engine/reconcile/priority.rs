//! Priority preemption, a step of a pass after the assignment (opt-in per fleet:
//! `policy.priority_preemption_after`): a job that has waited that long for a TPU may displace
//! a running job of strictly lower priority whose TPU it can use. The victim is the one with
//! the least work at risk (the shortest-running current attempt; the notice lets it save),
//! never a job displaced within `priority_preemption_window`, never one that would not be
//! retried; its workers get the `priority-preemption` notice and it is requeued as after a
//! preemption once they are confirmed stopped. One victim per waiting job at a time.

use super::Pass;
use crate::engine::demand::Requirement;
use crate::engine::state::{AttemptStatus, Job, JobStatus};
use crate::engine::time::Timestamp;
use crate::spec::Name;

impl<'a> Pass<'a> {
    // ----- step 9: priority preemption -----------------------------------------------------

    pub(super) fn priority_preemption(&mut self) {
        let rule = self.index.fleet.policy.priority_preemption;
        if !rule.enabled() {
            return;
        }
        let now = self.now;
        // Running jobs not displaced within the window and retried after an interruption:
        // the possible victims. (A scan of the active jobs, only when the rule is on.)
        let mut victims: Vec<(&Job, Timestamp)> = self
            .state
            .jobs
            .values()
            .filter(|j| j.status == JobStatus::Running && j.spec.retry_on_infrastructure_failure)
            .filter_map(|j| {
                let a = j.attempt()?;
                let started = a.started_at?;
                (a.status == AttemptStatus::Running
                    && a.lost.is_none()
                    && !a.interrupting
                    && !displaced_within(j, now, rule.window_secs))
                .then_some((j, started))
            })
            .collect();
        if victims.is_empty() {
            return;
        }
        // Jobs with a displacement under way are served.
        let served: Vec<Name> = self
            .state
            .jobs
            .values()
            .filter_map(|j| {
                j.attempt()
                    .filter(|a| !a.status.is_terminal())?
                    .displaced_by
            })
            .collect();
        let mut waiters: Vec<&Job> = self
            .state
            .jobs
            .values()
            .filter(|j| j.status == JobStatus::Pending && !served.contains(&j.id))
            .filter(|j| j.not_before.is_none_or(|t| t <= now))
            .filter(|j| {
                victims
                    .iter()
                    .any(|(v, _)| v.spec.priority < j.spec.priority)
            })
            .filter(|j| now.elapsed_since(j.waiting_since(), rule.after_secs))
            .collect();
        // Queue order: higher priority first, then FIFO.
        waiters.sort_by_key(|j| (std::cmp::Reverse(j.spec.priority), j.submitted_at, j.id));
        let mut chosen: Vec<(Name, Name)> = Vec::new();
        for waiter in waiters {
            let req = Requirement::at(self.index, waiter, now);
            let best = victims
                .iter()
                .enumerate()
                .filter(|(_, (v, _))| v.spec.priority < waiter.spec.priority)
                .filter(|(_, (v, _))| {
                    v.assigned_resource
                        .and_then(|r| self.state.resources.get(&r))
                        .is_some_and(|r| req.accepts_tpu(self.index, r))
                })
                // Least work at risk: the most recently started; then the lowest priority,
                // the latest submitted.
                .max_by_key(|(_, (v, started))| {
                    (
                        *started,
                        std::cmp::Reverse(v.spec.priority),
                        v.submitted_at,
                        v.id,
                    )
                })
                .map(|(i, _)| i);
            if let Some(i) = best {
                let (victim, _) = victims.swap_remove(i);
                chosen.push((victim.id, waiter.id));
            }
        }
        for (victim, waiter) in chosen {
            self.displace(&victim, &waiter);
        }
    }

    /// Starts stopping `victim`'s attempt for `waiter`: its workers get the notice now.
    fn displace(&mut self, victim: &Name, waiter: &Name) {
        let summary = format!("displaced by {waiter}, of higher priority");
        let Some(attempt) = self.state.jobs.get_mut(victim).and_then(Job::attempt_mut) else {
            return;
        };
        attempt.displaced_by = Some(*waiter);
        attempt.lost = Some(summary.clone());
        let attempt = attempt.clone();
        let Some(resource) = self.state.resources.get(&attempt.resource_id).cloned() else {
            return;
        };
        self.event(
            "job_displacing",
            Some(victim),
            Some(&resource.id),
            Some(&attempt.id),
            format!("for={waiter}"),
        );
        self.finish_lost(victim, &attempt, &resource, &summary);
    }
}

/// Whether `job` was displaced (or is being displaced) within `window_secs` of `now`.
fn displaced_within(job: &Job, now: Timestamp, window_secs: i64) -> bool {
    job.attempts.iter().rev().any(|a| {
        a.displaced_by.is_some()
            && a.ended_at
                .is_none_or(|t| !now.elapsed_since(t, window_secs))
    })
}
