//! Conformance with Google's own API descriptions (the discovery documents vendored in
//! `tests/discovery/`): every request the Google clients send goes through a recording proxy
//! on loopback to a real server — the TPU API emulator, Google's Firestore emulator,
//! fake-gcs-server — and is checked against the method it calls (HTTP method, path
//! template, declared query parameters, body fields, types and enum values); every reply the
//! TPU API emulator gives is checked against the method's response schema as Google writes
//! proto-JSON, and every error against Google's error shape. The methods each client
//! reached are listed and compared with the methods the code calls, so a new call shows up
//! here, and one the documents do not define fails. `deploy`'s calls are checked the same
//! way in `tests/deploy.rs`. The emulator's own strictness (unknown query parameters and
//! body fields refused as Google refuses them) is shown over raw HTTP.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tpu_runner::emulator::{self, Clock, Running, Shared, World, lock};
use tpu_runner::gcp::discovery::Api;
use tpu_runner::gcp::http::{Endpoint, RetryPolicy};
use tpu_runner::gcp::tpu::{Client, QrRequest, Quotas};
use tpu_runner::spec::ProvisioningModel;

#[path = "support/google.rs"]
mod google;

/// One exchange the proxy carried.
#[derive(Clone, Debug)]
struct Exchange {
    sent: google::Sent,
    status: u16,
    reply: Vec<u8>,
}

