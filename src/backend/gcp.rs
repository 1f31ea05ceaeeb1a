//! `GcpBackend`, the `CloudBackend` over the TPU API: the API's objects and refusals turned
//! into what the engine reads, the inventory read of a pass (one listing per zone and kind,
//! all zones at once, adopted TPUs by exact name), a pass's creates and deletes (with the
//! original's labels, metadata, network and service account, a `requestId` each) and its
//! launches and cancels (through `Workers`) run at once with a bound. Every refusal becomes a
//! `CloudFailure` the engine plans around; nothing here panics on what the API returns. It
//! must not hold state between passes beyond caches.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;

use super::workers::{Call, Workers};
use super::{BackendError, CloudBackend, InFlight, Inventory, Outcome, Refreshed};
use crate::engine::observe::{
    AttemptReport, CloudFailure, Health, LABEL_FLEET_ENTRY, LABEL_MANAGED_BY, NodeInfo, NodeState,
    QrState, QueuedResourceInfo,
};
use crate::engine::{Action, InventoryScope, Timestamp};
use crate::gcp::http::ApiError;
use crate::gcp::tpu::{self, Node, QrRequest, QueuedResource};
use crate::spec::fleet::SshTransport;
use crate::spec::{FleetSpec, Name, NameMap, TpuType};

/// The engine's node state for the API's (unknown and hiding states read as `Repairing`:
/// not usable, not gone, so nothing is deleted or assigned on a state this build does not
/// know).
pub fn node_state(state: &str) -> NodeState {
    match state {
        "CREATING" => NodeState::Creating,
        "READY" => NodeState::Ready,
        "RESTARTING" | "REIMAGING" => NodeState::Restarting,
        "REPAIRING" => NodeState::Repairing,
        "STOPPING" => NodeState::Stopping,
        "STARTING" => NodeState::Starting,
        "STOPPED" => NodeState::Stopped,
        "PREEMPTED" => NodeState::Preempted,
        "TERMINATED" => NodeState::Terminated,
        "DELETING" => NodeState::Deleting,
        _ => NodeState::Repairing,
    }
}

/// The engine's health for the API's (omitted means healthy, §7).
pub fn health(health: &str) -> Health {
    match health {
        "" | "HEALTHY" | "HEALTH_UNSPECIFIED" => Health::Healthy,
        "TIMEOUT" => Health::Timeout,
        "UNHEALTHY_TENSORFLOW" => Health::UnhealthyTensorflow,
        "UNHEALTHY_MAINTENANCE" => Health::UnhealthyMaintenance,
        _ => Health::Unhealthy,
    }
}

/// The engine's queued-resource state for the API's (an unknown state reads as `Creating`:
/// live and waited on).
pub fn qr_state(state: &str) -> QrState {
    match state {
        "ACCEPTED" => QrState::Accepted,
        "WAITING_FOR_RESOURCES" => QrState::WaitingForResources,
        "PROVISIONING" => QrState::Provisioning,
        "ACTIVE" => QrState::Active,
        "FAILED" => QrState::Failed,
        "DELETING" => QrState::Deleting,
        "SUSPENDING" => QrState::Suspending,
        "SUSPENDED" => QrState::Suspended,
        _ => QrState::Creating,
    }
}

fn tpu_type(accelerator: &str) -> Result<TpuType, String> {
    let short = accelerator.rsplit('/').next().unwrap_or(accelerator);
    TpuType::parse(short).map_err(|e| format!("accelerator type `{accelerator}`: {e}"))
}

/// What the engine reads of a node listed in `zone`; an error for a node whose type this
/// build cannot read (it is left out of the observation and reported).
pub fn node_info(node: &Node, zone: &str) -> Result<NodeInfo, String> {
    Ok(NodeInfo {
        name: Name::new(node.id()),
        zone: Name::new(zone),
        tpu_type: tpu_type(&node.accelerator_type)?,
        state: node_state(&node.state),
        health: health(&node.health),
        spot: node.is_spot(),
        reserved: node.is_reserved(),
        labels: Arc::new(node.labels.clone()),
        queued_resource: (!node.queued_resource.is_empty())
            .then(|| Name::new(node.queued_resource.rsplit('/').next().unwrap_or_default())),
        worker_count: (node.network_endpoints.len() as u32).max(1),
        public_ip: node
            .network_endpoints
            .iter()
            .any(|e| !e.access_config.external_ip.is_empty()),
    })
}

