//! Why each pending job is not running, in words a user can act on and as reason codes a
//! script can read, and the queue in the order it is served: used by `plan`, `status`,
//! `watch` and the dashboard. Reads the fleet, the state after a
//! pass, the observation and the pass output; pure. The cost is linear: what depends only on
//! a job's requirement is worked out once per requirement class (and held once, shared by
//! the class's jobs), and every list a reason names is bounded (the first few names and a
//! count).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::demand::{ClassKey, Requirement};
use super::fleet_index::FleetIndex;
use super::observe::{
    Action, Health, LABEL_FLEET_ENTRY, LABEL_MANAGED_BY, NodeInfo, NodeState, Observation, QrState,
    QueuedResourceInfo,
};
use super::reconcile::PassOutput;
use super::state::{JobStatus, RegionChoice, ResourceStatus, State};
use super::time::Timestamp;
use crate::spec::gcp::ModelSet;
use crate::spec::{EntryKind, TpuRequest};

/// Names a reason lists at most; the rest are counted.
pub const SHOWN: usize = 5;

/// The reasons one pending job waits: its own, then those every job of its requirement
/// class shares (held once for the class: a sweep's thousands of alike jobs do not each
/// copy them). Serialises as `{job_id, reasons, codes}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// Job id.
    pub job_id: String,
    /// The job's own reasons (backing off, Spot first, displacing a victim) and sentences.
    own: Said,
    /// Its class's.
    class: std::sync::Arc<Said>,
}

/// Reasons as codes and, in the same order, as sentences.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Said {
    codes: Vec<Reason>,
    sentences: Vec<String>,
}

impl Said {
    fn of(codes: Vec<Reason>) -> Said {
        let sentences = codes.iter().map(ToString::to_string).collect();
        Said { codes, sentences }
    }
}

impl Explanation {
    /// One sentence per reason, most important first.
    pub fn reasons(&self) -> impl Iterator<Item = &str> + Clone {
        let sentences = self.own.sentences.iter().chain(&self.class.sentences);
        sentences.map(String::as_str)
    }

    /// The same reasons as codes with their names as fields, in the same order.
    pub fn codes(&self) -> impl Iterator<Item = &Reason> + Clone {
        self.own.codes.iter().chain(&self.class.codes)
    }

    /// When every reason is its class's: a key it shares with the explanations of its class
    /// alike, which then differ only in `job_id` (while they are all alive).
    pub fn class_only(&self) -> Option<usize> {
        let class = std::sync::Arc::as_ptr(&self.class) as usize;
        self.own.codes.is_empty().then_some(class)
    }
}

impl Serialize for Explanation {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        /// A list written from an iterator.
        struct Seq<I>(I);
        impl<I: Iterator + Clone> Serialize for Seq<I>
        where
            I::Item: Serialize,
        {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.clone())
            }
        }
        let mut out = serializer.serialize_struct("Explanation", 3)?;
        out.serialize_field("job_id", &self.job_id)?;
        out.serialize_field("reasons", &Seq(self.reasons()))?;
        out.serialize_field("codes", &Seq(self.codes()))?;
        out.end()
    }
}

/// Capacity asked for in one entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Requested {
    /// Entry id.
    pub entry: String,
    /// Its zone.
    pub zone: String,
    /// Its TPU type.
    pub tpu_type: String,
    /// Live requests (observed and made this pass).
    pub requested: u32,
    /// The entry's count.
    pub count: u32,
}

