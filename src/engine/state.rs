//! The persistent state model: jobs (with their attempts), resources (TPUs), interruption
//! requests and de-duplicated notices. Every status is an enum and every change of status
//! goes through a transition method that refuses an illegal move, so an invalid state
//! cannot be built by the engine. Serialised as versioned JSON (`SCHEMA_VERSION`); the same
//! schema is what `plan --state` reads and `status --json` prints. No IO, no clock.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::sorted_map::SortedMap;
use super::time::Timestamp;
use crate::spec::gcp::ModelSet;
use crate::spec::{JobSpec, Name, ProvisioningModel, TpuType};

/// Version of the JSON state schema. Bump on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// An attempt to move an object to a status it may not reach from where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IllegalTransition {
    /// `job`, `attempt`, `resource` or `interruption_request`.
    pub kind: &'static str,
    /// Object id.
    pub id: Name,
    /// Status it was in.
    pub from: String,
    /// Status it was asked to take.
    pub to: String,
}

impl fmt::Display for IllegalTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "illegal {} transition for {}: {} -> {}",
            self.kind, self.id, self.from, self.to
        )
    }
}

impl std::error::Error for IllegalTransition {}

/// Everything the controller remembers between passes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Schema version of this document.
    pub schema_version: u32,
    /// Jobs that are pending, running or cancelling, by id (in id order, hashed lookups).
    pub jobs: SortedMap<Job>,
    /// Jobs that reached a terminal status (succeeded, failed, deactivated), kept as history.
    /// A pass never iterates them, so its cost does not grow with history. Boxed: the map's
    /// nodes, a third empty on average, hold pointers rather than whole jobs.
    #[serde(default)]
    pub finished: BTreeMap<Name, Box<Job>>,
    /// TPU records by resource id (node name, or `adopted-<name>`), in id order, hashed
    /// lookups.
    pub resources: SortedMap<Resource>,
    /// Controlled interruption requests by id.
    #[serde(default)]
    pub interruption_requests: BTreeMap<Name, InterruptionRequest>,
    /// Per fleet entry: no capacity request before this time (after a refusal).
    #[serde(default)]
    pub entry_backoff: BTreeMap<Name, Backoff>,
    /// Conditions already reported, so each event is emitted once per change, not every pass.
    #[serde(default)]
    pub notices: BTreeMap<String, String>,
    /// Stockout memory per pool (`zone/type/model`), when the policy keeps one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pools: BTreeMap<String, PoolMemory>,
    /// TPUs someone else holds in the fleet's zones, as the last pass counted them against
    /// the chip limits (so that a command planning from the state alone counts them too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub others: Vec<OthersTpus>,
}

impl State {
    /// An empty state of the current schema.
    pub fn new() -> State {
        State {
            schema_version: SCHEMA_VERSION,
            ..State::default()
        }
    }

    /// Adds a job as submitted (status pending). Refuses an id already present.
    pub fn submit(&mut self, job: Job) -> Result<(), String> {
        if self.job(&job.id).is_some() {
            return Err(format!("job already exists: {}", job.id));
        }
        self.jobs.insert(job.id, job);
        Ok(())
    }

    /// The job `id`, active or finished.
    pub fn job(&self, id: &Name) -> Option<&Job> {
        self.jobs
            .get(id)
            .or_else(|| self.finished.get(id).map(|j| &**j))
    }

    /// Every job, active ones first.
    pub fn all_jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs
            .values()
            .chain(self.finished.values().map(|j| &**j))
    }

    /// Moves `id` to `finished` if it is terminal, giving back the room its lists had left to
    /// grow (history is kept for the whole run: a long simulation holds every job it saw).
    pub fn retire(&mut self, id: &Name) {
        if self.jobs.get(id).is_some_and(|j| j.status.is_terminal())
            && let Some(mut job) = self.jobs.remove(id)
        {
            job.attempts.shrink_to_fit();
            self.finished.insert(job.id, Box::new(job));
        }
    }
}

/// Capacity requests for an entry are paused until `until` after `failures` refusals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// Consecutive refusals.
    pub failures: u32,
    /// No new request before this time.
    pub until: Timestamp,
    /// Why (the last refusal).
    pub reason: String,
    /// The refused queued resource (the backoff ends when it exists).
    #[serde(default)]
    pub request: Name,
}

