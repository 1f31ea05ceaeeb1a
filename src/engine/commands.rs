//! The user commands' rules on stored records (§2.1): cancel (plain and `--if-pending`),
//! reprioritise, and the target check of an interruption request. Pure decisions on the
//! records a store read inside its transaction; the store writes what they return. Every
//! store runs these same functions, so the rules cannot differ between SQLite and Firestore.
//! No IO, no clock (times come in).

use serde::{Deserialize, Serialize};

use super::Event;
use super::lease::Lease;
use super::state::{
    InterruptionRequest, InterruptionStatus, Job, JobStatus, Resource, ResourceStatus,
};
use super::time::Timestamp;
use crate::spec::{Name, Priority};

/// The kind of the event a submitted job is recorded with.
pub const JOB_CREATED: &str = "job_created";

/// The events recording the submission of `jobs` at `now`: one per job, its detail the job's
/// specification as submitted (JSON), so that a captured trace holds it even after a
/// reprioritisation changed the record.
pub fn created(jobs: &[Job], now: Timestamp) -> Vec<Event> {
    jobs.iter()
        .map(|job| Event {
            at: now,
            kind: JOB_CREATED.into(),
            job_id: Some(job.id),
            resource_id: None,
            attempt_id: None,
            detail: serde_json::to_string(&job.spec).unwrap_or_default(),
        })
        .collect()
}

/// What `cancel` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum CancelResult {
    /// No such job.
    Unknown,
    /// `--if-pending` and the job is not provably idle: why.
    Conflict {
        /// Why the cancel was refused.
        reason: String,
    },
    /// The job's status after the cancel (deactivated, cancelling, or a terminal status
    /// left unchanged).
    Status {
        /// Resulting status.
        status: JobStatus,
        /// True when the job was changed (false: it already was terminal or cancelling).
        changed: bool,
    },
}

/// What `set-priority` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ReprioritizeResult {
    /// No such job.
    Unknown,
    /// Not pending, or assigned.
    Conflict {
        /// The job's status.
        status: JobStatus,
    },
    /// It already had that priority.
    Unchanged,
    /// Changed (the event `pending_job_reprioritized` was written with it).
    Reprioritized {
        /// Priority before.
        old: Priority,
        /// Priority now.
        new: Priority,
    },
}

/// The TPU records a `--if-pending` cancel judges, read by the store in its transaction
/// (see `previous_attempt` for which).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PreviousTpus {
    /// The record of the TPU the previous attempt ran on, if it still exists.
    pub of_attempt: Option<Resource>,
    /// Every record whose owner names the job or the previous attempt.
    pub pointing: Vec<Resource>,
}

/// What a store must read before `cancel` with `if_pending`: the previous attempt's TPU
/// record id and that attempt's id, when the job is pending, unassigned and keeps a previous
/// attempt (nothing to read otherwise).
pub fn previous_attempt(job: &Job) -> Option<(Name, Name)> {
    // A job that is not pending and unassigned is refused before any TPU is looked at.
    if job.status != JobStatus::Pending || job.assigned_resource.is_some() {
        return None;
    }
    let attempt_id = job.current_attempt?;
    let attempt = job.attempts.iter().rev().find(|a| a.id == attempt_id)?;
    Some((attempt.resource_id, attempt_id))
}

/// Cancels `job` (already read by the store). Plain: pending → deactivated, running →
/// cancelling, anything else unchanged (a terminal job is never rewritten). `if_pending`:
/// refused unless the job is pending, unassigned and, when it keeps a previous attempt, that
/// attempt provably ended and no TPU record points at the job or the attempt.
pub fn cancel(
    job: Option<&mut Job>,
    if_pending: bool,
    tpus: &PreviousTpus,
    now: Timestamp,
) -> CancelResult {
    let Some(job) = job else {
        return CancelResult::Unknown;
    };
    if if_pending && let Err(reason) = provably_idle(job, tpus) {
        return CancelResult::Conflict { reason };
    }
    let to = match job.status {
        JobStatus::Pending => JobStatus::Deactivated,
        JobStatus::Running => JobStatus::Cancelling,
        status => {
            return CancelResult::Status {
                status,
                changed: false,
            };
        }
    };
    if let Err(illegal) = job.transition(to, now) {
        return CancelResult::Conflict {
            reason: illegal.to_string(),
        };
    }
    if to == JobStatus::Deactivated {
        job.end_reason = Some("cancelled".into());
    }
    CancelResult::Status {
        status: job.status,
        changed: true,
    }
}

/// The event a changed cancel appends: `cancel_requested`, with the status it left the job
/// in (`deactivated`: it had not started; `cancelling`: its workers are being stopped).
pub fn cancel_event(job: &Job, now: Timestamp) -> Event {
    Event {
        at: now,
        kind: "cancel_requested".into(),
        job_id: Some(job.id),
        resource_id: None,
        attempt_id: None,
        detail: format!("status={}", job.status.as_str()),
    }
}

