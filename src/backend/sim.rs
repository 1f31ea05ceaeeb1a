//! `SimBackend`: the `CloudBackend` over the simulated cloud. Translates engine actions into
//! simulator calls and simulator views into the observation types GCP would produce, on
//! virtual time (`epoch` + simulator milliseconds).

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use tpu_runner_sim::SimCloud;
use tpu_runner_sim::cloud::{self as simc, ApiError, CancelResult};

use super::{BackendError, CloudBackend, Inventory, Outcome};
use crate::engine::observe::{
    AttemptReport, CancelOutcome, CloudFailure, Health, LABEL_FLEET_ENTRY, LABEL_MANAGED_BY,
    NodeInfo, NodeState, QrState, QueuedResourceInfo, RemoteError, RemoteErrorKind, WorkerState,
    WorkerStatus,
};
use crate::engine::{Action, InventoryScope, Timestamp};
use crate::spec::{Name, NameMap, NameSet, TpuType};

/// The simulated cloud seen through the backend boundary.
#[derive(Debug)]
pub struct SimBackend {
    /// The simulated world.
    pub cloud: SimCloud,
    /// Wall-clock instant of simulator time 0.
    pub epoch: Timestamp,
    /// Runner name (for labels).
    pub runner: String,
    /// Whether nodes have public IPs (the fleet's `direct` transport needs them).
    pub public_ip: bool,
    /// Calls made so far by the pass that started at `.0` (for their latencies).
    calls: (u64, u32),
    /// Cloud objects converted to observation types, reused while unchanged.
    converted: Converted,
    /// The label set of each fleet entry's objects (only looked up).
    labels: NameMap<simc::Labels>,
    /// The size of the report map the last `refresh_reports` left (`None`: none kept, read
    /// every attempt next time).
    reports_kept: Option<usize>,
    /// Attempts of that map whose workers beat: their heartbeat is the time of every read
    /// until the simulator reports them changed.
    beating: NameSet,
}

/// Cloud objects already converted to observation types, by incarnation. An object is
/// converted again only when its incarnation (serial) or state changes, its only mutable
/// field, so an inventory read of an unchanged fleet copies nothing. Only looked up, never
/// iterated in an order that matters.
#[derive(Debug, Default)]
struct Converted {
    /// By serial (serials are unique across nodes and queued resources).
    nodes: FxHashMap<u64, Conversion<simc::NodeState, NodeInfo>>,
    qrs: FxHashMap<u64, Conversion<simc::QrState, QueuedResourceInfo>>,
    /// Reads so far; each entry remembers the last read that saw it.
    pass: u64,
}

/// One converted object: of which state, last seen by which read.
#[derive(Debug)]
struct Conversion<S, T> {
    of: S,
    seen: u64,
    info: Arc<T>,
}

/// The conversion of incarnation `serial` in state `of`, seen by read `pass`: the earlier one
/// if it is of the same state, else `make()`'s (`None`: not an object the engine can read).
fn convert<S: Eq, T>(
    cache: &mut FxHashMap<u64, Conversion<S, T>>,
    serial: u64,
    of: S,
    pass: u64,
    make: impl FnOnce() -> Option<T>,
) -> Option<Arc<T>> {
    if let Some(c) = cache.get_mut(&serial).filter(|c| c.of == of) {
        c.seen = pass;
        return Some(c.info.clone());
    }
    let info = Arc::new(make()?);
    let conversion = Conversion {
        of,
        seen: pass,
        info: info.clone(),
    };
    cache.insert(serial, conversion);
    Some(info)
}

