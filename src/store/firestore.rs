//! The production store: Firestore (Native mode) through its REST API. The original's
//! collections, `<prefix>_<kind>` with prefix = runner name with `-` → `_` (jobs, attempts,
//! resources, interruption_requests, events, locks, lease_epochs), plus `<prefix>_controller`
//! for backoffs, notices and the event counter. One document per job, attempt, resource
//! and request; a record's version is its document's update time. Every write is one atomic
//! `commit` whose writes carry preconditions on what was read (compare-and-set; documents
//! only relied on get a `verify` write that changes nothing), retried on fresh reads when a
//! precondition fails; loads and exports read in one read-only transaction. No read-write
//! transaction is opened, so a killed client leaves no lock behind. Applies the engine's
//! rules; decides nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize as _;
use serde_json::{Map, Value, json};

use super::changes::{ChangeSet, Written, is_closed};
use super::records::{attempt_doc, is_active, job_doc, job_from_docs};
use super::{
    Base, CommitOutcome, ControllerDocs, CreateResult, Delta, Fence, InterruptResult, Io, Loaded,
    StateStore, StoreError, Version, Versions,
};
use crate::engine::commands::{self, CancelResult, ReprioritizeResult};
use crate::engine::lease::{self, Lease, Refusal};
use crate::engine::state::{InterruptionRequest, Job, Resource, SCHEMA_VERSION};
use crate::engine::{Event, State, Timestamp};
use crate::gcp::firestore::{ApiError, Client, Doc, Filter, Precondition, Query, Write};
use crate::spec::{Name, Priority};

pub use crate::gcp::firestore::{Endpoint, endpoint_from_env};

/// How long an operation keeps trying when it loses races to concurrent writers.
const RETRY_BUDGET: Duration = Duration::from_secs(60);

/// Documents per query page.
const PAGE: usize = 1000;

/// A store in a Firestore database.
#[derive(Debug)]
pub struct FirestoreStore {
    client: Client,
    prefix: String,
}

/// The collection names of one runner.
struct Collections {
    jobs: String,
    attempts: String,
    resources: String,
    requests: String,
    events: String,
    locks: String,
    epochs: String,
    controller: String,
}

type Res<T> = Result<T, StoreError>;

/// The field every job, resource and request document carries: the change number of the
/// commit that wrote it (what `load_changes` queries).
const CHANGED: &str = "changed";

/// The counters document (`<prefix>_controller/events`): the last event's sequence number
/// and the change sequence. Every commit that writes records moves the change number by one
/// under a precondition on this document, so commits are numbered in the order they land.
#[derive(Clone, Debug, Default)]
struct Counter {
    /// The last event's sequence number.
    events: u64,
    /// The last change number.
    changes: u64,
    /// Its update time (`None`: no document yet).
    time: Option<String>,
}

impl Counter {
    fn of(doc: Option<Doc>) -> Counter {
        match doc {
            Some(doc) => Counter {
                events: doc.fields.get("next").and_then(Value::as_u64).unwrap_or(0),
                changes: doc
                    .fields
                    .get("changes")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
                time: Some(doc.update_time),
            },
            None => Counter::default(),
        }
    }
}

/// The lease and the epoch as read, with their documents (for preconditions).
struct LockDocs {
    lease: Option<Lease>,
    epoch: Option<String>,
    lease_path: String,
    lease_doc: Option<Doc>,
    epoch_path: String,
    epoch_doc: Option<Doc>,
}

/// What one try of an operation's body decided.
enum Step<T> {
    /// Commit these writes, then return the value (and the writes' update times).
    Commit(Vec<Write>, T),
    /// Write nothing; return the value.
    Done(T),
}

/// A failure inside a transaction's body: the store's, or an API error (retried when it is
/// an abort).
enum TxError {
    Api(ApiError),
    Store(StoreError),
}

impl From<ApiError> for TxError {
    fn from(e: ApiError) -> Self {
        TxError::Api(e)
    }
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        TxError::Store(e)
    }
}

impl FirestoreStore {
    /// Opens the store of runner `runner` in `projects/{project}/databases/{database}` and
    /// checks it can be read (an unreachable endpoint or a permission error fails here).
    pub fn open(
        project: &str,
        database: &str,
        runner: &str,
        endpoint: Endpoint,
    ) -> Res<FirestoreStore> {
        let describe = format!("firestore:projects/{project}/databases/{database}");
        if project.is_empty() || runner.is_empty() {
            return Err(StoreError {
                store: describe,
                message: "needs the fleet's project and runner name: pass --fleet deployment.yaml or --store firestore:PROJECT/DATABASE".into(),
            });
        }
        let client = Client::new(endpoint, project, database).map_err(|e| StoreError {
            store: describe.clone(),
            message: explain(&e),
        })?;
        let mut store = FirestoreStore {
            client,
            prefix: runner.replace('-', "_"),
        };
        let locks = store.names().locks;
        store
            .client
            .batch_get(&[format!("{locks}/controller")], None)
            .map_err(|e| store.error(&e))?;
        Ok(store)
    }

    /// Round trips made so far.
    pub fn calls(&self) -> u64 {
        self.client.calls
    }

    fn names(&self) -> Collections {
        let p = &self.prefix;
        Collections {
            jobs: format!("{p}_jobs"),
            attempts: format!("{p}_attempts"),
            resources: format!("{p}_resources"),
            requests: format!("{p}_interruption_requests"),
            events: format!("{p}_events"),
            locks: format!("{p}_locks"),
            epochs: format!("{p}_lease_epochs"),
            controller: format!("{p}_controller"),
        }
    }

    fn error(&self, e: &ApiError) -> StoreError {
        StoreError {
            store: self.describe(),
            message: explain(e),
        }
    }

    fn bad(&self, path: &str, e: impl std::fmt::Display) -> StoreError {
        StoreError {
            store: self.describe(),
            message: format!(
                "document {path} cannot be read ({e}): fix or delete it in the Firestore console"
            ),
        }
    }

