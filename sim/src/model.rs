//! Configuration of the simulated cloud: capacity pools per zone and accelerator type, their
//! availability over time, preemption, provisioning latency, API faults and worker behaviour.
//! Plain data; defaults and their sources are documented in the scenario reference.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::trace::SpotTrace;

/// Everything the simulated cloud needs to know.
#[derive(Clone, Debug)]
pub struct CloudConfig {
    /// Run seed; every random stream derives from it.
    pub seed: u64,
    /// Capacity pools.
    pub pools: Vec<PoolConfig>,
    /// Provisioning latency per region (default for regions not listed).
    pub provisioning: Latency,
    /// Per-region overrides of the provisioning latency.
    pub provisioning_by_region: BTreeMap<String, Latency>,
    /// Seconds a deletion takes (also how long a queued resource stays SUSPENDING after
    /// losing its node).
    pub delete_secs: f64,
    /// Seconds between a Spot preemption notice and the TPU going away (GCP: 30 s).
    pub preemption_notice_secs: f64,
    /// API behaviour.
    pub api: ApiConfig,
    /// How long API calls take.
    pub api_latency: ApiLatency,
    /// Per-project API quotas (calls over them are refused with 429).
    pub api_quota: ApiQuota,
    /// Worker behaviour.
    pub workers: WorkerConfig,
    /// Injected cloud faults.
    pub faults: CloudFaults,
}

/// Cloud faults injected at random (each a rate per object-hour), active until `until_secs`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CloudFaults {
    /// Waiting queued resources that fail (state FAILED).
    pub qr_failure_per_hour: f64,
    /// Queued resources that vanish with their node, without any notice.
    pub qr_vanish_per_hour: f64,
    /// Ready nodes that vanish without a status (their queued resource stays ACTIVE).
    pub node_vanish_per_hour: f64,
    /// Faults (these and the API error rates) stop at this simulated second (0 = never).
    pub until_secs: u64,
}

/// A log-normal latency given by its median and shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    /// Median seconds.
    pub median_secs: f64,
    /// Log-normal shape (0 = constant).
    pub sigma: f64,
}

/// How a pool's capacity is paid for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PoolModel {
    /// Spot: preemptible, billed while held, at the Spot price.
    #[default]
    Spot,
    /// On-demand: never preempted, billed while held, at the list price.
    OnDemand,
    /// A reservation: never preempted, its whole size billed for the whole run whether held
    /// or not (what GCP charges for a reservation), at the list price.
    Reserved,
}

impl PoolModel {
    /// `spot`, `on-demand` or `reserved` (the cost key's suffix).
    pub fn as_str(self) -> &'static str {
        match self {
            PoolModel::Spot => "spot",
            PoolModel::OnDemand => "on-demand",
            PoolModel::Reserved => "reserved",
        }
    }
}

/// Capacity of one accelerator type in one zone under one provisioning model.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Zone.
    pub zone: String,
    /// Accelerator type (`v6e-16`).
    pub accelerator: String,
    /// Spot, on-demand or a reservation.
    pub model: PoolModel,
    /// The reservation's name (`Reserved` pools): requests naming another are refused.
    pub reservation: Option<String>,
    /// Chips per slice.
    pub chips: u32,
    /// Hosts (workers) per slice.
    pub hosts: u32,
    /// Slices available over time.
    pub capacity: Capacity,
    /// Random preemptions per node-hour while ACTIVE.
    pub preemption_per_hour: f64,
    /// Windows `[from, until)` (seconds) with no capacity at all (regional stockouts).
    pub outages: Vec<(u64, u64)>,
    /// A drop in capacity preempts the newest slices above it (true), or only stops new
    /// grants (false: a stockout of new capacity, as an availability probe sees it).
    pub reclaims: bool,
}

/// How many slices a pool offers over time.
#[derive(Clone, Debug)]
pub enum Capacity {
    /// As many as asked for.
    Unlimited,
    /// A fixed number.
    Constant(u32),
    /// Alternating available/stocked-out periods with exponential lengths.
    OnOff {
        /// Slices while available.
        slices: u32,
        /// Mean length of an available period.
        mean_on_secs: f64,
        /// Mean length of a stockout.
        mean_off_secs: f64,
    },
    /// Steps `(from_secs, slices)` sorted by time, each holding until the next (before the
    /// first: the first's value); `u32::MAX` is unlimited. What a capture saw.
    Schedule(Arc<[(u64, u32)]>),
    /// A spot availability trace, `scale` slices per trace instance.
    Trace {
        /// The trace.
        trace: Arc<SpotTrace>,
        /// Slices per instance in the trace.
        scale: u32,
        /// Where in the trace the run starts.
        offset_secs: u64,
    },
}

