//! Scenario files (`scenarios/*.yaml`): a fleet, the cloud model, the workload, the horizon,
//! seeds and policies. Read with the same strict, error-collecting reader as the fleet, so a
//! mistake names the file, line, column and field. Loads the files a scenario refers to
//! (fleet, traces, CSV columns) relative to the scenario file. The top level and the fleet and
//! policies live here; `cloud` reads the cloud model and `workload` the workloads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use tpu_runner_sim::workload::{Dist, JobArrival, Synthetic, TraceReplay};
use tpu_runner_sim::{ApiConfig, ApiLatency, ApiQuota, Capacity, Latency, WorkerConfig};

use crate::spec::yaml::{self, Checker, Fields, Node, Value};
use crate::spec::{
    FleetSpec, PolicyName, PolicySpec, ProvisioningModel, SpecErrors, TpuType, parse_fleet,
};

mod cloud;
mod workload;

pub use cloud::{DEFAULT_DATA_GB_PER_ATTEMPT, DEFAULT_EGRESS_USD_PER_GB, default_prices};
use cloud::{default_cloud, read_api, read_cloud, read_prices};
use workload::{read_initial_state, read_workloads};

/// A validated scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Name (file stem unless given).
    pub name: String,
    /// What it shows.
    pub description: String,
    /// The scenario file.
    pub path: PathBuf,
    /// The fleet.
    pub fleet: FleetSpec,
    /// Simulated seconds.
    pub horizon_secs: u64,
    /// Seeds run when the command line gives none.
    pub seeds: Vec<u64>,
    /// Policies compared when the command line gives none, by label: a policy name (the
    /// fleet's own policy when it is the fleet's, else that policy's defaults) or a variant
    /// of `variants`.
    pub policies: Vec<String>,
    /// Policy variants the scenario names (`policies: {frugal-5m: {name: frugal,
    /// race_after: 5m}}`), each laid over the fleet's policy.
    pub variants: BTreeMap<String, PolicySpec>,
    /// Cloud model.
    pub cloud: CloudSpec,
    /// Workloads (concatenated).
    pub workloads: Vec<WorkloadSpec>,
    /// TPU types a job of each width (chips) accepts.
    pub types_by_width: BTreeMap<u32, Vec<TpuType>>,
    /// USD per chip-hour by family: (spot, on-demand).
    pub prices: BTreeMap<String, (f64, f64)>,
    /// USD per GB moved between regions.
    pub egress_usd_per_gb: f64,
    /// USD per chip-hour of adopted TPUs (None: the family's on-demand price; 0 for TPU
    /// Research Cloud quota, which is free).
    pub adopted_usd_per_chip_hour: Option<f64>,
    /// Data read per job attempt from its bucket, in GB (for egress when regions differ).
    pub data_gb_per_attempt: f64,
    /// Faults switched on by the scenario (`chaos:`), if any.
    pub chaos: Option<ChaosSpec>,
}

/// Injected faults of a chaos run and how long they last.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChaosSpec {
    /// Faults stop at this simulated second; liveness is checked after.
    pub stop_secs: u64,
    /// A pending job that fits must start within this many seconds once faults stopped.
    pub liveness_secs: i64,
    /// API error rates.
    pub api: ApiConfig,
    /// Cloud object faults.
    pub faults: tpu_runner_sim::CloudFaults,
    /// Probability each worker's status object is lost.
    pub missing_status: f64,
    /// Workers dying silently, per attempt-hour.
    pub silent_death_per_hour: f64,
    /// Probability one worker fails alone.
    pub partial_failure: f64,
    /// Probability a pass sees the previous pass's (stale) observation.
    pub stale_observation: f64,
    /// Probability the controller crashes during a pass (before commit, after commit, or
    /// while acting) and restarts from the stored state.
    pub crash: f64,
    /// Probability per pass that a controller of an older deployment tries to act.
    pub stale_controller: f64,
}

