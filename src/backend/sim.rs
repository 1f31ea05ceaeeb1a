//! `SimBackend`: the `CloudBackend` over the simulated cloud. Translates engine actions into
//! simulator calls and simulator views into the observation types GCP would produce, on
//! virtual time (`epoch` + simulator milliseconds).

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use tpu_runner_sim::SimCloud;
use tpu_runner_sim::cloud::{self as simc, ApiError, CancelResult, Listing};
use ustr::Ustr;

use super::{BackendError, CloudBackend, InFlight, Inventory, Outcome, Refreshed};
use crate::engine::observe::{
    AttemptReport, CancelOutcome, CloudFailure, Health, LABEL_FLEET_ENTRY, LABEL_MANAGED_BY,
    NodeInfo, NodeState, Others, QrState, QueuedResourceInfo, RemoteError, RemoteErrorKind,
    WorkerState, WorkerStatus,
};
use crate::engine::{Action, InventoryScope, Timestamp};
use crate::gcp::http;
use crate::spec::{Name, NameMap, ProvisioningModel, TpuType};

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
    /// The last inventory read, reused where nothing changed.
    listings: Listings,
    /// The label set of each fleet entry's objects (only looked up).
    labels: NameMap<simc::Labels>,
    /// The cloud's TPU types, parsed.
    types: TpuTypes,
    /// The size of the report map the last `refresh_reports` left (`None`: none kept, read
    /// every attempt next time), and the attempts in flight then.
    reports_kept: Option<usize>,
    in_flight: Vec<InFlight>,
    /// The lists the last inventory read left (`None`: none, or a read failed).
    produced: Option<Produced>,
}

/// The version of a zone's kept listing (to ask the cloud whether it changed since).
fn version<S, T>(kept: &Option<(u64, Vec<Converted<S, T>>)>) -> Option<u64> {
    kept.as_ref().map(|(version, _)| *version)
}

/// The version of a listing that answered with the zone's objects (`None`: unchanged since
/// the version the caller keeps).
fn listed_version<I>(listing: Result<Listing<I>, ApiError>) -> Result<Option<u64>, ApiError> {
    Ok(match listing? {
        Listing::Unchanged => None,
        Listing::Changed { version, .. } => Some(version),
    })
}

/// The lists the last successful inventory read left: over which zones, and their lengths.
#[derive(Debug)]
struct Produced {
    zones: Vec<Name>,
    nodes: usize,
    qrs: usize,
}

/// What the last inventory read converted to observation types, kept so that a zone with
/// nothing changed is answered without converting anything, and an unchanged cloud object
/// keeps its observation object (the engine recognises those by address).
#[derive(Debug, Default)]
struct Listings {
    /// Per zone (only looked up): its last node and queued-resource listings.
    zones: NameMap<ZoneListing>,
    /// Adopted nodes (read by name every pass) as converted by the last read.
    adopted: Vec<Converted<simc::NodeState, NodeInfo>>,
}

/// One zone's last listings: their versions and conversions, in name order.
#[derive(Debug, Default)]
struct ZoneListing {
    nodes: Option<(u64, Vec<Converted<simc::NodeState, NodeInfo>>)>,
    qrs: Option<(u64, Vec<Converted<simc::QrState, QueuedResourceInfo>>)>,
    /// The zone's objects the listings leave out (someone else's), as of the listings'
    /// versions.
    others: Option<(ListingVersions, Others)>,
}

/// The versions of a zone's node and queued-resource listings.
type ListingVersions = (Option<u64>, Option<u64>);

/// A cloud object converted: its incarnation (serial) and state, the only field that
/// changes during an incarnation, and the observation object.
#[derive(Debug)]
struct Converted<S, T> {
    serial: u64,
    state: S,
    info: Arc<T>,
}

/// The conversions a listing left, by incarnation (serials are unique across objects), so
/// that converting a zone of n objects costs O(n), not O(n²).
type Previous<S, T> = FxHashMap<u64, Converted<S, T>>;

