//! The emulator's HTTP surface: the TPU API v2 routes the GCP backend calls (in the REST
//! reference's shapes, errors as `google.rpc.Status` JSON), the control routes (time, faults,
//! status) and the simulated workers' routes (launch, cancel, reports). Each handler takes the
//! world's lock for one step of the model and never holds it across an await.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tpu_runner_sim::CallKind;
use tpu_runner_sim::cloud::{self as simc, ApiError, CancelResult, RemoteError};
use ustr::Ustr;

use super::{Clock, Created, Shared, World, lock};
use crate::backend::InFlight;
use crate::backend::sim::api_refusal;
use crate::gcp::discovery::{Api, query_pairs};
use crate::spec::Name;

/// A refusal in the API's error shape.
#[derive(Debug)]
pub struct Fail {
    code: StatusCode,
    status: &'static str,
    message: String,
    /// `error.details` (typed `Any` values), when Google gives them.
    details: Option<Value>,
}

impl Fail {
    pub(crate) fn new(code: StatusCode, status: &'static str, message: impl Into<String>) -> Fail {
        Fail {
            code,
            status,
            message: message.into(),
            details: None,
        }
    }

    fn not_found(what: &str) -> Fail {
        Fail::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("Resource '{what}' was not found"),
        )
    }

    fn invalid(message: impl Into<String>) -> Fail {
        Fail::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message)
    }
}

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        let mut body = json!({"error": {
            "code": self.code.as_u16(),
            "message": self.message,
            "status": self.status,
        }});
        if let Some(details) = self.details {
            body["error"]["details"] = details;
        }
        (self.code, Json(body)).into_response()
    }
}

/// The simulated cloud's refusal as the API words it (the wording the simulator's backend
/// reads too, so both report the same failure).
fn api_fail(e: &ApiError, zone: &str, what: &str) -> Fail {
    let e = api_refusal(e, zone, what);
    Fail {
        code: StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        status: match e.status.as_str() {
            "RESOURCE_EXHAUSTED" => "RESOURCE_EXHAUSTED",
            "UNAVAILABLE" => "UNAVAILABLE",
            "DEADLINE_EXCEEDED" => "DEADLINE_EXCEEDED",
            "ALREADY_EXISTS" => "ALREADY_EXISTS",
            "NOT_FOUND" => "NOT_FOUND",
            "INVALID_ARGUMENT" => "INVALID_ARGUMENT",
            _ => "INTERNAL",
        },
        message: e.message,
        details: None,
    }
}

type Reply = Result<Json<Value>, Fail>;

/// Sends `value` after `wait` (the modelled latency on a wall clock).
async fn after(wait: Duration, reply: Reply) -> Reply {
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    reply
}

/// The router over `shared`.
pub fn router(shared: Shared) -> Router {
    let tpu = "/v2/projects/{project}/locations/{zone}";
    let ctl = "/emulator/v1";
    Router::new()
        .route(&format!("{tpu}/nodes"), get(list_nodes))
        .route(
            &format!("{tpu}/nodes/{{node}}"),
            get(get_node).delete(delete_node).post(node_method),
        )
        .route(
            &format!("{tpu}/queuedResources"),
            get(list_qrs).post(create_qr),
        )
        .route(
            &format!("{tpu}/queuedResources/{{qr}}"),
            get(get_qr).delete(delete_qr),
        )
        .route(&format!("{tpu}/operations/{{op}}"), get(get_operation))
        .route(&format!("{ctl}/status"), get(status))
        .route(&format!("{ctl}/time"), post(advance))
        .route(&format!("{ctl}/zones/{{zone}}/stockout"), post(stockout))
        .route(
            &format!("{ctl}/projects/{{project}}/locations/{{zone}}/nodes/{{node}}/preempt"),
            post(preempt),
        )
        .route(
            &format!("{ctl}/projects/{{project}}/locations/{{zone}}/nodes/{{node}}/launch"),
            post(launch),
        )
        .route(
            &format!("{ctl}/projects/{{project}}/locations/{{zone}}/nodes/{{node}}/cancel"),
            post(cancel),
        )
        .route(
            &format!("{ctl}/projects/{{project}}/locations/{{zone}}/nodes/{{node}}/maintenance"),
            post(super::metadata::announce_maintenance),
        )
        .route(
            &format!(
                "{ctl}/projects/{{project}}/locations/{{zone}}/nodes/{{node}}/computeMetadata/v1/instance/{{key}}"
            ),
            get(super::metadata::read),
        )
        .route(&format!("{ctl}/reports"), post(reports))
        .route(
            &format!(
                "{ctl}/projects/{{project}}/locations/{{zone}}/nodes/{{node}}/workers/{{worker}}"
            ),
            post(register_ssh_worker),
        )
        .fallback(|| async {
            Fail::new(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                "the TPU API emulator does not serve this path",
            )
        })
        .layer(axum::middleware::from_fn(front_end))
        .layer(axum::middleware::from_fn(as_status))
        .with_state(shared)
}

