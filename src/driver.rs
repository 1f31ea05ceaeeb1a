//! The driver: one controller pass against any `CloudBackend`. It builds the observation
//! (inventory of the runner's zones and adopted TPUs, worker reports, and the results of the
//! previous pass's actions), runs the engine, then carries out the actions and keeps their
//! results for the next pass.
//! The same code runs in the simulator and in production.

use std::collections::BTreeMap;

use crate::backend::{BackendError, CloudBackend, Outcome};
use crate::engine::observe::{ActionFailure, CancelOutcome, RemoteError};
use crate::engine::state::{Attempt, Job, JobStatus};
use crate::engine::{Action, Engine, Observation, PassOutput, State, Timestamp};
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
}

impl Feedback {
    /// True when there is nothing to report.
    pub fn is_empty(&self) -> bool {
        self.failures.is_empty() && self.launch_errors.is_empty() && self.cancels.is_empty()
    }
}

/// Builds the observation for a pass.
pub fn observe<B: CloudBackend>(
    engine: &Engine,
    state: &State,
    backend: &mut B,
    feedback: &Feedback,
    now: Timestamp,
) -> Result<Observation, BackendError> {
    let scope = engine.inventory_scope(state);
    let (nodes, queued_resources) = backend.inventory(&scope, now)?;
    let in_flight: Vec<(&Job, &Attempt)> = state
        .jobs
        .values()
        .filter(|j| matches!(j.status, JobStatus::Running | JobStatus::Cancelling))
        .filter_map(|j| Some((j, j.attempt()?)))
        .collect();
    let mut attempts = NameMap::with_capacity_and_hasher(in_flight.len(), Default::default());
    for (job, attempt) in in_flight {
        let mut report = backend
            .attempt_report(&attempt.id, &job.id, now)?
            .unwrap_or_default();
        report.launch_error = feedback.launch_errors.get(&attempt.id).cloned();
        report.cancel = feedback.cancels.get(&attempt.id).cloned();
        attempts.insert(attempt.id, report);
    }
    Ok(Observation {
        nodes,
        queued_resources,
        attempts,
        failures: feedback.failures.clone(),
    })
}

/// Carries out the actions of a pass and returns what the next pass must hear.
pub fn execute<B: CloudBackend>(backend: &mut B, actions: &[Action], now: Timestamp) -> Feedback {
    let mut feedback = Feedback::default();
    for action in actions {
        match backend.execute(action, now) {
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
        }
    }
    feedback
}

/// One full pass: observe, reconcile, act. `Err` when the observation could not be made (the
/// pass is skipped; nothing changed).
pub fn pass<B: CloudBackend>(
    engine: &Engine,
    state: &mut State,
    backend: &mut B,
    feedback: &mut Feedback,
    now: Timestamp,
) -> Result<PassOutput, BackendError> {
    let observation = observe(engine, state, backend, feedback, now)?;
    let out = engine.reconcile(state, &observation, now);
    *feedback = execute(backend, &out.actions, now);
    Ok(out)
}
