//! `deploy` as data (§6.4): the ordered, idempotent REST calls that set up a fleet's project —
//! services, the runner bucket, the IAP firewall, Firestore, the two service accounts and
//! their least-privilege grants, the SSH key secret, the artifacts, the controller image, the
//! epoch bump, and the Cloud Run job. Every step either checks before it creates (`Ensure`),
//! merges IAM bindings into the policy it read (`Grant`), or is a write that may be repeated
//! (`Send`). This module only plans; `apply` carries a plan out over an `Http` boundary (real
//! HTTPS, or recorded fixtures in tests). It never holds a secret's value: the SSH key is
//! generated at apply time and goes only into Secret Manager.
//!
//! Least privilege, against the original's project-wide `tpu.admin` and `storage.objectAdmin`:
//! - controller: a custom role with exactly the TPU permissions the controller calls (nodes
//!   get/list/delete, queued resources get/list/create/delete, operations get), project-wide
//!   because TPU permissions have no narrower resource; `datastore.user` conditioned on the
//!   fleet's database; `iam.serviceAccountUser` on the worker account only (to create TPUs
//!   that run as it), not the project; `secretmanager.secretAccessor` on the SSH key secret
//!   only; `storage.objectViewer` on the runner bucket and each job bucket named with
//!   `--job-bucket` (reports, logs); `logging.logWriter`.
//! - worker: `storage.objectViewer` on the runner bucket (agent, startup script);
//!   `storage.objectUser` (create, overwrite, read; no IAM changes) on each job bucket;
//!   `logging.logWriter`; `secretAccessor` on each of the fleet's `worker_secrets` only.
//!   Job buckets are named at deploy (`--job-bucket`); without any, the plan says that
//!   workers will lack access rather than granting the whole project.

pub mod apply;
pub mod startup;

use serde::Serialize;
use serde_json::{Value, json};

use crate::spec::FleetSpec;
use crate::spec::fleet::SshTransport;

/// One HTTP request of a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Request {
    /// `GET`, `POST`, `PATCH`, `PUT`.
    pub method: &'static str,
    /// Full URL.
    pub url: String,
    /// JSON body, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// What its reply is (its method's response schema) and how long it is waited for.
    pub reply: Reply,
}

/// What a call replies, as its method's response schema in Google's discovery document
/// says (`tests/deploy.rs` checks each against the document): a resource, or an operation
/// to follow until it is done. An operation is recognised by the method, never guessed from
/// the reply (proto-JSON omits `done` while it is false).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// The resource itself (or a policy): done when it comes.
    Resource,
    /// A `google.longrunning.Operation`, read again at `/VERSION/<name>` of the same API
    /// until it is done, for at most `deadline_secs`; its `error` fails the step.
    Operation {
        /// The longest wait.
        deadline_secs: u64,
    },
    /// A Compute Engine `Operation` (`status` until `DONE`, `error.errors[]`), read again
    /// with `globalOperations.get`.
    ComputeOperation {
        /// The longest wait.
        deadline_secs: u64,
    },
    /// An operation that is not waited for: the call starts something that runs on (a
    /// Cloud Run execution: the controller, for hours).
    Started,
}

impl Request {
    fn get(url: String) -> Request {
        Request {
            method: "GET",
            url,
            body: None,
            reply: Reply::Resource,
        }
    }

    fn post(url: String, body: Value) -> Request {
        Request {
            method: "POST",
            url,
            body: Some(body),
            reply: Reply::Resource,
        }
    }

    /// The same request, replying with a Compute Engine operation followed for at most
    /// `secs`.
    fn compute_operation(self, secs: u64) -> Request {
        Request {
            reply: Reply::ComputeOperation {
                deadline_secs: secs,
            },
            ..self
        }
    }

    /// The same request, replying with an operation followed for at most `secs`.
    fn operation(self, secs: u64) -> Request {
        Request {
            reply: Reply::Operation {
                deadline_secs: secs,
            },
            ..self
        }
    }
}