/// An HTTP proxy on loopback that forwards every request to `upstream` and keeps it with
/// its reply; stopped when dropped.
struct Proxy {
    url: String,
    log: Arc<Mutex<Vec<Exchange>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn to(upstream: &str) -> Proxy {
        use axum::body::Bytes;
        use axum::extract::Request;
        use axum::response::IntoResponse;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (kept, upstream) = (log.clone(), upstream.trim_end_matches('/').to_owned());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let http = reqwest::Client::new();
                let app = axum::Router::new().fallback(move |request: Request| {
                    let (http, kept, upstream) = (http.clone(), kept.clone(), upstream.clone());
                    async move {
                        let (parts, body) = request.into_parts();
                        let body: Bytes = axum::body::to_bytes(body, 64 << 20).await.unwrap();
                        let target = parts.uri.path_and_query().unwrap().to_string();
                        let content_type = parts
                            .headers
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned();
                        let mut forward = http
                            .request(parts.method.clone(), format!("{upstream}{target}"))
                            .body(body.clone());
                        for (k, v) in &parts.headers {
                            if k != "host" && k != "content-length" {
                                forward = forward.header(k, v);
                            }
                        }
                        let reply = forward.send().await.unwrap();
                        let status = reply.status().as_u16();
                        let reply_type = reply
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("application/json")
                            .to_owned();
                        let bytes = reply.bytes().await.unwrap().to_vec();
                        kept.lock().unwrap().push(Exchange {
                            sent: google::Sent {
                                method: parts.method.to_string(),
                                target,
                                body: body.to_vec(),
                                content_type,
                            },
                            status,
                            reply: bytes.clone(),
                        });
                        (
                            axum::http::StatusCode::from_u16(status).unwrap(),
                            [("content-type", reply_type)],
                            bytes,
                        )
                            .into_response()
                    }
                });
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Proxy {
            url,
            log,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn exchanges(&self) -> Vec<Exchange> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Checks every exchange's request against `api` (and, with `replies`, every reply against
/// the method's response schema, every error against Google's error shape); the methods
/// reached, or every problem found.
fn judge(api: &'static Api, exchanges: &[Exchange], replies: bool) -> BTreeSet<String> {
    let mut problems = Vec::new();
    let mut reached = BTreeSet::new();
    for x in exchanges {
        match google::check_request(api, &x.sent) {
            Err(e) => problems.push(e),
            Ok(method) => {
                reached.insert(method.id.clone());
                if !replies {
                    continue;
                }
                if (200..300).contains(&x.status) {
                    if let Err(e) = google::check_reply(api, method, &x.reply) {
                        problems.push(format!("{} {}: {e}", x.sent.method, x.sent.target));
                    }
                } else if let Err(e) = error_shape(x.status, &x.reply) {
                    problems.push(format!("{} {}: {e}", x.sent.method, x.sent.target));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "what Google's {} {} document does not allow:\n{}",
        api.name,
        api.version,
        problems.join("\n")
    );
    reached
}

/// Google's error reply: `{"error": {code, message, status, details?}}` with the HTTP
/// status as `code`, a `google.rpc.Code` name as `status`, typed details.
fn error_shape(status: u16, body: &[u8]) -> Result<(), String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("an error that is not JSON: {e}"))?;
    let e = v["error"].as_object().ok_or("no `error` object")?;
    let known: BTreeSet<&str> = ["code", "message", "status", "details"].into();
    if let Some(k) = e.keys().find(|k| !known.contains(k.as_str())) {
        return Err(format!("an error with a field Google's has not: {k}"));
    }
    if e.get("code").and_then(Value::as_u64) != Some(u64::from(status)) {
        return Err(format!("error.code is not the HTTP status {status}: {v}"));
    }
    const CODES: [&str; 16] = [
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    if !e
        .get("status")
        .and_then(Value::as_str)
        .is_some_and(|s| CODES.contains(&s))
    {
        return Err(format!("error.status is not a google.rpc.Code: {v}"));
    }
    for d in e
        .get("details")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if !d["@type"].is_string() {
            return Err(format!("an error detail without its @type: {v}"));
        }
    }
    Ok(())
}

const PROJECT: &str = "conf-project";
const EAST: &str = "us-east1-d";

/// An emulated cloud with a single-host pool and a four-host one in `EAST` (Spot), and
/// single-host on-demand capacity and a reservation `conf-res` of two slices there.
fn world() -> Shared {
    use tpu_runner_sim::model::*;
    let scenario = tpu_runner::simulate::scenario::load(
        &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/smoke.yaml"),
    )
    .unwrap();
    let mut config = tpu_runner::simulate::harness::cloud_config(&scenario, 5, None);
    let pool = |accelerator: &str, chips, hosts| PoolConfig {
        zone: EAST.into(),
        accelerator: accelerator.into(),
        model: PoolModel::Spot,
        reservation: None,
        chips,
        hosts,
        capacity: Capacity::Constant(4),
        preemption_per_hour: 0.0,
        outages: Vec::new(),
        reclaims: true,
    };
    config.pools = vec![
        pool("v6e-8", 8, 1),
        pool("v6e-16", 16, 4),
        PoolConfig {
            model: PoolModel::OnDemand,
            reclaims: false,
            ..pool("v6e-8", 8, 1)
        },
        PoolConfig {
            model: PoolModel::Reserved,
            reservation: Some("conf-res".into()),
            capacity: Capacity::Constant(2),
            reclaims: false,
            ..pool("v6e-8", 8, 1)
        },
    ];
    let cloud = tpu_runner_sim::SimCloud::new(config);
    let sim = tpu_runner::backend::sim::SimBackend::new(
        cloud,
        tpu_runner::simulate::harness::EPOCH,
        "conf",
        true,
    );
    World::new(sim, PROJECT, Clock::Virtual).shared()
}

fn client(url: &str) -> Client {
    Client::new(
        Endpoint::emulator(url),
        PROJECT,
        Quotas::default(),
        RetryPolicy {
            tries: 1,
            ..RetryPolicy::default()
        },
    )
    .unwrap()
}

fn request(id: &str, accelerator: &str) -> QrRequest {
    QrRequest {
        model: ProvisioningModel::Spot,
        reservation: None,
        id: format!("{id}-qr"),
        node_id: id.into(),
        zone: EAST.into(),
        accelerator_type: accelerator.into(),
        runtime_version: "v2-alpha-tpuv6e".into(),
        network: "default".into(),
        subnetwork: "default".into(),
        external_ips: true,
        service_account: "conf-worker@conf-project.iam.gserviceaccount.com".into(),
        labels: BTreeMap::from([("managed-by".into(), "conf".into())]),
        metadata: BTreeMap::from([(
            "startup-script-url".into(),
            "gs://conf-bucket/artifacts/startup.sh".into(),
        )]),
    }
}

/// Every call of the TPU client, against the emulator: what they send and what the emulator
/// answers are what Google's TPU API v2 document defines. Worker host keys of a four-host
/// slice come back to the right workers.
#[test]
fn the_tpu_client_and_the_emulator_speak_the_tpu_api_v2_document() {
    let world = world();
    let running: Running = emulator::start(world.clone(), "127.0.0.1:0").unwrap();
    let proxy = Proxy::to(&running.url());
    let c = client(&proxy.url);

    let op = c
        .create_queued_resource(
            &request("conf-big", "v6e-16"),
            "6f1c1b3e-0000-4000-8000-000000000001",
        )
        .unwrap();
    assert!(!op.done, "an operation takes time: {op:?}");
    c.create_queued_resource(
        &request("conf-small", "v6e-8"),
        "6f1c1b3e-0000-4000-8000-000000000002",
    )
    .unwrap();
    let read = c.operation(&op.name).unwrap();
    let again = c.operation(&op.name).unwrap();
    assert!(again.done, "{read:?} {again:?}");
    lock(&world).sim.cloud.advance_to(3_600_000);
    // Every state a reply can show: a request waiting in a stocked-out pool, a preempted
    // Spot node (its queued resource suspended), ready ones.
    lock(&world).sim.cloud.set_stockout(EAST, true);
    c.create_queued_resource(
        &request("conf-waiting", "v6e-8"),
        "6f1c1b3e-0000-4000-8000-000000000005",
    )
    .unwrap();
    c.create_queued_resource(
        &request("conf-spot", "v6e-8"),
        "6f1c1b3e-0000-4000-8000-000000000006",
    )
    .unwrap();
    lock(&world).sim.cloud.set_stockout(EAST, false);
    // On-demand and reserved capacity: the `guaranteed` tier, with a `reservationName` for
    // the reservation; a stockout of Spot capacity does not touch them.
    c.create_queued_resource(
        &QrRequest {
            model: ProvisioningModel::OnDemand,
            ..request("conf-on-demand", "v6e-8")
        },
        "6f1c1b3e-0000-4000-8000-000000000008",
    )
    .unwrap();
    c.create_queued_resource(
        &QrRequest {
            model: ProvisioningModel::Reserved,
            reservation: Some("conf-res".into()),
            ..request("conf-reserved", "v6e-8")
        },
        "6f1c1b3e-0000-4000-8000-000000000009",
    )
    .unwrap();
    let unknown = c.create_queued_resource(
        &QrRequest {
            model: ProvisioningModel::Reserved,
            reservation: Some("no-such-reservation".into()),
            ..request("conf-unreserved", "v6e-8")
        },
        "6f1c1b3e-0000-4000-8000-00000000000a",
    );
    let err = unknown.expect_err("a reservation that does not exist is refused");
    assert!(
        matches!(
            tpu_runner::backend::gcp::cloud_failure(&err),
            tpu_runner::engine::observe::CloudFailure::Permanent(_)
        ),
        "{err}"
    );
    lock(&world).sim.cloud.advance_to(7_200_000);
    assert!(lock(&world).sim.cloud.preempt_now(EAST, "conf-spot"));
    lock(&world).sim.cloud.set_stockout(EAST, true);
    c.create_queued_resource(
        &request("conf-stuck", "v6e-8"),
        "6f1c1b3e-0000-4000-8000-000000000007",
    )
    .unwrap();
    lock(&world).sim.cloud.advance_to(7_300_000);

    let qrs = c
        .list_queued_resources(&[EAST.to_owned()])
        .remove(0)
        .unwrap();
    let states: BTreeSet<&str> = qrs.iter().map(|q| q.state.state.as_str()).collect();
    assert!(
        states.contains("WAITING_FOR_RESOURCES") && states.contains("SUSPENDED"),
        "{states:?}"
    );
    let model_of = |id: &str| {
        let qr = qrs.iter().find(|q| q.id() == format!("{id}-qr")).unwrap();
        (qr.is_spot(), qr.is_reserved(), qr.state.state.clone())
    };
    assert_eq!(model_of("conf-spot"), (true, false, "SUSPENDED".into()));
    assert_eq!(model_of("conf-on-demand"), (false, false, "ACTIVE".into()));
    assert_eq!(model_of("conf-reserved"), (false, true, "ACTIVE".into()));
    assert!(!qrs.iter().any(|q| q.id() == "conf-unreserved-qr"));
    let nodes = c.list_nodes(&[EAST.to_owned()]).remove(0).unwrap();
    let states: BTreeSet<&str> = nodes.iter().map(|n| n.state.as_str()).collect();
    assert!(states.contains("PREEMPTED"), "{states:?}");
    let node = |id: &str| nodes.iter().find(|n| n.id() == id).unwrap();
    assert!(node("conf-spot").is_spot() && !node("conf-spot").is_reserved());
    assert!(!node("conf-on-demand").is_spot() && !node("conf-on-demand").is_reserved());
    assert!(!node("conf-reserved").is_spot() && node("conf-reserved").is_reserved());

    let got = c.get_nodes(&[
        (EAST.to_owned(), "conf-big".to_owned()),
        (EAST.to_owned(), "absent".to_owned()),
    ]);
    let big = got[0].as_ref().unwrap().as_ref().unwrap();
    assert_eq!(big.network_endpoints.len(), 4);
    assert!(got[1].as_ref().unwrap().is_none());

    // Workers 1 and 3 publish their keys; 0 and 2 not yet.
    {
        let mut w = lock(&world);
        for i in [1u32, 3] {
            w.ssh_workers.insert(
                (EAST.to_owned(), "conf-big".to_owned(), i),
                tpu_runner::emulator::SshWorker {
                    ip_address: format!("10.0.0.{i}"),
                    port: 2200 + i as u16,
                    host_key: format!("ssh-ed25519 AAAAKEYOFWORKER{i}"),
                },
            );
        }
    }
    let keys = c
        .guest_attributes(EAST, "conf-big", "hostkeys/", 4)
        .unwrap();
    let by_worker: Vec<(u32, &str)> = keys
        .iter()
        .map(|a| (a.worker_id, a.value.as_str()))
        .collect();
    assert_eq!(
        by_worker,
        [(1, "AAAAKEYOFWORKER1"), (3, "AAAAKEYOFWORKER3")]
    );
    let all = c.guest_attributes(EAST, "conf-big", "", 4).unwrap();
    assert!(
        all.iter()
            .any(|a| a.worker_id == 3 && a.key == "hostname" && a.value == "t1v-n-conf-big-w-3"),
        "{all:?}"
    );

    c.delete_node(EAST, "conf-small").unwrap();
    c.delete_node(EAST, "conf-small").unwrap();
    c.delete_queued_resource(EAST, "conf-big-qr", "6f1c1b3e-0000-4000-8000-000000000003")
        .unwrap();
    c.delete_queued_resource(EAST, "absent-qr", "6f1c1b3e-0000-4000-8000-000000000004")
        .unwrap();

    let tpu = &google::APIS["tpu"];
    let reached = judge(tpu, &proxy.exchanges(), true);
    // Every method the TPU client calls (src/gcp/tpu.rs), and no other.
    assert_eq!(
        reached.into_iter().collect::<Vec<_>>(),
        [
            "tpu.projects.locations.nodes.delete",
            "tpu.projects.locations.nodes.get",
            "tpu.projects.locations.nodes.getGuestAttributes",
            "tpu.projects.locations.nodes.list",
            "tpu.projects.locations.operations.get",
            "tpu.projects.locations.queuedResources.create",
            "tpu.projects.locations.queuedResources.delete",
            "tpu.projects.locations.queuedResources.list",
        ]
    );
}

/// A controller's passes on the emulator (creates, listings, deletes through `GcpBackend`,
/// with a scenario's faults: refusals, stockouts) send and receive only what the document
/// defines.
#[test]
fn a_controller_on_the_emulator_sends_and_receives_only_what_the_document_defines() {
    use tpu_runner::backend::CloudBackend;
    use tpu_runner::backend::gcp::{CreateSettings, GcpBackend};
    use tpu_runner::backend::workers::EmulatedWorkers;
    use tpu_runner::engine::{Action, InventoryScope};
    use tpu_runner::spec::{Name, TpuType};
    let world = world();
    let running = emulator::start(world.clone(), "127.0.0.1:0").unwrap();
    let proxy = Proxy::to(&running.url());
    let fleet = tpu_runner::spec::fleet::parse_fleet(
        "conformance.yaml",
        &format!("name: conf\nproject: {PROJECT}\ncontroller_region: us-east1\ncontroller_timeout: 168h\nfirestore_location: nam5\nnetwork: default\nsubnetwork: default\nssh_transport: direct\nbucket: gs://conf-bucket\ntpus:\n  - {{id: east, type: v6e-8, zone: {EAST}, count: 4, runtime: v2-alpha-tpuv6e, chip_limit: 32}}\n"),
    )
    .unwrap();
    let workers = EmulatedWorkers::new(&Endpoint::emulator(&running.url()), PROJECT).unwrap();
    let mut backend = GcpBackend::new(
        client(&proxy.url),
        CreateSettings::of_fleet(&fleet),
        Box::new(workers),
    );
    let now = tpu_runner::simulate::harness::EPOCH;
    let create = |n: usize| Action::CreateQueuedResource {
        name: Name::new(&format!("conf-east-{n}-qr")),
        node_id: Name::new(&format!("conf-east-{n}")),
        zone: Name::new(EAST),
        tpu_type: TpuType::parse("v6e-8").unwrap(),
        runtime: "v2-alpha-tpuv6e".into(),
        entry_id: Name::new("east"),
        model: tpu_runner::spec::ProvisioningModel::Spot,
        reservation: None,
    };
    let scope = InventoryScope {
        runner: "conf",
        zones: std::borrow::Cow::Owned([Name::new(EAST)].into_iter().collect()),
        adopted: [(EAST, "adopted-tpu")].into_iter().collect(),
    };
    backend.execute(&[create(1), create(2)], now);
    lock(&world).sim.cloud.advance_to(3_600_000);
    let mut inventory = Default::default();
    backend.inventory(&scope, now, &mut inventory).unwrap();
    backend.execute(
        &[
            Action::DeleteNode {
                name: Name::new("conf-east-1"),
                zone: Name::new(EAST),
            },
            Action::DeleteQueuedResource {
                name: Name::new("conf-east-2-qr"),
                zone: Name::new(EAST),
            },
        ],
        now,
    );
    backend.inventory(&scope, now, &mut inventory).unwrap();
    let reached = judge(&google::APIS["tpu"], &proxy.exchanges(), true);
    assert!(
        reached.contains("tpu.projects.locations.nodes.delete"),
        "{reached:?}"
    );
    assert!(
        reached.contains("tpu.projects.locations.nodes.get"),
        "adopted TPUs are read by name: {reached:?}"
    );
}

/// One raw HTTP call: its status and JSON reply.
fn call(method: &str, url: &str, body: Option<&Value>) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut r = reqwest::Client::new().request(method.parse().unwrap(), url);
        if let Some(body) = body {
            r = r.json(body);
        }
        let reply = r.send().await.unwrap();
        let status = reply.status().as_u16();
        (status, reply.json().await.unwrap_or(Value::Null))
    })
}

/// Google's front end refuses what the method does not declare; so does the emulator, in
/// Google's error shape.
#[test]
fn the_emulator_refuses_unknown_parameters_and_fields_as_google_does() {
    let world = world();
    let running = emulator::start(world.clone(), "127.0.0.1:0").unwrap();
    let base = format!("{}/v2/projects/{PROJECT}/locations/{EAST}", running.url());
    let refused = |(status, body): (u16, Value)| -> Value {
        assert_eq!(status, 400, "{body}");
        error_shape(400, &serde_json::to_vec(&body).unwrap()).unwrap();
        assert_eq!(body["error"]["status"], "INVALID_ARGUMENT", "{body}");
        assert_eq!(
            body["error"]["details"][0]["@type"], "type.googleapis.com/google.rpc.BadRequest",
            "{body}"
        );
        body
    };
    // The v2alpha1 parameter on v2's nodes.delete: the defect that would leave nodes billing.
    let body = refused(call(
        "DELETE",
        &format!("{base}/nodes/conf-small?requestId=r-1"),
        None,
    ));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("Unknown name \"requestId\": Cannot bind query parameter"),
        "{message}"
    );
    // A body field QueuedResource does not have, deep in the node spec.
    let qrs = format!("{base}/queuedResources?queuedResourceId=conf-x-qr");
    let mut create = tpu_runner::gcp::tpu::create_body(PROJECT, &request("conf-x", "v6e-8"));
    create["tpu"]["nodeSpec"][0]["node"]["acceleratorConfigg"] = json!({"type": "V6E"});
    let body = refused(call("POST", &qrs, Some(&create)));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("Unknown name \"acceleratorConfigg\" at 'tpu.nodeSpec[0].node'"),
        "{message}"
    );
    // A value of the wrong type; a query value of the wrong type.
    let mut create = tpu_runner::gcp::tpu::create_body(PROJECT, &request("conf-x", "v6e-8"));
    create["tpu"]["nodeSpec"][0]["node"]["networkConfig"]["enableExternalIps"] = json!("yes");
    refused(call("POST", &qrs, Some(&create)));
    refused(call("GET", &format!("{base}/nodes?pageSize=ten"), None));
    // `tier` is a union: both tiers, none, or a reservation with Spot or in another zone are
    // refused (the emulator is no kinder than the document).
    let invalid = |(status, body): (u16, Value)| {
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["status"], "INVALID_ARGUMENT", "{body}");
    };
    let spot = tpu_runner::gcp::tpu::create_body(PROJECT, &request("conf-x", "v6e-8"));
    let mut both = spot.clone();
    both["guaranteed"] = json!({});
    invalid(call("POST", &qrs, Some(&both)));
    let mut neither = spot.clone();
    neither.as_object_mut().unwrap().remove("spot");
    invalid(call("POST", &qrs, Some(&neither)));
    let mut spot_reserved = spot.clone();
    spot_reserved["reservationName"] = json!(format!(
        "projects/{PROJECT}/locations/{EAST}/reservations/conf-res"
    ));
    invalid(call("POST", &qrs, Some(&spot_reserved)));
    let mut elsewhere = neither.clone();
    elsewhere["guaranteed"] = json!({});
    elsewhere["reservationName"] = json!(format!(
        "projects/{PROJECT}/locations/us-west1-a/reservations/conf-res"
    ));
    invalid(call("POST", &qrs, Some(&elsewhere)));
    // Google's parser takes a field's proto name too: this one is refused only because the
    // node does not exist.
    let (status, _) = call(
        "POST",
        &format!("{base}/nodes/conf-small:getGuestAttributes"),
        Some(&json!({"query_path": "hostkeys/"})),
    );
    assert_eq!(status, 404, "the node does not exist yet");
    // A path no method has is 404.
    assert_eq!(call("GET", &format!("{base}/nodes/a/b"), None).0, 404);
    // Two nodes of one type in one zone are two live nodes in the emulator's status (it
    // counted (zone, type) pairs).
    let c = client(&running.url());
    for id in ["conf-a", "conf-b"] {
        c.create_queued_resource(
            &request(id, "v6e-8"),
            &format!("00000000-0000-4000-8000-0000000{id}"),
        )
        .unwrap();
    }
    lock(&world).sim.cloud.advance_to(3_600_000);
    let (_, status) = call(
        "GET",
        &format!("{}/emulator/v1/status", running.url()),
        None,
    );
    assert_eq!(status["liveNodes"], 2, "{status}");
    // Nothing refused reached the simulated cloud.
    assert!(
        lock(&world)
            .sim
            .cloud
            .peek_queued_resource("us-east1-d".into(), "conf-x-qr".into())
            .is_none()
    );
}

