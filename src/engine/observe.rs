//! What the engine is told about the cloud (an observation) and what it asks for in return
//! (actions and events). These are plain data shared by every backend: the simulator and
//! GCP produce the same `Observation` and consume the same `Action`s. No behaviour here.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::time::Timestamp;
use crate::spec::{Name, NameMap, ProvisioningModel, TpuType};

/// Label naming the runner on managed TPUs and queued resources.
pub const LABEL_MANAGED_BY: &str = "managed-by";
/// Label naming the fleet entry on managed TPUs and queued resources.
pub const LABEL_FLEET_ENTRY: &str = "fleet-entry";

/// Labels of an observed object, shared so that observing it again copies nothing.
pub type Labels = Arc<BTreeMap<String, String>>;

/// A snapshot of the cloud, taken once per pass. Objects are shared (`Arc`): a driver may
/// hand the same unchanged object to many passes without copying it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// TPU nodes found in the inventory scope, by (zone, name).
    #[serde(default)]
    pub nodes: Vec<Arc<NodeInfo>>,
    /// Queued resources found in the inventory scope, by (zone, name).
    #[serde(default)]
    pub queued_resources: Vec<Arc<QueuedResourceInfo>>,
    /// What the workers report, by attempt id (hashed: only looked up, never iterated).
    #[serde(default)]
    pub attempts: NameMap<AttemptReport>,
    /// Refusals of the previous pass's actions (stockout, quota, rate limit, …).
    #[serde(default)]
    pub failures: Vec<ActionFailure>,
    /// When the worker reports were read (the heartbeat of a `beating` report).
    #[serde(default)]
    pub read_at: Option<Timestamp>,
    /// What the previous pass's disk recoveries on adopted TPUs answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disk_recoveries: Vec<DiskRecovery>,
    /// This observation's number in its driver's sequence (0: not numbered).
    #[serde(skip)]
    pub serial: u64,
    /// Which reports may differ from those of observation `since`, if the driver kept
    /// track (the engine then need not compare every report; `None`: any may differ).
    #[serde(skip)]
    pub report_changes: Option<ReportChanges>,
    /// Attempts whose report carries a launch or cancel result (the driver's bookkeeping:
    /// the next observation clears them).
    #[serde(skip)]
    pub fed: Vec<Name>,
    /// The inventory as the last successful listing gave it (the driver's bookkeeping, to
    /// tell what the next listing changed: `sightings`).
    #[serde(skip)]
    pub listed: (Vec<Arc<NodeInfo>>, Vec<Arc<QueuedResourceInfo>>),
    /// What others hold in the listed zones.
    #[serde(default, skip_serializing_if = "Others::is_empty")]
    pub others: Others,
}

/// The nodes and queued resources of the listed zones that this runner neither created nor
/// adopted: another team's, another runner's, made by hand. The engine never acts on them;
/// their chips count against the fleet's chip limits, as the project's quota counts them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Others {
    /// Their nodes, by (zone, name).
    #[serde(default)]
    pub nodes: Vec<NodeInfo>,
    /// Their queued resources, by (zone, name).
    #[serde(default)]
    pub queued_resources: Vec<QueuedResourceInfo>,
}

impl Others {
    /// Nothing of anyone else's is listed.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.queued_resources.is_empty()
    }

    /// Empties both lists.
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.queued_resources.clear();
    }
}

impl Observation {
    /// The last sign of life of the workers behind `report`.
    pub fn heartbeat(&self, report: &AttemptReport) -> Option<Timestamp> {
        if report.beating {
            self.read_at.or(report.heartbeat_at)
        } else {
            report.heartbeat_at
        }
    }
}

/// The attempts whose worker report may differ from an earlier observation's other than by
/// a later heartbeat (every other report is the same, or its workers were heard from since).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReportChanges {
    /// The `serial` of the earlier observation.
    pub since: u64,
    /// Attempts whose report may differ, was added or was dropped.
    pub attempts: Vec<Name>,
}