    /// Runs `body` optimistically until its writes commit. `body` reads outside any
    /// transaction (`tx` is `None`) and returns writes that each carry a precondition on
    /// what it read: records it changes on their update time (or absence), documents it
    /// only relied on through `verify` writes. One `commit` applies them all or none; a
    /// failed precondition means someone wrote in between, and `body` runs again on fresh
    /// reads. No read-write transaction is ever opened, so a client killed mid-operation
    /// leaves no lock behind (Firestore keeps an abandoned transaction's locks for 60 s).
    fn cas<T>(
        &mut self,
        mut body: impl FnMut(&mut FirestoreStore, Option<&str>) -> Result<Step<T>, TxError>,
    ) -> Res<(T, Vec<String>)> {
        let started = std::time::Instant::now();
        let mut attempt = 0;
        loop {
            let error = match body(self, None) {
                Ok(Step::Done(value)) => return Ok((value, Vec::new())),
                Ok(Step::Commit(writes, value)) => match self.client.commit(&writes, None) {
                    Ok(times) => return Ok((value, times)),
                    // Not applied: a precondition failed (someone wrote) or contention.
                    Err(e) if lost_race(&e) || e.status == "ABORTED" => e,
                    // No answer, or a server error: it may have been applied. Trying again
                    // could report the caller's own write as someone else's.
                    Err(e) if e.code == 0 || e.code >= 500 => {
                        return Err(StoreError {
                            store: self.describe(),
                            message: format!(
                                "the commit's outcome is unknown ({}): it may or may not have been written; read the state again before deciding (a controller reloads and redoes its pass)",
                                explain(&e)
                            ),
                        });
                    }
                    Err(e) => return Err(self.error(&e)),
                },
                Err(TxError::Api(e)) if retryable(&e) => e,
                Err(TxError::Api(e)) => return Err(self.error(&e)),
                Err(TxError::Store(e)) => return Err(e),
            };
            attempt += 1;
            if started.elapsed() > RETRY_BUDGET {
                return Err(StoreError {
                    store: self.describe(),
                    message: format!(
                        "gave up after {attempt} tries in {} s lost to concurrent writers or unavailability (last: {}): try again",
                        started.elapsed().as_secs(),
                        explain(&error)
                    ),
                });
            }
            std::thread::sleep(backoff(attempt));
        }
    }

    /// A write that changes nothing and fails unless `doc` (read at `path`) is unchanged,
    /// or still absent.
    fn verify(&self, path: String, doc: &Option<Doc>) -> Write {
        match doc {
            Some(doc) => Write::Set {
                path,
                fields: doc.fields.clone(),
                precondition: Precondition::UpdateTime(doc.update_time.clone()),
            },
            None => Write::Delete {
                path,
                precondition: Precondition::Exists(false),
            },
        }
    }

    fn get(&mut self, paths: &[String], tx: Option<&str>) -> Result<Vec<Option<Doc>>, ApiError> {
        self.client.batch_get(paths, tx)
    }

    /// The job `id` with its attempts, and its document as read (for preconditions).
    fn read_job(&mut self, id: &Name, tx: Option<&str>) -> Result<Option<(Job, Doc)>, TxError> {
        let names = self.names();
        let path = format!("{}/{id}", names.jobs);
        let Some(doc) = self.get(std::slice::from_ref(&path), tx)?.pop().flatten() else {
            return Ok(None);
        };
        let attempts = self.client.query(
            &Query {
                collection: &names.attempts,
                filters: vec![Filter::new("job_id", "EQUAL", json!(id.as_str()))],
                ..Query::default()
            },
            tx,
            PAGE,
        )?;
        let job = self.job_of(
            doc.fields.clone(),
            attempts.into_iter().map(|d| d.fields).collect(),
            &path,
        )?;
        Ok(Some((job, doc)))
    }

    fn job_of(
        &self,
        mut doc: Map<String, Value>,
        attempts: Vec<Map<String, Value>>,
        path: &str,
    ) -> Res<Job> {
        doc.remove("active");
        let attempts = attempts
            .into_iter()
            .map(|mut a| {
                a.remove("job_active");
                a
            })
            .collect();
        job_from_docs(doc, attempts).map_err(|e| self.bad(path, e))
    }

    /// The writes of one job and all its attempts.
    /// A job's document and its attempts' documents, the job stamped with change `changed`.
    fn job_writes(&self, job: &Job, precondition: Precondition, changed: u64) -> Res<Vec<Write>> {
        let names = self.names();
        let active = is_active(job);
        let mut doc = job_doc(job).map_err(|e| self.bad(&job.id, e))?;
        doc.insert("active".into(), json!(active));
        doc.insert(CHANGED.into(), json!(changed));
        if let Some(ended) = job.ended_at {
            doc.insert("ended_ms".into(), json!(ended.0));
        }
        let mut writes = vec![Write::Set {
            path: format!("{}/{}", names.jobs, job.id),
            fields: doc,
            precondition,
        }];
        for (seq, attempt) in job.attempts.iter().enumerate() {
            let mut doc = attempt_doc(job, seq, attempt).map_err(|e| self.bad(&attempt.id, e))?;
            doc.insert("job_active".into(), json!(active));
            writes.push(Write::Set {
                path: format!("{}/{}", names.attempts, attempt.id),
                fields: doc,
                precondition: Precondition::None,
            });
        }
        Ok(writes)
    }

