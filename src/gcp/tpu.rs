//! Cloud TPU API v2 REST client: nodes and queued resources listed per zone (paginated,
//! several zones at once with a bound), nodes fetched by name, queued resources (Spot,
//! on-demand or in a reservation) created and deleted with a `requestId` (a retry after a lost reply is idempotent), nodes deleted
//! (absent is success), guest attributes read per worker, long-running operations read.
//! Every request carries only what its method declares in Google's discovery document
//! (`tests/google_conformance.rs` checks it). Proto-JSON is parsed tolerantly: unknown fields
//! and enum values, int64 as strings or numbers, omitted defaults, and the v2alpha1 shapes of
//! `original-behaviour.md` §7 (a bare-string `state`, a `nodeSpec` object). Every call has a
//! timeout, bounded retries with backoff and jitter (honouring `Retry-After`) and a
//! client-side rate limit per quota. Blocking API over a private runtime; knows nothing of
//! the engine.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};

pub use super::http::Endpoint;
use super::http::{self, ApiError, RetryPolicy, malformed, retryable, transport};
use crate::spec::ProvisioningModel;

/// `TPU_RUNNER_TPU_ENDPOINT` when set (an emulator, no credentials), else production.
pub fn endpoint_from_env() -> Endpoint {
    Endpoint::from_env("TPU_RUNNER_TPU_ENDPOINT", "https://tpu.googleapis.com")
}

/// An int64 written as a string (proto-JSON) or a number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Int64(pub i64);

impl<'de> Deserialize<'de> for Int64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::String(s) => Int64(s.parse().unwrap_or(0)),
            Value::Number(n) => Int64(n.as_i64().unwrap_or(0)),
            _ => Int64(0),
        })
    }
}

/// A TPU VM as the API returns it (fields this project reads; the rest are ignored).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Node {
    /// `projects/P/locations/Z/nodes/N` (or a bare id inside a queued resource's spec).
    pub name: String,
    /// `v6e-16`.
    pub accelerator_type: String,
    /// `READY`, `PREEMPTED` … (unknown values kept as they are).
    pub state: String,
    /// `HEALTHY` … (omitted means healthy).
    pub health: String,
    /// Free text.
    pub health_description: String,
    /// Software version.
    pub runtime_version: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Metadata (startup script …).
    pub metadata: BTreeMap<String, String>,
    /// Spot, preemptible, reserved.
    pub scheduling_config: SchedulingConfig,
    /// One per worker.
    pub network_endpoints: Vec<NetworkEndpoint>,
    /// Full name of the owning queued resource.
    pub queued_resource: String,
    /// Numeric id.
    pub id: Int64,
    /// RFC 3339.
    pub create_time: String,
    /// v2alpha1: `SPOT`, `ON_DEMAND` ….
    pub provisioning_model: String,
}

/// `schedulingConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SchedulingConfig {
    /// Preemptible (legacy Spot).
    pub preemptible: bool,
    /// Reserved.
    pub reserved: bool,
    /// Spot.
    pub spot: bool,
}

/// One worker's address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NetworkEndpoint {
    /// Internal IP.
    pub ip_address: String,
    /// Port (the emulator sets the worker's SSH port here).
    pub port: i64,
    /// External address, if any.
    pub access_config: AccessConfig,
}

/// `accessConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AccessConfig {
    /// Public IP (empty: none).
    pub external_ip: String,
}

impl Node {
    /// The last path segment of `name`.
    pub fn id(&self) -> &str {
        last_segment(&self.name)
    }

    /// Spot by any of the ways the API says so.
    pub fn is_spot(&self) -> bool {
        self.scheduling_config.spot
            || self.scheduling_config.preemptible
            || self.provisioning_model.eq_ignore_ascii_case("SPOT")
    }

    /// Created in a reservation (`schedulingConfig.reserved`; v2alpha1 `RESERVED`).
    pub fn is_reserved(&self) -> bool {
        self.scheduling_config.reserved || self.provisioning_model.eq_ignore_ascii_case("RESERVED")
    }
}