impl ChaosSpec {
    /// The faults `--chaos` switches on for a scenario without a `chaos:` section: every
    /// injector at a rate that fires many times per simulated day, stopping at 3/4 of the
    /// horizon, with a 2-hour liveness bound.
    pub fn defaults(horizon_secs: u64) -> ChaosSpec {
        ChaosSpec {
            stop_secs: horizon_secs * 3 / 4,
            liveness_secs: 7200,
            api: ApiConfig {
                rate_limited: 0.03,
                unavailable: 0.02,
                timeout: 0.01,
                lost_reply: 0.02,
            },
            faults: tpu_runner_sim::CloudFaults {
                qr_failure_per_hour: 0.2,
                qr_vanish_per_hour: 0.03,
                node_vanish_per_hour: 0.03,
                until_secs: 0,
            },
            missing_status: 0.03,
            silent_death_per_hour: 0.05,
            partial_failure: 0.05,
            stale_observation: 0.03,
            crash: 0.02,
            stale_controller: 0.02,
        }
    }
}

/// The cloud model of a scenario.
#[derive(Clone, Debug)]
pub struct CloudSpec {
    /// Default provisioning latency.
    pub provisioning: Latency,
    /// Per-region provisioning latency.
    pub provisioning_by_region: BTreeMap<String, Latency>,
    /// Seconds a deletion takes (and a queued resource stays SUSPENDING after losing its
    /// node).
    pub delete_secs: f64,
    /// Queued resources waiting for capacity that fail (FAILED), per request-hour.
    pub qr_failure_per_hour: f64,
    /// Seconds between a Spot preemption notice and the TPU going away.
    pub preemption_notice_secs: f64,
    /// How long API calls take.
    pub api_latency: ApiLatency,
    /// Per-project API quotas.
    pub api_quota: ApiQuota,
    /// API error rates.
    pub api: ApiConfig,
    /// Worker behaviour.
    pub workers: WorkerConfig,
    /// Capacity per (zone, type).
    pub pools: Vec<PoolSpec>,
}

/// Capacity of one (zone, type, provisioning model).
#[derive(Clone, Debug)]
pub struct PoolSpec {
    /// Zone.
    pub zone: String,
    /// Type.
    pub tpu_type: TpuType,
    /// Spot, on-demand or a reservation.
    pub model: ProvisioningModel,
    /// The reservation's name (`reserved` pools).
    pub reservation: Option<String>,
    /// Slices over time.
    pub capacity: Capacity,
    /// Random preemptions per node-hour.
    pub preemption_per_hour: f64,
    /// Stockout windows (seconds).
    pub outages: Vec<(u64, u64)>,
    /// A drop in capacity preempts slices above it (`reclaim: true`, the default).
    pub reclaims: bool,
}

/// One workload.
#[derive(Clone, Debug)]
pub enum WorkloadSpec {
    /// Generated.
    Synthetic(Synthetic),
    /// Replayed from a CSV trace.
    Trace(TraceReplay),
    /// Jobs captured from production (`kind: jobs`), each with its own types and regions.
    Jobs(Vec<JobArrival>),
    /// The active jobs of a state snapshot (`initial_state`), all there at the start.
    Queue(LiveQueue),
}

/// The queue of a state snapshot: its pending and running jobs, submitted at the start in
/// their order, each needing work drawn from `duration` (a snapshot says nothing of it; a
/// running job starts again, as after a preemption without a checkpoint).
#[derive(Clone, Debug, PartialEq)]
pub struct LiveQueue {
    /// The jobs, their work to be drawn.
    pub jobs: Vec<JobArrival>,
    /// Work per job.
    pub duration: Dist,
}

impl LiveQueue {
    /// The jobs with their work drawn for `seed`.
    pub fn generate(&self, seed: u64) -> Vec<JobArrival> {
        let mut rng = tpu_runner_sim::SimRng::new(seed, "initial_state");
        self.jobs
            .iter()
            .map(|j| {
                let mut j = j.clone();
                j.behaviour.work_secs = self.duration.sample(&mut rng).max(1.0);
                j
            })
            .collect()
    }
}