/// A TPU VM as the TPU API describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Node id.
    pub name: Name,
    /// Zone.
    pub zone: Name,
    /// Accelerator type.
    pub tpu_type: TpuType,
    /// Lifecycle state.
    pub state: NodeState,
    /// Health.
    #[serde(default)]
    pub health: Health,
    /// Spot (preemptible) capacity.
    pub spot: bool,
    /// Created in a reservation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserved: bool,
    /// Labels (shared: reading the same object again copies nothing).
    #[serde(default)]
    pub labels: Labels,
    /// The queued resource that created it, if any.
    #[serde(default)]
    pub queued_resource: Option<Name>,
    /// Network endpoints (= workers).
    pub worker_count: u32,
    /// Some endpoint has a public IP.
    #[serde(default)]
    pub public_ip: bool,
}

/// TPU node states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NodeState {
    /// Being created.
    Creating,
    /// Ready.
    Ready,
    /// Restarting.
    Restarting,
    /// Being repaired.
    Repairing,
    /// Stopping.
    Stopping,
    /// Starting.
    Starting,
    /// Stopped.
    Stopped,
    /// Preempted.
    Preempted,
    /// Terminated.
    Terminated,
    /// Failed.
    Failed,
    /// Being deleted.
    Deleting,
    /// Suspending.
    Suspending,
    /// Suspended.
    Suspended,
}

impl NodeState {
    /// States that end a TPU (§ conventions): preempted, suspending, suspended, terminated,
    /// stopped, failed, deleting.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            NodeState::Preempted
                | NodeState::Suspending
                | NodeState::Suspended
                | NodeState::Terminated
                | NodeState::Stopped
                | NodeState::Failed
                | NodeState::Deleting
        )
    }

    /// The API's name (`READY`), as serde writes it.
    pub fn api_name(self) -> &'static str {
        match self {
            NodeState::Creating => "CREATING",
            NodeState::Ready => "READY",
            NodeState::Restarting => "RESTARTING",
            NodeState::Repairing => "REPAIRING",
            NodeState::Stopping => "STOPPING",
            NodeState::Starting => "STARTING",
            NodeState::Stopped => "STOPPED",
            NodeState::Preempted => "PREEMPTED",
            NodeState::Terminated => "TERMINATED",
            NodeState::Failed => "FAILED",
            NodeState::Deleting => "DELETING",
            NodeState::Suspending => "SUSPENDING",
            NodeState::Suspended => "SUSPENDED",
        }
    }
}

/// TPU node health.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Health {
    /// Healthy (also the default when the API omits it).
    #[default]
    Healthy,
    /// Unhealthy for an unspecified reason.
    Unhealthy,
    /// Unhealthy because of maintenance.
    UnhealthyMaintenance,
    /// Unhealthy TensorFlow runtime.
    UnhealthyTensorflow,
    /// Timed out.
    Timeout,
}

impl Health {
    /// The API's name (`HEALTHY`), as serde writes it.
    pub fn api_name(self) -> &'static str {
        match self {
            Health::Healthy => "HEALTHY",
            Health::Unhealthy => "UNHEALTHY",
            Health::UnhealthyMaintenance => "UNHEALTHY_MAINTENANCE",
            Health::UnhealthyTensorflow => "UNHEALTHY_TENSORFLOW",
            Health::Timeout => "TIMEOUT",
        }
    }
}

impl NodeInfo {
    /// READY and HEALTHY.
    pub fn is_operational(&self) -> bool {
        self.state == NodeState::Ready && self.health == Health::Healthy
    }

    /// How it is paid for.
    pub fn model(&self) -> ProvisioningModel {
        ProvisioningModel::of(self.spot, self.reserved)
    }
}

impl QueuedResourceInfo {
    /// How what it asks for is paid for.
    pub fn model(&self) -> ProvisioningModel {
        ProvisioningModel::of(self.spot, self.reserved)
    }
}