/// A queued resource as the API returns it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct QueuedResource {
    /// `projects/P/locations/Z/queuedResources/Q`.
    pub name: String,
    /// RFC 3339.
    pub create_time: String,
    /// The nodes it provisions.
    pub tpu: QrTpu,
    /// Present (`{}`) for the Spot tier.
    pub spot: Option<Value>,
    /// Present for the guaranteed tier (on-demand or reserved capacity).
    pub guaranteed: Option<Value>,
    /// `projects/P/locations/Z/reservations/R` when it asks for a reservation's capacity.
    pub reservation_name: String,
    /// The state and its data.
    pub state: QrState,
    /// v2alpha1 top-level labels.
    pub labels: BTreeMap<String, String>,
    /// v2alpha1: `SPOT` …
    pub provisioning_model: String,
}

/// `tpu` of a queued resource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct QrTpu {
    /// Node specs (a list in v2; one object in some v2alpha1 replies).
    #[serde(deserialize_with = "one_or_many")]
    pub node_spec: Vec<NodeSpec>,
}

/// One node a queued resource provisions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeSpec {
    /// `projects/P/locations/Z`.
    pub parent: String,
    /// The node id.
    pub node_id: String,
    /// The node's configuration.
    pub node: Node,
}

/// The state of a queued resource: `{state, stateInitiator, failedData…}` (v2) or a bare
/// string (some v2alpha1 replies).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QrState {
    /// `WAITING_FOR_RESOURCES`, `ACTIVE` … (unknown values kept).
    pub state: String,
    /// `USER`, `SERVICE` or empty.
    pub initiator: String,
    /// Why it failed (`failedData.error.message`), if it did.
    pub error: Option<String>,
}

impl<'de> Deserialize<'de> for QrState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::String(state) => QrState {
                state,
                ..QrState::default()
            },
            Value::Object(m) => {
                let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
                QrState {
                    state: text(m.get("state").or_else(|| m.get("name"))),
                    initiator: text(m.get("stateInitiator")),
                    error: m
                        .get("failedData")
                        .and_then(|f| f.get("error"))
                        .map(|e| text(e.get("message"))),
                }
            }
            _ => QrState::default(),
        })
    }
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<NodeSpec>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect(),
        v @ Value::Object(_) => serde_json::from_value(v).into_iter().collect(),
        _ => Vec::new(),
    })
}

impl QueuedResource {
    /// The last path segment of `name`.
    pub fn id(&self) -> &str {
        last_segment(&self.name)
    }

    /// The first node spec (tpu-runner requests one node per queued resource).
    pub fn node_spec(&self) -> Option<&NodeSpec> {
        self.tpu.node_spec.first()
    }

    /// Labels: top level (v2alpha1) or the node spec's.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        match self.node_spec() {
            Some(spec) if self.labels.is_empty() => &spec.node.labels,
            _ => &self.labels,
        }
    }

    /// Spot tier (the default of the original when nothing says otherwise: no tier, no
    /// reservation, no v2alpha1 model).
    pub fn is_spot(&self) -> bool {
        self.spot.is_some()
            || self.provisioning_model.eq_ignore_ascii_case("SPOT")
            || (self.guaranteed.is_none()
                && self.provisioning_model.is_empty()
                && self.reservation_name.is_empty())
    }

    /// Asks for a reservation's capacity: `reservationName` (v2), or v2alpha1's
    /// `guaranteed.reserved` or `RESERVED` model.
    pub fn is_reserved(&self) -> bool {
        !self.reservation_name.is_empty()
            || self
                .guaranteed
                .as_ref()
                .and_then(|g| g.get("reserved"))
                .and_then(Value::as_bool)
                .unwrap_or(false)
            || self.provisioning_model.eq_ignore_ascii_case("RESERVED")
    }
}

/// A long-running operation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Operation {
    /// `projects/P/locations/Z/operations/O`.
    pub name: String,
    /// Omitted while false.
    pub done: bool,
    /// Set when it failed.
    pub error: Option<Status>,
    /// The result, when done.
    pub response: Option<Value>,
}

/// `google.rpc.Status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Status {
    /// gRPC code.
    pub code: i64,
    /// Message.
    pub message: String,
}