/// Why a job waits, as data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Reason {
    /// Retrying later after infrastructure failures.
    BackingOff {
        /// Failures so far.
        failures: u32,
        /// Until when.
        until: Timestamp,
    },
    /// No entry of the fleet can ever run it.
    NoEntry {
        /// What it asks for, in words.
        request: String,
    },
    /// Every compatible TPU runs an earlier or higher-priority job.
    TpusTaken {
        /// The first holders (`job (running)` / `job (assigned this pass)`).
        holders: Vec<String>,
        /// How many more.
        more: usize,
    },
    /// An adopted TPU it could use is not available.
    AdoptedUnavailable {
        /// Its name.
        tpu: String,
        /// Its zone.
        zone: String,
    },
    /// An entry is paused after a refusal.
    EntryPaused {
        /// Entry id.
        entry: String,
        /// Until when.
        until: Timestamp,
        /// The refusal.
        refusal: String,
    },
    /// An entry's pool is cooling after stockout signals (the stockout memory): it is asked
    /// only when no other compatible entry is left.
    PoolCooling {
        /// Entry id.
        entry: String,
        /// The pool (`zone/type/model`).
        pool: String,
        /// Until when.
        until: Timestamp,
        /// The last signal.
        signal: String,
    },
    /// An entry's chip limit is reached.
    ChipLimit {
        /// Entry id.
        entry: String,
        /// The notice.
        note: String,
    },
    /// An entry has all its TPUs busy.
    EntryAtCount {
        /// Entry id.
        entry: String,
        /// Its count.
        count: u32,
    },
    /// Capacity is requested.
    CapacityRequested {
        /// The first entries asked.
        entries: Vec<Requested>,
        /// How many more.
        more: usize,
    },
    /// Entries of another provisioning model are not open to it yet (Spot first).
    SpotFirst {
        /// The model (`on-demand`, `reserved`).
        model: String,
        /// Its compatible entries of that model.
        entries: Vec<String>,
        /// When they open to it (`None`: never, by the fleet's policy).
        from: Option<Timestamp>,
    },
    /// A running lower-priority job is being stopped to free its TPU for it (priority
    /// preemption): it is assigned once the victim's workers are confirmed stopped.
    Displacing {
        /// The victim.
        victim: String,
        /// Its TPU.
        tpu: String,
    },
    /// Nothing in particular: capacity may come.
    WaitingForCapacity {
        /// Compatible entries.
        entries: usize,
    },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let more = |n: usize| {
            if n > 0 {
                format!(" and {n} more")
            } else {
                String::new()
            }
        };
        match self {
            Reason::BackingOff { failures, until } => write!(
                f,
                "backing off after {failures} infrastructure failure(s) until {until}"
            ),
            Reason::NoEntry { request } => write!(f, "no fleet entry offers {request}"),
            Reason::TpusTaken { holders, more: n } => write!(
                f,
                "every compatible TPU is taken by an earlier or higher-priority job: {}{}",
                holders.join(", "),
                more(*n)
            ),
            Reason::AdoptedUnavailable { tpu, zone } => {
                write!(f, "adopted TPU {tpu} ({zone}) is not available")
            }
            Reason::EntryPaused {
                entry,
                until,
                refusal,
            } => write!(
                f,
                "entry {entry} paused until {until} after a refusal ({refusal})"
            ),
            Reason::PoolCooling {
                entry,
                pool,
                until,
                signal,
            } => write!(
                f,
                "entry {entry} asked last until {until}: stockout in {pool} ({signal})"
            ),
            Reason::ChipLimit { note, .. } => write!(f, "chip limit reached: {note}"),
            Reason::EntryAtCount { entry, count } => {
                write!(f, "entry {entry} is at its count ({count} TPUs, all busy)")
            }
            Reason::CapacityRequested { entries, more: n } => write!(
                f,
                "capacity requested in {}{}",
                entries
                    .iter()
                    .map(|r| format!(
                        "{} ({} {}, {}/{} requested)",
                        r.zone, r.tpu_type, r.entry, r.requested, r.count
                    ))
                    .collect::<Vec<_>>()
                    .join("; "),
                more(*n)
            ),
            Reason::SpotFirst {
                model,
                entries,
                from,
            } => match from {
                Some(t) => write!(
                    f,
                    "Spot first: {model} entries ({}) open to it at {t}",
                    entries.join(", ")
                ),
                None => write!(
                    f,
                    "Spot only: the policy never gives it {model} entries ({})",
                    entries.join(", ")
                ),
            },
            Reason::Displacing { victim, tpu } => write!(
                f,
                "displacing lower-priority job {victim} from TPU {tpu}: assigned once its workers have stopped"
            ),
            Reason::WaitingForCapacity { entries } => write!(
                f,
                "waiting for capacity: {entries} compatible entr{}",
                if *entries == 1 { "y" } else { "ies" }
            ),
        }
    }
}

fn describe_request(req: &Requirement<'_>) -> String {
    let tpu = match req.tpu {
        TpuRequest::Any => "any TPU type".to_owned(),
        TpuRequest::OneOf(types) => types
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" or "),
    };
    let mut out = tpu;
    if let Some(z) = req.zone {
        out.push_str(&format!(" in zone {z}"));
    }
    if let Some(n) = req.tpu_name {
        out.push_str(&format!(" on TPU {n}"));
    }
    match req.regions {
        RegionChoice::Pinned(r) => {
            out.push_str(&format!(" in region {r} (pinned by its previous attempt)"))
        }
        RegionChoice::AnyOf(list) => {
            let regions: Vec<&str> = list.iter().map(|b| b.region.as_str()).collect();
            out.push_str(&format!(
                " in regions with a bucket ({})",
                regions.join(", ")
            ));
        }
    }
    out
}

/// Explains every job still pending after the pass.
pub fn explain(
    index: &FleetIndex,
    state: &State,
    observation: &Observation,
    out: &PassOutput,
    now: Timestamp,
) -> Vec<Explanation> {
    explain_jobs(index, state, observation, out, now, state.jobs.values())
}

