//! `deploy` against Google's APIs as their discovery documents describe them: a fake Google
//! that checks every request against the method it calls (`tests/discovery/`: HTTP method,
//! path, declared query parameters, body fields and types) and every reply it gives against
//! the method's response schema, answers as Google does (long-running operations that take
//! several reads to finish and omit `done` until then; what an operation makes exists only
//! once it is done; no API answers before the services are enabled; a bucket only in a
//! Cloud Storage location), and keeps what was created, granted and uploaded. A first
//! deploy on an empty project creates everything in order (the whole request sequence is a
//! snapshot); a second one on the same project writes nothing it need not; failed and
//! unfinished operations stop the deploy with their reason; the generated SSH key reaches
//! only Secret Manager.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use tpu_runner::deploy::apply::{Http, Materials, apply};
use tpu_runner::deploy::{Inputs, Step, plan, render};
use tpu_runner::engine::Timestamp;
use tpu_runner::store::StateStore;

#[path = "support/google.rs"]
mod google;

const KEY: &[u8] = b"-----BEGIN OPENSSH PRIVATE KEY-----\nTESTKEYBYTES-never-logged\n-----END OPENSSH PRIVATE KEY-----\n";

fn responses() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/deploy/responses.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Cloud Storage's bucket locations (its documented regions and multi-regions); Google
/// refuses any other with 400.
const STORAGE_LOCATIONS: &[&str] = &[
    "US",
    "EU",
    "ASIA",
    "NAM4",
    "EUR4",
    "ASIA1",
    "US-CENTRAL1",
    "US-EAST1",
    "US-EAST4",
    "US-EAST5",
    "US-SOUTH1",
    "US-WEST1",
    "US-WEST2",
    "US-WEST3",
    "US-WEST4",
    "EUROPE-WEST1",
    "EUROPE-WEST2",
    "EUROPE-WEST3",
    "EUROPE-WEST4",
    "EUROPE-WEST6",
    "ASIA-EAST1",
    "ASIA-NORTHEAST1",
    "ASIA-SOUTHEAST1",
    "SOUTHAMERICA-EAST1",
];

/// An operation the fake is running: read again at its poll URL until `reads` is 0.
struct Running {
    /// Reads still answered "not done" (`None`: never done).
    reads: Option<u32>,
    /// The reply while running and once done.
    pending: Value,
    finished: Value,
    /// What exists once it is done (a check URL), and whether it enables the services.
    makes: Option<String>,
    enables: bool,
}