/// Every refusal in Google's error shape (`google.rpc.Status` JSON), also those the router
/// and axum's extractors make in plain text: a body without its JSON content type, a query
/// that does not parse (`pageSize=-1`), a method the path does not have. The metadata
/// server's routes answer as the metadata server does (plain text).
async fn as_status(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let metadata = request.uri().path().contains("/computeMetadata/");
    let response = next.run(request).await;
    if metadata {
        return response;
    }
    let code = response.status();
    let json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if json || !(code.is_client_error() || code.is_server_error()) {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        code.canonical_reason().unwrap_or("refused").to_owned()
    } else {
        text
    };
    // Google's canonical codes for the HTTP statuses (a method the path lacks is 404).
    let (code, status) = match code.as_u16() {
        401 => (code, "UNAUTHENTICATED"),
        403 => (code, "PERMISSION_DENIED"),
        404 | 405 => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        409 => (code, "ABORTED"),
        429 => (code, "RESOURCE_EXHAUSTED"),
        503 => (code, "UNAVAILABLE"),
        504 => (code, "DEADLINE_EXCEEDED"),
        400..=499 => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
    };
    Fail::new(code, status, message).into_response()
}

/// The TPU API v2 as Google describes it (the discovery document `tests/discovery/` vendors).
fn tpu_api() -> &'static Api {
    static API: std::sync::LazyLock<Api> = std::sync::LazyLock::new(|| {
        Api::parse(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/discovery/tpu.v2.json"
        )))
        .expect("the vendored TPU API document parses (a test reads it)")
    });
    &API
}

/// The largest request body the emulator reads.
const BODY_LIMIT: usize = 4 << 20;

/// Google's front end before every TPU API call: a path no method has is 404; a query
/// parameter the method does not declare, a body field its request message does not have,
/// or a value of the wrong type is 400 `INVALID_ARGUMENT` with a `BadRequest` detail, as
/// Google's JSON transcoding refuses them. The emulator's own routes pass as they are.
async fn front_end(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if !request.uri().path().starts_with("/v2/") {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, BODY_LIMIT).await else {
        return Fail::invalid("the request body is too large").into_response();
    };
    let json = if bytes.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                return Fail::invalid(format!("Invalid JSON payload received. {e}"))
                    .into_response();
            }
        }
    };
    let api = tpu_api();
    let path = parts.uri.path();
    if api.resolve(parts.method.as_str(), path).is_none() {
        return Fail::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("{} {path}: the TPU API v2 has no such method", parts.method),
        )
        .into_response();
    }
    let query = parts.uri.query().map(query_pairs).unwrap_or_default();
    if let Err(problems) = api.check_request(parts.method.as_str(), path, &query, json.as_ref()) {
        let violations: Vec<Value> = problems.iter().map(|p| json!({"description": p})).collect();
        let mut fail = Fail::invalid(problems.join("; "));
        fail.details = Some(json!([{
            "@type": "type.googleapis.com/google.rpc.BadRequest",
            "fieldViolations": violations,
        }]));
        return fail.into_response();
    }
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
    .await
}

/// The world for a call on `project`, brought to the wall clock.
pub(crate) fn world<'a>(
    shared: &'a Shared,
    project: &str,
) -> Result<std::sync::MutexGuard<'a, World>, Fail> {
    let mut w = lock(shared);
    if project != w.project {
        return Err(Fail::new(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            format!(
                "Permission denied on resource project {project} (the emulator serves project {})",
                w.project
            ),
        ));
    }
    w.tick();
    w.reap_workers();
    Ok(w)
}

// ----- JSON of the simulated cloud's objects -------------------------------------------

