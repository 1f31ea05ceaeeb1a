//! The fleet's `policy:` section: which assignment and capacity policy the controller runs,
//! its parameters, and the engine's timings — one piece of configuration read alike by
//! `plan`, `simulate`, the controller, `local up` and `deploy`, so what was measured in the
//! simulator is what runs. Strictly validated like every other field. Plain data: the engine
//! turns it into a policy; nothing here decides.

use serde::{Deserialize, Serialize};

use super::gcp::ProvisioningModel;
use super::yaml::{self, Checker, Node, Place, Value};

/// Timing and limits of the reconcile engine (the original's §3.11 values and the limits the
/// rewrite added). Every `…_secs` field is a number of seconds, the rest counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Seconds between passes in production (the original's loop, 30 s).
    pub reconcile_interval_secs: i64,
    /// A provisioning node seen before and now missing is recycled after this (300 s).
    pub orphan_grace_secs: i64,
    /// After one worker fails, wait this long for the others (60 s).
    pub partial_failure_grace_secs: i64,
    /// After some workers succeed, silent ones are lost after this (new; 600 s).
    pub partial_success_grace_secs: i64,
    /// A launch still failing after this long ends the attempt (1800 s).
    pub stale_launch_secs: i64,
    /// A running attempt whose heartbeat is older than this is lost (new; 900 s).
    pub heartbeat_timeout_secs: i64,
    /// Launch failures of one attempt before it is ended as lost (new; 5).
    pub max_launch_failures: u32,
    /// Failed cleanups of a failed launch before it is ended anyway (new; 5).
    pub max_cleanup_failures: u32,
    /// Retryable infrastructure failures of one job before it fails (new; 6).
    pub max_infra_retries: u32,
    /// First backoff after an infrastructure failure, doubled each time (new; 60 s).
    pub infra_backoff_secs: i64,
    /// Longest infrastructure backoff (new; 1800 s).
    pub infra_backoff_max_secs: i64,
    /// Failed cancels of one attempt before escalation (2).
    pub cancel_escalation: u32,
    /// Retryable failures of one job on one managed Spot TPU before it is replaced (2).
    pub recycle_threshold: u32,
    /// First pause of an entry's capacity requests after a refusal, doubled each time (new; 60 s).
    pub create_backoff_secs: i64,
    /// Longest pause of an entry's capacity requests (new; 900 s).
    pub create_backoff_max_secs: i64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            reconcile_interval_secs: 30,
            orphan_grace_secs: 300,
            partial_failure_grace_secs: 60,
            partial_success_grace_secs: 600,
            stale_launch_secs: 1800,
            heartbeat_timeout_secs: 900,
            max_launch_failures: 5,
            max_cleanup_failures: 5,
            max_infra_retries: 6,
            infra_backoff_secs: 60,
            infra_backoff_max_secs: 1800,
            cancel_escalation: 2,
            recycle_threshold: 2,
            create_backoff_secs: 60,
            create_backoff_max_secs: 900,
        }
    }
}

/// A policy by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    /// tpu-runner 0.1.12's decisions: every compatible entry races for a waiting job.
    Classic,
    /// One capacity request per waiting job; it races after `race_after`.
    Frugal,
    /// Baseline: SkyPilot managed jobs' `FAILOVER` (one zone at a time, cheapest first).
    SkypilotFailover,
    /// Baseline: SkyPilot managed jobs' `EAGER_NEXT_REGION` (`FAILOVER`'s requests, and a
    /// preempted job relaunched in another region at once).
    SkypilotEagerNextRegion,
    /// Baseline: dstack's sequential offers with retry (cheapest first, no memory).
    DstackOffers,
    /// Baseline: Kueue's ordered flavors (fleet order; never moves on a stockout).
    KueueFlavors,
}

impl PolicyName {
    /// Every policy, as written.
    pub const ALL: [PolicyName; 6] = [
        PolicyName::Classic,
        PolicyName::Frugal,
        PolicyName::SkypilotFailover,
        PolicyName::SkypilotEagerNextRegion,
        PolicyName::DstackOffers,
        PolicyName::KueueFlavors,
    ];