/// Where an IAM policy is read and written: each API words `getIamPolicy` its own way
/// (the discovery documents' methods, checked by `tests/deploy.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IamApi {
    /// Resource Manager v3: `POST :getIamPolicy` with `{options}`; `POST :setIamPolicy`.
    ResourceManager,
    /// IAM v1 service accounts: `POST :getIamPolicy` with no body, the version in the
    /// query; `POST :setIamPolicy`.
    ServiceAccount,
    /// Secret Manager v1: `GET :getIamPolicy`, the version in the query; `POST
    /// :setIamPolicy`.
    SecretManager,
    /// Cloud Storage: `GET /iam`; `PUT /iam` with the policy itself.
    Storage,
}

impl IamApi {
    /// The read of `resource`'s policy (version 3: conditional bindings).
    pub fn read(self, resource: &str) -> Request {
        let (method, url, body) = match self {
            IamApi::ResourceManager => (
                "POST",
                format!("{resource}:getIamPolicy"),
                Some(json!({"options": {"requestedPolicyVersion": 3}})),
            ),
            IamApi::ServiceAccount => (
                "POST",
                format!("{resource}:getIamPolicy?options.requestedPolicyVersion=3"),
                None,
            ),
            IamApi::SecretManager => (
                "GET",
                format!("{resource}:getIamPolicy?options.requestedPolicyVersion=3"),
                None,
            ),
            IamApi::Storage => (
                "GET",
                format!("{resource}/iam?optionsRequestedPolicyVersion=3"),
                None,
            ),
        };
        Request {
            method,
            url,
            body,
            reply: Reply::Resource,
        }
    }

    /// The write of `policy` (as read, with the bindings added) to `resource`.
    pub fn write(self, resource: &str, policy: Value) -> Request {
        match self {
            IamApi::Storage => Request {
                method: "PUT",
                url: format!("{resource}/iam"),
                body: Some(policy),
                reply: Reply::Resource,
            },
            _ => Request::post(
                format!("{resource}:setIamPolicy"),
                json!({ "policy": policy }),
            ),
        }
    }
}

/// One IAM binding to make sure of.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Binding {
    /// `roles/…` or `projects/P/roles/…`.
    pub role: String,
    /// `serviceAccount:…`.
    pub member: String,
    /// An IAM condition (`{title, expression}`), if the grant is conditional.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<Value>,
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// Read `check`; when it is absent (404), send `create` (and follow its operation).
    Ensure {
        /// What this makes sure of.
        what: String,
        /// The read.
        check: Request,
        /// The create.
        create: Request,
    },
    /// Read the IAM policy at `resource` (`getIamPolicy`), add the missing `bindings`, and
    /// write it back (`setIamPolicy`, with the etag read) only if something was missing.
    Grant {
        /// What this grants.
        what: String,
        /// The resource URL (without the `:getIamPolicy` suffix).
        resource: String,
        /// Which API's policy methods.
        iam: IamApi,
        /// The bindings.
        bindings: Vec<Binding>,
    },
    /// A write that may be repeated (enabling services, uploading an artifact, running).
    Send {
        /// What this does.
        what: String,
        /// The request.
        request: Request,
    },
    /// The deployment epoch set through the store (every older controller is fenced).
    SetEpoch {
        /// What this does.
        what: String,
        /// The new epoch.
        epoch: String,
    },
    /// An artifact uploaded to the runner bucket, replaced if it differs.
    Upload {
        /// What it is.
        what: String,
        /// `gs://BUCKET/NAME`.
        uri: String,
        /// Its bytes, named (`agent`, `deployment`): filled at apply time.
        source: String,
    },
}

/// What a deploy needs besides the fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct Inputs {
    /// The new deployment epoch.
    pub epoch: String,
    /// Job buckets workers write to and the controller reads (`gs://…`).
    pub job_buckets: Vec<String>,
}