/// What the engine reads of a queued resource listed in `zone`.
pub fn qr_info(qr: &QueuedResource, zone: &str) -> Result<QueuedResourceInfo, String> {
    let spec = qr
        .node_spec()
        .ok_or_else(|| format!("queued resource {} names no node", qr.id()))?;
    Ok(QueuedResourceInfo {
        name: Name::new(qr.id()),
        zone: Name::new(zone),
        node_id: Name::new(&spec.node_id),
        tpu_type: tpu_type(&spec.node.accelerator_type)?,
        state: qr_state(&qr.state.state),
        spot: qr.is_spot(),
        reserved: qr.is_reserved(),
        labels: Arc::new(qr.labels().clone()),
        failure: qr.state.error.clone(),
    })
}

/// The engine's kind of a refusal: stockouts and quotas by what the API says, rate limits,
/// absent and existing objects, and everything whose outcome is unknown (5xx, timeouts, lost
/// connections) apart from permanent refusals (permission, bad request).
pub fn cloud_failure(e: &ApiError) -> CloudFailure {
    let text = e.to_string();
    let lower = e.message.to_ascii_lowercase();
    let stockout = lower.contains("no more capacity")
        || lower.contains("insufficient capacity")
        || lower.contains("stockout")
        || lower.contains("out of capacity");
    let quota = lower.contains("quota");
    let rate = lower.contains("per minute")
        || lower.contains("rate limit")
        || lower.contains("too many requests");
    match (e.code, e.status.as_str()) {
        (404, _) | (_, "NOT_FOUND") => CloudFailure::NotFound(text),
        (_, "ALREADY_EXISTS") => CloudFailure::AlreadyExists(text),
        _ if stockout => CloudFailure::Stockout(text),
        (429, _) if quota && !rate => CloudFailure::QuotaExhausted(text),
        (429, _) => CloudFailure::RateLimited(text),
        (_, "RESOURCE_EXHAUSTED") if quota => CloudFailure::QuotaExhausted(text),
        (_, "RESOURCE_EXHAUSTED") => CloudFailure::Stockout(text),
        (0, "UNAUTHENTICATED") => CloudFailure::Permanent(text),
        (0, _) | (500..=599, _) | (_, "UNAVAILABLE" | "DEADLINE_EXCEEDED" | "ABORTED") => {
            CloudFailure::Unavailable(text)
        }
        _ => CloudFailure::Permanent(text),
    }
}

/// A read that failed: the pass is skipped.
fn read_error(what: &str, e: &ApiError) -> BackendError {
    BackendError {
        message: format!("{what}: {e}"),
    }
}

