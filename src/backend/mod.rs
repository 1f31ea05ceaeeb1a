//! The boundary between the engine's decisions and a cloud: `CloudBackend` reads the
//! inventory scope (the runner's objects per zone, adopted TPUs by name) and worker reports,
//! and carries out a pass's actions. Two implementations: the simulator (`sim`) and GCP
//! (`gcp`, over the TPU API). Refusals are returned as data, never as panics.

pub mod gcp;
pub mod sim;
pub mod ssh;
pub mod workers;

use std::fmt;
use std::sync::Arc;

use crate::engine::observe::{
    AttemptReport, CancelOutcome, CloudFailure, NodeInfo, Others, QueuedResourceInfo, RemoteError,
};
use crate::engine::{Action, InventoryScope, Timestamp};
use crate::spec::{Name, NameMap};

/// An attempt whose workers may report: its id, its job, and the job's bucket (where the
/// workers write their status objects).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// Attempt id.
    pub attempt: Name,
    /// Job id.
    pub job: Name,
    /// The job's bucket (`gs://…`; empty before placement).
    pub bucket: Name,
}

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
    /// What a disk recovery's workers answered (one line each), or why it failed.
    DiskRecovery(Result<Vec<String>, String>),
}

/// What an inventory read found, each list sorted by (zone, name).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inventory {
    /// This runner's nodes and the adopted ones.
    pub nodes: Vec<Arc<NodeInfo>>,
    /// This runner's queued resources.
    pub queued_resources: Vec<Arc<QueuedResourceInfo>>,
    /// Everything else the zones' listings hold (never acted on; counted against chip
    /// limits).
    pub others: Others,
}

/// What a report refresh did.
#[derive(Clone, Debug, PartialEq)]
pub struct Refreshed {
    /// When the reports were read.
    pub read_at: Timestamp,
    /// The attempts whose report may differ from the map handed in other than by a later
    /// heartbeat (added, dropped or re-read); `None` when the backend cannot tell.
    pub changed: Option<Vec<Name>>,
}

/// A cloud the driver can observe and act on.
pub trait CloudBackend {
    /// Lists the nodes and queued resources labelled `managed-by` = `scope.runner` in each
    /// of `scope.zones` and fetches the adopted nodes by name (absent ones are left out),
    /// into `inventory`: each kind sorted by (zone, name), without duplicates; the zones'
    /// other nodes and queued resources (not this runner's, not adopted) go to
    /// `inventory.others`. `inventory`
    /// is what this backend left there on the previous call, kept by the driver: a backend
    /// may leave the objects of zones that did not change where they are, and must replace
    /// everything when handed anything else (empty lists force a full read). Any failed call
    /// fails the whole read; the lists may then be partly updated, and the next call must
    /// replace them.
    fn inventory(
        &mut self,
        scope: &InventoryScope<'_>,
        now: Timestamp,
        inventory: &mut Inventory,
    ) -> Result<(), BackendError>;
    /// Brings `reports` up to date with what the workers of each attempt in `in_flight`
    /// (in job-id order) report (launch acknowledged, status objects,
    /// heartbeat or `beating`; a default report when nothing is known of it), and drops every
    /// other attempt's. `reports` is the map this backend brought up to date on the previous
    /// call, kept by the driver: a backend may re-read only the attempts whose workers wrote,
    /// stopped or started since, and must read every attempt when handed any other map (an
    /// empty one forces a full read). On error the map may be partly updated, and a backend
    /// whose read failed part-way must read every attempt on its next call.
    fn refresh_reports(
        &mut self,
        in_flight: &[InFlight],
        reports: &mut NameMap<AttemptReport>,
        now: Timestamp,
    ) -> Result<Refreshed, BackendError>;
    /// Carries out the actions of a pass, one outcome per action, in order. They are
    /// independent (the engine orders nothing within a pass), so a backend may run them at
    /// once, with a bound; a refusal of one never stops the others.
    fn execute(&mut self, actions: &[Action], now: Timestamp) -> Vec<Outcome>;
}