/// Explains those of `jobs` still pending in `state` after the pass (a page of the queue:
/// the facts every reason reads are gathered once, each job costs only its own reasons).
pub fn explain_jobs<'j>(
    index: &FleetIndex,
    state: &State,
    observation: &Observation,
    out: &PassOutput,
    now: Timestamp,
    jobs: impl IntoIterator<Item = &'j super::state::Job>,
) -> Vec<Explanation> {
    // Live requests per entry (observed and created this pass).
    let mut requests: BTreeMap<&str, u32> = BTreeMap::new();
    for q in &observation.queued_resources {
        if q.state.is_live()
            && let Some(e) = index.queued_resource_entry(q)
        {
            *requests.entry(index.entry(e).id.as_str()).or_default() += 1;
        }
    }
    for a in &out.actions {
        if let Action::CreateQueuedResource { entry_id, .. } = a {
            *requests.entry(entry_id.as_str()).or_default() += 1;
        }
    }
    let assigned_now: std::collections::HashSet<(&str, &str)> = out
        .events
        .iter()
        .filter(|e| e.kind == "job_assigned")
        .filter_map(|e| Some((e.job_id.as_deref()?, e.resource_id.as_deref()?)))
        .collect();
    // Facts about the TPU records, read once: busy TPUs per entry, usable adopted TPUs.
    let mut busy_per_entry: HashMap<&str, u32> = HashMap::new();
    let mut usable_adopted: std::collections::HashSet<&str> = Default::default();
    let mut held: Vec<Vec<Held<'_>>> = vec![Vec::new(); index.fleet.tpus.len()];
    for r in state.resources.values() {
        // A declared record is its entry's, of its type and zone.
        if let Some(owner) = &r.owner
            && let Some(d) = index.declared(&r.tpu_name)
            && index.declares(index.entry(d.entry as usize), r)
        {
            let when = if assigned_now.contains(&(owner.job_id.as_str(), r.id.as_str())) {
                "assigned this pass"
            } else {
                "running"
            };
            held[d.entry as usize].push(Held {
                job: owner.job_id.as_str(),
                when,
                tpu_name: r.tpu_name,
            });
        }
        if r.is_busy() {
            *busy_per_entry.entry(r.entry_id.as_str()).or_default() += 1;
        }
        if r.adopted && (r.status == ResourceStatus::Idle || r.is_busy()) {
            usable_adopted.insert(r.tpu_name.as_str());
        }
    }
    let facts = Facts {
        index,
        state,
        requests,
        busy_per_entry,
        usable_adopted,
        held,
        now,
    };
    // Jobs a priority preemption under way is freeing a TPU for: waiter → (victim, TPU).
    let displacing: rustc_hash::FxHashMap<
        crate::spec::Name,
        (crate::spec::Name, crate::spec::Name),
    > = if index.fleet.policy.priority_preemption.enabled() {
        state
            .jobs
            .values()
            .filter_map(|j| {
                let a = j.attempt().filter(|a| !a.status.is_terminal())?;
                Some((a.displaced_by?, (j.id, a.tpu_name)))
            })
            .collect()
    } else {
        Default::default()
    };
    let pending: Vec<&super::state::Job> = jobs
        .into_iter()
        .filter_map(|j| {
            let job = state.jobs.get(&j.id)?;
            (job.status == JobStatus::Pending).then_some(job)
        })
        .collect();
    // Each job's reasons are its own plus its class's: a long queue is explained in parts
    // side by side, each part working out the reasons of the classes it meets once.
    let parts = crate::parallel::in_parts(&pending, |_, part| {
        let mut by_class = Default::default();
        let explain = |job| explain_one(&facts, &displacing, &mut by_class, job);
        part.iter().map(explain).collect::<Vec<_>>()
    });
    parts.into_iter().flatten().collect()
}

/// What depends only on the requirement, per class, with its sentences.
type ClassReasons<'a> = rustc_hash::FxHashMap<ClassKey<'a>, std::sync::Arc<Said>>;