/// `old` by incarnation.
fn previous<S, T>(old: Vec<Converted<S, T>>) -> Previous<S, T> {
    old.into_iter().map(|c| (c.serial, c)).collect()
}

/// The conversion of incarnation `serial` in state `state`: the one in `old` if there is one
/// of the same state, else `make()`'s (`None`: not an object the engine can read).
fn convert<S: Copy + Eq, T>(
    old: &Previous<S, T>,
    serial: u64,
    state: S,
    make: impl FnOnce() -> Option<T>,
) -> Option<Converted<S, T>> {
    let info = match old.get(&serial).filter(|c| c.state == state) {
        Some(c) => c.info.clone(),
        None => Arc::new(make()?),
    };
    Some(Converted {
        serial,
        state,
        info,
    })
}

/// How a zone's kept listing is to be brought up to date.
enum Update<W, D> {
    /// Nothing in the zone changed.
    Unchanged,
    /// The listing's version and the zone's objects, whole, in name order.
    Whole(u64, W),
    /// The listing's version and the names the cloud changed since the kept version, each
    /// with what the listing holds under it now (none: gone or not listed).
    Delta(u64, D),
}

/// A zone's kept listing (version and conversions) brought up to date by `update`: whole
/// listings replace it, each object converted by `make` unless the kept listing holds it
/// in the same incarnation and state (see `convert`); deltas replace just the objects they
/// name (found by `name_of`, the kept listing being in name order), on the same rule. Its
/// objects are then in `out` from `*at` on (edited in place over the kept listing's run
/// when `in_place`, where an unchanged zone costs nothing; else appended), and `*at` moves
/// past them.
#[allow(clippy::too_many_arguments)]
fn keep<S: Copy + Eq, T, V>(
    kept: &mut Option<(u64, Vec<Converted<S, T>>)>,
    update: Update<impl Iterator<Item = V>, impl Iterator<Item = (Ustr, Option<V>)>>,
    incarnation: impl Fn(&V) -> (u64, S),
    make: impl Fn(&V) -> Option<T>,
    name_of: impl Fn(&T) -> Name,
    in_place: bool,
    out: &mut Vec<Arc<T>>,
    at: &mut usize,
) {
    let held = kept
        .as_ref()
        .filter(|_| in_place)
        .map_or(0, |(_, l)| l.len());
    let start = *at;
    // Whether the zone's run in `out` is written whole (else edited in place, if at all).
    let whole = !in_place || matches!(update, Update::Whole(..));
    match update {
        Update::Unchanged => {}
        Update::Whole(version, objects) => {
            let old = previous(kept.take().map(|(_, old)| old).unwrap_or_default());
            let new = objects
                .filter_map(|o| {
                    let (serial, state) = incarnation(&o);
                    convert(&old, serial, state, || make(&o))
                })
                .collect();
            *kept = Some((version, new));
        }
        Update::Delta(version, changed) => {
            let (kept_version, listed) = kept.as_mut().expect("a delta is of a kept listing");
            *kept_version = version;
            let edit = !whole;
            for (name, object) in changed {
                let found =
                    listed.binary_search_by(|c| name_of(&c.info).as_str().cmp(name.as_str()));
                let now = object.as_ref().map(&incarnation);
                if let (Ok(i), Some((serial, state))) = (found, now)
                    && listed[i].serial == serial
                    && listed[i].state == state
                {
                    continue;
                }
                let converted = object.zip(now).and_then(|(o, (serial, state))| {
                    Some(Converted {
                        serial,
                        state,
                        info: Arc::new(make(&o)?),
                    })
                });
                match (found, converted) {
                    (Ok(i), Some(c)) => {
                        if edit {
                            out[start + i] = c.info.clone();
                        }
                        listed[i] = c;
                    }
                    (Ok(i), None) => {
                        listed.remove(i);
                        if edit {
                            out.remove(start + i);
                        }
                    }
                    (Err(i), Some(c)) => {
                        if edit {
                            out.insert(start + i, c.info.clone());
                        }
                        listed.insert(i, c);
                    }
                    (Err(_), None) => {}
                }
            }
        }
    }
    let listed = kept.as_ref().map_or(&[][..], |(_, listed)| listed);
    if whole {
        out.splice(start..start + held, listed.iter().map(|c| c.info.clone()));
    }
    *at += listed.len();
}

