//! The simulation harness: runs the real engine, through the real driver, against the
//! simulated cloud on virtual time. Jobs arrive as the workload says; every reconcile interval
//! the controller may run a pass (passes that provably have nothing to do are skipped: no
//! change in the cloud, no arrival, no pending result, engine wake-up not reached). Records
//! metrics, a time series for plots and a hash of every event for determinism checks.

use std::collections::BTreeMap;

use tpu_runner_sim::workload::JobArrival;
use tpu_runner_sim::{CallKind, CloudConfig, CloudFaults, PoolConfig, SimCloud, SimRng};

use super::checker::Invariants;
use super::fingerprint::Fingerprint;
use super::metrics::{
    BoundJob, Metrics, PlacedBoundJob, Stats, add_job_metrics, capacity_cost,
    goodput_bound_with_placement,
};
use super::scenario::{ChaosSpec, Scenario, WorkloadSpec, hosts_of};
use crate::backend::CloudBackend;
use crate::backend::sim::SimBackend;
use crate::driver::{self, Feedback};
use crate::emulator::{Clock, Shared, World, lock};
use crate::engine::state::{BucketRegion, Job, JobStatus};
use crate::engine::{Engine, Event, Observation, PassOutput, State, Timestamp, lease};
use crate::spec::fleet::SshTransport;
use crate::spec::{EntryKind, JobSpec, Name, Priority, TpuRequest, gcp};
use crate::store::{Base, CommitOutcome, CreateResult, Fence, StateStore, StoreError};

/// Wall-clock instant of simulated time 0 (2026-01-01T00:00:00Z).
pub const EPOCH: Timestamp = Timestamp::from_secs(1_767_225_600);

/// At most this many slots in the goodput bound (each at least 10 minutes).
const BOUND_SLOTS_MAX: u64 = 720;

/// One sample of the time series.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Sample {
    /// Hours since the start.
    pub hours: f64,
    /// Chips ACTIVE.
    pub allocated_chips: u64,
    /// Chips running commands.
    pub busy_chips: u64,
    /// Jobs pending.
    pub queue: u64,
    /// Jobs running.
    pub running: u64,
    /// Available capacity per zone (chips, capped at what the fleet could use).
    pub capacity_by_zone: BTreeMap<String, u64>,
    /// Spot preemptions so far.
    pub preemptions: u64,
}

/// Options of one run.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// Run every pass even when nothing changed (for equivalence tests).
    pub never_skip: bool,
    /// Samples kept for plots (about this many).
    pub samples: usize,
    /// Inject these faults (and check every invariant after every step).
    pub chaos: Option<ChaosSpec>,
    /// Check every invariant after every step even without faults.
    pub check_invariants: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            never_skip: false,
            samples: 600,
            chaos: None,
            check_invariants: false,
        }
    }
}

/// A hook that may tamper with the state and the actions of a pass before they are acted
/// on: only for tests that prove the invariant checkers catch broken engines.
pub type Mutator<'m> = dyn FnMut(&mut State, &mut Vec<crate::engine::Action>, Timestamp) + 'm;

/// Optional hooks of a run.
#[derive(Default)]
pub struct Hooks<'h> {
    /// Called after every step; an `Err` stops the run.
    pub checker: Option<&'h mut Checker<'h>>,
    /// Called between the engine's decision and acting on it.
    pub mutator: Option<&'h mut Mutator<'h>>,
    /// Keep the controller's state in this (empty) store, as production does: jobs are
    /// created in it as they arrive, every pass loads the active state from it and commits
    /// its changes fenced by the lease, and a crashed controller knows only what it holds.
    pub store: Option<&'h mut dyn StateStore>,
    /// Reach the simulated cloud through this backend instead of in process: called once
    /// with the world (to serve it, e.g. through the TPU API emulator on virtual time); the
    /// backend it returns makes every inventory read, report read and action of the run.
    pub wire: Option<&'h mut Wire<'h>>,
    /// Simulated milliseconds reached, updated every step (for a progress display).
    pub progress: Option<&'h std::sync::atomic::AtomicU64>,
}

/// Builds the backend a run reaches its world through (see `Hooks::wire`).
pub type Wire<'w> = dyn FnMut(&Shared) -> Box<dyn CloudBackend> + 'w;

/// The simulated world of `scenario` with `seed` (and `chaos`'s faults) at time 0, seen
/// through the simulator's backend: its capacity pools, and the fleet's adopted TPUs already
/// there (their chips are returned: they are allocated before the run starts).
pub fn world_of(scenario: &Scenario, seed: u64, chaos: Option<&ChaosSpec>) -> (SimBackend, u64) {
    let mut cloud = SimCloud::new(cloud_config(scenario, seed, chaos));
    let mut adopted_chips = 0u64;
    for entry in &scenario.fleet.tpus {
        if let EntryKind::Adopted { existing } = &entry.kind {
            cloud.add_existing_node(
                &entry.zone,
                existing,
                &entry.tpu_type.to_string(),
                entry.tpu_type.chips(),
                hosts_of(&entry.tpu_type),
            );
            adopted_chips += u64::from(entry.tpu_type.chips());
        }
    }
    let sim = SimBackend::new(
        cloud,
        EPOCH,
        &scenario.fleet.name,
        scenario.fleet.ssh_transport == SshTransport::Direct,
    );
    (sim, adopted_chips)
}

