//! `SimCloud`: the discrete-event model of queued resources, TPU nodes, spot capacity,
//! preemption and the workers running attempts. Single-threaded; time is virtual
//! milliseconds since the start of the run; events are ordered by (time, sequence number);
//! every collection that affects behaviour is ordered. It executes requests and answers
//! questions; it never decides anything a scheduler would.
//!
//! Here: the objects, the clock, the event queue and each pool's capacity over time; `api`
//! answers the TPU API, `pools` holds the pools to their capacity and moves nodes through
//! their lifecycle, `workers` runs the attempts on them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use ustr::{Ustr, UstrMap};

use crate::model::{Capacity, CloudConfig, JobBehaviour, Latency, PoolModel};
use crate::rng::SimRng;
use crate::waiting::WaitingQueue;
use crate::zoned::{InZone, ZonedTable};

mod api;
mod pools;
mod workers;

/// Virtual milliseconds since the start of the run.
pub type Millis = u64;

/// Queued resource states, as the TPU API names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum QrState {
    /// Waiting for capacity.
    WaitingForResources,
    /// Capacity found; the node is being created.
    Provisioning,
    /// The node exists.
    Active,
    /// Failed.
    Failed,
    /// Its node was preempted or deleted; being suspended (for `delete_secs`).
    Suspending,
    /// Its node was preempted or deleted.
    Suspended,
    /// Being deleted.
    Deleting,
}

/// Node states, as the TPU API names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeState {
    /// Being created.
    Creating,
    /// Ready.
    Ready,
    /// Preempted (stays until deleted).
    Preempted,
    /// Being deleted.
    Deleting,
}

/// A queued resource as `get` and `list` return it, borrowed from the cloud (reading copies
/// nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QrView<'a> {
    /// Incarnation: a queued resource created again under the same name has a new serial.
    pub serial: u64,
    /// Name.
    pub name: Ustr,
    /// Zone.
    pub zone: Ustr,
    /// Node id.
    pub node_id: Ustr,
    /// Accelerator type.
    pub accelerator: &'a str,
    /// State (the only field that changes during an incarnation).
    pub state: QrState,
    /// Labels given at creation.
    pub labels: &'a Labels,
    /// How what it asks for is paid for.
    pub model: PoolModel,
    /// The reservation it asks in (`Reserved` only).
    pub reservation: Option<Ustr>,
}

/// What the cloud says of a failed queued resource (`failedData.error.message`).
pub const QR_FAILED_MESSAGE: &str = "The queued resource failed to be provisioned.";

/// Labels of a cloud object: set at creation and shared, never copied, by every read.
pub type Labels = std::sync::Arc<BTreeMap<String, String>>;

/// A node as `get` and `list` return it, borrowed from the cloud.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeView<'a> {
    /// Incarnation: a node created again under the same name has a new serial.
    pub serial: u64,
    /// Name.
    pub name: Ustr,
    /// Zone.
    pub zone: Ustr,
    /// Accelerator type.
    pub accelerator: &'a str,
    /// State (the only field that changes during an incarnation).
    pub state: NodeState,
    /// Hosts.
    pub hosts: u32,
    /// Labels.
    pub labels: &'a Labels,
    /// The queued resource that made it.
    pub queued_resource: Option<Ustr>,
    /// Spot capacity (false for existing on-demand nodes).
    pub spot: bool,
    /// Created in a reservation.
    pub reserved: bool,
}

/// The answer to a zone listing.
#[derive(Debug)]
pub enum Listing<I> {
    /// Nothing in the zone changed since the version the caller keeps.
    Unchanged,
    /// The zone's objects, and the version of this listing.
    Changed {
        /// Pass it as `known` to the next listing of the zone.
        version: u64,
        /// The objects, in name order.
        objects: I,
    },
}

/// An API error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// 429.
    RateLimited,
    /// 5xx before anything happened.
    Unavailable,
    /// No reply; the effect may have happened.
    Timeout,
    /// The object already exists.
    AlreadyExists,
    /// The object does not exist.
    NotFound,
    /// No pool of this type and provisioning model in this zone.
    NoSuchPool,
    /// No reservation of this name for this type in this zone.
    NoSuchReservation,
}

