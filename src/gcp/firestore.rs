//! Firestore (Native mode) REST v1 client: transactions (`beginTransaction`, `commit` with
//! preconditions, `rollback`), `batchGet` and `runQuery`, and the conversion between plain
//! JSON and Firestore's typed values. Blocking API over a private single-threaded tokio
//! runtime (so it must not be called from inside another runtime's worker thread).
//! `FIRESTORE_EMULATOR_HOST` selects the emulator (no credentials, `Bearer owner`).
//! Knows nothing of tpu-runner's records.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

pub use super::http::{ApiError, Endpoint, api_error};
use super::http::{error_chain, malformed, transport};

/// `FIRESTORE_EMULATOR_HOST` when set (an emulator, no credentials), else production.
pub fn endpoint_from_env() -> Endpoint {
    Endpoint::from_env(
        "FIRESTORE_EMULATOR_HOST",
        "https://firestore.googleapis.com",
    )
}

/// A document read: its full name, fields as plain JSON, and update time.
#[derive(Clone, Debug, PartialEq)]
pub struct Doc {
    /// `projects/…/documents/coll/id`.
    pub name: String,
    /// Fields as plain JSON.
    pub fields: Map<String, Value>,
    /// RFC 3339 update time (the version for preconditions).
    pub update_time: String,
}

impl Doc {
    /// The last path segment (the document id).
    pub fn id(&self) -> &str {
        self.name.rsplit('/').next().unwrap_or("")
    }
}

/// A precondition on a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// None.
    None,
    /// The document must (not) exist.
    Exists(bool),
    /// The document must have this update time.
    UpdateTime(String),
}

/// One write of a commit.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Replace the whole document `path` (`coll/id`) with `fields`.
    Set {
        /// `coll/id`.
        path: String,
        /// Plain JSON fields.
        fields: Map<String, Value>,
        /// Precondition.
        precondition: Precondition,
    },
    /// Delete `path`.
    Delete {
        /// `coll/id`.
        path: String,
        /// Precondition.
        precondition: Precondition,
    },
}

/// A field filter of a query.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    /// Field path (`active`, `owner.job_id`).
    pub field: String,
    /// `EQUAL`, `GREATER_THAN_OR_EQUAL`, `IN`, …
    pub op: &'static str,
    /// The Firestore value (see `to_value`).
    pub value: Value,
}

impl Filter {
    /// `field op value` with a plain JSON value.
    pub fn new(field: &str, op: &'static str, value: Value) -> Filter {
        Filter {
            field: field.into(),
            op,
            value: to_value(&value),
        }
    }
}

/// A structured query on one collection: an AND of filters, ordered by `order_by` (if any)
/// then by document name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Query<'a> {
    /// Collection id.
    pub collection: &'a str,
    /// Filters (AND).
    pub filters: Vec<Filter>,
    /// A field to order by first (required by Firestore for a range filter on it).
    pub order_by: Option<&'a str>,
    /// Start after this cursor (typed values of the order fields, the name last).
    pub start_after: Option<Value>,
    /// At most this many documents.
    pub limit: Option<usize>,
    /// Newest first: `order_by` (and the name) descending.
    pub descending: bool,
}

/// The client.
pub struct Client {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    endpoint: Endpoint,
    database: String,
    auth: Option<Arc<dyn gcp_auth::TokenProvider>>,
    /// Calls made (round trips), for benches and reports.
    pub calls: u64,
    /// Documents read as Firestore bills them: each document a `batchGet` asks for, each a
    /// query returns (at least one per query page).
    pub reads: u64,
    /// Documents written by committed writes (each `update`, `delete` or `verify`).
    pub writes: u64,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "firestore::Client({} {})",
            self.endpoint.base, self.database
        )
    }
}

const SCOPES: &[&str] = &["https://www.googleapis.com/auth/datastore"];

