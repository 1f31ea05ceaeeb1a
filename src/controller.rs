//! The production controller loop (§3.1): hold the lease, and every interval load the active
//! state from the store, observe the cloud, run the engine, commit what the pass changed,
//! then carry out its actions. The same driver steps the simulator runs; this module adds
//! only the lease, the store round trip, the pacing and when to stop. It decides nothing
//! the engine decides, and it never acts before the pass that asked is committed.
//!
//! Structured logs (`tracing`): one record per pass (time taken, actions, events, whether
//! work is left) and per stop; never a job's environment or a key.
//!
//! Crash safety comes from that order: a pass is persisted (one fenced, conditional
//! transaction) before any of its actions goes out, and every action is idempotent by name
//! (queued resources and nodes by their generated names, launches by attempt id), so a
//! controller killed anywhere restarts from the store and asks again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::backend::{BackendError, CloudBackend};
use crate::driver::{self, Feedback};
use crate::engine::lease::Refusal;
use crate::engine::{Engine, Event, Observation, State, Timestamp};
use crate::store::{Base, CommitOutcome, Fence, Io, StateStore, StoreError};

/// How a controller runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Lease owner (unique per process: the Cloud Run execution, the host, or `local-<uuid>`).
    pub owner: String,
    /// The deployment epoch this controller belongs to.
    pub epoch: String,
    /// Lease time-to-live; renewed every pass.
    pub lease_ttl_secs: i64,
    /// Time between passes.
    pub interval: Duration,
    /// Stop when nothing is left to do (no active job, nothing of ours in the cloud).
    pub exit_when_idle: bool,
    /// When another controller holds the lease at start, wait for it (a restarted local
    /// stack waits out its killed predecessor's lease) instead of exiting.
    pub wait_for_lease: bool,
}

/// Why the controller stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Nothing left to do (`exit_when_idle`).
    Idle,
    /// Another controller holds the lease (at start, or after an idle release).
    LeaseHeld {
        /// Its owner.
        owner: String,
    },
    /// Asked to stop (SIGTERM, Ctrl-C): the lease was released.
    Stopped,
}

/// A failure that ends the controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControllerError {
    /// The store failed.
    Store(StoreError),
    /// The lease was lost or the epoch moved on: a newer controller acts now.
    Fenced(String),
}

impl std::fmt::Display for ControllerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControllerError::Store(e) => write!(f, "{e}"),
            ControllerError::Fenced(why) => write!(f, "the controller lost its lease: {why}"),
        }
    }
}

impl std::error::Error for ControllerError {}

impl From<StoreError> for ControllerError {
    fn from(e: StoreError) -> Self {
        ControllerError::Store(e)
    }
}

/// What one pass did.
#[derive(Clone, Debug, PartialEq)]
pub enum Pass {
    /// Committed, then acted.
    Done {
        /// The pass's events (committed with it).
        events: Vec<Event>,
        /// Actions carried out.
        actions: usize,
        /// Something is left to do: an active job, or something of ours in the cloud.
        busy: bool,
        /// How the pass read the store: the whole active set, or what changed since.
        load: Load,
        /// Documents the pass read and wrote in the store.
        io: Io,
    },
    /// The cloud could not be read: nothing was decided (the pass is retried next interval).
    CloudError(BackendError),
    /// A command wrote a record this pass changed: nothing was written or done; the next
    /// pass starts from the store again.
    Conflict(Vec<String>),
}

/// How a pass read the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// The whole active set: at start, after a conflict, after the lease lapsed or changed
    /// hands, and every `FULL_LOAD_EVERY_SECS` as a safety net.
    Full,
    /// Only what was written since the last pass (`StateStore::load_changes`).
    Delta,
}

impl Load {
    /// `full` or `delta`.
    pub fn as_str(self) -> &'static str {
        match self {
            Load::Full => "full",
            Load::Delta => "delta",
        }
    }
}

