//! Durable state shared by the controller and every command: the `StateStore` boundary and
//! what all its implementations share (opening a store from a URL, the change set of a
//! pass, record layout). Two implementations: `sqlite` (embedded, the default) and
//! `firestore` (production). Stores apply the engine's rules (`engine::commands`,
//! `engine::lease`) inside their transactions; they must not make decisions of their own.
//!
//! Concurrency design (ARCHITECTURE.md): optimistic. A pass loads the active state with the
//! version of every record (a long-lived controller then reads only the records written
//! since, by the store's change sequence: `load_changes`); its commit writes only the
//! records the pass changed, each
//! conditional on the version it read, in one atomic write that also checks the lease
//! (owner, epoch, expiry). A command that wrote one of those records meanwhile makes the
//! commit refuse (`CommitOutcome::Conflict`): the controller reloads and redoes the pass.
//! A command's write to a record the pass did not change is kept as it is.

pub mod changes;
pub mod firestore;
pub mod records;
pub mod sqlite;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::engine::commands::{CancelResult, ReprioritizeResult};
use crate::engine::lease::{Lease, Refusal};
use crate::engine::state::{Backoff, InterruptionRequest, Job, OthersTpus, PoolMemory};
use crate::engine::{Event, State, Timestamp};
use crate::spec::{Name, NameMap, Priority};

pub use changes::{Base, ChangeSet, apply_delta};

/// A record's version as its store reads it (SQLite: a counter; Firestore: the document's
/// update time). Opaque: only compared for equality.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Version(pub String);

/// A failure of the store itself (not a refusal of the operation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError {
    /// The store (`sqlite:/path/state.db`, `firestore:projects/p/databases/d`).
    pub store: String,
    /// What went wrong and what to do.
    pub message: String,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store {}: {}", self.store, self.message)
    }
}

impl std::error::Error for StoreError {}

/// Which controller may write: the lease holder of the current epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// Lease owner.
    pub owner: String,
    /// Deployment epoch of that owner.
    pub epoch: String,
}

/// What was written to the store after a cursor (by anyone: the controller, a command, an
/// import): every job, resource record and interruption request written since, as it is
/// now, with its version, and the controller documents. What a controller that keeps its
/// state between passes reads instead of the whole active set.
#[derive(Debug, Default)]
pub struct Delta {
    /// Jobs written since, active or finished (a finished one leaves the active set).
    pub jobs: Vec<(Job, Version)>,
    /// Resource records written since.
    pub resources: Vec<(crate::engine::state::Resource, Version)>,
    /// Interruption requests written since, open or closed.
    pub requests: Vec<(InterruptionRequest, Version)>,
    /// Backoffs, notices and the stockout memory (always read: three small documents).
    pub controller: ControllerDocs,
    /// The change sequence this delta reaches: the next one starts here.
    pub cursor: u64,
}

/// Documents a store read and wrote (what Firestore bills), counted since it was last asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Io {
    /// Documents read (each job, attempt, record, event or control document returned).
    pub reads: u64,
    /// Documents written (created, updated or deleted).
    pub writes: u64,
}

impl Io {
    /// `reads` and `writes` more.
    pub fn add(&mut self, reads: usize, writes: usize) {
        self.reads += reads as u64;
        self.writes += writes as u64;
    }
}

/// The active state as a pass sees it, with what its commit needs to find its changes.
#[derive(Debug)]
pub struct Loaded {
    /// Pending, running and cancelling jobs (with their attempts), every resource record,
    /// open interruption requests, backoffs and notices. `finished` is empty.
    pub state: State,
    /// The versions read, for the commit.
    pub base: Base,
}

/// What a pass's commit did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Written, with the events.
    Committed,
    /// A record the pass changed was written by someone else since the load (ids named):
    /// nothing was written; reload and redo the pass.
    Conflict {
        /// `jobs/<id>`, `resources/<id>`, `interruption_requests/<id>`.
        records: Vec<String>,
    },
    /// The caller does not hold the lease of the current epoch: nothing was written.
    Fenced {
        /// Why.
        reason: String,
    },
}

