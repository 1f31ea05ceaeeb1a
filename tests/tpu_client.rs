//! The Cloud TPU API client: response fixtures written from the REST reference parse
//! (every documented field, unknown fields and enum values, the v2alpha1 variants), the
//! create request has the documented shape, and over real HTTP on loopback (a scripted
//! server) the client pages through listings, retries 5xx, 429 and lost replies with the
//! same `requestId`, honours `Retry-After`, does not retry permanent errors, and treats
//! NOT_FOUND on delete as success.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tpu_runner::gcp::http::RetryPolicy;
use tpu_runner::gcp::tpu::{
    self, Client, Endpoint, Node, Operation, QrRequest, QueuedResource, Quotas,
};
use tpu_runner::spec::ProvisioningModel;

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tpu-api")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn documented_node_replies_parse() {
    let node: Node = serde_json::from_str(&fixture("node-v2-full.json")).unwrap();
    assert_eq!(node.id(), "lab-runner-east-v6e-1-1a2b3c4d");
    assert_eq!(
        (node.accelerator_type.as_str(), node.state.as_str()),
        ("v6e-16", "READY")
    );
    assert_eq!(
        node.health, "",
        "omitted health (the spec reads it as healthy)"
    );
    assert!(node.is_spot());
    assert_eq!(node.network_endpoints.len(), 4);
    assert_eq!(
        node.network_endpoints[0].access_config.external_ip,
        "34.1.2.3"
    );
    assert_eq!(node.id.0, 7_465_382_910_293_847_561, "int64 as a string");
    assert!(node.queued_resource.ends_with("-qr"));
    assert_eq!(node.labels["managed-by"], "lab-runner");

    let odd: Node = serde_json::from_str(&fixture("node-odd.json")).unwrap();
    assert_eq!(
        odd.state, "HIDING_IN_A_FUTURE_VERSION",
        "unknown enum values are kept"
    );
    assert_eq!(odd.health, "SOMETHING_NEW");
    assert_eq!(odd.id.0, 42, "int64 as a number");
    assert!(odd.is_spot(), "v2alpha1 provisioningModel");
    assert_eq!(odd.network_endpoints.len(), 2);
    assert!(odd.accelerator_type.ends_with("/v4-32"));
}