/// Hosts (workers) of a slice: single-host up to 8 chips, 4 chips per host beyond.
pub fn hosts_of(tpu_type: &TpuType) -> u32 {
    let chips = tpu_type.chips();
    if chips <= 8 { 1 } else { chips / 4 }
}

/// Where data files the repository does not carry come from.
const DATA_HINT: &str = "a `$TRACES/...` file is read from `--traces DIR` or TPU_RUNNER_TRACES; \
                         scenarios/traces/README.md says where to fetch the spot traces";

/// Where a scenario's files are: relative paths from the scenario's folder; `$TRACES/…`
/// from the traces folder (`--traces DIR` or `TPU_RUNNER_TRACES`), for data the repository
/// may not carry (the unlicensed spot traces).
#[derive(Clone, Debug, Default)]
pub struct Dirs {
    /// The scenario file's folder.
    pub scenario: PathBuf,
    /// The traces folder, if given.
    pub traces: Option<PathBuf>,
}

impl Dirs {
    /// The path of `file` as written in the scenario.
    pub fn join(&self, file: impl AsRef<Path>) -> PathBuf {
        let file = file.as_ref();
        match file.strip_prefix("$TRACES") {
            Ok(rest) => match &self.traces {
                Some(traces) => traces.join(rest),
                // Left as written: reading it fails with the hint above.
                None => file.to_path_buf(),
            },
            Err(_) => self.scenario.join(file),
        }
    }
}

/// Why a scenario could not be loaded.
#[derive(Debug)]
pub enum ScenarioError {
    /// The scenario file itself could not be read.
    Io(String),
    /// Files it names (fleet, traces) could not be read, and nothing else is wrong: typically
    /// the public traces are not beside the repository.
    Missing(SpecErrors),
    /// Problems in the file.
    Invalid(SpecErrors),
}

impl std::fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScenarioError::Io(m) => writeln!(f, "error: {m}"),
            ScenarioError::Missing(e) | ScenarioError::Invalid(e) => f.write_str(&e.render()),
        }
    }
}

const TOP: &[&str] = &[
    "name",
    "description",
    "fleet",
    "horizon_hours",
    "seeds",
    "policies",
    "cloud",
    "workload",
    "types_by_width",
    "prices",
    "egress_usd_per_gb",
    "adopted_usd_per_chip_hour",
    "data_gb_per_attempt",
    "chaos",
    "initial_state",
];

/// Reads a scenario file.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    load_with(path, None)
}

/// Loads a scenario file with `$TRACES/…` files read from `traces` (default: the
/// environment variable `TPU_RUNNER_TRACES`).
pub fn load_with(path: &Path, traces: Option<&Path>) -> Result<Scenario, ScenarioError> {
    let text = crate::files::read_text(path, crate::files::SPEC_LIMIT)
        .map_err(|e| ScenarioError::Io(format!("cannot read `{}`: {e}", path.display())))?;
    parse_with(path, &text, traces)
}

/// Parses scenario text; files it names are resolved relative to `path`'s directory.
pub fn parse(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
    parse_with(path, text, None)
}

/// Parses scenario text with `$TRACES/…` files read from `traces` (default:
/// `TPU_RUNNER_TRACES`).
pub fn parse_with(
    path: &Path,
    text: &str,
    traces: Option<&Path>,
) -> Result<Scenario, ScenarioError> {
    let file = path.display().to_string();
    let root = yaml::parse(&file, text).map_err(ScenarioError::Invalid)?;
    let dir = Dirs {
        scenario: path.parent().map(Path::to_path_buf).unwrap_or_default(),
        traces: traces
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("TPU_RUNNER_TRACES").map(PathBuf::from)),
    };
    let mut c = Checker::new(text);
    let mut unreadable = 0;
    let scenario = read(&mut c, &root, path, &dir, &mut unreadable);
    let only_unreadable = unreadable > 0 && c.error_count() == unreadable;
    let scenario = c.finish(&file, scenario).map_err(if only_unreadable {
        ScenarioError::Missing
    } else {
        ScenarioError::Invalid
    })?;
    scenario.ok_or_else(|| ScenarioError::Io(format!("`{file}` could not be read")))
}

