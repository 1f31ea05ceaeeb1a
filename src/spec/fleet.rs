//! The fleet (`deployment.yaml`): the runner's settings and its TPU entries, validated with
//! every rule of the original plus the fixes listed in ARCHITECTURE.md. Reading never stops
//! at the first problem. Must not touch the network or the cloud.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::diagnostic::SpecErrors;
use super::gcp::{self, ProvisioningModel, TpuType};
use super::names::{self, Name};
use super::policy::{self, PolicySpec};
use super::yaml::{self, Checker, Node, Place, Value};

/// The most TPUs one managed entry may declare (every ordinal has a name the controller
/// reads; 4,096 slices is beyond any TPU quota a single zone grants).
pub const MAX_ENTRY_COUNT: u32 = 4096;

/// A validated fleet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetSpec {
    /// Runner name (a slug); prefixes every generated resource.
    pub name: String,
    /// GCP project id.
    pub project: String,
    /// Region of the controller (Cloud Run job).
    pub controller_region: String,
    /// Cloud Run task timeout, as written (`168h`).
    pub controller_timeout: String,
    /// Firestore location.
    pub firestore_location: String,
    /// VPC network for TPUs.
    pub network: String,
    /// VPC subnetwork for TPUs.
    pub subnetwork: String,
    /// Runner bucket (`gs://…`), given or derived.
    pub bucket: String,
    /// Controller memory (`1Gi`).
    pub controller_memory: String,
    /// Cloud Run task retries (0–10).
    pub controller_max_retries: u32,
    /// How the controller reaches TPU workers.
    pub ssh_transport: SshTransport,
    /// Seconds an idle managed TPU is kept before deletion.
    pub idle_timeout_seconds: u64,
    /// Secret Manager secrets workers may read.
    pub worker_secrets: Vec<String>,
    /// TPU entries, in file order.
    pub tpus: Vec<TpuEntry>,
    /// The policy the controller runs, its parameters and the engine's timings (`policy:`;
    /// `classic` with the default timings when absent).
    #[serde(default)]
    pub policy: PolicySpec,
    /// How long the store keeps events (`event_retention`, default 30 days): older ones are
    /// deleted a few at a time by the controller's passes.
    #[serde(default = "default_event_retention")]
    pub event_retention_secs: i64,
}

/// Events are kept 30 days unless the fleet says otherwise: a month of history to capture
/// and report on, at a few hundred bytes per event.
pub const DEFAULT_EVENT_RETENTION_SECS: i64 = 30 * 86_400;

fn default_event_retention() -> i64 {
    DEFAULT_EVENT_RETENTION_SECS
}

/// How the controller reaches workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SshTransport {
    /// SSH to a public IP.
    Direct,
    /// SSH through an IAP TCP tunnel.
    Iap,
}

/// One TPU entry of the fleet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TpuEntry {
    /// Unique entry id (given, or `slug(type)-slug(zone)-<1-based index>`).
    pub id: Name,
    /// Accelerator type.
    #[serde(rename = "type")]
    pub tpu_type: TpuType,
    /// Zone.
    pub zone: Name,
    /// Spot, on-demand or reserved.
    pub provisioning_model: ProvisioningModel,
    /// The reservation a `reserved` entry's TPUs are created in (its last name segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// Chip ceiling shared by every entry with the same (model, family, zone): the quota
    /// the user is willing to use there (required, as in the original).
    pub chip_limit: u32,
    /// Managed TPUs kept provisioned even without demand.
    pub keep_warm_count: u32,
    /// Software version for created TPUs.
    pub runtime: Option<String>,
    /// Adopted or managed.
    #[serde(flatten)]
    pub kind: EntryKind,
}

/// Whether tpu-runner creates this entry's TPUs or adopts one that exists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum EntryKind {
    /// tpu-runner creates up to `count` TPUs of the entry's model through queued resources.
    Managed {
        /// Ceiling on TPUs of this entry.
        count: u32,
    },
    /// An existing TPU named `existing`, used as is and never deleted.
    Adopted {
        /// The TPU's node name.
        existing: String,
    },
}