/// Google's APIs as far as deploy uses them.
struct Fake {
    shapes: Value,
    /// Requests seen: method, URL, body (JSON, or a note for bytes).
    log: Vec<(String, String, Value)>,
    /// Check URLs of things that exist.
    existing: BTreeSet<String>,
    /// Check URLs of everything the plan creates (a policy of one of them is read only once
    /// it exists).
    planned: BTreeSet<String>,
    /// What each create makes exist: (create URL, body) → check URL.
    creates: BTreeMap<(String, String), String>,
    /// Operations by the URL they are read at.
    operations: BTreeMap<String, Running>,
    next_operation: u32,
    /// Reads before an operation is done (each API's own in real life).
    op_reads: u32,
    /// Operations of this URL fragment end with this error.
    failing: Option<(&'static str, Value)>,
    services_enabled: bool,
    policies: BTreeMap<String, Value>,
    objects: BTreeMap<String, Vec<u8>>,
    /// Time the deploy waited between reads of operations.
    waited: Duration,
    /// What Google would have refused or answered otherwise.
    violations: Vec<String>,
}

impl Fake {
    fn new(steps: &[Step]) -> Fake {
        let creates: BTreeMap<(String, String), String> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Ensure { check, create, .. } => Some((
                    (
                        create.url.clone(),
                        create_key(&create.url, create.body.as_ref()),
                    ),
                    check.url.clone(),
                )),
                _ => None,
            })
            .collect();
        Fake {
            shapes: responses(),
            log: Vec::new(),
            existing: BTreeSet::new(),
            planned: creates
                .values()
                .map(|u| without_query(u).to_owned())
                .collect(),
            creates,
            operations: BTreeMap::new(),
            next_operation: 0,
            op_reads: 2,
            failing: None,
            services_enabled: false,
            policies: BTreeMap::new(),
            objects: BTreeMap::new(),
            waited: Duration::ZERO,
            violations: Vec::new(),
        }
    }

    fn shape(&self, name: &str) -> Value {
        self.shapes[name].clone()
    }

    fn writes(&self) -> Vec<String> {
        self.log
            .iter()
            .filter(|(m, u, _)| {
                m != "GET" && !u.contains(":getIamPolicy") && !u.contains("/operations/")
            })
            .map(|(m, u, _)| format!("{m} {u}"))
            .collect()
    }

    fn error(code: u16, status: &str, message: &str) -> (u16, Value) {
        (
            code,
            json!({"error": {"code": code, "message": message, "status": status}}),
        )
    }

    /// Starts an operation for a call to `url` (named as that API names its operations).
    fn start(
        &mut self,
        url: &str,
        makes: Option<String>,
        response: Value,
        forever: bool,
    ) -> (u16, Value) {
        self.next_operation += 1;
        let n = self.next_operation;
        let (host, target) = google::split_url(url);
        let version = target.split('/').nth(1).unwrap_or("v1");
        let mut reads = (!forever).then_some(self.op_reads);
        let mut error = None;
        if let Some((fragment, e)) = &self.failing
            && url.contains(fragment)
        {
            if e.is_null() {
                reads = None;
            } else {
                error = Some(e.clone());
            }
        }
        if host == "compute.googleapis.com" {
            let name = format!("operation-1733100000000-{n:04}");
            let global = &url[..url.find("/global/").unwrap() + "/global/".len()];
            let link = format!("{global}operations/{name}");
            let pending = json!({"kind": "compute#operation", "id": format!("{}", 7_000_000 + n), "name": name,
                "operationType": "insert", "status": "RUNNING", "selfLink": link, "targetLink": makes.clone().unwrap_or_default()});
            let mut finished = pending.clone();
            finished["status"] = json!("DONE");
            finished["progress"] = json!(100);
            self.operations.insert(
                link,
                Running {
                    reads,
                    pending: pending.clone(),
                    finished,
                    makes,
                    enables: false,
                },
            );
            return (200, pending);
        }
        let project = "local-project";
        let name = if host == "serviceusage.googleapis.com" {
            format!("operations/acf.p2-123456789012-{n:04}")
        } else if host == "firestore.googleapis.com" {
            format!("projects/{project}/databases/(default)/operations/ASA3NDEw{n:04}")
        } else {
            let location = target
                .split("/locations/")
                .nth(1)
                .and_then(|r| r.split('/').next())
                .unwrap();
            format!("projects/{project}/locations/{location}/operations/operation-{n:04}")
        };
        let pending = json!({"name": name, "metadata": {"@type": "type.googleapis.com/google.protobuf.Empty"}});
        let mut finished = pending.clone();
        finished["done"] = json!(true);
        match error {
            Some(e) => finished["error"] = e,
            None => finished["response"] = response,
        }
        let enables = host == "serviceusage.googleapis.com";
        self.operations.insert(
            format!("https://{host}/{version}/{name}"),
            Running {
                reads,
                pending: pending.clone(),
                finished,
                makes,
                enables,
            },
        );
        (200, pending)
    }

    fn answer(
        &mut self,
        method: &str,
        url: &str,
        body: &Value,
        bytes: Option<&[u8]>,
    ) -> (u16, Value) {
        let (host, _) = google::split_url(url);
        if !self.services_enabled && host != "serviceusage.googleapis.com" {
            return Fake::error(
                403,
                "PERMISSION_DENIED",
                &format!(
                    "{host} has not been used in project local-project before or it is disabled (SERVICE_DISABLED)"
                ),
            );
        }
        if let Some(op) = self.operations.get_mut(url) {
            return match &mut op.reads {
                Some(0) => {
                    let finished = op.finished.clone();
                    if finished.get("error").is_none()
                        && (finished["done"] == true || finished["status"] == "DONE")
                    {
                        if let Some(makes) = op.makes.take() {
                            self.existing.insert(makes);
                        }
                        if op.enables {
                            self.services_enabled = true;
                        }
                    }
                    (200, finished)
                }
                Some(n) => {
                    *n -= 1;
                    (200, op.pending.clone())
                }
                None => (200, op.pending.clone()),
            };
        }
        if method == "POST" && url.contains("services:batchEnable") {
            return self.start(
                url,
                None,
                json!({"@type": "type.googleapis.com/google.api.serviceusage.v1.BatchEnableServicesResponse"}),
                false,
            );
        }
        // Object metadata and uploads.
        if method == "GET" && url.starts_with(STORAGE_OBJECTS) && url.contains("/o/") {
            let key = without_query(url).to_owned();
            return match self.objects.get(&key) {
                None => (404, self.shape("not_found")),
                Some(data) => {
                    let mut o = self.shape("object");
                    o["size"] = json!(data.len().to_string());
                    o["crc32c"] = json!(tpu_runner::gcp::storage::crc32c_b64(data));
                    (200, o)
                }
            };
        }
        if method == "POST" && url.starts_with(UPLOADS) {
            let (bucket_part, query) = url[UPLOADS.len()..].split_once("/o?").unwrap();
            let name = query.split("name=").nth(1).unwrap();
            let key = format!("{STORAGE_OBJECTS}{bucket_part}/o/{name}");
            let data = bytes.unwrap().to_vec();
            let mut o = self.shape("object");
            o["size"] = json!(data.len().to_string());
            o["crc32c"] = json!(tpu_runner::gcp::storage::crc32c_b64(&data));
            self.objects.insert(key, data);
            return (200, o);
        }
        // IAM policies: of a resource the plan makes only once it exists.
        if url.contains(":getIamPolicy") || (method == "GET" && url.contains("/iam?")) {
            let resource = without_query(url)
                .trim_end_matches(":getIamPolicy")
                .trim_end_matches("/iam");
            if self.planned.contains(resource)
                && !self.existing.iter().any(|e| without_query(e) == resource)
            {
                return (404, self.shape("not_found"));
            }
            let bucket = url.contains("/iam?");
            let policy = self.policies.get(resource).cloned().unwrap_or_else(|| {
                self.shape(if bucket {
                    "empty_bucket_policy"
                } else {
                    "empty_policy"
                })
            });
            return (200, policy);
        }
        if url.ends_with(":setIamPolicy") || (method == "PUT" && url.ends_with("/iam")) {
            let resource = url
                .trim_end_matches(":setIamPolicy")
                .trim_end_matches("/iam");
            let policy = body.get("policy").cloned().unwrap_or(body.clone());
            assert!(
                policy.get("etag").is_some(),
                "a policy written without the etag read: {url}"
            );
            self.policies.insert(resource.to_owned(), policy.clone());
            return (200, policy);
        }
        if method == "GET" {
            return if self.existing.contains(url) {
                (
                    200,
                    json!({"name": format!("resource at {}", without_query(url))}),
                )
            } else {
                (404, self.shape("not_found"))
            };
        }
        if url.starts_with("https://storage.googleapis.com/storage/v1/b?") {
            let location = body["location"].as_str().unwrap_or_default();
            if !STORAGE_LOCATIONS.contains(&location) {
                return Fake::error(
                    400,
                    "INVALID_ARGUMENT",
                    &format!("Invalid location: {location}"),
                );
            }
        }
        let built = self.operations.iter().any(|(_, o)| {
            o.finished["response"]["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with(".Build"))
                && o.reads == Some(0)
        });
        if url.starts_with("https://run.googleapis.com/")
            && (method == "PATCH" || url.contains("jobId="))
            && !built
        {
            return Fake::error(
                400,
                "INVALID_ARGUMENT",
                "Image 'us-central1-docker.pkg.dev/local-project/local-stack/controller:e-test-1' not found.",
            );
        }
        let key = (url.to_owned(), create_key(url, Some(body)));
        let makes = self.creates.get(&key).cloned();
        let (_, target) = google::split_url(url);
        let api = google::api_at(host).unwrap();
        let method_info = api.resolve(method, without_query(target)).unwrap();
        match method_info.response.as_deref() {
            Some("Operation" | "GoogleLongrunningOperation")
                if host == "compute.googleapis.com" =>
            {
                self.start(url, makes, Value::Null, false)
            }
            Some("Operation" | "GoogleLongrunningOperation") => {
                let response = if url.contains("/builds") {
                    json!({"@type": "type.googleapis.com/google.devtools.cloudbuild.v1.Build", "status": "SUCCESS"})
                } else {
                    json!({"@type": format!("type.googleapis.com/{}", method_info.id)})
                };
                // A run's operation is the controller's execution: done hours later.
                let forever = url.ends_with(":run");
                self.start(url, makes, response, forever)
            }
            _ => {
                if let Some(check) = makes {
                    self.existing.insert(check);
                }
                (
                    200,
                    json!({"name": format!("made by {}", without_query(url))}),
                )
            }
        }
    }
}