fn read(
    c: &mut Checker<'_>,
    root: &Node,
    path: &Path,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Scenario> {
    if matches!(root.value, Value::Null) {
        c.error_hint(
            root,
            "",
            "the file is empty; expected a scenario mapping",
            "see scenarios/README.md for the format",
        );
        return None;
    }
    let moved = [
        (
            "engine",
            "the engine's timings are part of the fleet's policy, read alike by the simulator and the controller: set `policy: {engine: {…}}` in the fleet (durations such as `15m`)",
        ),
        (
            "reconcile_interval_secs",
            "the pass interval is part of the fleet's policy: set `policy: {engine: {reconcile_interval: 30s}}` in the fleet",
        ),
    ];
    let f = c.mapping(root, "", "a scenario", TOP, &moved)?;
    let name = match f.get("name") {
        Some(n) => c.nonempty_string(n, "name", "a scenario name")?,
        None => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scenario".into()),
    };
    let description = f
        .get("description")
        .and_then(|n| c.string(n, "description", "a text"))
        .unwrap_or_default();
    let fleet = f
        .required(c, "fleet", "a path to a deployment.yaml or an inline fleet")
        .and_then(|n| read_fleet(c, n, dir, unreadable));
    let horizon_secs = f
        .required(c, "horizon_hours", "the simulated duration in hours")
        .and_then(|n| {
            c.number(
                n,
                "horizon_hours",
                0.001,
                24.0 * 366.0,
                "a positive number of hours (at most a year)",
            )
        })
        .map(|h| (h * 3600.0) as u64);
    let seeds = match f.get("seeds") {
        Some(n) => c.list(n, "seeds", "a list of seeds", false).map(|items| {
            items
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    c.integer(
                        s,
                        yaml::index("seeds", i),
                        0,
                        i64::MAX,
                        "a non-negative integer",
                    )
                    .map(|v| v as u64)
                })
                .collect()
        }),
        None => Some(vec![1]),
    };
    // Variants are laid over the fleet's policy (checked even when the fleet is not
    // readable, over the default one, so every problem is reported at once).
    let default_policy = PolicySpec::default();
    let base = fleet.as_ref().map_or(&default_policy, |f| &f.policy);
    let (policies, variants) = match f.get("policies") {
        Some(n) => read_policies(c, n, base),
        None => Some((vec![base.name.as_str().to_owned()], BTreeMap::new())),
    }
    .unzip();
    let types_by_width = f
        .required(
            c,
            "types_by_width",
            "a mapping of job widths (chips) to TPU types",
        )
        .and_then(|n| read_types_by_width(c, n));
    let cloud = match (f.get("cloud"), &fleet) {
        (Some(n), Some(fleet)) => read_cloud(c, n, fleet, dir, unreadable),
        (None, Some(fleet)) => Some(default_cloud(fleet)),
        _ => None,
    };
    let initial = match (f.get("initial_state"), &fleet) {
        (Some(n), Some(fleet)) => read_initial_state(c, n, fleet, dir, unreadable).map(Some),
        (Some(_), None) => None,
        (None, _) => Some(None),
    };
    // A live queue may be all there is to simulate.
    let workloads = match (f.get("workload"), f.get("initial_state")) {
        (None, Some(_)) => Some(Vec::new()),
        _ => f
            .required(c, "workload", "a list of workloads (or an `initial_state`)")
            .and_then(|n| read_workloads(c, n, types_by_width.as_ref(), dir, unreadable)),
    };
    let workloads = match (workloads, initial) {
        (Some(mut w), Some(Some(queue))) => {
            w.insert(0, WorkloadSpec::Queue(queue));
            Some(w)
        }
        (Some(w), Some(None)) => Some(w),
        _ => None,
    };
    let fleet_families: BTreeSet<String> = fleet
        .iter()
        .flat_map(|fleet| &fleet.tpus)
        .map(|e| e.tpu_type.quota_family().to_owned())
        .collect();
    let prices = match f.get("prices") {
        Some(n) => read_prices(c, n, &fleet_families),
        None => Some(default_prices()),
    };
    // Every family the fleet uses needs a price, or its chip-hours would cost nothing.
    if let Some(prices) = &prices {
        for family in fleet_families.iter().filter(|f| !prices.contains_key(*f)) {
            c.error_hint(
                f.get("prices").unwrap_or(f.node()),
                "prices",
                format!("no price for the TPU family `{family}` the fleet uses"),
                format!(
                    "add `prices: {{{family}: {{spot: …, on_demand: …}}}}` (USD per chip-hour)"
                ),
            );
        }
    }
    let adopted_price = match f.get("adopted_usd_per_chip_hour") {
        Some(n) => c
            .number(
                n,
                "adopted_usd_per_chip_hour",
                0.0,
                1e4,
                "USD per chip-hour, 0 or more",
            )
            .map(Some),
        None => Some(None),
    };
    let egress_usd_per_gb = f
        .get("egress_usd_per_gb")
        .map_or(Some(DEFAULT_EGRESS_USD_PER_GB), |n| {
            c.number(n, "egress_usd_per_gb", 0.0, 100.0, "USD per GB, 0 or more")
        });
    let data_gb_per_attempt = f
        .get("data_gb_per_attempt")
        .map_or(Some(DEFAULT_DATA_GB_PER_ATTEMPT), |n| {
            c.number(n, "data_gb_per_attempt", 0.0, 1e9, "GB, 0 or more")
        });
    if let (Some(fleet), Some(types)) = (&fleet, &types_by_width) {
        check_types_in_fleet(c, &f, fleet, types);
    }
    let chaos = match (f.get("chaos"), horizon_secs) {
        (Some(n), Some(h)) => read_chaos(c, n, h).map(Some),
        (Some(_), None) => None,
        (None, _) => Some(None),
    };
    Some(Scenario {
        name,
        description,
        path: path.to_path_buf(),
        fleet: fleet?,
        horizon_secs: horizon_secs?,
        seeds: seeds?,
        policies: policies?,
        variants: variants?,
        cloud: cloud?,
        workloads: workloads?,
        types_by_width: types_by_width?,
        prices: prices?,
        egress_usd_per_gb: egress_usd_per_gb?,
        adopted_usd_per_chip_hour: adopted_price?,
        data_gb_per_attempt: data_gb_per_attempt?,
        chaos: chaos?,
    })
}