/// A queued resource as the TPU API describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedResourceInfo {
    /// Queued resource id.
    pub name: Name,
    /// Zone.
    pub zone: Name,
    /// Node id it provisions.
    pub node_id: Name,
    /// Accelerator type.
    pub tpu_type: TpuType,
    /// State.
    pub state: QrState,
    /// Spot tier.
    pub spot: bool,
    /// Asks for capacity of a reservation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserved: bool,
    /// Labels (shared, as for nodes).
    #[serde(default)]
    pub labels: Labels,
    /// Why it failed, as the cloud says (`FAILED` requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// Queued resource states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum QrState {
    /// Being created.
    Creating,
    /// Accepted (older API).
    Accepted,
    /// Waiting for capacity.
    WaitingForResources,
    /// Capacity found; the node is being provisioned.
    Provisioning,
    /// The node exists.
    Active,
    /// Failed (stays until deleted).
    Failed,
    /// Being deleted.
    Deleting,
    /// Being suspended.
    Suspending,
    /// Suspended.
    Suspended,
    /// Validity window ended.
    Expired,
}

impl QrState {
    /// Live: accepted, waiting, provisioning, creating or active.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            QrState::Creating
                | QrState::Accepted
                | QrState::WaitingForResources
                | QrState::Provisioning
                | QrState::Active
        )
    }

    /// Being deleted or suspended.
    pub fn is_deleting(self) -> bool {
        matches!(self, QrState::Deleting | QrState::Suspending)
    }

    /// The API's name (`WAITING_FOR_RESOURCES`), as serde writes it.
    pub fn api_name(self) -> &'static str {
        match self {
            QrState::Creating => "CREATING",
            QrState::Accepted => "ACCEPTED",
            QrState::WaitingForResources => "WAITING_FOR_RESOURCES",
            QrState::Provisioning => "PROVISIONING",
            QrState::Active => "ACTIVE",
            QrState::Failed => "FAILED",
            QrState::Deleting => "DELETING",
            QrState::Suspending => "SUSPENDING",
            QrState::Suspended => "SUSPENDED",
            QrState::Expired => "EXPIRED",
        }
    }
}

/// What the workers of one attempt report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptReport {
    /// Every expected worker acknowledged the launch.
    #[serde(default)]
    pub launched: bool,
    /// The last launch failed.
    #[serde(default)]
    pub launch_error: Option<RemoteError>,
    /// The result of the last cancel.
    #[serde(default)]
    pub cancel: Option<CancelOutcome>,
    /// Final status objects, one per worker that finished.
    #[serde(default)]
    pub statuses: Vec<WorkerStatus>,
    /// Last heartbeat of the slowest live worker (absent before launch).
    #[serde(default)]
    pub heartbeat_at: Option<Timestamp>,
    /// Every live worker was heard from when the reports were read (the observation's
    /// `read_at`), whatever `heartbeat_at` says: for a backend that knows liveness without
    /// re-reading a report on every pass.
    #[serde(default)]
    pub beating: bool,
}

/// A failed remote operation (launch or cancel).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteError {
    /// How to treat it.
    pub kind: RemoteErrorKind,
    /// Error text.
    pub message: String,
}

/// Classes of remote-operation errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteErrorKind {
    /// Connection trouble; try again.
    Temporary,
    /// The TPU no longer exists.
    NotFound,
    /// Anything else.
    Hard,
}

/// Result of a remote cancel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum CancelOutcome {
    /// The signal was sent to a running process.
    Sent,
    /// No process of the attempt runs on any worker (confirmed).
    NotRunning,
    /// A worker runs a different attempt.
    AttemptMismatch,
    /// The cancel itself failed.
    Error {
        /// The error.
        error: RemoteError,
    },
}