fn node_json(w: &World, n: &simc::NodeView<'_>) -> Value {
    let project = &w.project;
    let created = w.created.get(n.name.as_str());
    let external = created.map_or(w.sim.public_ip, |c| c.external_ips);
    let endpoints: Vec<Value> = (0..n.hosts.max(1))
        .map(|i| {
            let ssh = w
                .ssh_workers
                .get(&(n.zone.to_string(), n.name.to_string(), i));
            let (ip, port) = ssh.map_or(("127.0.0.1", 22), |s| (s.ip_address.as_str(), s.port));
            let mut e = json!({"ipAddress": ip, "port": port});
            if external {
                e["accessConfig"] = json!({"externalIp": "127.0.0.1"});
            }
            e
        })
        .collect();
    let state = match n.state {
        simc::NodeState::Creating => "CREATING",
        simc::NodeState::Ready => "READY",
        simc::NodeState::Preempted => "PREEMPTED",
        simc::NodeState::Deleting => "DELETING",
    };
    let mut node = json!({
        "name": format!("projects/{project}/locations/{}/nodes/{}", n.zone, n.name),
        "acceleratorType": n.accelerator,
        "state": state,
        "labels": **n.labels,
        "networkEndpoints": endpoints,
        "apiVersion": "V2",
        "id": (n.serial as i64).to_string(),
    });
    if n.state == simc::NodeState::Ready {
        node["health"] = json!("HEALTHY");
    }
    if n.spot {
        node["schedulingConfig"] = json!({"spot": true});
    } else if n.reserved {
        node["schedulingConfig"] = json!({"reserved": true});
    }
    if let Some(qr) = n.queued_resource {
        node["queuedResource"] = json!(format!(
            "projects/{project}/locations/{}/queuedResources/{qr}",
            n.zone
        ));
    }
    if let Some(c) = created {
        node["runtimeVersion"] = json!(c.runtime_version);
        node["createTime"] = json!(c.create_time);
    }
    node
}

fn qr_json(w: &World, q: &simc::QrView<'_>) -> Value {
    let project = &w.project;
    let state = match q.state {
        simc::QrState::WaitingForResources => "WAITING_FOR_RESOURCES",
        simc::QrState::Provisioning => "PROVISIONING",
        simc::QrState::Active => "ACTIVE",
        simc::QrState::Failed => "FAILED",
        simc::QrState::Suspending => "SUSPENDING",
        simc::QrState::Suspended => "SUSPENDED",
        simc::QrState::Deleting => "DELETING",
    };
    let created = w.created.get(q.node_id.as_str());
    let mut state = json!({"state": state});
    if q.state == simc::QrState::Failed {
        state["failedData"] = json!({"error": {"code": 8, "message": simc::QR_FAILED_MESSAGE}});
    }
    let mut qr = json!({
        "name": format!("projects/{project}/locations/{}/queuedResources/{}", q.zone, q.name),
        "tpu": {"nodeSpec": [{
            "parent": format!("projects/{project}/locations/{}", q.zone),
            "nodeId": q.node_id.as_str(),
            "node": {
                "acceleratorType": q.accelerator,
                "labels": **q.labels,
            },
        }]},
        "state": state,
    });
    match q.model {
        tpu_runner_sim::PoolModel::Spot => qr["spot"] = json!({}),
        _ => qr["guaranteed"] = json!({}),
    }
    if let Some(r) = q.reservation {
        qr["reservationName"] = json!(format!(
            "projects/{project}/locations/{}/reservations/{r}",
            q.zone
        ));
    }
    if let Some(c) = created {
        qr["createTime"] = json!(c.create_time);
        qr["tpu"]["nodeSpec"][0]["node"]["runtimeVersion"] = json!(c.runtime_version);
    }
    qr
}

// ----- TPU API v2 -------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ListQuery {
    page_size: Option<usize>,
    page_token: Option<String>,
}

/// One page of a listing: the first page is the call (it counts, uses quota and may fail);
/// later pages come from the names it listed, each object shown as it is when its page is
/// read (one that went meanwhile is left out), so a kept listing costs a name per object,
/// not its JSON.
fn list_page(
    w: &mut World,
    q: &ListQuery,
    key: &str,
    list: impl FnOnce(&mut World) -> Result<Vec<(Ustr, Ustr)>, Fail>,
    render: impl Fn(&World, Ustr, Ustr) -> Option<Value>,
) -> Result<Value, Fail> {
    let size = q.page_size.filter(|&s| s > 0).unwrap_or(1000).min(1000);
    let names = match q.page_token.as_deref().filter(|t| !t.is_empty()) {
        Some(token) => w
            .take_page(token)
            .ok_or_else(|| Fail::invalid(format!("invalid page token {token:?}")))?,
        None => list(w)?,
    };
    let (page, next) = w.page(names, size);
    let items: Vec<Value> = page
        .into_iter()
        .filter_map(|(zone, name)| render(w, zone, name))
        .collect();
    let mut reply = json!({});
    if !items.is_empty() {
        reply[key] = json!(items);
    }
    if let Some(next) = next {
        reply["nextPageToken"] = json!(next);
    }
    Ok(reply)
}