/// TPUs of one pool (zone, TPU type, provisioning model) that someone else holds: another
/// team's, another runner's, made by hand.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OthersTpus {
    /// Zone.
    pub zone: Name,
    /// TPU type.
    pub tpu_type: TpuType,
    /// How they are paid for.
    pub model: ProvisioningModel,
    /// How many (nodes that hold chips, and live requests without such a node).
    pub count: u32,
}

/// What the stockout memory holds for one pool (zone, TPU type, provisioning model).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMemory {
    /// Since when a request of the pool has waited for capacity with none granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<Timestamp>,
    /// Requests of the pool granted (provisioning or active) at the last pass.
    #[serde(default)]
    pub granted: u32,
    /// Stockout signals since capacity was last seen.
    #[serde(default)]
    pub strikes: u32,
    /// Requests go elsewhere first until this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cool_until: Option<Timestamp>,
    /// The last signal, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl PoolMemory {
    /// The pool of a fleet entry: `zone/type/model` (entries of one zone, type and model
    /// draw on the same capacity).
    pub fn key(entry: &crate::spec::TpuEntry) -> String {
        format!(
            "{}/{}/{}",
            entry.zone,
            entry.tpu_type,
            entry.provisioning_model.as_str()
        )
    }

    /// True when requests should go elsewhere first at `now`.
    pub fn cooling(&self, now: Timestamp) -> bool {
        self.cool_until.is_some_and(|t| t > now)
    }
}

/// Status of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Waiting for a TPU.
    Pending,
    /// Assigned; its current attempt is launching or running.
    Running,
    /// Cancel requested while running; waiting for the remote stop.
    Cancelling,
    /// Every worker exited 0.
    Succeeded,
    /// Failed (application, setup, artifacts, retries exhausted, or interrupted with retry off).
    Failed,
    /// Cancelled.
    Deactivated,
}

impl JobStatus {
    /// True for succeeded, failed and deactivated.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Deactivated
        )
    }

    /// The legal moves of §2: pending → running | deactivated; running → cancelling |
    /// succeeded | failed | pending; cancelling → deactivated.
    pub fn can_become(self, to: JobStatus) -> bool {
        use JobStatus::*;
        matches!(
            (self, to),
            (Pending, Running)
                | (Pending, Deactivated)
                | (Running, Cancelling)
                | (Running, Succeeded)
                | (Running, Failed)
                | (Running, Pending)
                | (Cancelling, Deactivated)
        )
    }

    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Cancelling => "cancelling",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Deactivated => "deactivated",
        }
    }

    /// The word a person reads: as [`as_str`](Self::as_str), but `cancelled` for the
    /// stored `deactivated` (the original's word, kept in records and JSON).
    pub fn word(self) -> &'static str {
        match self {
            JobStatus::Deactivated => "cancelled",
            other => other.as_str(),
        }
    }
}

/// Where a job is placed: every retry stays there (same bucket, same checkpoints) unless the
/// fleet's policy moves it after repeated preemptions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Exact region of the selected bucket (`storage_region`).
    pub region: String,
    /// The selected bucket (`JOB_BUCKET`; interned: every pass hands it to the workers'
    /// report reads).
    pub bucket: Name,
    /// The bucket's region when the job was moved away from it without its checkpoints
    /// (`move_checkpoints: false`); `None`: `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_region: Option<String>,
    /// The checkpoint directory to copy into this bucket's before the next attempt's command
    /// starts (a move with `move_checkpoints: true`); cleared once an attempt's workers report
    /// launched (they copy before they start the command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_from: Option<String>,
    /// When the job was moved here (`None`: placed here first): preemptions before do not
    /// count towards the next move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
}

impl Placement {
    /// A first placement: `bucket` in `region`.
    pub fn new(region: &str, bucket: &str) -> Placement {
        Placement {
            region: region.to_owned(),
            bucket: Name::new(bucket),
            bucket_region: None,
            checkpoint_from: None,
            since: None,
        }
    }

    /// The region of the job's bucket (and checkpoints).
    pub fn bucket_region(&self) -> &str {
        self.bucket_region.as_deref().unwrap_or(&self.region)
    }
}

/// A bucket of the job and the region it lives in (found at submit).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BucketRegion {
    /// Exact region.
    pub region: String,
    /// `gs://` URI.
    pub bucket: String,
}