/// How often a controller reads the whole active set although deltas would do: a safety net
/// that bounds how long any divergence between memory and the store could last.
const FULL_LOAD_EVERY_SECS: i64 = 600;

/// Events older than the fleet's retention deleted per pass, at most: far more than a pass
/// records, so the log shrinks back to its window, in bounded steps.
const COMPACT_PER_PASS: usize = 1000;

/// How often a controller looks for events past retention: a look reads up to
/// `COMPACT_PER_PASS` of the oldest events (on Firestore, that many documents), which every
/// pass would pay for nothing. A look that deleted a full batch looks again next pass.
const COMPACT_EVERY_SECS: i64 = 600;

pub use crate::engine::observe::POLICY_EVENT;

/// One controller: its engine, store and backend, and what it keeps between passes (the
/// state as last loaded, with the engine's caches; the observation; action results for the
/// next pass). All of it but the store's content may be lost at any time.
pub struct Controller {
    engine: Engine,
    /// The policy the engine runs, as every pass record names it (name and digest).
    policy: (&'static str, String),
    /// The store holds this controller's `controller_policy` event.
    policy_recorded: bool,
    /// What the cloud was seen doing that no committed pass recorded yet (a pass refused
    /// for a conflict hands its sightings to the next).
    unrecorded: Vec<Event>,
    /// When to look for events past retention again (`None`: at the next pass).
    next_compaction: Option<Timestamp>,
    store: Box<dyn StateStore>,
    backend: Box<dyn CloudBackend>,
    settings: Settings,
    state: State,
    /// What the store held as of `state` (versions and change cursor), while deltas may
    /// bring it forward; `None`: the next pass loads the whole active set.
    base: Option<Base>,
    /// When the next pass loads the whole active set although a delta would do.
    next_full_load: Timestamp,
    /// When the lease this controller last acquired lapses (`None`: never acquired, or
    /// released): a pass that finds it lapsed loads the whole active set.
    held_until: Option<Timestamp>,
    observation: Observation,
    feedback: Feedback,
}

impl Controller {
    /// A controller over `store` and `backend`.
    pub fn new(
        engine: Engine,
        store: Box<dyn StateStore>,
        backend: Box<dyn CloudBackend>,
        settings: Settings,
    ) -> Controller {
        let spec = &engine.index().fleet.policy;
        Controller {
            policy: (spec.name.as_str(), spec.digest()),
            policy_recorded: false,
            unrecorded: Vec::new(),
            next_compaction: None,
            engine,
            store,
            backend,
            settings,
            state: State::new(),
            base: None,
            next_full_load: Timestamp(i64::MIN),
            held_until: None,
            observation: Observation::default(),
            feedback: Feedback::default(),
        }
    }

    fn fence(&self) -> Fence {
        Fence {
            owner: self.settings.owner.clone(),
            epoch: self.settings.epoch.clone(),
        }
    }

    /// Acquires or renews the lease: `Err(owner)` when another live controller holds it.
    pub fn acquire(&mut self, now: Timestamp) -> Result<Result<(), String>, ControllerError> {
        let s = &self.settings;
        let acquired = self
            .store
            .acquire_lease(&s.owner, &s.epoch, s.lease_ttl_secs, now)?;
        // Held without a break, the state in memory is kept; after a lapse or a first
        // acquisition the next pass loads the whole active set. Deltas carry every writer's
        // changes, but a change of hands is where a whole load is cheap insurance.
        let kept = self.held_until.is_some_and(|until| until > now);
        self.held_until = acquired.as_ref().ok().map(|lease| lease.expires_at);
        if !kept || acquired.is_err() {
            self.base = None;
        }
        match acquired {
            Ok(_) => Ok(Ok(())),
            Err(Refusal::Held { owner, .. }) => Ok(Err(owner)),
            Err(Refusal::StaleEpoch { current }) => Err(ControllerError::Fenced(format!(
                "the deployment's epoch is {current}, this controller's {}",
                s.epoch
            ))),
        }
    }