/// Key under which chip limits are shared.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct QuotaKey {
    /// Provisioning model.
    pub model: ProvisioningModel,
    /// Quota family (`v5e` for `v5litepod`).
    pub family: String,
    /// Zone.
    pub zone: String,
}

impl TpuEntry {
    /// True for an adopted (existing) TPU.
    pub fn is_adopted(&self) -> bool {
        matches!(self.kind, EntryKind::Adopted { .. })
    }

    /// Ceiling on TPUs of this entry: 1 for adopted, `count` for managed.
    pub fn ceiling(&self) -> u32 {
        match self.kind {
            EntryKind::Adopted { .. } => 1,
            EntryKind::Managed { count } => count,
        }
    }

    /// The most chips this entry may hold: chips per TPU × its ceiling.
    pub fn declared_chips(&self) -> u64 {
        u64::from(self.chips_per_tpu()) * u64::from(self.ceiling())
    }

    /// Chips in one TPU of this entry.
    pub fn chips_per_tpu(&self) -> u32 {
        self.tpu_type.chips()
    }

    /// Region of the entry's zone.
    pub fn region(&self) -> &str {
        gcp::zone_region(&self.zone).unwrap_or(&self.zone)
    }

    /// The quota key this entry counts against.
    pub fn quota_key(&self) -> QuotaKey {
        QuotaKey {
            model: self.provisioning_model,
            family: self.tpu_type.quota_family().to_owned(),
            zone: self.zone.to_string(),
        }
    }

    /// The node names this entry declares: the adopted name, or ordinals `1..=count`.
    pub fn declared_node_names(&self, runner: &str) -> Vec<String> {
        match &self.kind {
            EntryKind::Adopted { existing } => vec![existing.clone()],
            EntryKind::Managed { count } => {
                (1..=*count).map(|k| self.node_name(runner, k)).collect()
            }
        }
    }

    /// The generated node name of managed ordinal `k` (1-based).
    pub fn node_name(&self, runner: &str, k: u32) -> String {
        names::managed_node_name(runner, &self.id, &self.tpu_type.to_string(), &self.zone, k)
    }
}

impl FleetSpec {
    /// Chip limits by quota key.
    pub fn chip_limits(&self) -> BTreeMap<QuotaKey, u32> {
        self.tpus
            .iter()
            .map(|e| (e.quota_key(), e.chip_limit))
            .collect()
    }

    /// The entry with id `id`.
    pub fn entry(&self, id: &str) -> Option<&TpuEntry> {
        self.tpus.iter().find(|e| e.id == id)
    }
}

const TOP_LEVEL: &[&str] = &[
    "name",
    "project",
    "controller_region",
    "controller_timeout",
    "firestore_location",
    "network",
    "subnetwork",
    "tpus",
    "bucket",
    "controller_memory",
    "controller_max_retries",
    "ssh_transport",
    "idle_timeout_seconds",
    "worker_secrets",
    "policy",
    "event_retention",
];

const ENTRY_FIELDS: &[&str] = &[
    "id",
    "type",
    "zone",
    "count",
    "existing",
    "runtime",
    "provisioning_model",
    "reservation",
    "chip_limit",
    "keep_warm_count",
];

/// Longest runner name: `<name>-controller` must fit a 30-character service account id.
pub const RUNNER_NAME_MAX: usize = 19;

/// Parses and validates a fleet file. `file` names it in errors.
pub fn parse_fleet(file: &str, source: &str) -> Result<FleetSpec, SpecErrors> {
    let root = yaml::parse(file, source)?;
    let mut c = Checker::new(source);
    let fleet = read_fleet(&mut c, &root);
    c.finish(file, fleet)
        .and_then(|f| f.ok_or_else(|| super::incomplete(file, source)))
}