fn without_query(url: &str) -> &str {
    url.split('?').next().unwrap()
}

/// What tells two creates at one URL apart (the service accounts): the body, except a
/// secret version's payload, which is made at apply time.
fn create_key(url: &str, body: Option<&Value>) -> String {
    if url.ends_with(":addVersion") {
        return String::new();
    }
    body.filter(|b| !b.is_null())
        .map(Value::to_string)
        .unwrap_or_default()
}

const STORAGE_OBJECTS: &str = "https://storage.googleapis.com/storage/v1/b/";
const UPLOADS: &str = "https://storage.googleapis.com/upload/storage/v1/b/";

impl Http for Fake {
    fn send(
        &mut self,
        method: &str,
        url: &str,
        body: Option<(&[u8], &str)>,
    ) -> Result<(u16, Vec<u8>), String> {
        let json_body = body
            .map(|(b, t)| {
                if t == "application/json" {
                    serde_json::from_slice(b).unwrap()
                } else {
                    json!(format!("<{} bytes of {t}>", b.len()))
                }
            })
            .unwrap_or(Value::Null);
        self.log
            .push((method.to_owned(), url.to_owned(), json_body.clone()));
        // Google's front end first: a request its document does not define is refused.
        let (host, target) = google::split_url(url);
        let Some(api) = google::api_at(host) else {
            self.violations
                .push(format!("{method} {url}: no vendored document for {host}"));
            return Ok((404, b"{}".to_vec()));
        };
        let sent = google::Sent {
            method: method.to_owned(),
            target: target.to_owned(),
            body: body.map(|(b, _)| b.to_vec()).unwrap_or_default(),
            content_type: body.map(|(_, t)| t.to_owned()).unwrap_or_default(),
        };
        let checked = google::check_request(api, &sent);
        let m = match checked {
            Ok(m) => m,
            Err(e) => {
                self.violations.push(e.clone());
                let (code, reply) = Fake::error(400, "INVALID_ARGUMENT", &e);
                return Ok((code, serde_json::to_vec(&reply).unwrap()));
            }
        };
        let (code, reply) = self.answer(method, url, &json_body, body.map(|(b, _)| b));
        // And every reply it gives must be one Google would give.
        if (200..300).contains(&code)
            && let Err(e) = google::check_reply(api, m, &serde_json::to_vec(&reply).unwrap())
        {
            self.violations.push(format!("the fake's own reply: {e}"));
        }
        Ok((code, serde_json::to_vec(&reply).unwrap()))
    }