fn provably_idle(job: &Job, tpus: &PreviousTpus) -> Result<(), String> {
    if job.status != JobStatus::Pending {
        return Err(format!("job is {}, not pending", job.status.as_str()));
    }
    if let Some(resource) = &job.assigned_resource {
        return Err(format!("job is assigned to {resource}"));
    }
    let Some(attempt_id) = job.current_attempt else {
        return Ok(());
    };
    let attempt = job
        .attempts
        .iter()
        .rev()
        .find(|a| a.id == attempt_id)
        .ok_or_else(|| format!("previous attempt {attempt_id} is missing"))?;
    let ended = attempt.status.is_terminal()
        && attempt
            .end_reason
            .is_some_and(|reason| reason.fits(attempt.status));
    if !ended {
        return Err(format!(
            "previous attempt {attempt_id} has not provably ended"
        ));
    }
    if let Some(resource) = tpus
        .of_attempt
        .as_ref()
        .filter(|r| r.id == attempt.resource_id)
    {
        let points_here = resource
            .owner
            .as_ref()
            .is_some_and(|o| o.job_id == job.id || o.attempt_id == attempt_id);
        if points_here {
            return Err(format!(
                "TPU {} of the previous attempt still points at it",
                resource.id
            ));
        }
    }
    if let Some(resource) = tpus.pointing.first() {
        return Err(format!("TPU {} still points at the job", resource.id));
    }
    Ok(())
}

/// Sets a pending, unassigned job's priority; returns the event to append when it changed.
pub fn reprioritize(
    job: Option<&mut Job>,
    priority: Priority,
    now: Timestamp,
) -> (ReprioritizeResult, Option<Event>) {
    let Some(job) = job else {
        return (ReprioritizeResult::Unknown, None);
    };
    if job.status != JobStatus::Pending || job.assigned_resource.is_some() {
        return (ReprioritizeResult::Conflict { status: job.status }, None);
    }
    let old = job.spec.priority;
    if old == priority {
        return (ReprioritizeResult::Unchanged, None);
    }
    job.spec.priority = priority;
    let event = Event {
        at: now,
        kind: "pending_job_reprioritized".into(),
        job_id: Some(job.id),
        resource_id: None,
        attempt_id: None,
        detail: format!(
            "old_priority={}; new_priority={}",
            old.as_str(),
            priority.as_str()
        ),
    };
    (
        ReprioritizeResult::Reprioritized { old, new: priority },
        Some(event),
    )
}

/// The id of the interruption request for (resource, job, attempt):
/// `stable_id("interrupt", {attempt_id, job_id, resource_id})`.
pub fn interruption_id(resource_id: &Name, job_id: &Name, attempt_id: &Name) -> Name {
    let value = serde_json::json!({
        "resource_id": resource_id.as_str(),
        "job_id": job_id.as_str(),
        "attempt_id": attempt_id.as_str(),
    });
    Name::new(&crate::spec::names::stable_id("interrupt", &value))
}

/// Why a request for (`resource_id`, `job_id`, `attempt_id`) names no existing target, if
/// it does not: the resource and the job must exist and the attempt be one of the job's.
pub fn unknown_target(
    resource: Option<&Resource>,
    job: Option<&Job>,
    resource_id: &Name,
    job_id: &Name,
    attempt_id: &Name,
) -> Option<String> {
    match (resource, job) {
        (Some(_), Some(job)) if job.attempts.iter().any(|a| a.id == *attempt_id) => None,
        (Some(_), Some(_)) => Some(format!(
            "unknown interruption target: attempt {attempt_id} of job {job_id}"
        )),
        _ => Some(format!(
            "unknown interruption target: resource {resource_id}, job {job_id}"
        )),
    }
}

/// Why `fence` may not write at `now` given the stored lease and epoch, if it may not: the
/// epoch must be the current one, and the caller must hold an unexpired lease taken with it.
pub fn fence_refusal(
    lease: Option<&Lease>,
    epoch: Option<&str>,
    owner: &str,
    fence_epoch: &str,
    now: Timestamp,
) -> Option<String> {
    if let Some(current) = epoch
        && current != fence_epoch
    {
        return Some(format!(
            "epoch {fence_epoch} is not the current deployment's ({current})"
        ));
    }
    match lease {
        None => Some("nobody holds the controller lease".into()),
        Some(l) if l.owner != owner => Some(format!("the controller lease is held by {}", l.owner)),
        Some(l) if l.epoch != fence_epoch => Some(format!(
            "the lease was taken with epoch {}, not {fence_epoch}",
            l.epoch
        )),
        Some(l) if l.expires_at <= now => Some(format!("the lease expired at {}", l.expires_at)),
        Some(_) => None,
    }
}

/// A new `requested` interruption request after the target check of §2.1: the TPU is a
/// managed record of an eligible (managed Spot) entry, busy with exactly that job and
/// attempt, and the job runs that attempt on it.
pub fn interruption_request(
    resource: &Resource,
    job: &Job,
    attempt_id: &Name,
    eligible_entry: bool,
    now: Timestamp,
) -> Result<InterruptionRequest, String> {
    if resource.adopted || !eligible_entry {
        return Err(format!(
            "{} is not a managed Spot TPU (only those can be interrupted)",
            resource.id
        ));
    }
    let attempt = job.attempt();
    let reciprocal = resource.status == ResourceStatus::Busy
        && resource.owned_by(&job.id, attempt_id)
        && job.status == JobStatus::Running
        && job.assigned_resource.as_ref() == Some(&resource.id)
        && attempt.is_some_and(|a| {
            a.id == *attempt_id && !a.status.is_terminal() && a.resource_id == resource.id
        });
    if !reciprocal {
        return Err(format!(
            "{} does not run attempt {attempt_id} of job {}",
            resource.id, job.id
        ));
    }
    Ok(InterruptionRequest {
        id: interruption_id(&resource.id, &job.id, attempt_id),
        resource_id: resource.id,
        job_id: job.id,
        attempt_id: *attempt_id,
        entry_id: resource.entry_id,
        status: InterruptionStatus::Requested,
        requested_at: now,
        processed_at: None,
        queued_resource_name: None,
        error_summary: String::new(),
    })
}