impl Converted {
    fn node(&mut self, n: &simc::NodeView<'_>, public_ip: bool) -> Option<Arc<NodeInfo>> {
        convert(&mut self.nodes, n.serial, n.state, self.pass, || {
            Some(NodeInfo {
                tpu_type: TpuType::parse(n.accelerator).ok()?,
                name: Name::new(n.name),
                zone: Name::new(n.zone),
                state: match n.state {
                    simc::NodeState::Creating => NodeState::Creating,
                    simc::NodeState::Ready => NodeState::Ready,
                    simc::NodeState::Preempted => NodeState::Preempted,
                    simc::NodeState::Deleting => NodeState::Deleting,
                },
                health: Health::Healthy,
                spot: n.spot,
                labels: n.labels.clone(),
                queued_resource: n.queued_resource.map(Name::new),
                worker_count: n.hosts,
                public_ip,
            })
        })
    }

    fn queued_resource(&mut self, q: &simc::QrView<'_>) -> Option<Arc<QueuedResourceInfo>> {
        convert(&mut self.qrs, q.serial, q.state, self.pass, || {
            Some(QueuedResourceInfo {
                tpu_type: TpuType::parse(q.accelerator).ok()?,
                name: Name::new(q.name),
                zone: Name::new(q.zone),
                node_id: Name::new(q.node_id),
                state: match q.state {
                    simc::QrState::WaitingForResources => QrState::WaitingForResources,
                    simc::QrState::Provisioning => QrState::Provisioning,
                    simc::QrState::Active => QrState::Active,
                    simc::QrState::Failed => QrState::Failed,
                    simc::QrState::Suspended => QrState::Suspended,
                    simc::QrState::Deleting => QrState::Deleting,
                },
                spot: true,
                labels: q.labels.clone(),
            })
        })
    }

    /// Drops what the last read did not see (deleted objects).
    fn forget_unseen(&mut self) {
        let pass = self.pass;
        self.nodes.retain(|_, c| c.seen == pass);
        self.qrs.retain(|_, c| c.seen == pass);
    }
}

impl SimBackend {
    /// Every report of `in_flight` read afresh, the cache left alone (what `refresh_reports`
    /// must agree with; the chaos runs check it on every pass).
    pub fn read_reports(&self, in_flight: &[(Name, Name)]) -> NameMap<AttemptReport> {
        in_flight
            .iter()
            .map(|(attempt, _)| (*attempt, self.read_report(attempt).0))
            .collect()
    }

    /// What the workers of `attempt` report, and whether they beat.
    fn read_report(&self, attempt: &Name) -> (AttemptReport, bool) {
        let Some(view) = self.cloud.attempt(attempt) else {
            return (AttemptReport::default(), false);
        };
        let statuses = view
            .statuses
            .iter()
            .map(|s| WorkerStatus {
                host: s.host.clone(),
                state: match s.state {
                    "succeeded" => WorkerState::Succeeded,
                    "failed_setup" => WorkerState::FailedSetup,
                    _ => WorkerState::Failed,
                },
                command_exit_code: s.exit_code,
                finished_at: Some(self.at(s.finished_at)),
                infrastructure_failure: s.infrastructure_failure.map(str::to_owned),
                artifact_upload_error: None,
            })
            .collect();
        let report = AttemptReport {
            launched: view.launched,
            launch_error: None,
            cancel: None,
            statuses,
            heartbeat_at: view.heartbeat_at.map(|t| self.at(t)),
        };
        (report, view.beating)
    }

    /// The backend of runner `runner` over `cloud`, whose time 0 is `epoch`; `public_ip`:
    /// nodes get public addresses.
    pub fn new(cloud: SimCloud, epoch: Timestamp, runner: &str, public_ip: bool) -> SimBackend {
        SimBackend {
            cloud,
            epoch,
            runner: runner.to_owned(),
            public_ip,
            calls: (u64::MAX, 0),
            converted: Converted::default(),
            labels: NameMap::default(),
            reports_kept: None,
            beating: NameSet::default(),
        }
    }

    /// Simulator milliseconds of `now`.
    pub fn millis(&self, now: Timestamp) -> u64 {
        (now.0 - self.epoch.0).max(0) as u64
    }