/// The services the runner uses.
pub const SERVICES: [&str; 10] = [
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "compute.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
    "tpu.googleapis.com",
];

/// The TPU permissions the controller's calls need (list, get, create, delete; operations).
/// (A queued resource's create also checks `tpu.nodes.create` for the node it makes.)
pub const CONTROLLER_TPU_PERMISSIONS: [&str; 10] = [
    "tpu.locations.get",
    "tpu.nodes.create",
    "tpu.nodes.delete",
    "tpu.nodes.get",
    "tpu.nodes.list",
    "tpu.operations.get",
    "tpu.queuedResources.create",
    "tpu.queuedResources.delete",
    "tpu.queuedResources.get",
    "tpu.queuedResources.list",
];

/// How long the controller image's build may take (Cloud Build's `timeout`).
const BUILD_TIMEOUT_SECS: u64 = 1200;

/// Regions that have TPUs but no Cloud Storage location of their own (Cloud Storage's
/// documented locations; `storage.v1.json` lists its regional endpoints without them).
const NO_STORAGE_LOCATION: [&str; 1] = ["us-central2"];

/// The Cloud Storage location of a bucket meant for `region`: the region itself, or the
/// `US` multi-region for a TPU-only region (its artifacts are read once per TPU boot).
fn storage_location(region: &str) -> String {
    if NO_STORAGE_LOCATION.contains(&region) {
        "US".into()
    } else {
        region.to_uppercase()
    }
}

/// The IAP TCP-forwarding range (Google's documented source of IAP tunnels).
const IAP_RANGE: &str = "35.235.240.0/20";

fn account(fleet: &FleetSpec, who: &str) -> String {
    format!(
        "{}-{who}@{}.iam.gserviceaccount.com",
        fleet.name, fleet.project
    )
}

fn bucket_name(uri: &str) -> &str {
    uri.trim_start_matches("gs://").trim_end_matches('/')
}

/// The custom role's id (letters, digits, `_` and `.` only).
fn role_id(fleet: &FleetSpec) -> String {
    format!("tpuRunner_{}_controller", fleet.name.replace('-', "_"))
}