async fn list_nodes(
    State(shared): State<Shared>,
    Path((project, zone)): Path<(String, String)>,
    Query(q): Query<ListQuery>,
) -> Reply {
    let (wait, reply) = {
        let mut w = world(&shared, &project)?;
        let wait = w.read_call();
        let reply = list_page(
            &mut w,
            &q,
            "nodes",
            |w| {
                Ok(w.sim
                    .cloud
                    .list_zone_nodes(&zone)
                    .map_err(|e| api_fail(&e, &zone, &zone))?
                    .map(|n| (n.zone, n.name))
                    .collect())
            },
            |w, zone, name| Some(node_json(w, &w.sim.cloud.peek_node(zone, name)?)),
        );
        (wait, reply)
    };
    after(wait, reply.map(Json)).await
}

async fn list_qrs(
    State(shared): State<Shared>,
    Path((project, zone)): Path<(String, String)>,
    Query(q): Query<ListQuery>,
) -> Reply {
    let (wait, reply) = {
        let mut w = world(&shared, &project)?;
        let wait = w.read_call();
        let reply = list_page(
            &mut w,
            &q,
            "queuedResources",
            |w| {
                Ok(w.sim
                    .cloud
                    .list_zone_queued_resources(&zone)
                    .map_err(|e| api_fail(&e, &zone, &zone))?
                    .map(|q| (q.zone, q.name))
                    .collect())
            },
            |w, zone, name| Some(qr_json(w, &w.sim.cloud.peek_queued_resource(zone, name)?)),
        );
        (wait, reply)
    };
    after(wait, reply.map(Json)).await
}

/// The longest resource id the emulator takes (a TPU node's name becomes its VMs' names,
/// which Compute Engine bounds at 63).
const MAX_ID: usize = 63;

/// An unqualified resource id as the TPU API documents it (`^[A-Za-z0-9_.~+%-]+$`), bounded.
fn resource_id(name: &str) -> bool {
    (1..=MAX_ID).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.~+%-".contains(&b))
}

/// A name from a request, as the simulated cloud keys it, without interning what it never
/// made: a name no object was ever created under is looked up as one that cannot exist, so
/// requests naming anything at all never grow the emulator's memory.
pub(super) fn known(name: &str) -> Ustr {
    Ustr::from_existing(name).unwrap_or_else(|| Ustr::from("\u{0}unknown"))
}

async fn get_node(
    State(shared): State<Shared>,
    Path((project, zone, node)): Path<(String, String, String)>,
) -> Reply {
    let (wait, reply) = {
        let mut w = world(&shared, &project)?;
        let wait = w.read_call();
        let found = w
            .sim
            .cloud
            .get_node(known(&zone), known(&node))
            .map(|n| n.map(|n| (n.zone, n.name)));
        let reply = match found {
            Err(e) => Err(api_fail(&e, &zone, &node)),
            Ok(None) => Err(Fail::not_found(&format!(
                "projects/{project}/locations/{zone}/nodes/{node}"
            ))),
            Ok(Some((z, n))) => {
                let view = w.sim.cloud.peek_node(z, n).expect("just read");
                Ok(Json(node_json(&w, &view)))
            }
        };
        (wait, reply)
    };
    after(wait, reply).await
}