    fn record<T: serde::Serialize>(&self, value: &T) -> Map<String, Value> {
        match serde_json::to_value(value).expect("state records serialise") {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    fn request_write(
        &self,
        r: &InterruptionRequest,
        precondition: Precondition,
        changed: u64,
    ) -> Write {
        let mut fields = self.record(r);
        fields.insert("active".into(), json!(!is_closed(r)));
        fields.insert(CHANGED.into(), json!(changed));
        Write::Set {
            path: format!("{}/{}", self.names().requests, r.id),
            fields,
            precondition,
        }
    }

    fn resource_write(&self, r: &Resource, precondition: Precondition, changed: u64) -> Write {
        let mut fields = self.record(r);
        fields.insert(CHANGED.into(), json!(changed));
        Write::Set {
            path: format!("{}/{}", self.names().resources, r.id),
            fields,
            precondition,
        }
    }

    fn controller_writes(&self, docs: &ControllerDocs) -> Vec<Write> {
        let c = self.names().controller;
        vec![
            Write::Set {
                path: format!("{c}/backoff"),
                fields: self.record(&docs.backoff),
                precondition: Precondition::None,
            },
            Write::Set {
                path: format!("{c}/notices"),
                fields: self.record(&docs.notices),
                precondition: Precondition::None,
            },
            Write::Set {
                path: format!("{c}/pools"),
                fields: self.record(&docs.pools),
                precondition: Precondition::None,
            },
            Write::Set {
                path: format!("{c}/others"),
                fields: self.record(&json!({ "tpus": docs.others })),
                precondition: Precondition::None,
            },
        ]
    }

    /// The writes appending `events` after the counter as read, and the counter's: its
    /// event number moved past them, and its change number by one when `stamped` (the
    /// records this commit writes carry `counter.changes + 1`). Nothing when there is
    /// nothing to count.
    fn counted(&self, events: &[Event], counter: &Counter, stamped: bool) -> Vec<Write> {
        if events.is_empty() && !stamped {
            return Vec::new();
        }
        let names = self.names();
        let mut writes: Vec<Write> = events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let seq = counter.events + i as u64 + 1;
                let mut fields = self.record(e);
                fields.insert("seq".into(), json!(seq));
                Write::Set {
                    path: format!("{}/{seq:020}", names.events),
                    fields,
                    precondition: Precondition::Exists(false),
                }
            })
            .collect();
        writes.push(Write::Set {
            path: format!("{}/events", names.controller),
            fields: [
                (
                    "next".to_owned(),
                    json!(counter.events + events.len() as u64),
                ),
                (
                    "changes".to_owned(),
                    json!(counter.changes + u64::from(stamped)),
                ),
            ]
            .into_iter()
            .collect(),
            precondition: match &counter.time {
                Some(t) => Precondition::UpdateTime(t.clone()),
                None => Precondition::Exists(false),
            },
        });
        writes
    }

    /// What a command that changed `job` (read as `doc`) writes: the job, if it is still as
    /// read, with the next change number, and its `event`.
    fn command_writes(
        &mut self,
        job: &Job,
        doc: &Doc,
        event: Event,
        tx: Option<&str>,
    ) -> Result<Vec<Write>, TxError> {
        let counter = self.counter(tx)?;
        let mut writes = self.job_writes(
            job,
            Precondition::UpdateTime(doc.update_time.clone()),
            counter.changes + 1,
        )?;
        writes.extend(self.counted(&[event], &counter, true));
        Ok(writes)
    }

    /// The event and change counters read in `tx`.
    fn counter(&mut self, tx: Option<&str>) -> Result<Counter, TxError> {
        let path = format!("{}/events", self.names().controller);
        Ok(Counter::of(self.get(&[path], tx)?.pop().flatten()))
    }