/// A submitted job and its history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Job id.
    pub id: Name,
    /// The validated specification.
    pub spec: JobSpec,
    /// Submission time (FIFO order).
    pub submitted_at: Timestamp,
    /// Current status.
    pub status: JobStatus,
    /// Candidate regions with their buckets (sorted by region).
    pub bucket_regions: Vec<BucketRegion>,
    /// Pinned placement, set by the first assignment.
    #[serde(default)]
    pub placement: Option<Placement>,
    /// Resource running it (while running or cancelling).
    #[serde(default)]
    pub assigned_resource: Option<Name>,
    /// Current (or last) attempt id.
    #[serde(default)]
    pub current_attempt: Option<Name>,
    /// Every attempt, oldest first.
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    /// Retryable infrastructure failures so far (capped by the engine config).
    #[serde(default)]
    pub infra_failures: u32,
    /// Preemptions and losses so far.
    #[serde(default)]
    pub interruptions: u32,
    /// Not to be assigned before this time (backoff after an infrastructure failure).
    #[serde(default)]
    pub not_before: Option<Timestamp>,
    /// When it reached a terminal status.
    #[serde(default)]
    pub ended_at: Option<Timestamp>,
    /// Why it ended (for terminal jobs).
    #[serde(default)]
    pub end_reason: Option<String>,
    /// Fingerprint of what the job accepts, derived from `spec` and `bucket_regions` (which
    /// never change after submission); never serialised, filled again by the first pass.
    #[serde(skip)]
    pub(crate) print: RequirementPrintCache,
}

/// A cached [`RequirementPrint`]. Derived data: every two caches compare equal, so it never
/// makes two jobs differ.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequirementPrintCache(pub(crate) Option<RequirementPrint>);

impl PartialEq for RequirementPrintCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// 128-bit fingerprints (truncated SHA-1) of a job's requirement, so grouping a large queue
/// by requirement reads two numbers per job instead of following its strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequirementPrint {
    /// Types, zone and TPU name.
    pub base: u128,
    /// The same plus the bucket regions (for jobs not pinned to a region).
    pub with_regions: u128,
}

impl RequirementPrint {
    /// The fingerprints of `job`'s requirement.
    pub fn of(job: &Job) -> RequirementPrint {
        use sha1::{Digest, Sha1};
        fn field(h: &mut Sha1, bytes: &[u8]) {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        }
        fn finish(h: Sha1) -> u128 {
            let digest = h.finalize();
            u128::from_le_bytes(digest[..16].try_into().expect("SHA-1 has 20 bytes"))
        }
        let mut h = Sha1::new();
        match &job.spec.tpu {
            crate::spec::TpuRequest::Any => field(&mut h, b"any"),
            crate::spec::TpuRequest::OneOf(types) => {
                field(&mut h, b"one_of");
                h.update((types.len() as u64).to_le_bytes());
                for t in types {
                    field(&mut h, t.to_string().as_bytes());
                }
            }
        }
        for text in [&job.spec.zone, &job.spec.tpu_name] {
            match text {
                Some(text) => {
                    h.update([1]);
                    field(&mut h, text.as_bytes());
                }
                None => h.update([0]),
            }
        }
        let base = h.clone();
        h.update((job.bucket_regions.len() as u64).to_le_bytes());
        for b in &job.bucket_regions {
            field(&mut h, b.region.as_bytes());
        }
        RequirementPrint {
            base: finish(base),
            with_regions: finish(h),
        }
    }
}

impl Job {
    /// A new pending job.
    pub fn new(spec: JobSpec, submitted_at: Timestamp, bucket_regions: Vec<BucketRegion>) -> Job {
        let mut bucket_regions = bucket_regions;
        bucket_regions.sort();
        let mut job = Job {
            id: Name::new(&spec.id),
            spec,
            submitted_at,
            status: JobStatus::Pending,
            bucket_regions,
            placement: None,
            assigned_resource: None,
            current_attempt: None,
            attempts: Vec::new(),
            infra_failures: 0,
            interruptions: 0,
            not_before: None,
            ended_at: None,
            end_reason: None,
            print: RequirementPrintCache::default(),
        };
        job.ensure_print();
        job
    }

    /// Fills the requirement fingerprint if it is missing (a job read from JSON).
    pub(crate) fn ensure_print(&mut self) {
        if self.print.0.is_none() {
            self.print = RequirementPrintCache(Some(RequirementPrint::of(self)));
        }
    }