async fn get_qr(
    State(shared): State<Shared>,
    Path((project, zone, qr)): Path<(String, String, String)>,
) -> Reply {
    let (wait, reply) = {
        let mut w = world(&shared, &project)?;
        let wait = w.read_call();
        let found = w
            .sim
            .cloud
            .get_queued_resource(known(&zone), known(&qr))
            .map(|q| q.is_some());
        let reply = match found {
            Err(e) => Err(api_fail(&e, &zone, &qr)),
            Ok(false) => Err(Fail::not_found(&format!(
                "projects/{project}/locations/{zone}/queuedResources/{qr}"
            ))),
            Ok(true) => {
                let view = w
                    .sim
                    .cloud
                    .peek_queued_resource(known(&zone), known(&qr))
                    .expect("just read");
                Ok(Json(qr_json(&w, &view)))
            }
        };
        (wait, reply)
    };
    after(wait, reply).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct MutationQuery {
    queued_resource_id: Option<String>,
    request_id: Option<String>,
    force: Option<bool>,
}

/// What a create body asks for (the emulator serves requests for one node).
struct CreateBody {
    /// The tier: `spot`, or `guaranteed` (with `reservationName`: reserved).
    model: tpu_runner_sim::PoolModel,
    /// The reservation's last name segment.
    reservation: Option<String>,
    node_id: String,
    accelerator: String,
    runtime_version: String,
    external_ips: bool,
    labels: BTreeMap<String, String>,
}

fn create_body(body: &Value, project: &str, zone: &str) -> Result<CreateBody, Fail> {
    let specs = body
        .pointer("/tpu/nodeSpec")
        .and_then(Value::as_array)
        .ok_or_else(|| Fail::invalid("tpu.nodeSpec is required"))?;
    let [spec] = specs.as_slice() else {
        return Err(Fail::invalid(
            "the emulator serves queued resources of exactly one node spec",
        ));
    };
    let text = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
    // `tier` is a union (`spot` or `guaranteed`); the emulator wants one, as tpu-runner sends.
    let reservation = match body.get("reservationName") {
        None => None,
        Some(v) => {
            let name = v
                .as_str()
                .ok_or_else(|| Fail::invalid("reservationName must be a string"))?;
            let prefix = format!("projects/{project}/locations/{zone}/reservations/");
            match name.strip_prefix(&prefix) {
                Some(r) if !r.is_empty() && !r.contains('/') => Some(r.to_owned()),
                _ => {
                    return Err(Fail::invalid(format!(
                        "reservationName {name:?} is not of the form {prefix}{{reservation}}"
                    )));
                }
            }
        }
    };
    let model = match (body.get("spot"), body.get("guaranteed"), &reservation) {
        (Some(_), Some(_), _) => {
            return Err(Fail::invalid(
                "tier: only one of `spot` and `guaranteed` may be set",
            ));
        }
        (Some(_), None, Some(_)) => {
            return Err(Fail::invalid(
                "reservationName cannot be used with the Spot tier",
            ));
        }
        (Some(_), None, None) => tpu_runner_sim::PoolModel::Spot,
        (None, Some(_), None) => tpu_runner_sim::PoolModel::OnDemand,
        (None, Some(_), Some(_)) => tpu_runner_sim::PoolModel::Reserved,
        (None, None, _) => {
            return Err(Fail::invalid(
                "the emulator wants a tier: set `spot: {}` or `guaranteed: {}`",
            ));
        }
    };
    let parent = text(spec, "/parent").unwrap_or_default();
    if !parent.ends_with(&format!("/locations/{zone}")) {
        return Err(Fail::invalid(format!(
            "nodeSpec.parent {parent:?} is not this zone ({zone})"
        )));
    }
    let node_id =
        text(spec, "/nodeId").ok_or_else(|| Fail::invalid("nodeSpec.nodeId is required"))?;
    let accelerator = text(spec, "/node/acceleratorType")
        .ok_or_else(|| Fail::invalid("node.acceleratorType is required"))?;
    let labels = spec
        .pointer("/node/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    Ok(CreateBody {
        model,
        reservation,
        node_id,
        accelerator,
        runtime_version: text(spec, "/node/runtimeVersion").unwrap_or_default(),
        external_ips: spec
            .pointer("/node/networkConfig/enableExternalIps")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        labels,
    })
}

async fn create_qr(
    State(shared): State<Shared>,
    Path((project, zone)): Path<(String, String)>,
    Query(q): Query<MutationQuery>,
    body: Option<Json<Value>>,
) -> Reply {
    let (wait, reply) = {
        let mut w = world(&shared, &project)?;
        // The call takes its time before it takes effect (as in the simulator).
        let wait = w.timed_call(CallKind::Mutation);
        let reply = (|| {
            let id = q
                .queued_resource_id
                .clone()
                .filter(|id| !id.is_empty())
                .ok_or_else(|| Fail::invalid("queuedResourceId is required"))?;
            let Json(body) = body.ok_or_else(|| Fail::invalid("a JSON body is required"))?;
            let create = create_body(&body, &project, &zone)?;
            for (what, name) in [
                ("queuedResourceId", id.as_str()),
                ("nodeId", create.node_id.as_str()),
            ] {
                if !resource_id(name) {
                    return Err(Fail::invalid(format!(
                        "{what} must follow ^[A-Za-z0-9_.~+%-]+$ and be at most {MAX_ID} characters"
                    )));
                }
            }
            if let Some(op) = w.replayed(q.request_id.as_deref()) {
                return Ok(op);
            }
            let result = w.sim.cloud.create_queued_resource(
                Ustr::from(&zone),
                Ustr::from(&id),
                Ustr::from(&create.node_id),
                &create.accelerator,
                create.model,
                create.reservation.as_deref(),
                Arc::new(create.labels),
            );
            let took_effect = matches!(result, Ok(()) | Err(ApiError::Timeout))
                && w.sim
                    .cloud
                    .peek_queued_resource(Ustr::from(&zone), Ustr::from(&id))
                    .is_some();
            if took_effect {
                let create_time = w.timestamp(w.now_ms());
                w.created.insert(
                    create.node_id.clone(),
                    Created {
                        runtime_version: create.runtime_version,
                        external_ips: create.external_ips,
                        create_time,
                    },
                );
                let view = w
                    .sim
                    .cloud
                    .peek_queued_resource(Ustr::from(&zone), Ustr::from(&id))
                    .expect("created");
                let mut response = qr_json(&w, &view);
                response["@type"] = json!("type.googleapis.com/google.cloud.tpu.v2.QueuedResource");
                let op = w.operation(&zone, "create", q.request_id.as_deref(), response);
                // A lost reply: done, but the caller hears nothing (a retry with the same
                // requestId gets the operation).
                result.map(|()| op).map_err(|e| api_fail(&e, &zone, &id))
            } else {
                Err(api_fail(
                    &result.err().unwrap_or(ApiError::Unavailable),
                    &zone,
                    &id,
                ))
            }
        })();
        (wait, reply.map(Json))
    };
    after(wait, reply).await
}