/// The per-call timeout (the emulator can hang a request forever: ecosystem.md §2.3).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl Client {
    /// A client for `projects/{project}/databases/{database}` at `endpoint`. Production
    /// endpoints fetch Application Default Credentials now, so a missing credential fails
    /// here with a clear message.
    pub fn new(endpoint: Endpoint, project: &str, database: &str) -> Result<Client, ApiError> {
        let (rt, http, auth) = super::http::connect(&endpoint, CALL_TIMEOUT)?;
        Ok(Client {
            rt,
            http,
            endpoint,
            database: format!("projects/{project}/databases/{database}"),
            auth,
            calls: 0,
            reads: 0,
            writes: 0,
        })
    }

    /// `projects/P/databases/D`.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The full name of `coll/id`.
    pub fn doc_name(&self, path: &str) -> String {
        format!("{}/documents/{path}", self.database)
    }

    fn post(&mut self, method: &str, body: Value) -> Result<Value, ApiError> {
        let url = format!(
            "{}/v1/{}/documents:{method}",
            self.endpoint.base, self.database
        );
        self.calls += 1;
        let http = self.http.clone();
        let auth = self.auth.clone();
        self.rt.block_on(async move {
            let token = match &auth {
                None => "owner".to_owned(),
                Some(provider) => provider
                    .token(SCOPES)
                    .await
                    .map_err(|e| {
                        transport(
                            "UNAUTHENTICATED",
                            format!("cannot get an access token: {e}"),
                        )
                    })?
                    .as_str()
                    .to_owned(),
            };
            let reply = http
                .post(&url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .map_err(|e| {
                    let status = if e.is_timeout() {
                        "DEADLINE_EXCEEDED"
                    } else {
                        "UNAVAILABLE"
                    };
                    transport(status, format!("{url}: {}", error_chain(&e)))
                })?;
            let code = reply.status().as_u16();
            let text = reply
                .text()
                .await
                .map_err(|e| transport("UNAVAILABLE", error_chain(&e)))?;
            if !(200..300).contains(&code) {
                return Err(api_error(code, &text));
            }
            serde_json::from_str(&text).map_err(|e| ApiError {
                code,
                status: "INTERNAL".into(),
                message: format!("unreadable reply ({e})"),
            })
        })
    }

    /// Starts a read-write transaction (`retry`: the id of the one that aborted), or a
    /// read-only one.
    pub fn begin(&mut self, read_only: bool, retry: Option<&str>) -> Result<String, ApiError> {
        let options = if read_only {
            json!({"readOnly": {}})
        } else {
            match retry {
                Some(t) => json!({"readWrite": {"retryTransaction": t}}),
                None => json!({"readWrite": {}}),
            }
        };
        let reply = self.post("beginTransaction", json!({ "options": options }))?;
        reply["transaction"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| malformed("beginTransaction without a transaction"))
    }

    /// Rolls a transaction back (errors ignored: it lapses on its own).
    pub fn rollback(&mut self, transaction: &str) {
        let _ = self.post("rollback", json!({ "transaction": transaction }));
    }

    /// Reads documents (`coll/id` paths) in `transaction`; `None` for missing ones, in the
    /// order asked.
    pub fn batch_get(
        &mut self,
        paths: &[String],
        transaction: Option<&str>,
    ) -> Result<Vec<Option<Doc>>, ApiError> {
        let mut out = Vec::with_capacity(paths.len());
        for chunk in paths.chunks(500) {
            let names: Vec<String> = chunk.iter().map(|p| self.doc_name(p)).collect();
            let mut body = json!({ "documents": names });
            if let Some(t) = transaction {
                body["transaction"] = json!(t);
            }
            let reply = self.post("batchGet", body)?;
            self.reads += chunk.len() as u64;
            let mut found: std::collections::HashMap<String, Doc> = Default::default();
            for item in reply
                .as_array()
                .ok_or_else(|| malformed("batchGet is not a list"))?
            {
                if let Some(doc) = item.get("found") {
                    let doc = parse_doc(doc)?;
                    found.insert(doc.name.clone(), doc);
                }
            }
            out.extend(names.iter().map(|n| found.remove(n)));
        }
        Ok(out)
    }

    /// Runs `query` in `transaction`, in pages of `page` documents, until its limit or the
    /// end.
    pub fn query(
        &mut self,
        query: &Query<'_>,
        transaction: Option<&str>,
        page: usize,
    ) -> Result<Vec<Doc>, ApiError> {
        let mut out: Vec<Doc> = Vec::new();
        let mut cursor: Option<Value> = query.start_after.clone();
        loop {
            let want = match query.limit {
                Some(limit) if limit <= out.len() => return Ok(out),
                Some(limit) => page.min(limit - out.len()),
                None => page,
            };
            let mut order = Vec::new();
            let direction = if query.descending {
                "DESCENDING"
            } else {
                "ASCENDING"
            };
            if let Some(field) = query.order_by {
                order.push(json!({ "field": { "fieldPath": field }, "direction": direction }));
            }
            order.push(json!({ "field": { "fieldPath": "__name__" }, "direction": direction }));
            let mut structured = json!({
                "from": [{ "collectionId": query.collection }],
                "orderBy": order,
                "limit": want,
            });
            let mut conditions: Vec<Value> = query
                .filters
                .iter()
                .map(|f| {
                    json!({"fieldFilter": {
                        "field": { "fieldPath": f.field },
                        "op": f.op,
                        "value": f.value,
                    }})
                })
                .collect();
            match conditions.len() {
                0 => {}
                1 => structured["where"] = conditions.pop().expect("one"),
                _ => {
                    structured["where"] =
                        json!({"compositeFilter": {"op": "AND", "filters": conditions}})
                }
            }
            if let Some(values) = &cursor {
                structured["startAt"] = json!({ "values": values, "before": false });
            }
            let mut body = json!({ "structuredQuery": structured });
            if let Some(t) = transaction {
                body["transaction"] = json!(t);
            }
            let reply = self.post("runQuery", body)?;
            let mut got = 0;
            for item in reply
                .as_array()
                .ok_or_else(|| malformed("runQuery is not a list"))?
            {
                if let Some(doc) = item.get("document") {
                    let typed = doc
                        .get("fields")
                        .and_then(|f| f.get(query.order_by.unwrap_or("")));
                    let doc = parse_doc(doc)?;
                    let mut values = Vec::new();
                    if query.order_by.is_some() {
                        values.push(typed.cloned().unwrap_or(json!({"nullValue": null})));
                    }
                    values.push(json!({ "referenceValue": doc.name }));
                    cursor = Some(Value::Array(values));
                    out.push(doc);
                    got += 1;
                }
            }
            self.reads += got.max(1) as u64;
            if got < want {
                return Ok(out);
            }
        }
    }

    /// Commits `writes` (in `transaction`, if any); returns each write's update time (a
    /// write that changed nothing keeps the document's previous one).
    pub fn commit(
        &mut self,
        writes: &[Write],
        transaction: Option<&str>,
    ) -> Result<Vec<String>, ApiError> {
        let writes: Vec<Value> = writes.iter().map(|w| self.write_json(w)).collect();
        let mut body = json!({ "writes": writes });
        if let Some(t) = transaction {
            body["transaction"] = json!(t);
        }
        let reply = self.post("commit", body)?;
        self.writes += writes.len() as u64;
        let commit_time = reply["commitTime"].as_str().unwrap_or_default();
        let results = reply["writeResults"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok((0..writes.len())
            .map(|i| {
                results
                    .get(i)
                    .and_then(|r| r["updateTime"].as_str())
                    .unwrap_or(commit_time)
                    .to_owned()
            })
            .collect())
    }

    fn write_json(&self, write: &Write) -> Value {
        let (mut w, precondition) = match write {
            Write::Set {
                path,
                fields,
                precondition,
            } => (
                json!({"update": { "name": self.doc_name(path), "fields": to_fields(fields) }}),
                precondition,
            ),
            Write::Delete { path, precondition } => {
                (json!({ "delete": self.doc_name(path) }), precondition)
            }
        };
        match precondition {
            Precondition::None => {}
            Precondition::Exists(e) => w["currentDocument"] = json!({ "exists": e }),
            Precondition::UpdateTime(t) => w["currentDocument"] = json!({ "updateTime": t }),
        }
        w
    }
}

fn parse_doc(doc: &Value) -> Result<Doc, ApiError> {
    let name = doc["name"]
        .as_str()
        .ok_or_else(|| malformed("document without a name"))?;
    let fields = match doc.get("fields") {
        Some(Value::Object(f)) => from_fields(f)?,
        _ => Map::new(),
    };
    Ok(Doc {
        name: name.to_owned(),
        fields,
        update_time: doc["updateTime"].as_str().unwrap_or_default().to_owned(),
    })
}

/// Plain JSON → Firestore `Value`.
pub fn to_value(v: &Value) -> Value {
    match v {
        Value::Null => json!({ "nullValue": null }),
        Value::Bool(b) => json!({ "booleanValue": b }),
        Value::Number(n) => match n.as_i64() {
            Some(i) => json!({ "integerValue": i.to_string() }),
            None => json!({ "doubleValue": n.as_f64().unwrap_or(0.0) }),
        },
        Value::String(s) => json!({ "stringValue": s }),
        Value::Array(items) => {
            json!({ "arrayValue": { "values": items.iter().map(to_value).collect::<Vec<_>>() } })
        }
        Value::Object(map) => json!({ "mapValue": { "fields": to_fields(map) } }),
    }
}

/// Plain JSON object → Firestore `fields`.
pub fn to_fields(map: &Map<String, Value>) -> Value {
    Value::Object(map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect())
}

/// Firestore `fields` → plain JSON object.
pub fn from_fields(fields: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    fields
        .iter()
        .map(|(k, v)| Ok((k.clone(), from_value(v)?)))
        .collect()
}

/// Firestore `Value` → plain JSON (timestamps, references and bytes as strings).
pub fn from_value(v: &Value) -> Result<Value, ApiError> {
    let Some((kind, inner)) = v.as_object().and_then(|m| m.iter().next()) else {
        return Err(malformed("a value without a type"));
    };
    Ok(match kind.as_str() {
        "nullValue" => Value::Null,
        "booleanValue" => Value::Bool(inner.as_bool().unwrap_or(false)),
        "integerValue" => {
            let i = match inner {
                Value::String(s) => s
                    .parse::<i64>()
                    .map_err(|_| malformed("a bad integerValue"))?,
                other => other
                    .as_i64()
                    .ok_or_else(|| malformed("a bad integerValue"))?,
            };
            Value::from(i)
        }
        "doubleValue" => match inner {
            Value::String(s) => Value::from(s.parse::<f64>().unwrap_or(f64::NAN)),
            other => other.clone(),
        },
        "stringValue" | "timestampValue" | "referenceValue" | "bytesValue" => inner.clone(),
        "arrayValue" => Value::Array(match inner.get("values") {
            Some(Value::Array(items)) => items.iter().map(from_value).collect::<Result<_, _>>()?,
            _ => Vec::new(),
        }),
        "mapValue" => Value::Object(match inner.get("fields") {
            Some(Value::Object(f)) => from_fields(f)?,
            _ => Map::new(),
        }),
        "geoPointValue" => inner.clone(),
        _ => return Err(malformed("an unknown value type")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let plain = json!({
            "a": 1, "b": -2.5, "c": "x", "d": [true, null, {"e": "f"}], "g": {}, "h": [],
            "big": i64::MAX
        });
        let Value::Object(map) = plain.clone() else {
            unreachable!()
        };
        let typed = to_fields(&map);
        assert_eq!(typed["a"], json!({"integerValue": "1"}));
        assert_eq!(typed["big"], json!({"integerValue": i64::MAX.to_string()}));
        let Value::Object(typed) = typed else {
            unreachable!()
        };
        assert_eq!(Value::Object(from_fields(&typed).unwrap()), plain);
    }

    #[test]
    fn errors_are_read_from_google_bodies() {
        let e = api_error(
            409,
            r#"{"error":{"code":409,"message":"Transaction lock timeout.","status":"ABORTED"}}"#,
        );
        assert_eq!((e.code, e.status.as_str()), (409, "ABORTED"));
        let e = api_error(502, "<html>bad gateway</html>");
        assert_eq!(e.status, "UNKNOWN");
    }
}