/// The plan of a deploy of `fleet`.
pub fn plan(fleet: &FleetSpec, inputs: &Inputs) -> Vec<Step> {
    let p = &fleet.project;
    let region = &fleet.controller_region;
    let bucket = bucket_name(&fleet.bucket).to_owned();
    // A runner bucket whose name ends in a region (the derived `<project>-<name>-us-central2`,
    // as the original created it) is made there; any other in the controller's region.
    let parts: Vec<&str> = bucket.split('-').collect();
    let bucket_region = (parts.len() >= 2)
        .then(|| parts[parts.len() - 2..].join("-"))
        .filter(|r| crate::spec::gcp::check_region(r).is_ok())
        .unwrap_or_else(|| region.clone());
    let bucket_location = storage_location(&bucket_region);
    let controller = account(fleet, "controller");
    let worker = account(fleet, "worker");
    let sa = |email: &str| format!("serviceAccount:{email}");
    let secret = format!("{}-ssh-key", fleet.name);
    let job = format!("{}-controller", fleet.name);
    let repo = fleet.name.clone();
    let image = format!(
        "{region}-docker.pkg.dev/{p}/{repo}/controller:{}",
        inputs.epoch
    );
    let mut steps = vec![Step::Send {
        what: "enable the services the runner uses".into(),
        request: Request::post(
            format!("https://serviceusage.googleapis.com/v1/projects/{p}/services:batchEnable"),
            json!({ "serviceIds": SERVICES }),
        )
        .operation(600),
    }];
    steps.push(Step::Ensure {
        what: format!("runner bucket gs://{bucket} in {bucket_location}"),
        check: Request::get(format!(
            "https://storage.googleapis.com/storage/v1/b/{bucket}?fields=name"
        )),
        create: Request::post(
            format!("https://storage.googleapis.com/storage/v1/b?project={p}"),
            json!({
                "name": bucket,
                "location": bucket_location,
                "iamConfiguration": {
                    "uniformBucketLevelAccess": {"enabled": true},
                    "publicAccessPrevention": "enforced"
                }
            }),
        ),
    });
    if fleet.ssh_transport == SshTransport::Iap {
        steps.push(Step::Ensure {
            what: format!("firewall {}-iap-ssh: SSH from IAP only", fleet.name),
            check: Request::get(format!(
                "https://compute.googleapis.com/compute/v1/projects/{p}/global/firewalls/{}-iap-ssh",
                fleet.name
            )),
            create: Request::post(
                format!("https://compute.googleapis.com/compute/v1/projects/{p}/global/firewalls"),
                json!({
                    "name": format!("{}-iap-ssh", fleet.name),
                    "network": format!("projects/{p}/global/networks/{}", fleet.network),
                    "direction": "INGRESS",
                    "sourceRanges": [IAP_RANGE],
                    "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
                    "targetServiceAccounts": [worker],
                }),
            )
            .compute_operation(300),
        });
    }
    steps.push(Step::Ensure {
        what: format!(
            "Firestore database (default) in {}",
            fleet.firestore_location
        ),
        check: Request::get(format!(
            "https://firestore.googleapis.com/v1/projects/{p}/databases/(default)"
        )),
        create: Request::post(
            format!(
                "https://firestore.googleapis.com/v1/projects/{p}/databases?databaseId=(default)"
            ),
            json!({"locationId": fleet.firestore_location, "type": "FIRESTORE_NATIVE"}),
        )
        .operation(600),
    });
    for (who, email) in [("controller", &controller), ("worker", &worker)] {
        steps.push(Step::Ensure {
            what: format!("service account {email}"),
            check: Request::get(format!(
                "https://iam.googleapis.com/v1/projects/{p}/serviceAccounts/{email}"
            )),
            create: Request::post(
                format!("https://iam.googleapis.com/v1/projects/{p}/serviceAccounts"),
                json!({
                    "accountId": format!("{}-{who}", fleet.name),
                    "serviceAccount": {"displayName": format!("tpu-runner {} {who}", fleet.name)}
                }),
            ),
        });
    }
    let role = role_id(fleet);
    steps.push(Step::Ensure {
        what: format!("custom role {role}: exactly the TPU calls the controller makes"),
        check: Request::get(format!(
            "https://iam.googleapis.com/v1/projects/{p}/roles/{role}"
        )),
        create: Request::post(
            format!("https://iam.googleapis.com/v1/projects/{p}/roles"),
            json!({
                "roleId": role,
                "role": {
                    "title": format!("tpu-runner {} controller", fleet.name),
                    "includedPermissions": CONTROLLER_TPU_PERMISSIONS,
                    "stage": "GA"
                }
            }),
        ),
    });
    steps.push(Step::Grant {
        what: "project: the controller's TPU role, Firestore on its database, log writing; the worker's log writing".into(),
        resource: format!("https://cloudresourcemanager.googleapis.com/v3/projects/{p}"),
        iam: IamApi::ResourceManager,
        bindings: vec![
            Binding {
                role: format!("projects/{p}/roles/{role}"),
                member: sa(&controller),
                condition: None,
            },
            Binding {
                role: "roles/datastore.user".into(),
                member: sa(&controller),
                condition: Some(json!({
                    "title": "the fleet's database only",
                    "expression": format!("resource.name == \"projects/{p}/databases/(default)\"")
                })),
            },
            Binding {
                role: "roles/logging.logWriter".into(),
                member: sa(&controller),
                condition: None,
            },
            Binding {
                role: "roles/logging.logWriter".into(),
                member: sa(&worker),
                condition: None,
            },
        ]
        .into_iter()
        // IAP fleets: the controller opens TCP tunnels (port 22 only) to the workers.
        .chain((fleet.ssh_transport == SshTransport::Iap).then(|| Binding {
            role: "roles/iap.tunnelResourceAccessor".into(),
            member: sa(&controller),
            condition: Some(json!({
                "title": "SSH only",
                "expression": "destination.port == 22"
            })),
        }))
        .collect(),
    });
    steps.push(Step::Grant {
        what: "the worker account: the controller may create TPUs that run as it".into(),
        resource: format!("https://iam.googleapis.com/v1/projects/{p}/serviceAccounts/{worker}"),
        iam: IamApi::ServiceAccount,
        bindings: vec![Binding {
            role: "roles/iam.serviceAccountUser".into(),
            member: sa(&controller),
            condition: None,
        }],
    });
    steps.push(Step::Grant {
        what: format!(
            "runner bucket gs://{bucket}: both accounts read (agent, startup script, fleet)"
        ),
        resource: format!("https://storage.googleapis.com/storage/v1/b/{bucket}"),
        iam: IamApi::Storage,
        bindings: vec![
            Binding {
                role: "roles/storage.objectViewer".into(),
                member: sa(&controller),
                condition: None,
            },
            Binding {
                role: "roles/storage.objectViewer".into(),
                member: sa(&worker),
                condition: None,
            },
        ],
    });
    for job_bucket in &inputs.job_buckets {
        let b = bucket_name(job_bucket);
        steps.push(Step::Grant {
            what: format!("job bucket gs://{b}: workers write statuses, logs and checkpoints; the controller reads them"),
            resource: format!("https://storage.googleapis.com/storage/v1/b/{b}"),
            iam: IamApi::Storage,
            bindings: vec![
                Binding {
                    role: "roles/storage.objectUser".into(),
                    member: sa(&worker),
                    condition: None,
                },
                Binding {
                    role: "roles/storage.objectViewer".into(),
                    member: sa(&controller),
                    condition: None,
                },
            ],
        });
    }
    let secrets = format!("https://secretmanager.googleapis.com/v1/projects/{p}/secrets");
    steps.push(Step::Ensure {
        what: format!("secret {secret} (the controller's SSH key)"),
        check: Request::get(format!("{secrets}/{secret}")),
        create: Request::post(
            format!("{secrets}?secretId={secret}"),
            json!({"replication": {"automatic": {}}, "labels": {"managed-by": fleet.name}}),
        ),
    });
    steps.push(Step::Ensure {
        what: format!("a version of {secret}: an ed25519 key generated here, never printed"),
        check: Request::get(format!("{secrets}/{secret}/versions/latest")),
        create: Request::post(
            format!("{secrets}/{secret}:addVersion"),
            json!({"payload": {"data": "<generated ed25519 private key, base64>"}}),
        ),
    });
    steps.push(Step::Upload {
        what: "the controller's public key (workers authorize it), when this deploy made the key"
            .into(),
        uri: format!("gs://{bucket}/artifacts/ssh-key.pub"),
        source: "ssh-public-key".into(),
    });
    steps.push(Step::Grant {
        what: format!("secret {secret}: the controller reads it"),
        resource: format!("{secrets}/{secret}"),
        iam: IamApi::SecretManager,
        bindings: vec![Binding {
            role: "roles/secretmanager.secretAccessor".into(),
            member: sa(&controller),
            condition: None,
        }],
    });
    for s in &fleet.worker_secrets {
        steps.push(Step::Grant {
            what: format!("worker secret {s}: the workers read it"),
            resource: format!("{secrets}/{s}"),
            iam: IamApi::SecretManager,
            bindings: vec![Binding {
                role: "roles/secretmanager.secretAccessor".into(),
                member: sa(&worker),
                condition: None,
            }],
        });
    }
    steps.push(Step::Upload {
        what: "the worker agent (this binary); workers check its SHA-256".into(),
        uri: format!("gs://{bucket}/artifacts/tpu-runner"),
        source: "agent".into(),
    });
    steps.push(Step::Upload {
        what: "the agent's SHA-256".into(),
        uri: format!("gs://{bucket}/artifacts/tpu-runner.sha256"),
        source: "agent-sha256".into(),
    });
    steps.push(Step::Upload {
        what: "the startup script TPUs run at boot (it checks the agent's SHA-256)".into(),
        uri: format!("gs://{bucket}/artifacts/startup.sh"),
        source: "startup".into(),
    });
    steps.push(Step::Upload {
        what: format!(
            "the fleet the controller reads, with its policy: {}",
            fleet.policy.describe()
        ),
        uri: format!("gs://{bucket}/specs/deployment.yaml"),
        source: "deployment".into(),
    });
    steps.push(Step::Upload {
        what: "the controller image's build context (a Dockerfile and this binary)".into(),
        uri: format!("gs://{bucket}/artifacts/controller-image.tar.gz"),
        // An IAP fleet's controller opens its tunnels with gcloud: its image carries it.
        source: if fleet.ssh_transport == SshTransport::Iap {
            "image-context-gcloud".into()
        } else {
            "image-context".into()
        },
    });
    steps.push(Step::Ensure {
        what: format!("Artifact Registry repository {repo} in {region}"),
        check: Request::get(format!(
            "https://artifactregistry.googleapis.com/v1/projects/{p}/locations/{region}/repositories/{repo}"
        )),
        create: Request::post(
            format!("https://artifactregistry.googleapis.com/v1/projects/{p}/locations/{region}/repositories?repositoryId={repo}"),
            json!({"format": "DOCKER"}),
        )
        .operation(300),
    });
    steps.push(Step::Send {
        what: format!("build the controller image {image}"),
        request: Request::post(
            format!("https://cloudbuild.googleapis.com/v1/projects/{p}/locations/{region}/builds"),
            json!({
                "source": {"storageSource": {"bucket": bucket, "object": "artifacts/controller-image.tar.gz"}},
                "steps": [{"name": "gcr.io/cloud-builders/docker", "args": ["build", "-t", image, "."]}],
                "images": [image],
                "timeout": format!("{BUILD_TIMEOUT_SECS}s"),
            }),
        )
        // The build's own timeout, then time for Cloud Build to say so.
        .operation(BUILD_TIMEOUT_SECS + 300),
    });
    steps.push(Step::SetEpoch {
        what: format!(
            "set the deployment epoch to {} in the store (older controllers are fenced from now on)",
            inputs.epoch
        ),
        epoch: inputs.epoch.clone(),
    });
    let env = |name: &str, value: &str| json!({"name": name, "value": value});
    let template = json!({
        "template": {
            "taskCount": 1,
            "template": {
                "serviceAccount": controller,
                "timeout": format!("{}s", duration_secs(&fleet.controller_timeout)),
                "maxRetries": fleet.controller_max_retries,
                "containers": [{
                    "image": image,
                    "args": ["controller", "--exit-when-idle", "--wait-for-lease", "--log-json"],
                    "resources": {"limits": {"memory": fleet.controller_memory, "cpu": "1"}},
                    "env": [
                        env("TPU_RUNNER_DEPLOYMENT", &format!("gs://{bucket}/specs/deployment.yaml")),
                        env("TPU_RUNNER_STORE", "firestore"),
                        env("TPU_RUNNER_SSH_USER", "tpurunner"),
                        env("TPU_RUNNER_CONTROLLER_EPOCH", &inputs.epoch),
                        {"name": "TPU_RUNNER_SSH_PRIVATE_KEY", "valueSource": {"secretKeyRef": {"secret": secret, "version": "latest"}}},
                    ],
                }],
            },
        },
    });
    let jobs = format!("https://run.googleapis.com/v2/projects/{p}/locations/{region}/jobs");
    steps.push(Step::Ensure {
        what: format!("Cloud Run job {job}"),
        check: Request::get(format!("{jobs}/{job}")),
        create: Request::post(format!("{jobs}?jobId={job}"), template.clone()).operation(300),
    });
    steps.push(Step::Send {
        what: format!("point {job} at the new image and epoch"),
        request: Request {
            method: "PATCH",
            url: format!("{jobs}/{job}"),
            body: Some(template),
            reply: Reply::Operation { deadline_secs: 300 },
        },
    });
    steps.push(Step::Send {
        what: format!("run {job} (it hands off from any older execution through the lease)"),
        request: run_controller(fleet, "https://run.googleapis.com"),
    });
    steps
}