/// Reads the inventory `scope` names through `client` into `inventory` (replaced whole):
/// every zone's nodes and queued resources labelled `managed-by` = the runner (one paginated
/// listing per zone and kind, zones at once), then the adopted nodes by exact name; the
/// zones' other objects go to `others`. An object equal to one the lists held keeps that
/// one's allocation (the engine recognises unchanged objects by address, and skips what did
/// not change). Objects this build cannot read are left out and returned as notes; any
/// failed call fails the read.
pub fn read_inventory(
    client: &tpu::Client,
    scope: &InventoryScope<'_>,
    inventory: &mut Inventory,
) -> Result<Vec<String>, BackendError> {
    let zones: Vec<String> = scope.zones.iter().map(|z| z.to_string()).collect();
    let ours = |labels: &BTreeMap<String, String>| {
        labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(scope.runner)
    };
    let adopted = |zone: &str, name: &str| scope.adopted.contains(&(zone, name));
    let mut notes = Vec::new();
    let Inventory {
        nodes,
        queued_resources: qrs,
        others,
    } = inventory;
    others.clear();
    let old_nodes = Kept::of(nodes, |n| (n.zone, n.name));
    let old_qrs = Kept::of(qrs, |q| (q.zone, q.name));
    for (zone, listed) in zones.iter().zip(client.list_nodes(&zones)) {
        for node in listed.map_err(|e| read_error(&format!("listing nodes in {zone}"), &e))? {
            let mine = ours(&node.labels);
            if !mine && adopted(zone, node.id()) {
                // Read by name below.
                continue;
            }
            match node_info(&node, zone) {
                Ok(info) if mine => nodes.push(old_nodes.reuse(info, |n| (n.zone, n.name))),
                Ok(info) => others.nodes.push(info),
                Err(e) => notes.push(format!("node {} in {zone} left out: {e}", node.id())),
            }
        }
    }
    for (zone, listed) in zones.iter().zip(client.list_queued_resources(&zones)) {
        for qr in
            listed.map_err(|e| read_error(&format!("listing queued resources in {zone}"), &e))?
        {
            match qr_info(&qr, zone) {
                Ok(info) if ours(qr.labels()) => {
                    qrs.push(old_qrs.reuse(info, |q| (q.zone, q.name)));
                }
                // The request behind an adopted TPU: its chips are the TPU's, counted once.
                Ok(info) if adopted(zone, info.node_id.as_str()) => {}
                Ok(info) => others.queued_resources.push(info),
                Err(e) => notes.push(format!(
                    "queued resource {} in {zone} left out: {e}",
                    qr.id()
                )),
            }
        }
    }
    let adopted: Vec<(String, String)> = scope
        .adopted
        .iter()
        .map(|(zone, name)| ((*zone).to_owned(), (*name).to_owned()))
        .collect();
    for ((zone, name), got) in adopted.iter().zip(client.get_nodes(&adopted)) {
        let got =
            got.map_err(|e| read_error(&format!("reading adopted TPU {name} in {zone}"), &e))?;
        if let Some(node) = got {
            match node_info(&node, zone) {
                Ok(info) => nodes.push(old_nodes.reuse(info, |n| (n.zone, n.name))),
                Err(e) => notes.push(format!("adopted TPU {name} in {zone} left out: {e}")),
            }
        }
    }
    let key = |zone: &Name, name: &Name| (zone.as_str(), name.as_str());
    nodes.sort_by(|a, b| key(&a.zone, &a.name).cmp(&key(&b.zone, &b.name)));
    nodes.dedup_by(|a, b| a.zone == b.zone && a.name == b.name);
    qrs.sort_by(|a, b| key(&a.zone, &a.name).cmp(&key(&b.zone, &b.name)));
    others
        .nodes
        .sort_by(|a, b| key(&a.zone, &a.name).cmp(&key(&b.zone, &b.name)));
    others
        .queued_resources
        .sort_by(|a, b| key(&a.zone, &a.name).cmp(&key(&b.zone, &b.name)));
    Ok(notes)
}

/// The objects an inventory held, by (zone, name), to hand out again where unchanged.
struct Kept<T>(std::collections::HashMap<(Name, Name), Arc<T>>);

impl<T: PartialEq> Kept<T> {
    /// Takes `list`'s objects (the list is left empty).
    fn of(list: &mut Vec<Arc<T>>, key: impl Fn(&T) -> (Name, Name)) -> Kept<T> {
        Kept(list.drain(..).map(|o| (key(&o), o)).collect())
    }

    /// The kept object equal to `info`, or `info` newly allocated.
    fn reuse(&self, info: T, key: impl Fn(&T) -> (Name, Name)) -> Arc<T> {
        match self.0.get(&key(&info)) {
            Some(old) if **old == info => old.clone(),
            _ => Arc::new(info),
        }
    }
}

/// What every queued resource of a fleet is created with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateSettings {
    /// The runner (the `managed-by` label).
    pub runner: String,
    /// Project.
    pub project: String,
    /// VPC network.
    pub network: String,
    /// Subnetwork (in each zone's region).
    pub subnetwork: String,
    /// Workers get external IPs (SSH `direct`); IAP needs none.
    pub external_ips: bool,
    /// The workers' service account (empty: the project's default).
    pub service_account: String,
    /// `startup-script-url` metadata (empty: none).
    pub startup_script_url: String,
}

