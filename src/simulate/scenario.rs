//! Scenario files (`scenarios/*.yaml`): a fleet, the cloud model, the workload, the horizon,
//! seeds and policies. Read with the same strict, error-collecting reader as the fleet, so a
//! mistake names the file, line, column and field. Loads the files a scenario refers to
//! (fleet, traces, CSV columns) relative to the scenario file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tpu_runner_sim::workload::{Dist, JobArrival, Regions, Synthetic, TraceReplay, read_column};
use tpu_runner_sim::{ApiConfig, ApiLatency, ApiQuota, Capacity, Latency, SpotTrace, WorkerConfig};

use crate::spec::yaml::{self, Checker, Fields, Node, Place, Value};
use crate::spec::{
    EntryKind, FleetSpec, PolicyName, PolicySpec, ProvisioningModel, SpecErrors, TpuEntry, TpuType,
    gcp, parse_fleet,
};

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

/// GCP's Spot VM preemption notice (ACPI soft-off to termination), seconds.
const PREEMPTION_NOTICE_SECS: f64 = 30.0;

/// API call latencies: a batch of parallel inventory reads 0.3 s, a mutation 1 s, an SSH
/// call 3 s (medians; no public figures, kept well under the original's timeouts of 90 s,
/// 300 s and 180 s).
const API_LATENCY: ApiLatency = ApiLatency {
    read: Latency {
        median_secs: 0.3,
        sigma: 0.5,
    },
    mutation: Latency {
        median_secs: 1.0,
        sigma: 0.5,
    },
    remote: Latency {
        median_secs: 3.0,
        sigma: 0.5,
    },
};

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