fn read_fleet(c: &mut Checker<'_>, root: &Node) -> Option<FleetSpec> {
    if matches!(root.value, Value::Null) {
        c.error_hint(
            root,
            "",
            "the file is empty; expected a fleet mapping",
            "run `tpu-runner init` to write a commented example",
        );
        return None;
    }
    let rejected = [
        (
            "tpu",
            "the fleet lists TPUs under `tpus:`, a list of entries",
        ),
        (
            "jobs",
            "this looks like a job manifest; validate it with `tpu-runner validate-jobs`",
        ),
    ];
    let f = c.mapping(root, "", "the fleet", TOP_LEVEL, &rejected)?;

    let name = f.required(c, "name", "the runner name, e.g. `my-runner`").and_then(|n| {
        let name = c.nonempty_string(n, "name", "a non-empty string")?;
        let slugged = names::slug(&name);
        if slugged != name {
            c.error_hint(n, "name", format!("runner name {} is not a slug", yaml::quote(&name)), format!("use `{slugged}`: lowercase letters, digits and single hyphens"));
            return None;
        }
        if !name.starts_with(|ch: char| ch.is_ascii_lowercase()) || name.len() > RUNNER_NAME_MAX {
            c.error_hint(
                n,
                "name",
                format!("expected a runner name of at most {RUNNER_NAME_MAX} characters starting with a letter, found {}", yaml::quote(&name)),
                "the name prefixes service accounts (`<name>-controller`, at most 30 characters) and Cloud Run jobs",
            );
            return None;
        }
        Some(name)
    });
    let project = f
        .required(c, "project", "your GCP project id")
        .and_then(|n| {
            let p = c.nonempty_string(n, "project", "a GCP project id")?;
            gcp::check_project(&p)
                .map_err(|e| c.expected(n, "project", &e))
                .ok()?;
            Some(p)
        });
    let controller_region = f
        .required(c, "controller_region", "a region such as `us-central1`")
        .and_then(|n| {
            let r = c.nonempty_string(n, "controller_region", "a region such as `us-central1`")?;
            gcp::check_region(&r)
                .map_err(|e| c.expected(n, "controller_region", &e))
                .ok()?;
            Some(r)
        });
    let controller_timeout = f
        .required(c, "controller_timeout", "a duration such as `168h`")
        .and_then(|n| {
            let t = c.nonempty_string(n, "controller_timeout", "a duration such as `168h`")?;
            check_task_timeout(&t)
                .map_err(|e| {
                    c.error_hint(
                        n,
                        "controller_timeout",
                        format!("expected {e}, found {}", yaml::quote(&t)),
                        "Cloud Run jobs allow at most 168h",
                    )
                })
                .ok()?;
            Some(t)
        });
    let firestore_location = f
        .required(
            c,
            "firestore_location",
            "a Firestore location such as `nam5` or `us-central1`",
        )
        .and_then(|n| {
            let l = c.nonempty_string(n, "firestore_location", "a Firestore location")?;
            if !l
                .chars()
                .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-')
            {
                c.expected(
                    n,
                    "firestore_location",
                    "a Firestore location such as `nam5` or `us-central1`",
                );
                return None;
            }
            Some(l)
        });
    let network = f
        .required(c, "network", "a VPC network name, e.g. `default`")
        .and_then(|n| c.nonempty_string(n, "network", "a non-empty network name"));
    let subnetwork = f
        .required(c, "subnetwork", "a subnetwork name, e.g. `default`")
        .and_then(|n| c.nonempty_string(n, "subnetwork", "a non-empty subnetwork name"));

    let tpus_node = f.required(c, "tpus", "a list of TPU entries");
    let tpus_list =
        tpus_node.and_then(|n| c.list(n, "tpus", "a non-empty list of TPU entries", false));

    let bucket = match f.get("bucket") {
        Some(n) => c
            .string(n, "bucket", "a bucket URI such as `gs://my-bucket`")
            .and_then(|b| {
                gcp::normalize_bucket_uri(&b)
                    .map_err(|e| c.expected(n, "bucket", &e))
                    .ok()
            }),
        None => match (&project, &name) {
            (Some(p), Some(r)) => Some(format!("gs://{}", names::default_bucket_name(p, r))),
            _ => None,
        },
    };
    let controller_memory = match f.get("controller_memory") {
        Some(n) => c.string(n, "controller_memory", "a memory size such as `1Gi` or `512Mi`").and_then(|m| {
            let m = m.trim().to_owned();
            let ok = m
                .strip_suffix("Mi")
                .or_else(|| m.strip_suffix("Gi"))
                .is_some_and(|d| !d.is_empty() && !d.starts_with('0') && d.chars().all(|ch| ch.is_ascii_digit()));
            if !ok {
                c.expected(n, "controller_memory", "a memory size such as `1Gi` or `512Mi` (a positive integer, then Mi or Gi)");
                return None;
            }
            Some(m)
        }),
        None => Some("1Gi".to_owned()),
    };
    let controller_max_retries = match f.get("controller_max_retries") {
        Some(n) => c
            .integer(
                n,
                "controller_max_retries",
                0,
                10,
                "an integer from 0 to 10",
            )
            .map(|v| v as u32),
        None => Some(3),
    };
    let ssh_transport = match f.get("ssh_transport") {
        Some(n) => c
            .string(n, "ssh_transport", "`direct` or `iap`")
            .and_then(|t| match t.trim().to_lowercase().as_str() {
                "direct" => Some(SshTransport::Direct),
                "iap" => Some(SshTransport::Iap),
                _ => {
                    c.expected(n, "ssh_transport", "`direct` or `iap`");
                    None
                }
            }),
        None => Some(SshTransport::Direct),
    };
    let idle_timeout_seconds = match f.get("idle_timeout_seconds") {
        Some(n) => c
            .integer(
                n,
                "idle_timeout_seconds",
                0,
                i64::MAX,
                "a whole number of seconds, 0 or more",
            )
            .map(|v| v as u64),
        None => Some(600),
    };
    let worker_secrets = match f.get("worker_secrets") {
        Some(n) => c
            .list(
                n,
                "worker_secrets",
                "a list of Secret Manager secret names",
                true,
            )
            .map(|items| {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let path = yaml::index("worker_secrets", i);
                    if let Some(s) = c.nonempty_string(item, path, "a non-empty secret name") {
                        match gcp::check_secret_name(&s) {
                            Ok(()) => out.push(s),
                            Err(e) => c.expected(item, path, &e),
                        }
                    }
                }
                c.unique(
                    items.iter().enumerate().filter_map(|(i, n)| {
                        n.as_str()
                            .map(|s| (s.trim().to_owned(), n, yaml::index("worker_secrets", i)))
                    }),
                    "secret",
                );
                out
            }),
        None => Some(Vec::new()),
    };

    let policy = match f.get("policy") {
        Some(n) => policy::read_policy(
            c,
            n,
            "policy",
            &PolicySpec::default(),
            Some(policy::PolicyName::Classic),
        ),
        None => Some(PolicySpec::default()),
    };

    let event_retention_secs = match f.get("event_retention") {
        // From an hour (a capture needs some history) to ten years.
        Some(n) => policy::duration(c, n, "event_retention", 3600, 3650 * 86_400),
        None => Some(DEFAULT_EVENT_RETENTION_SECS),
    };

    let entries = tpus_list
        .map(|items| read_entries(c, items))
        .unwrap_or_default();

    Some(FleetSpec {
        name: name?,
        project: project?,
        controller_region: controller_region?,
        controller_timeout: controller_timeout?,
        firestore_location: firestore_location?,
        network: network?,
        subnetwork: subnetwork?,
        bucket: bucket?,
        controller_memory: controller_memory?,
        controller_max_retries: controller_max_retries?,
        ssh_transport: ssh_transport?,
        idle_timeout_seconds: idle_timeout_seconds?,
        worker_secrets: worker_secrets?,
        tpus: entries.into_iter().map(|(e, _, _)| e).collect(),
        policy: policy?,
        event_retention_secs: event_retention_secs?,
    })
}