    /// The requirement fingerprint (computed now if missing).
    pub fn print(&self) -> RequirementPrint {
        self.print.0.unwrap_or_else(|| RequirementPrint::of(self))
    }

    /// Moves to `to`, refusing illegal moves.
    pub fn transition(&mut self, to: JobStatus, now: Timestamp) -> Result<(), IllegalTransition> {
        if !self.status.can_become(to) {
            return Err(IllegalTransition {
                kind: "job",
                id: self.id,
                from: self.status.as_str().into(),
                to: to.as_str().into(),
            });
        }
        self.status = to;
        if to.is_terminal() {
            self.ended_at = Some(now);
        }
        Ok(())
    }

    /// The current attempt, if any.
    pub fn attempt(&self) -> Option<&Attempt> {
        let id = self.current_attempt?;
        self.attempts.iter().rev().find(|a| a.id == id)
    }

    /// The current attempt, mutably.
    pub fn attempt_mut(&mut self) -> Option<&mut Attempt> {
        let id = self.current_attempt?;
        self.attempts.iter_mut().rev().find(|a| a.id == id)
    }

    /// The regions this job may still run in: its pinned region, or all bucket regions.
    pub fn candidate_regions(&self) -> RegionChoice<'_> {
        match &self.placement {
            Some(p) => RegionChoice::Pinned(&p.region),
            None => RegionChoice::AnyOf(&self.bucket_regions),
        }
    }

    /// Since when it has waited for a TPU: the end of its last attempt, or its submission.
    pub fn waiting_since(&self) -> Timestamp {
        self.attempts
            .last()
            .and_then(|a| a.ended_at)
            .unwrap_or(self.submitted_at)
    }

    /// The provisioning models of the managed entries it may take now under `fallback`:
    /// Spot always, another model once it has waited that model's wait; and when the next
    /// model opens to it, if one will.
    pub fn models_at(
        &self,
        fallback: &crate::spec::policy::Fallback,
        now: Timestamp,
    ) -> (ModelSet, Option<Timestamp>) {
        let since = self.waiting_since();
        let mut models = ModelSet::SPOT;
        let mut next: Option<Timestamp> = None;
        for model in ProvisioningModel::ALL {
            let Some(after) = fallback.after(model) else {
                continue;
            };
            if now.elapsed_since(since, after) {
                models = models.with(model);
            } else {
                let at = since.plus_secs(after);
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        (models, next)
    }

    /// True when the job may run in `region`.
    pub fn accepts_region(&self, region: &str) -> bool {
        self.candidate_regions().accepts(region)
    }
}

/// The regions a job may run in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RegionChoice<'a> {
    /// Pinned by a previous attempt.
    Pinned(&'a str),
    /// Any region with one of its buckets.
    AnyOf(&'a [BucketRegion]),
}

impl RegionChoice<'_> {
    /// True when `region` is allowed: the one region a job is pinned to, or any with one of
    /// its buckets (the one region rule of the engine, `plan` and `validate-jobs --buckets`).
    pub fn accepts(self, region: &str) -> bool {
        match self {
            RegionChoice::Pinned(r) => r == region,
            RegionChoice::AnyOf(list) => list.iter().any(|b| b.region == region),
        }
    }
}

/// Status of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptStatus {
    /// Created; the command is being started on the workers.
    Launching,
    /// Started on every worker.
    Running,
    /// Every worker exited 0.
    Succeeded,
    /// Preempted or lost; the job is requeued (or failed when retry is off).
    Interrupted,
    /// Stopped by a cancel.
    Cancelled,
    /// The command failed.
    Failed,
    /// The runner's own set-up failed on a worker.
    FailedSetup,
}

impl AttemptStatus {
    /// True once the attempt has ended.
    pub fn is_terminal(self) -> bool {
        !matches!(self, AttemptStatus::Launching | AttemptStatus::Running)
    }

    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Launching => "launching",
            AttemptStatus::Running => "running",
            AttemptStatus::Succeeded => "succeeded",
            AttemptStatus::Interrupted => "interrupted",
            AttemptStatus::Cancelled => "cancelled",
            AttemptStatus::Failed => "failed",
            AttemptStatus::FailedSetup => "failed_setup",
        }
    }
}