/// Result of a remote command (launch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteError {
    /// The TPU does not exist.
    NotFound,
    /// Could not connect (not ready).
    Temporary,
}

/// Result of a remote cancel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelResult {
    /// Signal sent to a running attempt.
    Sent,
    /// Nothing of the attempt runs.
    NotRunning,
    /// The TPU runs a different attempt.
    Mismatch,
}

/// A worker's final status object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerStatusView {
    /// Host (`w0`, `w1`, ...; interned: every run keeps its statuses to the end).
    pub host: Ustr,
    /// `succeeded`, `failed` or `failed_setup`.
    pub state: &'static str,
    /// Command exit code.
    pub exit_code: Option<i32>,
    /// When it finished.
    pub finished_at: Millis,
    /// Infrastructure failure marker.
    pub infrastructure_failure: Option<&'static str>,
}

/// What the workers of an attempt show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptView {
    /// Launched on every worker.
    pub launched: bool,
    /// Final status objects present.
    pub statuses: Vec<WorkerStatusView>,
    /// Last heartbeat.
    pub heartbeat_at: Option<Millis>,
    /// Workers alive on a live node: they heartbeat continuously (`heartbeat_at` is now, and
    /// stays the current time until the run is reported changed).
    pub beating: bool,
}

/// Totals the metrics are computed from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Accounting {
    /// Chip-seconds of ACTIVE capacity (from ACTIVE to deletion request or preemption).
    pub allocated_chip_secs: f64,
    /// Chip-seconds of commands running.
    pub busy_chip_secs: f64,
    /// Chip-seconds of progress lost at interruptions (since the last checkpoint).
    pub lost_chip_secs: f64,
    /// Preemptions (random, trace-driven or stockout).
    pub preemptions: u64,
    /// API calls by kind.
    pub api_calls: BTreeMap<&'static str, u64>,
    /// API calls that failed, by error.
    pub api_errors: BTreeMap<&'static str, u64>,
    /// Seconds from queued-resource creation to ACTIVE, one per provisioned request.
    pub time_to_capacity_secs: Vec<f64>,
    /// Discrete events processed.
    pub events: u64,
    /// Attempts killed because another attempt was launched on their TPU (should stay 0).
    pub attempts_displaced: u64,
    /// Injected faults that fired, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Chip-seconds of ACTIVE capacity per `<accelerator>/<spot|on-demand|adopted>` (for
    /// cost; adopted = TPUs that existed before the run).
    pub allocated_chip_secs_by_type: BTreeMap<String, f64>,
}

/// The kinds of API call the simulator counts (in an array: a list call is made for every
/// zone on every pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ApiCall {
    ListNodes,
    ListQueuedResources,
    GetNode,
    GetQueuedResource,
    CreateQueuedResource,
    DeleteQueuedResource,
    DeleteNode,
    Launch,
    Cancel,
}

impl ApiCall {
    const ALL: [ApiCall; 9] = [
        ApiCall::ListNodes,
        ApiCall::ListQueuedResources,
        ApiCall::GetNode,
        ApiCall::GetQueuedResource,
        ApiCall::CreateQueuedResource,
        ApiCall::DeleteQueuedResource,
        ApiCall::DeleteNode,
        ApiCall::Launch,
        ApiCall::Cancel,
    ];