/// TPU types by the simulated cloud's accelerator text: its pools' types, parsed once (a
/// parse interns the family: a lock on a table shared by the whole process); any other text
/// is parsed when seen.
#[derive(Debug, Default)]
struct TpuTypes(rustc_hash::FxHashMap<String, TpuType>);

impl TpuTypes {
    fn of(cloud: &SimCloud) -> TpuTypes {
        let pools = &cloud.config().pools;
        TpuTypes(
            pools
                .iter()
                .filter_map(|p| Some((p.accelerator.clone(), TpuType::parse(&p.accelerator).ok()?)))
                .collect(),
        )
    }

    fn get(&self, text: &str) -> Option<TpuType> {
        match self.0.get(text) {
            Some(t) => Some(t.clone()),
            None => TpuType::parse(text).ok(),
        }
    }
}

fn node_info(n: &simc::NodeView<'_>, public_ip: bool, types: &TpuTypes) -> Option<NodeInfo> {
    Some(NodeInfo {
        tpu_type: types.get(n.accelerator)?,
        name: Name::from_ustr(n.name),
        zone: Name::from_ustr(n.zone),
        state: match n.state {
            simc::NodeState::Creating => NodeState::Creating,
            simc::NodeState::Ready => NodeState::Ready,
            simc::NodeState::Preempted => NodeState::Preempted,
            simc::NodeState::Deleting => NodeState::Deleting,
        },
        health: Health::Healthy,
        spot: n.spot,
        reserved: n.reserved,
        labels: n.labels.clone(),
        queued_resource: n.queued_resource.map(Name::from_ustr),
        worker_count: n.hosts,
        public_ip,
    })
}

/// The simulated pool model of a provisioning model.
pub fn pool_model(model: ProvisioningModel) -> tpu_runner_sim::PoolModel {
    match model {
        ProvisioningModel::Spot => tpu_runner_sim::PoolModel::Spot,
        ProvisioningModel::OnDemand => tpu_runner_sim::PoolModel::OnDemand,
        ProvisioningModel::Reserved => tpu_runner_sim::PoolModel::Reserved,
    }
}

fn qr_info(q: &simc::QrView<'_>, types: &TpuTypes) -> Option<QueuedResourceInfo> {
    Some(QueuedResourceInfo {
        tpu_type: types.get(q.accelerator)?,
        name: Name::from_ustr(q.name),
        zone: Name::from_ustr(q.zone),
        node_id: Name::from_ustr(q.node_id),
        state: match q.state {
            simc::QrState::WaitingForResources => QrState::WaitingForResources,
            simc::QrState::Provisioning => QrState::Provisioning,
            simc::QrState::Active => QrState::Active,
            simc::QrState::Failed => QrState::Failed,
            simc::QrState::Suspending => QrState::Suspending,
            simc::QrState::Suspended => QrState::Suspended,
            simc::QrState::Deleting => QrState::Deleting,
        },
        spot: q.model == tpu_runner_sim::PoolModel::Spot,
        reserved: q.model == tpu_runner_sim::PoolModel::Reserved,
        labels: q.labels.clone(),
        failure: (q.state == simc::QrState::Failed).then(|| simc::QR_FAILED_MESSAGE.to_owned()),
    })
}