/// Reads a proto-JSON object: `null` anywhere means the field's default (proto3 JSON), so
/// nulls are dropped before the typed read.
fn parse<T: serde::de::DeserializeOwned>(mut v: Value) -> Result<T, serde_json::Error> {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|_, x| !x.is_null());
                m.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    serde_json::from_value(v)
}

fn last_segment(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// What a queued resource is created with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QrRequest {
    /// Its tier: `spot`, or `guaranteed` for on-demand and reserved capacity.
    pub model: ProvisioningModel,
    /// The reservation (its last name segment) a `reserved` request asks in.
    pub reservation: Option<String>,
    /// Queued resource id.
    pub id: String,
    /// Node id.
    pub node_id: String,
    /// Zone.
    pub zone: String,
    /// `v6e-16`.
    pub accelerator_type: String,
    /// Software version.
    pub runtime_version: String,
    /// VPC network name.
    pub network: String,
    /// Subnetwork name (in the zone's region).
    pub subnetwork: String,
    /// Give workers external IPs (SSH `direct`); off for IAP.
    pub external_ips: bool,
    /// Worker service account email (empty: the project default).
    pub service_account: String,
    /// Labels (`managed-by`, `fleet-entry`).
    pub labels: BTreeMap<String, String>,
    /// Metadata (`startup-script-url`).
    pub metadata: BTreeMap<String, String>,
}

/// The body of `queuedResources.create` for `r` in `project` (ecosystem.md §3.1).
pub fn create_body(project: &str, r: &QrRequest) -> Value {
    let region = r
        .zone
        .rsplit_once('-')
        .map_or(r.zone.as_str(), |(region, _)| region);
    let mut node = json!({
        "acceleratorType": r.accelerator_type,
        "runtimeVersion": r.runtime_version,
        "networkConfig": {
            "network": format!("projects/{project}/global/networks/{}", r.network),
            "subnetwork": format!("projects/{project}/regions/{region}/subnetworks/{}", r.subnetwork),
            "enableExternalIps": r.external_ips,
        },
        "labels": r.labels,
        "metadata": r.metadata,
        "tags": ["tpu-runner"],
    });
    if !r.service_account.is_empty() {
        node["serviceAccount"] = json!({
            "email": r.service_account,
            "scope": ["https://www.googleapis.com/auth/cloud-platform"],
        });
    }
    let mut body = json!({
        "tpu": {"nodeSpec": [{
            "parent": format!("projects/{project}/locations/{}", r.zone),
            "nodeId": r.node_id,
            "node": node,
        }]},
    });
    // `tier` is a union of `spot` and `guaranteed`; a reservation is named beside it.
    match (r.model, &r.reservation) {
        (ProvisioningModel::Spot, _) => body["spot"] = json!({}),
        (ProvisioningModel::OnDemand, _) | (ProvisioningModel::Reserved, None) => {
            body["guaranteed"] = json!({})
        }
        (ProvisioningModel::Reserved, Some(reservation)) => {
            body["guaranteed"] = json!({});
            body["reservationName"] = json!(format!(
                "projects/{project}/locations/{}/reservations/{reservation}",
                r.zone
            ));
        }
    }
    body
}

/// Calls per minute the client allows itself, per quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quotas {
    /// Reads (list, get).
    pub reads_per_minute: u32,
    /// Writes (create, delete).
    pub writes_per_minute: u32,
}

impl Default for Quotas {
    fn default() -> Self {
        // Below the TPU API's default per-project quotas, so the controller queues its own
        // calls instead of being refused.
        Quotas {
            reads_per_minute: 900,
            writes_per_minute: 240,
        }
    }
}

/// Spaces calls of one quota at least `interval` apart.
#[derive(Debug)]
struct Pacer {
    interval: Duration,
    next: tokio::sync::Mutex<tokio::time::Instant>,
}

impl Pacer {
    fn new(per_minute: u32) -> Pacer {
        Pacer {
            interval: Duration::from_secs(60) / per_minute.max(1),
            next: tokio::sync::Mutex::new(tokio::time::Instant::now()),
        }
    }