#[test]
fn documented_queued_resource_replies_parse() {
    let waiting: QueuedResource = serde_json::from_str(&fixture("qr-v2-waiting.json")).unwrap();
    assert_eq!(waiting.state.state, "WAITING_FOR_RESOURCES");
    assert_eq!(waiting.state.initiator, "USER");
    assert!(waiting.is_spot());
    assert_eq!(
        waiting.node_spec().unwrap().node_id,
        "lab-runner-east-v6e-1-1a2b3c4d"
    );
    assert_eq!(
        waiting.labels()["fleet-entry"],
        "east-v6e",
        "labels from the node spec"
    );

    let failed: QueuedResource = serde_json::from_str(&fixture("qr-v2-failed.json")).unwrap();
    assert_eq!(
        (failed.state.state.as_str(), failed.state.initiator.as_str()),
        ("FAILED", "SERVICE")
    );
    assert!(
        failed
            .state
            .error
            .as_deref()
            .unwrap()
            .contains("no more capacity")
    );
    assert!(!failed.is_spot(), "the guaranteed tier");

    let alpha: QueuedResource = serde_json::from_str(&fixture("qr-v2alpha1.json")).unwrap();
    assert_eq!(alpha.state.state, "ACTIVE", "a bare-string state");
    assert_eq!(
        alpha.node_spec().unwrap().node_id,
        "n-alpha",
        "a nodeSpec object"
    );
    assert_eq!(
        alpha.labels()["managed-by"],
        "lab-runner",
        "top-level labels"
    );
    assert!(alpha.is_spot());

    let done: Operation = serde_json::from_str(&fixture("operation-done.json")).unwrap();
    assert!(done.done && done.error.is_none() && done.response.is_some());
    let error: Operation = serde_json::from_str(&fixture("operation-error.json")).unwrap();
    assert_eq!(error.error.unwrap().code, 8);
    let pending: Operation = serde_json::from_str(r#"{"name": "op"}"#).unwrap();
    assert!(!pending.done, "done is omitted while false");
}

fn request() -> QrRequest {
    QrRequest {
        model: ProvisioningModel::Spot,
        reservation: None,
        id: "lab-runner-east-v6e-1-1a2b3c4d-qr".into(),
        node_id: "lab-runner-east-v6e-1-1a2b3c4d".into(),
        zone: "us-east1-d".into(),
        accelerator_type: "v6e-16".into(),
        runtime_version: "v2-alpha-tpuv6e".into(),
        network: "default".into(),
        subnetwork: "default".into(),
        external_ips: true,
        service_account: "lab-runner-worker@my-project-123.iam.gserviceaccount.com".into(),
        labels: BTreeMap::from([
            ("managed-by".into(), "lab-runner".into()),
            ("fleet-entry".into(), "east-v6e".into()),
        ]),
        metadata: BTreeMap::from([(
            "startup-script-url".into(),
            "gs://lab-runner-bucket/artifacts/startup.sh".into(),
        )]),
    }
}

#[test]
fn the_create_request_has_the_documented_shape() {
    let expected: Value = serde_json::from_str(&fixture("create-qr-request.json")).unwrap();
    assert_eq!(tpu::create_body("my-project-123", &request()), expected);
}

/// On-demand capacity is the `guaranteed` tier; a reservation's adds its full name.
#[test]
fn on_demand_and_reserved_requests_have_the_documented_shape() {
    let on_demand: Value =
        serde_json::from_str(&fixture("create-qr-request-on-demand.json")).unwrap();
    let request_as = |model, reservation: Option<&str>| QrRequest {
        model,
        reservation: reservation.map(str::to_owned),
        ..request()
    };
    assert_eq!(
        tpu::create_body(
            "my-project-123",
            &request_as(ProvisioningModel::OnDemand, None)
        ),
        on_demand
    );
    let reserved: Value =
        serde_json::from_str(&fixture("create-qr-request-reserved.json")).unwrap();
    assert_eq!(
        tpu::create_body(
            "my-project-123",
            &request_as(ProvisioningModel::Reserved, Some("lab-v6e-reservation"))
        ),
        reserved
    );
    // A reply for it reads back as reserved, not Spot.
    let reply: QueuedResource = serde_json::from_str(&fixture("qr-v2-reserved.json")).unwrap();
    assert!(reply.is_reserved() && !reply.is_spot());
    let info = tpu_runner::backend::gcp::qr_info(&reply, "us-east1-d").unwrap();
    assert_eq!(info.model(), ProvisioningModel::Reserved);
    let waiting: QueuedResource = serde_json::from_str(&fixture("qr-v2-waiting.json")).unwrap();
    assert_eq!(
        tpu_runner::backend::gcp::qr_info(&waiting, "us-east1-d")
            .unwrap()
            .model(),
        ProvisioningModel::Spot
    );
    let guaranteed = r#"{"name": "q", "guaranteed": {}, "tpu": {"nodeSpec": [{"nodeId": "n", "node": {"acceleratorType": "v6e-8"}}]}}"#;
    let guaranteed: QueuedResource = serde_json::from_str(guaranteed).unwrap();
    assert_eq!(
        tpu_runner::backend::gcp::qr_info(&guaranteed, "us-east1-d")
            .unwrap()
            .model(),
        ProvisioningModel::OnDemand
    );
    let node: Node =
        serde_json::from_str(r#"{"name": "n", "schedulingConfig": {"reserved": true}}"#).unwrap();
    assert!(node.is_reserved() && !node.is_spot());
}

/// One scripted reply: status, extra headers, body; `None` closes the connection without
/// answering (a lost reply).
type Reply = Option<(u16, Vec<(String, String)>, String)>;

/// A request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    target: String,
    body: String,
}

/// An HTTP/1.1 server on loopback answering requests in order from `script`.
fn server(script: Vec<Reply>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        let mut script = script.into_iter();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() || line.is_empty() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (method, target) = (
                parts.next().unwrap_or("").to_owned(),
                parts.next().unwrap_or("").to_owned(),
            );
            let mut length = 0usize;
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                if header == "\r\n" || header.is_empty() {
                    break;
                }
                if let Some((k, v)) = header.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; length];
            reader.read_exact(&mut body).unwrap();
            log.lock().unwrap().push(Seen {
                method,
                target,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
            match script.next() {
                Some(Some((status, headers, body))) => {
                    let mut reply = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                        body.len()
                    );
                    for (k, v) in headers {
                        reply.push_str(&format!("{k}: {v}\r\n"));
                    }
                    reply.push_str("\r\n");
                    reply.push_str(&body);
                    let _ = stream.write_all(reply.as_bytes());
                }
                // A lost reply: the request arrived, no answer comes back.
                Some(None) | None => drop(stream),
            }
        }
    });
    (addr, seen)
}

