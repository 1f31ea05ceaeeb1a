//! The boundary between the engine's decisions and a cloud: `CloudBackend` fetches exactly
//! the named resources and worker reports, and carries out one action at a time. Two
//! implementations: the simulator (`sim`) and GCP (to come). Refusals are returned as data.

pub mod sim;

use std::fmt;

use crate::engine::observe::{
    AttemptReport, CancelOutcome, CloudFailure, NodeInfo, QueuedResourceInfo, RemoteError,
};
use crate::engine::{Action, InventoryTargets, Timestamp};

/// A failed inventory or report read: the pass is skipped and retried later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendError {
    /// What failed.
    pub message: String,
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BackendError {}

/// What carrying out an action produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done (for deletions: also "was already gone").
    Done,
    /// The cloud refused; the engine plans around it on the next pass.
    Refused(CloudFailure),
    /// A launch failed on the workers.
    LaunchFailed(RemoteError),
    /// The result of a cancel.
    Cancelled(CancelOutcome),
}

/// A cloud the driver can observe and act on.
pub trait CloudBackend {
    /// Fetches the nodes and queued resources named in `targets` (absent ones are left out).
    fn inventory(
        &mut self,
        targets: &InventoryTargets<'_>,
        now: Timestamp,
    ) -> Result<(Vec<NodeInfo>, Vec<QueuedResourceInfo>), BackendError>;
    /// What the workers of `attempt_id` report (launch acknowledged, status objects,
    /// heartbeat); `None` if nothing is known of it.
    fn attempt_report(
        &mut self,
        attempt_id: &str,
        job_id: &str,
        now: Timestamp,
    ) -> Result<Option<AttemptReport>, BackendError>;
    /// Carries out one action.
    fn execute(&mut self, action: &Action, now: Timestamp) -> Outcome;
}