/// Why an attempt ended; each terminal status has its legal reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// All workers exited 0.
    Succeeded,
    /// The TPU was preempted or its capacity request ended.
    Preempted,
    /// The TPU or the workers were lost (retryable infrastructure failure).
    Lost,
    /// Cancelled by the user.
    Cancelled,
    /// The command failed.
    ApplicationFailed,
    /// The runner's set-up failed.
    SetupFailed,
}

impl EndReason {
    /// True when `reason` may end an attempt with `status` (§2).
    pub fn fits(self, status: AttemptStatus) -> bool {
        matches!(
            (status, self),
            (AttemptStatus::Succeeded, EndReason::Succeeded)
                | (
                    AttemptStatus::Interrupted,
                    EndReason::Preempted | EndReason::Lost
                )
                | (AttemptStatus::Cancelled, EndReason::Cancelled)
                | (AttemptStatus::Failed, EndReason::ApplicationFailed)
                | (AttemptStatus::FailedSetup, EndReason::SetupFailed)
        )
    }
}

/// One try of a job on one TPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// `attempt-<hash of job, resource, previous attempt>`.
    pub id: Name,
    /// The resource it runs on.
    pub resource_id: Name,
    /// Node name (denormalised for reports).
    pub tpu_name: Name,
    /// Zone of the node.
    pub zone: Name,
    /// Status.
    pub status: AttemptStatus,
    /// Created (assigned).
    pub created_at: Timestamp,
    /// Started on every worker.
    #[serde(default)]
    pub started_at: Option<Timestamp>,
    /// Ended.
    #[serde(default)]
    pub ended_at: Option<Timestamp>,
    /// Why it ended.
    #[serde(default)]
    pub end_reason: Option<EndReason>,
    /// Aggregated exit code.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Last error text (at most 4000 characters).
    #[serde(default)]
    pub error_summary: String,
    /// Launch failures so far (bounded: a launch that keeps failing ends the attempt).
    #[serde(default)]
    pub launch_failures: u32,
    /// True once a failed launch is waiting for confirmed cleanup before it ends.
    #[serde(default)]
    pub failed_launch: bool,
    /// Failed attempts to stop the remaining workers of an ended attempt.
    #[serde(default)]
    pub stop_failures: u32,
    /// Judged lost (silent workers): why. Its workers are being stopped; once they are, the
    /// job is requeued whatever exit codes the stop itself produced.
    #[serde(default)]
    pub lost: Option<String>,
    /// Its workers are being stopped for a controlled interruption (`interrupt-spot`): once
    /// they are, the attempt ends interrupted (as a preemption, not lost) and its job is
    /// requeued; never before, so two attempts of the job never run at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupting: bool,
    /// The job of higher priority it is stopped for (priority preemption): its workers get
    /// the notice; once they are stopped the attempt ends interrupted (as a preemption) and
    /// its job is requeued. Kept once ended: a job is displaced at most once in a window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub displaced_by: Option<Name>,
}

impl Attempt {
    /// A new attempt, launching on the TPU `resource_id` (`tpu_name` in `zone`) since `now`.
    pub fn new(id: Name, resource_id: Name, tpu_name: Name, zone: Name, now: Timestamp) -> Attempt {
        Attempt {
            id,
            resource_id,
            tpu_name,
            zone,
            status: AttemptStatus::Launching,
            created_at: now,
            started_at: None,
            ended_at: None,
            end_reason: None,
            exit_code: None,
            error_summary: String::new(),
            launch_failures: 0,
            failed_launch: false,
            stop_failures: 0,
            lost: None,
            interrupting: false,
            displaced_by: None,
        }
    }

    /// Marks the attempt running (from launching).
    pub fn start(&mut self, now: Timestamp) -> Result<(), IllegalTransition> {
        if self.status != AttemptStatus::Launching {
            return Err(self.illegal(AttemptStatus::Running));
        }
        self.status = AttemptStatus::Running;
        self.started_at.get_or_insert(now);
        Ok(())
    }

    /// Ends the attempt with `status` and `reason`, refusing illegal pairs and second endings.
    pub fn end(
        &mut self,
        status: AttemptStatus,
        reason: EndReason,
        exit_code: Option<i32>,
        summary: &str,
        now: Timestamp,
    ) -> Result<(), IllegalTransition> {
        if self.status.is_terminal() || !status.is_terminal() || !reason.fits(status) {
            return Err(self.illegal(status));
        }
        self.status = status;
        self.end_reason = Some(reason);
        self.exit_code = exit_code;
        if !summary.is_empty() {
            self.error_summary = last_chars(summary, 4000);
        }
        self.ended_at = Some(now);
        Ok(())
    }

