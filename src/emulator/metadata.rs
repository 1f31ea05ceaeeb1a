//! The metadata server of the emulator's TPU VMs, one per node under the control routes
//! (`…/nodes/NODE/computeMetadata/v1/instance/preempted` and `…/maintenance-event`), as
//! Google's answers: the `Metadata-Flavor: Google` request header required, text values, an
//! `ETag`, and `wait_for_change` long polls with `last_etag` and `timeout_sec`. The local
//! workers' agents watch it as a TPU VM's agent watches the real one. Reads the world; the
//! only thing it changes is a node's announced maintenance (a control route).

use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::Shared;
use super::routes::{Fail, known, world};

/// The query of a metadata read.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct MetadataQuery {
    #[serde(default)]
    wait_for_change: Option<String>,
    #[serde(default)]
    last_etag: Option<String>,
    #[serde(default)]
    timeout_sec: Option<u64>,
}

/// The longest a long poll waits (Google's own cap is an hour; the emulator's is shorter).
const MAX_WAIT_SECS: u64 = 300;

/// Virtual milliseconds an announced maintenance lasts (Compute Engine warns 60 s ahead;
/// the emulator's maintenance is over then, and the key says `NONE` again).
const MAINTENANCE_MS: u64 = 60_000;

/// What the emulator announces for host maintenance that stops a TPU VM.
pub(crate) const TERMINATE: &str = "TERMINATE_ON_HOST_MAINTENANCE";

fn etag(value: &str) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// `instance/KEY` of node `node`: `None` when there is no such node or key.
fn value(
    shared: &Shared,
    project: &str,
    zone: &str,
    node: &str,
    key: &str,
) -> Result<String, Fail> {
    let w = world(shared, project)?;
    let gone = || {
        Fail::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("no TPU VM {zone}/{node}"),
        )
    };
    let (z, n) = (known(zone), known(node));
    match key {
        "preempted" => {
            let preempted = w.sim.cloud.preempted(z, n).ok_or_else(gone)?;
            Ok(if preempted { "TRUE" } else { "FALSE" }.to_owned())
        }
        "maintenance-event" => {
            let serial = w.sim.cloud.peek_node(z, n).ok_or_else(gone)?.serial;
            let now = w.now_ms();
            let announced = w
                .maintenance
                .get(&(zone.to_owned(), node.to_owned()))
                .is_some_and(|&(s, at)| s == serial && now < at + MAINTENANCE_MS);
            Ok(if announced { TERMINATE } else { "NONE" }.to_owned())
        }
        _ => Err(Fail::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("the emulator's metadata server does not serve instance/{key}"),
        )),
    }
}

/// `GET …/nodes/{node}/computeMetadata/v1/instance/{key}`.
pub(crate) async fn read(
    State(shared): State<Shared>,
    Path((project, zone, node, key)): Path<(String, String, String, String)>,
    Query(q): Query<MetadataQuery>,
    headers: HeaderMap,
) -> Response {
    if headers.get("Metadata-Flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        // Google's metadata server refuses a request without it (a forwarded request).
        return (
            StatusCode::FORBIDDEN,
            "Missing Metadata-Flavor:Google header.",
        )
            .into_response();
    }
    let first = match value(&shared, &project, &zone, &node, &key) {
        Ok(v) => v,
        Err(f) => return f.into_response(),
    };
    let wait = q.wait_for_change.as_deref() == Some("true");
    let mut current = first.clone();
    if wait {
        // Without `last_etag` a long poll waits for the value to change from what it was
        // when the request came.
        let since = q.last_etag.clone().unwrap_or_else(|| etag(&first));
        let until = Instant::now()
            + Duration::from_secs(q.timeout_sec.unwrap_or(MAX_WAIT_SECS).min(MAX_WAIT_SECS));
        while etag(&current) == since && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
            current = match value(&shared, &project, &zone, &node, &key) {
                Ok(v) => v,
                Err(f) => return f.into_response(),
            };
        }
    }
    let mut reply = current.clone().into_response();
    let h = reply.headers_mut();
    h.insert("Metadata-Flavor", HeaderValue::from_static("Google"));
    h.insert("Content-Type", HeaderValue::from_static("application/text"));
    if let Ok(tag) = HeaderValue::from_str(&etag(&current)) {
        h.insert("ETag", tag);
    }
    reply
}

/// `POST /emulator/v1/projects/P/locations/Z/nodes/N/maintenance`: announces host maintenance
/// that stops TPU VM `N` on its metadata server, for a minute of virtual time (the node itself
/// stays up: the maintenance is short).
pub(crate) async fn announce_maintenance(
    State(shared): State<Shared>,
    Path((project, zone, node)): Path<(String, String, String)>,
) -> Response {
    let mut w = match world(&shared, &project) {
        Ok(w) => w,
        Err(f) => return f.into_response(),
    };
    let serial = w
        .sim
        .cloud
        .peek_node(known(&zone), known(&node))
        .map(|n| n.serial);
    match serial {
        Some(serial) => {
            let now = w.now_ms();
            w.maintenance.insert((zone, node.clone()), (serial, now));
            axum::Json(serde_json::json!({"maintenance": node, "event": TERMINATE})).into_response()
        }
        None => Fail::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("no TPU VM {zone}/{node}"),
        )
        .into_response(),
    }
}