    async fn wait(&self) {
        let slot = {
            let mut next = self.next.lock().await;
            let now = tokio::time::Instant::now();
            let slot = (*next).max(now);
            *next = slot + self.interval;
            slot
        };
        tokio::time::sleep_until(slot).await;
    }
}

/// The kind of a call, for its quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// The client.
pub struct Client {
    rt: tokio::runtime::Runtime,
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    endpoint: Endpoint,
    project: String,
    auth: Option<Arc<dyn gcp_auth::TokenProvider>>,
    policy: RetryPolicy,
    reads: Pacer,
    writes: Pacer,
    calls: AtomicU64,
    /// Calls of one request at a time in flight at most.
    concurrency: usize,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tpu::Client({} {})",
            self.inner.endpoint.base, self.inner.project
        )
    }
}

/// The per-call timeout.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

impl Client {
    /// A client for `project` at `endpoint`; production endpoints fetch Application
    /// Default Credentials now (a missing credential fails here).
    pub fn new(
        endpoint: Endpoint,
        project: &str,
        quotas: Quotas,
        policy: RetryPolicy,
    ) -> Result<Client, ApiError> {
        let (rt, http, auth) = http::connect(&endpoint, CALL_TIMEOUT)?;
        let inner = Inner {
            http,
            endpoint,
            project: project.to_owned(),
            auth,
            policy,
            reads: rt.block_on(async { Pacer::new(quotas.reads_per_minute) }),
            writes: rt.block_on(async { Pacer::new(quotas.writes_per_minute) }),
            calls: AtomicU64::new(0),
            concurrency: 16,
        };
        Ok(Client {
            rt,
            inner: Arc::new(inner),
        })
    }