    fn at(&self, millis: u64) -> Timestamp {
        self.epoch.plus_millis(millis as i64)
    }
}

fn api_failure(e: ApiError, what: &str) -> CloudFailure {
    match e {
        ApiError::RateLimited => {
            CloudFailure::RateLimited(format!("{what}: 429 too many requests"))
        }
        ApiError::Unavailable => {
            CloudFailure::Unavailable(format!("{what}: 503 backend unavailable"))
        }
        ApiError::Timeout => CloudFailure::Unavailable(format!("{what}: deadline exceeded")),
        ApiError::AlreadyExists => CloudFailure::AlreadyExists(format!("{what}: already exists")),
        ApiError::NotFound => CloudFailure::NotFound(format!("{what}: not found")),
        ApiError::NoSuchPool => {
            CloudFailure::Stockout(format!("{what}: no such accelerator in this zone"))
        }
    }
}

fn read_error(e: ApiError, what: &str) -> BackendError {
    BackendError {
        message: format!("inventory read of {what} failed: {e:?}"),
    }
}

impl CloudBackend for SimBackend {
    fn inventory(
        &mut self,
        scope: &InventoryScope<'_>,
        _now: Timestamp,
    ) -> Result<Inventory, BackendError> {
        let label = (LABEL_MANAGED_BY, scope.runner);
        let public_ip = self.public_ip;
        let cache = &mut self.converted;
        cache.pass += 1;
        let mut nodes = Vec::new();
        for zone in &scope.zones {
            for n in self
                .cloud
                .list_nodes(zone, label)
                .map_err(|e| read_error(e, zone))?
            {
                nodes.extend(cache.node(&n, public_ip));
            }
        }
        // Listed zone by zone, each in name order: sorted already unless adopted TPUs join.
        if !scope.adopted.is_empty() {
            for (zone, name) in &scope.adopted {
                let found = self
                    .cloud
                    .get_node(zone, name)
                    .map_err(|e| read_error(e, name))?;
                nodes.extend(found.and_then(|n| cache.node(&n, public_ip)));
            }
            nodes.sort_by(|a, b| (&a.zone, &a.name).cmp(&(&b.zone, &b.name)));
            nodes.dedup_by(|a, b| a.name == b.name);
        }
        let mut qrs = Vec::new();
        for zone in &scope.zones {
            for q in self
                .cloud
                .list_queued_resources(zone, label)
                .map_err(|e| read_error(e, zone))?
            {
                qrs.extend(cache.queued_resource(&q));
            }
        }
        cache.forget_unseen();
        Ok((nodes, qrs))
    }

    fn refresh_reports(
        &mut self,
        in_flight: &[(Name, Name)],
        reports: &mut NameMap<AttemptReport>,
        _now: Timestamp,
    ) -> Result<(), BackendError> {
        let changed: NameSet = self
            .cloud
            .take_report_changes()
            .iter()
            .filter_map(|a| Name::existing(a))
            .collect();
        if self.reports_kept != Some(reports.len()) {
            reports.clear();
            self.beating.clear();
        }
        // Attempts no longer in flight leave (counted first: on most passes none did).
        let kept = in_flight
            .iter()
            .filter(|(a, _)| reports.contains_key(a))
            .count();
        if kept != reports.len() {
            let keep: NameSet = in_flight.iter().map(|(a, _)| *a).collect();
            reports.retain(|a, _| keep.contains(a));
            self.beating.retain(|a| keep.contains(a));
        }
        let heartbeat = self.at(self.cloud.now());
        for (attempt, _) in in_flight {
            if !changed.contains(attempt)
                && let Some(report) = reports.get_mut(attempt)
            {
                if self.beating.contains(attempt) {
                    report.heartbeat_at = Some(heartbeat);
                }
                continue;
            }
            let (report, beating) = self.read_report(attempt);
            reports.insert(*attempt, report);
            if beating {
                self.beating.insert(*attempt);
            } else {
                self.beating.remove(attempt);
            }
        }
        self.reports_kept = Some(reports.len());
        Ok(())
    }

