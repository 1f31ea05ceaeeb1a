//! `deploy` against Google's APIs as their REST references describe them: a fake that answers
//! with the recorded response shapes of `tests/fixtures/deploy/responses.json` (404s,
//! operations done or polled, IAM policies with etags, object metadata with CRC32C) and keeps
//! what was created, granted and uploaded. A first deploy on an empty project creates
//! everything in order (the whole request sequence is a snapshot); a second one on the same
//! project writes nothing it need not; the generated SSH key reaches only Secret Manager.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use tpu_runner::deploy::apply::{Http, Materials, apply};
use tpu_runner::deploy::{Inputs, Step, plan, render};
use tpu_runner::engine::Timestamp;
use tpu_runner::store::StateStore;

const KEY: &[u8] = b"-----BEGIN OPENSSH PRIVATE KEY-----\nTESTKEYBYTES-never-logged\n-----END OPENSSH PRIVATE KEY-----\n";

fn responses() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/deploy/responses.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Google's APIs as far as deploy uses them.
struct Fake {
    shapes: Value,
    /// Requests seen: method, URL, body (JSON, or a note for bytes).
    log: Vec<(String, String, Value)>,
    /// Check URLs of things that exist.
    existing: BTreeSet<String>,
    /// What each create makes exist: (create URL, body) → check URL.
    creates: BTreeMap<(String, String), String>,
    policies: BTreeMap<String, Value>,
    objects: BTreeMap<String, Vec<u8>>,
    polled: bool,
}

impl Fake {
    fn new(steps: &[Step]) -> Fake {
        let creates = steps
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
            creates,
            policies: BTreeMap::new(),
            objects: BTreeMap::new(),
            polled: false,
        }
    }

    fn reply(&self, code: u16, shape: &str) -> Result<(u16, Vec<u8>), String> {
        Ok((code, serde_json::to_vec(&self.shapes[shape]).unwrap()))
    }

    fn writes(&self) -> Vec<String> {
        self.log
            .iter()
            .filter(|(m, u, _)| {
                m != "GET" && !u.ends_with(":getIamPolicy") && !u.contains("/operations/")
            })
            .map(|(m, u, _)| format!("{m} {u}"))
            .collect()
    }
}

/// What tells two creates at one URL apart (the service accounts): the body, except a
/// secret version's payload, which is made at apply time.
fn create_key(url: &str, body: Option<&Value>) -> String {
    if url.ends_with(":addVersion") {
        return String::new();
    }
    body.map(Value::to_string).unwrap_or_default()
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
        // Object metadata and uploads.
        if method == "GET" && url.starts_with(STORAGE_OBJECTS) && url.contains("/o/") {
            let key = url.split('?').next().unwrap().to_owned();
            return match self.objects.get(&key) {
                None => self.reply(404, "not_found"),
                Some(data) => {
                    let mut o = self.shapes["object"].clone();
                    o["size"] = json!(data.len().to_string());
                    o["crc32c"] = json!(tpu_runner::gcp::storage::crc32c_b64(data));
                    Ok((200, serde_json::to_vec(&o).unwrap()))
                }
            };
        }
        if method == "POST" && url.starts_with(UPLOADS) {
            let (bucket_part, query) = url[UPLOADS.len()..].split_once("/o?").unwrap();
            let name = query.split("name=").nth(1).unwrap();
            let key = format!("{STORAGE_OBJECTS}{bucket_part}/o/{name}");
            self.objects.insert(key, body.unwrap().0.to_vec());
            return self.reply(200, "object");
        }
        // IAM policies.
        if url.ends_with(":getIamPolicy") || (method == "GET" && url.contains("/iam?")) {
            let resource = url
                .split(":getIamPolicy")
                .next()
                .unwrap()
                .split("/iam?")
                .next()
                .unwrap();
            let bucket = url.contains("/iam?");
            let policy = self.policies.get(resource).cloned().unwrap_or_else(|| {
                self.shapes[if bucket {
                    "empty_bucket_policy"
                } else {
                    "empty_policy"
                }]
                .clone()
            });
            return Ok((200, serde_json::to_vec(&policy).unwrap()));
        }
        if url.ends_with(":setIamPolicy") || (method == "PUT" && url.ends_with("/iam")) {
            let resource = url
                .trim_end_matches(":setIamPolicy")
                .trim_end_matches("/iam");
            let policy = json_body.get("policy").cloned().unwrap_or(json_body);
            assert!(
                policy.get("etag").is_some(),
                "a policy written without the etag read: {url}"
            );
            self.policies.insert(resource.to_owned(), policy.clone());
            return Ok((200, serde_json::to_vec(&policy).unwrap()));
        }
        // Firestore's database create is a long-running operation, polled once.
        if url.contains("/operations/") {
            self.polled = true;
            return self.reply(200, "operation_finished");
        }
        if method == "GET" {
            return if self.existing.contains(url) {
                self.reply(200, "resource")
            } else {
                self.reply(404, "not_found")
            };
        }
        let key = (url.to_owned(), create_key(url, Some(&json_body)));
        if let Some(check) = self.creates.get(&key).cloned() {
            self.existing.insert(check);
            if url.contains("firestore.googleapis.com") && url.contains("databaseId") {
                return self.reply(200, "operation_pending");
            }
        }
        self.reply(200, "operation_done")
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

fn deploy(fake: &mut Fake, store: &mut dyn StateStore) -> Vec<String> {
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
    )
    .unwrap();
    lines
}

#[test]
fn a_first_deploy_creates_everything_in_order_and_a_second_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = tpu_runner::store::sqlite::SqliteStore::open(&dir.path().join("s.db")).unwrap();
    let steps = plan(&fleet(), &inputs());
    let mut fake = Fake::new(&steps);

    let lines = deploy(&mut fake, &mut store);
    assert!(fake.polled, "the database create's operation was followed");
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

    // Again: everything is found as it is; only the always-sent calls write.
    fake.log.clear();
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
            Ok((200, b"{}".to_vec()))
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut store = tpu_runner::store::sqlite::SqliteStore::open(&dir.path().join("s.db")).unwrap();
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