    /// Releases the lease (if still ours).
    pub fn release(&mut self) -> Result<(), ControllerError> {
        self.held_until = None;
        self.base = None;
        Ok(self.store.release_lease(&self.settings.owner)?)
    }

    /// Brings the state in memory up to the store: what was written since the last pass,
    /// or the whole active set when there is no base to start from, the delta cannot reach
    /// back to it, or the safety net is due.
    fn load(&mut self, now: Timestamp) -> Result<(Base, Load), ControllerError> {
        if now >= self.next_full_load {
            self.base = None;
        }
        let whole =
            crate::store::changes::refresh(self.store.as_mut(), &mut self.state, &mut self.base)?;
        if whole {
            self.next_full_load = now.plus_secs(FULL_LOAD_EVERY_SECS);
        }
        let base = self.base.take().expect("a refresh leaves a base");
        Ok((base, if whole { Load::Full } else { Load::Delta }))
    }

    /// One pass at `now`, the lease held: renew, load, observe, reconcile, commit, act.
    pub fn pass(&mut self, now: Timestamp) -> Result<Pass, ControllerError> {
        // Counted from here: the pass's own reads and writes.
        let _ = self.store.take_io();
        if let Err(owner) = self.acquire(now)? {
            return Err(ControllerError::Fenced(format!("{owner} holds it now")));
        }
        let (mut base, load) = self.load(now)?;
        match driver::observe(
            &self.engine,
            &self.state,
            self.backend.as_mut(),
            &self.feedback,
            now,
            &mut self.observation,
        ) {
            Ok(seen) => self.unrecorded.extend(seen),
            Err(e) => {
                // Nothing was decided: the state is still the store's.
                self.base = Some(base);
                return Ok(Pass::CloudError(e));
            }
        };
        let mut out = self
            .engine
            .reconcile(&mut self.state, &self.observation, now);
        // What the cloud did comes before what the pass decided about it, and the policy
        // deciding before both (once per controller: a trace knows what produced it).
        out.events.splice(0..0, self.unrecorded.iter().cloned());
        if !self.policy_recorded {
            out.events.insert(0, self.policy_event(now));
        }
        let fence = self.fence();
        match self
            .store
            .commit_pass(&mut base, &self.state, &out.events, &fence, now)?
        {
            CommitOutcome::Committed => {
                self.policy_recorded = true;
                self.unrecorded.clear();
                self.base = Some(base);
            }
            CommitOutcome::Conflict { records } => {
                // The state in memory is ahead of the store: the next pass loads it whole
                // (`base` is dropped), which brings every record back.
                return Ok(Pass::Conflict(records));
            }
            CommitOutcome::Fenced { reason } => return Err(ControllerError::Fenced(reason)),
        }
        // Persisted: now the actions may go out.
        self.feedback = driver::execute(self.backend.as_mut(), &out.actions, now);
        // Retention, a bounded step now and then (a failure only delays it).
        if self.next_compaction.is_none_or(|at| now >= at) {
            let retention = self.engine.index().fleet.event_retention_secs;
            let before = now.plus_secs(-retention);
            self.next_compaction = match self.store.compact_events(before, COMPACT_PER_PASS) {
                Ok(deleted) if deleted == COMPACT_PER_PASS => None,
                Ok(_) => Some(now.plus_secs(COMPACT_EVERY_SECS)),
                Err(e) => {
                    tracing::warn!(error = %e, "old events could not be deleted; retrying next pass");
                    None
                }
            };
        }
        Ok(Pass::Done {
            busy: self.busy(),
            actions: out.actions.len(),
            events: out.events,
            load,
            io: self.store.take_io(),
        })
    }

    /// The event naming the policy this controller runs: `name= digest= ` and what differs
    /// from the defaults.
    fn policy_event(&self, now: Timestamp) -> crate::engine::Event {
        let spec = &self.engine.index().fleet.policy;
        crate::engine::Event {
            at: now,
            kind: POLICY_EVENT.into(),
            job_id: None,
            resource_id: None,
            attempt_id: None,
            detail: format!(
                "name={} digest={} interval={}ms {}",
                self.policy.0,
                self.policy.1,
                self.settings.interval.as_millis(),
                spec.describe()
            ),
        }
    }