    fn execute(&mut self, action: &Action, now: Timestamp) -> Outcome {
        // Calls are made one after another: the world moves on while each one is in flight.
        let pass = self.millis(now);
        if self.calls.0 != pass {
            self.calls = (pass, 0);
        }
        let kind = match action {
            Action::Launch(_) | Action::Cancel { .. } => tpu_runner_sim::CallKind::Remote,
            _ => tpu_runner_sim::CallKind::Mutation,
        };
        let latency = self.cloud.call_latency_ms(kind, pass, self.calls.1);
        self.calls.1 += 1;
        self.cloud.advance_to(self.cloud.now() + latency);
        match action {
            Action::CreateQueuedResource {
                name,
                node_id,
                zone,
                tpu_type,
                entry_id,
                ..
            } => {
                // One label set per entry, shared by its objects (as a listing filters them).
                let labels = match self.labels.get(entry_id) {
                    Some(labels) => labels.clone(),
                    None => {
                        let labels = Arc::new(BTreeMap::from([
                            (LABEL_MANAGED_BY.to_owned(), self.runner.clone()),
                            (LABEL_FLEET_ENTRY.to_owned(), entry_id.to_string()),
                        ]));
                        self.labels.insert(*entry_id, labels.clone());
                        labels
                    }
                };
                match self.cloud.create_queued_resource(
                    zone,
                    name,
                    node_id,
                    &tpu_type.to_string(),
                    labels,
                ) {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::Refused(api_failure(e, name)),
                }
            }
            Action::DeleteQueuedResource { name, zone } => {
                match self.cloud.delete_queued_resource(zone, name) {
                    Ok(()) | Err(ApiError::NotFound) => Outcome::Done,
                    Err(e) => Outcome::Refused(api_failure(e, name)),
                }
            }
            Action::DeleteNode { name, zone } => match self.cloud.delete_node(zone, name) {
                Ok(()) | Err(ApiError::NotFound) => Outcome::Done,
                Err(e) => Outcome::Refused(api_failure(e, name)),
            },
            Action::Launch(l) => {
                match self
                    .cloud
                    .launch(&l.zone, &l.tpu_name, &l.attempt_id, &l.job_id)
                {
                    Ok(()) => Outcome::Done,
                    Err(simc::RemoteError::NotFound) => Outcome::LaunchFailed(RemoteError {
                        kind: RemoteErrorKind::NotFound,
                        message: format!(
                            "NOT_FOUND: projects/sim/locations/{}/nodes/{} was not found",
                            l.zone, l.tpu_name
                        ),
                    }),
                    Err(simc::RemoteError::Temporary) => Outcome::LaunchFailed(RemoteError {
                        kind: RemoteErrorKind::Temporary,
                        message: format!("ssh: connect to host {}: Connection refused", l.tpu_name),
                    }),
                }
            }
            Action::Cancel {
                attempt_id,
                tpu_name,
                zone,
                ..
            } => match self.cloud.cancel(zone, tpu_name, attempt_id) {
                Ok(CancelResult::Sent) => Outcome::Cancelled(CancelOutcome::Sent),
                Ok(CancelResult::NotRunning) => Outcome::Cancelled(CancelOutcome::NotRunning),
                Ok(CancelResult::Mismatch) => Outcome::Cancelled(CancelOutcome::AttemptMismatch),
                Err(simc::RemoteError::NotFound) => Outcome::Cancelled(CancelOutcome::NotRunning),
                Err(simc::RemoteError::Temporary) => Outcome::Cancelled(CancelOutcome::Error {
                    error: RemoteError {
                        kind: RemoteErrorKind::Temporary,
                        message: "ssh: connection refused".into(),
                    },
                }),
            },
        }
    }
}