async fn delete_qr(
    State(shared): State<Shared>,
    Path((project, zone, qr)): Path<(String, String, String)>,
    Query(q): Query<MutationQuery>,
) -> Reply {
    let (wait, reply) = {
        let mut w = world(&shared, &project)?;
        let wait = w.timed_call(CallKind::Mutation);
        let reply = (|| {
            if let Some(op) = w.replayed(q.request_id.as_deref()) {
                return Ok(op);
            }
            let (z, name) = (known(&zone), known(&qr));
            let live_node = w.sim.cloud.peek_queued_resource(z, name).is_some_and(|v| {
                matches!(v.state, simc::QrState::Active | simc::QrState::Provisioning)
            });
            if live_node && q.force != Some(true) {
                return Err(Fail::new(
                    StatusCode::BAD_REQUEST,
                    "FAILED_PRECONDITION",
                    format!("queued resource {qr} has a node: delete it with force=true"),
                ));
            }
            let result = w.sim.cloud.delete_queued_resource(z, name);
            let full = &qr;
            match result {
                Ok(()) => Ok(w.operation(&zone, "delete", q.request_id.as_deref(), empty())),
                Err(ApiError::Timeout) => {
                    w.operation(&zone, "delete", q.request_id.as_deref(), empty());
                    Err(api_fail(&ApiError::Timeout, &zone, full))
                }
                Err(e) => Err(api_fail(&e, &zone, full)),
            }
        })();
        (wait, reply.map(Json))
    };
    after(wait, reply).await
}

async fn delete_node(
    State(shared): State<Shared>,
    Path((project, zone, node)): Path<(String, String, String)>,
) -> Reply {
    let (wait, reply) = {
        let mut w = world(&shared, &project)?;
        let wait = w.timed_call(CallKind::Mutation);
        let result = w.sim.cloud.delete_node(known(&zone), known(&node));
        let reply = match result {
            Ok(()) => Ok(w.operation(&zone, "delete", None, empty())),
            Err(ApiError::Timeout) => {
                w.operation(&zone, "delete", None, empty());
                Err(api_fail(&ApiError::Timeout, &zone, &node))
            }
            Err(e) => Err(api_fail(&e, &zone, &node)),
        };
        (wait, reply.map(Json))
    };
    after(wait, reply).await
}

/// A finished delete's `response`: `google.protobuf.Empty`, typed.
fn empty() -> Value {
    json!({"@type": "type.googleapis.com/google.protobuf.Empty"})
}

async fn get_operation(
    State(shared): State<Shared>,
    Path((project, zone, op)): Path<(String, String, String)>,
) -> Reply {
    let mut w = world(&shared, &project)?;
    let name = format!("projects/{project}/locations/{zone}/operations/{op}");
    w.find_operation(&name)
        .map(Json)
        .ok_or_else(|| Fail::not_found(&name))
}

// ----- control ------------------------------------------------------------------------------