/// What creating jobs did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateResult {
    /// Every job was created.
    Created,
    /// Nothing was created: these ids exist already (active or finished).
    Exist(Vec<Name>),
}

/// What filing an interruption request did.
#[derive(Clone, Debug, PartialEq)]
pub enum InterruptResult {
    /// Filed.
    Requested(InterruptionRequest),
    /// The resource, job or attempt does not exist: which.
    UnknownTarget(String),
    /// A request with this id exists already.
    Exists(Name),
    /// The target is not a managed Spot TPU running that attempt: why.
    Rejected(String),
}

/// The transactional store of jobs, attempts, resources, interruption requests, the
/// controller lease and events (§2, §2.1).
pub trait StateStore {
    /// The store's name for messages (`sqlite:PATH`, `firestore:projects/P/databases/D`).
    fn describe(&self) -> String;

    /// Creates every job, or none when any id exists (active or finished).
    fn create_jobs(&mut self, jobs: &[Job], now: Timestamp) -> Result<CreateResult, StoreError>;

    /// Cancels a job (§2.1 `cancel_job`; the rules of `engine::commands::cancel`).
    fn cancel_job(
        &mut self,
        id: &Name,
        if_pending: bool,
        now: Timestamp,
    ) -> Result<CancelResult, StoreError>;

    /// Sets a pending job's priority; the event is appended in the same transaction.
    fn reprioritize(
        &mut self,
        id: &Name,
        priority: Priority,
        now: Timestamp,
    ) -> Result<ReprioritizeResult, StoreError>;

    /// Files an interruption request for the TPU `resource_id` running `attempt_id` of
    /// `job_id`; `eligible` says whether a fleet entry id is a managed Spot entry.
    fn create_interruption_request(
        &mut self,
        resource_id: &Name,
        job_id: &Name,
        attempt_id: &Name,
        eligible: &dyn Fn(&Name) -> bool,
        now: Timestamp,
    ) -> Result<InterruptResult, StoreError>;

    /// Acquires or renews the controller lease (`engine::lease::acquire` on the stored lease
    /// and epoch, atomically).
    fn acquire_lease(
        &mut self,
        owner: &str,
        epoch: &str,
        ttl_secs: i64,
        now: Timestamp,
    ) -> Result<Result<Lease, Refusal>, StoreError>;

    /// Releases the lease if `owner` holds it.
    fn release_lease(&mut self, owner: &str) -> Result<(), StoreError>;

    /// Sets the deployment epoch (a new deployment fences every older controller).
    fn set_epoch(&mut self, epoch: &str, now: Timestamp) -> Result<(), StoreError>;

    /// The stored lease and epoch.
    fn lease(&mut self) -> Result<(Option<Lease>, Option<String>), StoreError>;

    /// Loads the active state (one consistent snapshot).
    fn load_active(&mut self) -> Result<Loaded, StoreError>;

    /// What was written after change `cursor` (a `Base::cursor`), in one consistent
    /// snapshot: it costs the records written since, not the size of the state. `None` when
    /// the store's change sequence has not reached `cursor` (another store, or one emptied
    /// and imported again): load it whole.
    fn load_changes(&mut self, cursor: u64) -> Result<Option<Delta>, StoreError>;

    /// The documents read and written since the last call (then counted from zero).
    fn take_io(&mut self) -> Io;

    /// Commits what a pass changed in `state` since `base` (see `ChangeSet`) and the pass's
    /// events, in one transaction fenced by `fence` (lease held, not expired at `now`,
    /// current epoch). On `Committed`, `base` is brought forward to `state`.
    fn commit_pass(
        &mut self,
        base: &mut Base,
        state: &State,
        events: &[Event],
        fence: &Fence,
        now: Timestamp,
    ) -> Result<CommitOutcome, StoreError>;

    /// One job, active or finished, with its attempts.
    fn job(&mut self, id: &Name) -> Result<Option<Job>, StoreError>;