/// Runs `f` with the run's backend: the wired one, or the world's own.
fn with_backend<T>(
    world: &Shared,
    wire: &mut Option<Box<dyn CloudBackend>>,
    f: impl FnOnce(&mut dyn CloudBackend) -> T,
) -> T {
    match wire {
        Some(backend) => f(backend.as_mut()),
        None => f(&mut lock(world).sim),
    }
}

/// The controller's link to its store in a run: loads and commits, with the lease.
struct StoreLink<'s> {
    store: &'s mut dyn StateStore,
    base: Option<Base>,
}

impl StoreLink<'_> {
    fn fail(e: StoreError, t_ms: u64) -> Violation {
        Violation {
            message: format!("the state store failed: {e}"),
            at_s: t_ms as f64 / 1000.0,
            recent_events: Vec::new(),
        }
    }

    /// Brings `state` to what the store holds now, as the production controller does before
    /// a pass: what was written since the last pass (`load_changes`, `apply_delta`), or the
    /// whole active set when there is no base yet. Only records that differ are replaced,
    /// so the engine's caches (which the harness keeps across a crash in memory too) stay
    /// valid. `finished` (history for metrics and checks) stays: a pass never reads it.
    fn load(&mut self, state: &mut State, t_ms: u64) -> Result<(), Violation> {
        crate::store::changes::refresh(self.store, state, &mut self.base)
            .map(|_| ())
            .map_err(|e| Self::fail(e, t_ms))
    }

    /// Brings `state` to the whole active set the store holds (all a restarted controller
    /// knows); a store missing a commit would revert the records of that commit here.
    fn reload(&mut self, state: &mut State, t_ms: u64) -> Result<(), Violation> {
        self.base = None;
        self.load(state, t_ms)
    }

    /// Commits a pass; a refusal is a violation (nothing else writes to this store).
    fn commit(
        &mut self,
        state: &State,
        events: &[Event],
        fence: &Fence,
        now: Timestamp,
        t_ms: u64,
    ) -> Result<(), Violation> {
        let base = self.base.as_mut().expect("loaded before the pass");
        match self
            .store
            .commit_pass(base, state, events, fence, now)
            .map_err(|e| Self::fail(e, t_ms))?
        {
            CommitOutcome::Committed => Ok(()),
            refused => Err(Violation {
                message: format!("the store refused the controller's commit: {refused:?}"),
                at_s: t_ms as f64 / 1000.0,
                recent_events: Vec::new(),
            }),
        }
    }
}

/// What a step exposes to invariant checkers.
pub struct StepView<'a> {
    /// Virtual time.
    pub now: Timestamp,
    /// State after the pass.
    pub state: &'a State,
    /// The pass output, if a pass ran.
    pub output: Option<&'a PassOutput>,
    /// The simulated cloud.
    pub cloud: &'a SimCloud,
    /// The engine.
    pub engine: &'a Engine,
    /// Job ids submitted so far.
    pub submitted: &'a [Name],
}

/// A hook called after every step; an `Err` stops the run.
pub type Checker<'c> = dyn FnMut(&StepView<'_>) -> Result<(), String> + 'c;

/// The result of a run.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Scenario name.
    pub scenario: String,
    /// Policy.
    pub policy: String,
    /// Seed.
    pub seed: u64,
    /// Metrics.
    pub metrics: Metrics,
    /// Time series.
    pub series: Vec<Sample>,
    /// FNV-1a hash of the event log (same seed ⇒ same hash).
    pub event_hash: u64,
    /// The final state.
    pub state: State,
    /// The last events (for failure reports).
    pub recent_events: Vec<Event>,
}

/// A run that stopped on an invariant violation.
#[derive(Clone, Debug)]
pub struct Violation {
    /// What broke.
    pub message: String,
    /// When (simulated seconds).
    pub at_s: f64,
    /// The events just before.
    pub recent_events: Vec<Event>,
}

/// The cloud configuration of a scenario for `seed`, with `chaos` faults if given (they
/// stop at the chaos stop time, the scenario's own queued-resource failures with them, so
/// that liveness can be checked on a quiet cloud).
pub fn cloud_config(scenario: &Scenario, seed: u64, chaos: Option<&ChaosSpec>) -> CloudConfig {
    let mut api = scenario.cloud.api;
    let mut workers = scenario.cloud.workers;
    let mut faults = CloudFaults {
        qr_failure_per_hour: scenario.cloud.qr_failure_per_hour,
        ..CloudFaults::default()
    };
    if let Some(c) = chaos {
        api = c.api;
        workers.missing_status = c.missing_status;
        workers.silent_death_per_hour = c.silent_death_per_hour;
        workers.partial_failure = c.partial_failure;
        faults = CloudFaults {
            until_secs: c.stop_secs.max(1),
            qr_failure_per_hour: c.faults.qr_failure_per_hour.max(faults.qr_failure_per_hour),
            ..c.faults
        };
    }
    CloudConfig {
        seed,
        pools: scenario
            .cloud
            .pools
            .iter()
            .map(|p| PoolConfig {
                zone: p.zone.clone(),
                accelerator: p.tpu_type.to_string(),
                model: crate::backend::sim::pool_model(p.model),
                reservation: p.reservation.clone(),
                chips: p.tpu_type.chips(),
                hosts: hosts_of(&p.tpu_type),
                capacity: p.capacity.clone(),
                preemption_per_hour: p.preemption_per_hour,
                outages: p.outages.clone(),
                reclaims: p.reclaims,
            })
            .collect(),
        provisioning: scenario.cloud.provisioning,
        provisioning_by_region: scenario.cloud.provisioning_by_region.clone(),
        delete_secs: scenario.cloud.delete_secs,
        api_latency: scenario.cloud.api_latency,
        api_quota: scenario.cloud.api_quota,
        preemption_notice_secs: scenario.cloud.preemption_notice_secs,
        api,
        workers,
        faults,
    }
}