/// Why pending `job` waits: its own reasons (backing off, Spot first, displacing a victim),
/// then its class's (worked out once per class in `by_class`).
fn explain_one<'a>(
    facts: &Facts<'a>,
    displacing: &rustc_hash::FxHashMap<crate::spec::Name, (crate::spec::Name, crate::spec::Name)>,
    by_class: &mut ClassReasons<'a>,
    job: &&'a super::state::Job,
) -> Explanation {
    let (index, now) = (facts.index, facts.now);
    let req = Requirement::at(index, job, now);
    let models = req.models;
    let class = by_class
        .entry(ClassKey::of(job, models))
        .or_insert_with(|| std::sync::Arc::new(Said::of(class_reasons(facts, &req))))
        .clone();
    let mut codes = Vec::new();
    if let Some(t) = job.not_before.filter(|t| *t > now) {
        codes.push(Reason::BackingOff {
            failures: job.infra_failures,
            until: t,
        });
    }
    if models != ModelSet::ALL {
        codes.extend(spot_first(index, job, &Requirement::of(job), models));
    }
    if let Some((victim, tpu)) = displacing.get(&job.id) {
        codes.push(Reason::Displacing {
            victim: victim.to_string(),
            tpu: tpu.to_string(),
        });
    }
    Explanation {
        job_id: job.id.to_string(),
        own: Said::of(codes),
        class,
    }
}

/// The entries of each provisioning model `job` may not take yet (it may take `models`),
/// and when they open to it.
fn spot_first(
    index: &FleetIndex,
    job: &crate::engine::state::Job,
    all: &Requirement<'_>,
    models: ModelSet,
) -> Vec<Reason> {
    let fallback = &index.fleet.policy.fallback;
    let candidates = index.candidates(all);
    crate::spec::ProvisioningModel::ALL
        .into_iter()
        .filter(|m| !models.has(*m))
        .filter_map(|model| {
            let entries: Vec<String> = candidates
                .iter()
                .map(|&e| e as usize)
                .filter(|&e| {
                    let entry = index.entry(e);
                    !entry.is_adopted()
                        && entry.provisioning_model == model
                        && all.accepts_entry(index, e)
                })
                .map(|e| index.entry(e).id.to_string())
                .collect();
            (!entries.is_empty()).then(|| Reason::SpotFirst {
                model: model.as_str().to_owned(),
                entries,
                from: fallback
                    .after(model)
                    .map(|after| job.waiting_since().plus_secs(after)),
            })
        })
        .collect()
}

/// What every class's reasons read, gathered once per pass.
struct Facts<'a> {
    index: &'a FleetIndex,
    state: &'a State,
    /// Live requests per entry.
    requests: BTreeMap<&'a str, u32>,
    /// Busy TPU records per entry.
    busy_per_entry: HashMap<&'a str, u32>,
    /// Adopted TPUs that are idle or busy.
    usable_adopted: std::collections::HashSet<&'a str>,
    /// Per entry (fleet order), its declared TPUs that run a job.
    held: Vec<Vec<Held<'a>>>,
    now: Timestamp,
}

/// A declared TPU that runs a job.
#[derive(Clone, Copy, Debug)]
struct Held<'a> {
    /// The job it runs.
    job: &'a str,
    /// `running`, or `assigned this pass`.
    when: &'static str,
    /// The TPU's name (a job may require one).
    tpu_name: crate::spec::Name,
}

/// The bytes of a holder's text `job (when)` up to the closing parenthesis, for ordering.
fn holder_text<'a>((job, when): (&'a str, &'a str)) -> impl Iterator<Item = u8> + 'a {
    job.bytes().chain(*b" (").chain(when.bytes())
}

/// The order of [`holder_text`], comparing slices: byte by byte only when one job id starts
/// the other.
fn holder_order(a: &(&str, &str), b: &(&str, &str)) -> std::cmp::Ordering {
    let (ja, jb) = (a.0.as_bytes(), b.0.as_bytes());
    let n = ja.len().min(jb.len());
    ja[..n].cmp(&jb[..n]).then_with(|| {
        if ja.len() == jb.len() {
            a.1.cmp(b.1)
        } else {
            holder_text(*a).cmp(holder_text(*b))
        }
    })
}