    /// The lease and epoch documents, as read.
    fn lock_docs(&mut self, tx: Option<&str>) -> Result<LockDocs, TxError> {
        let names = self.names();
        let paths = [
            format!("{}/controller", names.locks),
            format!("{}/controller", names.epochs),
        ];
        let mut docs = self.get(&paths, tx)?;
        let epoch_doc = docs.pop().flatten();
        let lease_doc = docs.pop().flatten();
        // A lease that cannot be read is acquirable (§2.1), never a dead controller.
        let lease = lease_doc.as_ref().and_then(|doc| {
            serde_json::from_value::<Lease>(Value::Object(doc.fields.clone())).ok()
        });
        let epoch = epoch_doc
            .as_ref()
            .and_then(|d| d.fields.get("epoch"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(LockDocs {
            lease,
            epoch,
            lease_path: paths[0].clone(),
            lease_doc,
            epoch_path: paths[1].clone(),
            epoch_doc,
        })
    }

    fn read_locks(&mut self, tx: Option<&str>) -> Result<(Option<Lease>, Option<String>), TxError> {
        let docs = self.lock_docs(tx)?;
        Ok((docs.lease, docs.epoch))
    }

    fn parse<T: serde::de::DeserializeOwned>(&self, doc: Doc) -> Res<T> {
        serde_json::from_value(Value::Object(doc.fields)).map_err(|e| self.bad(&doc.name, e))
    }

    /// A request document without the `active` flag the store adds.
    fn parse_request(&self, mut doc: Doc) -> Res<InterruptionRequest> {
        doc.fields.remove("active");
        self.parse(doc)
    }

    /// What a `--if-pending` cancel of `job` judges (nothing is read for a plain cancel).
    /// Read outside a transaction: a TPU starting to point at the job would have to write
    /// the job too, which the cancel's precondition on the job catches.
    fn previous_tpus(
        &mut self,
        job: Option<&Job>,
        if_pending: bool,
        tx: Option<&str>,
    ) -> Result<commands::PreviousTpus, TxError> {
        let Some((resource, attempt)) = job
            .filter(|_| if_pending)
            .and_then(commands::previous_attempt)
        else {
            return Ok(Default::default());
        };
        let collection = self.names().resources;
        let path = format!("{collection}/{resource}");
        let of_attempt = match self.get(&[path], tx)?.pop().flatten() {
            Some(doc) => Some(self.parse(doc)?),
            None => None,
        };
        let mut pointing: Vec<Resource> = Vec::new();
        let job_id = job.map_or("", |j| j.id.as_str());
        for (field, value) in [
            ("owner.job_id", job_id),
            ("owner.attempt_id", attempt.as_str()),
        ] {
            let query = Query {
                collection: &collection,
                filters: vec![Filter::new(field, "EQUAL", json!(value))],
                ..Query::default()
            };
            for doc in self.client.query(&query, tx, PAGE)? {
                let r: Resource = self.parse(doc)?;
                if !pointing.iter().any(|o| o.id == r.id) {
                    pointing.push(r);
                }
            }
        }
        pointing.sort_by_key(|r| r.id);
        Ok(commands::PreviousTpus {
            of_attempt,
            pointing,
        })
    }

    /// Runs `f` in one read-only transaction (a consistent snapshot), rolled back after.
    fn read_only<T>(&mut self, f: impl FnOnce(&mut FirestoreStore, &str) -> Res<T>) -> Res<T> {
        let tx = self.client.begin(true, None).map_err(|e| self.error(&e))?;
        let result = f(self, &tx);
        self.client.rollback(&tx);
        result
    }

    /// Jobs from their documents and their attempts' documents, with each job's version.
    fn jobs_of(&self, job_docs: Vec<Doc>, attempt_docs: Vec<Doc>) -> Res<Vec<(Job, String)>> {
        let mut attempts: BTreeMap<String, Vec<Map<String, Value>>> = BTreeMap::new();
        for doc in attempt_docs {
            let job = doc
                .fields
                .get("job_id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            attempts.entry(job).or_default().push(doc.fields);
        }
        job_docs
            .into_iter()
            .map(|doc| {
                let id = doc.id().to_owned();
                let job = self.job_of(
                    doc.fields,
                    attempts.remove(&id).unwrap_or_default(),
                    &doc.name,
                )?;
                Ok((job, doc.update_time))
            })
            .collect()
    }

    /// The active state and its base, read in `tx`.
    fn load_in(&mut self, tx: &str) -> Res<Loaded> {
        let names = self.names();
        let mut state = State::new();
        let active = |field: &str| vec![Filter::new(field, "EQUAL", json!(true))];
        let job_docs = self.all(&names.jobs, active("active"), Some(tx))?;
        let attempt_docs = self.all(&names.attempts, active("job_active"), Some(tx))?;
        let mut job_versions = Versions::default();
        for (job, time) in self.jobs_of(job_docs, attempt_docs)? {
            job_versions.insert(job.id, Version(time));
            state.jobs.insert(job.id, job);
        }
        let mut resource_versions = Versions::default();
        for doc in self.all(&names.resources, Vec::new(), Some(tx))? {
            let time = doc.update_time.clone();
            let r: Resource = self.parse(doc)?;
            resource_versions.insert(r.id, Version(time));
            state.resources.insert(r.id, r);
        }
        let mut request_versions = BTreeMap::new();
        for doc in self.all(&names.requests, active("active"), Some(tx))? {
            let time = doc.update_time.clone();
            let r = self.parse_request(doc)?;
            request_versions.insert(r.id, Version(time));
            state.interruption_requests.insert(r.id, r);
        }
        let (docs, counter) = self.control_docs(tx)?;
        docs.apply_to(&mut state);
        let base = Base::new(
            &state,
            job_versions,
            resource_versions,
            request_versions,
            counter.changes,
        );
        Ok(Loaded { state, base })
    }

    /// The controller documents and the counters, read in `tx` (one call); a store an
    /// import did not finish is refused.
    fn control_docs(&mut self, tx: &str) -> Res<(ControllerDocs, Counter)> {
        let names = self.names();
        let paths = [
            format!("{}/import", names.controller),
            format!("{}/backoff", names.controller),
            format!("{}/notices", names.controller),
            format!("{}/pools", names.controller),
            format!("{}/others", names.controller),
            format!("{}/events", names.controller),
        ];
        let mut docs = self.get(&paths, Some(tx)).map_err(|e| self.error(&e))?;
        // Never a half-imported store: what a killed import left is refused, not served.
        if let Some(Some(marker)) = docs.first()
            && marker.fields.get("state") == Some(&json!(IMPORTING))
        {
            return Err(self.unfinished_import(marker));
        }
        let counter = Counter::of(docs.pop().flatten());
        let mut control = ControllerDocs::default();
        if let Some(mut doc) = docs.pop().flatten() {
            let tpus = doc.fields.remove("tpus").unwrap_or(json!([]));
            control.others = serde_json::from_value(tpus).map_err(|e| self.bad(&doc.name, e))?;
        }
        if let Some(doc) = docs.pop().flatten() {
            control.pools = self.parse(doc)?;
        }
        if let Some(doc) = docs.pop().flatten() {
            control.notices = self.parse(doc)?;
        }
        if let Some(doc) = docs.pop().flatten() {
            control.backoff = self.parse(doc)?;
        }
        Ok((control, counter))
    }

    /// What was written after change `cursor`, read in `tx`: the documents stamped with a
    /// later change number (one query per collection on the single-field index Firestore
    /// keeps for every field), each changed job with its attempts (`IN` queries of 30 ids).
    fn changes_in(&mut self, tx: &str, cursor: u64) -> Res<Option<Delta>> {
        let (controller, counter) = self.control_docs(tx)?;
        if counter.changes < cursor {
            return Ok(None);
        }
        let mut delta = Delta {
            cursor: counter.changes,
            controller,
            ..Delta::default()
        };
        if counter.changes == cursor {
            return Ok(Some(delta));
        }
        let names = self.names();
        let after = |coll: &str, store: &mut FirestoreStore| -> Res<Vec<Doc>> {
            store
                .client
                .query(
                    &Query {
                        collection: coll,
                        filters: vec![Filter::new(CHANGED, "GREATER_THAN", json!(cursor))],
                        order_by: Some(CHANGED),
                        ..Query::default()
                    },
                    Some(tx),
                    PAGE,
                )
                .map_err(|e| store.error(&e))
        };
        let job_docs = after(&names.jobs, self)?;
        let mut attempt_docs = Vec::new();
        let ids: Vec<&str> = job_docs.iter().map(Doc::id).collect();
        for chunk in ids.chunks(30) {
            attempt_docs.extend(self.all(
                &names.attempts,
                vec![Filter::new("job_id", "IN", json!(chunk))],
                Some(tx),
            )?);
        }
        for (job, time) in self.jobs_of(job_docs, attempt_docs)? {
            delta.jobs.push((job, Version(time)));
        }
        for doc in after(&names.resources, self)? {
            let time = doc.update_time.clone();
            delta.resources.push((self.parse(doc)?, Version(time)));
        }
        for doc in after(&names.requests, self)? {
            let time = doc.update_time.clone();
            delta
                .requests
                .push((self.parse_request(doc)?, Version(time)));
        }
        Ok(Some(delta))
    }

    /// The error for a store an import did not finish in.
    fn unfinished_import(&self, marker: &Doc) -> StoreError {
        StoreError {
            store: self.describe(),
            message: format!(
                "an import into this store did not finish ({} jobs were to be written; it was killed or failed): nothing is read from a half-imported store; delete the `{}_*` collections (or use another runner name) and import again",
                marker.fields.get("jobs").cloned().unwrap_or_default(),
                self.prefix
            ),
        }
    }

    /// Finished jobs ended at or after `since`, by end time (`descending`: latest first).
    fn finished_in_order(
        &mut self,
        since: Timestamp,
        limit: usize,
        descending: bool,
    ) -> Res<Vec<Job>> {
        let names = self.names();
        let docs = self
            .client
            .query(
                &Query {
                    collection: &names.jobs,
                    filters: vec![Filter::new(
                        "ended_ms",
                        "GREATER_THAN_OR_EQUAL",
                        json!(since.0),
                    )],
                    order_by: Some("ended_ms"),
                    limit: Some(limit),
                    descending,
                    ..Query::default()
                },
                None,
                PAGE,
            )
            .map_err(|e| self.error(&e))?;
        let mut jobs = Vec::new();
        for doc in docs {
            if doc.fields.get("active") == Some(&json!(false)) {
                let id = Name::new(doc.id());
                jobs.extend(self.job(&id)?);
            }
        }
        Ok(jobs)
    }

    /// Events (of job `job`, if given) with sequence numbers above `after`, oldest first,
    /// at most `limit`.
    fn events_where(
        &mut self,
        job: Option<&Name>,
        after: u64,
        limit: usize,
    ) -> Res<Vec<(u64, Event)>> {
        let names = self.names();
        let start = self
            .client
            .doc_name(&format!("{}/{after:020}", names.events));
        let docs = self
            .client
            .query(
                &Query {
                    collection: &names.events,
                    filters: job
                        .map(|j| vec![Filter::new("job_id", "EQUAL", json!(j.as_str()))])
                        .unwrap_or_default(),
                    start_after: Some(json!([{ "referenceValue": start }])),
                    limit: Some(limit),
                    ..Query::default()
                },
                None,
                PAGE,
            )
            .map_err(|e| self.error(&e))?;
        let mut out = Vec::new();
        for doc in docs {
            let seq = doc.fields.get("seq").and_then(Value::as_u64).unwrap_or(0);
            let mut fields = doc.fields.clone();
            fields.remove("seq");
            let event: Event = serde_json::from_value(Value::Object(fields))
                .map_err(|e| self.bad(&doc.name, e))?;
            out.push((seq, event));
        }
        Ok(out)
    }

    fn all(&mut self, collection: &str, filters: Vec<Filter>, tx: Option<&str>) -> Res<Vec<Doc>> {
        self.client
            .query(
                &Query {
                    collection,
                    filters,
                    ..Query::default()
                },
                tx,
                PAGE,
            )
            .map_err(|e| self.error(&e))
    }
}

/// The import marker's state while an import writes.
const IMPORTING: &str = "importing";

/// A commit refused because a precondition no longer held: someone wrote first.
fn lost_race(e: &ApiError) -> bool {
    matches!(
        e.status.as_str(),
        "FAILED_PRECONDITION" | "ALREADY_EXISTS" | "NOT_FOUND"
    )
}

/// Retryable transport or server failures (the call may be made again).
fn retryable(e: &ApiError) -> bool {
    matches!(
        e.status.as_str(),
        "ABORTED" | "UNAVAILABLE" | "DEADLINE_EXCEEDED" | "RESOURCE_EXHAUSTED"
    )
}

/// Exponential backoff with jitter: 50 ms × 2^k, at most 2 s, ± half.
fn backoff(attempt: u32) -> Duration {
    let base = (50u64 << attempt.min(6)).min(2000);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    Duration::from_millis(base / 2 + nanos % (base / 2 + 1))
}

/// A sentence for an API failure, with what to do.
fn explain(e: &ApiError) -> String {
    match e.status.as_str() {
        "UNAVAILABLE" if e.code == 0 => format!(
            "unreachable ({}): check the network, or FIRESTORE_EMULATOR_HOST for an emulator",
            e.message
        ),
        "DEADLINE_EXCEEDED" => format!("did not answer in time ({}): try again", e.message),
        "PERMISSION_DENIED" => format!(
            "permission denied ({}): the caller needs roles/datastore.user on the project",
            e.message
        ),
        "UNAUTHENTICATED" => e.message.clone(),
        "NOT_FOUND" => format!(
            "not found ({}): create the database with `tpu-runner deploy` (or check the project and database)",
            e.message
        ),
        _ => e.to_string(),
    }
}

fn precondition(expected: &Option<Version>) -> Precondition {
    match expected {
        Some(v) => Precondition::UpdateTime(v.0.clone()),
        None => Precondition::Exists(false),
    }
}

impl StateStore for FirestoreStore {
    fn describe(&self) -> String {
        format!("firestore:{}", self.client.database())
    }

    fn create_jobs(&mut self, jobs: &[Job], now: Timestamp) -> Res<CreateResult> {
        let jobs_coll = self.names().jobs;
        let (result, _) = self.cas(|store, tx| {
            let paths: Vec<String> = jobs
                .iter()
                .map(|j| format!("{jobs_coll}/{}", j.id))
                .collect();
            let found = store.get(&paths, tx)?;
            let mut exist: Vec<Name> = jobs
                .iter()
                .zip(&found)
                .filter(|(_, d)| d.is_some())
                .map(|(j, _)| j.id)
                .collect();
            let mut seen = crate::spec::NameSet::default();
            exist.extend(jobs.iter().filter(|j| !seen.insert(j.id)).map(|j| j.id));
            if !exist.is_empty() {
                exist.sort();
                exist.dedup();
                return Ok(Step::Done(CreateResult::Exist(exist)));
            }
            let counter = store.counter(tx)?;
            let mut writes = Vec::new();
            for job in jobs {
                writes.extend(store.job_writes(
                    job,
                    Precondition::Exists(false),
                    counter.changes + 1,
                )?);
            }
            writes.extend(store.counted(&commands::created(jobs, now), &counter, true));
            Ok(Step::Commit(writes, CreateResult::Created))
        })?;
        Ok(result)
    }

    fn cancel_job(&mut self, id: &Name, if_pending: bool, now: Timestamp) -> Res<CancelResult> {
        let (result, _) = self.cas(|store, tx| {
            let mut read = store.read_job(id, tx)?;
            let tpus = store.previous_tpus(read.as_ref().map(|(j, _)| j), if_pending, tx)?;
            let result = commands::cancel(read.as_mut().map(|(j, _)| j), if_pending, &tpus, now);
            match (&result, &read) {
                (CancelResult::Status { changed: true, .. }, Some((job, doc))) => {
                    let writes =
                        store.command_writes(job, doc, commands::cancel_event(job, now), tx)?;
                    Ok(Step::Commit(writes, result))
                }
                _ => Ok(Step::Done(result)),
            }
        })?;
        Ok(result)
    }

    fn reprioritize(
        &mut self,
        id: &Name,
        priority: Priority,
        now: Timestamp,
    ) -> Res<ReprioritizeResult> {
        let (result, _) = self.cas(|store, tx| {
            let mut read = store.read_job(id, tx)?;
            let (result, event) =
                commands::reprioritize(read.as_mut().map(|(j, _)| j), priority, now);
            let (Some(event), Some((job, doc))) = (event, &read) else {
                return Ok(Step::Done(result));
            };
            let writes = store.command_writes(job, doc, event, tx)?;
            Ok(Step::Commit(writes, result))
        })?;
        Ok(result)
    }

    fn create_interruption_request(
        &mut self,
        resource_id: &Name,
        job_id: &Name,
        attempt_id: &Name,
        eligible: &dyn Fn(&Name) -> bool,
        now: Timestamp,
    ) -> Res<InterruptResult> {
        let (result, _) = self.cas(|store, tx| {
            let names = store.names();
            let id = commands::interruption_id(resource_id, job_id, attempt_id);
            let paths = [
                format!("{}/{resource_id}", names.resources),
                format!("{}/{id}", names.requests),
            ];
            let mut docs = store.get(&paths, tx)?;
            let existing = docs.pop().flatten();
            let resource_doc = docs.pop().flatten();
            let resource: Option<Resource> = match resource_doc.clone() {
                Some(doc) => Some(store.parse(doc)?),
                None => None,
            };
            let job_path = format!("{}/{job_id}", names.jobs);
            let (job, job_doc) = match store.read_job(job_id, tx)? {
                Some((job, doc)) => (Some(job), Some(doc)),
                None => (None, None),
            };
            if let Some(reason) = commands::unknown_target(
                resource.as_ref(),
                job.as_ref(),
                resource_id,
                job_id,
                attempt_id,
            ) {
                return Ok(Step::Done(InterruptResult::UnknownTarget(reason)));
            }
            let (Some(resource), Some(job)) = (resource, job) else {
                unreachable!("unknown_target checked both")
            };
            if existing.is_some() {
                return Ok(Step::Done(InterruptResult::Exists(id)));
            }
            match commands::interruption_request(
                &resource,
                &job,
                attempt_id,
                eligible(&resource.entry_id),
                now,
            ) {
                Ok(request) => {
                    // Filed only if the TPU and the job are still as checked.
                    let counter = store.counter(tx)?;
                    let mut writes = vec![
                        store.request_write(
                            &request,
                            Precondition::Exists(false),
                            counter.changes + 1,
                        ),
                        store.verify(paths[0].clone(), &resource_doc),
                        store.verify(job_path.clone(), &job_doc),
                    ];
                    writes.extend(store.counted(&[], &counter, true));
                    Ok(Step::Commit(writes, InterruptResult::Requested(request)))
                }
                Err(reason) => Ok(Step::Done(InterruptResult::Rejected(reason))),
            }
        })?;
        Ok(result)
    }

    fn acquire_lease(
        &mut self,
        owner: &str,
        epoch: &str,
        ttl_secs: i64,
        now: Timestamp,
    ) -> Res<Result<Lease, Refusal>> {
        let (result, _) = self.cas(|store, tx| {
            let locks = store.lock_docs(tx)?;
            match lease::acquire(
                locks.lease.as_ref(),
                locks.epoch.as_deref(),
                owner,
                epoch,
                ttl_secs,
                now,
            ) {
                Ok(new) => {
                    // Taken only if neither the lease nor the epoch changed since read.
                    let write = Write::Set {
                        path: locks.lease_path.clone(),
                        fields: store.record(&new),
                        precondition: match &locks.lease_doc {
                            Some(doc) => Precondition::UpdateTime(doc.update_time.clone()),
                            None => Precondition::Exists(false),
                        },
                    };
                    let epoch = store.verify(locks.epoch_path.clone(), &locks.epoch_doc);
                    Ok(Step::Commit(vec![write, epoch], Ok(new)))
                }
                Err(refusal) => Ok(Step::Done(Err(refusal))),
            }
        })?;
        Ok(result)
    }

    fn release_lease(&mut self, owner: &str) -> Res<()> {
        self.cas(|store, tx| {
            let locks = store.lock_docs(tx)?;
            if let (Some(held), Some(doc)) = (&locks.lease, &locks.lease_doc)
                && lease::release(Some(held.clone()), owner).is_none()
            {
                let write = Write::Delete {
                    path: locks.lease_path.clone(),
                    precondition: Precondition::UpdateTime(doc.update_time.clone()),
                };
                return Ok(Step::Commit(vec![write], ()));
            }
            Ok(Step::Done(()))
        })?;
        Ok(())
    }

    fn set_epoch(&mut self, epoch: &str, now: Timestamp) -> Res<()> {
        if epoch.is_empty() {
            return Err(StoreError {
                store: self.describe(),
                message: "refused an empty epoch".into(),
            });
        }
        let path = format!("{}/controller", self.names().epochs);
        let fields: Map<String, Value> = [
            ("epoch".to_owned(), json!(epoch)),
            ("updated_at".to_owned(), json!(now)),
        ]
        .into_iter()
        .collect();
        self.client
            .commit(
                &[Write::Set {
                    path,
                    fields,
                    precondition: Precondition::None,
                }],
                None,
            )
            .map_err(|e| self.error(&e))?;
        Ok(())
    }

    fn lease(&mut self) -> Res<(Option<Lease>, Option<String>)> {
        self.read_locks(None).map_err(|e| match e {
            TxError::Api(e) => self.error(&e),
            TxError::Store(e) => e,
        })
    }

    fn load_active(&mut self) -> Res<Loaded> {
        self.read_only(|store, tx| store.load_in(tx))
    }

    fn load_changes(&mut self, cursor: u64) -> Res<Option<Delta>> {
        self.read_only(|store, tx| store.changes_in(tx, cursor))
    }

    fn take_io(&mut self) -> Io {
        let io = Io {
            reads: self.client.reads,
            writes: self.client.writes,
        };
        (self.client.reads, self.client.writes) = (0, 0);
        io
    }

    fn commit_pass(
        &mut self,
        base: &mut Base,
        state: &State,
        events: &[Event],
        fence: &Fence,
        now: Timestamp,
    ) -> Res<CommitOutcome> {
        let changes = ChangeSet::between(base, state);
        let names = self.names();
        let ((outcome, counts), times) = self.cas(|store, tx| {
            let locks = store.lock_docs(tx)?;
            let (lease, epoch) = (locks.lease.clone(), locks.epoch.clone());
            if let Some(reason) = commands::fence_refusal(
                lease.as_ref(),
                epoch.as_deref(),
                &fence.owner,
                &fence.epoch,
                now,
            ) {
                return Ok(Step::Done((CommitOutcome::Fenced { reason }, None)));
            }
            // Read every record about to be written inside the transaction: a write since
            // the load is a conflict (and the preconditions below guard the same).
            let mut paths = Vec::with_capacity(changes.len());
            let mut expected = Vec::with_capacity(changes.len());
            for (job, v) in &changes.jobs {
                paths.push(format!("{}/{}", names.jobs, job.id));
                expected.push(v);
            }
            for (r, v) in &changes.resources {
                paths.push(format!("{}/{}", names.resources, r.id));
                expected.push(v);
            }
            for (r, v) in &changes.requests {
                paths.push(format!("{}/{}", names.requests, r.id));
                expected.push(v);
            }
            let found = store.get(&paths, tx)?;
            let conflicts: Vec<String> = paths
                .iter()
                .zip(&found)
                .zip(&expected)
                .filter(|((_, doc), want)| {
                    doc.as_ref().map(|d| &d.update_time) != want.as_ref().map(|v| &v.0)
                })
                .map(|((path, _), _)| {
                    let (coll, id) = path.split_once('/').unwrap_or((path, ""));
                    let kind = coll
                        .strip_prefix(&format!("{}_", store.prefix))
                        .unwrap_or(coll);
                    format!("{kind}/{id}")
                })
                .collect();
            if !conflicts.is_empty() {
                return Ok(Step::Done((
                    CommitOutcome::Conflict { records: conflicts },
                    None,
                )));
            }
            // Records written take the next change number; events theirs.
            let stamped = changes.len() > usize::from(changes.controller.is_some());
            let counter = if stamped || !events.is_empty() {
                store.counter(tx)?
            } else {
                Counter::default()
            };
            let changed = counter.changes + 1;
            // Writes in a fixed order; remember where each record's document write is.
            let mut writes = Vec::new();
            let mut positions = (Vec::new(), Vec::new(), Vec::new());
            for (job, v) in &changes.jobs {
                positions.0.push(writes.len());
                writes.extend(store.job_writes(job, precondition(v), changed)?);
            }
            for (r, v) in &changes.resources {
                positions.1.push(writes.len());
                writes.push(store.resource_write(r, precondition(v), changed));
            }
            for (r, v) in &changes.requests {
                positions.2.push(writes.len());
                writes.push(store.request_write(r, precondition(v), changed));
            }
            if let Some(docs) = &changes.controller {
                writes.extend(store.controller_writes(docs));
            }
            // The fence holds at the commit: the lease and the epoch are as read.
            writes.push(store.verify(locks.lease_path.clone(), &locks.lease_doc));
            writes.push(store.verify(locks.epoch_path.clone(), &locks.epoch_doc));
            writes.extend(store.counted(events, &counter, stamped));
            // No one wrote since the base's cursor: the next delta starts after this commit.
            let cursor = if !stamped {
                None
            } else if counter.changes == base.cursor {
                Some(changed)
            } else {
                None
            };
            Ok(Step::Commit(
                writes,
                (CommitOutcome::Committed, Some((positions, cursor))),
            ))
        })?;
        if let Some(((jobs, resources, requests), cursor)) = counts {
            let version = |i: usize| Version(times.get(i).cloned().unwrap_or_default());
            let written = Written {
                jobs: changes
                    .jobs
                    .iter()
                    .zip(jobs)
                    .map(|((j, _), i)| (j.id, version(i)))
                    .collect(),
                resources: changes
                    .resources
                    .iter()
                    .zip(resources)
                    .map(|((r, _), i)| (r.id, version(i)))
                    .collect(),
                requests: changes
                    .requests
                    .iter()
                    .zip(requests)
                    .map(|((r, _), i)| (r.id, version(i)))
                    .collect(),
                cursor,
            };
            base.advance(state, &changes, written);
        }
        Ok(outcome)
    }

    fn job(&mut self, id: &Name) -> Res<Option<Job>> {
        // The job and its attempts as of one instant.
        self.read_only(|store, tx| match store.read_job(id, Some(tx)) {
            Ok(job) => Ok(job.map(|(j, _)| j)),
            Err(TxError::Api(e)) => Err(store.error(&e)),
            Err(TxError::Store(e)) => Err(e),
        })
    }

    fn existing_jobs(&mut self, ids: &[Name]) -> Res<Vec<Name>> {
        let jobs = self.names().jobs;
        let paths: Vec<String> = ids.iter().map(|id| format!("{jobs}/{id}")).collect();
        let docs = self
            .client
            .batch_get(&paths, None)
            .map_err(|e| self.error(&e))?;
        let mut found: Vec<Name> = ids
            .iter()
            .zip(&docs)
            .filter(|(_, d)| d.is_some())
            .map(|(id, _)| *id)
            .collect();
        found.sort();
        found.dedup();
        Ok(found)
    }

    fn runs_named(&mut self, name: &str, limit: usize) -> Res<Vec<Name>> {
        // An equality filter only (no composite index to deploy): the runs of one name are
        // few, ordered here by submission.
        let jobs = self.names().jobs;
        let docs = self.all(
            &jobs,
            vec![Filter::new("spec.name", "EQUAL", json!(name))],
            None,
        )?;
        let mut runs: Vec<(i64, Name)> = docs
            .iter()
            .map(|d| {
                let at = d
                    .fields
                    .get("submitted_at")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                (at, Name::new(d.id()))
            })
            .collect();
        runs.sort_by(|a, b| b.cmp(a));
        runs.truncate(limit);
        Ok(runs.into_iter().map(|(_, id)| id).collect())
    }

    fn finished_jobs(&mut self, since: Timestamp, limit: usize) -> Res<Vec<Job>> {
        self.finished_in_order(since, limit, false)
    }

    fn latest_finished(&mut self, since: Timestamp, limit: usize) -> Res<Vec<Job>> {
        self.finished_in_order(since, limit, true)
    }

    fn job_events(&mut self, job: &Name, after: u64, limit: usize) -> Res<Vec<(u64, Event)>> {
        // Event documents are named by their zero-padded sequence number: an equality filter
        // in name order is sequence order, with no composite index to deploy.
        self.events_where(Some(job), after, limit)
    }

    fn events_after(&mut self, after: u64, limit: usize) -> Res<Vec<(u64, Event)>> {
        self.events_where(None, after, limit)
    }

    fn compact_events(&mut self, before: Timestamp, limit: usize) -> Res<usize> {
        let names = self.names();
        let docs = self
            .client
            .query(
                &Query {
                    collection: &names.events,
                    limit: Some(limit),
                    ..Query::default()
                },
                None,
                PAGE,
            )
            .map_err(|e| self.error(&e))?;
        let writes: Vec<Write> = docs
            .iter()
            .filter(|d| {
                d.fields
                    .get("at")
                    .and_then(|at| Timestamp::deserialize(at).ok())
                    .is_some_and(|at| at < before)
            })
            .map(|d| Write::Delete {
                path: format!("{}/{}", names.events, d.id()),
                precondition: Precondition::Exists(true),
            })
            .collect();
        if writes.is_empty() {
            return Ok(0);
        }
        // Deleting what another compaction deleted first is no loss: then nothing is
        // written and the next call finds the rest.
        match self.client.commit(&writes, None) {
            Ok(_) => Ok(writes.len()),
            Err(e) if lost_race(&e) => Ok(0),
            Err(e) => Err(self.error(&e)),
        }
    }

    fn export(&mut self) -> Res<State> {
        // One read-only transaction: a job finishing meanwhile is in `jobs` or in
        // `finished`, never in both.
        self.read_only(|store, tx| {
            let Loaded { mut state, .. } = store.load_in(tx)?;
            let names = store.names();
            let inactive = |field: &str| vec![Filter::new(field, "EQUAL", json!(false))];
            let job_docs = store.all(&names.jobs, inactive("active"), Some(tx))?;
            let attempt_docs = store.all(&names.attempts, inactive("job_active"), Some(tx))?;
            for (job, _) in store.jobs_of(job_docs, attempt_docs)? {
                state.finished.insert(job.id, Box::new(job));
            }
            for doc in store.all(&names.requests, inactive("active"), Some(tx))? {
                let r = store.parse_request(doc)?;
                state.interruption_requests.insert(r.id, r);
            }
            state.schema_version = SCHEMA_VERSION;
            Ok(state)
        })
    }

    fn import(&mut self, state: &State) -> Res<()> {
        let names = self.names();
        for coll in [&names.jobs, &names.resources, &names.requests] {
            let docs = self
                .client
                .query(
                    &Query {
                        collection: coll,
                        limit: Some(1),
                        ..Query::default()
                    },
                    None,
                    1,
                )
                .map_err(|e| self.error(&e))?;
            if !docs.is_empty() {
                return Err(StoreError {
                    store: self.describe(),
                    message: format!(
                        "holds records already ({coll}): import only into an empty store (nothing was written)"
                    ),
                });
            }
        }
        // Every record takes the next change number, so a controller's next delta reads it.
        let counter = self.counter(None).map_err(|e| match e {
            TxError::Api(e) => self.error(&e),
            TxError::Store(e) => e,
        })?;
        let changed = counter.changes + 1;
        let mut writes = Vec::new();
        for job in state.all_jobs() {
            writes.extend(self.job_writes(job, Precondition::Exists(false), changed)?);
        }
        for r in state.resources.values() {
            writes.push(self.resource_write(r, Precondition::Exists(false), changed));
        }
        for r in state.interruption_requests.values() {
            writes.push(self.request_write(r, Precondition::Exists(false), changed));
        }
        writes.extend(self.controller_writes(&ControllerDocs::of(state)));
        // Ids must be unique across active and finished jobs (checked before writing).
        let mut seen = crate::spec::NameSet::default();
        if let Some(dup) = state.all_jobs().find(|j| !seen.insert(j.id)) {
            return Err(StoreError {
                store: self.describe(),
                message: format!(
                    "job {} is both active and finished in the file: nothing was written",
                    dup.id
                ),
            });
        }
        // Claim the store (checked, nothing written yet): one import at a time, and a marker
        // that says, until the last part is written, that the store is half imported
        // (loads refuse it).
        let marker = format!("{}/import", names.controller);
        let jobs = state.all_jobs().count();
        let claim = Write::Set {
            path: marker.clone(),
            fields: serde_json::Map::from_iter([
                ("state".to_owned(), json!(IMPORTING)),
                ("jobs".to_owned(), json!(jobs)),
            ]),
            precondition: Precondition::Exists(false),
        };
        if let Err(e) = self.client.commit(&[claim], None) {
            if !lost_race(&e) {
                return Err(self.error(&e));
            }
            let found = self.get(&[marker], None).map_err(|e| self.error(&e))?;
            return Err(match found.into_iter().next().flatten() {
                Some(doc) if doc.fields.get("state") == Some(&json!(IMPORTING)) => {
                    StoreError {
                        message: format!(
                            "another import is writing into this store, or one did not finish: {}",
                            self.unfinished_import(&doc).message
                        ),
                        store: self.describe(),
                    }
                }
                _ => StoreError {
                    store: self.describe(),
                    message: "was imported into already: import only into an empty store (nothing was written)".into(),
                },
            });
        }
        // One commit holds at most 10 MiB: a large state is imported in chunks, each
        // create-only, so a retry after a partial import fails loudly instead of overwriting;
        // the marker says the store is half imported until the last one is written.
        writes.extend(self.counted(&[], &counter, true));
        writes.push(Write::Set {
            path: marker,
            fields: serde_json::Map::from_iter([
                ("state".to_owned(), json!("complete")),
                ("jobs".to_owned(), json!(jobs)),
            ]),
            precondition: Precondition::Exists(true),
        });
        let chunks = writes.chunks(400).count();
        for (k, chunk) in writes.chunks(400).enumerate() {
            self.client.commit(chunk, None).map_err(|e| StoreError {
                store: self.describe(),
                message: format!(
                    "{} after {k} of {chunks} parts were written: delete the `{}_*` collections (or use another runner name) and import again",
                    explain(&e),
                    self.prefix
                ),
            })?;
        }
        Ok(())
    }
}