/// The arrivals of a scenario for `seed` within its horizon, sorted by time then id.
pub fn arrivals(scenario: &Scenario, seed: u64) -> Vec<JobArrival> {
    let mut all: Vec<JobArrival> = Vec::new();
    let until = scenario.horizon_secs as f64;
    for w in &scenario.workloads {
        match w {
            WorkloadSpec::Synthetic(s) => all.extend(s.generate(seed, until)),
            WorkloadSpec::Trace(t) => all.extend(t.generate(seed, until)),
            WorkloadSpec::Jobs(jobs) => {
                all.extend(jobs.iter().filter(|j| j.at_secs <= until).cloned());
            }
            WorkloadSpec::Queue(q) => all.extend(q.generate(seed)),
        }
    }
    all.sort_by(|a, b| {
        a.at_secs
            .total_cmp(&b.at_secs)
            .then_with(|| a.id.cmp(&b.id))
    });
    all
}

/// The TPU types `arrival` accepts: its own (a captured job), those of the fleet's types it
/// names; else the scenario's for its width. `None`: none (the arrival is skipped).
fn accepted_types<'s>(
    scenario: &'s Scenario,
    arrival: &JobArrival,
) -> Option<std::borrow::Cow<'s, [gcp::TpuType]>> {
    use std::borrow::Cow;
    let types = match &arrival.types {
        Some(names) => Cow::Owned(
            names
                .iter()
                .filter_map(|n| gcp::TpuType::parse(n).ok())
                .filter(|t| scenario.fleet.tpus.iter().any(|e| e.tpu_type == *t))
                .collect(),
        ),
        None => Cow::Borrowed(
            scenario
                .types_by_width
                .get(&arrival.width_chips)
                .map(Vec::as_slice)?,
        ),
    };
    (!types.is_empty()).then_some(types)
}

/// The job an arrival submits (built when it arrives: a queue of 50k jobs held from the start
/// was most of a large scenario's memory).
fn job_of(scenario: &Scenario, arrival: &JobArrival, types: &[gcp::TpuType]) -> Job {
    let bucket_regions: Vec<BucketRegion> = arrival
        .regions
        .iter()
        .map(|r| BucketRegion {
            region: r.clone(),
            bucket: format!("gs://{}-{r}", scenario.fleet.name),
        })
        .collect();
    let spec = JobSpec {
        id: arrival.id.clone(),
        name: None,
        fresh_id: false,
        tpu: TpuRequest::OneOf(types.to_vec()),
        bundle: ".".into(),
        command: "python train.py".into(),
        tpu_name: None,
        zone: None,
        buckets: bucket_regions.iter().map(|b| b.bucket.clone()).collect(),
        caches: vec![],
        env: BTreeMap::new(),
        priority: [Priority::Low, Priority::Normal, Priority::High]
            [arrival.priority.min(2) as usize],
        retry_on_infrastructure_failure: true,
        move_checkpoints: false,
    };
    Job::new(
        spec,
        EPOCH.plus_millis((arrival.at_secs * 1000.0) as i64),
        bucket_regions,
    )
}

/// Whether a pass decided what the pass with empty caches decided: the same actions, events
/// and violations, and a wake-up no later (a cache may keep a heartbeat deadline from before
/// the heartbeat moved on, which only wakes the controller early).
fn same_decisions(cached: &PassOutput, scratch: &PassOutput) -> bool {
    let wake_ok = match (cached.next_wake, scratch.next_wake) {
        (Some(c), Some(s)) => c <= s,
        (c, s) => c.is_some() || s.is_none(),
    };
    cached.actions == scratch.actions
        && cached.events == scratch.events
        && cached.violations == scratch.violations
        && wake_ok
}

/// Events a violation report shows: the last ones before it.
const RECENT_EVENTS: usize = 40;

/// The last `RECENT_EVENTS` of `earlier` followed by `now`.
fn last_events(earlier: &std::collections::VecDeque<Event>, now: &[Event]) -> Vec<Event> {
    let all: Vec<&Event> = earlier.iter().chain(now).collect();
    all[all.len().saturating_sub(RECENT_EVENTS)..]
        .iter()
        .map(|e| (*e).clone())
        .collect()
}

/// The run's event hash: XXH3-64 over every committed engine event's bytes (its time, kind,
/// ids and detail, each field ended by a marker so that no two different events give the same
/// bytes), one streaming update per event.
struct EventHash {
    hasher: xxhash_rust::xxh3::Xxh3Default,
    bytes: Vec<u8>,
}

impl EventHash {
    fn new() -> EventHash {
        EventHash {
            hasher: xxhash_rust::xxh3::Xxh3Default::new(),
            bytes: Vec::new(),
        }
    }

    fn add(&mut self, e: &Event) {
        let b = &mut self.bytes;
        b.clear();
        b.extend_from_slice(&e.at.0.to_le_bytes());
        b.extend_from_slice(e.kind.as_bytes());
        b.push(0xff);
        for id in [e.job_id, e.resource_id, e.attempt_id] {
            match id {
                Some(id) => {
                    b.extend_from_slice(id.as_bytes());
                    b.push(0xfe);
                }
                None => b.push(0xfd),
            }
        }
        b.extend_from_slice(e.detail.as_bytes());
        b.push(0xff);
        self.hasher.update(b);
    }