/// The reasons every job with requirement `req` shares.
fn class_reasons(facts: &Facts<'_>, req: &Requirement<'_>) -> Vec<Reason> {
    let Facts {
        index,
        state,
        requests,
        busy_per_entry,
        usable_adopted,
        now,
        ..
    } = facts;
    let (index, state, now) = (*index, *state, *now);
    let mut reasons = Vec::new();
    let candidates = index.candidates(req);
    let entries: Vec<usize> = candidates
        .iter()
        .map(|&e| e as usize)
        .filter(|&e| req.accepts_entry(index, e))
        .collect();
    if entries.is_empty() {
        reasons.push(Reason::NoEntry {
            request: describe_request(req),
        });
        return reasons;
    }
    // Who holds the TPUs of compatible entries: only candidates in the required zone, and
    // the entry declaring the required name, hold TPUs the job accepts.
    let named = req.tpu_name.map(|n| {
        crate::spec::Name::existing(n).and_then(|n| Some(index.declared(&n)?.entry as usize))
    });
    let mut holders = Vec::new();
    for e in candidates.iter().map(|&e| e as usize) {
        let entry = index.entry(e);
        if req.zone.is_some_and(|z| entry.zone != z)
            || named.is_some_and(|declaring| declaring != Some(e))
            || !req.accepts_place(&entry.tpu_type, &entry.zone)
        {
            continue;
        }
        let accepted = facts.held[e]
            .iter()
            .filter(|h| req.tpu_name.is_none_or(|n| n == h.tpu_name));
        holders.extend(accepted.map(|h| (h.job, h.when)));
    }
    if !holders.is_empty() {
        // The first SHOWN in the order of their text `job (when)`, the only ones written.
        let order = holder_order;
        let more = holders.len().saturating_sub(SHOWN);
        if more > 0 {
            holders.select_nth_unstable_by(SHOWN, order);
            holders.truncate(SHOWN);
        }
        holders.sort_unstable_by(order);
        let holders = holders
            .iter()
            .map(|(job, when)| format!("{job} ({when})"))
            .collect();
        reasons.push(Reason::TpusTaken { holders, more });
    }
    let mut requested = Vec::new();
    for &e in &entries {
        let entry = index.entry(e);
        match &entry.kind {
            EntryKind::Adopted { existing } => {
                if !usable_adopted.contains(existing.as_str()) {
                    reasons.push(Reason::AdoptedUnavailable {
                        tpu: existing.to_string(),
                        zone: entry.zone.to_string(),
                    });
                }
            }
            EntryKind::Managed { count } => {
                if let Some(b) = state.entry_backoff.get(&entry.id).filter(|b| b.until > now) {
                    reasons.push(Reason::EntryPaused {
                        entry: entry.id.to_string(),
                        until: b.until,
                        refusal: b.reason.clone(),
                    });
                }
                if let Some(m) = state
                    .pools
                    .get(index.pool_key(e))
                    .filter(|m| m.cooling(now))
                {
                    reasons.push(Reason::PoolCooling {
                        entry: entry.id.to_string(),
                        pool: index.pool_key(e).to_owned(),
                        until: m.cool_until.unwrap_or(now),
                        signal: m.reason.clone(),
                    });
                }
                if let Some(note) = state.notices.get(&format!("chip_limit:{}", entry.id)) {
                    reasons.push(Reason::ChipLimit {
                        entry: entry.id.to_string(),
                        note: note.clone(),
                    });
                }
                let n = requests.get(entry.id.as_str()).copied().unwrap_or(0);
                if n > 0 {
                    requested.push(Requested {
                        entry: entry.id.to_string(),
                        zone: entry.zone.to_string(),
                        tpu_type: entry.tpu_type.to_string(),
                        requested: n,
                        count: *count,
                    });
                } else if *count > 0
                    && busy_per_entry.get(entry.id.as_str()).copied().unwrap_or(0) >= *count
                {
                    reasons.push(Reason::EntryAtCount {
                        entry: entry.id.to_string(),
                        count: *count,
                    });
                }
            }
        }
    }
    if !requested.is_empty() {
        let more = requested.len().saturating_sub(SHOWN);
        requested.truncate(SHOWN);
        reasons.push(Reason::CapacityRequested {
            entries: requested,
            more,
        });
    }
    if reasons.is_empty() {
        reasons.push(Reason::WaitingForCapacity {
            entries: entries.len(),
        });
    }
    reasons
}