    fn illegal(&self, to: AttemptStatus) -> IllegalTransition {
        IllegalTransition {
            kind: "attempt",
            id: self.id,
            from: self.status.as_str().into(),
            to: to.as_str().into(),
        }
    }
}

/// The last `n` characters of `text`.
pub fn last_chars(text: &str, n: usize) -> String {
    let count = text.chars().count();
    text.chars().skip(count.saturating_sub(n)).collect()
}

/// Status of a TPU record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceStatus {
    /// Capacity requested; the node is not ready yet.
    Provisioning,
    /// Ready and free.
    Idle,
    /// Running an attempt.
    Busy,
    /// Present but not usable (unhealthy, maintenance, wrong state).
    Unavailable,
    /// Being deleted (capacity or unusable TPU).
    Draining,
    /// Scheduled for replacement after repeated infrastructure failures.
    Recycling,
    /// Deletion for replacement requested.
    RecyclingRequested,
    /// Gone (preempted, capacity ended or replaced).
    Preempted,
    /// Deleted because it was not needed.
    Deleted,
}

impl ResourceStatus {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceStatus::Provisioning => "provisioning",
            ResourceStatus::Idle => "idle",
            ResourceStatus::Busy => "busy",
            ResourceStatus::Unavailable => "unavailable",
            ResourceStatus::Draining => "draining",
            ResourceStatus::Recycling => "recycling",
            ResourceStatus::RecyclingRequested => "recycling_requested",
            ResourceStatus::Preempted => "preempted",
            ResourceStatus::Deleted => "deleted",
        }
    }

    /// True for records whose TPU is gone.
    pub fn is_gone(self) -> bool {
        matches!(self, ResourceStatus::Preempted | ResourceStatus::Deleted)
    }
}

/// What an adopted TPU's record id puts before its TPU name.
const ADOPTED_ID_PREFIX: &str = "adopted-";

/// Which job and attempt a resource runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// Job id.
    pub job_id: Name,
    /// Attempt id.
    pub attempt_id: Name,
}

/// A failure counter tied to one job (and attempt).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureCounter {
    /// Job the failures belong to.
    pub job_id: Name,
    /// Attempt (for cancellation failures).
    #[serde(default)]
    pub attempt_id: Option<Name>,
    /// Consecutive failures.
    pub count: u32,
}

/// A TPU the controller knows about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resource {
    /// Node name for managed TPUs, `adopted-<name>` for adopted ones.
    pub id: Name,
    /// Node name.
    pub tpu_name: Name,
    /// Zone.
    pub zone: Name,
    /// Accelerator type.
    pub tpu_type: TpuType,
    /// Fleet entry id.
    pub entry_id: Name,
    /// Adopted (existing) TPU.
    pub adopted: bool,
    /// Status.
    pub status: ResourceStatus,
    /// The job and attempt running on it.
    #[serde(default)]
    pub owner: Option<Owner>,
    /// Workers (hosts) in the slice, at least 1.
    pub worker_count: u32,
    /// Idle since (managed TPUs; drives the idle timeout).
    #[serde(default)]
    pub idle_since: Option<Timestamp>,
    /// When the node of a provisioning TPU was first seen.
    #[serde(default)]
    pub provisioning_node_seen_at: Option<Timestamp>,
    /// Since when a previously seen provisioning node is missing.
    #[serde(default)]
    pub provisioning_node_missing_since: Option<Timestamp>,
    /// While provisioning: since when its queued resource has waited for capacity (the
    /// cloud's `WAITING_FOR_RESOURCES`, a stockout); none before that and once granted.
    /// Shown to users; decides nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_wait_since: Option<Timestamp>,
    /// Retryable infrastructure failures of one job in a row on this TPU.
    #[serde(default)]
    pub retryable_failures: Option<FailureCounter>,
    /// Failed cancellations of one attempt in a row on this TPU.
    #[serde(default)]
    pub cancellation_failures: Option<FailureCounter>,
}

impl Resource {
    /// The record id of TPU `tpu_name`: the name itself, or `adopted-<name>` for an adopted
    /// TPU (an adopted TPU never shares an id with a managed ordinal of the same name).
    pub fn id_for(tpu_name: Name, adopted: bool) -> Name {
        if adopted {
            Name::new(&format!("{ADOPTED_ID_PREFIX}{tpu_name}"))
        } else {
            tpu_name
        }
    }