impl CreateSettings {
    /// The original's settings for `fleet` (§7): labels `managed-by` / `fleet-entry`, the
    /// runner bucket's startup script, the `<name>-worker` service account.
    pub fn of_fleet(fleet: &FleetSpec) -> CreateSettings {
        let bucket = fleet.bucket.trim_start_matches("gs://");
        CreateSettings {
            runner: fleet.name.clone(),
            project: fleet.project.clone(),
            network: fleet.network.clone(),
            subnetwork: fleet.subnetwork.clone(),
            external_ips: fleet.ssh_transport == SshTransport::Direct,
            service_account: format!(
                "{}-worker@{}.iam.gserviceaccount.com",
                fleet.name, fleet.project
            ),
            startup_script_url: if bucket.is_empty() {
                String::new()
            } else {
                format!("gs://{bucket}/artifacts/startup.sh")
            },
        }
    }

    /// The create request of an engine action.
    pub fn request(
        &self,
        name: &Name,
        node_id: &Name,
        zone: &Name,
        tpu_type: &TpuType,
        runtime: &str,
        entry_id: &Name,
    ) -> QrRequest {
        let mut metadata = BTreeMap::new();
        if !self.startup_script_url.is_empty() {
            metadata.insert(
                "startup-script-url".to_owned(),
                self.startup_script_url.clone(),
            );
        }
        QrRequest {
            model: crate::spec::ProvisioningModel::Spot,
            reservation: None,
            id: name.to_string(),
            node_id: node_id.to_string(),
            zone: zone.to_string(),
            accelerator_type: tpu_type.to_string(),
            runtime_version: runtime.to_owned(),
            network: self.network.clone(),
            subnetwork: self.subnetwork.clone(),
            external_ips: self.external_ips,
            service_account: self.service_account.clone(),
            labels: BTreeMap::from([
                (LABEL_MANAGED_BY.to_owned(), self.runner.clone()),
                (LABEL_FLEET_ENTRY.to_owned(), entry_id.to_string()),
            ]),
            metadata,
        }
    }
}

/// The `CloudBackend` over the TPU API and a set of workers.
pub struct GcpBackend {
    client: tpu::Client,
    settings: CreateSettings,
    workers: Box<dyn Workers>,
    /// Actions of one pass in flight at once at most (1: one after another, in order).
    pub concurrency: usize,
    /// What the last inventory read left out (objects this build cannot read), for the log.
    pub notes: Vec<String>,
    /// Workers of each TPU the last inventory read found, by (zone, name).
    worker_counts: std::collections::HashMap<(Name, Name), u32>,
}

impl std::fmt::Debug for GcpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GcpBackend({:?}, {})", self.client, self.settings.runner)
    }
}

impl GcpBackend {
    /// A backend over `client` creating with `settings`, its workers `workers`; 16 actions
    /// in flight at most.
    pub fn new(
        client: tpu::Client,
        settings: CreateSettings,
        workers: Box<dyn Workers>,
    ) -> GcpBackend {
        GcpBackend {
            client,
            settings,
            workers,
            concurrency: 16,
            notes: Vec::new(),
            worker_counts: Default::default(),
        }
    }

    /// HTTP requests made to the TPU API so far.
    pub fn api_calls(&self) -> u64 {
        self.client.calls()
    }