/// The cloud as the state believes it to be: ready TPUs for idle and busy records, waiting
/// requests for provisioning ones, healthy workers for running attempts.
pub fn assumed_observation(index: &FleetIndex, state: &State, now: Timestamp) -> Observation {
    let mut obs = Observation::default();
    for job in state.jobs.values() {
        if let Some(a) = job.attempt().filter(|a| !a.status.is_terminal()) {
            let report = super::observe::AttemptReport {
                launched: true,
                heartbeat_at: Some(now),
                ..Default::default()
            };
            obs.attempts.insert(a.id, report);
        }
    }
    for r in state.resources.values() {
        let labels = std::collections::BTreeMap::from([
            (LABEL_MANAGED_BY.to_owned(), index.runner().to_owned()),
            (LABEL_FLEET_ENTRY.to_owned(), r.entry_id.to_string()),
        ]);
        let up =
            matches!(r.status, ResourceStatus::Idle | ResourceStatus::Busy) || r.owner.is_some();
        let model = index
            .entry_index(&r.entry_id)
            .map_or(crate::spec::ProvisioningModel::OnDemand, |e| {
                index.entry(e).provisioning_model
            });
        let (spot, reserved) = (
            model == crate::spec::ProvisioningModel::Spot,
            model == crate::spec::ProvisioningModel::Reserved,
        );
        if !r.adopted && (up || r.status == ResourceStatus::Provisioning) {
            obs.queued_resources
                .push(std::sync::Arc::new(QueuedResourceInfo {
                    name: crate::spec::names::queued_resource_name(&r.tpu_name),
                    zone: r.zone,
                    node_id: r.tpu_name,
                    tpu_type: r.tpu_type.clone(),
                    state: if up {
                        QrState::Active
                    } else {
                        QrState::WaitingForResources
                    },
                    spot,
                    reserved,
                    labels: labels.clone().into(),
                    failure: None,
                }));
        }
        if up {
            obs.nodes.push(std::sync::Arc::new(NodeInfo {
                name: r.tpu_name,
                zone: r.zone,
                tpu_type: r.tpu_type.clone(),
                state: NodeState::Ready,
                health: Health::Healthy,
                spot,
                reserved,
                labels: if r.adopted {
                    Default::default()
                } else {
                    labels.into()
                },
                queued_resource: None,
                worker_count: r.worker_count,
                public_ip: true,
            }));
        }
    }
    // Someone else's TPUs, as many as the last pass counted.
    for held in &state.others {
        for _ in 0..held.count.min(super::snapshot::MAX_OTHERS_PER_POOL) {
            let n = obs.others.nodes.len() + 1;
            obs.others.nodes.push(NodeInfo {
                name: crate::spec::Name::new(&format!("others-{n}")),
                zone: held.zone,
                tpu_type: held.tpu_type.clone(),
                state: NodeState::Ready,
                health: Health::Healthy,
                spot: held.model == crate::spec::ProvisioningModel::Spot,
                reserved: held.model == crate::spec::ProvisioningModel::Reserved,
                labels: Default::default(),
                queued_resource: None,
                worker_count: 1,
                public_ip: false,
            });
        }
    }
    obs
}

/// One active job in the order the controller serves it.
#[derive(Clone, Debug)]
pub struct Queued<'s> {
    /// The job.
    pub job: &'s super::state::Job,
    /// Its place among the waiting jobs (1-based); running and cancelling ones have none.
    pub position: Option<usize>,
    /// Why it waits (a pending job the next pass would start has none).
    pub why: Option<Explanation>,
}

/// A page of the queue: the rows shown and how many more matched.
#[derive(Clone, Debug)]
pub struct QueuePage<'s> {
    /// The first rows that matched, in service order, each waiting one explained.
    pub rows: Vec<Queued<'s>>,
    /// Rows that matched past the page.
    pub more: usize,
}