    fn wait(&mut self, d: Duration) {
        self.waited += d;
    }
}

fn fleet() -> tpu_runner::spec::FleetSpec {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/local/deployment.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.replace(
        "tpus:",
        "ssh_transport: iap\nworker_secrets: [wandb-key]\ntpus:",
    );
    tpu_runner::spec::parse_fleet("deployment.yaml", &text).unwrap()
}

fn inputs() -> Inputs {
    Inputs {
        epoch: "e-test-1".into(),
        job_buckets: vec!["gs://lab-us-east1".into()],
    }
}

fn try_deploy(fake: &mut Fake, store: &mut dyn StateStore) -> Result<Vec<String>, String> {
    let steps = plan(&fleet(), &inputs());
    let mut keys = 0;
    let mut materials = Materials {
        agent: b"\x7fELF agent bytes".to_vec(),
        deployment: b"name: local-stack\n".to_vec(),
        keygen: Box::new(move || {
            keys += 1;
            assert_eq!(keys, 1, "one key per deploy at most");
            Ok((
                KEY.to_vec(),
                b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITEST tpurunner\n".to_vec(),
            ))
        }),
        public_key: None,
    };
    let mut lines = Vec::new();
    apply(
        &steps,
        fake,
        &mut materials,
        store,
        Timestamp(1_764_633_600_000),
        &mut |l| lines.push(l),
    )?;
    Ok(lines)
}

fn deploy(fake: &mut Fake, store: &mut dyn StateStore) -> Vec<String> {
    let lines = try_deploy(fake, store).unwrap_or_else(|e| {
        panic!(
            "deploy failed: {e}\nwhat Google would refuse: {:#?}",
            fake.violations
        )
    });
    assert!(
        fake.violations.is_empty(),
        "requests or replies Google's documents do not allow:\n{}",
        fake.violations.join("\n")
    );
    lines
}

fn store() -> (tempfile::TempDir, tpu_runner::store::sqlite::SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = tpu_runner::store::sqlite::SqliteStore::open(&dir.path().join("s.db")).unwrap();
    (dir, store)
}