    /// The TPU name in an adopted record's id (`None` for an id that is not one).
    pub fn tpu_name_in_id(id: &Name) -> Option<Name> {
        id.as_str().strip_prefix(ADOPTED_ID_PREFIX).map(Name::new)
    }

    /// A new record for node `tpu_name` of `entry` (id `adopted-<name>` for adopted TPUs).
    pub fn new(
        tpu_name: Name,
        entry: &crate::spec::TpuEntry,
        status: ResourceStatus,
        worker_count: u32,
    ) -> Resource {
        let adopted = entry.is_adopted();
        Resource {
            id: Resource::id_for(tpu_name, adopted),
            tpu_name,
            zone: entry.zone,
            tpu_type: entry.tpu_type.clone(),
            entry_id: entry.id,
            adopted,
            status,
            owner: None,
            worker_count: worker_count.max(1),
            idle_since: None,
            provisioning_node_seen_at: None,
            provisioning_node_missing_since: None,
            capacity_wait_since: None,
            retryable_failures: None,
            cancellation_failures: None,
        }
    }

    /// The status as users are shown it: `waiting-for-capacity` for a provisioning TPU whose
    /// request waits for capacity (a stockout), else the status's name.
    pub fn shown_status(&self) -> &'static str {
        match self.waiting_for_capacity_since() {
            Some(_) => "waiting-for-capacity",
            None => self.status.as_str(),
        }
    }

    /// Since when this provisioning TPU's request has waited for capacity, if it waits.
    pub fn waiting_for_capacity_since(&self) -> Option<Timestamp> {
        self.capacity_wait_since
            .filter(|_| self.status == ResourceStatus::Provisioning)
    }

    /// True when the resource runs an attempt (status busy or any owner).
    pub fn is_busy(&self) -> bool {
        self.status == ResourceStatus::Busy || self.owner.is_some()
    }

    /// Moves to `to`. Busy needs an owner; idle, provisioning, preempted and deleted need none
    /// (use [`Resource::release`] first).
    pub fn set_status(&mut self, to: ResourceStatus) -> Result<(), IllegalTransition> {
        let needs_owner = to == ResourceStatus::Busy;
        let forbids_owner = matches!(
            to,
            ResourceStatus::Idle
                | ResourceStatus::Provisioning
                | ResourceStatus::Preempted
                | ResourceStatus::Deleted
        );
        if (needs_owner && self.owner.is_none()) || (forbids_owner && self.owner.is_some()) {
            return Err(IllegalTransition {
                kind: "resource",
                id: self.id,
                from: format!(
                    "{}{}",
                    self.status.as_str(),
                    if self.owner.is_some() { " (owned)" } else { "" }
                ),
                to: to.as_str().into(),
            });
        }
        self.status = to;
        Ok(())
    }

    /// Takes ownership for `job_id`/`attempt_id` and becomes busy (from idle only).
    pub fn occupy(&mut self, job_id: &Name, attempt_id: &Name) -> Result<(), IllegalTransition> {
        if self.status != ResourceStatus::Idle || self.owner.is_some() {
            return Err(IllegalTransition {
                kind: "resource",
                id: self.id,
                from: self.status.as_str().into(),
                to: "busy".into(),
            });
        }
        self.owner = Some(Owner {
            job_id: *job_id,
            attempt_id: *attempt_id,
        });
        self.status = ResourceStatus::Busy;
        self.idle_since = None;
        self.cancellation_failures = None;
        Ok(())
    }

    /// Drops ownership and moves to `to`; `idle_since` is stamped for managed TPUs that
    /// become idle.
    pub fn release(&mut self, to: ResourceStatus, now: Timestamp) -> Result<(), IllegalTransition> {
        self.owner = None;
        self.cancellation_failures = None;
        self.set_status(to)?;
        self.idle_since = (to == ResourceStatus::Idle && !self.adopted).then_some(now);
        Ok(())
    }

    /// True when `job_id`/`attempt_id` own this resource.
    pub fn owned_by(&self, job_id: &Name, attempt_id: &Name) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|o| o.job_id == *job_id && o.attempt_id == *attempt_id)
    }
}