/// The final status object a worker writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Worker host name.
    pub host: String,
    /// Final state.
    pub state: WorkerState,
    /// Exit code of the command (absent if it never ran).
    #[serde(default)]
    pub command_exit_code: Option<i32>,
    /// When the worker finished.
    #[serde(default)]
    pub finished_at: Option<Timestamp>,
    /// An infrastructure failure the runner detected (slice failure, device busy).
    #[serde(default)]
    pub infrastructure_failure: Option<String>,
    /// Uploading logs failed.
    #[serde(default)]
    pub artifact_upload_error: Option<String>,
    /// Why set-up failed, as the worker said (bounded): the command never ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_error: Option<String>,
}

/// A worker's final state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// The command exited 0.
    Succeeded,
    /// The command exited non-zero.
    Failed,
    /// The runner's set-up failed before the command ran.
    FailedSetup,
    /// The command ran but its logs could not be uploaded.
    FailedArtifacts,
}

/// What a disk recovery on an adopted TPU answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskRecovery {
    /// The TPU's record.
    pub resource_id: Name,
    /// Every worker's answer line (`TPU_RUNNER_DISK_RECOVERY <host> SUFFICIENT|RECOVERED
    /// <before> <after> <work entries> <cache dirs>`), or why it could not be done.
    pub result: Result<Vec<String>, String>,
}

/// A refused action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionFailure {
    /// The action that failed.
    pub action: Action,
    /// Why.
    pub failure: CloudFailure,
}

/// Why the cloud refused an action. Data the engine plans around, never a panic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "message")]
pub enum CloudFailure {
    /// No capacity of that type in that zone now.
    Stockout(String),
    /// Project quota exhausted.
    QuotaExhausted(String),
    /// HTTP 429: too many requests.
    RateLimited(String),
    /// The object does not exist (deletes treat this as success).
    NotFound(String),
    /// The object already exists.
    AlreadyExists(String),
    /// 5xx or a timeout: the outcome is unknown.
    Unavailable(String),
    /// Anything else (permission, bad request).
    Permanent(String),
}

/// A request to the cloud. Idempotent by name: repeating one is harmless.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Action {
    /// Request a Spot TPU through a queued resource.
    CreateQueuedResource {
        /// Queued resource id.
        name: Name,
        /// Node id.
        node_id: Name,
        /// Zone.
        zone: Name,
        /// Accelerator type.
        tpu_type: TpuType,
        /// Runtime version.
        runtime: String,
        /// Fleet entry (label).
        entry_id: Name,
        /// How its capacity is paid for (the queued resource's tier).
        #[serde(default = "spot")]
        model: ProvisioningModel,
        /// The reservation it asks in (`reserved` only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reservation: Option<String>,
    },
    /// Delete a queued resource (and its node).
    DeleteQueuedResource {
        /// Queued resource id.
        name: Name,
        /// Zone.
        zone: Name,
    },
    /// Delete a node.
    DeleteNode {
        /// Node id.
        name: Name,
        /// Zone.
        zone: Name,
    },
    /// Start an attempt on every worker of a TPU (idempotent per attempt id).
    Launch(Box<LaunchRequest>),
    /// Free the disk space the agent's own folders hold on an idle adopted TPU (its
    /// workspace, then its oldest caches), on every worker.
    RecoverDisk {
        /// The TPU's record.
        resource_id: Name,
        /// Node.
        tpu_name: Name,
        /// Zone.
        zone: Name,
        /// Expected workers.
        worker_count: u32,
    },
    /// Stop an attempt on every worker (confirms when nothing of it runs).
    Cancel {
        /// Attempt to stop.
        attempt_id: Name,
        /// Its job.
        job_id: Name,
        /// Node.
        tpu_name: Name,
        /// Zone.
        zone: Name,
        /// Why the job is stopped when it will run again: the workers tell its command
        /// (`TPU_RUNNER_PREEMPTION_FILE`, then SIGTERM) and give it a notice's time to save.
        /// `None` for a cancel the job does not come back from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        notice: Option<Notice>,
    },
}