impl SimBackend {
    /// The inventory of `scope` read afresh, converting everything and calling nothing (what
    /// `inventory` must agree with; the chaos runs check it on every pass).
    pub fn read_inventory(&self, scope: &InventoryScope<'_>) -> Inventory {
        let mut others = Others::default();
        for zone in scope.zones.iter() {
            self.others_in(*zone, scope, &mut others);
        }
        let label = (LABEL_MANAGED_BY, scope.runner);
        let mut nodes: Vec<Arc<NodeInfo>> = scope
            .zones
            .iter()
            .flat_map(|zone| self.cloud.peek_nodes(zone.ustr(), label))
            .chain(scope.adopted.iter().filter_map(|(zone, name)| {
                self.cloud.peek_node(Ustr::from(zone), Ustr::from(name))
            }))
            .filter_map(|n| node_info(&n, self.public_ip, &self.types).map(Arc::new))
            .collect();
        nodes.sort_by(|a, b| (&a.zone, &a.name).cmp(&(&b.zone, &b.name)));
        nodes.dedup_by(|a, b| a.name == b.name);
        let qrs = scope
            .zones
            .iter()
            .flat_map(|zone| self.cloud.peek_queued_resources(zone.ustr(), label))
            .filter_map(|q| qr_info(&q, &self.types).map(Arc::new))
            .collect();
        Inventory {
            nodes,
            queued_resources: qrs,
            others,
        }
    }

    /// Whether `found`, someone else's objects in `zone` as of its listings' versions `at`,
    /// still holds: each object the cloud changed since is listed under `label` (this
    /// runner's) or gone, and none of them is in `found`. `false` when the cloud cannot tell.
    fn others_unchanged(
        &self,
        zone: Ustr,
        at: ListingVersions,
        found: &Others,
        label: (&str, &str),
    ) -> bool {
        let cloud = &self.cloud;
        let (Some(nodes_at), Some(qrs_at)) = at else {
            return false;
        };
        let (Some(mut nodes), Some(mut qrs)) = (
            cloud.nodes_changed_since(zone, nodes_at),
            cloud.queued_resources_changed_since(zone, qrs_at),
        ) else {
            return false;
        };
        let node_kept = |name: Ustr| {
            !found.nodes.iter().any(|n| n.name.ustr() == name)
                && (cloud.peek_node(zone, name)).is_none_or(|n| simc::labelled(n.labels, label))
        };
        let qr_kept = |name: Ustr| {
            !found.queued_resources.iter().any(|q| q.name.ustr() == name)
                && (cloud.peek_queued_resource(zone, name))
                    .is_none_or(|q| simc::labelled(q.labels, label))
        };
        nodes.all(node_kept) && qrs.all(qr_kept)
    }

    /// Appends the objects of `zone` that are neither this runner's nor adopted to `others`.
    fn others_in(&self, zone: Name, scope: &InventoryScope<'_>, others: &mut Others) {
        let label = (LABEL_MANAGED_BY, scope.runner);
        let adopted =
            |n: &simc::NodeView<'_>| scope.adopted.contains(&(n.zone.as_str(), n.name.as_str()));
        others.nodes.extend(
            self.cloud
                .peek_other_nodes(zone.ustr(), label)
                .filter(|n| !adopted(n))
                .filter_map(|n| node_info(&n, self.public_ip, &self.types)),
        );
        // The request behind an adopted TPU: its chips are the TPU's, counted once.
        others.queued_resources.extend(
            self.cloud
                .peek_other_queued_resources(zone.ustr(), label)
                .filter_map(|q| qr_info(&q, &self.types))
                .filter(|q| {
                    !scope
                        .adopted
                        .contains(&(q.zone.as_str(), q.node_id.as_str()))
                }),
        );
    }

    /// Every report of `in_flight` read afresh, the cache left alone (what `refresh_reports`
    /// must agree with; the chaos runs check it on every pass).
    pub fn read_reports(&self, in_flight: &[InFlight]) -> NameMap<AttemptReport> {
        in_flight
            .iter()
            .map(|f| (f.attempt, self.read_report(&f.attempt)))
            .collect()
    }

