//! `SimCloud`: the discrete-event model of queued resources, TPU nodes, spot capacity,
//! preemption and the workers running attempts. Single-threaded; time is virtual
//! milliseconds since the start of the run; events are ordered by (time, sequence number);
//! every collection that affects behaviour is ordered. It executes requests and answers
//! questions; it never decides anything a scheduler would.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use ustr::{Ustr, UstrMap};

use crate::model::{ApiConfig, CallKind, Capacity, CloudConfig, JobBehaviour, Latency, PoolModel};
use crate::rng::SimRng;
use crate::waiting::WaitingQueue;
use crate::zoned::{InZone, ZonedTable};

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

    /// The nodes of `pool` (found through its zone's index), by name.
    fn pool_nodes(&self, pool: usize) -> impl Iterator<Item = (Ustr, &Node)> {
        self.nodes
            .in_zone(self.pool_zones[pool])
            .filter(move |(_, n)| n.pool == pool)
    }

    fn in_use(&self, pool: usize) -> u32 {
        debug_assert_eq!(
            self.live[pool],
            self.pool_nodes(pool)
                .filter(|(_, n)| is_live(n.state))
                .count() as u32,
            "pool {pool}'s live-node count"
        );
        self.live[pool]
    }

    /// Adds `node` (keeping its pool's live count).
    fn insert_node(&mut self, key: Ustr, node: Node) {
        if is_live(node.state)
            && let Some(live) = self.live.get_mut(node.pool)
        {
            *live += 1;
        }
        self.remove_node(key);
        self.nodes.insert(key, node);
    }

    /// Moves node `key` to `state` (keeping its pool's live count).
    fn set_node_state(&mut self, key: Ustr, state: NodeState) {
        let Some(node) = self.nodes.get_mut(key) else {
            return;
        };
        let (was, pool) = (is_live(node.state), node.pool);
        node.state = state;
        if let Some(live) = self.live.get_mut(pool) {
            match (was, is_live(state)) {
                (true, false) => *live -= 1,
                (false, true) => *live += 1,
                _ => {}
            }
        }
    }

    /// Removes node `key` (keeping its pool's live count).
    fn remove_node(&mut self, key: Ustr) -> Option<Node> {
        let node = self.nodes.remove(key)?;
        if is_live(node.state)
            && let Some(live) = self.live.get_mut(node.pool)
        {
            *live -= 1;
        }
        Some(node)
    }

    /// Preempt the newest nodes while more are in use than available (nodes already under
    /// notice are on their way out and count as gone), unless the pool never reclaims.
    fn enforce_capacity(&mut self, pool: usize) {
        if !self.config.pools[pool].reclaims {
            return;
        }
        let available = self.available[pool];
        let leaving = self
            .pool_nodes(pool)
            .filter(|(_, n)| {
                n.notice_at.is_some() && matches!(n.state, NodeState::Creating | NodeState::Ready)
            })
            .count() as u32;
        let mut in_use = self.in_use(pool) - leaving;
        if in_use <= available {
            return;
        }
        let mut victims: Vec<(u64, Ustr)> = self
            .pool_nodes(pool)
            .filter(|(_, n)| {
                n.notice_at.is_none() && matches!(n.state, NodeState::Creating | NodeState::Ready)
            })
            .map(|(k, n)| (n.serial, k))
            .collect();
        victims.sort_by_key(|v| std::cmp::Reverse(v.0));
        for (_, key) in victims {
            if in_use <= available {
                break;
            }
            self.preempt(key);
            in_use -= 1;
        }
    }

    fn release_allocation(&mut self, key: Ustr) {
        let now = self.now;
        if let Some(node) = self.nodes.get_mut(key)
            && let Some(since) = node.active_since.take()
            && node.model != PoolModel::Reserved
        {
            let secs = (now - since) as f64 / 1000.0 * node.chips as f64;
            self.accounting.allocated_chip_secs += secs;
            *self
                .accounting
                .allocated_chip_secs_by_type
                .entry(price_key(node))
                .or_default() += secs;
        }
    }

    /// A Spot preemption: the notice now, the TPU gone `preemption_notice_secs` later. A job
    /// that checkpoints on notice saves its progress at the notice.
    fn preempt(&mut self, key: Ustr) {
        let notice_ms = (self.config.preemption_notice_secs * 1000.0) as u64;
        let now = self.now;
        let Some(node) = self.nodes.get_mut(key) else {
            return;
        };
        if notice_ms == 0 || node.state == NodeState::Creating {
            self.reclaim(key);
            return;
        }
        if node.notice_at.is_some() {
            return;
        }
        node.notice_at = Some(now);
        let (serial, run) = (node.serial, node.run);
        if let Some(attempt) = run
            && let Some(r) = self.runs.get_mut(&attempt)
            && r.alive
            && r.state == RunState::Running
            && self
                .jobs
                .get(&r.job_id)
                .is_some_and(|p| p.behaviour.checkpoint_on_notice)
        {
            r.saved_at_notice = Some(now.saturating_sub(r.run_start) as f64 / 1000.0);
        }
        self.push(now + notice_ms, Event::NoticeEnd { serial });
    }

    /// The TPU goes away now: PREEMPTED, its request suspended, its run killed.
    fn reclaim(&mut self, key: Ustr) {
        self.release_allocation(key);
        self.touch_node_runs(key);
        self.set_node_state(key, NodeState::Preempted);
        let Some(node) = self.nodes.get_mut(key) else {
            return;
        };
        let run = node.run.take();
        let qr = node.queued_resource;
        self.accounting.preemptions += 1;
        self.version += 1;
        if let Some(qr) = qr
            && self.qrs.get(qr).is_some_and(|q| {
                !matches!(
                    q.state,
                    QrState::Deleting | QrState::Suspending | QrState::Suspended
                )
            })
        {
            self.suspend(qr);
        }
        if let Some(attempt) = run {
            self.kill_run(attempt);
        }
    }

    /// The queued resource `key` lost its node: SUSPENDING now, SUSPENDED `delete_secs`
    /// later (unless it is deleted first).
    fn suspend(&mut self, key: Ustr) {
        let Some(q) = self.qrs.get_mut(key) else {
            return;
        };
        q.state = QrState::Suspending;
        let serial = q.serial;
        let done = self.now + (self.config.delete_secs * 1000.0) as u64;
        self.push(done, Event::SuspensionDone { serial });
    }

    /// The run dies with its TPU: no status, no heartbeat; progress since the last
    /// checkpoint is lost.
    fn kill_run(&mut self, attempt: Ustr) {
        let now = self.now;
        self.touch_run(attempt);
        let Some(run) = self.runs.get_mut(&attempt) else {
            return;
        };
        if run.state == RunState::Ended || !run.alive {
            run.alive = false;
            return;
        }
        let was_running = run.state == RunState::Running;
        run.alive = false;
        let progress = (now.saturating_sub(run.run_start)) as f64 / 1000.0;
        let (job, chips, notice) = (run.job_id, run.chips, run.saved_at_notice);
        if was_running {
            self.account_interruption(job, progress, chips, notice);
        }
    }

    /// Busy time and saved/lost progress of an interrupted run (saved: the last periodic
    /// checkpoint, or the one written at a preemption notice if later).
    fn account_interruption(
        &mut self,
        job: Ustr,
        progress_secs: f64,
        chips: u32,
        saved_at_notice: Option<f64>,
    ) {
        self.accounting.busy_chip_secs += progress_secs * chips as f64;
        if let Some(p) = self.jobs.get_mut(&job) {
            let ckpt = p.behaviour.checkpoint_secs;
            let periodic = if ckpt > 0.0 {
                (progress_secs / ckpt).floor() * ckpt
            } else {
                0.0
            };
            let saved = periodic.max(saved_at_notice.unwrap_or(0.0).min(progress_secs));
            let saved = saved
                .min(p.behaviour.work_secs - p.checkpointed_secs)
                .max(0.0);
            p.checkpointed_secs += saved;
            self.accounting.lost_chip_secs += (progress_secs - saved).max(0.0) * chips as f64;
        }
    }

    /// Whether incarnation `serial` of queued resource `name` still waits for resources.
    fn still_waiting(qrs: &ZonedTable<Qr>, serial: u64, name: Ustr) -> bool {
        qrs.get(name)
            .is_some_and(|q| q.serial == serial && q.state == QrState::WaitingForResources)
    }

    /// Starts provisioning the oldest waiting requests of `pool` while it has capacity.
    /// Grants waiting requests while the pool has room, then logs its level.
    fn provision_waiting(&mut self, pool: usize) {
        if pool >= self.available.len() {
            return;
        }
        let mut in_use = self.in_use(pool);
        while in_use < self.available[pool] {
            let qrs = &self.qrs;
            let next =
                self.waiting[pool].pop_live(|serial, name| Self::still_waiting(qrs, serial, name));
            let Some((_, key)) = next else { break };
            self.start_provisioning(key);
            in_use += 1;
        }
        self.log_level(pool);
    }

    /// Logs the slices `pool` can hold now if they changed: what is available, or, where a
    /// drop does not reclaim, at least what is still held (the bound credits those).
    fn log_level(&mut self, pool: usize) {
        let mut level = self.available[pool];
        if !self.config.pools[pool].reclaims {
            level = level.max(self.in_use(pool));
        }
        if self.logged[pool] != Some(level) {
            self.logged[pool] = Some(level);
            self.capacity_log.push((self.now, pool, level));
        }
    }

    fn start_provisioning(&mut self, key: Ustr) {
        let region = region_of(&self.qrs[key].zone).to_owned();
        let latency = *self
            .config
            .provisioning_by_region
            .get(&region)
            .unwrap_or(&self.config.provisioning);
        let secs = sample(&mut self.rng_provisioning, latency).max(1.0);
        let pool = self.qrs[key].pool;
        let (chips, hosts) = (self.config.pools[pool].chips, self.config.pools[pool].hosts);
        let qr = self.qrs.get_mut(key).expect("exists");
        qr.state = QrState::Provisioning;
        let serial = qr.serial;
        let node_key = qr.node_id;
        let node = Node {
            serial: self.serial + 1,
            name: qr.node_id,
            zone: qr.zone,
            accelerator: qr.accelerator.clone(),
            pool,
            state: NodeState::Creating,
            hosts,
            chips,
            labels: qr.labels.clone(),
            queued_resource: Some(qr.name),
            active_since: None,
            run: None,
            launched: Vec::new(),
            caches: BTreeSet::new(),
            spot: self.config.pools[pool].model == PoolModel::Spot,
            model: self.config.pools[pool].model,
            notice_at: None,
        };
        self.serial += 1;
        self.by_serial.insert(node.serial, (false, node_key));
        self.insert_node(node_key, node);
        self.version += 1;
        self.push(
            self.now + (secs * 1000.0) as u64,
            Event::Provisioned { serial },
        );
    }

    fn provisioned(&mut self, qr_serial: u64) {
        let Some((true, key)) = self.by_serial.get(&qr_serial).cloned() else {
            return;
        };
        let Some(qr) = self.qrs.get_mut(key) else {
            return;
        };
        if qr.state != QrState::Provisioning {
            return;
        }
        qr.state = QrState::Active;
        let created = qr.created_at;
        let node_key = qr.node_id;
        self.accounting
            .time_to_capacity_secs
            .push((self.now - created) as f64 / 1000.0);
        let rate = self
            .nodes
            .get(node_key)
            .and_then(|n| self.config.pools.get(n.pool))
            .map_or(0.0, |p| p.preemption_per_hour);
        if self
            .nodes
            .get(node_key)
            .is_some_and(|n| n.state == NodeState::Creating)
        {
            self.set_node_state(node_key, NodeState::Ready);
            let node = self.nodes.get_mut(node_key).expect("exists");
            node.active_since = Some(self.now);
            let serial = node.serial;
            if rate > 0.0 {
                let life = self.rng_preemption.exponential(3600.0 / rate);
                self.push(self.now + (life * 1000.0) as u64, Event::Preempt { serial });
            }
            let vanish = self.config.faults.node_vanish_per_hour;
            self.schedule_fault(vanish, Event::NodeVanish { serial });
        }
        self.version += 1;
    }

    // ----- the API ------------------------------------------------------------------

    /// How long the `index`-th call of `kind` made by the pass that started at `pass_at`
    /// takes, in milliseconds: a pure function of the seed, the pass and the call (not a
    /// draw from a shared stream), so a run that skips idle passes sees the same latencies
    /// as one that runs them all.
    pub fn call_latency_ms(&self, kind: CallKind, pass_at: Millis, index: u32) -> Millis {
        let latency = match kind {
            CallKind::Read => self.config.api_latency.read,
            CallKind::Mutation => self.config.api_latency.mutation,
            CallKind::Remote => self.config.api_latency.remote,
        };
        if latency.median_secs <= 0.0 {
            return 0;
        }
        let call = pass_at
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add((u64::from(index) << 2) | kind as u64);
        let mut rng = SimRng::new(self.config.seed ^ call, "api_latency");
        (sample(&mut rng, latency).max(0.0) * 1000.0) as Millis
    }

    /// Takes one call from the read or mutation quota, refilled with simulated time; false
    /// when the bucket is empty (the call is refused and uses nothing).
    fn within_quota(&mut self, mutation: bool) -> bool {
        let quota = &self.config.api_quota;
        let per_minute = [quota.reads_per_minute, quota.mutations_per_minute];
        let elapsed_min = self.now.saturating_sub(self.quota_at) as f64 / 60_000.0;
        self.quota_at = self.now;
        for (tokens, rate) in self.quota_tokens.iter_mut().zip(per_minute) {
            *tokens = (*tokens + elapsed_min * rate).min(rate);
        }
        let k = usize::from(mutation);
        if per_minute[k] <= 0.0 {
            return true;
        }
        if self.quota_tokens[k] < 1.0 {
            return false;
        }
        self.quota_tokens[k] -= 1.0;
        true
    }

    fn api(&mut self, kind: ApiCall, mutation: bool) -> Result<bool, ApiError> {
        self.api_calls[kind as usize] += 1;
        let ApiConfig {
            rate_limited,
            unavailable,
            timeout,
            lost_reply,
        } = self.config.api;
        // The draw only picks the fault a call meets, and the stream is this function's alone:
        // with every fault probability 0 (fixed for the run) it is skipped.
        let u = if rate_limited + unavailable + timeout + lost_reply > 0.0 {
            self.rng_api.uniform()
        } else {
            1.0
        };
        if !self.within_quota(mutation) {
            *self
                .accounting
                .api_errors
                .entry("quota_exceeded")
                .or_default() += 1;
            return Err(ApiError::RateLimited);
        }
        if !self.faults_active(self.now) {
            return Ok(false);
        }
        let err = if u < rate_limited {
            Some(("rate_limited", ApiError::RateLimited, false))
        } else if u < rate_limited + unavailable {
            Some(("unavailable", ApiError::Unavailable, false))
        } else if u < rate_limited + unavailable + timeout {
            Some(("timeout", ApiError::Timeout, false))
        } else if mutation && u < rate_limited + unavailable + timeout + lost_reply {
            Some(("lost_reply", ApiError::Timeout, true))
        } else {
            None
        };
        match err {
            None => Ok(false),
            Some((name, _, true)) => {
                *self.accounting.api_errors.entry(name).or_default() += 1;
                Ok(true)
            }
            Some((name, e, false)) => {
                *self.accounting.api_errors.entry(name).or_default() += 1;
                Err(e)
            }
        }
    }

    /// Creates a queued resource for one node in the pool of `accelerator` and `model` in
    /// `zone` (a reserved one: in the reservation named `reservation`).
    #[allow(clippy::too_many_arguments)]
    pub fn create_queued_resource(
        &mut self,
        zone: Ustr,
        name: Ustr,
        node_id: Ustr,
        accelerator: &str,
        model: PoolModel,
        reservation: Option<&str>,
        labels: Labels,
    ) -> Result<(), ApiError> {
        let lost_reply = self.api(ApiCall::CreateQueuedResource, true)?;
        if self.qrs.contains_key(name) || self.nodes.contains_key(node_id) {
            return Err(ApiError::AlreadyExists);
        }
        let pool = self
            .pool_index
            .get(&zone)
            .and_then(|in_zone| {
                in_zone
                    .iter()
                    .find(|(a, p)| a == accelerator && self.config.pools[*p].model == model)
            })
            .map(|&(_, pool)| pool)
            .ok_or(ApiError::NoSuchPool)?;
        if model == PoolModel::Reserved
            && self.config.pools[pool].reservation.as_deref() != reservation
        {
            return Err(ApiError::NoSuchReservation);
        }
        self.serial += 1;
        let qr = Qr {
            serial: self.serial,
            name,
            zone,
            node_id,
            accelerator: accelerator.to_owned(),
            pool,
            model,
            reservation: reservation
                .filter(|_| model == PoolModel::Reserved)
                .map(Ustr::from),
            state: QrState::WaitingForResources,
            created_at: self.now,
            labels,
        };
        let serial = qr.serial;
        self.by_serial.insert(qr.serial, (true, name));
        self.qrs.insert(name, qr);
        let qrs = &self.qrs;
        self.waiting[pool].push(self.now, serial, name, |serial, name| {
            Self::still_waiting(qrs, serial, name)
        });
        self.version += 1;
        let faults = self.config.faults;
        self.schedule_fault(
            faults.qr_failure_per_hour,
            Event::QrFault {
                serial,
                vanish: false,
            },
        );
        self.schedule_fault(
            faults.qr_vanish_per_hour,
            Event::QrFault {
                serial,
                vanish: true,
            },
        );
        self.provision_waiting(pool);
        if lost_reply {
            Err(ApiError::Timeout)
        } else {
            Ok(())
        }
    }

    /// Deletes a queued resource and its node.
    pub fn delete_queued_resource(&mut self, zone: Ustr, name: Ustr) -> Result<(), ApiError> {
        let lost_reply = self.api(ApiCall::DeleteQueuedResource, true)?;
        let Some(qr) = self.qrs.get_mut(name).filter(|q| q.zone == zone) else {
            return Err(ApiError::NotFound);
        };
        if qr.state == QrState::Deleting {
            return if lost_reply {
                Err(ApiError::Timeout)
            } else {
                Ok(())
            };
        }
        qr.state = QrState::Deleting;
        let serial = qr.serial;
        let node_key = qr.node_id;
        if self
            .nodes
            .get(node_key)
            .is_some_and(|n| n.queued_resource == Some(name))
        {
            self.start_node_deletion(node_key);
        }
        self.version += 1;
        let done = self.now + (self.config.delete_secs * 1000.0) as u64;
        self.push(done, Event::DeletionDone { serial });
        if lost_reply {
            Err(ApiError::Timeout)
        } else {
            Ok(())
        }
    }

    fn start_node_deletion(&mut self, key: Ustr) {
        self.release_allocation(key);
        let Some(node) = self.nodes.get_mut(key) else {
            return;
        };
        if node.state == NodeState::Deleting {
            return;
        }
        self.set_node_state(key, NodeState::Deleting);
        self.touch_node_runs(key);
        let node = self.nodes.get_mut(key).expect("exists");
        let serial = node.serial;
        let run = node.run.take();
        if let Some(attempt) = run {
            self.kill_run(attempt);
        }
        let done = self.now + (self.config.delete_secs * 1000.0) as u64;
        self.push(done, Event::DeletionDone { serial });
        self.version += 1;
    }

    /// Deletes a node (its queued resource, if any, becomes SUSPENDING, then SUSPENDED).
    pub fn delete_node(&mut self, zone: Ustr, name: Ustr) -> Result<(), ApiError> {
        let lost_reply = self.api(ApiCall::DeleteNode, true)?;
        let Some(node) = self.nodes.get(name).filter(|n| n.zone == zone) else {
            return Err(ApiError::NotFound);
        };
        let qr = node.queued_resource;
        self.start_node_deletion(name);
        if let Some(qr) = qr
            && self
                .qrs
                .get(qr)
                .is_some_and(|q| matches!(q.state, QrState::Active | QrState::Provisioning))
        {
            self.suspend(qr);
        }
        let pool = self.nodes[name].pool;
        self.provision_waiting(pool);
        if lost_reply {
            Err(ApiError::Timeout)
        } else {
            Ok(())
        }
    }

    /// The calls of an inventory read that finds nothing changed, without listing: `zones`
    /// node listings, `adopted` node reads, then `zones` queued-resource listings, stopping
    /// at the first refusal as the reader does. For a controller pass the harness skips (it
    /// has nothing to do): its reads still count, use quota and may fail.
    pub fn idle_inventory_reads(&mut self, zones: usize, adopted: usize) -> Result<(), ApiError> {
        for _ in 0..zones {
            self.api(ApiCall::ListNodes, false)?;
        }
        for _ in 0..adopted {
            self.api(ApiCall::GetNode, false)?;
        }
        for _ in 0..zones {
            self.api(ApiCall::ListQueuedResources, false)?;
        }
        Ok(())
    }

    /// GET a node.
    pub fn get_node(&mut self, zone: Ustr, name: Ustr) -> Result<Option<NodeView<'_>>, ApiError> {
        self.api(ApiCall::GetNode, false)?;
        Ok(self
            .nodes
            .get(name)
            .filter(|n| n.zone == zone)
            .map(Node::view))
    }

    /// LIST the nodes of `zone` carrying label `key` = `value`, in name order (one call; the
    /// API's pages are not modelled). `known`: the version of an earlier listing of the zone
    /// the caller keeps (like an ETag); if no node of the zone changed since, the answer is
    /// `Unchanged` (the call still counts and can fail like any other).
    pub fn list_nodes<'a>(
        &'a mut self,
        zone: Ustr,
        label: (&'a str, &'a str),
        known: Option<u64>,
    ) -> Result<Listing<impl Iterator<Item = NodeView<'a>> + 'a>, ApiError> {
        self.api(ApiCall::ListNodes, false)?;
        let version = self.nodes.zone_version(zone);
        if known == Some(version) {
            return Ok(Listing::Unchanged);
        }
        let objects = self.peek_nodes(zone, label);
        Ok(Listing::Changed { version, objects })
    }

    /// What `list_nodes` lists in `zone`, without making a call (also for checks).
    pub fn peek_nodes<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
    ) -> impl Iterator<Item = NodeView<'a>> + 'a {
        self.nodes_where(zone, label, true)
    }

    /// What `list_queued_resources` lists in `zone`, without making a call (also for checks).
    pub fn peek_queued_resources<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
    ) -> impl Iterator<Item = QrView<'a>> + 'a {
        self.qrs_where(zone, label, true)
    }

    /// The nodes of `zone` that `list_nodes` with `label` leaves out (someone else's),
    /// without making a call.
    pub fn peek_other_nodes<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
    ) -> impl Iterator<Item = NodeView<'a>> + 'a {
        self.nodes_where(zone, label, false)
    }

    /// The queued resources of `zone` that `list_queued_resources` with `label` leaves out,
    /// without making a call.
    pub fn peek_other_queued_resources<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
    ) -> impl Iterator<Item = QrView<'a>> + 'a {
        self.qrs_where(zone, label, false)
    }

    /// The nodes of `zone` whose `label` is set as given (`labelled`), or not.
    fn nodes_where<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
        labelled: bool,
    ) -> impl Iterator<Item = NodeView<'a>> + 'a {
        let mut filter = LabelFilter::new(label);
        self.nodes
            .in_zone(zone)
            .filter(move |(_, n)| filter.matches(&n.labels) == labelled)
            .map(|(_, n)| n.view())
    }

    /// The queued resources of `zone` whose `label` is set as given (`labelled`), or not.
    fn qrs_where<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
        labelled: bool,
    ) -> impl Iterator<Item = QrView<'a>> + 'a {
        let mut filter = LabelFilter::new(label);
        self.qrs
            .in_zone(zone)
            .filter(move |(_, q)| filter.matches(&q.labels) == labelled)
            .map(|(_, q)| q.view())
    }

    /// The names of `zone`'s nodes changed since version `known` of its listing (an earlier
    /// `list_nodes` answer's), without making a call: a caller that keeps that listing may
    /// read just these (with `peek_node`) to bring it up to date. In order of change, possibly
    /// repeated; `None` when the cloud no longer knows (then list the zone whole).
    pub fn nodes_changed_since(
        &self,
        zone: Ustr,
        known: u64,
    ) -> Option<impl Iterator<Item = Ustr> + '_> {
        self.nodes.changed_since(zone, known)
    }

    /// The names of `zone`'s queued resources changed since version `known` of its listing
    /// (see `nodes_changed_since`).
    pub fn queued_resources_changed_since(
        &self,
        zone: Ustr,
        known: u64,
    ) -> Option<impl Iterator<Item = Ustr> + '_> {
        self.qrs.changed_since(zone, known)
    }

    /// What `get_node` would return, without making a call (for checks).
    pub fn peek_node(&self, zone: Ustr, name: Ustr) -> Option<NodeView<'_>> {
        self.nodes
            .get(name)
            .filter(|n| n.zone == zone)
            .map(Node::view)
    }

    /// Every node, in no particular order, without making a call (for the emulator's
    /// workers and for checks).
    pub fn all_nodes(&self) -> impl Iterator<Item = NodeView<'_>> + '_ {
        self.nodes.values().map(Node::view)
    }

    /// What `get_queued_resource` would return, without making a call.
    pub fn peek_queued_resource(&self, zone: Ustr, name: Ustr) -> Option<QrView<'_>> {
        self.qrs.get(name).filter(|q| q.zone == zone).map(Qr::view)
    }

    /// Adds a node that exists before the run (an adopted, on-demand TPU): READY, never
    /// preempted, outside every spot pool.
    pub fn add_existing_node(
        &mut self,
        zone: &str,
        name: &str,
        accelerator: &str,
        chips: u32,
        hosts: u32,
    ) {
        self.serial += 1;
        let (zone, key) = (Ustr::from(zone), Ustr::from(name));
        self.by_serial.insert(self.serial, (false, key));
        self.insert_node(
            key,
            Node {
                serial: self.serial,
                name: key,
                zone,
                accelerator: accelerator.to_owned(),
                pool: usize::MAX,
                state: NodeState::Ready,
                hosts,
                chips,
                labels: Labels::default(),
                queued_resource: None,
                active_since: Some(self.now),
                run: None,
                launched: Vec::new(),
                caches: BTreeSet::new(),
                spot: false,
                model: PoolModel::OnDemand,
                notice_at: None,
            },
        );
        self.version += 1;
    }

    /// GET a queued resource.
    pub fn get_queued_resource(
        &mut self,
        zone: Ustr,
        name: Ustr,
    ) -> Result<Option<QrView<'_>>, ApiError> {
        self.api(ApiCall::GetQueuedResource, false)?;
        Ok(self.qrs.get(name).filter(|q| q.zone == zone).map(Qr::view))
    }

    /// LIST the queued resources of `zone` carrying label `key` = `value`, in name order
    /// (`known` as for `list_nodes`).
    pub fn list_queued_resources<'a>(
        &'a mut self,
        zone: Ustr,
        label: (&'a str, &'a str),
        known: Option<u64>,
    ) -> Result<Listing<impl Iterator<Item = QrView<'a>> + 'a>, ApiError> {
        self.api(ApiCall::ListQueuedResources, false)?;
        let version = self.qrs.zone_version(zone);
        if known == Some(version) {
            return Ok(Listing::Unchanged);
        }
        let objects = self.peek_queued_resources(zone, label);
        Ok(Listing::Changed { version, objects })
    }

    /// The latency of the next call of `kind` made by the pass that started at `pass_at`
    /// (`call_latency_ms` numbering the pass's calls in order; a new `pass_at` starts again
    /// at 0). One numbering for every caller, so a pass made in process and one made over
    /// HTTP see the same latencies.
    pub fn take_call_latency_ms(&mut self, kind: CallKind, pass_at: Millis) -> Millis {
        if self.pass_calls.0 != pass_at {
            self.pass_calls = (pass_at, 0);
        }
        let index = self.pass_calls.1;
        self.pass_calls.1 += 1;
        self.call_latency_ms(kind, pass_at, index)
    }

    // ----- faults injected by hand (the emulator's control endpoints) -------------------

    /// Stocks out every pool of `zone` but its reservations (their capacity is held for
    /// the project) (`on`), or lifts it: a stocked-out pool offers no capacity, so its Spot
    /// TPUs beyond that are preempted (with notice) and its waiting requests wait. Returns
    /// the pools it applies to (0: no such zone).
    pub fn set_stockout(&mut self, zone: &str, on: bool) -> usize {
        let pools: Vec<usize> = (0..self.config.pools.len())
            .filter(|&p| {
                let pool = &self.config.pools[p];
                pool.zone == zone && pool.model != PoolModel::Reserved
            })
            .collect();
        for &pool in &pools {
            self.stocked_out[pool] = on;
            self.available[pool] = self.capacity_at(pool, self.now);
            self.enforce_capacity(pool);
            self.provision_waiting(pool);
        }
        self.version += 1;
        pools.len()
    }

    /// Whether node `name` of `zone` was given its preemption notice or is no longer up
    /// (what its metadata server's `instance/preempted` says: `None` when there is no node).
    pub fn preempted(&self, zone: Ustr, name: Ustr) -> Option<bool> {
        let node = self.nodes.get(name).filter(|n| n.zone == zone)?;
        Some(
            node.notice_at.is_some()
                || !matches!(node.state, NodeState::Creating | NodeState::Ready),
        )
    }

    /// Preempts the Spot node `name` of `zone` now (with the usual notice); false when there
    /// is no such READY Spot node.
    pub fn preempt_now(&mut self, zone: &str, name: &str) -> bool {
        let key = Ustr::from(name);
        let preemptible = self.nodes.get(key).is_some_and(|n| {
            n.zone == zone && n.spot && n.state == NodeState::Ready && n.notice_at.is_none()
        });
        if preemptible {
            *self
                .accounting
                .faults
                .entry("preempted_by_hand")
                .or_default() += 1;
            self.preempt(key);
            let pool = self.nodes.get(key).map_or(usize::MAX, |n| n.pool);
            self.provision_waiting(pool);
            self.version += 1;
        }
        preemptible
    }

    /// LIST every node of `zone`, whatever its labels, in name order (one call, as
    /// `list_nodes`).
    pub fn list_zone_nodes(
        &mut self,
        zone: &str,
    ) -> Result<impl Iterator<Item = NodeView<'_>> + '_, ApiError> {
        self.api(ApiCall::ListNodes, false)?;
        Ok(self.nodes.in_zone(Ustr::from(zone)).map(|(_, n)| n.view()))
    }

    /// LIST every queued resource of `zone`, whatever its labels, in name order.
    pub fn list_zone_queued_resources(
        &mut self,
        zone: &str,
    ) -> Result<impl Iterator<Item = QrView<'_>> + '_, ApiError> {
        self.api(ApiCall::ListQueuedResources, false)?;
        Ok(self.qrs.in_zone(Ustr::from(zone)).map(|(_, q)| q.view()))
    }

    // ----- workers --------------------------------------------------------------------

    /// Registers how a job behaves (at its arrival).
    pub fn register_job(&mut self, job_id: &str, behaviour: JobBehaviour) {
        self.jobs.entry(Ustr::from(job_id)).or_insert(JobProgress {
            behaviour,
            checkpointed_secs: 0.0,
            attempts: 0,
        });
    }

    /// Starts `attempt` of `job_id` on every worker of the node (idempotent per attempt).
    pub fn launch(
        &mut self,
        zone: Ustr,
        node_name: Ustr,
        attempt: Ustr,
        job_id: Ustr,
    ) -> Result<(), RemoteError> {
        self.api_calls[ApiCall::Launch as usize] += 1;
        if self.runs.contains_key(&attempt) {
            return Ok(());
        }
        let Some(node) = self.nodes.get(node_name).filter(|n| n.zone == zone) else {
            return Err(RemoteError::NotFound);
        };
        if node.state != NodeState::Ready {
            return Err(if node.state == NodeState::Creating {
                RemoteError::Temporary
            } else {
                RemoteError::NotFound
            });
        }
        if let Some(other) = node.run {
            // The launch script stops whatever still runs there: an engine bug if it ever
            // happens to a live attempt (dead workers leave nothing to stop).
            if self
                .runs
                .get(&other)
                .is_some_and(|r| r.alive && r.state != RunState::Ended)
            {
                self.accounting.attempts_displaced += 1;
            }
            self.kill_run(other);
        }
        let cache = self
            .jobs
            .get(&job_id)
            .and_then(|j| j.behaviour.cache_key.clone());
        let node_slot = self.nodes.slot_of(node_name).expect("exists");
        let node = self.nodes.get_mut(node_name).expect("exists");
        let warm = cache.as_ref().is_some_and(|c| node.caches.contains(c));
        node.run = Some(attempt);
        node.launched.push(attempt);
        let (serial, hosts, chips) = (node.serial, node.hosts, node.chips);
        let latency = if warm {
            self.config.workers.setup_warm
        } else {
            self.config.workers.setup
        };
        let setup = sample(&mut self.rng_workers, latency).max(1.0);
        self.runs.insert(
            attempt,
            Run {
                job_id,
                node_serial: serial,
                node_key: node_name,
                node_slot,
                hosts,
                chips,
                state: RunState::Setup,
                run_start: self.now,
                outcome: Outcome::Success,
                alive: true,
                last_heartbeat: self.now,
                statuses: Vec::new(),
                saved_at_notice: None,
            },
        );
        self.touch_run(attempt);
        self.version += 1;
        self.push(
            self.now + (setup * 1000.0) as u64,
            Event::SetupDone { attempt },
        );
        Ok(())
    }

    fn setup_done(&mut self, attempt: Ustr) {
        let now = self.now;
        let Some(run) = self.runs.get(&attempt) else {
            return;
        };
        if run.state != RunState::Setup || !run.alive {
            return;
        }
        let job_id = run.job_id;
        let workers = self.config.workers;
        let behaviour = self.jobs.get(&job_id).map(|j| j.behaviour.clone());
        let Some(behaviour) = behaviour else { return };
        let progress = self.jobs.get_mut(&job_id).expect("registered");
        progress.attempts += 1;
        let remaining = (behaviour.work_secs - progress.checkpointed_secs).max(0.0);
        // One draw per outcome from the job's own stream, so other jobs never shift it.
        let mut rng = SimRng::new(
            self.config.seed,
            &format!("job/{job_id}/{}", progress.attempts),
        );
        let faults_active = self.faults_active(now);
        self.touch_run(attempt);
        let run = self.runs.get_mut(&attempt).expect("exists");
        if rng.chance(behaviour.setup_failure) {
            run.outcome = Outcome::SetupFailure;
            run.state = RunState::Ended;
            run.statuses = vec![WorkerStatusView {
                host: Ustr::from("w0"),
                state: "failed_setup",
                exit_code: None,
                finished_at: now,
                infrastructure_failure: None,
            }];
            self.finish_run_on_node(attempt);
            return;
        }
        run.state = RunState::Running;
        run.run_start = now;
        let (outcome, duration) = if rng.chance(behaviour.app_failure) {
            (Outcome::AppFailure, remaining * rng.uniform())
        } else if rng.chance(behaviour.infra_failure) {
            (Outcome::InfraFailure, remaining * rng.uniform())
        } else if run.hosts > 1 && faults_active && rng.chance(workers.partial_failure) {
            (Outcome::PartialFailure, remaining * rng.uniform())
        } else {
            (Outcome::Success, remaining)
        };
        run.outcome = outcome;
        if outcome == Outcome::PartialFailure {
            *self.accounting.faults.entry("partial_failure").or_default() += 1;
        }
        self.version += 1;
        self.push(
            now + (duration.max(0.001) * 1000.0) as u64,
            Event::RunEnd { attempt },
        );
        if workers.silent_death_per_hour > 0.0 {
            let at = rng.exponential(3600.0 / workers.silent_death_per_hour);
            if at < duration && self.faults_active(now + (at * 1000.0) as u64) {
                self.push(now + (at * 1000.0) as u64, Event::SilentDeath { attempt });
            }
        }
    }

    fn finish_run_on_node(&mut self, attempt: Ustr) {
        if let Some(run) = self.runs.get(&attempt)
            && let Some(node) = self.nodes.get_mut(run.node_key)
            && node.run == Some(attempt)
        {
            node.run = None;
        }
        self.version += 1;
    }

    fn run_end(&mut self, attempt: Ustr) {
        let now = self.now;
        let missing = self.config.workers.missing_status;
        let Some(run) = self.runs.get(&attempt).cloned() else {
            return;
        };
        if run.state != RunState::Running || !run.alive {
            return;
        }
        let duration = (now - run.run_start) as f64 / 1000.0;
        let hosts = run.hosts;
        // Kept with the run for the rest of the simulation: sized to the hosts, not grown.
        let mut statuses = Vec::with_capacity(hosts as usize);
        for h in 0..hosts {
            let host = Ustr::from(&format!("w{h}"));
            let (state, code, marker) = match run.outcome {
                Outcome::Success => ("succeeded", 0, None),
                Outcome::AppFailure => ("failed", if h == 0 { 1 } else { 143 }, None),
                Outcome::InfraFailure => {
                    if h == 0 {
                        ("failed", 134, Some("slice_failure_chip_driver_error"))
                    } else {
                        ("failed", 143, None)
                    }
                }
                Outcome::PartialFailure => {
                    if h == 0 {
                        ("failed", 1, None)
                    } else {
                        continue; // peers keep running until cancelled
                    }
                }
                Outcome::SetupFailure => ("failed_setup", 2, None),
            };
            if self.rng_workers.chance(missing) && self.faults_active(now) {
                *self.accounting.faults.entry("status_lost").or_default() += 1;
                continue;
            }
            statuses.push(WorkerStatusView {
                host,
                state,
                exit_code: Some(code),
                finished_at: now,
                infrastructure_failure: marker,
            });
        }
        match run.outcome {
            Outcome::Success => {
                self.accounting.busy_chip_secs += duration * run.chips as f64;
                if let Some(p) = self.jobs.get_mut(&run.job_id) {
                    p.checkpointed_secs = p.behaviour.work_secs;
                    if let Some(c) = p.behaviour.cache_key.clone()
                        && let Some(node) = self.nodes.get_mut(run.node_key)
                    {
                        node.caches.insert(c);
                    }
                }
            }
            _ => self.account_interruption(run.job_id, duration, run.chips, run.saved_at_notice),
        }
        let partial = run.outcome == Outcome::PartialFailure;
        self.touch_run(attempt);
        let r = self.runs.get_mut(&attempt).expect("exists");
        r.statuses = statuses;
        r.last_heartbeat = now;
        if partial {
            // One worker failed; the others keep running (and heartbeating) until cancelled.
            r.state = RunState::Running;
            r.run_start = now;
            self.version += 1;
        } else {
            r.state = RunState::Ended;
            r.alive = false;
            self.finish_run_on_node(attempt);
        }
    }

    /// Stops `attempt` on the node (every worker writes status 143).
    /// With a `notice` (the controller stops the run to start it again later), a job that
    /// checkpoints on notice saves its progress first, as at a Spot preemption notice.
    pub fn cancel(
        &mut self,
        zone: Ustr,
        node_name: Ustr,
        attempt: Ustr,
        notice: bool,
    ) -> Result<CancelResult, RemoteError> {
        self.api_calls[ApiCall::Cancel as usize] += 1;
        let Some(node) = self.nodes.get(node_name).filter(|n| n.zone == zone) else {
            return Err(RemoteError::NotFound);
        };
        if node.state != NodeState::Ready {
            return Err(RemoteError::Temporary);
        }
        match self.runs.get(&attempt) {
            None => {
                return Ok(if node.run.is_some() {
                    CancelResult::Mismatch
                } else {
                    CancelResult::NotRunning
                });
            }
            Some(run) if run.node_key != node_name => return Ok(CancelResult::Mismatch),
            Some(run) if run.state == RunState::Ended || !run.alive => {
                return Ok(CancelResult::NotRunning);
            }
            Some(_) => {}
        }
        let now = self.now;
        let run = self.runs.get(&attempt).cloned().expect("checked");
        if run.state == RunState::Running {
            let progress = (now - run.run_start) as f64 / 1000.0;
            let saves = notice
                && self
                    .jobs
                    .get(&run.job_id)
                    .is_some_and(|p| p.behaviour.checkpoint_on_notice);
            self.account_interruption(
                run.job_id,
                progress,
                run.chips,
                if saves {
                    Some(progress)
                } else {
                    run.saved_at_notice
                },
            );
        }
        self.touch_run(attempt);
        let r = self.runs.get_mut(&attempt).expect("checked");
        let have: BTreeSet<Ustr> = r.statuses.iter().map(|s| s.host).collect();
        for h in 0..r.hosts {
            let host = Ustr::from(&format!("w{h}"));
            if !have.contains(&host) {
                r.statuses.push(WorkerStatusView {
                    host,
                    state: "failed",
                    exit_code: Some(143),
                    finished_at: now,
                    infrastructure_failure: None,
                });
            }
        }
        r.state = RunState::Ended;
        r.alive = false;
        self.finish_run_on_node(attempt);
        Ok(CancelResult::Sent)
    }

    /// What the workers of `attempt` show now (`None` if it was never launched).
    pub fn attempt(&self, attempt: Ustr) -> Option<AttemptView> {
        let run = self.runs.get(&attempt)?;
        let node_alive = self
            .nodes
            .at(run.node_slot)
            .is_some_and(|n| n.serial == run.node_serial && n.state == NodeState::Ready);
        let beating = run.alive && node_alive;
        let heartbeat = if beating {
            self.now
        } else {
            run.last_heartbeat.max(run.run_start)
        };
        Some(AttemptView {
            launched: true,
            statuses: run.statuses.clone(),
            heartbeat_at: Some(heartbeat),
            beating,
        })
    }

    /// The attempts whose `attempt` view may have changed since the last call (a superset,
    /// in no particular order, repeats possible), other than the heartbeat of a beating run
    /// moving with time. A reader that keeps views between calls re-reads only these.
    pub fn take_report_changes(&mut self) -> Vec<Ustr> {
        std::mem::take(&mut self.report_changes)
    }

    fn touch_run(&mut self, attempt: Ustr) {
        self.report_changes.push(attempt);
    }

    /// Marks every attempt launched on node `key` changed (the node is going away).
    fn touch_node_runs(&mut self, key: Ustr) {
        if let Some(node) = self.nodes.get(key) {
            self.report_changes.extend(node.launched.iter().copied());
        }
    }

    /// Attempt ids running (alive) on each node, for invariant checks: (zone, node) → attempts.
    pub fn live_runs(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (id, run) in &self.runs {
            if run.alive && run.state != RunState::Ended {
                out.entry(run.node_key.to_string())
                    .or_default()
                    .push(id.to_string());
            }
        }
        for ids in out.values_mut() {
            ids.sort();
        }
        out
    }

    /// Node names of live capacity (nodes creating or ready, queued resources waiting,
    /// provisioning or active) grouped by the value of label `label`.
    pub fn live_capacity_by_label(&self, label: &str) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for n in self
            .nodes
            .values()
            .filter(|n| matches!(n.state, NodeState::Creating | NodeState::Ready))
        {
            if let Some(v) = n.labels.get(label) {
                out.entry(v.clone()).or_default().insert(n.name.to_string());
            }
        }
        for q in self.qrs.values().filter(|q| {
            matches!(
                q.state,
                QrState::WaitingForResources | QrState::Provisioning | QrState::Active
            )
        }) {
            if let Some(v) = q.labels.get(label) {
                out.entry(v.clone())
                    .or_default()
                    .insert(q.node_id.to_string());
            }
        }
        out
    }

    /// Live (Creating/Ready) nodes per pool, in pool order (existing nodes are in none).
    pub fn live_per_pool(&self) -> Vec<u32> {
        let mut out = vec![0; self.config.pools.len()];
        for n in self
            .nodes
            .values()
            .filter(|n| matches!(n.state, NodeState::Creating | NodeState::Ready))
        {
            if let Some(count) = out.get_mut(n.pool) {
                *count += 1;
            }
        }
        out
    }

    /// Live (Creating/Ready) nodes per accelerator type and zone: (zone, type) → count.
    pub fn live_nodes(&self) -> BTreeMap<(String, String), u32> {
        let mut out = BTreeMap::new();
        for n in self
            .nodes
            .values()
            .filter(|n| matches!(n.state, NodeState::Creating | NodeState::Ready))
        {
            *out.entry((n.zone.to_string(), n.accelerator.clone()))
                .or_default() += 1;
        }
        out
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