    /// As written in a file and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::Classic => "classic",
            PolicyName::Frugal => "frugal",
            PolicyName::SkypilotFailover => "skypilot-failover",
            PolicyName::SkypilotEagerNextRegion => "skypilot-eager-next-region",
            PolicyName::DstackOffers => "dstack-offers",
            PolicyName::KueueFlavors => "kueue-flavors",
        }
    }

    /// The policy written `text`.
    pub fn parse(text: &str) -> Option<PolicyName> {
        PolicyName::ALL.into_iter().find(|p| p.as_str() == text)
    }

    /// True for the peers' policies, kept as baselines to compare with.
    pub fn is_baseline(self) -> bool {
        matches!(
            self,
            PolicyName::SkypilotFailover
                | PolicyName::SkypilotEagerNextRegion
                | PolicyName::DstackOffers
                | PolicyName::KueueFlavors
        )
    }

    /// True for a policy that waits out a stockout in the entry it asked (Kueue's flavors
    /// move on only when one is full, #2560): a job may then wait while another entry has
    /// room, so the simulator's liveness check does not hold it to a bound.
    pub fn waits_out_stockouts(self) -> bool {
        self == PolicyName::KueueFlavors
    }

    /// Every name, for messages (`classic, frugal, …`).
    pub fn list() -> String {
        PolicyName::ALL.map(PolicyName::as_str).join(", ")
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `frugal`'s `race_after` when the file does not set it: 15 min (a stockout in the zone a
/// job's one request went to delays it by at most this before it races every entry).
pub const DEFAULT_RACE_AFTER_SECS: i64 = 900;

/// `stockout_wait` when the file does not set it: a request still waiting for capacity
/// after 10 min is a stockout signal (the emulator and the traces provision in 1–8 min when
/// capacity exists).
pub const DEFAULT_STOCKOUT_WAIT_SECS: i64 = 600;

/// Stockout memory: per pool (zone, TPU type, provisioning model), refusals and long waits
/// cool the pool for `cooldown_secs`, doubled for each further signal (at most 8×) until
/// capacity is seen there again; requests go first to pools that are not cooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StockoutMemory {
    /// How long one signal cools a pool; 0 turns the memory off.
    pub cooldown_secs: i64,
    /// A request waiting for capacity this long is a stockout signal.
    pub wait_secs: i64,
    /// Times the cooldown doubles with further signals (0 to 3: at most 8×).
    pub doublings: u32,
}

impl Default for StockoutMemory {
    fn default() -> Self {
        StockoutMemory {
            cooldown_secs: 0,
            wait_secs: DEFAULT_STOCKOUT_WAIT_SECS,
            doublings: 3,
        }
    }
}

impl StockoutMemory {
    /// The memory a peer's fail-fast creates amount to (its creates are refused at once
    /// where a queued resource would wait): a request not granted within a minute is a
    /// stockout, and the zone is skipped for `cooldown_secs`, doubled `doublings` times.
    pub fn fail_fast(cooldown_secs: i64, doublings: u32) -> StockoutMemory {
        StockoutMemory {
            cooldown_secs,
            wait_secs: 60,
            doublings,
        }
    }

    /// True when the memory is on.
    pub fn enabled(&self) -> bool {
        self.cooldown_secs > 0
    }
}

/// `priority_preemption_window` when the file does not set it: a job is displaced at most
/// once in 2 h (a few checkpoint intervals of most training loops).
pub const DEFAULT_PREEMPTION_WINDOW_SECS: i64 = 7200;

/// Priority preemption (opt-in): a job waiting `after_secs` for a TPU may displace a running
/// job of strictly lower priority whose TPU it can use; no job is displaced twice within
/// `window_secs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityPreemption {
    /// How long a job waits before it may displace one; 0 turns it off.
    pub after_secs: i64,
    /// No job is displaced twice within this.
    pub window_secs: i64,
}

impl Default for PriorityPreemption {
    fn default() -> Self {
        PriorityPreemption {
            after_secs: 0,
            window_secs: DEFAULT_PREEMPTION_WINDOW_SECS,
        }
    }
}

impl PriorityPreemption {
    /// True when it is on.
    pub fn enabled(&self) -> bool {
        self.after_secs > 0
    }
}

/// `move_window` when the file does not set it: preemptions counted over 6 h.
pub const DEFAULT_MOVE_WINDOW_SECS: i64 = 6 * 3600;

/// Moving on after repeated preemptions (opt-in): a job preempted `after_preemptions` times
/// within `window_secs` in the region it is pinned to is pinned to another of its regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegionMove {
    /// Preemptions in one region that move a job; 0 turns it off.
    pub after_preemptions: u32,
    /// Over how long they are counted.
    pub window_secs: i64,
}

impl Default for RegionMove {
    fn default() -> Self {
        RegionMove {
            after_preemptions: 0,
            window_secs: DEFAULT_MOVE_WINDOW_SECS,
        }
    }
}