    fn value(&self) -> u64 {
        self.hasher.digest()
    }
}

/// Per pool: slices the fleet could hold there (managed counts; chip limits applied later).
fn pool_ceilings(scenario: &Scenario) -> Vec<u32> {
    scenario
        .cloud
        .pools
        .iter()
        .map(|p| {
            scenario
                .fleet
                .tpus
                .iter()
                .filter(|e| e.zone == p.zone && e.tpu_type == p.tpu_type)
                .map(|e| match e.kind {
                    EntryKind::Managed { count } => count,
                    EntryKind::Adopted { .. } => 0,
                })
                .sum()
        })
        .collect()
}

/// Runs one scenario with one policy and seed.
pub fn run(
    scenario: &Scenario,
    policy_name: &str,
    seed: u64,
    options: RunOptions,
    hooks: Hooks<'_>,
) -> Result<RunResult, Violation> {
    let Hooks {
        mut checker,
        mut mutator,
        store,
        wire,
        progress,
    } = hooks;
    let mut store = store.map(|store| StoreLink { store, base: None });
    let fence = Fence {
        owner: "controller".into(),
        epoch: "e2".into(),
    };
    if let Some(link) = store.as_mut() {
        link.store
            .set_epoch("e2", EPOCH)
            .map_err(|e| StoreLink::fail(e, 0))?;
    }
    let started = std::time::Instant::now();
    let spec = scenario
        .policy(policy_name)
        .unwrap_or_else(|| scenario.fleet.policy.clone());
    let tick_ms = spec.engine.reconcile_interval_secs.max(1) as u64 * 1000;
    let liveness = !spec.name.waits_out_stockouts();
    let engine = Engine::with_policy(spec, scenario.fleet.clone());
    let chaos = options.chaos;
    let mut chaos_rng = SimRng::new(seed, "chaos");
    let mut invariants = (chaos.is_some() || options.check_invariants).then(|| {
        Invariants::new(
            chaos
                .filter(|_| liveness)
                .map(|c| EPOCH.plus_secs(c.stop_secs as i64)),
            chaos.map_or(7200, |c| c.liveness_secs),
        )
    });
    let mut harness_faults: BTreeMap<String, u64> = BTreeMap::new();
    // The lease of the running controller (epoch e2); a stale controller has epoch e1.
    let mut held_lease = lease::acquire(None, Some("e2"), "controller", "e2", 900, EPOCH).ok();
    let mut previous_observation: Option<Observation> = None;
    // Kept from pass to pass: the backend refreshes the worker reports in place.
    let mut observation = Observation::default();
    let (sim, adopted_chips) = world_of(scenario, seed, chaos.as_ref());
    let world = World::new(sim, &scenario.fleet.project, Clock::Virtual).shared();
    let mut wired = wire.map(|w| w(&world));
    let all_arrivals = arrivals(scenario, seed);
    let listed = all_arrivals.len();
    let mut arrivals: Vec<(JobArrival, std::borrow::Cow<'_, [gcp::TpuType]>)> = all_arrivals
        .into_iter()
        .filter_map(|a| {
            let types = accepted_types(scenario, &a)?;
            Some((a, types))
        })
        .collect();
    // Kept for the whole run (the bound reads them at the end): no room left to grow.
    arrivals.shrink_to_fit();
    let jobs_skipped = (listed - arrivals.len()) as u64;

    let horizon_ms = scenario.horizon_secs * 1000;
    // Nothing at or after the horizon counts (the last pass's calls may end past it).
    lock(&world).sim.cloud.set_horizon(horizon_ms);
    let sample_every_ms =
        (horizon_ms / options.samples.max(1) as u64).max(tick_ms) / tick_ms * tick_ms;
    let ceilings = pool_ceilings(scenario);

    let mut state = State::new();
    let mut feedback = Feedback::default();
    let mut submitted: Vec<Name> = Vec::new();
    let mut next_arrival = 0;
    let mut last_version = u64::MAX;
    let mut next_wake: Option<Timestamp> = None;
    // Zones and adopted TPUs a skipped pass reads (kept while passes are skipped).
    let mut idle_scope: Option<(usize, usize)> = None;
    // The previous pass acted: the next one must see the consequences.
    let mut acted = false;
    // The previous pass changed the state: the next one may have follow-up decisions.
    let mut changed = false;
    let mut fingerprint = Fingerprint::default();
    let mut last_fingerprint = 0u64;
    let mut metrics = Metrics::default();
    let mut series = Vec::new();
    let mut event_hash = EventHash::new();
    let mut recent: std::collections::VecDeque<Event> = std::collections::VecDeque::new();
    let mut t_ms = 0u64;
    let mut next_sample_ms = 0u64;
    loop {
        lock(&world).sim.cloud.advance_to(t_ms);
        let now = EPOCH.plus_millis(t_ms as i64);
        let mut arrived = false;
        while next_arrival < arrivals.len()
            && (arrivals[next_arrival].0.at_secs * 1000.0) as u64 <= t_ms
        {
            let (arrival, types) = &arrivals[next_arrival];
            lock(&world)
                .sim
                .cloud
                .register_job(&arrival.id, arrival.behaviour.clone());
            let job = job_of(scenario, arrival, types);
            let id = job.id;
            match store.as_mut() {
                // The job is submitted to the store; the next pass reads it from there.
                Some(link) => {
                    let created = link
                        .store
                        .create_jobs(std::slice::from_ref(&job), now)
                        .map_err(|e| StoreLink::fail(e, t_ms))?;
                    if created == CreateResult::Created {
                        submitted.push(id);
                    }
                }
                None => {
                    if state.submit(job).is_ok() {
                        submitted.push(id);
                    }
                }
            }
            next_arrival += 1;
            arrived = true;
        }
        let wake_due = next_wake.is_some_and(|w| w <= now);
        let must_run = options.never_skip
            || acted
            || changed
            || lock(&world).sim.cloud.version() != last_version
            || arrived
            || !feedback.is_empty()
            || wake_due
            || t_ms == 0;
        let mut output = None;
        acted = false;
        changed = false;
        // Every pass reads the inventory (skipped ones too: they would have read and found
        // nothing to do); its actions go out once the reads are back.
        let read_done_ms = t_ms
            + lock(&world)
                .sim
                .cloud
                .call_latency_ms(CallKind::Read, t_ms, 0);
        if must_run {
            idle_scope = None;
        } else {
            // The skipped pass's reads: the state, so the scope, is the last pass's.
            let (zones, adopted) = *idle_scope.get_or_insert_with(|| {
                let scope = engine.inventory_scope(&state);
                (scope.zones.len(), scope.adopted.len())
            });
            if lock(&world)
                .sim
                .cloud
                .idle_inventory_reads(zones, adopted)
                .is_err()
            {
                metrics.failed_passes += 1;
            }
            lock(&world).sim.cloud.advance_to(read_done_ms);
        }
        if must_run {
            let faults_on = chaos.is_some_and(|c| t_ms < c.stop_secs * 1000);
            let fault = |rng: &mut SimRng, p: f64| faults_on && rng.chance(p);
            // A controller of an older deployment tries to act: the epoch must fence it.
            if chaos.is_some_and(|c| fault(&mut chaos_rng, c.stale_controller)) {
                *harness_faults.entry("stale_controller".into()).or_default() += 1;
                if lease::acquire(
                    held_lease.as_ref(),
                    Some("e2"),
                    "stale-controller",
                    "e1",
                    900,
                    now,
                )
                .is_ok()
                {
                    return Err(Violation {
                        message: "a controller with a stale epoch acquired the lease".into(),
                        at_s: t_ms as f64 / 1000.0,
                        recent_events: recent.iter().cloned().collect(),
                    });
                }
                // The same through the store: it refuses the stale controller both the
                // lease and any commit.
                if let Some(link) = store.as_mut() {
                    let stale = Fence {
                        owner: "stale-controller".into(),
                        epoch: "e1".into(),
                    };
                    let refused = link
                        .store
                        .acquire_lease("stale-controller", "e1", 900, now)
                        .map_err(|e| StoreLink::fail(e, t_ms))?
                        .is_err();
                    let mut base = match link.base.clone() {
                        Some(base) => base,
                        None => {
                            link.store
                                .load_active()
                                .map_err(|e| StoreLink::fail(e, t_ms))?
                                .base
                        }
                    };
                    let fenced = matches!(
                        link.store
                            .commit_pass(&mut base, &state, &[], &stale, now)
                            .map_err(|e| StoreLink::fail(e, t_ms))?,
                        CommitOutcome::Fenced { .. }
                    );
                    if !refused || !fenced {
                        return Err(Violation {
                            message: "a controller with a stale epoch was let through by the store"
                                .into(),
                            at_s: t_ms as f64 / 1000.0,
                            recent_events: recent.iter().cloned().collect(),
                        });
                    }
                }
            }
            held_lease = lease::acquire(
                held_lease.as_ref(),
                Some("e2"),
                "controller",
                "e2",
                900,
                now,
            )
            .ok();
            if let Some(link) = store.as_mut() {
                // The running controller renews its lease through the store.
                if let Err(refusal) = link
                    .store
                    .acquire_lease("controller", "e2", 900, now)
                    .map_err(|e| StoreLink::fail(e, t_ms))?
                {
                    return Err(Violation {
                        message: format!("the controller lost its lease: {refusal:?}"),
                        at_s: t_ms as f64 / 1000.0,
                        recent_events: recent.iter().cloned().collect(),
                    });
                }
                // Every pass reads what the store holds (new jobs, others' writes).
                link.load(&mut state, t_ms)?;
            }
            let crash =
                chaos.and_then(|c| fault(&mut chaos_rng, c.crash).then(|| chaos_rng.index(3)));
            // What this pass sees is the cloud at its start: changes while its reads and
            // calls are in flight are for the next pass to see (as a skipped pass would).
            let seen_version = lock(&world).sim.cloud.version();
            let observed = with_backend(&world, &mut wired, |backend| {
                driver::observe(&engine, &state, backend, &feedback, now, &mut observation)
            });
            match observed {
                Err(_) => {
                    lock(&world).sim.cloud.advance_to(read_done_ms);
                    metrics.failed_passes += 1;
                    next_wake = Some(now);
                }
                Ok(seen) => {
                    // Under checks, what the backend keeps from pass to pass, read over the
                    // scope the engine keeps, must be what reading everything afresh over a
                    // scope swept from every record gives.
                    if invariants.is_some() {
                        let w = lock(&world);
                        let scope = engine.index().inventory_scope(&state);
                        let fresh = w.sim.read_inventory(&scope);
                        let in_flight = driver::in_flight(&state);
                        let mut reports = w.sim.read_reports(&in_flight);
                        drop(w);
                        driver::merge_feedback(&mut reports, &mut Vec::new(), &feedback);
                        let differs = if fresh.nodes != observation.nodes
                            || fresh.queued_resources != observation.queued_resources
                            || fresh.others != observation.others
                        {
                            Some("inventory")
                        } else {
                            (reports != observation.attempts).then_some("worker reports")
                        };
                        if let Some(what) = differs {
                            return Err(Violation {
                                message: format!(
                                    "the {what} kept between passes differ from a full read"
                                ),
                                at_s: t_ms as f64 / 1000.0,
                                recent_events: recent.iter().cloned().collect(),
                            });
                        }
                    }
                    let mut stale = false;
                    let old = match previous_observation.take() {
                        Some(old)
                            if chaos
                                .is_some_and(|c| fault(&mut chaos_rng, c.stale_observation)) =>
                        {
                            *harness_faults
                                .entry("stale_observation".into())
                                .or_default() += 1;
                            stale = true;
                            Some(old)
                        }
                        _ => None,
                    };
                    let view = old.as_ref().unwrap_or(&observation);
                    let committed = crash.map(|_| state.clone());
                    // Under checks, the engine's caches must not change what a pass decides.
                    let from_scratch = invariants.is_some().then(|| {
                        let mut scratch = state.clone();
                        let out = engine.reconcile_from_scratch(&mut scratch, view, now);
                        (scratch, out)
                    });
                    let mut out = engine.reconcile(&mut state, view, now);
                    if let Some((scratch, scratch_out)) = from_scratch
                        && (scratch != state || !same_decisions(&out, &scratch_out))
                    {
                        return Err(Violation {
                            message: "the pass differs from a pass with empty caches".into(),
                            at_s: t_ms as f64 / 1000.0,
                            recent_events: recent.iter().cloned().collect(),
                        });
                    }
                    // What the cloud did comes before what the pass decided about it.
                    out.events.splice(0..0, seen);
                    lock(&world).sim.cloud.advance_to(read_done_ms);
                    if let Some(m) = mutator.as_deref_mut() {
                        m(&mut state, &mut out.actions, now);
                    }
                    metrics.passes += 1;
                    next_wake = out.next_wake;
                    // After a stale view the next pass must look again (production passes
                    // run every interval anyway; only the skipping shortcut needs telling).
                    acted = !out.actions.is_empty() || stale;
                    // The driver persists the pass before acting (a crash before commit
                    // loses it).
                    if crash != Some(0)
                        && let Some(link) = store.as_mut()
                    {
                        link.commit(&state, &out.events, &fence, now, t_ms)?;
                    }
                    match crash {
                        None => {
                            feedback = with_backend(&world, &mut wired, |backend| {
                                driver::execute(backend, &out.actions, now)
                            });
                        }
                        Some(point) => {
                            // The restarted controller remembers nothing but the store.
                            *harness_faults
                                .entry(format!(
                                    "crash_{}",
                                    ["before_commit", "before_acting", "while_acting"][point]
                                ))
                                .or_default() += 1;
                            feedback = Feedback::default();
                            let committed = committed.expect("cloned for a crash");
                            if let Some(link) = store.as_mut() {
                                // Only the store survives. The harness's bookkeeping is
                                // that of the in-memory run (the last committed copy after
                                // a crash before commit); the records come from the store.
                                if point == 0 {
                                    state = committed.clone();
                                }
                                link.reload(&mut state, t_ms)?;
                            }
                            match point {
                                0 if store.is_some() => {}
                                0 => state = committed,
                                1 => {}
                                _ => {
                                    let k = chaos_rng.index(out.actions.len() + 1);
                                    with_backend(&world, &mut wired, |backend| {
                                        driver::execute(backend, &out.actions[..k], now)
                                    });
                                }
                            }
                            next_wake = Some(now);
                        }
                    }
                    // A crash before commit loses the whole pass: its decisions and events.
                    let committed_pass = crash != Some(0);
                    for e in out.events.iter().filter(|_| committed_pass) {
                        event_hash.add(e);
                    }
                    metrics.engine_events += out.events.len() as u64;
                    if committed_pass && !out.violations.is_empty() {
                        return Err(Violation {
                            message: format!(
                                "the engine reported broken invariants: {}",
                                out.violations.join("; ")
                            ),
                            at_s: t_ms as f64 / 1000.0,
                            recent_events: last_events(&recent, &out.events),
                        });
                    }
                    // Only chaos runs hand a pass the previous observation.
                    previous_observation = chaos.is_some().then(|| view.clone());
                    if crash.is_some() {
                        // The restarted controller listed nothing yet either: its first
                        // sightings are first seen.
                        observation.listed = Default::default();
                    }
                    output = committed_pass.then_some(out);
                    let now_fingerprint = fingerprint.of(&state);
                    changed = now_fingerprint != last_fingerprint;
                    last_fingerprint = now_fingerprint;
                }
            }
            last_version = seen_version;
        }
        if invariants.is_some() || checker.is_some() {
            let w = lock(&world);
            let view = StepView {
                now,
                state: &state,
                output: output.as_ref(),
                cloud: &w.sim.cloud,
                engine: &engine,
                submitted: &submitted,
            };
            let verdict = invariants
                .as_mut()
                .map_or(Ok(()), |inv| inv.check(&view))
                .and_then(|()| checker.as_deref_mut().map_or(Ok(()), |check| check(&view)));
            if let Err(message) = verdict {
                return Err(Violation {
                    message,
                    at_s: t_ms as f64 / 1000.0,
                    recent_events: last_events(&recent, output.as_ref().map_or(&[], |o| &o.events)),
                });
            }
        }
        // The pass's events join the recent ones (moved, not copied: most are never shown).
        for e in output.into_iter().flat_map(|o| o.events) {
            if recent.len() == RECENT_EVENTS {
                recent.pop_front();
            }
            recent.push_back(e);
        }
        if t_ms >= next_sample_ms {
            series.push(sample(&lock(&world).sim, &state, scenario, &ceilings, t_ms));
            next_sample_ms = (t_ms / sample_every_ms + 1) * sample_every_ms;
        }
        let all_arrived = next_arrival >= arrivals.len();
        let quiet = all_arrived
            && state.jobs.is_empty()
            && next_wake.is_none()
            && lock(&world).sim.cloud.allocated_chips() <= adopted_chips
            && lock(&world).sim.cloud.live_nodes().is_empty();
        if let Some(p) = progress {
            p.store(t_ms, std::sync::atomic::Ordering::Relaxed);
        }
        if t_ms >= horizon_ms || quiet {
            break;
        }
        // The controller sleeps one interval after its pass (reads and calls took time).
        t_ms = (lock(&world).sim.cloud.now().max(t_ms) + tick_ms).min(horizon_ms);
    }

    let acc = lock(&world).sim.cloud.accounting();
    let hours = |chip_s: f64| chip_s / 3600.0;
    metrics.allocated_chip_hours = hours(acc.allocated_chip_secs);
    metrics.busy_chip_hours = hours(acc.busy_chip_secs);
    metrics.lost_chip_hours = hours(acc.lost_chip_secs);
    metrics.goodput_chip_hours = (metrics.busy_chip_hours - metrics.lost_chip_hours).max(0.0);
    metrics.utilization = ratio(metrics.busy_chip_hours, metrics.allocated_chip_hours);
    metrics.goodput_ratio = ratio(metrics.goodput_chip_hours, metrics.allocated_chip_hours);
    metrics.preemptions = acc.preemptions;
    metrics.api_calls = acc
        .api_calls
        .iter()
        .map(|(k, v)| ((*k).to_owned(), *v))
        .collect();
    metrics.api_errors = acc
        .api_errors
        .iter()
        .map(|(k, v)| ((*k).to_owned(), *v))
        .collect();
    metrics.faults = acc
        .faults
        .iter()
        .map(|(k, v)| ((*k).to_owned(), *v))
        .chain(harness_faults)
        .collect();
    for (k, v) in &acc.api_errors {
        *metrics.faults.entry(format!("api_{k}")).or_default() += v;
    }
    metrics.invariant_checks = invariants.as_ref().map_or(0, |i| i.steps);
    metrics.events = acc.events;
    metrics.simulated_s = t_ms as f64 / 1000.0;
    metrics.time_to_capacity_s = Stats::of(&acc.time_to_capacity_secs);
    metrics.jobs_skipped = jobs_skipped;
    add_job_metrics(&mut metrics, state.all_jobs(), scenario.data_gb_per_attempt);
    metrics.egress_usd = metrics.egress_gb * scenario.egress_usd_per_gb;
    metrics.cost_usd = capacity_cost(
        &acc.allocated_chip_secs_by_type,
        &scenario.prices,
        scenario.adopted_usd_per_chip_hour,
    ) + metrics.egress_usd;
    // The bound, on the capacity the fleet could have used during the run, each job on the
    // pools and adopted TPUs it may run on.
    let (sets, set_of) = placement_sets(scenario, arrivals.iter().take(next_arrival));
    let bound_jobs: Vec<PlacedBoundJob> = arrivals
        .iter()
        .zip(set_of)
        .map(|((a, _), set)| PlacedBoundJob {
            job: BoundJob {
                release_s: a.at_secs,
                work: a.behaviour.work_secs * f64::from(a.width_chips),
                width: f64::from(a.width_chips),
            },
            set,
        })
        .collect();
    let slot_s = (t_ms / 1000).div_ceil(BOUND_SLOTS_MAX).max(600);
    let capacity = capacity_by_resource(scenario, &lock(&world).sim.cloud, &ceilings, t_ms, slot_s);
    let bound_chip_s = goodput_bound_with_placement(&bound_jobs, &sets, &capacity, slot_s as f64);
    metrics.bound_goodput_chip_hours = hours(bound_chip_s);
    metrics.efficiency = ratio(metrics.goodput_chip_hours, metrics.bound_goodput_chip_hours);
    metrics.wall_s = started.elapsed().as_secs_f64();
    Ok(RunResult {
        scenario: scenario.name.clone(),
        policy: policy_name.to_owned(),
        seed,
        metrics,
        series,
        event_hash: event_hash.value(),
        state,
        recent_events: recent.into_iter().collect(),
    })
}

/// The bound's resources: the cloud's pools, then the fleet's adopted TPUs. Per resource,
/// the chip-seconds the fleet could have held in each slot of `[0, end_ms)`: for a pool, the
/// integral of min(available slices, fleet ceiling) × chips, exact from the capacity log
/// (chip limits are not applied: the bound stays an upper bound); an adopted TPU is always
/// there.
fn capacity_by_resource(
    scenario: &Scenario,
    cloud: &SimCloud,
    ceilings: &[u32],
    end_ms: u64,
    slot_s: u64,
) -> Vec<Vec<f64>> {
    let slot_ms = slot_s * 1000;
    let n = end_ms.div_ceil(slot_ms).max(1) as usize;
    let pools = &scenario.cloud.pools;
    let adopted: Vec<f64> = scenario
        .fleet
        .tpus
        .iter()
        .filter(|e| matches!(e.kind, EntryKind::Adopted { .. }))
        .map(|e| f64::from(e.tpu_type.chips()))
        .collect();
    let mut out = vec![vec![0.0; n]; pools.len() + adopted.len()];
    let mut add = |resource: usize, from: u64, until: u64, chips: f64| {
        let mut t = from;
        while t < until {
            let slot = (t / slot_ms) as usize;
            let slot_end = ((slot as u64 + 1) * slot_ms).min(until);
            if slot < n {
                out[resource][slot] += chips * (slot_end - t) as f64 / 1000.0;
            }
            t = slot_end;
        }
    };
    // The log is in time order: each pool's level holds until its next entry. When it
    // drops, the TPUs above the new level get a preemption notice and may work on until it
    // ends: the chips they hold are credited for that long too (an upper envelope).
    let notice_ms = (cloud.config().preemption_notice_secs * 1000.0) as u64;
    let mut level: Vec<Option<(u64, u32)>> = vec![None; pools.len()];
    let chips_at = |pool: usize, available: u32| {
        f64::from(available.min(ceilings[pool])) * f64::from(pools[pool].tpu_type.chips())
    };
    for &(t, pool, available) in cloud.capacity_log() {
        if let Some((since, before)) = level[pool] {
            add(
                pool,
                since.min(end_ms),
                t.min(end_ms),
                chips_at(pool, before),
            );
            let dropped = chips_at(pool, before) - chips_at(pool, available);
            if dropped > 0.0 {
                add(pool, t.min(end_ms), (t + notice_ms).min(end_ms), dropped);
            }
        }
        level[pool] = Some((t, available));
    }
    for (pool, l) in level.iter().enumerate() {
        if let Some((since, available)) = *l {
            add(pool, since.min(end_ms), end_ms, chips_at(pool, available));
        }
    }
    for (k, chips) in adopted.into_iter().enumerate() {
        add(pools.len() + k, 0, end_ms, chips);
    }
    out
}

/// Per arrival, the index of its set of bound resources (same order as
/// [`capacity_by_resource`]: a pool or an adopted TPU of an accepted type in one of its
/// regions), and the sets (sorted resource indices). Arrivals with the same types and
/// regions share a set.
fn placement_sets<'a>(
    scenario: &Scenario,
    arrivals: impl Iterator<Item = &'a (JobArrival, std::borrow::Cow<'a, [gcp::TpuType]>)>,
) -> (Vec<Vec<usize>>, Vec<usize>) {
    let places: Vec<(&gcp::TpuType, &str)> = scenario
        .cloud
        .pools
        .iter()
        .map(|p| (&p.tpu_type, p.zone.as_str()))
        .chain(
            scenario
                .fleet
                .tpus
                .iter()
                .filter(|e| matches!(e.kind, EntryKind::Adopted { .. }))
                .map(|e| (&e.tpu_type, e.zone.as_str())),
        )
        .collect();
    let mut ids: BTreeMap<(&[gcp::TpuType], &[String]), usize> = BTreeMap::new();
    let mut sets = Vec::new();
    let mut set_of = Vec::new();
    for (arrival, types) in arrivals {
        let types: &[gcp::TpuType] = types;
        let id = *ids.entry((types, &arrival.regions)).or_insert_with(|| {
            sets.push(
                places
                    .iter()
                    .enumerate()
                    .filter(|(_, (tpu_type, zone))| {
                        types.contains(tpu_type)
                            && gcp::zone_region(zone)
                                .is_ok_and(|r| arrival.regions.iter().any(|a| a == r))
                    })
                    .map(|(i, _)| i)
                    .collect(),
            );
            sets.len() - 1
        });
        set_of.push(id);
    }
    (sets, set_of)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

fn sample(
    backend: &SimBackend,
    state: &State,
    scenario: &Scenario,
    ceilings: &[u32],
    t_ms: u64,
) -> Sample {
    let mut capacity_by_zone: BTreeMap<String, u64> = BTreeMap::new();
    for (p, &a) in backend.cloud.available_slices().iter().enumerate() {
        let pool = &scenario.cloud.pools[p];
        *capacity_by_zone.entry(pool.zone.clone()).or_default() +=
            u64::from(a.min(ceilings[p])) * u64::from(pool.tpu_type.chips());
    }
    let mut queue = 0;
    let mut running = 0;
    for j in state.jobs.values() {
        match j.status {
            JobStatus::Pending => queue += 1,
            JobStatus::Running | JobStatus::Cancelling => running += 1,
            _ => {}
        }
    }
    Sample {
        hours: t_ms as f64 / 3_600_000.0,
        allocated_chips: backend.cloud.allocated_chips(),
        busy_chips: backend.cloud.busy_chips(),
        preemptions: backend.cloud.preemptions(),
        queue,
        running,
        capacity_by_zone,
    }
}