/// Why a running command is asked to stop early and will be started again: the word written
/// into its `TPU_RUNNER_PREEMPTION_FILE` (docs/workers.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Notice {
    /// The metadata server announced a Spot preemption (`instance/preempted` = `TRUE`).
    SpotPreemption,
    /// The metadata server announced host maintenance that stops the TPU
    /// (`instance/maintenance-event` other than `NONE`).
    HostMaintenance,
    /// The controller stops it to take its Spot TPU away (`interrupt-spot`).
    InterruptSpot,
    /// The controller stops it for a job of higher priority.
    PriorityPreemption,
}

impl Notice {
    /// Every notice.
    pub const ALL: [Notice; 4] = [
        Notice::SpotPreemption,
        Notice::HostMaintenance,
        Notice::InterruptSpot,
        Notice::PriorityPreemption,
    ];

    /// The word in the marker file, the agent's `--notice` and a status object's
    /// `infrastructure_failure`.
    pub fn word(self) -> &'static str {
        match self {
            Notice::SpotPreemption => "spot-preemption",
            Notice::HostMaintenance => "host-maintenance",
            Notice::InterruptSpot => "interrupt-spot",
            Notice::PriorityPreemption => "priority-preemption",
        }
    }

    /// The notice a word names.
    pub fn of_word(word: &str) -> Option<Notice> {
        Notice::ALL.into_iter().find(|n| n.word() == word)
    }
}

/// Everything the workers need to run an attempt.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LaunchRequest {
    /// Attempt id.
    pub attempt_id: Name,
    /// Job id.
    pub job_id: Name,
    /// Resource id.
    pub resource_id: Name,
    /// Node.
    pub tpu_name: Name,
    /// Zone.
    pub zone: Name,
    /// Accelerator type.
    pub tpu_type: TpuType,
    /// Expected workers.
    pub worker_count: u32,
    /// The job's command.
    pub command: String,
    /// The job's bucket (`JOB_BUCKET`).
    pub bucket: String,
    /// Stable across retries: `<bucket>/jobs/<job>/checkpoints`.
    pub checkpoint_dir: String,
    /// The checkpoint directory of the job's previous bucket, to copy into `checkpoint_dir`
    /// before the command starts (the job was moved to another region with
    /// `move_checkpoints: true`; objects already there are kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_from: Option<String>,
    /// The job's environment.
    pub env: BTreeMap<String, String>,
    /// The content bundle in the job's bucket, named by its SHA-256
    /// (`gs://B/bundles/<sha256>.tar.gz`, which the workers verify), or the `gs://` object the
    /// job names; `None`: no bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    /// Caches the job declares (kept on the TPU between jobs that declare the same key).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<crate::spec::job::Cache>,
}

impl Action {
    /// A short kind name (for API call counts).
    pub fn kind(&self) -> &'static str {
        match self {
            Action::CreateQueuedResource { .. } => "create_queued_resource",
            Action::DeleteQueuedResource { .. } => "delete_queued_resource",
            Action::DeleteNode { .. } => "delete_node",
            Action::Launch(_) => "launch",
            Action::Cancel { .. } => "cancel",
            Action::RecoverDisk { .. } => "recover_disk",
        }
    }
}

/// The model of a create action written before models existed.
fn spot() -> ProvisioningModel {
    ProvisioningModel::Spot
}

/// The kind of the event a controller records before its first pass's decisions: the
/// policy it runs (`name= digest= interval= ` and its parameters).
pub const POLICY_EVENT: &str = "controller_policy";

/// Something that happened, for the event log (one JSON line each).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When.
    pub at: Timestamp,
    /// What (snake_case, stable names shared with the original where they exist).
    pub kind: String,
    /// Job concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<Name>,
    /// Resource concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_id: Option<Name>,
    /// Attempt concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<Name>,
    /// Details.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}