impl RegionMove {
    /// True when it is on.
    pub fn enabled(&self) -> bool {
        self.after_preemptions > 0
    }
}

/// `on_demand_after` when the file does not set it: a job that waited 30 min for Spot capacity
/// may take an on-demand TPU (measured: docs/policies.md, "Spot first").
pub const DEFAULT_ON_DEMAND_AFTER_SECS: i64 = 1800;

/// Spot first, then on-demand or a reservation: how long a job waits for Spot capacity
/// before it may take a managed TPU of the other models (`None`: never). The wait restarts
/// with every attempt, so a job goes back to Spot at its next restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Fallback {
    /// Wait before on-demand entries (`None`: never).
    pub on_demand_after_secs: Option<i64>,
    /// Wait before reserved entries (`None`: never; 0: at once, a reservation is paid for
    /// whether used or not).
    pub reserved_after_secs: Option<i64>,
}

impl Default for Fallback {
    fn default() -> Self {
        Fallback {
            on_demand_after_secs: Some(DEFAULT_ON_DEMAND_AFTER_SECS),
            reserved_after_secs: Some(0),
        }
    }
}

impl Fallback {
    /// Every model at once (what the peers do with a mixed candidate list: they order it by
    /// price or by the fleet, and take the first that grants).
    pub const AT_ONCE: Fallback = Fallback {
        on_demand_after_secs: Some(0),
        reserved_after_secs: Some(0),
    };

    /// How long a job waits for Spot before it may take `model` (`None`: never).
    pub fn after(&self, model: ProvisioningModel) -> Option<i64> {
        match model {
            ProvisioningModel::Spot => Some(0),
            ProvisioningModel::OnDemand => self.on_demand_after_secs,
            ProvisioningModel::Reserved => self.reserved_after_secs,
        }
    }
}

/// The policy a fleet runs: its name, its parameters and the engine's timings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicySpec {
    /// Which policy.
    pub name: PolicyName,
    /// `frugal`: seconds a waiting job's demand stays in one entry before it races every
    /// compatible entry.
    pub race_after_secs: i64,
    /// Stockout memory (any policy; off unless `stockout_cooldown` is set).
    pub stockout: StockoutMemory,
    /// Priority preemption (any policy; off unless `priority_preemption_after` is set).
    pub priority_preemption: PriorityPreemption,
    /// Moving on after repeated preemptions (any policy; off unless
    /// `move_after_preemptions` is set).
    pub region_move: RegionMove,
    /// Spot first, then on-demand or a reservation (any policy; matters only to a fleet
    /// with managed on-demand or reserved entries).
    pub fallback: Fallback,
    /// The engine's timings.
    pub engine: EngineConfig,
}

impl Default for PolicySpec {
    fn default() -> Self {
        PolicySpec::named(PolicyName::Classic)
    }
}

impl PolicySpec {
    /// `name` with its default parameters and the default timings.
    pub fn named(name: PolicyName) -> PolicySpec {
        let stockout = match name {
            // SkyPilot blocks a zone that failed for the rest of the launch and retries
            // with an exponential backoff from `RETRY_INIT_GAP_SECONDS` = 60 s.
            PolicyName::SkypilotFailover | PolicyName::SkypilotEagerNextRegion => {
                StockoutMemory::fail_fast(60, 3)
            }
            // dstack keeps no memory of failed offers (#1359): each retry starts again.
            PolicyName::DstackOffers => StockoutMemory::fail_fast(60, 0),
            _ => StockoutMemory::default(),
        };
        PolicySpec {
            name,
            race_after_secs: DEFAULT_RACE_AFTER_SECS,
            stockout,
            priority_preemption: PriorityPreemption::default(),
            region_move: match name {
                // `EAGER_NEXT_REGION` leaves the region of every preemption at once.
                PolicyName::SkypilotEagerNextRegion => RegionMove {
                    after_preemptions: 1,
                    window_secs: DEFAULT_MOVE_WINDOW_SECS,
                },
                _ => RegionMove::default(),
            },
            // The peers take every candidate they are given at once, in their own order.
            fallback: if name.is_baseline() {
                Fallback::AT_ONCE
            } else {
                Fallback::default()
            },
            engine: EngineConfig::default(),
        }
    }

    /// `name` as a fleet running `self` would run it: `self` when it is `name`, else
    /// `name`'s defaults under `self`'s timings (a what-if in `plan`, a scenario's list).
    pub fn variant(&self, name: PolicyName) -> PolicySpec {
        if self.name == name {
            self.clone()
        } else {
            PolicySpec {
                engine: self.engine,
                ..PolicySpec::named(name)
            }
        }
    }