fn ok(body: Value) -> Reply {
    Some((200, vec![], body.to_string()))
}

fn error(status: u16, grpc: &str) -> Reply {
    Some((
        status,
        vec![],
        json!({"error": {"code": status, "message": "scripted", "status": grpc}}).to_string(),
    ))
}

fn client(addr: &str) -> Client {
    let fast = RetryPolicy {
        tries: 4,
        base: Duration::from_millis(20),
        cap: Duration::from_millis(200),
    };
    Client::new(
        Endpoint::emulator(addr),
        "p",
        Quotas {
            reads_per_minute: 60_000,
            writes_per_minute: 60_000,
        },
        fast,
    )
    .unwrap()
}

#[test]
fn listings_follow_every_page_and_retry_server_errors() {
    let node = |n: &str| json!({"name": format!("projects/p/locations/us-east1-d/nodes/{n}"), "state": "READY"});
    let (addr, seen) = server(vec![
        error(503, "UNAVAILABLE"),
        ok(json!({"nodes": [node("a"), node("b")], "nextPageToken": "page-2"})),
        Some((
            429,
            vec![("retry-after".into(), "0".into())],
            json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "slow down"}})
                .to_string(),
        )),
        ok(json!({"nodes": [node("c")]})),
    ]);
    let c = client(&addr);
    let lists = c.list_nodes(&["us-east1-d".into()]);
    let nodes = lists.into_iter().next().unwrap().unwrap();
    assert_eq!(
        nodes.iter().map(Node::id).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4, "two pages, each retried once");
    assert!(seen.iter().all(|s| s.method == "GET"));
    assert!(
        seen[0]
            .target
            .starts_with("/v2/projects/p/locations/us-east1-d/nodes?pageSize=")
    );
    assert!(seen[3].target.contains("pageToken=page-2"));
    assert_eq!(c.calls(), 4);
}

#[test]
fn null_fields_read_as_their_defaults() {
    // proto3 JSON: `null` means the default value, anywhere.
    let (addr, _) = server(vec![
        ok(json!({"nodes": [{
            "name": "projects/p/locations/us-east1-d/nodes/a",
            "state": "READY",
            "health": null,
            "labels": null,
            "schedulingConfig": {"spot": null, "preemptible": true},
            "networkEndpoints": [{"ipAddress": "10.0.0.2", "accessConfig": null}],
            "createTime": null,
        }], "nextPageToken": null})),
        ok(json!({"queuedResources": [{
            "name": "projects/p/locations/us-east1-d/queuedResources/q",
            "createTime": null,
            "tpu": {"nodeSpec": [{"nodeId": "a", "node": {"acceleratorType": "v6e-8", "runtimeVersion": null}}]},
            "state": {"state": "ACTIVE", "stateInitiator": null},
        }]})),
    ]);
    let c = client(&addr);
    let nodes = c.list_nodes(&["us-east1-d".into()]).remove(0).unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!((nodes[0].health.as_str(), nodes[0].labels.len()), ("", 0));
    assert!(nodes[0].is_spot());
    let qrs = c
        .list_queued_resources(&["us-east1-d".into()])
        .remove(0)
        .unwrap();
    assert_eq!(qrs[0].state.state, "ACTIVE");
    assert_eq!(qrs[0].node_spec().unwrap().node.runtime_version, "");
}