/// The active jobs in the order the controller serves them: running and cancelling first
/// (by start), then the pending ones in assignment order (priority, most-constrained, FIFO),
/// each with why it waits on the pass `engine` would make now on the cloud `state` assumes.
/// Only the jobs `shown` keeps are listed, the first `limit` of them (0: all), and only
/// those are explained: the order and the positions cover the whole queue, the reasons
/// cost the page. What `status`, `watch` and the dashboard show; pure.
pub fn queue<'s>(
    engine: &super::Engine,
    state: &'s State,
    now: Timestamp,
    shown: impl Fn(&super::state::Job) -> bool,
    limit: usize,
) -> QueuePage<'s> {
    let mut running: Vec<&super::state::Job> = state
        .jobs
        .values()
        .filter(|j| j.status != JobStatus::Pending)
        .collect();
    running.sort_by_key(|j| {
        (
            j.attempt()
                .map_or(j.submitted_at, |a| a.started_at.unwrap_or(a.created_at)),
            j.id,
        )
    });
    let demand = super::demand::Demand::build(
        engine.index(),
        state
            .jobs
            .values()
            .filter(|j| j.status == JobStatus::Pending),
        now,
    );
    let mut pending: Vec<_> = demand.jobs.iter().collect();
    pending.sort_by(|a, b| a.order_key.cmp(&b.order_key).then(a.job.id.cmp(&b.job.id)));
    let listed = running
        .into_iter()
        .map(|job| (job, None))
        .chain(
            pending
                .into_iter()
                .enumerate()
                .map(|(k, p)| (p.job, Some(k + 1))),
        )
        .filter(|(job, _)| shown(job));
    let mut rows: Vec<Queued<'s>> = Vec::new();
    let mut more = 0;
    for (job, position) in listed {
        if limit != 0 && rows.len() == limit {
            more += 1;
        } else {
            rows.push(Queued {
                job,
                position,
                why: None,
            });
        }
    }
    if rows.iter().any(|r| r.position.is_some()) {
        let observation = assumed_observation(engine.index(), state, now);
        let mut after = state.clone();
        let out = engine.reconcile(&mut after, &observation, now);
        let page = rows.iter().filter(|r| r.position.is_some()).map(|r| r.job);
        let mut why: rustc_hash::FxHashMap<crate::spec::Name, Explanation> =
            explain_jobs(engine.index(), &after, &observation, &out, now, page)
                .into_iter()
                .map(|e| (crate::spec::Name::new(&e.job_id), e))
                .collect();
        for r in &mut rows {
            r.why = why.remove(&r.job.id);
        }
    }
    QueuePage { rows, more }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::policy::Classic;
    use crate::engine::state::PoolMemory;
    use crate::engine::{Engine, EngineConfig, synthetic};

    /// Holders are ordered as their texts `job (when)`: job ids and times that start one
    /// another, with bytes below and above the joining ` (`.
    #[test]
    fn holders_are_ordered_as_their_texts() {
        let parts = ["", "a", "ab", "a ", "a (", "a (b", "(", "!", "b", "\u{e9}"];
        for a in parts.iter().flat_map(|j| parts.map(|w| (*j, w))) {
            for b in parts.iter().flat_map(|j| parts.map(|w| (*j, w))) {
                let text = |(j, w): (&str, &str)| format!("{j} ({w}");
                assert_eq!(holder_order(&a, &b), text(a).cmp(&text(b)), "{a:?} {b:?}");
            }
        }
    }

    /// Every pending job is explained, its text is its codes', and no reason grows with the
    /// queue: the same bound at 500 and 5,000 jobs.
    #[test]
    fn explanations_are_bounded_and_match_their_codes() {
        let epoch = Timestamp::from_secs(1_767_225_600);
        let mut longest = Vec::new();
        for n_jobs in [500usize, 5_000] {
            let fleet = synthetic::fleet(20, 3);
            let (mut state, obs) = synthetic::planning_instance(&fleet, n_jobs, 60, epoch);
            let engine = Engine::new(fleet, EngineConfig::default(), Box::new(Classic));
            let now = epoch.plus_secs(100);
            let out = engine.reconcile(&mut state, &obs, now);
            let waiting = explain(engine.index(), &state, &obs, &out, now);
            let pending = state
                .jobs
                .values()
                .filter(|j| j.status == JobStatus::Pending)
                .count();
            assert_eq!(waiting.len(), pending);
            for w in &waiting {
                let text: Vec<String> = w.codes().map(ToString::to_string).collect();
                assert_eq!(text, w.reasons().collect::<Vec<_>>());
                for c in w.codes() {
                    if let Reason::TpusTaken { holders, .. } = c {
                        assert!(holders.len() <= SHOWN);
                    }
                }
            }
            longest.push(
                waiting
                    .iter()
                    .flat_map(|w| w.reasons().map(str::len))
                    .max()
                    .unwrap_or(0),
            );
        }
        assert!(
            longest[1] <= longest[0] + 16,
            "reasons grew with the queue: {longest:?}"
        );
    }

    /// A pool cooling after stockout signals is a reason of every job that could use it, in
    /// words and as a code.
    #[test]
    fn a_cooling_pool_is_a_reason() {
        let epoch = Timestamp::from_secs(1_767_225_600);
        let mut fleet = synthetic::fleet(4, 2);
        fleet.policy.stockout.cooldown_secs = 1800;
        let (mut state, obs) = synthetic::planning_instance(&fleet, 40, 60, epoch);
        let now = epoch.plus_secs(100);
        let pool = PoolMemory::key(&fleet.tpus[1]);
        state.pools.insert(
            pool.clone(),
            PoolMemory {
                // As many granted as listed: no new capacity seen in this pass.
                granted: u32::MAX,
                strikes: 1,
                cool_until: Some(now.plus_secs(1800)),
                reason: "a request waited 10m for capacity".into(),
                ..PoolMemory::default()
            },
        );
        let engine = Engine::new(fleet, EngineConfig::default(), Box::new(Classic));
        let out = engine.reconcile(&mut state, &obs, now);
        let waiting = explain(engine.index(), &state, &obs, &out, now);
        let cooled: Vec<&str> = waiting
            .iter()
            .flat_map(|w| w.reasons())
            .filter(|r| r.contains("stockout in"))
            .collect();
        assert!(!cooled.is_empty(), "{waiting:?}");
        assert!(
            cooled[0].contains(&pool) && cooled[0].contains("a request waited 10m"),
            "{}",
            cooled[0]
        );
    }

    /// A waiting job a priority preemption is freeing a TPU for says so, naming the victim.
    #[test]
    fn a_displacement_under_way_is_the_waiters_reason() {
        let epoch = Timestamp::from_secs(1_767_225_600);
        let mut fleet = synthetic::fleet(4, 2);
        fleet.policy.priority_preemption.after_secs = 600;
        let (mut state, obs) = synthetic::planning_instance(&fleet, 40, 60, epoch);
        let now = epoch.plus_secs(100);
        let engine = Engine::new(fleet, EngineConfig::default(), Box::new(Classic));
        let out = engine.reconcile(&mut state, &obs, now);
        let waiter = state
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Pending)
            .map(|j| j.id)
            .expect("a waiting job");
        let victim = state
            .jobs
            .values_mut()
            .find(|j| j.status == JobStatus::Running)
            .expect("a running job");
        let attempt = victim.attempts.last_mut().expect("its attempt");
        attempt.displaced_by = Some(waiter);
        let (victim, tpu) = (victim.id.to_string(), attempt.tpu_name.to_string());
        let waiting = explain(engine.index(), &state, &obs, &out, now);
        let reasons: Vec<&str> = waiting
            .iter()
            .find(|w| w.job_id == waiter.as_str())
            .expect("explained")
            .reasons()
            .collect();
        assert!(
            reasons.iter().any(|r| r
                == &format!("displacing lower-priority job {victim} from TPU {tpu}: assigned once its workers have stopped")),
            "{reasons:?}"
        );
    }

    /// A job that has not waited `on_demand_after` is told when the fleet's on-demand
    /// entries open to it; with `never`, that they never will; once open, nothing is said.
    #[test]
    fn spot_first_is_a_reason_until_the_wait_is_up() {
        let epoch = Timestamp::from_secs(1_767_225_600);
        let mut fleet = synthetic::fleet(4, 2);
        fleet.tpus[1].provisioning_model = crate::spec::ProvisioningModel::OnDemand;
        let on_demand = fleet.tpus[1].id.to_string();
        let reasons_at = |after: Option<i64>, waited: i64| -> Vec<String> {
            let mut fleet = fleet.clone();
            fleet.policy.fallback.on_demand_after_secs = after;
            let (mut state, obs) = synthetic::planning_instance(&fleet, 40, 60, epoch);
            let now = epoch.plus_secs(waited);
            let engine = Engine::new(fleet, EngineConfig::default(), Box::new(Classic));
            let out = engine.reconcile(&mut state, &obs, now);
            explain(engine.index(), &state, &obs, &out, now)
                .into_iter()
                .flat_map(|w| w.reasons().map(str::to_owned).collect::<Vec<_>>())
                .filter(|r| r.contains(&on_demand))
                .collect()
        };
        let soon = reasons_at(Some(1800), 100);
        assert!(!soon.is_empty());
        assert!(
            soon.iter()
                .all(|r| r.starts_with("Spot first: on-demand entries") && r.contains(" at ")),
            "{soon:?}"
        );
        let never = reasons_at(None, 100);
        assert!(
            !never.is_empty() && never.iter().all(|r| r.starts_with("Spot only")),
            "{never:?}"
        );
        let open = reasons_at(Some(1800), 2 * 86_400);
        assert!(open.iter().all(|r| !r.contains("Spot first")), "{open:?}");
    }

    /// A page of the queue is the whole queue's rows, cut: the same order, positions and
    /// reasons as listing everything, whatever the filter and the page size.
    #[test]
    fn a_page_of_the_queue_is_the_whole_queue_cut() {
        let epoch = Timestamp::from_secs(1_767_225_600);
        let fleet = synthetic::fleet(20, 3);
        let (state, _) = synthetic::planning_instance(&fleet, 2_000, 60, epoch);
        let engine = Engine::new(fleet, EngineConfig::default(), Box::new(Classic));
        let now = epoch.plus_secs(100);
        let all = queue(&engine, &state, now, |_| true, 0);
        assert_eq!((all.rows.len(), all.more), (state.jobs.len(), 0));
        let key = |q: &Queued<'_>| {
            (
                q.job.id,
                q.position,
                q.why
                    .as_ref()
                    .map(|w| w.reasons().map(str::to_owned).collect::<Vec<_>>()),
            )
        };
        let even = |j: &crate::engine::state::Job| j.id.as_str().ends_with(['0', '2', '4']);
        for (limit, shown) in [(1, false), (50, false), (50, true), (3_000, true)] {
            let page = queue(&engine, &state, now, |j| !shown || even(j), limit);
            let expected: Vec<_> = all
                .rows
                .iter()
                .filter(|q| !shown || even(q.job))
                .map(key)
                .collect();
            let cut = expected.len().min(limit);
            assert_eq!(
                page.rows.iter().map(key).collect::<Vec<_>>(),
                expected[..cut]
            );
            assert_eq!(page.more, expected.len() - cut);
        }
        assert!(all.rows.iter().any(|q| q.why.is_some()), "nothing waits");
    }
}