    /// A short digest of everything that decides (name, parameters, timings): 12 hex
    /// digits of the SHA-256 of its canonical JSON. Two passes with the same digest ran the
    /// same policy.
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let json = serde_json::to_vec(&self.canonical()).expect("plain data serialises");
        hex::encode(&sha2::Sha256::digest(&json)[..6])
    }

    /// What decides, only: a parameter the policy does not read is left out (so
    /// `classic`'s digest does not change with `race_after`).
    fn canonical(&self) -> serde_json::Value {
        let mut v = serde_json::json!({"name": self.name, "engine": self.engine});
        if self.name == PolicyName::Frugal {
            v["race_after_secs"] = self.race_after_secs.into();
        }
        if self.stockout.enabled() {
            v["stockout"] = serde_json::json!(self.stockout);
        }
        if self.priority_preemption.enabled() {
            v["priority_preemption"] = serde_json::json!(self.priority_preemption);
        }
        if self.region_move.enabled() {
            v["region_move"] = serde_json::json!(self.region_move);
        }
        if self.fallback != PolicySpec::named(self.name).fallback {
            v["fallback"] = serde_json::json!(self.fallback);
        }
        v
    }

    /// `frugal (race_after 10m) 3f2a…`: the name, its parameters that differ from their
    /// defaults, the engine timings that do, and the digest.
    pub fn describe(&self) -> String {
        let mut changed = Vec::new();
        if self.name == PolicyName::Frugal && self.race_after_secs != DEFAULT_RACE_AFTER_SECS {
            changed.push(format!("race_after {}", show_secs(self.race_after_secs)));
        }
        let own = PolicySpec::named(self.name).stockout;
        if self.stockout.cooldown_secs != own.cooldown_secs {
            changed.push(format!(
                "stockout_cooldown {}",
                show_secs(self.stockout.cooldown_secs)
            ));
        }
        if self.stockout.enabled() && self.stockout.wait_secs != own.wait_secs {
            changed.push(format!(
                "stockout_wait {}",
                show_secs(self.stockout.wait_secs)
            ));
        }
        if self.stockout.enabled() && self.stockout.doublings != own.doublings {
            changed.push(format!("stockout_doublings {}", self.stockout.doublings));
        }
        let p = self.priority_preemption;
        if p.enabled() {
            changed.push(format!(
                "priority_preemption_after {}",
                show_secs(p.after_secs)
            ));
            if p.window_secs != DEFAULT_PREEMPTION_WINDOW_SECS {
                changed.push(format!(
                    "priority_preemption_window {}",
                    show_secs(p.window_secs)
                ));
            }
        }
        let (m, own_move) = (self.region_move, PolicySpec::named(self.name).region_move);
        if m.after_preemptions != own_move.after_preemptions {
            changed.push(format!("move_after_preemptions {}", m.after_preemptions));
        }
        if m.enabled() && m.window_secs != own_move.window_secs {
            changed.push(format!("move_window {}", show_secs(m.window_secs)));
        }
        let own_fallback = PolicySpec::named(self.name).fallback;
        for (key, ours, own) in [
            (
                "on_demand_after",
                self.fallback.on_demand_after_secs,
                own_fallback.on_demand_after_secs,
            ),
            (
                "reserved_after",
                self.fallback.reserved_after_secs,
                own_fallback.reserved_after_secs,
            ),
        ] {
            if ours != own {
                changed.push(format!("{key} {}", ours.map_or("never".into(), show_secs)));
            }
        }
        let defaults = serde_json::to_value(EngineConfig::default()).expect("plain data");
        let ours = serde_json::to_value(self.engine).expect("plain data");
        for (k, v) in ours.as_object().into_iter().flatten() {
            if defaults[k] != *v {
                let key = k.strip_suffix("_secs").unwrap_or(k);
                match (k.ends_with("_secs"), v.as_i64()) {
                    (true, Some(s)) => changed.push(format!("{key} {}", show_secs(s))),
                    _ => changed.push(format!("{key} {v}")),
                }
            }
        }
        let params = if changed.is_empty() {
            String::new()
        } else {
            format!(" ({})", changed.join(", "))
        };
        format!("{}{params} {}", self.name.as_str(), self.digest())
    }
}