/// The most jobs a run replays from files (traces and captured jobs, within the horizon):
/// a run keeps every job it has seen, about 2.6 KB each (README, Performance), so two
/// million take some 5 GB.
pub const MAX_REPLAYED_JOBS: usize = 2_000_000;

/// Refuses, before anything runs, workloads whose files bring more than
/// `MAX_REPLAYED_JOBS` jobs within the horizon (a ten-million-row trace took 3.8 GB and
/// aborted). Synthetic workloads draw only the arrivals their horizon holds. Checked on the
/// scenario as it will run (after `--horizon-hours` and `--max-jobs`).
pub fn check_replayed_jobs(s: &Scenario) -> Result<(), String> {
    let until = s.horizon_secs as f64;
    let replayed: usize = s
        .workloads
        .iter()
        .map(|w| match w {
            WorkloadSpec::Trace(t) => t.arriving_until(until),
            WorkloadSpec::Jobs(jobs) => jobs.iter().filter(|j| j.at_secs <= until).count(),
            WorkloadSpec::Synthetic(_) | WorkloadSpec::Queue(_) => 0,
        })
        .sum();
    if replayed > MAX_REPLAYED_JOBS {
        return Err(format!(
            "error: {}: the workloads' files bring {replayed} jobs within the horizon; a run replays at most {MAX_REPLAYED_JOBS} (each job it has seen stays in memory, about 2.6 KB)\n  = hint: replay fewer: a trace's `limit:` (or --max-jobs), a shorter `horizon_hours` (or --horizon-hours), or a smaller `time_scale`\n",
            s.path.display()
        ));
    }
    Ok(())
}