async fn status(State(shared): State<Shared>) -> Json<Value> {
    let mut w = lock(&shared);
    w.tick();
    let (clock, speed) = match w.clock() {
        Clock::Virtual => ("virtual", None),
        Clock::Wall { speed, .. } => ("wall", Some(speed)),
    };
    let acc = w.sim.cloud.accounting();
    Json(json!({
        "project": w.project,
        "clock": clock,
        "speed": speed,
        "now": w.timestamp(w.now_ms()),
        "virtualSeconds": w.now_ms() as f64 / 1000.0,
        "zones": w.zones(),
        "liveNodes": w.sim.cloud.live_nodes().values().sum::<u32>(),
        "allocatedChips": w.sim.cloud.allocated_chips(),
        "apiCalls": acc.api_calls,
        "apiErrors": acc.api_errors,
        "preemptions": acc.preemptions,
    }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Advance {
    advance_secs: Option<f64>,
    to_secs: Option<f64>,
}

async fn advance(State(shared): State<Shared>, Json(a): Json<Advance>) -> Reply {
    let mut w = lock(&shared);
    if !matches!(w.clock(), Clock::Virtual) {
        return Err(Fail::new(
            StatusCode::BAD_REQUEST,
            "FAILED_PRECONDITION",
            "time only moves by hand on a virtual clock (start the emulator with --virtual-time)",
        ));
    }
    let now = w.now_ms();
    let to = match (a.advance_secs, a.to_secs) {
        (Some(d), None) if d.is_finite() && d >= 0.0 => now + (d * 1000.0) as u64,
        (None, Some(t)) if t.is_finite() && t * 1000.0 >= now as f64 => (t * 1000.0) as u64,
        _ => {
            return Err(Fail::invalid(
                "give one of advanceSecs (≥ 0) or toSecs (not before now)",
            ));
        }
    };
    w.sim.cloud.advance_to(to);
    w.reap_workers();
    Ok(Json(json!({"virtualSeconds": w.now_ms() as f64 / 1000.0})))
}

#[derive(Debug, Deserialize)]
struct Stockout {
    on: bool,
}

async fn stockout(
    State(shared): State<Shared>,
    Path(zone): Path<String>,
    Json(s): Json<Stockout>,
) -> Reply {
    let mut w = lock(&shared);
    w.tick();
    let pools = w.sim.cloud.set_stockout(&zone, s.on);
    w.reap_workers();
    match pools {
        0 => Err(Fail::not_found(&format!("zone {zone} (no capacity pool)"))),
        pools => Ok(Json(
            json!({"zone": zone, "stockedOut": s.on, "pools": pools}),
        )),
    }
}

/// `POST …/nodes/N:getGuestAttributes {queryPath, workerIds}`, as the API answers it: one
/// `GuestAttributes` per worker asked (every worker, in worker order, when `workerIds` is
/// empty), with no worker id in it (the schema has none: the order says which is which).
/// Each registered worker publishes its `hostkeys/ssh-ed25519` and its instance name
/// (`guestInventory/hostname`, as a TPU VM worker's `t1v-n-…-w-I`); those under `queryPath`
/// (all when it is empty) are listed.
async fn node_method(
    State(shared): State<Shared>,
    Path((project, zone, node)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> Reply {
    let Some(name) = node.strip_suffix(":getGuestAttributes") else {
        return Err(Fail::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("the TPU API emulator does not serve POST nodes/{node}"),
        ));
    };
    // The front end checked the body against GetGuestAttributesRequest.
    let request: Value = serde_json::from_slice(&body).unwrap_or_else(|_| json!({}));
    let query = request["queryPath"].as_str().unwrap_or_default().to_owned();
    let asked: Vec<String> = request["workerIds"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect();
    let (wait, reply) = {
        let mut w = world(&shared, &project)?;
        let wait = w.read_call();
        let found = w
            .sim
            .cloud
            .get_node(known(&zone), known(name))
            .map(|n| n.map(|n| n.hosts));
        let reply = match found {
            Err(e) => Err(api_fail(&e, &zone, name)),
            Ok(None) => Err(Fail::not_found(&format!(
                "projects/{project}/locations/{zone}/nodes/{name}"
            ))),
            Ok(Some(hosts)) => guest_attributes(&w, &zone, name, hosts.max(1), &query, &asked)
                .map(|attributes| Json(json!({"guestAttributes": attributes}))),
        };
        (wait, reply)
    };
    after(wait, reply).await
}

fn guest_attributes(
    w: &World,
    zone: &str,
    name: &str,
    hosts: u32,
    query: &str,
    asked: &[String],
) -> Result<Vec<Value>, Fail> {
    let workers: Vec<u32> = if asked.is_empty() {
        (0..hosts).collect()
    } else {
        asked
            .iter()
            .map(|id| {
                id.parse::<u32>()
                    .ok()
                    .filter(|&i| i < hosts)
                    .ok_or_else(|| {
                        Fail::invalid(format!(
                            "Invalid worker ID: {id:?} (the node has {hosts} workers)"
                        ))
                    })
            })
            .collect::<Result<_, _>>()?
    };
    Ok(workers
        .into_iter()
        .map(|i| {
            let published = w
                .ssh_workers
                .get(&(zone.to_owned(), name.to_owned(), i))
                .and_then(|ssh| ssh.host_key.trim().split_once(' '))
                .map(|(kind, key)| (kind.to_owned(), key.to_owned()));
            let hostname = format!("t1v-n-{name}-w-{i}");
            let items: Vec<Value> = published
                .iter()
                .flat_map(|(kind, key)| {
                    [
                        ("hostkeys", kind.as_str(), key.as_str()),
                        ("guestInventory", "hostname", hostname.as_str()),
                    ]
                })
                .filter(|(ns, k, _)| format!("{ns}/{k}").starts_with(query))
                .map(|(ns, k, v)| json!({"namespace": ns, "key": k, "value": v}))
                .collect();
            // Proto-JSON omits what is empty.
            let mut value = json!({});
            if !items.is_empty() {
                value["items"] = json!(items);
            }
            let mut entry = json!({"queryValue": value});
            if !query.is_empty() {
                entry["queryPath"] = json!(query);
            }
            entry
        })
        .collect())
}

/// `POST /emulator/v1/…/nodes/N/workers/I {ipAddress, port, hostKey}`: worker I of node N is
/// the sshd at that address with that host key (its endpoint and guest attributes say so).
async fn register_ssh_worker(
    State(shared): State<Shared>,
    Path((project, zone, node, worker)): Path<(String, String, String, u32)>,
    Json(ssh): Json<crate::emulator::SshWorker>,
) -> Reply {
    let mut w = world(&shared, &project)?;
    w.ssh_workers.insert((zone, node.clone(), worker), ssh);
    Ok(Json(json!({"registered": node, "worker": worker})))
}

async fn preempt(
    State(shared): State<Shared>,
    Path((project, zone, node)): Path<(String, String, String)>,
) -> Reply {
    let mut w = world(&shared, &project)?;
    let preempted = w.sim.cloud.preempt_now(&zone, &node);
    w.reap_workers();
    if preempted {
        Ok(Json(json!({"preempted": node})))
    } else {
        Err(Fail::new(
            StatusCode::BAD_REQUEST,
            "FAILED_PRECONDITION",
            format!("{zone}/{node} is not a READY Spot node without a preemption notice"),
        ))
    }
}

// ----- simulated workers --------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LaunchBody {
    attempt_id: String,
    job_id: String,
}

fn remote_fail(e: &RemoteError, zone: &str, node: &str) -> Fail {
    match e {
        RemoteError::NotFound => Fail::not_found(&format!("nodes/{node} in {zone}")),
        RemoteError::Temporary => Fail::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            format!("ssh: connect to host {node}: Connection refused"),
        ),
    }
}

async fn launch(
    State(shared): State<Shared>,
    Path((project, zone, node)): Path<(String, String, String)>,
    Json(l): Json<LaunchBody>,
) -> Reply {
    let (wait, reply) = {
        let mut w = world(&shared, &project)?;
        let wait = w.timed_call(CallKind::Remote);
        let behaviour = w.default_job.clone();
        w.sim.cloud.register_job(&l.job_id, behaviour);
        let reply = w
            .sim
            .cloud
            .launch(
                Ustr::from(&zone),
                Ustr::from(&node),
                Ustr::from(&l.attempt_id),
                Ustr::from(&l.job_id),
            )
            .map(|()| Json(json!({"launched": l.attempt_id})))
            .map_err(|e| remote_fail(&e, &zone, &node));
        (wait, reply)
    };
    after(wait, reply).await
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CancelBody {
    attempt_id: String,
    /// Why the controller stops it, when the job is to run again (`interrupt-spot`, …).
    #[serde(default)]
    notice: Option<String>,
}

async fn cancel(
    State(shared): State<Shared>,
    Path((project, zone, node)): Path<(String, String, String)>,
    Json(c): Json<CancelBody>,
) -> Reply {
    let (wait, reply) = {
        let mut w = world(&shared, &project)?;
        let wait = w.timed_call(CallKind::Remote);
        let reply = w
            .sim
            .cloud
            .cancel(
                Ustr::from(&zone),
                Ustr::from(&node),
                Ustr::from(&c.attempt_id),
                c.notice.is_some(),
            )
            .map(|r| {
                Json(json!({"result": match r {
                    CancelResult::Sent => "sent",
                    CancelResult::NotRunning => "notRunning",
                    CancelResult::Mismatch => "mismatch",
                }}))
            })
            .map_err(|e| remote_fail(&e, &zone, &node));
        (wait, reply)
    };
    after(wait, reply).await
}

#[derive(Debug, Deserialize)]
struct ReportsBody {
    attempts: Vec<String>,
}

async fn reports(State(shared): State<Shared>, Json(r): Json<ReportsBody>) -> Reply {
    let (wait, reply) = {
        let mut w = lock(&shared);
        w.tick();
        // Reading the workers' status objects is a read of the pass.
        let wait = w.read_call();
        let in_flight: Vec<InFlight> = r
            .attempts
            .iter()
            .map(|a| InFlight {
                attempt: Name::new(a),
                job: Name::new(""),
                bucket: Name::new(""),
            })
            .collect();
        let reports = w.sim.read_reports(&in_flight);
        let read_at = w.timestamp(w.now_ms());
        let touched: Vec<String> = w
            .sim
            .cloud
            .take_report_changes()
            .iter()
            .map(|a| a.to_string())
            .collect();
        (
            wait,
            json!({"readAt": read_at, "reports": reports, "touched": touched}),
        )
    };
    after(wait, Ok(Json(reply))).await
}