/// Cloud Run task timeouts: a positive integer followed by `s`, `m` or `h`, at most 168h.
fn check_task_timeout(text: &str) -> Result<(), String> {
    const EXPECTED: &str = "a duration such as `168h`, `90m` or `3600s`";
    let unit = text.chars().last().ok_or(EXPECTED)?;
    let digits = &text[..text.len() - 1];
    let value: u64 = digits.parse().map_err(|_| EXPECTED.to_owned())?;
    if value == 0 {
        return Err("a positive duration such as `168h`, `90m` or `3600s` (0 is not one)".into());
    }
    if digits.starts_with('0') || digits.starts_with('+') {
        return Err(EXPECTED.into());
    }
    let seconds = match unit {
        's' => value,
        'm' => value.saturating_mul(60),
        'h' => value.saturating_mul(3600),
        _ => return Err(EXPECTED.into()),
    };
    if seconds > 168 * 3600 {
        return Err("a duration of at most 168h".into());
    }
    Ok(())
}

/// A validated entry with its node and 0-based position in `tpus`.
type Located<'n> = (TpuEntry, &'n Node, usize);

fn read_entries<'n>(c: &mut Checker<'_>, items: &'n [Node]) -> Vec<Located<'n>> {
    let mut entries = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = yaml::index("tpus", i);
        if let Some(entry) = read_entry(c, item, path, i + 1) {
            entries.push((entry, item, i));
        }
    }
    c.unique(
        entries.iter().map(|(e, n, i)| {
            (
                e.id.to_string(),
                yaml::field(n, "id").unwrap_or(n),
                field_path(*i, "id"),
            )
        }),
        "entry id",
    );
    check_adopted_names(c, &entries);
    check_chip_limits(c, &entries);
    entries
}