const CHAOS_FIELDS: &[&str] = &[
    "stop_hours",
    "liveness_hours",
    "api",
    "qr_failure_per_hour",
    "qr_vanish_per_hour",
    "node_vanish_per_hour",
    "missing_status",
    "silent_death_per_hour",
    "partial_failure",
    "stale_observation",
    "crash",
    "stale_controller",
];

/// `chaos:` — every field optional, defaulting to [`ChaosSpec::defaults`].
fn read_chaos(c: &mut Checker<'_>, node: &Node, horizon_secs: u64) -> Option<ChaosSpec> {
    let f = c.mapping(node, "chaos", "fault settings", CHAOS_FIELDS, &[])?;
    let d = ChaosSpec::defaults(horizon_secs);
    let hours = |c: &mut Checker<'_>, name: &str, default: f64| {
        f.get(name).map_or(Some(default), |n| {
            c.number(n, f.path(name), 0.0, 1e6, "hours")
        })
    };
    let rate = |c: &mut Checker<'_>, name: &str, default: f64| {
        f.get(name).map_or(Some(default), |n| {
            c.number(n, f.path(name), 0.0, 1000.0, "a rate per hour")
        })
    };
    let prob = |c: &mut Checker<'_>, name: &str, default: f64| {
        f.get(name).map_or(Some(default), |n| {
            c.number(n, f.path(name), 0.0, 1.0, "a probability from 0 to 1")
        })
    };
    // Every field is read before any is combined: each problem is reported, not the first.
    let stop = hours(c, "stop_hours", d.stop_secs as f64 / 3600.0);
    let liveness = hours(c, "liveness_hours", d.liveness_secs as f64 / 3600.0);
    let api = f
        .get("api")
        .map_or(Some(d.api), |n| read_api(c, n, "chaos.api"));
    let qr_failure = rate(c, "qr_failure_per_hour", d.faults.qr_failure_per_hour);
    let qr_vanish = rate(c, "qr_vanish_per_hour", d.faults.qr_vanish_per_hour);
    let node_vanish = rate(c, "node_vanish_per_hour", d.faults.node_vanish_per_hour);
    let missing_status = prob(c, "missing_status", d.missing_status);
    let silent_death = rate(c, "silent_death_per_hour", d.silent_death_per_hour);
    let partial_failure = prob(c, "partial_failure", d.partial_failure);
    let stale_observation = prob(c, "stale_observation", d.stale_observation);
    let crash = prob(c, "crash", d.crash);
    let stale_controller = prob(c, "stale_controller", d.stale_controller);
    Some(ChaosSpec {
        stop_secs: (stop? * 3600.0) as u64,
        liveness_secs: (liveness? * 3600.0) as i64,
        api: api?,
        faults: tpu_runner_sim::CloudFaults {
            qr_failure_per_hour: qr_failure?,
            qr_vanish_per_hour: qr_vanish?,
            node_vanish_per_hour: node_vanish?,
            until_secs: 0,
        },
        missing_status: missing_status?,
        silent_death_per_hour: silent_death?,
        partial_failure: partial_failure?,
        stale_observation: stale_observation?,
        crash: crash?,
        stale_controller: stale_controller?,
    })
}