    /// The name in `Accounting::api_calls`.
    fn name(self) -> &'static str {
        match self {
            ApiCall::ListNodes => "list_nodes",
            ApiCall::ListQueuedResources => "list_queued_resources",
            ApiCall::GetNode => "get_node",
            ApiCall::GetQueuedResource => "get_queued_resource",
            ApiCall::CreateQueuedResource => "create_queued_resource",
            ApiCall::DeleteQueuedResource => "delete_queued_resource",
            ApiCall::DeleteNode => "delete_node",
            ApiCall::Launch => "launch",
            ApiCall::Cancel => "cancel",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    CapacityChange { pool: usize },
    Provisioned { serial: u64 },
    DeletionDone { serial: u64 },
    SuspensionDone { serial: u64 },
    Preempt { serial: u64 },
    NoticeEnd { serial: u64 },
    SetupDone { attempt: Ustr },
    RunEnd { attempt: Ustr },
    SilentDeath { attempt: Ustr },
    QrFault { serial: u64, vanish: bool },
    NodeVanish { serial: u64 },
}

#[derive(Clone, Debug)]
struct Qr {
    serial: u64,
    name: Ustr,
    zone: Ustr,
    node_id: Ustr,
    accelerator: String,
    pool: usize,
    model: PoolModel,
    reservation: Option<Ustr>,
    state: QrState,
    created_at: Millis,
    labels: Labels,
}

#[derive(Clone, Debug)]
struct Node {
    serial: u64,
    name: Ustr,
    zone: Ustr,
    accelerator: String,
    pool: usize,
    state: NodeState,
    hosts: u32,
    chips: u32,
    labels: Labels,
    queued_resource: Option<Ustr>,
    active_since: Option<Millis>,
    run: Option<Ustr>,
    /// Every attempt launched on the node (their reports change when it goes away).
    launched: Vec<Ustr>,
    caches: BTreeSet<String>,
    spot: bool,
    /// Its pool's model (on-demand for existing nodes).
    model: PoolModel,
    /// When a preemption notice was given (the TPU goes away `preemption_notice_secs` later).
    notice_at: Option<Millis>,
}

impl Qr {
    fn view(&self) -> QrView<'_> {
        QrView {
            serial: self.serial,
            name: self.name,
            zone: self.zone,
            node_id: self.node_id,
            accelerator: &self.accelerator,
            state: self.state,
            labels: &self.labels,
            model: self.model,
            reservation: self.reservation,
        }
    }
}

impl Node {
    fn view(&self) -> NodeView<'_> {
        NodeView {
            serial: self.serial,
            name: self.name,
            zone: self.zone,
            accelerator: &self.accelerator,
            state: self.state,
            hosts: self.hosts,
            labels: &self.labels,
            queued_resource: self.queued_resource,
            spot: self.spot,
            reserved: self.model == PoolModel::Reserved,
        }
    }
}

impl InZone for Node {
    fn zone(&self) -> Ustr {
        self.zone
    }
}

impl InZone for Qr {
    fn zone(&self) -> Ustr {
        self.zone
    }
}

/// Whether `labels` set label `key` to `value` (what a listing filters on).
pub fn labelled(labels: &Labels, (key, value): (&str, &str)) -> bool {
    labels.get(key).is_some_and(|v| v == value)
}

/// A listing's label filter: label `key` must be `value`. Label sets are immutable and
/// shared (`Arc`) by the objects created with them, and a zone lists them in name order,
/// which groups them by set: each run of one set is checked once.
struct LabelFilter<'a> {
    key: &'a str,
    value: &'a str,
    last: Option<(*const BTreeMap<String, String>, bool)>,
}

impl<'a> LabelFilter<'a> {
    fn new((key, value): (&'a str, &'a str)) -> Self {
        LabelFilter {
            key,
            value,
            last: None,
        }
    }