/// Every refusal is `google.rpc.Status` JSON, also those the HTTP layer makes before a
/// handler runs (they were plain text, or no body at all): a body without its JSON content
/// type, a query value out of range, a method a path does not have, on the TPU API and on
/// the emulator's own routes.
#[test]
fn every_refusal_of_the_emulator_is_a_google_rpc_status() {
    let running = emulator::start(world(), "127.0.0.1:0").unwrap();
    let url = running.url();
    let base = format!("{url}/v2/projects/{PROJECT}/locations/{EAST}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let send = |method: &str, url: String, content_type: Option<&str>, body: &str| {
        rt.block_on(async {
            let mut r = reqwest::Client::new()
                .request(method.parse().unwrap(), url)
                .body(body.to_owned());
            if let Some(t) = content_type {
                r = r.header("content-type", t);
            }
            let reply = r.send().await.unwrap();
            (reply.status().as_u16(), reply.bytes().await.unwrap())
        })
    };
    let json = Some("application/json");
    let qrs = format!("{base}/queuedResources?queuedResourceId=conf-x-qr");
    let cases = [
        ("POST", qrs.clone(), None, r#"{"tpu": {}}"#, 400),
        ("POST", qrs, json, r#"{"tpu": "#, 400),
        ("GET", format!("{base}/nodes?pageSize=-1"), None, "", 400),
        ("PUT", format!("{base}/nodes/conf-small"), json, "{}", 404),
        (
            "POST",
            format!("{url}/emulator/v1/zones/{EAST}/stockout"),
            None,
            r#"{"on": true}"#,
            400,
        ),
        (
            "POST",
            format!("{url}/emulator/v1/zones/{EAST}/stockout"),
            json,
            r#"{"on": "#,
            400,
        ),
        ("PUT", format!("{url}/emulator/v1/status"), None, "", 404),
        ("GET", format!("{url}/nowhere"), None, "", 404),
    ];
    for (method, url, content_type, body, code) in cases {
        let (status, reply) = send(method, url.clone(), content_type, body);
        assert_eq!(
            status,
            code,
            "{method} {url}: {}",
            String::from_utf8_lossy(&reply)
        );
        error_shape(status, &reply).unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    }
}

/// A client that opens a connection and never finishes its request's headers is cut off
/// (it held a connection and its task for as long as it liked).
#[test]
fn the_emulator_closes_a_connection_whose_headers_never_end() {
    use std::io::{Read, Write};
    let running = emulator::start_with(world(), "127.0.0.1:0", Duration::from_secs(1)).unwrap();
    let addr = running.url().trim_start_matches("http://").to_owned();
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /emulator/v1/status HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    // The server ends the connection (EOF, or a reset) instead of waiting for the headers.
    let _ = slow.read_to_end(&mut rest);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the connection was held open"
    );
    // A client that sends its request whole is served.
    let mut quick = std::net::TcpStream::connect(&addr).unwrap();
    quick
        .write_all(b"GET /emulator/v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    quick.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

/// The emulator `var` names (`STORAGE_EMULATOR_HOST`, `FIRESTORE_EMULATOR_HOST`), if one
/// runs; without one the test says so and skips (and fails where CI requires emulators).
fn emulator_at(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(host) if !host.trim().is_empty() => Some(Endpoint::emulator(host.trim()).base),
        _ => {
            assert!(
                std::env::var("TPU_RUNNER_REQUIRE_EMULATORS").as_deref() != Ok("1"),
                "{var} is not set: start its emulator (.ci/run does)"
            );
            eprintln!("skipped: set {var} (README, Development)");
            None
        }
    }
}

/// Every call of the Cloud Storage client sends what the JSON API's document defines (the
/// replies are fake-gcs-server's, not Google's: only the requests are judged).
#[test]
fn the_cloud_storage_client_speaks_the_storage_v1_document() {
    use tpu_runner::gcp::storage::Storage;
    let Some(upstream) = emulator_at("STORAGE_EMULATOR_HOST") else {
        return;
    };
    let proxy = Proxy::to(&upstream);
    let s = Storage::new(Endpoint::emulator(&proxy.url), RetryPolicy::default()).unwrap();
    let bucket = format!("conf-{}", std::process::id());
    s.create_bucket("conf-project", &bucket, "US-EAST1")
        .unwrap();
    // (fake-gcs-server keeps its own location: only the call is judged.)
    assert!(s.bucket_location(&bucket).unwrap().is_some());
    let name = "jobs/j 1/status/w-0.json";
    s.put(&bucket, name, b"{}", "application/json", true)
        .unwrap();
    let e = s
        .put(&bucket, name, b"{}", "application/json", true)
        .unwrap_err();
    assert_eq!(e.status, "FAILED_PRECONDITION", "create-only: {e}");
    s.put(&bucket, name, b"{\"a\":1}", "application/json", false)
        .unwrap();
    assert_eq!(
        s.get(&bucket, name, 1 << 20).unwrap().unwrap(),
        b"{\"a\":1}"
    );
    let dir = tempfile::tempdir().unwrap();
    assert!(
        s.download(&bucket, name, &dir.path().join("f"), 1 << 20)
            .unwrap()
    );
    assert_eq!(s.list(&bucket, "jobs/").unwrap().len(), 1);
    // A moved job's checkpoints are copied inside Cloud Storage (`objects.rewrite`).
    s.rewrite(&bucket, name, &bucket, "moved/w-0.json").unwrap();
    assert_eq!(
        s.get(&bucket, "moved/w-0.json", 1 << 20).unwrap().unwrap(),
        b"{\"a\":1}"
    );
    s.delete(&bucket, "moved/w-0.json").unwrap();
    s.delete(&bucket, name).unwrap();
    assert!(s.get(&bucket, name, 1 << 20).unwrap().is_none());
    let reached = judge(&google::APIS["storage"], &proxy.exchanges(), false);
    assert_eq!(
        reached.into_iter().collect::<Vec<_>>(),
        [
            "storage.buckets.get",
            "storage.buckets.insert",
            "storage.objects.delete",
            "storage.objects.get",
            "storage.objects.insert",
            "storage.objects.list",
            "storage.objects.rewrite",
        ]
    );
}

/// The Firestore store (lease, epoch, loads, commits with preconditions, history queries
/// with cursors) sends what Firestore's document defines, and Google's own Firestore
/// emulator answers in its response schemas.
#[test]
fn the_firestore_store_speaks_the_firestore_v1_document() {
    use tpu_runner::engine::Timestamp;
    use tpu_runner::store::StateStore;
    use tpu_runner::store::firestore::FirestoreStore;
    let Some(upstream) = emulator_at("FIRESTORE_EMULATOR_HOST") else {
        return;
    };
    let proxy = Proxy::to(&upstream);
    let runner = format!("conf{}", std::process::id());
    let mut store = FirestoreStore::open(
        "demo-tpu-runner",
        "(default)",
        &runner,
        Endpoint::emulator(&proxy.url),
    )
    .unwrap();
    let now = Timestamp::from_secs(1_767_225_600);
    store.set_epoch("e-1", now).unwrap();
    store
        .acquire_lease("controller-a", "e-1", 60, now)
        .unwrap()
        .unwrap();
    store.lease().unwrap();
    let loaded = store.load_active().unwrap();
    let _ = loaded;
    store.events_after(0, 10).unwrap();
    store.finished_jobs(now, 10).unwrap();
    store.export().unwrap();
    store.release_lease("controller-a").unwrap();
    let mut client = tpu_runner::gcp::firestore::Client::new(
        Endpoint::emulator(&proxy.url),
        "demo-tpu-runner",
        "(default)",
    )
    .unwrap();
    let t = client.begin(false, None).unwrap();
    client.rollback(&t);
    let reached = judge(&google::APIS["firestore"], &proxy.exchanges(), true);
    assert_eq!(
        reached.into_iter().collect::<Vec<_>>(),
        [
            "firestore.projects.databases.documents.batchGet",
            "firestore.projects.databases.documents.beginTransaction",
            "firestore.projects.databases.documents.commit",
            "firestore.projects.databases.documents.rollback",
            "firestore.projects.databases.documents.runQuery",
        ]
    );
}

/// The rule book itself: a call the documents do not define fails, whatever its shape.
#[test]
fn a_call_the_documents_do_not_define_is_refused() {
    let tpu = &google::APIS["tpu"];
    let sent = |method: &str, target: &str, body: &str| google::Sent {
        method: method.into(),
        target: target.into(),
        body: body.as_bytes().to_vec(),
        content_type: "application/json".into(),
    };
    let p = "/v2/projects/p/locations/z";
    for (s, why) in [
        (
            sent("DELETE", &format!("{p}/nodes/n?requestId=1"), ""),
            "Unknown name \"requestId\"",
        ),
        (
            sent(
                "POST",
                &format!("{p}/nodes/n:getGuestAttributes"),
                r#"{"workerId": "1"}"#,
            ),
            "Unknown name \"workerId\"",
        ),
        (
            sent("POST", &format!("{p}/nodes/n:reboot"), "{}"),
            "no method",
        ),
        (sent("PUT", &format!("{p}/nodes/n"), "{}"), "no method"),
        (
            sent("GET", &format!("{p}/queuedResources?pageSize=x"), ""),
            "TYPE_INTEGER",
        ),
        (
            sent("DELETE", &format!("{p}/queuedResources/q?force=maybe"), ""),
            "TYPE_BOOLEAN",
        ),
        (
            sent("GET", &format!("{p}/nodes/n"), r#"{"a": 1}"#),
            "takes no request body",
        ),
        (
            sent(
                "POST",
                &format!("{p}/queuedResources?queuedResourceId=q"),
                r#"{"tpu": {"nodeSpec": [{"node": {"state": "SLEEPING"}}]}}"#,
            ),
            "not a value of the enum",
        ),
    ] {
        let e = google::check_request(tpu, &s).unwrap_err();
        assert!(e.contains(why), "{why}: {e}");
    }
    // Secret Manager's getIamPolicy is a GET: a POST is no method at all.
    let secrets = &google::APIS["secretmanager"];
    let e = google::check_request(
        secrets,
        &sent(
            "POST",
            "/v1/projects/p/secrets/s:getIamPolicy",
            r#"{"options": {"requestedPolicyVersion": 3}}"#,
        ),
    )
    .unwrap_err();
    assert!(e.contains("no method"), "{e}");
    // Replies: int64 as strings, defaults omitted, Any typed.
    let op = tpu.method("tpu.projects.locations.operations.get").unwrap();
    for (reply, why) in [
        (json!({"name": "o", "done": false}), "Google omits defaults"),
        (
            json!({"name": "o", "done": true, "response": {}}),
            "Any without its @type",
        ),
        (
            json!({"name": "o", "workerId": "0"}),
            "Unknown name \"workerId\"",
        ),
    ] {
        let e = google::check_reply(tpu, op, &serde_json::to_vec(&reply).unwrap()).unwrap_err();
        assert!(e.contains(why), "{why}: {e}");
    }
    let node = tpu.method("tpu.projects.locations.nodes.get").unwrap();
    let e = google::check_reply(tpu, node, br#"{"name": "n", "id": 7}"#).unwrap_err();
    assert!(e.contains("expected a string (int64)"), "{e}");
    let e =
        google::check_reply(tpu, node, br#"{"name": "n", "createTime": "yesterday"}"#).unwrap_err();
    assert!(e.contains("is not a google-datetime"), "{e}");
}

/// Every vendored document parses and has methods.
#[test]
fn every_vendored_document_is_read() {
    let names: Vec<&str> = google::APIS.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "artifactregistry",
            "cloudbuild",
            "cloudresourcemanager",
            "compute",
            "firestore",
            "iam",
            "run",
            "secretmanager",
            "serviceusage",
            "storage",
            "tpu",
        ]
    );
    for api in google::APIS.values() {
        assert!(!api.methods().is_empty(), "{}", api.name);
    }
}

/// Resident memory of this process, in bytes (the emulator runs in it).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// The emulator's memory stays bounded whatever it is asked. 10,000 listings left
/// unfinished (ten times the 1,000 it keeps) grow this process by less than 32 MB: a first
/// page keeps only the names of the rest, 16 bytes each (before, it kept the rest as JSON:
/// about 30 GB for 10,000 listings). 10,000 GETs of unique 10 kB names intern none of them
/// (before, every name a request mentioned was kept forever: 100 MB here).
#[test]
fn the_emulators_memory_is_bounded_under_listings_and_long_names() {
    let world = world();
    {
        let mut w = lock(&world);
        for i in 0..200 {
            w.sim
                .cloud
                .create_queued_resource(
                    ustr::Ustr::from(EAST),
                    ustr::Ustr::from(&format!("conf-{i}-qr")),
                    ustr::Ustr::from(&format!("conf-{i}")),
                    "v6e-8",
                    tpu_runner_sim::PoolModel::Spot,
                    None,
                    Arc::new(BTreeMap::from([(
                        "managed-by".to_owned(),
                        "conf".to_owned(),
                    )])),
                )
                .unwrap();
        }
    }
    let running = emulator::start(world.clone(), "127.0.0.1:0").unwrap();
    let base = format!("{}/v2/projects/{PROJECT}/locations/{EAST}", running.url());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::new();
    let before = rss_bytes();
    let long = |i: usize| format!("{}{i}", "n".repeat(10_000));
    rt.block_on(async {
        for i in 0..10_000 {
            let page: Value = http
                .get(format!("{base}/queuedResources?pageSize=1"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert!(page["nextPageToken"].is_string(), "{page}");
            let status = http
                .get(format!("{base}/nodes/{}", long(i)))
                .send()
                .await
                .unwrap()
                .status();
            assert_eq!(status.as_u16(), 404);
        }
    });
    let grown = rss_bytes().saturating_sub(before);
    assert!(grown < 32 << 20, "the emulator grew by {} MB", grown >> 20);
    let interned = (0..10_000)
        .filter(|&i| ustr::Ustr::from_existing(&long(i)).is_some())
        .count();
    assert_eq!(interned, 0, "names no object has were kept");
    // The newest listings still page on.
    let (_, first) = call("GET", &format!("{base}/queuedResources?pageSize=150"), None);
    let token = first["nextPageToken"].as_str().unwrap();
    let (code, rest) = call(
        "GET",
        &format!("{base}/queuedResources?pageSize=150&pageToken={token}"),
        None,
    );
    assert_eq!(code, 200);
    assert_eq!(rest["queuedResources"].as_array().unwrap().len(), 50);
}
