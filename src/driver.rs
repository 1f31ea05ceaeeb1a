//! The driver: the two halves of a controller pass around the engine, against any
//! `CloudBackend`. `observe` builds the observation (inventory of the runner's zones and
//! adopted TPUs, worker reports, and the results of the previous pass's actions); `execute`
//! carries out the actions and keeps their results for the next pass. The caller runs the
//! engine in between (the controller commits before it executes). The same code runs in the
//! simulator and in production.

use std::collections::BTreeMap;

use crate::backend::{BackendError, CloudBackend, InFlight, Inventory, Outcome};
use crate::engine::observe::Event;
use crate::engine::observe::{
    ActionFailure, AttemptReport, CancelOutcome, DiskRecovery, RemoteError, ReportChanges,
};
use crate::engine::state::JobStatus;
use crate::engine::{Action, Engine, Observation, State, Timestamp, in_step, sightings};
use crate::spec::{Name, NameMap};

/// Results of actions waiting to be reported to the next pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Feedback {
    /// Refused cloud actions.
    pub failures: Vec<ActionFailure>,
    /// Launch errors by attempt.
    pub launch_errors: BTreeMap<Name, RemoteError>,
    /// Cancel results by attempt.
    pub cancels: BTreeMap<Name, CancelOutcome>,
    /// Disk recoveries' answers.
    pub disk_recoveries: Vec<DiskRecovery>,
}

impl Feedback {
    /// True when there is nothing to report.
    pub fn is_empty(&self) -> bool {
        self.failures.is_empty()
            && self.launch_errors.is_empty()
            && self.cancels.is_empty()
            && self.disk_recoveries.is_empty()
    }
}

/// Brings `observation` up to date for a pass: the inventory, the worker reports (kept from
/// the previous pass and refreshed by the backend), and the results of the previous pass's
/// actions. Returns what the listing shows the cloud did since the last successful one
/// (`sightings`: nodes and queued resources first seen, changed or gone), to be recorded with
/// the pass's events. On error the observation is partly updated and the pass must be
/// skipped; the next listing is then compared with the last successful one.
pub fn observe<B: CloudBackend + ?Sized>(
    engine: &Engine,
    state: &State,
    backend: &mut B,
    feedback: &Feedback,
    now: Timestamp,
    observation: &mut Observation,
) -> Result<Vec<Event>, BackendError> {
    let since = observation.serial;
    observation.serial += 1;
    observation.report_changes = None;
    let scope = engine.inventory_scope(state);
    let mut inventory = Inventory {
        nodes: std::mem::take(&mut observation.nodes),
        queued_resources: std::mem::take(&mut observation.queued_resources),
        others: std::mem::take(&mut observation.others),
    };
    let listed = backend.inventory(&scope, now, &mut inventory);
    Inventory {
        nodes: observation.nodes,
        queued_resources: observation.queued_resources,
        others: observation.others,
    } = inventory;
    listed?;
    let seen = sightings::changes(
        (&observation.listed.0, &observation.listed.1),
        (&observation.nodes, &observation.queued_resources),
        now,
    );
    in_step::keep(&mut observation.listed.0, &observation.nodes);
    in_step::keep(&mut observation.listed.1, &observation.queued_resources);
    let in_flight = in_flight(state);
    let read = backend.refresh_reports(&in_flight, &mut observation.attempts, now)?;
    observation.read_at = Some(read.read_at);
    let fed = merge_feedback(&mut observation.attempts, &mut observation.fed, feedback);
    observation.report_changes = read.changed.map(|mut attempts| {
        attempts.extend(fed);
        ReportChanges { since, attempts }
    });
    observation.failures.clone_from(&feedback.failures);
    observation
        .disk_recoveries
        .clone_from(&feedback.disk_recoveries);
    Ok(seen)
}

/// The attempts whose workers may report: the current attempt of every running or
/// cancelling job, with the job and its bucket, in job-id order.
pub fn in_flight(state: &State) -> Vec<InFlight> {
    let unplaced = Name::new("");
    state
        .jobs
        .values()
        .filter(|j| matches!(j.status, JobStatus::Running | JobStatus::Cancelling))
        .filter_map(|j| {
            Some(InFlight {
                attempt: j.attempt()?.id,
                job: j.id,
                bucket: j.placement.as_ref().map_or(unplaced, |p| p.bucket),
            })
        })
        .collect()
}

/// Hands each in-flight attempt's report the result of the previous pass's launch or cancel,
/// clearing the results `fed` (the attempts whose report carries one) handed before; keeps
/// `fed` up to date and returns the attempts whose report this changed.
pub fn merge_feedback(
    reports: &mut NameMap<AttemptReport>,
    fed: &mut Vec<Name>,
    feedback: &Feedback,
) -> Vec<Name> {
    let mut changed = Vec::new();
    let attempts: Vec<Name> = fed
        .drain(..)
        .chain(feedback.launch_errors.keys().copied())
        .chain(feedback.cancels.keys().copied())
        .collect();
    for attempt in attempts {
        let Some(report) = reports.get_mut(&attempt) else {
            continue;
        };
        let launch_error = feedback.launch_errors.get(&attempt);
        let cancel = feedback.cancels.get(&attempt);
        if report.launch_error.as_ref() != launch_error || report.cancel.as_ref() != cancel {
            report.launch_error = launch_error.cloned();
            report.cancel = cancel.cloned();
            changed.push(attempt);
        }
        if (launch_error.is_some() || cancel.is_some()) && !fed.contains(&attempt) {
            fed.push(attempt);
        }
    }
    changed
}

/// Carries out the actions of a pass and returns what the next pass must hear.
pub fn execute<B: CloudBackend + ?Sized>(
    backend: &mut B,
    actions: &[Action],
    now: Timestamp,
) -> Feedback {
    let mut feedback = Feedback::default();
    for (action, outcome) in actions.iter().zip(backend.execute(actions, now)) {
        match outcome {
            Outcome::Done => {}
            Outcome::Refused(failure) => feedback.failures.push(ActionFailure {
                action: action.clone(),
                failure,
            }),
            Outcome::LaunchFailed(error) => {
                if let Action::Launch(l) = action {
                    feedback.launch_errors.insert(l.attempt_id, error);
                }
            }
            Outcome::Cancelled(outcome) => {
                if let Action::Cancel { attempt_id, .. } = action {
                    feedback.cancels.insert(*attempt_id, outcome);
                }
            }
            Outcome::DiskRecovery(result) => {
                if let Action::RecoverDisk { resource_id, .. } = action {
                    feedback.disk_recoveries.push(DiskRecovery {
                        resource_id: *resource_id,
                        result,
                    });
                }
            }
        }
    }
    feedback
}