    fn matches(&mut self, labels: &Labels) -> bool {
        let set = std::sync::Arc::as_ptr(labels);
        if let Some((last, matched)) = self.last
            && last == set
        {
            return matched;
        }
        let matched = labelled(labels, (self.key, self.value));
        self.last = Some((set, matched));
        matched
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunState {
    Setup,
    Running,
    Ended,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Success,
    AppFailure,
    InfraFailure,
    SetupFailure,
    PartialFailure,
}

#[derive(Clone, Debug)]
struct Run {
    job_id: Ustr,
    node_serial: u64,
    node_key: Ustr,
    /// The node's slot in `nodes` (holding it while `node_serial` matches).
    node_slot: usize,
    hosts: u32,
    chips: u32,
    state: RunState,
    run_start: Millis,
    outcome: Outcome,
    alive: bool,
    last_heartbeat: Millis,
    statuses: Vec<WorkerStatusView>,
    /// Seconds of this run's progress saved at a preemption notice.
    saved_at_notice: Option<f64>,
}

#[derive(Clone, Debug)]
struct JobProgress {
    behaviour: JobBehaviour,
    checkpointed_secs: f64,
    attempts: u32,
}

/// The simulated cloud.
#[derive(Debug)]
pub struct SimCloud {
    config: CloudConfig,
    now: Millis,
    seq: u64,
    serial: u64,
    queue: BinaryHeap<Reverse<(Millis, u64, Event)>>,
    // Keyed by name for lookups, indexed by zone for listing. Names, zones, attempt and job
    // ids are interned (`Ustr`: found by pointer, ordered by text). Hash maps iterate in an
    // order set by the (deterministic) insertion history; every use below is
    // order-independent anyway (counts, minimum by serial, sorted victims) except float sums
    // in `accounting`, which sort first; zone listings are in name order.
    qrs: ZonedTable<Qr>,
    /// Per pool, its queued resources waiting for resources, oldest first.
    waiting: Vec<WaitingQueue>,
    nodes: ZonedTable<Node>,
    by_serial: BTreeMap<u64, (bool, Ustr)>,
    /// Every run ever launched, by attempt id (grows with history: hashed, so a lookup does
    /// not slow down as a long run accumulates attempts).
    runs: UstrMap<Run>,
    jobs: UstrMap<JobProgress>,
    available: Vec<u32>,
    on: Vec<bool>,
    /// Pools by zone, then accelerator (a zone has a handful).
    pool_index: UstrMap<Vec<(String, usize)>>,
    /// Each pool's zone, interned.
    pool_zones: Vec<Ustr>,
    rng_capacity: SimRng,
    rng_provisioning: SimRng,
    rng_preemption: SimRng,
    rng_api: SimRng,
    rng_workers: SimRng,
    rng_faults: SimRng,
    accounting: Accounting,
    /// Bumped on every change visible through `get`/`attempt` (lets drivers skip idle passes).
    version: u64,
    /// Attempts whose `attempt` view may have changed since the last `take_report_changes`
    /// (other than a beating run's heartbeat moving with time).
    report_changes: Vec<Ustr>,
    /// Calls made, by `ApiCall` (`accounting` names them).
    api_calls: [u64; ApiCall::ALL.len()],
    /// Quota tokens left for reads and mutations, as of `quota_at`.
    quota_tokens: [f64; 2],
    quota_at: Millis,
    /// Every change of the slices a pool can hold: (time, pool, slices). The available
    /// slices, or for a pool that does not reclaim, at least those still held.
    capacity_log: Vec<(Millis, usize, u32)>,
    /// The last level logged per pool.
    logged: Vec<Option<u32>>,
    /// Per pool: its nodes that are CREATING or READY (kept by `insert_node`,
    /// `set_node_state` and `remove_node`, so that asking costs nothing).
    live: Vec<u32>,
    /// Pools stocked out by hand (`set_stockout`): no capacity until lifted.
    stocked_out: Vec<bool>,
    /// The pass whose calls `take_call_latency_ms` is numbering, and the calls so far.
    pass_calls: (Millis, u32),
    /// The end of the measured window (`set_horizon`), and the totals as of then, taken
    /// when the clock first reaches it (before any event at that instant).
    horizon: Option<Millis>,
    at_horizon: Option<Accounting>,
}

const UNLIMITED: u32 = u32::MAX;

impl SimCloud {
    /// A cloud at time 0.
    pub fn new(config: CloudConfig) -> SimCloud {
        let seed = config.seed;
        let mut pool_index: UstrMap<Vec<(String, usize)>> = UstrMap::default();
        for (i, p) in config.pools.iter().enumerate() {
            let in_zone = pool_index.entry(Ustr::from(&p.zone)).or_default();
            in_zone.push((p.accelerator.clone(), i));
        }
        let pool_zones = config.pools.iter().map(|p| Ustr::from(&p.zone)).collect();
        let n = config.pools.len();
        let mut cloud = SimCloud {
            now: 0,
            seq: 0,
            serial: 0,
            queue: BinaryHeap::new(),
            qrs: ZonedTable::default(),
            waiting: (0..n).map(|_| WaitingQueue::default()).collect(),
            nodes: ZonedTable::default(),
            by_serial: BTreeMap::new(),
            runs: UstrMap::default(),
            jobs: UstrMap::default(),
            available: vec![0; n],
            on: vec![true; n],
            pool_index,
            pool_zones,
            rng_capacity: SimRng::new(seed, "capacity"),
            rng_provisioning: SimRng::new(seed, "provisioning"),
            rng_preemption: SimRng::new(seed, "preemption"),
            rng_api: SimRng::new(seed, "api"),
            rng_workers: SimRng::new(seed, "workers"),
            rng_faults: SimRng::new(seed, "faults"),
            accounting: Accounting::default(),
            version: 0,
            report_changes: Vec::new(),
            api_calls: [0; ApiCall::ALL.len()],
            quota_tokens: [
                config.api_quota.reads_per_minute,
                config.api_quota.mutations_per_minute,
            ],
            quota_at: 0,
            capacity_log: Vec::new(),
            logged: vec![None; n],
            live: vec![0; n],
            stocked_out: vec![false; n],
            pass_calls: (Millis::MAX, 0),
            horizon: None,
            at_horizon: None,
            config,
        };
        for pool in 0..n {
            cloud.available[pool] = cloud.capacity_at(pool, 0);
            cloud.log_level(pool);
            cloud.schedule_capacity_change(pool);
        }
        cloud
    }

    /// Current virtual time.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// Changes visible to `get` calls so far.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Measures up to `horizon` only: whatever happens at or after it (calls of the last
    /// pass ending later, an event exactly at the horizon) is outside every total.
    pub fn set_horizon(&mut self, horizon: Millis) {
        self.horizon = Some(horizon);
    }

    /// Totals for metrics: as of the horizon once the clock reached it, else up to `now`
    /// (allocation of still-active nodes and running commands counted to then).
    pub fn accounting(&self) -> Accounting {
        match &self.at_horizon {
            Some(acc) => acc.clone(),
            None => self.accounting_at(self.now),
        }
    }

    /// Takes the horizon's totals when the clock is about to reach `t` (every event before
    /// the horizon processed, none at or after it).
    fn reach(&mut self, t: Millis) {
        if let Some(h) = self.horizon
            && t >= h
            && self.at_horizon.is_none()
        {
            self.at_horizon = Some(self.accounting_at(h.max(self.now)));
        }
    }

    /// The totals with open intervals closed at `t` (no earlier than every closed one).
    fn accounting_at(&self, t: Millis) -> Accounting {
        let mut acc = self.accounting.clone();
        for kind in ApiCall::ALL {
            let calls = self.api_calls[kind as usize];
            if calls > 0 {
                acc.api_calls.insert(kind.name(), calls);
            }
        }
        // A reservation is billed whole for the whole run, held or not; its nodes add nothing.
        let secs = t as f64 / 1000.0;
        for p in self
            .config
            .pools
            .iter()
            .filter(|p| p.model == PoolModel::Reserved)
        {
            let slices = match p.capacity {
                Capacity::Constant(n) => n,
                _ => 0,
            };
            let chip_secs = secs * f64::from(slices) * f64::from(p.chips);
            acc.allocated_chip_secs += chip_secs;
            *acc.allocated_chip_secs_by_type
                .entry(format!("{}/{}", p.accelerator, p.model.as_str()))
                .or_default() += chip_secs;
        }
        let mut active: Vec<&Node> = self.nodes.values().collect();
        active.sort_by_key(|n| n.serial);
        for node in active {
            if node.model == PoolModel::Reserved {
                continue;
            }
            if let Some(since) = node.active_since {
                let secs = t.saturating_sub(since) as f64 / 1000.0;
                acc.allocated_chip_secs += secs * node.chips as f64;
                *acc.allocated_chip_secs_by_type
                    .entry(price_key(node))
                    .or_default() += secs * node.chips as f64;
            }
        }
        let mut running: Vec<(&Ustr, &Run)> = self
            .runs
            .iter()
            .filter(|(_, r)| r.state == RunState::Running && r.alive)
            .collect();
        running.sort_by_key(|(id, _)| *id);
        for (_, run) in running {
            acc.busy_chip_secs +=
                t.saturating_sub(run.run_start) as f64 / 1000.0 * run.chips as f64;
        }
        acc
    }

    /// Spot preemptions so far (random, trace-driven or stockout).
    pub fn preemptions(&self) -> u64 {
        self.accounting.preemptions
    }

    /// Attempts killed because another was launched over them (0 for a correct engine).
    pub fn attempts_displaced(&self) -> u64 {
        self.accounting.attempts_displaced
    }

    /// Chips of ACTIVE nodes now.
    pub fn allocated_chips(&self) -> u64 {
        self.nodes
            .values()
            .filter(|n| n.active_since.is_some())
            .map(|n| u64::from(n.chips))
            .sum()
    }

    /// Chips running a command now: a live run is always its node's current run, so the
    /// nodes (bounded by the fleet) are counted, not every run of the history.
    pub fn busy_chips(&self) -> u64 {
        self.nodes
            .values()
            .filter_map(|n| self.runs.get(n.run.as_ref()?))
            .filter(|r| r.state == RunState::Running && r.alive)
            .map(|r| u64::from(r.chips))
            .sum()
    }

    /// `busy_chips` counted over every run ever launched (for invariant checks: the two
    /// must agree).
    pub fn busy_chips_of_all_runs(&self) -> u64 {
        self.runs
            .values()
            .filter(|r| r.state == RunState::Running && r.alive)
            .map(|r| u64::from(r.chips))
            .sum()
    }

    /// Every change of available slices so far: (time, pool, slices), in time order.
    pub fn capacity_log(&self) -> &[(Millis, usize, u32)] {
        &self.capacity_log
    }

    /// Slices available now per pool (`u32::MAX` = unlimited), in pool order.
    pub fn available_slices(&self) -> &[u32] {
        &self.available
    }

    /// The configuration.
    pub fn config(&self) -> &CloudConfig {
        &self.config
    }

    /// Slices the pool offers at `secs` (without outages' stockout state machine).
    pub fn capacity_at(&self, pool: usize, millis: Millis) -> u32 {
        let p = &self.config.pools[pool];
        let secs = millis / 1000;
        if self.stocked_out[pool]
            || p.outages
                .iter()
                .any(|(from, until)| secs >= *from && secs < *until)
        {
            return 0;
        }
        match &p.capacity {
            Capacity::Unlimited => UNLIMITED,
            Capacity::Constant(n) => *n,
            Capacity::OnOff { slices, .. } => {
                if self.on[pool] {
                    *slices
                } else {
                    0
                }
            }
            Capacity::Schedule(steps) => {
                let i = steps.partition_point(|(from, _)| *from <= secs);
                steps
                    .get(i.saturating_sub(1))
                    .map_or(UNLIMITED, |(_, n)| *n)
            }
            Capacity::Trace {
                trace,
                scale,
                offset_secs,
            } => trace.at(secs + offset_secs).saturating_mul(*scale),
        }
    }

    fn faults_active(&self, at: Millis) -> bool {
        let until = self.config.faults.until_secs;
        until == 0 || at < until * 1000
    }

    /// Schedules a fault for an object at an exponential time, if it falls while faults last.
    fn schedule_fault(&mut self, rate_per_hour: f64, event: Event) {
        if rate_per_hour <= 0.0 {
            return;
        }
        let at = self.now + (self.rng_faults.exponential(3600.0 / rate_per_hour) * 1000.0) as u64;
        if self.faults_active(at) {
            self.push(at, event);
        }
    }

    fn push(&mut self, at: Millis, event: Event) {
        self.seq += 1;
        self.queue
            .push(Reverse((at.max(self.now), self.seq, event)));
    }

    fn schedule_capacity_change(&mut self, pool: usize) {
        let p = &self.config.pools[pool];
        let now_secs = self.now / 1000;
        let mut next: Option<u64> = p
            .outages
            .iter()
            .flat_map(|(a, b)| [*a, *b])
            .filter(|t| *t > now_secs)
            .min();
        match &p.capacity {
            Capacity::OnOff {
                mean_on_secs,
                mean_off_secs,
                ..
            } => {
                let mean = if self.on[pool] {
                    *mean_on_secs
                } else {
                    *mean_off_secs
                };
                let d = self.rng_capacity.exponential(mean).max(1.0) as u64;
                next = Some(next.map_or(now_secs + d, |n| n.min(now_secs + d)));
            }
            Capacity::Trace {
                trace, offset_secs, ..
            } => {
                let gap = trace.gap_seconds;
                let current = trace.at(now_secs + offset_secs);
                // The next tick whose value differs (bounded to one period).
                let mut t = ((now_secs + offset_secs) / gap + 1) * gap;
                let limit = t + trace.period_seconds();
                while t < limit && trace.at(t) == current {
                    t += gap;
                }
                if t < limit {
                    let at = t - offset_secs;
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
            Capacity::Schedule(steps) => {
                let i = steps.partition_point(|(from, _)| *from <= now_secs);
                if let Some((at, _)) = steps.get(i) {
                    next = Some(next.map_or(*at, |n| n.min(*at)));
                }
            }
            Capacity::Unlimited | Capacity::Constant(_) => {}
        }
        if let Some(at) = next {
            self.push(at * 1000, Event::CapacityChange { pool });
        }
    }

    /// The time of the next event, if any.
    pub fn next_event_at(&self) -> Option<Millis> {
        self.queue.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Processes every event up to and including `until`, then sets the clock to `until`.
    pub fn advance_to(&mut self, until: Millis) {
        while let Some(Reverse((t, _, _))) = self.queue.peek() {
            if *t > until {
                break;
            }
            let t = *t;
            self.reach(t);
            let Reverse((t, _, event)) = self.queue.pop().expect("peeked");
            self.now = t;
            self.accounting.events += 1;
            self.handle(event);
        }
        self.reach(until);
        self.now = self.now.max(until);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::CapacityChange { pool } => {
                if let Capacity::OnOff { .. } = self.config.pools[pool].capacity {
                    let in_outage = self.config.pools[pool]
                        .outages
                        .iter()
                        .any(|(a, b)| self.now / 1000 >= *a && self.now / 1000 < *b);
                    if !in_outage {
                        self.on[pool] = !self.on[pool];
                    }
                }
                self.available[pool] = self.capacity_at(pool, self.now);
                self.enforce_capacity(pool);
                self.provision_waiting(pool);
                self.schedule_capacity_change(pool);
            }
            Event::Provisioned { serial } => self.provisioned(serial),
            Event::DeletionDone { serial } => {
                if let Some((is_qr, key)) = self.by_serial.remove(&serial) {
                    let pool = if is_qr {
                        self.qrs.remove(key).map(|q| q.pool)
                    } else {
                        // Its runs were marked changed when the deletion started.
                        self.remove_node(key).map(|n| n.pool)
                    };
                    self.version += 1;
                    if let Some(pool) = pool {
                        self.provision_waiting(pool);
                    }
                }
            }
            Event::SuspensionDone { serial } => {
                if let Some((true, key)) = self.by_serial.get(&serial).cloned()
                    && let Some(q) = self.qrs.get(key)
                    && q.state == QrState::Suspending
                {
                    self.qrs.get_mut(key).expect("exists").state = QrState::Suspended;
                    self.version += 1;
                }
            }
            Event::Preempt { serial } => {
                if let Some((false, key)) = self.by_serial.get(&serial).cloned()
                    && self
                        .nodes
                        .get(key)
                        .is_some_and(|n| n.state == NodeState::Ready)
                {
                    self.preempt(key);
                    // Without a notice the slice is free now.
                    let pool = self.nodes[key].pool;
                    self.provision_waiting(pool);
                }
            }
            Event::NoticeEnd { serial } => {
                if let Some((false, key)) = self.by_serial.get(&serial).cloned()
                    && self
                        .nodes
                        .get(key)
                        .is_some_and(|n| matches!(n.state, NodeState::Creating | NodeState::Ready))
                {
                    self.reclaim(key);
                    let pool = self.nodes[key].pool;
                    self.provision_waiting(pool);
                }
            }
            Event::QrFault { serial, vanish } => {
                let Some((true, key)) = self.by_serial.get(&serial).cloned() else {
                    return;
                };
                let Some(qr) = self.qrs.get(key) else { return };
                if vanish
                    && matches!(
                        qr.state,
                        QrState::WaitingForResources | QrState::Provisioning | QrState::Active
                    )
                {
                    *self.accounting.faults.entry("qr_vanished").or_default() += 1;
                    let (node_id, pool) = (qr.node_id, qr.pool);
                    if self
                        .nodes
                        .get(node_id)
                        .is_some_and(|n| n.queued_resource == Some(key))
                    {
                        self.release_allocation(node_id);
                        self.touch_node_runs(node_id);
                        if let Some(run) = self.nodes.get_mut(node_id).and_then(|n| n.run.take()) {
                            self.kill_run(run);
                        }
                        if let Some(n) = self.remove_node(node_id) {
                            self.by_serial.remove(&n.serial);
                        }
                    }
                    self.qrs.remove(key);
                    self.by_serial.remove(&serial);
                    self.version += 1;
                    self.provision_waiting(pool);
                } else if !vanish && qr.state == QrState::WaitingForResources {
                    *self.accounting.faults.entry("qr_failed").or_default() += 1;
                    self.qrs.get_mut(key).expect("exists").state = QrState::Failed;
                    self.version += 1;
                }
            }
            Event::NodeVanish { serial } => {
                let Some((false, key)) = self.by_serial.get(&serial).cloned() else {
                    return;
                };
                if self
                    .nodes
                    .get(key)
                    .is_some_and(|n| n.state == NodeState::Ready)
                {
                    *self.accounting.faults.entry("node_vanished").or_default() += 1;
                    self.release_allocation(key);
                    self.touch_node_runs(key);
                    if let Some(run) = self.nodes.get_mut(key).and_then(|n| n.run.take()) {
                        self.kill_run(run);
                    }
                    let pool = self.remove_node(key).map(|n| n.pool);
                    self.by_serial.remove(&serial);
                    self.version += 1;
                    if let Some(pool) = pool {
                        self.provision_waiting(pool);
                    }
                }
            }
            Event::SetupDone { attempt } => self.setup_done(attempt),
            Event::RunEnd { attempt } => self.run_end(attempt),
            Event::SilentDeath { attempt } => {
                if let Some(run) = self.runs.get_mut(&attempt)
                    && run.state != RunState::Ended
                    && run.alive
                {
                    *self
                        .accounting
                        .faults
                        .entry("workers_died_silently")
                        .or_default() += 1;
                    self.touch_run(attempt);
                    let run = self.runs.get_mut(&attempt).expect("exists");
                    run.alive = false;
                    let progress = (self.now - run.run_start) as f64 / 1000.0;
                    let (job, chips, notice) = (run.job_id, run.chips, run.saved_at_notice);
                    if run.state == RunState::Running {
                        self.account_interruption(job, progress, chips, notice);
                    }
                    self.version += 1;
                }
            }
        }
    }
}

fn price_key(node: &Node) -> String {
    let model = match node.pool {
        usize::MAX => "adopted",
        _ => node.model.as_str(),
    };
    format!("{}/{model}", node.accelerator)
}

fn sample(rng: &mut SimRng, latency: Latency) -> f64 {
    if latency.sigma <= 0.0 {
        latency.median_secs
    } else {
        rng.lognormal(latency.median_secs, latency.sigma)
    }
}

/// The region of a zone (`us-east1-d` → `us-east1`).
pub fn region_of(zone: &str) -> &str {
    zone.rsplit_once('-').map_or(zone, |(r, _)| r)
}

/// A node that holds a slice of its pool: CREATING or READY.
fn is_live(state: NodeState) -> bool {
    matches!(state, NodeState::Creating | NodeState::Ready)
}
