//! Google's API discovery documents (`tests/discovery/`) as the judge of what crosses the
//! boundary to Google: a request (method, URL, body) is matched to the method it calls in
//! the document of its API and checked against it; a reply against the method's response
//! schema. Shared by the conformance and deploy tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde_json::Value;
use tpu_runner::gcp::discovery::{Api, Method, query_pairs};

/// Every vendored document, by API name (`tpu`, `storage` …).
pub static APIS: LazyLock<BTreeMap<String, Api>> = LazyLock::new(|| {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/discovery");
    let mut apis = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let mut api = Api::parse(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // Firestore's runQuery at the database root (`…/documents:runQuery`): the
            // method's own description names this parent form ("projects/{project_id}/
            // databases/{database_id}/documents or …/documents/{document_path}"), but the
            // document keeps only the binding for a document path.
            if api.name == "firestore" {
                assert!(api.add_binding(
                    "firestore.projects.databases.documents.runQuery",
                    "/v1/projects/{projectsId}/databases/{databasesId}/documents:runQuery",
                ));
            }
            apis.insert(api.name.clone(), api);
        }
    }
    apis
});

/// The API served at `host` (`run.googleapis.com`).
pub fn api_at(host: &str) -> Option<&'static Api> {
    APIS.values().find(|a| a.host() == host)
}

/// One request as it went out.
#[derive(Clone, Debug)]
pub struct Sent {
    /// `GET` …
    pub method: String,
    /// The path from the host's root, with its query.
    pub target: String,
    /// The body's bytes.
    pub body: Vec<u8>,
    /// Its content type.
    pub content_type: String,
}

/// The JSON a request body carries for its method: the body itself, or for a multipart
/// upload its metadata part; `None` for media bytes or no body.
pub fn json_of(sent: &Sent) -> Result<Option<Value>, String> {
    if sent.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if sent.content_type.starts_with("application/json") {
        return serde_json::from_slice(&sent.body)
            .map(Some)
            .map_err(|e| format!("a JSON body that does not parse: {e}"));
    }
    if let Some(boundary) = sent
        .content_type
        .strip_prefix("multipart/related; boundary=")
    {
        // The first part is the metadata (RFC 2387 as Cloud Storage's multipart upload takes it).
        let text = String::from_utf8_lossy(&sent.body);
        let delimiter = format!("--{boundary}");
        let part = text
            .split(&delimiter)
            .nth(1)
            .ok_or("a multipart body without parts")?;
        let (headers, json) = part
            .split_once("\r\n\r\n")
            .ok_or("a part without headers")?;
        if !headers.to_ascii_lowercase().contains("application/json") {
            return Err("the first part of a multipart upload is not its JSON metadata".into());
        }
        return serde_json::from_str(json.trim_end())
            .map(Some)
            .map_err(|e| format!("multipart metadata that does not parse: {e}"));
    }
    Ok(None)
}

/// Checks `sent` against the method of `api` it calls: that method, or what Google would
/// refuse (with the request, for the failure message).
pub fn check_request(api: &'static Api, sent: &Sent) -> Result<&'static Method, String> {
    let (path, query) = sent.target.split_once('?').unwrap_or((&sent.target, ""));
    let body = json_of(sent).map_err(|e| format!("{} {}: {e}", sent.method, sent.target))?;
    api.check_request(&sent.method, path, &query_pairs(query), body.as_ref())
        .map_err(|problems| {
            format!(
                "{} {} ({} {}):\n  {}",
                sent.method,
                sent.target,
                api.name,
                api.version,
                problems.join("\n  ")
            )
        })
}

/// Checks a reply of `method` against its response schema, as Google writes proto-JSON.
pub fn check_reply(api: &Api, method: &Method, body: &[u8]) -> Result<(), String> {
    let value: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Default::default())
    } else {
        serde_json::from_slice(body)
            .map_err(|e| format!("{}: a reply that is not JSON: {e}", method.id))?
    };
    let problems = api.check_reply(method, &value);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} replied {}:\n  {}",
            method.id,
            value,
            problems.join("\n  ")
        ))
    }
}

/// `https://host/path?query` → (host, target).
pub fn split_url(url: &str) -> (&str, &str) {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or(url);
    match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    }
}