fn read_latency(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<Latency> {
    let f = c.mapping(
        node,
        path,
        "a latency `{median_secs, sigma}`",
        &["median_secs", "sigma"],
        &[],
    )?;
    let median = f
        .required(c, "median_secs", "seconds")
        .and_then(|n| c.number(n, f.path("median_secs"), 0.0, 1e7, "seconds, 0 or more"));
    let sigma = f.get("sigma").map_or(Some(0.0), |n| {
        c.number(
            n,
            f.path("sigma"),
            0.0,
            5.0,
            "a log-normal shape from 0 to 5",
        )
    });
    Some(Latency {
        median_secs: median?,
        sigma: sigma?,
    })
}

fn read_api(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<ApiConfig> {
    let a = c.mapping(
        node,
        path,
        "API error rates",
        &["rate_limited", "unavailable", "timeout", "lost_reply"],
        &[],
    )?;
    Some(ApiConfig {
        rate_limited: probability(c, &a, "rate_limited")?,
        unavailable: probability(c, &a, "unavailable")?,
        timeout: probability(c, &a, "timeout")?,
        lost_reply: probability(c, &a, "lost_reply")?,
    })
}

fn probability(c: &mut Checker<'_>, f: &Fields<'_>, name: &str) -> Option<f64> {
    f.get(name).map_or(Some(0.0), |n| {
        c.number(n, f.path(name), 0.0, 1.0, "a probability from 0 to 1")
    })
}

/// Defaults (sources in scenarios/README.md): provisioning 5 min median (public reports 2–9
/// min per region), deletion 60 s, Spot preemption notice 30 s, set-up 120 s (30 s warm), no
/// faults, unlimited capacity.
fn default_cloud(fleet: &FleetSpec) -> CloudSpec {
    CloudSpec {
        provisioning: Latency {
            median_secs: 300.0,
            sigma: 0.5,
        },
        provisioning_by_region: BTreeMap::new(),
        delete_secs: 60.0,
        qr_failure_per_hour: 0.0,
        preemption_notice_secs: PREEMPTION_NOTICE_SECS,
        api_latency: API_LATENCY,
        api_quota: ApiQuota::default(),
        api: ApiConfig::default(),
        workers: WorkerConfig::default(),
        pools: fleet_pools(
            fleet,
            &[],
            &PoolDefaults {
                capacity: Capacity::Unlimited,
                preemption_per_hour: 0.0,
            },
        ),
    }
}

struct PoolDefaults {
    capacity: Capacity,
    preemption_per_hour: f64,
}

/// True when `pool` serves `entry`: a managed entry of the same zone, type, model and
/// reservation.
fn serves(pool: &PoolSpec, entry: &TpuEntry) -> bool {
    !matches!(entry.kind, EntryKind::Adopted { .. })
        && pool.zone == entry.zone.as_str()
        && pool.tpu_type == entry.tpu_type
        && pool.model == entry.provisioning_model
        && pool.reservation == entry.reservation
}

/// One pool per managed (zone, type, model, reservation) of the fleet: listed ones as given,
/// the others from the defaults (Spot), unlimited and never preempted (on-demand), or as
/// large as the entries it serves (a reservation).
fn fleet_pools(fleet: &FleetSpec, listed: &[PoolSpec], defaults: &PoolDefaults) -> Vec<PoolSpec> {
    let mut pools: Vec<PoolSpec> = listed.to_vec();
    for entry in &fleet.tpus {
        if matches!(entry.kind, EntryKind::Adopted { .. }) || pools.iter().any(|p| serves(p, entry))
        {
            continue;
        }
        let mut pool = PoolSpec {
            zone: entry.zone.to_string(),
            tpu_type: entry.tpu_type.clone(),
            model: entry.provisioning_model,
            reservation: entry.reservation.clone(),
            capacity: defaults.capacity.clone(),
            preemption_per_hour: defaults.preemption_per_hour,
            outages: Vec::new(),
            reclaims: entry.provisioning_model == ProvisioningModel::Spot,
        };
        match entry.provisioning_model {
            ProvisioningModel::Spot => {}
            ProvisioningModel::OnDemand => {
                (pool.capacity, pool.preemption_per_hour) = (Capacity::Unlimited, 0.0);
            }
            ProvisioningModel::Reserved => {
                let slices = fleet
                    .tpus
                    .iter()
                    .filter(|e| serves(&pool, e))
                    .map(TpuEntry::ceiling)
                    .sum();
                (pool.capacity, pool.preemption_per_hour) = (Capacity::Constant(slices), 0.0);
            }
        }
        pools.push(pool);
    }
    pools
}

fn read_cloud(
    c: &mut Checker<'_>,
    node: &Node,
    fleet: &FleetSpec,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<CloudSpec> {
    let f = c.mapping(
        node,
        "cloud",
        "the cloud model",
        &[
            "provisioning",
            "provisioning_by_region",
            "delete_secs",
            "qr_failure_per_hour",
            "preemption_notice_secs",
            "api_latency",
            "api_quota",
            "api",
            "workers",
            "pools",
            "default_pool",
        ],
        &[],
    )?;
    let defaults = default_cloud(fleet);
    let provisioning = f
        .get("provisioning")
        .map_or(Some(defaults.provisioning), |n| {
            read_latency(c, n, "cloud.provisioning")
        });
    let mut by_region = BTreeMap::new();
    if let Some(n) = f.get("provisioning_by_region") {
        if let Value::Map(pairs) = &n.value {
            for (k, v) in pairs {
                let Some(region) = c.nonempty_string(k, "cloud.provisioning_by_region", "a region")
                else {
                    continue;
                };
                if let Err(e) = gcp::check_region(&region) {
                    c.expected(k, "cloud.provisioning_by_region", &e);
                    continue;
                }
                if let Some(l) =
                    read_latency(c, v, &format!("cloud.provisioning_by_region.{region}"))
                {
                    by_region.insert(region, l);
                }
            }
        } else {
            c.expected(
                n,
                "cloud.provisioning_by_region",
                "a mapping of regions to latencies",
            );
        }
    }
    let delete_secs = f.get("delete_secs").map_or(Some(60.0), |n| {
        c.number(n, "cloud.delete_secs", 0.0, 86400.0, "seconds")
    });
    let qr_failure = f.get("qr_failure_per_hour").map_or(Some(0.0), |n| {
        c.number(
            n,
            "cloud.qr_failure_per_hour",
            0.0,
            1000.0,
            "a rate per request-hour",
        )
    });
    let notice = f
        .get("preemption_notice_secs")
        .map_or(Some(PREEMPTION_NOTICE_SECS), |n| {
            c.number(
                n,
                "cloud.preemption_notice_secs",
                0.0,
                3600.0,
                "seconds, 0 to 3600",
            )
        });
    let api_latency = match f.get("api_latency") {
        None => Some(API_LATENCY),
        Some(n) => c
            .mapping(
                n,
                "cloud.api_latency",
                "API call latencies",
                &["read", "mutation", "remote"],
                &[],
            )
            .and_then(|l| {
                let read = |c: &mut Checker<'_>, name: &str, default: Latency| {
                    l.get(name).map_or(Some(default), |n| {
                        read_latency(c, n, &format!("cloud.api_latency.{name}"))
                    })
                };
                Some(ApiLatency {
                    read: read(c, "read", API_LATENCY.read)?,
                    mutation: read(c, "mutation", API_LATENCY.mutation)?,
                    remote: read(c, "remote", API_LATENCY.remote)?,
                })
            }),
    };
    let api_quota = match f.get("api_quota") {
        None => Some(ApiQuota::default()),
        Some(n) => c
            .mapping(
                n,
                "cloud.api_quota",
                "API quotas in calls per minute",
                &["reads_per_minute", "mutations_per_minute"],
                &[],
            )
            .and_then(|q| {
                let rate = |c: &mut Checker<'_>, name: &str| {
                    q.get(name).map_or(Some(0.0), |n| {
                        c.number(
                            n,
                            q.path(name),
                            0.0,
                            1e9,
                            "calls per minute, 0 for no limit",
                        )
                    })
                };
                Some(ApiQuota {
                    reads_per_minute: rate(c, "reads_per_minute")?,
                    mutations_per_minute: rate(c, "mutations_per_minute")?,
                })
            }),
    };
    let api = f
        .get("api")
        .map_or(Some(ApiConfig::default()), |n| read_api(c, n, "cloud.api"));
    let workers = match f.get("workers") {
        Some(n) => c
            .mapping(
                n,
                "cloud.workers",
                "worker behaviour",
                &[
                    "setup",
                    "setup_warm",
                    "missing_status",
                    "silent_death_per_hour",
                    "partial_failure",
                ],
                &[],
            )
            .and_then(|w| {
                let d = WorkerConfig::default();
                Some(WorkerConfig {
                    setup: w
                        .get("setup")
                        .map_or(Some(d.setup), |n| read_latency(c, n, "cloud.workers.setup"))?,
                    setup_warm: w.get("setup_warm").map_or(Some(d.setup_warm), |n| {
                        read_latency(c, n, "cloud.workers.setup_warm")
                    })?,
                    missing_status: probability(c, &w, "missing_status")?,
                    silent_death_per_hour: w.get("silent_death_per_hour").map_or(
                        Some(0.0),
                        |n| {
                            c.number(
                                n,
                                "cloud.workers.silent_death_per_hour",
                                0.0,
                                1000.0,
                                "a rate per hour",
                            )
                        },
                    )?,
                    partial_failure: probability(c, &w, "partial_failure")?,
                })
            }),
        None => Some(WorkerConfig::default()),
    };
    let pool_defaults = match f.get("default_pool") {
        Some(n) => read_pool_defaults(c, n, dir, unreadable),
        None => Some(PoolDefaults {
            capacity: Capacity::Unlimited,
            preemption_per_hour: 0.0,
        }),
    };
    let listed = match f.get("pools") {
        Some(n) => c
            .list(n, "cloud.pools", "a list of pools", true)
            .map(|items| {
                let mut pools: Vec<PoolSpec> = Vec::new();
                for (i, node) in items.iter().enumerate() {
                    let path = yaml::index("cloud.pools", i);
                    let Some(pool) = read_pool(c, node, path, dir, unreadable) else {
                        continue;
                    };
                    let used = fleet.tpus.iter().any(|e| serves(&pool, e));
                    let what = match &pool.reservation {
                        Some(r) => format!(
                            "{} {} in {} (reservation {r})",
                            pool.model.as_str(),
                            pool.tpu_type,
                            pool.zone
                        ),
                        None => {
                            format!("{} {} in {}", pool.model.as_str(), pool.tpu_type, pool.zone)
                        }
                    };
                    if !used {
                        c.error(
                            node,
                            path,
                            format!(
                                "no managed fleet entry is a {what}: this pool would never be used"
                            ),
                        );
                    } else if pools.iter().any(|p| {
                        p.zone == pool.zone
                            && p.tpu_type == pool.tpu_type
                            && p.model == pool.model
                            && p.reservation == pool.reservation
                    }) {
                        c.error(node, path, format!("a second pool for {what}"));
                    } else {
                        pools.push(pool);
                    }
                }
                pools
            }),
        None => Some(Vec::new()),
    };
    Some(CloudSpec {
        provisioning: provisioning?,
        provisioning_by_region: by_region,
        delete_secs: delete_secs?,
        qr_failure_per_hour: qr_failure?,
        preemption_notice_secs: notice?,
        api_latency: api_latency?,
        api_quota: api_quota?,
        api: api?,
        workers: workers?,
        pools: fleet_pools(fleet, &listed?, &pool_defaults?),
    })
}

fn read_pool_defaults(
    c: &mut Checker<'_>,
    node: &Node,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<PoolDefaults> {
    let f = c.mapping(
        node,
        "cloud.default_pool",
        "pool defaults",
        &["capacity", "preemption_per_hour"],
        &[],
    )?;
    let capacity = f.get("capacity").map_or(Some(Capacity::Unlimited), |n| {
        read_capacity(c, n, "cloud.default_pool.capacity", dir, unreadable)
    });
    let preemption = f.get("preemption_per_hour").map_or(Some(0.0), |n| {
        c.number(
            n,
            "cloud.default_pool.preemption_per_hour",
            0.0,
            1000.0,
            "a rate per node-hour",
        )
    });
    Some(PoolDefaults {
        capacity: capacity?,
        preemption_per_hour: preemption?,
    })
}

fn read_pool(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<PoolSpec> {
    let f = c.mapping(
        node,
        path,
        "a pool",
        &[
            "zone",
            "type",
            "model",
            "reservation",
            "capacity",
            "preemption_per_hour",
            "outages_hours",
            "reclaim",
        ],
        &[],
    )?;
    const MODELS: &str = "`spot`, `on-demand` or `reserved`";
    let model = f.get("model").map_or(Some(ProvisioningModel::Spot), |n| {
        let m = c.string(n, f.path("model"), MODELS)?;
        let model = ProvisioningModel::parse(&m);
        if model.is_none() {
            c.expected(n, f.path("model"), MODELS);
        }
        model
    });
    let reservation = f
        .get("reservation")
        .and_then(|n| c.nonempty_string(n, f.path("reservation"), "the reservation's name"));
    match (model, &reservation) {
        (Some(ProvisioningModel::Reserved), None) => {
            f.required(
                c,
                "reservation",
                "the reservation's name, as its fleet entry names it",
            );
        }
        (Some(m), Some(_)) if m != ProvisioningModel::Reserved => {
            let n = f.get("reservation").unwrap_or(node);
            c.error(
                n,
                f.path("reservation"),
                "`reservation` applies only to `model: reserved`",
            );
        }
        _ => {}
    }
    let zone = f.required(c, "zone", "a zone").and_then(|n| {
        let z = c.nonempty_string(n, f.path("zone"), "a zone")?;
        gcp::zone_region(&z)
            .map_err(|e| c.expected(n, f.path("zone"), &e))
            .ok()?;
        Some(z)
    });
    let tpu_type = f.required(c, "type", "a TPU type").and_then(|n| {
        let t = c.nonempty_string(n, f.path("type"), "a TPU type")?;
        TpuType::parse(&t)
            .map_err(|e| c.error(n, f.path("type"), format!("expected {e}")))
            .ok()
    });
    let capacity = f.get("capacity").map_or(Some(Capacity::Unlimited), |n| {
        read_capacity(c, n, f.path("capacity"), dir, unreadable)
    });
    let preemption = f.get("preemption_per_hour").map_or(Some(0.0), |n| {
        c.number(
            n,
            f.path("preemption_per_hour"),
            0.0,
            1000.0,
            "a rate per node-hour",
        )
    });
    let reclaims = f
        .get("reclaim")
        .map_or(Some(true), |n| c.boolean(n, f.path("reclaim")));
    let outages = match f.get("outages_hours") {
        Some(n) => c
            .list(
                n,
                f.path("outages_hours"),
                "a list of `[from, until]` hour pairs",
                true,
            )
            .map(|items| {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let p = yaml::index(f.path("outages_hours"), i);
                    match &item.value {
                        Value::Seq(pair) if pair.len() == 2 => {
                            let a = c.number(&pair[0], p, 0.0, 1e6, "hours");
                            let b = c.number(&pair[1], p, 0.0, 1e6, "hours");
                            if let (Some(a), Some(b)) = (a, b) {
                                if a < b {
                                    out.push(((a * 3600.0) as u64, (b * 3600.0) as u64));
                                } else {
                                    c.error(item, p, "an outage must end after it starts");
                                }
                            }
                        }
                        _ => c.expected(item, p, "a pair `[from_hour, until_hour]`"),
                    }
                }
                out
            }),
        None => Some(Vec::new()),
    };
    let (model, capacity, preemption) = (model?, capacity?, preemption?);
    if model != ProvisioningModel::Spot {
        if let Some(n) = f.get("preemption_per_hour").filter(|_| preemption > 0.0) {
            c.error(
                n,
                f.path("preemption_per_hour"),
                format!("{} capacity is never preempted", model.as_str()),
            );
        }
        if let Some(n) = f.get("reclaim") {
            c.error(n, f.path("reclaim"), "only Spot capacity is reclaimed");
        }
    }
    if model == ProvisioningModel::Reserved && !matches!(capacity, Capacity::Constant(_)) {
        let n = f.get("capacity").unwrap_or(node);
        c.error_hint(
            n,
            f.path("capacity"),
            "a reservation's capacity is its size: a number of slices",
            "a reservation is billed whole for the whole run, so its size must be fixed",
        );
    }
    Some(PoolSpec {
        zone: zone?,
        tpu_type: tpu_type?,
        model,
        reservation,
        capacity,
        preemption_per_hour: preemption,
        outages: outages?,
        reclaims: reclaims? && model == ProvisioningModel::Spot,
    })
}

fn read_capacity(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Capacity> {
    const EXPECTED: &str =
        "`unlimited`, a number of slices, `{on_off: ...}`, `{trace: ...}` or `{schedule: ...}`";
    match &node.value {
        Value::Str(s) if s == "unlimited" => Some(Capacity::Unlimited),
        Value::Int(n) if *n >= 0 && *n <= u32::MAX as i64 => Some(Capacity::Constant(*n as u32)),
        Value::Map(_) => {
            let models = ["on_off", "trace", "schedule"];
            let f = c.mapping(node, path, "a capacity model", &models, &[])?;
            if !f.at_most_one(c, &models) {
                return None;
            }
            if let Some(n) = f.get("schedule") {
                return read_schedule(c, n, f.path("schedule"));
            }
            if let Some(n) = f.get("on_off") {
                let p = f.path("on_off");
                let o = c.mapping(
                    n,
                    p,
                    "an on/off model",
                    &["slices", "mean_on_hours", "mean_off_hours"],
                    &[],
                )?;
                let slices = o
                    .required(c, "slices", "slices while available")
                    .and_then(|n| {
                        c.integer(
                            n,
                            o.path("slices"),
                            0,
                            u32::MAX as i64,
                            "a number of slices",
                        )
                    });
                let on = o.required(c, "mean_on_hours", "hours").and_then(|n| {
                    c.number(n, o.path("mean_on_hours"), 0.001, 1e5, "positive hours")
                });
                let off = o.required(c, "mean_off_hours", "hours").and_then(|n| {
                    c.number(n, o.path("mean_off_hours"), 0.001, 1e5, "positive hours")
                });
                return Some(Capacity::OnOff {
                    slices: slices? as u32,
                    mean_on_secs: on? * 3600.0,
                    mean_off_secs: off? * 3600.0,
                });
            }
            if let Some(n) = f.get("trace") {
                let p = f.path("trace");
                let t = c.mapping(
                    n,
                    p,
                    "a trace model",
                    &["file", "scale", "offset_hours"],
                    &[],
                )?;
                let file = t
                    .required(c, "file", "a spot trace JSON file")
                    .and_then(|n| c.nonempty_string(n, t.path("file"), "a file path"))?;
                let scale = t.get("scale").map_or(Some(1), |n| {
                    c.integer(n, t.path("scale"), 1, 10_000, "slices per trace instance")
                });
                let offset = t.get("offset_hours").map_or(Some(0.0), |n| {
                    c.number(n, t.path("offset_hours"), 0.0, 1e6, "hours")
                });
                let full = dir.join(&file);
                let trace = match crate::files::read_text(&full, crate::files::DATA_LIMIT) {
                    Ok(text) => match SpotTrace::parse(&text) {
                        Ok(trace) => trace,
                        Err(e) => {
                            c.error(
                                n,
                                t.path("file"),
                                format!("`{}` is not a spot trace: {e}", full.display()),
                            );
                            return None;
                        }
                    },
                    Err(e) => {
                        *unreadable += 1;
                        c.error_hint(
                            n,
                            t.path("file"),
                            format!("cannot read the spot trace `{}`: {e}", full.display()),
                            DATA_HINT,
                        );
                        return None;
                    }
                };
                return Some(Capacity::Trace {
                    trace: Arc::new(trace),
                    scale: scale? as u32,
                    offset_secs: (offset? * 3600.0) as u64,
                });
            }
            c.expected(node, path, EXPECTED);
            None
        }
        _ => {
            c.expected(node, path, EXPECTED);
            None
        }
    }
}

/// `[[seconds, slices or unlimited], ...]`, in increasing time: each step holds until the
/// next (what a capture saw of a pool).
fn read_schedule(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<Capacity> {
    const STEP: &str = "a step `[seconds, slices]` (slices a number or `unlimited`)";
    let items = c.list(node, path, "a non-empty list of steps", false)?;
    let mut steps: Vec<(u64, u32)> = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let p = yaml::index(path, i);
        let pair = match &item.value {
            Value::Seq(pair) if pair.len() == 2 => pair,
            _ => {
                c.expected(item, p, STEP);
                ok = false;
                continue;
            }
        };
        let at = c.number(
            &pair[0],
            yaml::index(&p, 0),
            0.0,
            1e9,
            "seconds from the start",
        );
        let slices = match &pair[1].value {
            Value::Str(s) if s == "unlimited" => Some(u32::MAX),
            _ => c
                .integer(
                    &pair[1],
                    yaml::index(&p, 1),
                    0,
                    u32::MAX as i64 - 1,
                    "a number of slices",
                )
                .map(|n| n as u32),
        };
        let (Some(at), Some(slices)) = (at, slices) else {
            ok = false;
            continue;
        };
        let at = at as u64;
        if steps.last().is_some_and(|(last, _)| *last >= at) {
            c.error(
                item,
                p,
                format!(
                    "the steps must go forward in time: {at} s comes after {} s",
                    steps.last().map_or(0, |s| s.0)
                ),
            );
            ok = false;
            continue;
        }
        steps.push((at, slices));
    }
    ok.then(|| Capacity::Schedule(steps.into()))
}

/// `initial_state: FILE` or `{file: FILE, duration: DIST}`: the active jobs of a state
/// snapshot (`state export`) as a queue at the start. Their work is drawn from `duration`,
/// by default the run times of the snapshot's succeeded jobs (one hour when there are none).
fn read_initial_state(
    c: &mut Checker<'_>,
    node: &Node,
    fleet: &FleetSpec,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<LiveQueue> {
    let path = "initial_state";
    let (file_node, duration) = match &node.value {
        Value::Map(_) => {
            let f = c.mapping(node, path, "a state snapshot", &["file", "duration"], &[])?;
            let file = f.required(c, "file", "a state snapshot from `state export`")?;
            let duration = match f.get("duration") {
                Some(n) => Some(read_dist(c, n, f.path("duration"), dir, unreadable)?),
                None => None,
            };
            (file, duration)
        }
        _ => (node, None),
    };
    let file = c.nonempty_string(file_node, path, "a state snapshot file (`state export`)")?;
    let full = dir.join(&file);
    let text = match crate::files::read_text(&full, crate::files::STATE_LIMIT) {
        Ok(text) => text,
        Err(e) => {
            *unreadable += 1;
            c.error(
                file_node,
                path,
                format!("cannot read the state snapshot `{}`: {e}", full.display()),
            );
            return None;
        }
    };
    let state = match crate::spec::state_file::parse(&full.display().to_string(), &text) {
        Ok(state) => state,
        Err(message) => {
            c.error(
                file_node,
                path,
                format!(
                    "`{file}` is not a valid state snapshot:\n{}",
                    message.trim_end()
                ),
            );
            return None;
        }
    };
    let mut active: Vec<&crate::engine::state::Job> = state
        .jobs
        .values()
        .filter(|j| !j.status.is_terminal())
        .collect();
    active.sort_by_key(|j| (j.submitted_at, j.id));
    let jobs = active
        .iter()
        .enumerate()
        .map(|(i, j)| {
            super::captured::CapturedJob {
                id: j.id.to_string(),
                // In submission order, a millisecond apart.
                at_secs: i as f64 / 1000.0,
                types: super::captured::types_of(&j.spec, fleet),
                regions: j.bucket_regions.iter().map(|b| b.region.clone()).collect(),
                priority: j.spec.priority,
                // Drawn per seed (`LiveQueue::generate`).
                work_secs: 0.0,
                outcome: super::captured::Outcome::Unfinished,
                attempts: j.attempts.len() as u32,
                waited_secs: None,
            }
            .arrival()
        })
        .collect();
    let duration = duration.unwrap_or_else(|| {
        let ran: Vec<f64> = state
            .finished
            .values()
            .filter(|j| j.status == crate::engine::state::JobStatus::Succeeded)
            .filter_map(|j| {
                let a = j.attempts.last()?;
                Some(a.ended_at?.secs_since(a.started_at?))
            })
            .filter(|s| *s > 0.0)
            .collect();
        if ran.is_empty() {
            Dist::Constant(3600.0)
        } else {
            Dist::Empirical(ran)
        }
    });
    Some(LiveQueue { jobs, duration })
}

fn read_dist(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Dist> {
    let f = c.mapping(
        node,
        path,
        "a distribution",
        &["constant", "exponential", "lognormal", "empirical"],
        &[],
    )?;
    if !f.at_most_one(c, &["constant", "exponential", "lognormal", "empirical"]) {
        return None;
    }
    if let Some(n) = f.get("constant") {
        return c
            .number(n, f.path("constant"), 0.0, 1e9, "seconds")
            .map(Dist::Constant);
    }
    if let Some(n) = f.get("exponential") {
        return c
            .number(n, f.path("exponential"), 0.0, 1e9, "a mean in seconds")
            .map(Dist::Exponential);
    }
    if let Some(n) = f.get("lognormal") {
        let l = c.mapping(
            n,
            f.path("lognormal"),
            "`{median, sigma}`",
            &["median", "sigma"],
            &[],
        )?;
        let median = l
            .required(c, "median", "seconds")
            .and_then(|n| c.number(n, l.path("median"), 0.0, 1e9, "seconds"));
        let sigma = l
            .required(c, "sigma", "a shape")
            .and_then(|n| c.number(n, l.path("sigma"), 0.0, 5.0, "a shape from 0 to 5"));
        return Some(Dist::LogNormal {
            median: median?,
            sigma: sigma?,
        });
    }
    if let Some(n) = f.get("empirical") {
        let e = c.mapping(
            n,
            f.path("empirical"),
            "`{file, column}`",
            &["file", "column"],
            &[],
        )?;
        let file = e
            .required(c, "file", "a CSV file")
            .and_then(|n| c.nonempty_string(n, e.path("file"), "a file path"))?;
        let column = e
            .required(c, "column", "a column name")
            .and_then(|n| c.nonempty_string(n, e.path("column"), "a column name"))?;
        let values: Vec<f64> =
            read_csv_column(c, n, e.path("file"), &dir.join(&file), &column, unreadable)?
                .into_iter()
                .filter(|v| *v > 0.0)
                .collect();
        if values.is_empty() {
            c.error(
                n,
                e.path("column"),
                format!("column `{column}` of `{file}` has no positive value to draw from"),
            );
            return None;
        }
        return Some(Dist::Empirical(values));
    }
    c.expected(
        node,
        path,
        "one of `constant`, `exponential`, `lognormal`, `empirical`",
    );
    None
}

fn read_csv_column(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    file: &Path,
    column: &str,
    unreadable: &mut usize,
) -> Option<Vec<f64>> {
    match crate::files::read_text(file, crate::files::DATA_LIMIT) {
        Ok(text) => match read_column(&text, column) {
            Ok(v) => Some(v),
            Err(e) => {
                c.error(node, path, format!("`{}`: {e}", file.display()));
                None
            }
        },
        Err(e) => {
            *unreadable += 1;
            c.error_hint(
                node,
                path,
                format!("cannot read `{}`: {e}", file.display()),
                DATA_HINT,
            );
            None
        }
    }
}

fn read_weights(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<Vec<(u32, f64)>> {
    let Value::Map(pairs) = &node.value else {
        c.expected(
            node,
            path,
            "a mapping of widths (chips) to weights, such as `{8: 3, 16: 1}`",
        );
        return None;
    };
    let mut out = Vec::new();
    for (k, v) in pairs {
        let Value::Int(width) = k.value else {
            c.expected(k, path, "a width in chips");
            continue;
        };
        if let Some(w) = c.number(v, &format!("{path}.{width}"), 0.0, 1e9, "a weight") {
            out.push((width as u32, w));
        }
    }
    if out.is_empty() {
        c.expected(node, path, "at least one width");
        return None;
    }
    Some(out)
}

fn read_regions(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<Vec<(Regions, f64)>> {
    let items = c.list(node, path, "a list of `{regions: [...], weight: N}`", false)?;
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = yaml::index(path, i);
        let Some(f) = c.mapping(item, p, "a region set", &["regions", "weight"], &[]) else {
            continue;
        };
        let regions = f
            .required(c, "regions", "a list of regions")
            .and_then(|n| c.list(n, f.path("regions"), "a non-empty list of regions", false))
            .map(|rs| {
                rs.iter()
                    .enumerate()
                    .filter_map(|(j, r)| {
                        let rp = yaml::index(f.path("regions"), j);
                        let s = c.nonempty_string(r, rp, "a region")?;
                        gcp::check_region(&s)
                            .map_err(|e| c.expected(r, rp, &e))
                            .ok()?;
                        Some(s)
                    })
                    .collect::<Vec<_>>()
            });
        let weight = f.get("weight").map_or(Some(1.0), |n| {
            c.number(n, f.path("weight"), 0.0, 1e9, "a weight")
        });
        if let (Some(r), Some(w)) = (regions, weight) {
            out.push((r.into(), w));
        }
    }
    Some(out)
}

/// Fields every workload reads (see also the kind-specific ones below).
const WORKLOAD_FIELDS: &[&str] = &[
    "kind",
    "name",
    "start_hours",
    "duration",
    "regions",
    "priorities",
    "checkpoint_secs",
    "checkpoint_on_notice",
    "app_failure",
    "infra_failure",
    "setup_failure",
    "min_duration_secs",
    "max_duration_secs",
];

/// Fields only a synthetic workload reads.
const SYNTHETIC_ONLY_FIELDS: &[&str] = &["count", "interarrival", "widths"];

/// Fields only a trace replay reads.
const TRACE_ONLY_FIELDS: &[&str] = &[
    "file",
    "arrival_column",
    "width_column",
    "duration_column",
    "chips_per_unit",
    "time_scale",
    "limit",
];

fn read_workloads(
    c: &mut Checker<'_>,
    node: &Node,
    types_by_width: Option<&BTreeMap<u32, Vec<TpuType>>>,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Vec<WorkloadSpec>> {
    let items = c.list(node, "workload", "a non-empty list of workloads", false)?;
    let mut out = Vec::new();
    let mut names = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = yaml::index("workload", i);
        let allowed = [WORKLOAD_FIELDS, SYNTHETIC_ONLY_FIELDS, TRACE_ONLY_FIELDS].concat();
        let Some(f) = c.mapping(item, path, "a workload", &allowed, &[]) else {
            continue;
        };
        let kind = f
            .required(c, "kind", "`synthetic`, `trace` or `jobs`")
            .and_then(|n| c.nonempty_string(n, f.path("kind"), "`synthetic`, `trace` or `jobs`"));
        let name = match f.get("name") {
            Some(n) => c
                .nonempty_string(n, f.path("name"), "a name")
                .and_then(|s| {
                    let slug = crate::spec::names::slug(&s);
                    if slug != s {
                        c.error_hint(
                            n,
                            f.path("name"),
                            format!("workload name {} is not a slug", yaml::quote(&s)),
                            format!("use `{slug}` (it prefixes job ids)"),
                        );
                        return None;
                    }
                    Some(s)
                }),
            None => Some(format!("w{i}")),
        };
        let Some(name) = name else { continue };
        names.push((name.clone(), f.node(), format!("{}.name", path)));
        if let Some(other) = kind
            .as_deref()
            .filter(|k| !matches!(*k, "synthetic" | "trace" | "jobs"))
        {
            c.error(
                f.get("kind").expect("present"),
                f.path("kind"),
                format!(
                    "expected `synthetic`, `trace` or `jobs`, found {}",
                    yaml::quote(other)
                ),
            );
            continue;
        }
        if kind.as_deref() == Some("jobs") {
            // A captured job file says everything of each job: nothing else applies.
            for field in allowed
                .iter()
                .filter(|k| !matches!(**k, "kind" | "name" | "file"))
            {
                if let Some(n) = f.get_raw(field) {
                    c.error_hint(
                        n,
                        f.path(field),
                        format!("`{field}` does not apply to a `jobs` workload"),
                        format!("remove `{field}`: each job of the file has its own"),
                    );
                }
            }
            if let Some(jobs) = read_captured_jobs(c, &f, dir, unreadable) {
                out.push(WorkloadSpec::Jobs(jobs));
            }
            continue;
        }
        // Fields of the other kind would be silently ignored: refuse them.
        let other_kind_fields: &[&str] = match kind.as_deref() {
            Some("synthetic") => TRACE_ONLY_FIELDS,
            Some("trace") => SYNTHETIC_ONLY_FIELDS,
            _ => &[],
        };
        for field in other_kind_fields {
            if let Some(n) = f.get_raw(field) {
                c.error_hint(
                    n,
                    f.path(field),
                    format!(
                        "`{field}` does not apply to a `{}` workload",
                        kind.as_deref().unwrap_or_default()
                    ),
                    format!("remove `{field}`"),
                );
            }
        }
        let template = read_template(c, &f, &name, dir, unreadable);
        match kind.as_deref() {
            Some("synthetic") => {
                let Some(t) = template else { continue };
                let unknown: Vec<String> = t
                    .widths
                    .iter()
                    .filter(|(w, weight)| {
                        *weight > 0.0 && types_by_width.is_some_and(|types| !types.contains_key(w))
                    })
                    .map(|(w, _)| w.to_string())
                    .collect();
                if !unknown.is_empty() {
                    c.error_hint(
                        f.get("widths").expect("required by the template"),
                        f.path("widths"),
                        format!(
                            "no `types_by_width` entry for width {}: these jobs could never run",
                            unknown.join(", ")
                        ),
                        "add the width to `types_by_width` or remove it here",
                    );
                    continue;
                }
                out.push(WorkloadSpec::Synthetic(t));
            }
            Some("trace") => {
                let Some(t) = template else { continue };
                let file = f
                    .required(c, "file", "a CSV job trace")
                    .and_then(|n| c.nonempty_string(n, f.path("file"), "a file path"));
                let arrival = f
                    .get("arrival_column")
                    .map_or(Some("arrival_time_s".to_owned()), |n| {
                        c.nonempty_string(n, f.path("arrival_column"), "a column")
                    });
                let width = f
                    .get("width_column")
                    .map_or(Some("scale_factor".to_owned()), |n| {
                        c.nonempty_string(n, f.path("width_column"), "a column")
                    });
                let duration_col = f
                    .get("duration_column")
                    .and_then(|n| c.nonempty_string(n, f.path("duration_column"), "a column"));
                let chips = f.get("chips_per_unit").map_or(Some(1), |n| {
                    c.integer(n, f.path("chips_per_unit"), 1, 4096, "chips per width unit")
                });
                let scale = f.get("time_scale").map_or(Some(1.0), |n| {
                    c.number(n, f.path("time_scale"), 1e-6, 1e6, "a positive factor")
                });
                let limit = f.get("limit").map_or(Some(usize::MAX), |n| {
                    c.integer(n, f.path("limit"), 1, i64::MAX, "a number of jobs")
                        .map(|v| v as usize)
                });
                let (Some(file), Some(arrival), Some(width), Some(chips), Some(scale), Some(limit)) =
                    (file, arrival, width, chips, scale, limit)
                else {
                    continue;
                };
                let full = dir.join(&file);
                let node_file = f.get("file").expect("required");
                let Some(arrivals) =
                    read_csv_column(c, node_file, f.path("file"), &full, &arrival, unreadable)
                else {
                    continue;
                };
                if arrivals.is_empty() {
                    c.error(
                        node_file,
                        f.path("file"),
                        format!("`{file}` has no job rows"),
                    );
                    continue;
                }
                let Some(widths) =
                    read_csv_column(c, node_file, f.path("file"), &full, &width, unreadable)
                else {
                    continue;
                };
                let durations = match duration_col {
                    Some(col) => {
                        read_csv_column(c, node_file, f.path("file"), &full, &col, unreadable)
                    }
                    None => None,
                };
                let duration = t.duration.clone();
                out.push(WorkloadSpec::Trace(TraceReplay {
                    name: name.clone(),
                    arrivals,
                    widths,
                    durations,
                    duration,
                    chips_per_unit: chips as u32,
                    time_scale: scale,
                    limit,
                    regions: t.regions.clone(),
                    template: t,
                }));
            }
            _ => {}
        }
    }
    c.unique(
        names
            .iter()
            .map(|(n, node, p)| (n.clone(), *node, p.clone())),
        "workload name",
    );
    Some(out)
}

/// The arrivals of a `kind: jobs` workload's file (`simulate::captured`'s format).
fn read_captured_jobs(
    c: &mut Checker<'_>,
    f: &Fields<'_>,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Vec<JobArrival>> {
    let node = f.required(c, "file", "a captured job file (JSON lines)")?;
    let file = c.nonempty_string(node, f.path("file"), "a file path")?;
    let full = dir.join(&file);
    let text = match crate::files::read_text(&full, crate::files::DATA_LIMIT) {
        Ok(text) => text,
        Err(e) => {
            *unreadable += 1;
            c.error(
                node,
                f.path("file"),
                format!("cannot read the job file `{}`: {e}", full.display()),
            );
            return None;
        }
    };
    match super::captured::parse(&text) {
        Ok(jobs) if jobs.is_empty() => {
            c.error(node, f.path("file"), format!("`{file}` has no jobs"));
            None
        }
        Ok(jobs) => Some(
            jobs.iter()
                .map(super::captured::CapturedJob::arrival)
                .collect(),
        ),
        Err((line, why)) => {
            c.error(
                node,
                f.path("file"),
                format!("`{}` line {line}: {why}", full.display()),
            );
            None
        }
    }
}

fn read_template(
    c: &mut Checker<'_>,
    f: &Fields<'_>,
    name: &str,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Synthetic> {
    let is_trace = f.get("kind").and_then(Node::as_str) == Some("trace");
    let count = if is_trace {
        Some(0)
    } else {
        f.required(c, "count", "a number of jobs").and_then(|n| {
            c.integer(n, f.path("count"), 0, 10_000_000, "a number of jobs")
                .map(|v| v as usize)
        })
    };
    let start = f.get("start_hours").map_or(Some(0.0), |n| {
        c.number(n, f.path("start_hours"), 0.0, 1e6, "hours")
    });
    let interarrival = match f.get("interarrival") {
        Some(n) => read_dist(c, n, f.path("interarrival"), dir, unreadable),
        None => Some(Dist::Constant(0.0)),
    };
    let duration = if is_trace && f.get("duration").is_none() {
        Some(Dist::Constant(3600.0))
    } else {
        f.required(c, "duration", "a distribution of work seconds")
            .and_then(|n| read_dist(c, n, f.path("duration"), dir, unreadable))
    };
    let widths = if is_trace {
        Some(vec![(0, 1.0)])
    } else {
        f.required(c, "widths", "widths in chips with weights")
            .and_then(|n| read_weights(c, n, f.path("widths")))
    };
    let regions = f
        .required(c, "regions", "region sets with weights")
        .and_then(|n| read_regions(c, n, f.path("regions")));
    let priorities = match f.get("priorities") {
        Some(n) => c
            .mapping(
                n,
                f.path("priorities"),
                "weights `{low, normal, high}`",
                &["low", "normal", "high"],
                &[],
            )
            .and_then(|p| {
                let mut w = [0.0; 3];
                for (i, k) in ["low", "normal", "high"].iter().enumerate() {
                    w[i] = p
                        .get(k)
                        .map_or(Some(0.0), |n| c.number(n, p.path(k), 0.0, 1e9, "a weight"))?;
                }
                if w.iter().sum::<f64>() <= 0.0 {
                    c.error(
                        n,
                        f.path("priorities"),
                        "at least one priority needs a positive weight",
                    );
                    return None;
                }
                Some(w)
            }),
        None => Some([0.0, 1.0, 0.0]),
    };
    let checkpoint = f.get("checkpoint_secs").map_or(Some(0.0), |n| {
        c.number(
            n,
            f.path("checkpoint_secs"),
            0.0,
            1e7,
            "seconds, 0 for none",
        )
    });
    let on_notice = f.get("checkpoint_on_notice").map_or(Some(false), |n| {
        c.boolean(n, f.path("checkpoint_on_notice"))
    });
    let min = f.get("min_duration_secs").map_or(Some(60.0), |n| {
        c.number(n, f.path("min_duration_secs"), 0.0, 1e9, "seconds")
    });
    let max = f
        .get("max_duration_secs")
        .map_or(Some(30.0 * 86400.0), |n| {
            c.number(n, f.path("max_duration_secs"), 0.0, 1e9, "seconds")
        });
    let (min, max) = duration_limits(c, f, min, max);
    Some(Synthetic {
        name: name.to_owned(),
        count: count?,
        start_secs: start? * 3600.0,
        interarrival: interarrival?,
        duration: duration?,
        widths: widths?,
        regions: regions?,
        priorities: priorities?,
        checkpoint_secs: checkpoint?,
        checkpoint_on_notice: on_notice?,
        app_failure: probability(c, f, "app_failure")?,
        infra_failure: probability(c, f, "infra_failure")?,
        setup_failure: probability(c, f, "setup_failure")?,
        min_duration_secs: min?,
        max_duration_secs: max?,
    })
}

/// The duration limits, or an error at the one given when the minimum exceeds the maximum.
fn duration_limits(
    c: &mut Checker<'_>,
    f: &yaml::Fields<'_>,
    min: Option<f64>,
    max: Option<f64>,
) -> (Option<f64>, Option<f64>) {
    if let (Some(lo), Some(hi)) = (min, max)
        && lo > hi
    {
        let default = |name: &str| match f.get(name) {
            Some(_) => "",
            None => ", its default",
        };
        let (key, message) = match f.get("max_duration_secs") {
            Some(_) => (
                "max_duration_secs",
                format!(
                    "must be at least `min_duration_secs` ({lo} s{})",
                    default("min_duration_secs")
                ),
            ),
            None => (
                "min_duration_secs",
                format!(
                    "must be at most `max_duration_secs` ({hi} s{})",
                    default("max_duration_secs")
                ),
            ),
        };
        if let Some(node) = f.get(key) {
            c.error(node, f.path(key), message);
        }
        return (None, None);
    }
    (min, max)
}

/// Prices per family: the defaults, overridden or extended (for families the fleet uses).
fn read_prices(
    c: &mut Checker<'_>,
    node: &Node,
    fleet_families: &BTreeSet<String>,
) -> Option<BTreeMap<String, (f64, f64)>> {
    let Value::Map(pairs) = &node.value else {
        c.expected(
            node,
            "prices",
            "a mapping of TPU families to `{spot, on_demand}` USD per chip-hour",
        );
        return None;
    };
    let mut out = default_prices();
    for (k, v) in pairs {
        let Some(family) = c.nonempty_string(k, "prices", "a TPU family such as `v6e`") else {
            continue;
        };
        if !out.contains_key(&family) && !fleet_families.contains(&family) {
            let known: BTreeSet<&str> = out
                .keys()
                .chain(fleet_families)
                .map(String::as_str)
                .collect();
            let known: Vec<&str> = known.into_iter().collect();
            c.error_hint(
                k,
                "prices",
                format!("unknown TPU family `{family}`"),
                format!("families are {}", known.join(", ")),
            );
            continue;
        }
        let p = format!("prices.{family}");
        let Some(f) = c.mapping(v, &p, "`{spot, on_demand}`", &["spot", "on_demand"], &[]) else {
            continue;
        };
        let spot = f
            .required(c, "spot", "USD per chip-hour")
            .and_then(|n| c.number(n, f.path("spot"), 0.0, 1e4, "USD per chip-hour"));
        let od = f
            .required(c, "on_demand", "USD per chip-hour")
            .and_then(|n| c.number(n, f.path("on_demand"), 0.0, 1e4, "USD per chip-hour"));
        if let (Some(s), Some(o)) = (spot, od) {
            out.insert(family, (s, o));
        }
    }
    Some(out)
}

/// USD per GB moved between regions (cloud.google.com/vpc/pricing, within a continent).
pub const DEFAULT_EGRESS_USD_PER_GB: f64 = 0.02;

/// GB an attempt outside its bucket region reads (checkpoint and dataset shard).
pub const DEFAULT_DATA_GB_PER_ATTEMPT: f64 = 10.0;

/// Default USD per chip-hour (spot, on-demand): the shipped list prices.
pub fn default_prices() -> BTreeMap<String, (f64, f64)> {
    crate::spec::prices::LIST_PRICES
        .iter()
        .map(|&(family, spot, on_demand)| (family.to_owned(), (spot, on_demand)))
        .collect()
}