/// Status of a controlled interruption request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InterruptionStatus {
    /// Filed, not yet processed.
    Requested,
    /// Claimed by the controller.
    Processing,
    /// The queued resource deletion was requested; the job was requeued.
    DeletionRequested,
    /// Deleting the queued resource failed.
    Failed,
    /// The target was not a valid managed Spot TPU running that job.
    Rejected,
}

impl InterruptionStatus {
    /// Legal moves: requested → processing | rejected; processing → deletion_requested |
    /// failed | rejected.
    pub fn can_become(self, to: InterruptionStatus) -> bool {
        use InterruptionStatus::*;
        matches!(
            (self, to),
            (Requested, Processing)
                | (Requested, Rejected)
                | (Processing, DeletionRequested | Failed | Rejected)
        )
    }
}

/// A request to interrupt a managed Spot TPU (and requeue its job).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InterruptionRequest {
    /// `interrupt-<hash of resource, job, attempt>`.
    pub id: Name,
    /// Target resource.
    pub resource_id: Name,
    /// Job it runs.
    pub job_id: Name,
    /// Attempt it runs.
    pub attempt_id: Name,
    /// Entry of the resource when filed.
    pub entry_id: Name,
    /// Status.
    pub status: InterruptionStatus,
    /// Filed at.
    pub requested_at: Timestamp,
    /// Processed at.
    #[serde(default)]
    pub processed_at: Option<Timestamp>,
    /// The queued resource whose deletion was requested.
    #[serde(default)]
    pub queued_resource_name: Option<Name>,
    /// Why it was rejected or failed.
    #[serde(default)]
    pub error_summary: String,
}

impl InterruptionRequest {
    /// Moves to `to`, refusing illegal moves (finishing a terminal request is an error).
    pub fn transition(
        &mut self,
        to: InterruptionStatus,
        now: Timestamp,
    ) -> Result<(), IllegalTransition> {
        if !self.status.can_become(to) {
            return Err(IllegalTransition {
                kind: "interruption_request",
                id: self.id,
                from: format!("{:?}", self.status),
                to: format!("{to:?}"),
            });
        }
        self.status = to;
        if to != InterruptionStatus::Processing {
            self.processed_at = Some(now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_transitions_follow_the_table() {
        use JobStatus::*;
        let all = [Pending, Running, Cancelling, Succeeded, Failed, Deactivated];
        let legal: Vec<(JobStatus, JobStatus)> = all
            .iter()
            .flat_map(|a| all.iter().map(move |b| (*a, *b)))
            .filter(|(a, b)| a.can_become(*b))
            .collect();
        assert_eq!(
            legal,
            vec![
                (Pending, Running),
                (Pending, Deactivated),
                (Running, Pending),
                (Running, Cancelling),
                (Running, Succeeded),
                (Running, Failed),
                (Cancelling, Deactivated)
            ]
        );
        for terminal in [Succeeded, Failed, Deactivated] {
            assert!(all.iter().all(|to| !terminal.can_become(*to)));
        }
    }

    #[test]
    fn end_reasons_pair_with_statuses() {
        use AttemptStatus as S;
        use EndReason as R;
        assert!(R::Preempted.fits(S::Interrupted) && R::Lost.fits(S::Interrupted));
        assert!(!R::Succeeded.fits(S::Failed));
        assert!(!R::Cancelled.fits(S::Interrupted));
    }

    #[test]
    fn busy_needs_an_owner_and_idle_forbids_one() {
        let mut r = Resource {
            id: "r".into(),
            tpu_name: "r".into(),
            zone: "us-east1-d".into(),
            tpu_type: TpuType::parse("v6e-8").unwrap(),
            entry_id: "e".into(),
            adopted: false,
            status: ResourceStatus::Idle,
            owner: None,
            worker_count: 2,
            idle_since: None,
            provisioning_node_seen_at: None,
            provisioning_node_missing_since: None,
            capacity_wait_since: None,
            retryable_failures: None,
            cancellation_failures: None,
        };
        assert!(r.set_status(ResourceStatus::Busy).is_err());
        r.occupy(&"j".into(), &"a".into()).unwrap();
        assert!(
            r.occupy(&"j2".into(), &"a2".into()).is_err(),
            "a TPU is never assigned twice"
        );
        assert!(r.set_status(ResourceStatus::Idle).is_err());
        r.release(ResourceStatus::Idle, Timestamp(5)).unwrap();
        assert_eq!(r.idle_since, Some(Timestamp(5)));
    }
}
