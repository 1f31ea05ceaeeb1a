//! A compact case language for engine tests: a fleet, jobs, resources, nodes, queued
//! resources and worker reports written in a few lines of YAML, turned into a `State` and an
//! `Observation`. Times are seconds after a fixed epoch. Shared by the engine test binaries.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use tpu_runner::engine::observe::{
    AttemptReport, DiskRecovery, Health, LABEL_FLEET_ENTRY, LABEL_MANAGED_BY, NodeInfo, NodeState,
    QrState, QueuedResourceInfo,
};
use tpu_runner::engine::state::{
    Attempt, AttemptStatus, BucketRegion, EndReason, FailureCounter, Job, JobStatus, Owner,
    Placement, Resource, ResourceStatus, State,
};
use tpu_runner::engine::{FleetIndex, Observation, Timestamp};
use tpu_runner::spec::{self, FleetSpec, JobSpec, Name, Priority, TpuRequest, TpuType};

/// Seconds since this epoch are used throughout the cases (2026-01-01T00:00:00Z).
pub const EPOCH: i64 = 1_767_225_600;

pub fn at(secs: i64) -> Timestamp {
    Timestamp::from_secs(EPOCH + secs)
}

/// A fleet with the usual header and the given entries (YAML flow mappings, one per line).
pub fn fleet(entries: &str) -> FleetSpec {
    let text = format!(
        "name: runner\nproject: my-project-123\ncontroller_region: us-central1\ncontroller_timeout: 168h\nfirestore_location: nam5\nnetwork: default\nsubnetwork: default\nssh_transport: iap\ntpus:\n{entries}"
    );
    spec::parse_fleet("case-fleet.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// What the case shows.
    pub about: String,
    /// Fleet entries (YAML text, one flow mapping per line, indented by two spaces).
    pub fleet: String,
    /// Optional fleet-level settings appended to the header (e.g. `idle_timeout_seconds: 0`).
    #[serde(default)]
    pub fleet_settings: String,
    /// `now`, seconds after the epoch.
    pub now: i64,
    #[serde(default)]
    pub jobs: Vec<CaseJob>,
    #[serde(default)]
    pub resources: Vec<CaseResource>,
    #[serde(default)]
    pub nodes: Vec<CaseNode>,
    #[serde(default)]
    pub qrs: Vec<CaseQr>,
    #[serde(default)]
    pub reports: BTreeMap<String, AttemptReport>,
    /// Entries removed from the fleet whose records the state still holds (names only).
    #[serde(default)]
    pub removed: String,
    /// Run a second pass at this time with the same observation (checks idempotence).
    #[serde(default)]
    pub again_at: Option<i64>,
    /// What the previous pass's disk recoveries answered.
    #[serde(default)]
    pub disk_recoveries: Vec<CaseRecovery>,
    /// Someone else's nodes and queued resources in the listed zones, as observed.
    #[serde(default)]
    pub others: tpu_runner::engine::observe::Others,
}

/// A disk recovery's answer: its workers' lines, or an error.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRecovery {
    /// Resource reference (see [`CaseResource::tpu`]).
    pub tpu: String,
    #[serde(default)]
    pub answers: Vec<String>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseJob {
    pub id: String,
    pub tpu: String,
    #[serde(default = "pending")]
    pub status: JobStatus,
    #[serde(default)]
    pub submitted_at: i64,
    /// Regions with a bucket (bucket name derived: `gs://b-<region>`).
    pub regions: Vec<String>,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub tpu_name: Option<String>,
    #[serde(default = "yes")]
    pub retry: bool,
    #[serde(default)]
    pub pinned: Option<String>,
    #[serde(default)]
    pub attempt: Option<CaseAttempt>,
    #[serde(default)]
    pub infra_failures: u32,
    #[serde(default)]
    pub not_before: Option<i64>,
    /// Earlier attempts a cloud preemption ended at these times, in the pinned region.
    #[serde(default)]
    pub preempted_at: Vec<i64>,
    #[serde(default)]
    pub move_checkpoints: bool,
}

fn pending() -> JobStatus {
    JobStatus::Pending
}
fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseAttempt {
    pub id: String,
    /// Resource reference (see [`CaseResource::tpu`]).
    pub tpu: String,
    pub status: AttemptStatus,
    #[serde(default)]
    pub created_at: i64,
    #[serde(default)]
    pub started_at: Option<i64>,
    #[serde(default)]
    pub launch_failures: u32,
    #[serde(default)]
    pub lost: Option<String>,
    /// The job of higher priority it is being stopped for.
    #[serde(default)]
    pub displaced_by: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseResource {
    /// `entry#k` for managed ordinal k of `entry`, or `entry` for an adopted entry.
    pub tpu: String,
    pub status: ResourceStatus,
    /// `[job, attempt]`.
    #[serde(default)]
    pub owner: Option<(String, String)>,
    #[serde(default = "one")]
    pub workers: u32,
    #[serde(default)]
    pub idle_since: Option<i64>,
    #[serde(default)]
    pub seen_at: Option<i64>,
    #[serde(default)]
    pub missing_since: Option<i64>,
    /// `[job, count]`.
    #[serde(default)]
    pub retryable_failures: Option<(String, u32)>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseNode {
    pub tpu: String,
    #[serde(default = "ready")]
    pub state: NodeState,
    #[serde(default)]
    pub health: Health,
    #[serde(default = "one")]
    pub workers: u32,
}

fn ready() -> NodeState {
    NodeState::Ready
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseQr {
    pub tpu: String,
    pub state: QrState,
}

/// Parses a case file.
pub fn read_case(text: &str) -> Case {
    let node = spec::yaml::parse("case.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_value(spec::yaml::to_json(&node)).unwrap_or_else(|e| panic!("bad case: {e}"))
}

/// The fleet of a case.
pub fn case_fleet(case: &Case) -> FleetSpec {
    fleet_text(case, &case.fleet)
}

/// The fleet plus the removed entries: only for naming records of removed entries.
pub fn naming_index(case: &Case) -> FleetIndex {
    FleetIndex::new(fleet_text(case, &format!("{}{}", case.fleet, case.removed)))
}

fn fleet_text(case: &Case, entries: &str) -> FleetSpec {
    let text = format!(
        "name: runner\nproject: my-project-123\ncontroller_region: us-central1\ncontroller_timeout: 168h\nfirestore_location: nam5\nnetwork: default\nsubnetwork: default\nssh_transport: iap\n{}\ntpus:\n{}",
        case.fleet_settings, entries
    );
    spec::parse_fleet("case-fleet.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

/// Resolves `entry#k` / `entry` to (entry index, node name, resource id).
pub fn resolve(index: &FleetIndex, tpu: &str) -> (usize, Name, Name) {
    let (entry_id, ordinal) = match tpu.split_once('#') {
        Some((e, k)) => (e, Some(k.parse::<u32>().expect("ordinal"))),
        None => (tpu, None),
    };
    let e = index
        .entry_index(&Name::new(entry_id))
        .unwrap_or_else(|| panic!("unknown entry {entry_id}"));
    let entry = index.entry(e);
    match (ordinal, &entry.kind) {
        (Some(k), _) => {
            let name = Name::new(&entry.node_name(index.runner(), k));
            (e, name, name)
        }
        (None, spec::EntryKind::Adopted { existing }) => (
            e,
            Name::new(existing),
            Resource::id_for(Name::new(existing), true),
        ),
        (None, _) => panic!("{tpu}: managed entries need #ordinal"),
    }
}

pub fn job_spec(
    id: &str,
    tpu: &str,
    zone: Option<String>,
    tpu_name: Option<String>,
    priority: Priority,
    retry: bool,
) -> JobSpec {
    JobSpec {
        id: id.into(),
        name: None,
        fresh_id: false,
        tpu: if tpu == "any" {
            TpuRequest::Any
        } else {
            TpuRequest::OneOf(
                tpu.split(',')
                    .map(|t| TpuType::parse(t.trim()).unwrap())
                    .collect(),
            )
        },
        bundle: ".".into(),
        command: "python train.py".into(),
        tpu_name,
        zone,
        buckets: vec![],
        caches: vec![],
        env: BTreeMap::new(),
        priority,
        retry_on_infrastructure_failure: retry,
        move_checkpoints: false,
    }
}

/// Builds the state and observation of a case.
pub fn build(case: &Case, index: &FleetIndex) -> (State, Observation) {
    let mut state = State::new();
    for j in &case.jobs {
        let mut spec = job_spec(
            &j.id,
            &j.tpu,
            j.zone.clone(),
            j.tpu_name.clone(),
            j.priority,
            j.retry,
        );
        let buckets: Vec<BucketRegion> = j
            .regions
            .iter()
            .map(|r| BucketRegion {
                region: r.clone(),
                bucket: format!("gs://b-{r}"),
            })
            .collect();
        spec.buckets = buckets.iter().map(|b| b.bucket.clone()).collect();
        let mut job = Job::new(spec, at(j.submitted_at), buckets);
        job.status = j.status;
        job.infra_failures = j.infra_failures;
        job.not_before = j.not_before.map(at);
        if let Some(region) = &j.pinned {
            job.placement = Some(Placement::new(region, &format!("gs://b-{region}")));
        }
        job.spec.move_checkpoints = j.move_checkpoints;
        for (k, t) in j.preempted_at.iter().enumerate() {
            let region = j
                .pinned
                .as_deref()
                .expect("earlier preemptions need `pinned`");
            let mut earlier = Attempt::new(
                Name::new(&format!("p{k}")),
                Name::new(&format!("gone-{k}")),
                Name::new(&format!("gone-{k}")),
                Name::new(&format!("{region}-b")),
                at(t - 600),
            );
            earlier
                .start(at(t - 500))
                .expect("a launching attempt starts");
            earlier
                .end(
                    AttemptStatus::Interrupted,
                    EndReason::Preempted,
                    None,
                    "TPU preempted or lost",
                    at(*t),
                )
                .expect("a running attempt ends");
            job.attempts.push(earlier);
            job.interruptions += 1;
        }
        if let Some(a) = &j.attempt {
            let (_, name, rid) = resolve(index, &a.tpu);
            let zone = index.entry(resolve(index, &a.tpu).0).zone;
            job.attempts.push(Attempt {
                id: Name::new(&a.id),
                resource_id: rid,
                tpu_name: name,
                zone,
                status: a.status,
                created_at: at(a.created_at),
                started_at: a.started_at.map(at),
                ended_at: None,
                end_reason: None,
                exit_code: None,
                error_summary: String::new(),
                launch_failures: a.launch_failures,
                failed_launch: false,
                stop_failures: 0,
                lost: a.lost.clone(),
                interrupting: false,
                displaced_by: a.displaced_by.as_deref().map(Name::new),
            });
            job.current_attempt = Some(Name::new(&a.id));
            if matches!(j.status, JobStatus::Running | JobStatus::Cancelling) {
                job.assigned_resource = Some(rid);
            }
        }
        state.jobs.insert(job.id, job);
    }
    for r in &case.resources {
        let (e, name, id) = resolve(index, &r.tpu);
        let entry = index.entry(e);
        state.resources.insert(
            id,
            Resource {
                id,
                owner: r.owner.as_ref().map(|(j, a)| Owner {
                    job_id: Name::new(j),
                    attempt_id: Name::new(a),
                }),
                worker_count: r.workers,
                idle_since: r.idle_since.map(at),
                provisioning_node_seen_at: r.seen_at.map(at),
                provisioning_node_missing_since: r.missing_since.map(at),
                retryable_failures: r.retryable_failures.as_ref().map(|(j, c)| FailureCounter {
                    job_id: Name::new(j),
                    attempt_id: None,
                    count: *c,
                }),
                ..Resource::new(name, entry, r.status, r.workers)
            },
        );
    }
    let mut obs = Observation::default();
    for n in &case.nodes {
        let (e, name, _) = resolve(index, &n.tpu);
        let entry = index.entry(e);
        let mut labels = BTreeMap::new();
        if !entry.is_adopted() {
            labels.insert(LABEL_MANAGED_BY.to_owned(), index.runner().to_owned());
            labels.insert(LABEL_FLEET_ENTRY.to_owned(), entry.id.to_string());
        }
        obs.nodes.push(Arc::new(NodeInfo {
            name,
            zone: entry.zone,
            tpu_type: entry.tpu_type.clone(),
            state: n.state,
            health: n.health,
            spot: entry.provisioning_model == spec::ProvisioningModel::Spot,
            reserved: entry.provisioning_model == spec::ProvisioningModel::Reserved,
            labels: labels.into(),
            queued_resource: (!entry.is_adopted())
                .then(|| spec::names::queued_resource_name(&name)),
            worker_count: n.workers,
            public_ip: false,
        }));
    }
    for q in &case.qrs {
        let (e, name, _) = resolve(index, &q.tpu);
        let entry = index.entry(e);
        let labels = BTreeMap::from([
            (LABEL_MANAGED_BY.to_owned(), index.runner().to_owned()),
            (LABEL_FLEET_ENTRY.to_owned(), entry.id.to_string()),
        ]);
        obs.queued_resources.push(Arc::new(QueuedResourceInfo {
            name: spec::names::queued_resource_name(&name),
            zone: entry.zone,
            node_id: name,
            tpu_type: entry.tpu_type.clone(),
            state: q.state,
            spot: entry.provisioning_model == spec::ProvisioningModel::Spot,
            reserved: entry.provisioning_model == spec::ProvisioningModel::Reserved,
            labels: labels.into(),
            failure: None,
        }));
    }
    obs.others = case.others.clone();
    obs.attempts = case
        .reports
        .clone()
        .into_iter()
        .map(|(id, report)| (Name::new(&id), report))
        .collect();
    for d in &case.disk_recoveries {
        let (_, _, resource_id) = resolve(index, &d.tpu);
        obs.disk_recoveries.push(DiskRecovery {
            resource_id,
            result: match &d.error {
                Some(e) => Err(e.clone()),
                None => Ok(d.answers.clone()),
            },
        });
    }
    (state, obs)
}

/// Replaces generated node names with `entry#k` so snapshots stay readable.
pub fn shorten(index: &FleetIndex, text: &str) -> String {
    let mut out = text.to_owned();
    for (e, names) in index.ordinals.iter().enumerate() {
        for (k, name) in names.iter().enumerate() {
            out = out.replace(name.as_str(), &format!("{}#{}", index.entry(e).id, k + 1));
        }
    }
    out
}