    fn call(&self, action: &Action) -> Call<Outcome> {
        let api = self.client.api();
        let request_id = uuid::Uuid::new_v4().to_string();
        let refused = |r: Result<(), ApiError>| match r {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::Refused(cloud_failure(&e)),
        };
        match action {
            Action::CreateQueuedResource {
                name,
                node_id,
                zone,
                tpu_type,
                runtime,
                entry_id,
                model,
                reservation,
            } => {
                let mut request = self
                    .settings
                    .request(name, node_id, zone, tpu_type, runtime, entry_id);
                request.model = *model;
                request.reservation = reservation.clone();
                Box::pin(async move {
                    refused(
                        api.create_queued_resource(&request, &request_id)
                            .await
                            .map(|_| ()),
                    )
                })
            }
            Action::DeleteQueuedResource { name, zone } => {
                let (name, zone) = (*name, *zone);
                Box::pin(async move {
                    refused(api.delete_queued_resource(&zone, &name, &request_id).await)
                })
            }
            Action::DeleteNode { name, zone } => {
                let (name, zone) = (*name, *zone);
                Box::pin(async move { refused(api.delete_node(&zone, &name).await) })
            }
            Action::Launch(launch) => self.workers.launch(launch),
            Action::Cancel {
                attempt_id,
                tpu_name,
                zone,
                notice,
                ..
            } => {
                let workers = self
                    .worker_counts
                    .get(&(*zone, *tpu_name))
                    .copied()
                    .unwrap_or(1);
                self.workers
                    .cancel(*attempt_id, *tpu_name, *zone, workers, *notice)
            }
            Action::RecoverDisk {
                tpu_name,
                zone,
                worker_count,
                ..
            } => self
                .workers
                .recover_disk(*tpu_name, *zone, (*worker_count).max(1)),
        }
    }
}

impl CloudBackend for GcpBackend {
    fn inventory(
        &mut self,
        scope: &InventoryScope<'_>,
        _now: Timestamp,
        inventory: &mut Inventory,
    ) -> Result<(), BackendError> {
        self.notes = read_inventory(&self.client, scope, inventory)?;
        self.worker_counts = inventory
            .nodes
            .iter()
            .map(|n| ((n.zone, n.name), n.worker_count))
            .collect();
        Ok(())
    }

    fn refresh_reports(
        &mut self,
        in_flight: &[InFlight],
        reports: &mut NameMap<AttemptReport>,
        _now: Timestamp,
    ) -> Result<Refreshed, BackendError> {
        let mut read = self.client.block_on(self.workers.reports(in_flight))?;
        // What changed against the map handed in: reports that differ, attempts that left,
        // and those the workers say they touched.
        let mut changed = Vec::new();
        let mut fresh = NameMap::default();
        for InFlight { attempt, .. } in in_flight {
            let report = read.reports.remove(attempt).unwrap_or_default();
            if reports.get(attempt) != Some(&report) {
                changed.push(*attempt);
            }
            fresh.insert(*attempt, report);
        }
        changed.extend(reports.keys().filter(|a| !fresh.contains_key(*a)).copied());
        for attempt in read.touched {
            if fresh.contains_key(&attempt) && !changed.contains(&attempt) {
                changed.push(attempt);
            }
        }
        *reports = fresh;
        Ok(Refreshed {
            read_at: read.read_at,
            changed: Some(changed),
        })
    }