#[test]
fn a_first_deploy_creates_everything_in_order_and_a_second_changes_nothing() {
    let (_dir, mut store) = store();
    let steps = plan(&fleet(), &inputs());
    let mut fake = Fake::new(&steps);

    let lines = deploy(&mut fake, &mut store);
    // Every operation was read until it was done (the services before anything else, the
    // image before the job that runs it), except the controller's execution.
    let unfinished: Vec<&String> = fake
        .operations
        .iter()
        .filter(|(_, o)| o.reads != Some(0))
        .map(|(u, _)| u)
        .collect();
    assert_eq!(unfinished.len(), 1, "{unfinished:?}");
    assert!(
        unfinished[0].contains("run.googleapis.com"),
        "{unfinished:?}"
    );
    assert!(fake.waited >= Duration::from_secs(3), "{:?}", fake.waited);
    let sequence: Vec<String> = fake
        .log
        .iter()
        .map(|(m, u, _)| format!("{m} {u}"))
        .collect();
    insta::assert_snapshot!("first_deploy_requests", sequence.join("\n"));
    // The grants are exactly the least-privilege ones (no tpu.admin, no project-wide storage).
    let project =
        &fake.policies["https://cloudresourcemanager.googleapis.com/v3/projects/local-project"];
    insta::assert_json_snapshot!("project_policy", project);
    let roles: Vec<&str> = project["bindings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["role"].as_str().unwrap())
        .collect();
    assert!(
        !roles
            .iter()
            .any(|r| r.contains("tpu.admin") || r.contains("storage.")),
        "{roles:?}"
    );
    assert_eq!(
        project["version"], 3,
        "a conditional binding needs policy version 3"
    );
    // The epoch is in the store; the key went only to Secret Manager, base64, and never to a log line.
    assert_eq!(store.lease().unwrap().1.as_deref(), Some("e-test-1"));
    let (_, url, body) = fake
        .log
        .iter()
        .find(|(_, u, _)| u.ends_with(":addVersion"))
        .unwrap();
    assert!(url.contains("secretmanager"));
    use base64::Engine as _;
    let data = body["payload"]["data"].as_str().unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
        KEY
    );
    for line in &lines {
        assert!(!line.contains("TESTKEY") && !line.contains(data), "{line}");
    }
    assert!(lines.iter().all(|l| !l.starts_with("ok")), "{lines:#?}");

    // Every method a deploy calls, each checked against its document above.
    let methods: BTreeSet<String> = fake
        .log
        .iter()
        .map(|(m, u, _)| {
            let (host, target) = google::split_url(u);
            let api = google::api_at(host).unwrap();
            api.resolve(m, without_query(target)).unwrap().id.clone()
        })
        .collect();
    insta::assert_snapshot!(
        "deploy_methods",
        methods.into_iter().collect::<Vec<_>>().join("\n")
    );

    // Again: everything is found as it is; only the always-sent calls write.
    fake.log.clear();
    fake.operations.clear();
    let again = deploy(&mut fake, &mut store);
    insta::assert_snapshot!("second_deploy_writes", fake.writes().join("\n"));
    assert!(again.iter().any(|l| l.contains("(exists)")));
    assert!(
        !fake.log.iter().any(|(_, u, _)| u.ends_with(":addVersion")),
        "a second deploy keeps the key"
    );
}

#[test]
fn the_dry_run_names_every_call_in_order() {
    let steps = plan(&fleet(), &inputs());
    insta::assert_snapshot!("dry_run", render(&steps));
}