fn field_path(i: usize, field: &str) -> String {
    yaml::join(yaml::index("tpus", i), field).to_string()
}

fn read_entry(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    index_1based: usize,
) -> Option<TpuEntry> {
    let rejected = [
        (
            "keep_warm",
            "`keep_warm` was replaced by `keep_warm_count`, an integer",
        ),
        (
            "name",
            "adopt an existing TPU with `existing: <name>`; managed TPU names are generated",
        ),
    ];
    let f = c.mapping(node, path, "a TPU entry", ENTRY_FIELDS, &rejected)?;
    let errors_before = c.error_count();

    let zone = f
        .required(c, "zone", "a zone such as `us-central2-b`")
        .and_then(|n| {
            if matches!(n.value, Value::Seq(_)) {
                c.error_hint(
                    n,
                    f.path("zone"),
                    "expected one zone, found a list",
                    "write one entry per zone",
                );
                return None;
            }
            let z = c.nonempty_string(n, f.path("zone"), "a zone such as `us-central2-b`")?;
            if let Err(e) = gcp::zone_region(&z) {
                let hint = if gcp::check_region(&z).is_ok() {
                    format!("`{z}` is a region; add the zone letter, e.g. `{z}-a`")
                } else {
                    "zones look like `us-central2-b`, `europe-west4-a`".to_owned()
                };
                c.error_hint(
                    n,
                    f.path("zone"),
                    format!("expected {e}, found {}", yaml::quote(&z)),
                    hint,
                );
                return None;
            }
            Some(z)
        });
    let tpu_type = f
        .required(c, "type", "an accelerator type such as `v6e-16`")
        .and_then(|n| {
            let t = c.nonempty_string(n, f.path("type"), "a TPU type such as `v6e-16`")?;
            TpuType::parse(&t)
                .map_err(|e| {
                    c.error(
                        n,
                        f.path("type"),
                        format!("expected {e}, found {}", yaml::quote(&t)),
                    )
                })
                .ok()
        });
    const MODELS: &str = "`spot`, `on-demand` or `reserved`";
    let provisioning_model = match f.get("provisioning_model") {
        Some(n) => c
            .string(n, f.path("provisioning_model"), MODELS)
            .and_then(|m| match ProvisioningModel::parse(&m) {
                Some(model) => Some(model),
                None => {
                    c.expected(n, f.path("provisioning_model"), MODELS);
                    None
                }
            }),
        None => Some(ProvisioningModel::Spot),
    };
    let reservation = f.get("reservation").and_then(|n| {
        let name = c.nonempty_string(n, f.path("reservation"), "a reservation name")?;
        if let Err(e) = gcp::check_reservation_name(&name) {
            c.expected(n, f.path("reservation"), &e);
            return None;
        }
        if provisioning_model.is_some_and(|m| m != ProvisioningModel::Reserved) {
            c.error_hint(
                n,
                f.path("reservation"),
                "`reservation` applies only to `provisioning_model: reserved`",
                "remove it, or set `provisioning_model: reserved`",
            );
            return None;
        }
        Some(name)
    });
    let chip_limit = f
        .required(
            c,
            "chip_limit",
            "the chips you are willing to use for this provisioning model, TPU family and zone, e.g. `chip_limit: 32`",
        )
        .and_then(|n| {
            c.integer(
                n,
                f.path("chip_limit"),
                1,
                u32::MAX as i64,
                "a positive integer (a number of chips)",
            )
            .map(|v| v as u32)
        });
    let keep_warm_count = match f.get("keep_warm_count") {
        Some(n) => c
            .integer(
                n,
                f.path("keep_warm_count"),
                0,
                u32::MAX as i64,
                "an integer, 0 or more",
            )
            .map(|v| v as u32),
        None => Some(0),
    };
    let runtime = f.get("runtime").and_then(|n| {
        c.nonempty_string(
            n,
            f.path("runtime"),
            "a TPU software version such as `v2-alpha-tpuv6e`",
        )
    });
    let id = match f.get("id") {
        Some(n) => c.nonempty_string(n, f.path("id"), "an entry id (a slug)").and_then(|id| {
            let slugged = names::slug(&id);
            if slugged != id || id.len() > 63 {
                c.error_hint(
                    n,
                    f.path("id"),
                    format!("expected an entry id of at most 63 lowercase letters, digits and hyphens, found {}", yaml::quote(&id)),
                    format!("the id becomes the `fleet-entry` label on TPUs; try `{}`", &slugged[..slugged.len().min(63)]),
                );
                return None;
            }
            Some(id)
        }),
        None => match (&tpu_type, &zone) {
            (Some(t), Some(z)) => Some(names::default_entry_id(&t.to_string(), z, index_1based)),
            _ => None,
        },
    };

    let kind = match f.get("existing") {
        Some(n) => {
            let existing = c
                .nonempty_string(n, f.path("existing"), "the name of an existing TPU")
                .and_then(|e| {
                    gcp::check_node_name(&e)
                        .map_err(|err| c.expected(n, f.path("existing"), &err))
                        .ok()?;
                    Some(e)
                });
            if let Some(count) = f.get_raw("count") {
                c.error_hint(
                    count,
                    f.path("count"),
                    "`count` does not apply to an adopted TPU (`existing`)",
                    "an adopted entry is exactly one TPU; remove `count`",
                );
            }
            if let (Some(k), Some(kw)) = (keep_warm_count, f.get("keep_warm_count"))
                && k != 0
            {
                c.error_hint(
                    kw,
                    f.path("keep_warm_count"),
                    "an adopted TPU cannot have keep_warm_count",
                    "adopted TPUs are never created or deleted; remove `keep_warm_count`",
                );
            }
            existing.map(|existing| EntryKind::Adopted { existing })
        }
        None => {
            let count = f
                .required(c, "count", "the most TPUs of this entry, e.g. `count: 2`")
                .and_then(|n| {
                    c.integer(
                        n,
                        f.path("count"),
                        0,
                        i64::from(MAX_ENTRY_COUNT),
                        "an integer from 0 to 4096 (the most TPUs of this entry; split a larger fleet into several entries)",
                    )
                    .map(|v| v as u32)
                });
            if let Some(count) = count {
                if count > 0 && runtime.is_none() && f.get("runtime").is_none() {
                    c.error_hint(
                        f.node(),
                        f.path("runtime"),
                        "required field `runtime` is missing",
                        "managed TPUs need a software version, e.g. `runtime: v2-alpha-tpuv6e`",
                    );
                }
                if let (Some(kw), Some(n)) = (keep_warm_count, f.get("keep_warm_count"))
                    && kw > count
                {
                    c.error(
                        n,
                        f.path("keep_warm_count"),
                        format!("keep_warm_count {kw} is above count {count}"),
                    );
                }
            }
            if provisioning_model == Some(ProvisioningModel::Reserved)
                && f.get("reservation").is_none()
            {
                c.error_hint(
                    f.node(),
                    f.path("reservation"),
                    "required field `reservation` is missing",
                    "a managed `reserved` entry creates its TPUs in a reservation: name it, e.g. `reservation: my-v6e-reservation`",
                );
            }
            count.map(|count| EntryKind::Managed { count })
        }
    };

    if c.error_count() > errors_before {
        return None;
    }
    Some(TpuEntry {
        id: Name::new(&id?),
        tpu_type: tpu_type?,
        zone: Name::new(&zone?),
        provisioning_model: provisioning_model?,
        reservation,
        chip_limit: chip_limit?,
        keep_warm_count: keep_warm_count?,
        runtime,
        kind: kind?,
    })
}