    /// HTTP requests made so far (retries included).
    pub fn calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }

    /// Every node of each zone (all pages), zones read concurrently; one result per zone,
    /// in order.
    pub fn list_nodes(&self, zones: &[String]) -> Vec<Result<Vec<Node>, ApiError>> {
        self.list_all(zones, "nodes")
    }

    /// Every queued resource of each zone, as `list_nodes`.
    pub fn list_queued_resources(
        &self,
        zones: &[String],
    ) -> Vec<Result<Vec<QueuedResource>, ApiError>> {
        self.list_all(zones, "queuedResources")
    }

    fn list_all<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        zones: &[String],
        collection: &'static str,
    ) -> Vec<Result<Vec<T>, ApiError>> {
        let inner = self.inner.clone();
        let zones = zones.to_vec();
        self.rt.block_on(async move {
            futures_util::stream::iter(zones.into_iter().map(|zone| {
                let inner = inner.clone();
                async move { inner.list(&zone, collection).await }
            }))
            .buffered(inner.concurrency)
            .collect()
            .await
        })
    }

    /// Nodes by (zone, id), concurrently; `None` for absent ones.
    pub fn get_nodes(&self, targets: &[(String, String)]) -> Vec<Result<Option<Node>, ApiError>> {
        let inner = self.inner.clone();
        let targets = targets.to_vec();
        self.rt.block_on(async move {
            futures_util::stream::iter(targets.into_iter().map(|(zone, id)| {
                let inner = inner.clone();
                async move {
                    let url = inner.url(&zone, &format!("nodes/{id}"));
                    match inner
                        .call(reqwest::Method::GET, &url, None, Kind::Read)
                        .await
                    {
                        Ok(v) => parse(v)
                            .map(Some)
                            .map_err(|e| malformed(&format!("node {id}: {e}"))),
                        Err(e) if e.status == "NOT_FOUND" => Ok(None),
                        Err(e) => Err(e),
                    }
                }
            }))
            .buffered(inner.concurrency)
            .collect()
            .await
        })
    }

    /// Creates a queued resource; `request_id` (a UUID) makes a retry idempotent.
    pub fn create_queued_resource(
        &self,
        r: &QrRequest,
        request_id: &str,
    ) -> Result<Operation, ApiError> {
        self.rt
            .block_on(self.api().create_queued_resource(r, request_id))
    }

    /// Deletes a queued resource and its node (`force`); absent is success.
    pub fn delete_queued_resource(
        &self,
        zone: &str,
        id: &str,
        request_id: &str,
    ) -> Result<(), ApiError> {
        self.rt
            .block_on(self.api().delete_queued_resource(zone, id, request_id))
    }

    /// Deletes a node; absent is success. (`nodes.delete` takes no `requestId` in v2:
    /// Google refuses undeclared parameters. A repeated delete is harmless: absent is
    /// success.)
    pub fn delete_node(&self, zone: &str, id: &str) -> Result<(), ApiError> {
        self.rt.block_on(self.api().delete_node(zone, id))
    }

    /// The calls as futures, to run several at once on `block_on`.
    pub fn api(&self) -> Api {
        Api(self.inner.clone())
    }

    /// Runs `f` on the client's runtime (where `api()`'s futures run).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// A node's guest attributes under `query_path` (`hostkeys/`: each worker's SSH host
    /// keys, published by the TPU VM's guest agent), as (worker id, namespace, key, value),
    /// for a node of `workers` workers. The reply (`GuestAttributes`) names no worker: it
    /// holds one entry per worker asked, in worker order. One call asks for every worker;
    /// if its reply does not hold one entry per worker, each worker is asked alone
    /// (`workerIds`), so no attribute is ever given to the wrong worker.
    pub fn guest_attributes(
        &self,
        zone: &str,
        node: &str,
        query_path: &str,
        workers: u32,
    ) -> Result<Vec<GuestAttribute>, ApiError> {
        let inner = self.inner.clone();
        let url = inner.url(zone, &format!("nodes/{node}:getGuestAttributes"));
        let ask = |worker: Option<u32>| {
            let mut body = json!({});
            if !query_path.is_empty() {
                body["queryPath"] = json!(query_path);
            }
            if let Some(w) = worker {
                body["workerIds"] = json!([w.to_string()]);
            }
            let (inner, url) = (inner.clone(), url.clone());
            async move {
                let v = inner
                    .call(reqwest::Method::POST, &url, Some(body), Kind::Read)
                    .await?;
                Ok::<_, ApiError>(v["guestAttributes"].as_array().cloned().unwrap_or_default())
            }
        };
        self.rt.block_on(async move {
            let all = ask(None).await?;
            let entries: Vec<(u32, Value)> = if all.len() == workers as usize {
                (0..workers).zip(all).collect()
            } else {
                let mut each = Vec::new();
                for w in 0..workers {
                    if let Some(entry) = ask(Some(w)).await?.into_iter().next() {
                        each.push((w, entry));
                    }
                }
                each
            };
            let mut out = Vec::new();
            for (worker, entry) in entries {
                for item in entry["queryValue"]["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let text = |k: &str| item[k].as_str().unwrap_or_default().to_owned();
                    out.push(GuestAttribute {
                        worker_id: worker,
                        namespace: text("namespace"),
                        key: text("key"),
                        value: text("value"),
                    });
                }
            }
            Ok(out)
        })
    }

    /// Reads an operation by its full name.
    pub fn operation(&self, name: &str) -> Result<Operation, ApiError> {
        let inner = self.inner.clone();
        let url = format!("{}/v2/{name}", inner.endpoint.base);
        self.rt.block_on(async move {
            let v = inner
                .call(reqwest::Method::GET, &url, None, Kind::Read)
                .await?;
            parse(v).map_err(|e| malformed(&format!("operation: {e}")))
        })
    }
}

/// One guest attribute of one worker (`getGuestAttributes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestAttribute {
    /// The worker (0-based), by its entry's place in the reply.
    pub worker_id: u32,
    /// `hostkeys` for SSH host keys.
    pub namespace: String,
    /// The key type (`ssh-ed25519`).
    pub key: String,
    /// The base64 key.
    pub value: String,
}

/// The client's mutations as futures (cheap to clone; they run on `Client::block_on`).
#[derive(Clone)]
pub struct Api(Arc<Inner>);

impl Api {
    /// Creates a queued resource (see `Client::create_queued_resource`).
    pub async fn create_queued_resource(
        &self,
        r: &QrRequest,
        request_id: &str,
    ) -> Result<Operation, ApiError> {
        let inner = &self.0;
        let url = format!(
            "{}?queuedResourceId={}&requestId={request_id}",
            inner.url(&r.zone, "queuedResources"),
            r.id
        );
        let body = create_body(&inner.project, r);
        let v = inner
            .call(reqwest::Method::POST, &url, Some(body), Kind::Write)
            .await?;
        parse(v).map_err(|e| malformed(&format!("operation: {e}")))
    }