    /// Something is left to do: an active job, or a node or queued resource of ours.
    fn busy(&self) -> bool {
        let runner = self.engine.index().runner();
        let ours = |labels: &crate::engine::observe::Labels| {
            labels.get("managed-by").is_some_and(|v| v == runner)
        };
        !self.state.jobs.is_empty()
            || self.observation.nodes.iter().any(|n| ours(&n.labels))
            || self
                .observation
                .queued_resources
                .iter()
                .any(|q| ours(&q.labels))
    }

    /// Runs passes every interval until stopped, idle (`exit_when_idle`) or fenced. `clock`
    /// gives the time of each pass; `on_pass` hears every pass (for the event log).
    pub fn run(
        &mut self,
        clock: &mut dyn FnMut() -> Timestamp,
        stop: &AtomicBool,
        on_pass: &mut dyn FnMut(&Pass),
    ) -> Result<Exit, ControllerError> {
        tracing::info!(
            policy = %self.engine.index().fleet.policy.describe(),
            "controller starting"
        );
        loop {
            match self.acquire(clock())? {
                Ok(()) => break,
                Err(owner) if !self.settings.wait_for_lease => {
                    return Ok(Exit::LeaseHeld { owner });
                }
                Err(_) => sleep_unless_stopped(self.settings.interval, stop),
            }
            if stop.load(Ordering::SeqCst) {
                return Ok(Exit::Stopped);
            }
        }
        loop {
            if stop.load(Ordering::SeqCst) {
                self.release()?;
                tracing::info!("stopped: lease released");
                return Ok(Exit::Stopped);
            }
            let started = std::time::Instant::now();
            let pass = match self.pass(clock()) {
                Ok(pass) => pass,
                Err(e) => {
                    // Fenced by a newer deployment: hand its controller the lease at once.
                    if matches!(e, ControllerError::Fenced(_)) {
                        let _ = self.release();
                    }
                    return Err(e);
                }
            };
            let ms = started.elapsed().as_millis() as u64;
            match &pass {
                Pass::Done {
                    events,
                    actions,
                    busy,
                    load,
                    io,
                } => tracing::info!(
                    ms,
                    actions,
                    events = events.len(),
                    busy,
                    jobs = self.state.jobs.len(),
                    load = load.as_str(),
                    reads = io.reads,
                    writes = io.writes,
                    policy = self.policy.0,
                    policy_digest = %self.policy.1,
                    "pass"
                ),
                Pass::CloudError(e) => {
                    tracing::warn!(ms, error = %e.message, "pass skipped: the cloud could not be read")
                }
                Pass::Conflict(records) => tracing::info!(
                    ms,
                    records = records.len(),
                    "pass redone: a command wrote a record it changed"
                ),
            }
            on_pass(&pass);
            match pass {
                // A conflict is redone at once, from the store.
                Pass::Conflict(_) => continue,
                Pass::Done { busy: false, .. } if self.settings.exit_when_idle => {
                    // Hand the lease back, then look once more: a job submitted meanwhile
                    // is ours again unless another controller took over.
                    self.release()?;
                    tracing::info!("idle: lease released");
                    if self.store.load_active()?.state.jobs.is_empty() {
                        return Ok(Exit::Idle);
                    }
                    if let Err(owner) = self.acquire(clock())? {
                        return Ok(Exit::LeaseHeld { owner });
                    }
                }
                _ => {}
            }
            sleep_unless_stopped(self.settings.interval, stop);
        }
    }
}

/// Sleeps `interval`, waking early when `stop` is set.
fn sleep_unless_stopped(interval: Duration, stop: &AtomicBool) {
    let until = std::time::Instant::now() + interval;
    while !stop.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// The wall clock as the engine's time.
pub fn wall_clock() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    Timestamp(ms)
}