    /// Which of `ids` name a job already, active or finished (sorted; one read, not one per
    /// id): `submit` asks before it uploads anything.
    fn existing_jobs(&mut self, ids: &[Name]) -> Result<Vec<Name>, StoreError>;

    /// The runs of the job named `name` (`spec.name`), latest submitted first, at most
    /// `limit`: what `watch NAME` follows.
    fn runs_named(&mut self, name: &str, limit: usize) -> Result<Vec<Name>, StoreError>;

    /// Finished jobs (succeeded, failed, deactivated) ended at or after `since`, oldest
    /// first, at most `limit`.
    fn finished_jobs(&mut self, since: Timestamp, limit: usize) -> Result<Vec<Job>, StoreError>;

    /// Finished jobs ended at or after `since`, the latest ended first, at most `limit`
    /// (the history `status --all` pages through).
    fn latest_finished(&mut self, since: Timestamp, limit: usize) -> Result<Vec<Job>, StoreError>;

    /// The events of job `job` with sequence numbers above `after`, oldest first, at most
    /// `limit`, each with its sequence number: what `watch` follows.
    fn job_events(
        &mut self,
        job: &Name,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Event)>, StoreError>;

    /// Events with sequence numbers above `after`, oldest first, at most `limit`, each with
    /// its sequence number (in commit order: SQLite's row ids, Firestore's event counter).
    fn events_after(&mut self, after: u64, limit: usize) -> Result<Vec<(u64, Event)>, StoreError>;

    /// Retention: deletes events older than `before` among the `limit` oldest (events are
    /// appended in time order, so this costs `limit` reads at most whatever the log's size)
    /// and returns how many went.
    fn compact_events(&mut self, before: Timestamp, limit: usize) -> Result<usize, StoreError>;

    /// Everything, finished jobs and closed requests included (the state JSON of
    /// `docs/state-schema.md`).
    fn export(&mut self) -> Result<State, StoreError>;

    /// Writes a whole state into an empty store (refused when it holds any job or resource).
    fn import(&mut self, state: &State) -> Result<(), StoreError>;
}

/// Where the store is: from `--store URL` or `TPU_RUNNER_STORE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite:PATH`.
    Sqlite(PathBuf),
    /// `firestore` (project and database from the fleet) or `firestore:PROJECT/DATABASE`.
    Firestore {
        /// Project, when given in the URL.
        project: Option<String>,
        /// Database, when given in the URL.
        database: Option<String>,
    },
}

/// The default store: `.tpu-runner/state.db` beside the fleet file.
pub fn default_store(fleet: &Path) -> StoreUrl {
    let dir = fleet
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    StoreUrl::Sqlite(dir.join(".tpu-runner").join("state.db"))
}