/// `jobs.run` of the fleet's Cloud Run controller job at `base` (Cloud Run, or an
/// emulator): its operation is the execution, done only when the controller stops, so it is
/// started, not waited for. `deploy` ends with it; `submit` sends it to wake the controller.
pub fn run_controller(fleet: &FleetSpec, base: &str) -> Request {
    Request {
        reply: Reply::Started,
        ..Request::post(
            format!(
                "{}/v2/projects/{}/locations/{}/jobs/{}-controller:run",
                base.trim_end_matches('/'),
                fleet.project,
                fleet.controller_region,
                fleet.name
            ),
            json!({}),
        )
    }
}

/// Seconds of a validated duration (`168h`, `90m`, `3600s`).
fn duration_secs(text: &str) -> u64 {
    let (number, unit) = text.split_at(text.len().saturating_sub(1));
    let n: u64 = number.parse().unwrap_or(0);
    match unit {
        "h" => n * 3600,
        "m" => n * 60,
        _ => n,
    }
}

/// How the dry run says a call's operation is followed.
fn awaits(reply: Reply) -> String {
    match reply {
        Reply::Resource => String::new(),
        Reply::Operation { deadline_secs } | Reply::ComputeOperation { deadline_secs } => {
            format!(
                " (an operation: waited for, {} min at most)",
                deadline_secs / 60
            )
        }
        Reply::Started => " (an operation: started, not waited for)".into(),
    }
}