#[test]
fn permanent_errors_are_not_retried_and_absent_nodes_are_none() {
    let (addr, seen) = server(vec![
        error(403, "PERMISSION_DENIED"),
        error(404, "NOT_FOUND"),
    ]);
    let c = client(&addr);
    let e = c
        .list_queued_resources(&["us-east1-d".into()])
        .remove(0)
        .unwrap_err();
    assert_eq!((e.code, e.status.as_str()), (403, "PERMISSION_DENIED"));
    let got = c
        .get_nodes(&[("us-east1-d".into(), "gone".into())])
        .remove(0)
        .unwrap();
    assert!(got.is_none());
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[test]
fn a_create_retried_after_a_lost_reply_carries_the_same_request_id() {
    let (addr, seen) = server(vec![
        None,
        ok(json!({"name": "projects/p/locations/us-east1-d/operations/op-1"})),
    ]);
    let c = client(&addr);
    let op = c
        .create_queued_resource(&request(), "6f1c1b3e-0000-4000-8000-000000000001")
        .unwrap();
    assert_eq!(op.name, "projects/p/locations/us-east1-d/operations/op-1");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for s in seen.iter() {
        assert_eq!(s.method, "POST");
        assert_eq!(
            s.target,
            "/v2/projects/p/locations/us-east1-d/queuedResources?queuedResourceId=lab-runner-east-v6e-1-1a2b3c4d-qr&requestId=6f1c1b3e-0000-4000-8000-000000000001"
        );
        let body: Value = serde_json::from_str(&s.body).unwrap();
        assert_eq!(body["spot"], json!({}));
    }
}

#[test]
fn deleting_what_is_gone_succeeds() {
    let (addr, seen) = server(vec![
        error(404, "NOT_FOUND"),
        ok(json!({"name": "op", "done": false})),
        error(400, "INVALID_ARGUMENT"),
    ]);
    let c = client(&addr);
    c.delete_queued_resource("us-east1-d", "q", "r-1").unwrap();
    c.delete_node("us-east1-d", "n").unwrap();
    assert_eq!(
        c.delete_node("us-east1-d", "n").unwrap_err().status,
        "INVALID_ARGUMENT"
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].method, "DELETE");
    assert_eq!(
        seen[0].target,
        "/v2/projects/p/locations/us-east1-d/queuedResources/q?force=true&requestId=r-1"
    );
    assert_eq!(
        seen[1].target, "/v2/projects/p/locations/us-east1-d/nodes/n",
        "nodes.delete declares no requestId in v2: Google refuses it"
    );
}

#[test]
fn guest_attributes_are_told_apart_by_their_place_in_the_reply() {
    // `GuestAttributes` has no worker id: the reply lists the workers in order.
    let reply: Value = serde_json::from_str(&fixture("guest-attributes-2-workers.json")).unwrap();
    let (addr, seen) = server(vec![ok(reply)]);
    let c = client(&addr);
    let attributes = c
        .guest_attributes("us-east1-d", "n", "hostkeys/", 2)
        .unwrap();
    let keys: Vec<(u32, &str)> = attributes
        .iter()
        .filter(|a| a.key == "ssh-ed25519")
        .map(|a| (a.worker_id, a.value.as_str()))
        .collect();
    assert_eq!(
        keys,
        [
            (0, "AAAAC3NzaC1lZDI1NTE5AAAAIWORKER0"),
            (1, "AAAAC3NzaC1lZDI1NTE5AAAAIWORKER1")
        ]
    );
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen[0].target,
        "/v2/projects/p/locations/us-east1-d/nodes/n:getGuestAttributes"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&seen[0].body).unwrap(),
        json!({"queryPath": "hostkeys/"})
    );
}

#[test]
fn a_reply_without_one_entry_per_worker_is_asked_again_worker_by_worker() {
    // Two workers, but the reply lists one (a worker not yet publishing, say): nothing is
    // guessed from the order; each worker is asked alone.
    let one = |key: &str| {
        json!({"guestAttributes": [{"queryPath": "hostkeys/", "queryValue": {"items": [
            {"namespace": "hostkeys", "key": "ssh-ed25519", "value": key}]}}]})
    };
    let (addr, seen) = server(vec![
        ok(one("FIRST")),
        ok(json!({"guestAttributes": [{"queryPath": "hostkeys/", "queryValue": {}}]})),
        ok(one("SECOND")),
    ]);
    let c = client(&addr);
    let attributes = c
        .guest_attributes("us-east1-d", "n", "hostkeys/", 2)
        .unwrap();
    let keys: Vec<(u32, &str)> = attributes
        .iter()
        .map(|a| (a.worker_id, a.value.as_str()))
        .collect();
    assert_eq!(keys, [(1, "SECOND")]);
    let bodies: Vec<Value> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| serde_json::from_str(&s.body).unwrap())
        .collect();
    assert_eq!(
        bodies[1..],
        [
            json!({"queryPath": "hostkeys/", "workerIds": ["0"]}),
            json!({"queryPath": "hostkeys/", "workerIds": ["1"]})
        ]
    );
}