    /// Deletes a queued resource and its node; absent is success.
    pub async fn delete_queued_resource(
        &self,
        zone: &str,
        id: &str,
        request_id: &str,
    ) -> Result<(), ApiError> {
        let url = format!(
            "{}?force=true&requestId={request_id}",
            self.0.url(zone, &format!("queuedResources/{id}"))
        );
        self.delete(&url).await
    }

    /// Deletes a node; absent is success (no `requestId`: v2 does not declare one).
    pub async fn delete_node(&self, zone: &str, id: &str) -> Result<(), ApiError> {
        let url = self.0.url(zone, &format!("nodes/{id}"));
        self.delete(&url).await
    }

    async fn delete(&self, url: &str) -> Result<(), ApiError> {
        match self
            .0
            .call(reqwest::Method::DELETE, url, None, Kind::Write)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.status == "NOT_FOUND" => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Inner {
    fn url(&self, zone: &str, rest: &str) -> String {
        format!(
            "{}/v2/projects/{}/locations/{zone}/{rest}",
            self.endpoint.base, self.project
        )
    }

    async fn list<T: serde::de::DeserializeOwned>(
        &self,
        zone: &str,
        collection: &str,
    ) -> Result<Vec<T>, ApiError> {
        let mut out = Vec::new();
        let mut token = String::new();
        for _ in 0..10_000 {
            let mut url = format!("{}?pageSize=500", self.url(zone, collection));
            if !token.is_empty() {
                url.push_str("&pageToken=");
                url.push_str(&token);
            }
            let page = self
                .call(reqwest::Method::GET, &url, None, Kind::Read)
                .await?;
            if let Some(items) = page.get(collection).and_then(Value::as_array) {
                for item in items {
                    out.push(
                        parse(item.clone())
                            .map_err(|e| malformed(&format!("{collection} in {zone}: {e}")))?,
                    );
                }
            }
            if let Some(unreachable) = page.get("unreachable").and_then(Value::as_array)
                && !unreachable.is_empty()
            {
                return Err(transport(
                    "UNAVAILABLE",
                    format!("{zone}: the API could not reach {unreachable:?}"),
                ));
            }
            token = page
                .get("nextPageToken")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if token.is_empty() {
                return Ok(out);
            }
        }
        Err(malformed("a listing that never ends"))
    }

    /// One call with the quota's pacing, a token, and bounded retries.
    async fn call(
        &self,
        method: reqwest::Method,
        url: &str,
        body: Option<Value>,
        kind: Kind,
    ) -> Result<Value, ApiError> {
        let mut k = 1;
        loop {
            match kind {
                Kind::Read => self.reads.wait().await,
                Kind::Write => self.writes.wait().await,
            }
            let (result, after) = self.once(method.clone(), url, body.as_ref()).await;
            match result {
                Err(e) if retryable(&e) && k < self.policy.tries => {
                    k += 1;
                    tokio::time::sleep(self.policy.wait(k, after, http::jitter())).await;
                }
                other => return other,
            }
        }
    }

    async fn once(
        &self,
        method: reqwest::Method,
        url: &str,
        body: Option<&Value>,
    ) -> (Result<Value, ApiError>, Option<Duration>) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let reply = match http::exchange(request, self.auth.as_ref()).await {
            Ok(reply) => reply,
            Err(mut e) => {
                e.message = format!("{url}: {}", e.message);
                return (Err(e), None);
            }
        };
        let after = reply.retry_after;
        if let Some(e) = reply.error() {
            return (Err(e), after);
        }
        if reply.body.iter().all(u8::is_ascii_whitespace) {
            return (Ok(json!({})), after);
        }
        (
            serde_json::from_slice(&reply.body).map_err(|e| ApiError {
                code: reply.code,
                status: "INTERNAL".into(),
                message: format!("unreadable reply ({e})"),
            }),
            after,
        )
    }
}