/// The plan as `--dry-run` prints it: one line per call, in order.
pub fn render(steps: &[Step]) -> String {
    let mut out = String::new();
    for (i, step) in steps.iter().enumerate() {
        let n = i + 1;
        match step {
            Step::Ensure {
                what,
                check,
                create,
            } => out.push_str(&format!(
                "{n:>2}. {what}\n    {} {}\n    if absent: {} {}{}\n",
                check.method,
                check.url,
                create.method,
                create.url,
                awaits(create.reply)
            )),
            Step::Grant {
                what,
                resource,
                iam,
                bindings,
            } => {
                let (get, set) = (iam.read(resource), iam.write(resource, json!({})));
                out.push_str(&format!("{n:>2}. {what}\n    {} {}\n", get.method, get.url));
                for b in bindings {
                    out.push_str(&format!(
                        "      + {} → {}{}\n",
                        b.role,
                        b.member,
                        if b.condition.is_some() { " (conditional)" } else { "" }
                    ));
                }
                out.push_str(&format!(
                    "    if any is missing: {} {}\n",
                    set.method, set.url
                ));
            }
            Step::Send { what, request } => out.push_str(&format!(
                "{n:>2}. {what}\n    {} {}{}\n",
                request.method,
                request.url,
                awaits(request.reply)
            )),
            Step::SetEpoch { what, .. } => out.push_str(&format!(
                "{n:>2}. {what}\n    through the Firestore store (`<runner>_lease_epochs/controller`)\n"
            )),
            Step::Upload { what, uri, .. } => out.push_str(&format!(
                "{n:>2}. {what}\n    upload {uri} (replaced only if it differs)\n"
            )),
        }
    }
    out
}