fn check_adopted_names(c: &mut Checker<'_>, entries: &[Located<'_>]) {
    let mut seen: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    for (e, node, i) in entries {
        if let EntryKind::Adopted { existing } = &e.kind
            && let Some(first) = seen.insert((existing.as_str(), e.zone.as_str()), &e.id)
        {
            c.error(
                yaml::field(node, "existing").unwrap_or(node),
                &field_path(*i, "existing"),
                format!(
                    "TPU {} in {} is adopted twice (also by entry `{first}`)",
                    yaml::quote(existing),
                    e.zone
                ),
            );
        }
    }
}

fn check_chip_limits(c: &mut Checker<'_>, entries: &[Located<'_>]) {
    // All entries sharing a quota key must state the same chip_limit.
    let mut by_key: BTreeMap<QuotaKey, Vec<&Located<'_>>> = BTreeMap::new();
    for located in entries {
        by_key
            .entry(located.0.quota_key())
            .or_default()
            .push(located);
    }
    for (key, members) in by_key {
        let first = &members[0].0;
        let mut consistent = true;
        for (e, node, i) in &members[1..] {
            if e.chip_limit != first.chip_limit {
                consistent = false;
                c.error_hint(
                    yaml::field(node, "chip_limit").unwrap_or(node),
                    &field_path(*i, "chip_limit"),
                    format!(
                        "inconsistent chip_limit for {} {} {}: {} here, {} on entry `{}`",
                        key.model.as_str(),
                        key.family,
                        key.zone,
                        e.chip_limit,
                        first.chip_limit,
                        first.id
                    ),
                    "entries with the same provisioning model, TPU family and zone share one chip limit; give them all the same value",
                );
            }
        }
        if !consistent {
            continue;
        }
        let limit = first.chip_limit;
        let requested: u64 = members.iter().map(|(e, _, _)| e.declared_chips()).sum();
        if requested > u64::from(limit) {
            let ids: Vec<String> = members
                .iter()
                .map(|(e, _, _)| format!("`{}`", e.id))
                .collect();
            let (_, node, i) = members[0];
            c.error_hint(
                yaml::field(node, "chip_limit").unwrap_or(node),
                &field_path(*i, "chip_limit"),
                format!("{} {} {}: requested {requested} chips > limit {limit}", key.model.as_str(), key.family, key.zone),
                format!("entries {} may hold {requested} chips together; lower their counts or raise chip_limit", ids.join(", ")),
            );
        }
    }
}