/// Seconds as the shortest exact duration (`15m`, `90s`, `2h`).
pub fn show_secs(secs: i64) -> String {
    match secs {
        s if s != 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s != 0 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Fields of `policy:`.
const POLICY_FIELDS: &[&str] = &[
    "name",
    "race_after",
    "stockout_cooldown",
    "stockout_wait",
    "stockout_doublings",
    "priority_preemption_after",
    "priority_preemption_window",
    "move_after_preemptions",
    "move_window",
    "on_demand_after",
    "reserved_after",
    "engine",
];

/// What a duration may be written as.
const DURATION: &str = "a duration such as `15m`, `90s` or `2h` (or whole seconds)";

/// A duration: whole seconds, or a positive integer followed by `s`, `m`, `h` or `d`.
pub fn parse_duration(text: &str) -> Option<i64> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().last()? {
        (i, 's' | 'm' | 'h' | 'd') => (&text[..i], &text[i..]),
        _ => (text, "s"),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 12 {
        return None;
    }
    let n: i64 = digits.parse().ok()?;
    Some(match unit {
        "d" => n * 86_400,
        "h" => n * 3600,
        "m" => n * 60,
        _ => n,
    })
}

/// Reads a duration field (a string with a unit, or an integer of seconds) in
/// `min..=max` seconds.
pub fn duration(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    min: i64,
    max: i64,
) -> Option<i64> {
    let secs = match &node.value {
        Value::Int(i) => Some(*i),
        Value::Str(s) => parse_duration(s),
        _ => None,
    };
    match secs {
        Some(s) if (min..=max).contains(&s) => Some(s),
        Some(_) => {
            c.expected(
                node,
                path,
                &format!("{DURATION} from {} to {}", show_secs(min), show_secs(max)),
            );
            None
        }
        None => {
            c.expected(node, path, DURATION);
            None
        }
    }
}

/// The engine's fields as a fleet file names them: a `…_secs` field without its suffix
/// (a duration), the rest as they are (counts).
fn engine_keys() -> Vec<(String, String)> {
    let fields = serde_json::to_value(EngineConfig::default()).expect("plain data");
    fields
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| (k.strip_suffix("_secs").unwrap_or(k).to_owned(), k.clone()))
        .collect()
}

/// Reads a `policy:` mapping at `path` (the fleet's, or a scenario's variant laid over
/// `base`): `name`, `race_after` (frugal only) and `engine` (timings by name, each laid over
/// `base`'s). `default_name` applies when `name` is absent.
pub fn read_policy(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    base: &PolicySpec,
    default_name: Option<PolicyName>,
) -> Option<PolicySpec> {
    let f = c.mapping(node, path, "the policy", POLICY_FIELDS, &[])?;
    // An unknown name is reported, and the rest is still checked (as `classic`'s).
    let name = match f.get("name") {
        Some(n) => c
            .nonempty_string(n, f.path("name"), "a policy name")
            .and_then(|text| match PolicyName::parse(&text) {
                Some(p) => Some(p),
                None => {
                    c.error_hint(
                        n,
                        f.path("name"),
                        format!("unknown policy {}", yaml::quote(&text)),
                        format!("known policies: {}", PolicyName::list()),
                    );
                    None
                }
            }),
        None => {
            if default_name.is_none() {
                f.required(c, "name", &format!("one of {}", PolicyName::list()));
            }
            default_name
        }
    };
    let mut ok = name.is_some();
    let name = name.unwrap_or(PolicyName::Classic);
    // A variant of another policy starts from that policy's defaults, keeping the timings.
    let mut spec = if name == base.name {
        base.clone()
    } else {
        PolicySpec {
            engine: base.engine,
            ..PolicySpec::named(name)
        }
    };
    if let Some(n) = f.get("race_after") {
        if name != PolicyName::Frugal && ok {
            c.error_hint(
                n,
                f.path("race_after"),
                format!(
                    "`race_after` is a parameter of `frugal`, not of `{}`",
                    name.as_str()
                ),
                "remove it, or set `name: frugal`",
            );
            ok = false;
        } else if name == PolicyName::Frugal {
            match duration(c, n, f.path("race_after"), 0, 7 * 86_400) {
                Some(s) => spec.race_after_secs = s,
                None => ok = false,
            }
        }
    }
    if let Some(n) = f.get("stockout_cooldown") {
        match duration(c, n, f.path("stockout_cooldown"), 0, 86_400) {
            Some(s) => spec.stockout.cooldown_secs = s,
            None => ok = false,
        }
    }
    if let Some(n) = f.get("stockout_wait") {
        match duration(c, n, f.path("stockout_wait"), 60, 86_400) {
            Some(s) => spec.stockout.wait_secs = s,
            None => ok = false,
        }
    }
    if let Some(n) = f.get("stockout_doublings") {
        match c.integer(n, f.path("stockout_doublings"), 0, 3, "a whole number") {
            Some(d) => spec.stockout.doublings = d as u32,
            None => ok = false,
        }
    }
    if let Some(n) = f.get("priority_preemption_after") {
        match duration(c, n, f.path("priority_preemption_after"), 0, 7 * 86_400) {
            Some(s) => spec.priority_preemption.after_secs = s,
            None => ok = false,
        }
    }
    if let Some(n) = f.get("priority_preemption_window") {
        match duration(c, n, f.path("priority_preemption_window"), 0, 7 * 86_400) {
            Some(s) => spec.priority_preemption.window_secs = s,
            None => ok = false,
        }
    }
    if let Some(n) = f.get("move_after_preemptions") {
        match c.integer(
            n,
            f.path("move_after_preemptions"),
            0,
            100,
            "a whole number",
        ) {
            Some(k) => spec.region_move.after_preemptions = k as u32,
            None => ok = false,
        }
    }
    if let Some(n) = f.get("move_window") {
        match duration(c, n, f.path("move_window"), 60, 30 * 86_400) {
            Some(s) => spec.region_move.window_secs = s,
            None => ok = false,
        }
    }
    for (key, field) in [
        ("on_demand_after", &mut spec.fallback.on_demand_after_secs),
        ("reserved_after", &mut spec.fallback.reserved_after_secs),
    ] {
        let Some(n) = f.get(key) else { continue };
        if matches!(&n.value, Value::Str(s) if s.trim() == "never") {
            *field = None;
            continue;
        }
        match duration(c, n, f.path(key), 0, 30 * 86_400) {
            Some(s) => *field = Some(s),
            None => ok = false,
        }
    }
    if let Some(n) = f.get("engine") {
        match read_engine(c, n, f.path("engine"), spec.engine) {
            Some(e) => spec.engine = e,
            None => ok = false,
        }
    }
    ok.then_some(spec)
}

/// Engine timings laid over `base`: durations for `…_secs` fields, whole numbers for counts.
fn read_engine(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    base: EngineConfig,
) -> Option<EngineConfig> {
    let keys = engine_keys();
    let allowed: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    let f = c.mapping(node, path, "engine timings", &allowed, &[])?;
    let mut fields = serde_json::to_value(base).expect("plain data");
    let mut ok = true;
    for (key, field) in &keys {
        let Some(n) = f.get(key) else { continue };
        let value = if field.ends_with("_secs") {
            let min = if field == "reconcile_interval_secs" {
                1
            } else {
                0
            };
            duration(c, n, f.path(key), min, 30 * 86_400)
        } else {
            c.integer(n, f.path(key), 0, 1000, "a whole number")
        };
        match value {
            Some(v) => fields[field] = v.into(),
            None => ok = false,
        }
    }
    if !ok {
        return None;
    }
    serde_json::from_value(fields).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_read_with_their_units() {
        assert_eq!(parse_duration("15m"), Some(900));
        assert_eq!(parse_duration("90s"), Some(90));
        assert_eq!(parse_duration("2h"), Some(7200));
        assert_eq!(parse_duration("600"), Some(600));
        assert_eq!(parse_duration("30d"), Some(30 * 86_400));
        for bad in ["", "m", "-5m", "1.5h", "10w", "1e3", "9999999999999m"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(show_secs(900), "15m");
        assert_eq!(show_secs(7200), "2h");
        assert_eq!(show_secs(45), "45s");
    }

    #[test]
    fn the_digest_follows_what_decides() {
        let classic = PolicySpec::default();
        let mut other = classic.clone();
        other.race_after_secs = 60;
        assert_eq!(
            classic.digest(),
            other.digest(),
            "classic does not read race_after"
        );
        let frugal = PolicySpec::named(PolicyName::Frugal);
        let mut quick = frugal.clone();
        quick.race_after_secs = 300;
        assert_ne!(frugal.digest(), quick.digest());
        assert_eq!(
            quick.describe(),
            format!("frugal (race_after 5m) {}", quick.digest())
        );
        let mut timed = classic.clone();
        timed.engine.heartbeat_timeout_secs = 1800;
        assert_eq!(
            timed.describe(),
            format!("classic (heartbeat_timeout 30m) {}", timed.digest())
        );
    }
}