#[test]
fn every_zone_is_listed_and_answered_in_order() {
    // Up to 16 zones are in flight at once; results come back in the order asked.
    let zones: Vec<String> = (0..6)
        .map(|i| format!("us-east1-{}", ["a", "b", "c", "d", "e", "f"][i]))
        .collect();
    let script = (0..6).map(|_| ok(json!({"queuedResources": []}))).collect();
    let (addr, seen) = server(script);
    let c = client(&addr);
    let lists = c.list_queued_resources(&zones);
    assert_eq!(lists.len(), 6);
    assert!(lists.iter().all(|l| l.as_ref().unwrap().is_empty()));
    let seen = seen.lock().unwrap();
    let mut asked: Vec<&str> = seen
        .iter()
        .map(|s| s.target.split('/').nth(5).unwrap())
        .collect();
    asked.sort();
    assert_eq!(asked, zones.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn the_inventory_keeps_the_runners_objects_and_fetches_adopted_tpus_by_name() {
    use tpu_runner::backend::gcp::read_inventory;
    use tpu_runner::engine::InventoryScope;
    use tpu_runner::spec::Name;
    let node = |zone: &str, n: &str, runner: &str| {
        json!({"name": format!("projects/p/locations/{zone}/nodes/{n}"), "acceleratorType": "v6e-8", "state": "READY",
               "labels": {"managed-by": runner}, "networkEndpoints": [{"ipAddress": "10.0.0.2"}]})
    };
    let qr = |zone: &str, q: &str, runner: &str| {
        json!({"name": format!("projects/p/locations/{zone}/queuedResources/{q}"), "spot": {}, "state": {"state": "ACTIVE"},
               "tpu": {"nodeSpec": [{"nodeId": q.trim_end_matches("-qr"), "node": {"acceleratorType": "v6e-8", "labels": {"managed-by": runner}}}]}})
    };
    // Calls go out concurrently, but the scripted server answers in arrival order: each
    // zone's reply is told apart by the test through the request path instead.
    let (addr, seen) = server(vec![
        ok(
            json!({"nodes": [node("us-east1-d", "lab-1", "lab"), node("us-east1-d", "other-1", "someone-else")]}),
        ),
        ok(json!({"nodes": [node("us-west1-a", "lab-2", "lab")]})),
        ok(
            json!({"queuedResources": [qr("us-east1-d", "lab-1-qr", "lab"), qr("us-east1-d", "x-qr", "someone-else")]}),
        ),
        ok(json!({"queuedResources": []})),
        ok(
            json!({"name": "projects/p/locations/us-central2-b/nodes/trc", "acceleratorType": "v4-32", "state": "READY", "networkEndpoints": [{}, {}, {}, {}]}),
        ),
    ]);
    let c = client(&addr);
    let scope = InventoryScope {
        runner: "lab",
        zones: std::borrow::Cow::Owned(
            [Name::new("us-east1-d"), Name::new("us-west1-a")]
                .into_iter()
                .collect(),
        ),
        adopted: [("us-central2-b", "trc")].into_iter().collect(),
    };
    let mut inventory = Default::default();
    let notes = read_inventory(&c, &scope, &mut inventory).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    let tpu_runner::backend::Inventory {
        nodes,
        queued_resources: qrs,
        others,
    } = inventory;
    // Someone else's node and request are kept apart (they count against chip limits).
    let names = |v: Vec<String>| v.join(",");
    assert_eq!(
        names(others.nodes.iter().map(|n| n.name.to_string()).collect()),
        "other-1"
    );
    assert_eq!(
        names(
            others
                .queued_resources
                .iter()
                .map(|q| q.name.to_string())
                .collect()
        ),
        "x-qr"
    );
    let names: Vec<String> = nodes
        .iter()
        .map(|n| format!("{}/{}", n.zone, n.name))
        .collect();
    let seen = seen.lock().unwrap();
    // Whatever order the zones were answered in, only the runner's objects and the adopted
    // TPU are kept, sorted by (zone, name), with the zone the listing was made for.
    assert_eq!(
        seen.len(),
        5,
        "one listing per zone and kind, one get per adopted TPU"
    );
    assert!(names.contains(&"us-central2-b/trc".to_owned()), "{names:?}");
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(
        nodes.iter().find(|n| n.name == "trc").unwrap().worker_count,
        4
    );
    assert!(
        qrs.iter()
            .all(|q| q.labels.get("managed-by").map(String::as_str) == Some("lab"))
    );
}