    /// What the workers of `attempt` report (a beating run's heartbeat is the read's time).
    fn read_report(&self, attempt: &Name) -> AttemptReport {
        let Some(view) = self.cloud.attempt(attempt.ustr()) else {
            return AttemptReport::default();
        };
        let statuses = view
            .statuses
            .iter()
            .map(|s| WorkerStatus {
                host: s.host.to_string(),
                state: match s.state {
                    "succeeded" => WorkerState::Succeeded,
                    "failed_setup" => WorkerState::FailedSetup,
                    _ => WorkerState::Failed,
                },
                command_exit_code: s.exit_code,
                finished_at: Some(self.at(s.finished_at)),
                infrastructure_failure: s.infrastructure_failure.map(str::to_owned),
                artifact_upload_error: None,
                setup_error: (s.state == "failed_setup")
                    .then(|| "the simulated set-up failed".to_owned()),
            })
            .collect();
        AttemptReport {
            launched: view.launched,
            launch_error: None,
            cancel: None,
            statuses,
            heartbeat_at: (!view.beating)
                .then(|| view.heartbeat_at.map(|t| self.at(t)))
                .flatten(),
            beating: view.beating,
        }
    }

    /// The backend of runner `runner` over `cloud`, whose time 0 is `epoch`; `public_ip`:
    /// nodes get public addresses.
    pub fn new(cloud: SimCloud, epoch: Timestamp, runner: &str, public_ip: bool) -> SimBackend {
        SimBackend {
            types: TpuTypes::of(&cloud),
            cloud,
            epoch,
            runner: runner.to_owned(),
            public_ip,
            listings: Listings::default(),
            labels: NameMap::default(),
            reports_kept: None,
            in_flight: Vec::new(),
            produced: None,
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

/// A refusal of the simulated cloud as the TPU API words it (the emulator replies with
/// exactly this), for the object `what` (a queued resource or node id) in `zone`.
pub fn api_refusal(e: &ApiError, zone: &str, what: &str) -> http::ApiError {
    let (code, status, message) = match e {
        ApiError::RateLimited => (
            429,
            "RESOURCE_EXHAUSTED",
            "Quota exceeded for quota metric 'Requests' and limit 'Requests per minute' of service 'tpu.googleapis.com'".to_owned(),
        ),
        ApiError::Unavailable => (503, "UNAVAILABLE", "The service is currently unavailable.".to_owned()),
        ApiError::Timeout => (504, "DEADLINE_EXCEEDED", "Deadline exceeded".to_owned()),
        ApiError::AlreadyExists => (409, "ALREADY_EXISTS", format!("Resource '{what}' already exists")),
        ApiError::NotFound => (404, "NOT_FOUND", format!("Resource '{what}' was not found")),
        ApiError::NoSuchPool => (
            429,
            "RESOURCE_EXHAUSTED",
            format!("There is no more capacity in the zone \"{zone}\"; it offers no such accelerator type"),
        ),
        ApiError::NoSuchReservation => (
            400,
            "INVALID_ARGUMENT",
            format!("Reservation for '{what}' not found in zone \"{zone}\" for this accelerator type"),
        ),
    };
    http::ApiError {
        code,
        status: status.to_owned(),
        message,
    }
}

/// What the engine hears of a refusal: read from its API wording, as the GCP backend reads it.
fn api_failure(e: ApiError, zone: &str, what: &str) -> CloudFailure {
    super::gcp::cloud_failure(&api_refusal(&e, zone, what))
}

/// A launch that failed on the workers, worded as the simulated workers' transport words it.
pub fn launch_error(e: &simc::RemoteError, zone: &str, tpu: &str) -> RemoteError {
    match e {
        simc::RemoteError::NotFound => RemoteError {
            kind: RemoteErrorKind::NotFound,
            message: format!("NOT_FOUND: projects/sim/locations/{zone}/nodes/{tpu} was not found"),
        },
        simc::RemoteError::Temporary => RemoteError {
            kind: RemoteErrorKind::Temporary,
            message: format!("ssh: connect to host {tpu}: Connection refused"),
        },
    }
}

/// A cancel that could not reach the workers.
pub fn cancel_unreachable() -> CancelOutcome {
    CancelOutcome::Error {
        error: RemoteError {
            kind: RemoteErrorKind::Temporary,
            message: "ssh: connection refused".into(),
        },
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
        inventory: &mut Inventory,
    ) -> Result<(), BackendError> {
        let Inventory {
            nodes,
            queued_resources: qrs,
            others,
        } = inventory;
        let label = (LABEL_MANAGED_BY, scope.runner);
        let public_ip = self.public_ip;
        let types = &self.types;
        // The lists left last time, over the same zones and without adopted nodes: only the
        // zones that changed are replaced in them (each zone's objects are one run).
        let in_place = scope.adopted.is_empty()
            && self.produced.take().is_some_and(|p| {
                p.nodes == nodes.len()
                    && p.qrs == qrs.len()
                    && p.zones.iter().eq(scope.zones.iter())
            });
        if !in_place {
            nodes.clear();
            qrs.clear();
        }
        let listings = &mut self.listings;
        let mut at = 0;
        for zone in scope.zones.iter() {
            let kept = &mut listings.zones.entry(*zone).or_default().nodes;
            let known = version(kept);
            let listing = self.cloud.list_nodes(zone.ustr(), label, known);
            let listed = listed_version(listing).map_err(|e| read_error(e, zone))?;
            let cloud = &self.cloud;
            let z = zone.ustr();
            let update = match (listed, known) {
                (None, _) => Update::Unchanged,
                (Some(v), Some(known)) if let Some(names) = cloud.nodes_changed_since(z, known) => {
                    let now = |name| {
                        cloud
                            .peek_node(z, name)
                            .filter(|n| simc::labelled(n.labels, label))
                    };
                    Update::Delta(v, names.map(move |name| (name, now(name))))
                }
                (Some(v), _) => Update::Whole(v, cloud.peek_nodes(z, label)),
            };
            let incarnation = |n: &simc::NodeView<'_>| (n.serial, n.state);
            let make = |n: &simc::NodeView<'_>| node_info(n, public_ip, types);
            let name_of = |n: &NodeInfo| n.name;
            keep(
                kept,
                update,
                incarnation,
                make,
                name_of,
                in_place,
                nodes,
                &mut at,
            );
        }
        // Listed zone by zone, each in name order: sorted already unless adopted TPUs join.
        if !scope.adopted.is_empty() {
            let old = previous(std::mem::take(&mut listings.adopted));
            for (zone, name) in &scope.adopted {
                let found = self
                    .cloud
                    .get_node(Ustr::from(zone), Ustr::from(name))
                    .map_err(|e| read_error(e, name))?;
                let converted = found.and_then(|n| {
                    convert(&old, n.serial, n.state, || node_info(&n, public_ip, types))
                });
                if let Some(c) = converted {
                    nodes.push(c.info.clone());
                    listings.adopted.push(c);
                }
            }
            nodes.sort_by(|a, b| (&a.zone, &a.name).cmp(&(&b.zone, &b.name)));
            nodes.dedup_by(|a, b| a.name == b.name);
        }
        let mut at = 0;
        for zone in scope.zones.iter() {
            let kept = &mut listings.zones.entry(*zone).or_default().qrs;
            let known = version(kept);
            let listing = self.cloud.list_queued_resources(zone.ustr(), label, known);
            let listed = listed_version(listing).map_err(|e| read_error(e, zone))?;
            let cloud = &self.cloud;
            let z = zone.ustr();
            let update = match (listed, known) {
                (None, _) => Update::Unchanged,
                (Some(v), Some(known))
                    if let Some(names) = cloud.queued_resources_changed_since(z, known) =>
                {
                    let now = |name| {
                        (cloud.peek_queued_resource(z, name))
                            .filter(|q| simc::labelled(q.labels, label))
                    };
                    Update::Delta(v, names.map(move |name| (name, now(name))))
                }
                (Some(v), _) => Update::Whole(v, cloud.peek_queued_resources(z, label)),
            };
            let incarnation = |q: &simc::QrView<'_>| (q.serial, q.state);
            let name_of = |q: &QueuedResourceInfo| q.name;
            keep(
                kept,
                update,
                incarnation,
                |q: &simc::QrView<'_>| qr_info(q, types),
                name_of,
                in_place,
                qrs,
                &mut at,
            );
        }
        // Someone else's objects: read again only in zones where one of them may have
        // changed (in a simulation nobody else creates anything, so this finds nothing).
        others.clear();
        for zone in scope.zones.iter() {
            let Some(listing) = self.listings.zones.get(zone) else {
                continue;
            };
            let versions = (version(&listing.nodes), version(&listing.qrs));
            let stale = match &listing.others {
                None => true,
                Some((at, _)) if *at == versions => false,
                Some((at, found)) => !self.others_unchanged(zone.ustr(), *at, found, label),
            };
            if stale {
                let mut found = Others::default();
                self.others_in(*zone, scope, &mut found);
                let listing = self.listings.zones.get_mut(zone).expect("looked up");
                listing.others = Some((versions, found));
            } else {
                let listing = self.listings.zones.get_mut(zone).expect("looked up");
                listing.others.as_mut().expect("kept").0 = versions;
            }
            let (_, found) = self.listings.zones[zone].others.as_ref().expect("set");
            others.nodes.extend(found.nodes.iter().cloned());
            others
                .queued_resources
                .extend(found.queued_resources.iter().cloned());
        }
        self.produced = Some(Produced {
            zones: scope.zones.iter().copied().collect(),
            nodes: nodes.len(),
            qrs: qrs.len(),
        });
        Ok(())
    }

    fn refresh_reports(
        &mut self,
        in_flight: &[InFlight],
        reports: &mut NameMap<AttemptReport>,
        _now: Timestamp,
    ) -> Result<Refreshed, BackendError> {
        let touched = self.cloud.take_report_changes();
        let read_at = self.at(self.cloud.now());
        let kept = self.reports_kept == Some(reports.len());
        let mut changed = Vec::new();
        if kept {
            // Who joined and who left, walking both lists in job-id order (names compared
            // as text only where they differ).
            let last = std::mem::take(&mut self.in_flight);
            let (mut i, mut j) = (0, 0);
            loop {
                let (left, joined) = match (last.get(i), in_flight.get(j)) {
                    (None, None) => break,
                    (Some(a), Some(b)) if a == b => (None, None),
                    (Some(a), Some(b)) if a.job == b.job => (Some(a), Some(b)),
                    (Some(a), Some(b)) if a.job < b.job => (Some(a), None),
                    (Some(a), None) => (Some(a), None),
                    (_, b) => (None, b),
                };
                if let Some(f) = left {
                    reports.remove(&f.attempt);
                    changed.push(f.attempt);
                }
                if let Some(f) = joined {
                    reports.insert(f.attempt, self.read_report(&f.attempt));
                    changed.push(f.attempt);
                }
                let same = left.is_none() && joined.is_none();
                i += usize::from(same || left.is_some());
                j += usize::from(same || joined.is_some());
            }
            // Runs whose workers wrote, stopped or started since (any still in flight).
            for attempt in touched.into_iter().map(Name::from_ustr) {
                if let Some(report) = reports.get_mut(&attempt) {
                    *report = self.read_report(&attempt);
                    changed.push(attempt);
                }
            }
        } else {
            reports.clear();
            reports.extend(
                in_flight
                    .iter()
                    .map(|f| (f.attempt, self.read_report(&f.attempt))),
            );
        }
        self.in_flight.clear();
        self.in_flight.extend_from_slice(in_flight);
        self.reports_kept = Some(reports.len());
        Ok(Refreshed {
            read_at,
            changed: kept.then_some(changed),
        })
    }

    fn execute(&mut self, actions: &[Action], now: Timestamp) -> Vec<Outcome> {
        actions.iter().map(|a| self.execute_one(a, now)).collect()
    }
}

impl SimBackend {
    /// Carries out one action. Calls are made one after another (the model of a controller
    /// with one call in flight): the world moves on while each one is in flight.
    fn execute_one(&mut self, action: &Action, now: Timestamp) -> Outcome {
        let pass = self.millis(now);
        let kind = match action {
            Action::Launch(_) | Action::Cancel { .. } | Action::RecoverDisk { .. } => {
                tpu_runner_sim::CallKind::Remote
            }
            _ => tpu_runner_sim::CallKind::Mutation,
        };
        let latency = self.cloud.take_call_latency_ms(kind, pass);
        self.cloud.advance_to(self.cloud.now() + latency);
        match action {
            Action::CreateQueuedResource {
                name,
                node_id,
                zone,
                tpu_type,
                entry_id,
                model,
                reservation,
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
                    zone.ustr(),
                    name.ustr(),
                    node_id.ustr(),
                    &tpu_type.to_string(),
                    pool_model(*model),
                    reservation.as_deref(),
                    labels,
                ) {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::Refused(api_failure(e, zone, name)),
                }
            }
            Action::DeleteQueuedResource { name, zone } => {
                match self.cloud.delete_queued_resource(zone.ustr(), name.ustr()) {
                    Ok(()) | Err(ApiError::NotFound) => Outcome::Done,
                    Err(e) => Outcome::Refused(api_failure(e, zone, name)),
                }
            }
            Action::DeleteNode { name, zone } => {
                match self.cloud.delete_node(zone.ustr(), name.ustr()) {
                    Ok(()) | Err(ApiError::NotFound) => Outcome::Done,
                    Err(e) => Outcome::Refused(api_failure(e, zone, name)),
                }
            }
            Action::Launch(l) => {
                match self.cloud.launch(
                    l.zone.ustr(),
                    l.tpu_name.ustr(),
                    l.attempt_id.ustr(),
                    l.job_id.ustr(),
                ) {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::LaunchFailed(launch_error(&e, &l.zone, &l.tpu_name)),
                }
            }
            Action::Cancel {
                attempt_id,
                tpu_name,
                zone,
                notice,
                ..
            } => match self.cloud.cancel(
                zone.ustr(),
                tpu_name.ustr(),
                attempt_id.ustr(),
                notice.is_some(),
            ) {
                Ok(CancelResult::Sent) => Outcome::Cancelled(CancelOutcome::Sent),
                Ok(CancelResult::NotRunning) => Outcome::Cancelled(CancelOutcome::NotRunning),
                Ok(CancelResult::Mismatch) => Outcome::Cancelled(CancelOutcome::AttemptMismatch),
                Err(simc::RemoteError::NotFound) => Outcome::Cancelled(CancelOutcome::NotRunning),
                Err(simc::RemoteError::Temporary) => Outcome::Cancelled(cancel_unreachable()),
            },
            // The simulated cloud has no disks to fill: every worker has enough.
            Action::RecoverDisk {
                tpu_name,
                worker_count,
                ..
            } => Outcome::DiskRecovery(Ok(sufficient(tpu_name, *worker_count))),
        }
    }
}

/// The answer of workers with room to spare (a simulated TPU's disks never fill).
pub fn sufficient(tpu: &Name, workers: u32) -> Vec<String> {
    (0..workers.max(1))
        .map(|i| format!("TPU_RUNNER_DISK_RECOVERY {tpu}-w-{i} SUFFICIENT 0 0 0 0"))
        .collect()
}