#[test]
fn a_refusal_names_its_step_and_stops() {
    struct Refusing(usize);
    impl Http for Refusing {
        fn send(
            &mut self,
            _: &str,
            url: &str,
            _: Option<(&[u8], &str)>,
        ) -> Result<(u16, Vec<u8>), String> {
            self.0 += 1;
            if url.contains("firestore") {
                return Ok((403, br#"{"error":{"code":403,"message":"Permission denied on project local-project","status":"PERMISSION_DENIED"}}"#.to_vec()));
            }
            // Every call succeeds, every operation at once.
            Ok((
                200,
                br#"{"name": "operations/op-1", "done": true}"#.to_vec(),
            ))
        }
    }
    let (_dir, mut store) = store();
    let mut materials = Materials {
        agent: Vec::new(),
        deployment: Vec::new(),
        keygen: Box::new(|| Ok((KEY.to_vec(), Vec::new()))),
        public_key: None,
    };
    let mut http = Refusing(0);
    let e = apply(
        &plan(&fleet(), &inputs()),
        &mut http,
        &mut materials,
        &mut store,
        Timestamp(0),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        e.starts_with("Firestore database (default) in nam5: GET"),
        "{e}"
    );
    assert!(e.contains("403: Permission denied"), "{e}");
    assert_eq!(
        store.lease().unwrap().1,
        None,
        "nothing after the refusal ran"
    );
}

#[test]
fn an_operation_is_followed_though_its_reply_omits_done() {
    // Google's pending operation is `{name, metadata}`: proto-JSON omits `done: false`. A
    // deploy that took that for a finished call would use the services, the database, the
    // image and the job before they exist; the fake refuses exactly that.
    let (_dir, mut store) = store();
    let mut fake = Fake::new(&plan(&fleet(), &inputs()));
    fake.op_reads = 5;
    deploy(&mut fake, &mut store);
    let polls = fake
        .log
        .iter()
        .filter(|(m, u, _)| m == "GET" && u.contains("/operations/"))
        .count();
    // Services, firewall, database, repository, build, the job's create and its update: six
    // reads each (five not done, then done); the run is not waited for.
    assert_eq!(polls, 7 * 6, "{:#?}", fake.log);
}

#[test]
fn a_failed_operation_stops_the_deploy_with_its_reason() {
    let (_dir, mut store) = store();
    let mut fake = Fake::new(&plan(&fleet(), &inputs()));
    fake.failing = Some((
        "cloudbuild",
        json!({"code": 3, "message": "Build step 0 \"gcr.io/cloud-builders/docker\" failed: exit status 1", "status": "INVALID_ARGUMENT"}),
    ));
    let e = try_deploy(&mut fake, &mut store).unwrap_err();
    assert!(e.starts_with("build the controller image"), "{e}");
    assert!(e.contains("failed: INVALID_ARGUMENT Build step 0"), "{e}");
    assert!(
        !fake
            .log
            .iter()
            .any(|(_, u, _)| u.contains("run.googleapis.com")),
        "nothing after the failed build ran"
    );
    assert_eq!(store.lease().unwrap().1, None);
}

#[test]
fn an_operation_that_never_ends_stops_the_deploy_at_its_deadline() {
    let (_dir, mut store) = store();
    let mut fake = Fake::new(&plan(&fleet(), &inputs()));
    fake.failing = Some(("firestore", Value::Null));
    let e = try_deploy(&mut fake, &mut store).unwrap_err();
    assert!(e.starts_with("Firestore database (default) in nam5"), "{e}");
    assert!(e.contains("was not done after"), "{e}");
    // The database's deadline is ten minutes, read at growing intervals up to 15 s.
    assert!(
        fake.waited >= Duration::from_secs(600) && fake.waited < Duration::from_secs(640),
        "{:?}",
        fake.waited
    );
}

#[test]
fn every_iam_policy_is_read_and_written_as_its_api_defines() {
    // Secret Manager reads a policy with GET, IAM's service accounts with a bodiless POST,
    // Resource Manager with a POST body, Cloud Storage at `/iam`: the fake's front end
    // refuses any other shape (a POST to a secret's getIamPolicy is no method at all).
    let (_dir, mut store) = store();
    let mut fake = Fake::new(&plan(&fleet(), &inputs()));
    deploy(&mut fake, &mut store);
    let reads: BTreeSet<String> = fake
        .log
        .iter()
        .filter(|(_, u, _)| u.contains("getIamPolicy") || u.contains("/iam?"))
        .map(|(m, u, b)| {
            let host = google::split_url(u).0;
            format!("{m} {host} body={}", !b.is_null())
        })
        .collect();
    assert_eq!(
        reads.into_iter().collect::<Vec<_>>(),
        [
            "GET secretmanager.googleapis.com body=false",
            "GET storage.googleapis.com body=false",
            "POST cloudresourcemanager.googleapis.com body=true",
            "POST iam.googleapis.com body=false",
        ]
    );
}

#[test]
fn the_runner_bucket_of_a_tpu_only_region_is_made_where_cloud_storage_has_a_location() {
    // `<project>-<name>-us-central2`: us-central2 has TPUs but no Cloud Storage location.
    let steps = plan(&fleet(), &inputs());
    let create = steps
        .iter()
        .find_map(|s| match s {
            Step::Ensure { create, .. } if create.url.contains("/storage/v1/b?") => Some(create),
            _ => None,
        })
        .unwrap();
    assert_eq!(create.body.as_ref().unwrap()["location"], "US");
}