fn read_fleet(
    c: &mut Checker<'_>,
    node: &Node,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<FleetSpec> {
    match &node.value {
        Value::Str(rel) => {
            let path = dir.join(rel);
            match crate::files::read_text(&path, crate::files::SPEC_LIMIT) {
                Ok(text) => match parse_fleet(&path.display().to_string(), &text) {
                    Ok(fleet) => Some(fleet),
                    Err(e) => {
                        c.error_hint(
                            node,
                            "fleet",
                            format!("the fleet `{}` is invalid", path.display()),
                            e.render().trim_end().to_owned(),
                        );
                        None
                    }
                },
                Err(e) => {
                    *unreadable += 1;
                    c.error(
                        node,
                        "fleet",
                        format!("cannot read `{}`: {e}", path.display()),
                    );
                    None
                }
            }
        }
        Value::Map(_) => {
            // Re-render the inline mapping as YAML text through JSON (a YAML superset).
            let json = c.to_json(node).to_string();
            match parse_fleet("<inline fleet>", &json) {
                Ok(fleet) => Some(fleet),
                Err(e) => {
                    // Each problem at the node it names in this file.
                    for d in &e.diagnostics {
                        let at = yaml::node_at(node, &d.path);
                        let path = yaml::join("fleet", &d.path);
                        match &d.hint {
                            Some(hint) => c.error_hint(at, path, d.message.clone(), hint.clone()),
                            None => c.error(at, path, d.message.clone()),
                        }
                    }
                    None
                }
            }
        }
        _ => {
            c.expected(
                node,
                "fleet",
                "a path to a deployment.yaml or an inline fleet mapping",
            );
            None
        }
    }
}

/// `policies:`: a list of labels (policy names, compared under the fleet's timings), or a
/// mapping of label → policy variant laid over the fleet's policy (`name` defaults to the
/// label when the label is a policy name).
fn read_policies(
    c: &mut Checker<'_>,
    node: &Node,
    base: &PolicySpec,
) -> Option<(Vec<String>, BTreeMap<String, PolicySpec>)> {
    const EXPECTED: &str = "a list of policy names, or a mapping of labels to policies (`{frugal-5m: {name: frugal, race_after: 5m}, classic: {}}`)";
    match &node.value {
        Value::Seq(_) => {
            let items = c.list(node, "policies", EXPECTED, false)?;
            let mut out = Vec::new();
            for (i, p) in items.iter().enumerate() {
                let path = yaml::index("policies", i);
                let Some(name) = c.nonempty_string(p, path, "a policy name") else {
                    continue;
                };
                if PolicyName::parse(&name).is_none() {
                    c.error_hint(
                        p,
                        path,
                        format!("unknown policy `{name}`"),
                        format!("known policies: {} (a variant with parameters is a mapping: `policies: {{{name}: {{name: frugal, race_after: 5m}}}}`)", PolicyName::list()),
                    );
                } else if out.contains(&name) {
                    c.error(p, path, format!("policy `{name}` is listed twice"));
                } else {
                    out.push(name);
                }
            }
            Some((out, BTreeMap::new()))
        }
        Value::Map(pairs) => {
            let mut labels = Vec::new();
            let mut variants = BTreeMap::new();
            for (key, value) in pairs {
                let Some(label) = key.as_str().map(str::to_owned) else {
                    c.expected(key, "policies", "a label (a string key)");
                    continue;
                };
                let path = format!("policies.{label}");
                let ok_label = !label.is_empty()
                    && label.len() <= 40
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
                if !ok_label {
                    c.expected(
                        key,
                        &path,
                        "a label of letters, digits, `-`, `_` and `.` (at most 40)",
                    );
                    continue;
                }
                let spec = match &value.value {
                    Value::Null => PolicyName::parse(&label).map(|name| base.variant(name)),
                    _ => crate::spec::policy::read_policy(
                        c,
                        value,
                        &path,
                        base,
                        PolicyName::parse(&label),
                    ),
                };
                match spec {
                    Some(spec) => {
                        labels.push(label.clone());
                        variants.insert(label, spec);
                    }
                    None if matches!(value.value, Value::Null) => c.error_hint(
                        key,
                        &path,
                        format!("`{label}` is not a policy name"),
                        format!("give it a policy: `{label}: {{name: frugal, race_after: 5m}}` (known policies: {})", PolicyName::list()),
                    ),
                    None => {}
                }
            }
            if labels.is_empty() && pairs.is_empty() {
                c.expected(node, "policies", EXPECTED);
                return None;
            }
            Some((labels, variants))
        }
        _ => {
            c.expected(node, "policies", EXPECTED);
            None
        }
    }
}

/// The policy variants of a `simulate --variants` file (`policies:`, a mapping of labels to
/// variants as in a scenario, and an optional `description:`), laid over `base` (each
/// scenario's fleet policy): the labels in file order and their policies. Read with the
/// scenario's strict reader, errors at their lines.
pub fn read_variants(
    path: &Path,
    text: &str,
    base: &PolicySpec,
) -> Result<(Vec<String>, BTreeMap<String, PolicySpec>), ScenarioError> {
    let file = path.display().to_string();
    let root = yaml::parse(&file, text).map_err(ScenarioError::Invalid)?;
    let mut c = Checker::new(text);
    let read = (|| {
        let f = c.mapping(
            &root,
            "",
            "a mapping with `policies:` (labels to policy variants)",
            &["description", "policies"],
            &[],
        )?;
        if let Some(n) = f.get("description") {
            c.string(n, "description", "a text");
        }
        let node = f.required(&mut c, "policies", "a mapping of labels to policy variants")?;
        if !matches!(node.value, Value::Map(_)) {
            c.expected(
                node,
                "policies",
                "a mapping of labels to policy variants (`{default: {name: classic}, frugal-5m: {name: frugal, race_after: 5m}}`)",
            );
            return None;
        }
        read_policies(&mut c, node, base)
    })();
    c.finish(&file, read)
        .map_err(ScenarioError::Invalid)?
        .ok_or_else(|| ScenarioError::Io(format!("`{file}` could not be read")))
}

impl Scenario {
    /// The policy a run labelled `label` runs: a variant the scenario names, or a policy
    /// name as the fleet would run it.
    pub fn policy(&self, label: &str) -> Option<PolicySpec> {
        match self.variants.get(label) {
            Some(spec) => Some(spec.clone()),
            None => PolicyName::parse(label).map(|name| self.fleet.policy.variant(name)),
        }
    }

    /// Every label a run may be given here.
    pub fn labels(&self) -> Vec<String> {
        let mut labels: Vec<String> = self.variants.keys().cloned().collect();
        for name in PolicyName::ALL {
            if !labels.iter().any(|l| l == name.as_str()) {
                labels.push(name.as_str().to_owned());
            }
        }
        labels
    }
}

fn read_types_by_width(c: &mut Checker<'_>, node: &Node) -> Option<BTreeMap<u32, Vec<TpuType>>> {
    let Value::Map(pairs) = &node.value else {
        c.expected(
            node,
            "types_by_width",
            "a mapping such as `{8: [v6e-8, v5litepod-8]}`",
        );
        return None;
    };
    let mut out = BTreeMap::new();
    for (k, v) in pairs {
        let Value::Int(width) = k.value else {
            c.expected(k, "types_by_width", "a width in chips (an integer key)");
            continue;
        };
        let path = format!("types_by_width.{width}");
        let Some(items) = c.list(v, &path, "a list of TPU types", false) else {
            continue;
        };
        let mut types = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let p = yaml::index(&path, i);
            if let Some(t) = c.nonempty_string(item, p, "a TPU type") {
                match TpuType::parse(&t) {
                    Ok(t) if t.chips() as i64 == width => types.push(t),
                    Ok(t) => c.error(item, p, format!("{t} has {} chips, not {width}", t.chips())),
                    Err(e) => c.error(item, p, format!("expected {e}, found {}", yaml::quote(&t))),
                }
            }
        }
        out.insert(width as u32, types);
    }
    Some(out)
}

fn check_types_in_fleet(
    c: &mut Checker<'_>,
    f: &Fields<'_>,
    fleet: &FleetSpec,
    types: &BTreeMap<u32, Vec<TpuType>>,
) {
    let Some(node) = f.get("types_by_width") else {
        return;
    };
    for (width, list) in types {
        if !list
            .iter()
            .any(|t| fleet.tpus.iter().any(|e| e.tpu_type == *t))
        {
            c.error_hint(
                node,
                &format!("types_by_width.{width}"),
                format!("no fleet entry has any of the types for width {width}"),
                "jobs of this width could never run; add an entry or change the types",
            );
        }
    }
}