/// API behaviour: error rates per call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ApiConfig {
    /// Probability a call is refused with HTTP 429.
    pub rate_limited: f64,
    /// Probability a call fails with a 5xx before doing anything.
    pub unavailable: f64,
    /// Probability a call times out (its effect may or may not have happened).
    pub timeout: f64,
    /// Probability a mutation succeeds but its reply is lost (reported as a timeout).
    pub lost_reply: f64,
}

/// How long API calls take. The controller reads its inventory concurrently (one batch) and
/// makes its mutations and worker calls one after another, so a pass with many actions
/// takes longer and the next one starts later.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ApiLatency {
    /// One inventory read (all exact-name GETs of a pass, in parallel).
    pub read: Latency,
    /// One mutation (create or delete a queued resource or node).
    pub mutation: Latency,
    /// One worker call over SSH (launch or cancel an attempt).
    pub remote: Latency,
}

impl ApiLatency {
    /// Calls that take no time.
    pub const ZERO: ApiLatency = ApiLatency {
        read: Latency {
            median_secs: 0.0,
            sigma: 0.0,
        },
        mutation: Latency {
            median_secs: 0.0,
            sigma: 0.0,
        },
        remote: Latency {
            median_secs: 0.0,
            sigma: 0.0,
        },
    };
}

/// Per-project API quotas as calls per minute (0 = unlimited), enforced as token buckets
/// holding one minute of calls; a refused call uses no quota.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ApiQuota {
    /// Inventory reads (GET of a node or queued resource) per minute.
    pub reads_per_minute: f64,
    /// Creates and deletes per minute.
    pub mutations_per_minute: f64,
}

/// Kinds of API call, for [`ApiLatency`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// Inventory read.
    Read,
    /// Create or delete.
    Mutation,
    /// Launch or cancel over SSH.
    Remote,
}

/// Worker behaviour.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkerConfig {
    /// Set-up time (bundle download, caches) without a warm cache.
    pub setup: Latency,
    /// Set-up time with a warm cache of the job's cache key on the TPU.
    pub setup_warm: Latency,
    /// Probability each worker's final status object is lost.
    pub missing_status: f64,
    /// Workers of a running attempt die silently (no status, no heartbeat) at this rate per hour.
    pub silent_death_per_hour: f64,
    /// Probability one worker of an attempt fails while its peers keep running.
    pub partial_failure: f64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            setup: Latency {
                median_secs: 120.0,
                sigma: 0.3,
            },
            setup_warm: Latency {
                median_secs: 30.0,
                sigma: 0.3,
            },
            missing_status: 0.0,
            silent_death_per_hour: 0.0,
            partial_failure: 0.0,
        }
    }
}

/// How one job behaves on the workers (known to the simulated world, not to the engine).
#[derive(Clone, Debug, PartialEq)]
pub struct JobBehaviour {
    /// Seconds of computation the job needs in total.
    pub work_secs: f64,
    /// Seconds between checkpoints (progress since the last one is lost on interruption);
    /// 0 means no checkpoints.
    pub checkpoint_secs: f64,
    /// Probability an attempt fails in the application.
    pub app_failure: f64,
    /// Probability an attempt hits an infrastructure failure (slice failure).
    pub infra_failure: f64,
    /// Probability the runner's set-up fails.
    pub setup_failure: f64,
    /// Cache key warmed by the job on its TPU.
    pub cache_key: Option<String>,
    /// The job saves a checkpoint when its TPU gets a preemption notice (only the seconds of
    /// the notice itself are lost).
    pub checkpoint_on_notice: bool,
}

impl JobBehaviour {
    /// `work_secs` of computation and nothing else: no checkpoints, failures or cache.
    pub fn plain(work_secs: f64) -> JobBehaviour {
        JobBehaviour {
            work_secs,
            checkpoint_secs: 0.0,
            app_failure: 0.0,
            infra_failure: 0.0,
            setup_failure: 0.0,
            cache_key: None,
            checkpoint_on_notice: false,
        }
    }
}