impl StoreUrl {
    /// Parses `sqlite:PATH`, `firestore` or `firestore:PROJECT[/DATABASE]`.
    pub fn parse(text: &str) -> Result<StoreUrl, String> {
        if let Some(path) = text.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err("`sqlite:` needs a path, e.g. `sqlite:.tpu-runner/state.db`".into());
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if text == "firestore" {
            return Ok(StoreUrl::Firestore {
                project: None,
                database: None,
            });
        }
        if let Some(rest) = text.strip_prefix("firestore:") {
            let (project, database) = match rest.split_once('/') {
                Some((p, d)) => (p, Some(d.to_owned())),
                None => (rest, None),
            };
            // Both end up in request paths: only what Google's ids may hold (a project id,
            // with its `domain:` prefix; a database id or `(default)`), nothing that could
            // climb a path or start a query (`..`, `/`, `?`, `#`).
            let project_ok = project.len() <= 100
                && project.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && project
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.:".contains(c))
                && !project.contains("..");
            let database_ok = database.as_deref().is_none_or(|d| {
                d == "(default)"
                    || (d.len() <= 63
                        && d.starts_with(|c: char| c.is_ascii_lowercase())
                        && d.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            });
            if !project_ok || !database_ok {
                return Err(format!(
                    "`{text}`: expected `firestore:PROJECT` or `firestore:PROJECT/DATABASE` (a project id such as `my-project-123`, a database id such as `(default)` or `runs`)"
                ));
            }
            return Ok(StoreUrl::Firestore {
                project: Some(project.to_owned()),
                database,
            });
        }
        Err(format!(
            "`{text}` is not a store: expected `sqlite:PATH`, `firestore` or `firestore:PROJECT[/DATABASE]`"
        ))
    }
}

/// What opening a Firestore store needs from the fleet when the URL does not say.
#[derive(Clone, Debug, Default)]
pub struct FleetDefaults {
    /// The fleet's runner name (collection prefix).
    pub runner: String,
    /// The fleet's project.
    pub project: String,
}

/// Opens the store at `url`. A missing SQLite file (and its folder) is created when
/// `create`, else refused (a command that only reads never leaves a file behind).
pub fn open(
    url: &StoreUrl,
    fleet: &FleetDefaults,
    create: bool,
) -> Result<Box<dyn StateStore>, StoreError> {
    match url {
        StoreUrl::Sqlite(path) if !create && !path.exists() => Err(StoreError {
            store: format!("sqlite:{}", path.display()),
            message: "does not exist (nothing was submitted to it yet): pass --store sqlite:PATH or --fleet beside an existing .tpu-runner/state.db".into(),
        }),
        StoreUrl::Sqlite(path) => Ok(Box::new(sqlite::SqliteStore::open(path)?)),
        StoreUrl::Firestore { project, database } => {
            let project = project.clone().unwrap_or_else(|| fleet.project.clone());
            let database = database.clone().unwrap_or_else(|| "(default)".into());
            Ok(Box::new(firestore::FirestoreStore::open(
                &project,
                &database,
                &fleet.runner,
                firestore::endpoint_from_env(),
            )?))
        }
    }
}

/// The controller-only documents: per-entry backoffs, reported notices and the stockout
/// memory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ControllerDocs {
    /// `State::entry_backoff`.
    pub backoff: BTreeMap<Name, Backoff>,
    /// `State::notices`.
    pub notices: BTreeMap<String, String>,
    /// `State::pools`.
    pub pools: BTreeMap<String, PoolMemory>,
    /// `State::others`.
    pub others: Vec<OthersTpus>,
}

impl ControllerDocs {
    /// The documents of `state`.
    pub fn of(state: &State) -> ControllerDocs {
        ControllerDocs {
            backoff: state.entry_backoff.clone(),
            notices: state.notices.clone(),
            pools: state.pools.clone(),
            others: state.others.clone(),
        }
    }

    /// True when `state` holds these documents.
    pub fn held_by(&self, state: &State) -> bool {
        self.backoff == state.entry_backoff
            && self.notices == state.notices
            && self.pools == state.pools
            && self.others == state.others
    }

    /// Puts the documents into `state` (leaving fields that already hold them untouched).
    pub fn apply_to(self, state: &mut State) {
        if state.entry_backoff != self.backoff {
            state.entry_backoff = self.backoff;
        }
        if state.notices != self.notices {
            state.notices = self.notices;
        }
        if state.pools != self.pools {
            state.pools = self.pools;
        }
        if state.others != self.others {
            state.others = self.others;
        }
    }
}

/// Versions of records by id.
pub type Versions = NameMap<Version>;

#[cfg(test)]
mod tests {
    use super::StoreUrl;

    #[test]
    fn store_urls_hold_only_what_ids_may() {
        for good in [
            "firestore:my-project-123",
            "firestore:google.com:my-project/(default)",
            "firestore:lifecycle-123-456789/runs-2",
        ] {
            assert!(StoreUrl::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "firestore:../../x",
            "firestore:p/d?x=1#frag",
            "firestore:p/../d",
            "firestore:P",
            "firestore:p/",
            "firestore:p d",
            "firestore:",
        ] {
            assert!(StoreUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