    fn execute(&mut self, actions: &[Action], _now: Timestamp) -> Vec<Outcome> {
        let calls: Vec<Call<Outcome>> = actions.iter().map(|a| self.call(a)).collect();
        let bound = self.concurrency.max(1);
        self.client.block_on(
            futures_util::stream::iter(calls)
                .buffered(bound)
                .collect::<Vec<Outcome>>(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(code: u16, status: &str, message: &str) -> ApiError {
        ApiError {
            code,
            status: status.into(),
            message: message.into(),
        }
    }

    #[test]
    fn every_refusal_has_its_kind() {
        use CloudFailure as F;
        let kind = |e: ApiError| std::mem::discriminant(&cloud_failure(&e));
        let same = |f: F| std::mem::discriminant(&f);
        let cases = [
            (
                err(
                    429,
                    "RESOURCE_EXHAUSTED",
                    "There is no more capacity in the zone \"us-east1-d\"",
                ),
                same(F::Stockout(String::new())),
            ),
            (
                err(
                    400,
                    "RESOURCE_EXHAUSTED",
                    "Insufficient capacity for v6e-16",
                ),
                same(F::Stockout(String::new())),
            ),
            (
                err(
                    429,
                    "RESOURCE_EXHAUSTED",
                    "Quota 'TPUV6E_SPOT' exceeded. Limit: 32 in region us-east1",
                ),
                same(F::QuotaExhausted(String::new())),
            ),
            (
                err(403, "RESOURCE_EXHAUSTED", "quota TPUS_PER_PROJECT exceeded"),
                same(F::QuotaExhausted(String::new())),
            ),
            (
                err(
                    429,
                    "RESOURCE_EXHAUSTED",
                    "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute'",
                ),
                same(F::RateLimited(String::new())),
            ),
            (
                err(429, "", "Too Many Requests"),
                same(F::RateLimited(String::new())),
            ),
            (
                err(503, "UNAVAILABLE", "backend error"),
                same(F::Unavailable(String::new())),
            ),
            (
                err(500, "INTERNAL", "internal error"),
                same(F::Unavailable(String::new())),
            ),
            (
                err(0, "DEADLINE_EXCEEDED", "timed out"),
                same(F::Unavailable(String::new())),
            ),
            (
                err(0, "UNAVAILABLE", "connection refused"),
                same(F::Unavailable(String::new())),
            ),
            (
                err(
                    403,
                    "PERMISSION_DENIED",
                    "tpu.queuedResources.create denied",
                ),
                same(F::Permanent(String::new())),
            ),
            (
                err(0, "UNAUTHENTICATED", "no credentials"),
                same(F::Permanent(String::new())),
            ),
            (
                err(404, "NOT_FOUND", "Resource 'q' was not found"),
                same(F::NotFound(String::new())),
            ),
            (
                err(409, "ALREADY_EXISTS", "already exists"),
                same(F::AlreadyExists(String::new())),
            ),
            (
                err(400, "INVALID_ARGUMENT", "bad accelerator type"),
                same(F::Permanent(String::new())),
            ),
        ];
        for (e, want) in cases {
            assert_eq!(kind(e.clone()), want, "{e}");
        }
    }

    #[test]
    fn api_objects_read_as_the_engine_expects() {
        let node: Node = serde_json::from_str(include_str!(
            "../../tests/fixtures/tpu-api/node-v2-full.json"
        ))
        .unwrap();
        let info = node_info(&node, "us-east1-d").unwrap();
        assert_eq!(info.name, "lab-runner-east-v6e-1-1a2b3c4d");
        assert_eq!(
            (info.state, info.health),
            (NodeState::Ready, Health::Healthy)
        );
        assert_eq!(info.worker_count, 4);
        assert!(info.spot && info.public_ip);
        assert_eq!(
            info.queued_resource.unwrap(),
            "lab-runner-east-v6e-1-1a2b3c4d-qr"
        );
        let odd: Node =
            serde_json::from_str(include_str!("../../tests/fixtures/tpu-api/node-odd.json"))
                .unwrap();
        let odd = node_info(&odd, "europe-west4-a").unwrap();
        assert_eq!(
            odd.state,
            NodeState::Repairing,
            "unknown states are neither usable nor gone"
        );
        assert_eq!(odd.health, Health::Unhealthy);
        assert_eq!(odd.tpu_type.to_string(), "v4-32");
        assert!(!odd.public_ip);
        let qr: QueuedResource = serde_json::from_str(include_str!(
            "../../tests/fixtures/tpu-api/qr-v2-waiting.json"
        ))
        .unwrap();
        let qr = qr_info(&qr, "us-east1-d").unwrap();
        assert_eq!((qr.state, qr.spot), (QrState::WaitingForResources, true));
        assert_eq!(
            qr.labels.get("fleet-entry").map(String::as_str),
            Some("east-v6e")
        );
        let failed: QueuedResource = serde_json::from_str(include_str!(
            "../../tests/fixtures/tpu-api/qr-v2-failed.json"
        ))
        .unwrap();
        assert_eq!(
            qr_info(&failed, "us-east1-d").unwrap().state,
            QrState::Failed
        );
        let alpha: QueuedResource = serde_json::from_str(include_str!(
            "../../tests/fixtures/tpu-api/qr-v2alpha1.json"
        ))
        .unwrap();
        assert_eq!(
            qr_info(&alpha, "us-central2-b").unwrap().state,
            QrState::Active
        );
        let mut strange = node.clone();
        strange.accelerator_type = "tpu-from-the-future".into();
        assert!(
            node_info(&strange, "us-east1-d").is_err(),
            "an unreadable type is reported, not a panic"
        );
    }
}
