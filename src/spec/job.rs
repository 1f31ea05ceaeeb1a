//! The job manifest (`job.yaml`): one or more jobs, each validated with every rule of the
//! original plus the fixes in ARCHITECTURE.md; optionally cross-checked against a fleet.
//! Must not touch the network, the cloud or the bundle on disk.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::diagnostic::SpecErrors;
use super::fleet::{EntryKind, FleetSpec, TpuEntry};
use super::gcp::{self, TpuType};
use super::names;
use super::yaml::{self, Checker, Node, Place, Value};

/// A validated job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The job's id: given in the manifest (`id:`, used once), else its name until `submit`
    /// gives it a fresh run id (`NAME-xxxxxx`).
    pub id: String,
    /// The job's name (`name:`, else the manifest's folder): what `watch`, `logs` and
    /// `cancel` accept for its latest run. Absent: the id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// True when the manifest gave no `id`: each `submit` is a new run with a fresh id.
    /// Read from the manifest only; never stored.
    #[serde(skip)]
    pub fresh_id: bool,
    /// Acceptable TPU types.
    pub tpu: TpuRequest,
    /// Code bundle: a local directory, a local tar archive, or a `gs://` URI.
    #[serde(default = "default_bundle")]
    pub bundle: String,
    /// Shell command run with `bash -lc` on every TPU worker.
    pub command: String,
    /// Exact TPU to run on, if pinned.
    #[serde(default)]
    pub tpu_name: Option<String>,
    /// Zone to run in, if pinned.
    #[serde(default)]
    pub zone: Option<String>,
    /// Regional buckets, one per candidate region.
    pub buckets: Vec<String>,
    /// Opt-in caches kept on the TPU between jobs.
    #[serde(default)]
    pub caches: Vec<Cache>,
    /// Extra environment for the command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Scheduling priority.
    #[serde(default)]
    pub priority: Priority,
    /// Whether preemption or infrastructure failure requeues the job (true) or fails it.
    #[serde(default = "yes")]
    pub retry_on_infrastructure_failure: bool,
    /// Whether the checkpoint directory moves with the job when the fleet's policy moves it
    /// to another of its regions after repeated preemptions (copied to that region's bucket
    /// before its next attempt); false keeps it, and the job's bucket, where they are.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub move_checkpoints: bool,
}

fn default_bundle() -> String {
    ".".to_owned()
}

fn yes() -> bool {
    true
}

/// The TPU types a job accepts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TpuRequest {
    /// Any type (`tpu: any`).
    Any,
    /// Exactly one of these types (raced across every compatible entry).
    OneOf(Vec<TpuType>),
}

impl TpuRequest {
    /// True when `tpu_type` is acceptable.
    pub fn accepts(&self, tpu_type: &TpuType) -> bool {
        match self {
            TpuRequest::Any => true,
            TpuRequest::OneOf(types) => types.contains(tpu_type),
        }
    }
}

impl Serialize for TpuRequest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            TpuRequest::Any => serializer.serialize_str("any"),
            TpuRequest::OneOf(types) => types.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for TpuRequest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Many(Vec<TpuType>),
        }
        match Raw::deserialize(deserializer)? {
            Raw::One(s) if s == "any" => Ok(TpuRequest::Any),
            Raw::One(s) => TpuType::parse(&s)
                .map(|t| TpuRequest::OneOf(vec![t]))
                .map_err(serde::de::Error::custom),
            Raw::Many(types) => Ok(TpuRequest::OneOf(types)),
        }
    }
}

/// A cache directory kept on the TPU under `key`, linked into the job directory at `path`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cache {
    /// Cache name on the TPU.
    pub key: String,
    /// Relative path in the job directory.
    pub path: String,
}

/// Scheduling priority; higher runs first.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Runs after normal and high.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Runs first.
    High,
}

impl Priority {
    /// Rank used for ordering: low 0, normal 1, high 2.
    pub fn rank(self) -> u8 {
        self as u8
    }

    /// `low`, `normal` or `high`.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }

    /// Parses `low`, `normal` or `high` (trimmed, any case).
    pub fn parse(text: &str) -> Option<Priority> {
        match text.trim().to_lowercase().as_str() {
            "low" => Some(Priority::Low),
            "normal" => Some(Priority::Normal),
            "high" => Some(Priority::High),
            _ => None,
        }
    }
}

/// Variables tpu-runner sets for the command; a job may not set them.
pub const RESERVED_ENV: &[&str] = &[
    "HOST",
    "WORK_ROOT",
    "SHM_ROOT",
    "CACHE_ROOT",
    "JOB_DIR",
    "ATTEMPT_DIR",
    "SHM_DIR",
    "PROCESS_DIR",
    "PID_FILE",
    "CURRENT_ATTEMPT_ID",
    "JOB_ID",
    "ATTEMPT_ID",
    "JOB_SHM_DIR",
    "JOB_GCS_DIR",
    "JOB_BUCKET",
    "ATTEMPT_GCS_DIR",
    "CHECKPOINT_GCS_DIR",
    "RUNNER_PROJECT",
    "BUNDLE_SHA256",
    "TPU_WORKER_COUNT",
    // Beyond the original, which overwrote these silently:
    "TPU_NAME",
    "TPU_ZONE",
    "TPU_TYPE",
    "TPU_WORKER_HOST",
];

/// The one `TPU_RUNNER_*` variable a job may set: the root-disk floor in KiB.
pub const MIN_ROOT_FREE_KB: &str = "TPU_RUNNER_MIN_ROOT_FREE_KB";

const JOB_FIELDS: &[&str] = &[
    "id",
    "name",
    "tpu",
    "bundle",
    "command",
    "tpu_name",
    "zone",
    "buckets",
    "caches",
    "env",
    "priority",
    "retry_on_infrastructure_failure",
    "move_checkpoints",
];

const STORED_ONLY: &[(&str, &str)] = &[
    (
        "region",
        "`region` is set by tpu-runner when the job is first placed; list candidate regions through `buckets`",
    ),
    (
        "storage_region",
        "`storage_region` is set by tpu-runner when the job is first placed; list candidate regions through `buckets`",
    ),
    (
        "bucket",
        "`bucket` is chosen by tpu-runner from `buckets` when the job is placed",
    ),
    (
        "bucket_regions",
        "`bucket_regions` is computed by tpu-runner at submit",
    ),
    (
        "regional_bundles",
        "`regional_bundles` is computed by tpu-runner at submit",
    ),
];

/// How many characters `submit` adds to a name for a run's id (`-` and six letters or
/// digits), so a name is at most 128 − 7 long.
pub const RUN_SUFFIX_LEN: usize = 7;

/// Checks a job name: a job id short enough for a run suffix.
pub fn check_job_name(name: &str) -> Result<(), String> {
    if name.len() > 128 - RUN_SUFFIX_LEN {
        return Err(format!(
            "a job name of 1 to {} letters, digits, `.`, `_` or `-`, starting with a letter or digit (`submit` adds a run suffix)",
            128 - RUN_SUFFIX_LEN
        ));
    }
    check_job_id(name).map_err(|_| {
        format!(
            "a job name of 1 to {} letters, digits, `.`, `_` or `-`, starting with a letter or digit",
            128 - RUN_SUFFIX_LEN
        )
    })
}

/// The name of a manifest's `index`-th job that names none: its folder's name (`count`
/// unnamed jobs: with `-N`, 1-based), as a valid name.
pub fn default_job_name(folder: &str, index: usize, count: usize) -> String {
    // A slug is lowercase letters, digits and inner dashes, never empty.
    let mut base = if folder.trim().is_empty() {
        "job".to_owned()
    } else {
        names::slug(folder)
    };
    base.truncate(100);
    let base = base.trim_end_matches('-');
    if count > 1 {
        format!("{base}-{}", index + 1)
    } else {
        base.to_owned()
    }
}

impl JobSpec {
    /// The job's name (its id when it has none).
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }

    /// Names the jobs of a manifest in `folder` that have neither `id` nor `name`.
    pub fn name_unnamed(jobs: &mut [JobSpec], folder: &str) {
        let count = jobs
            .iter()
            .filter(|j| j.fresh_id && j.name.is_none())
            .count();
        let unnamed = jobs.iter_mut().filter(|j| j.fresh_id && j.name.is_none());
        for (k, job) in unnamed.enumerate() {
            let name = default_job_name(folder, k, count);
            job.id = name.clone();
            job.name = Some(name);
        }
    }
}

/// 1–128 letters, digits, `.`, `_` or `-`, starting with a letter or digit: a name that is
/// one path segment, never `.`, `..` or hidden, and one shell word.
fn is_plain_name(text: &str) -> bool {
    (1..=128).contains(&text.len())
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Checks a job id: 1–128 letters, digits, `.`, `_` or `-`, starting with a letter or digit.
/// Ids become Firestore document ids, GCS path segments and shell words.
pub fn check_job_id(id: &str) -> Result<(), String> {
    if is_plain_name(id) {
        Ok(())
    } else {
        Err("a job id of 1 to 128 letters, digits, `.`, `_` or `-`, starting with a letter or digit".into())
    }
}

/// Parses and validates a job manifest. With `fleet`, also checks every job can run on it.
/// A job with neither `id` nor `name` is named after the folder `file` names (see
/// [`parse_jobs_in`]).
pub fn parse_jobs(
    file: &str,
    source: &str,
    fleet: Option<&FleetSpec>,
) -> Result<Vec<JobSpec>, SpecErrors> {
    let folder = std::path::Path::new(file)
        .parent()
        .and_then(|p| p.file_name())
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    parse_jobs_in(file, source, fleet, &folder)
}

/// [`parse_jobs`] for a manifest in the folder named `folder` (its last component; empty:
/// unnamed jobs are `job`, `job-2` …).
pub fn parse_jobs_in(
    file: &str,
    source: &str,
    fleet: Option<&FleetSpec>,
    folder: &str,
) -> Result<Vec<JobSpec>, SpecErrors> {
    let root = yaml::parse(file, source)?;
    let mut c = Checker::new(source);
    let mut jobs = read_jobs(&mut c, &root, fleet);
    if let Some(jobs) = &mut jobs {
        JobSpec::name_unnamed(jobs, folder);
    }
    c.finish(file, jobs)
        .and_then(|j| j.ok_or_else(|| super::incomplete(file, source)))
}

fn read_jobs(c: &mut Checker<'_>, root: &Node, fleet: Option<&FleetSpec>) -> Option<Vec<JobSpec>> {
    if matches!(root.value, Value::Null) {
        c.error_hint(
            root,
            "",
            "the file is empty; expected a mapping with `jobs:`",
            "see the README for a job.yaml example",
        );
        return None;
    }
    let rejected = [(
        "tpus",
        "this looks like a fleet file; validate it with `tpu-runner validate-fleet`",
    )];
    let f = c.mapping(root, "", "the job manifest", &["jobs"], &rejected)?;
    let list = f.required(c, "jobs", "a list of jobs")?;
    let items = c.list(list, "jobs", "a non-empty list of jobs", false)?;
    let jobs = read_items(c, items, |c, item, i| {
        Some((read_job(c, item, i, fleet)?, item, i))
    });
    let keys: Vec<(ListKeys, &Node)> = (jobs.iter())
        .map(|(j, n, i)| (ListKeys::of(j, *i), *n))
        .collect();
    check_unique(c, keys.iter().map(|(k, n)| (k, *n)));
    Some(jobs.into_iter().map(|(j, _, _)| j).collect())
}

/// Each item of a list read by `read` with its place in the list (what it keeps of the
/// ones that pass). A job's reading looks at no other job, so a long list (a sweep's) is
/// read in parts side by side, its problems kept in list order.
fn read_items<'n, I: Sync, R: Send>(
    c: &mut Checker<'_>,
    items: &'n [I],
    read: impl Fn(&mut Checker<'_>, &'n I, usize) -> Option<R> + Sync,
) -> Vec<R> {
    let parts = crate::parallel::in_parts(items, |start, part: &'n [I]| {
        let mut own = c.fork();
        let numbered = part.iter().enumerate().map(|(k, item)| (start + k, item));
        let kept: Vec<R> = numbered
            .filter_map(|(i, item)| read(&mut own, item, i))
            .collect();
        (own, kept)
    });
    let mut kept = Vec::with_capacity(items.len());
    for (own, part) in parts {
        c.absorb(own);
        kept.extend(part);
    }
    kept
}

/// Stored job specs (a state snapshot's) read again exactly as the jobs of a `job.yaml`
/// are, from the tree of the records (no text to write and scan again): one rule wherever
/// a job comes from. Problems name the i-th spec `jobs[i]`. Each part turns its specs into
/// trees, reads them and keeps only what the list-wide checks read.
pub fn recheck_stored(specs: &[&JobSpec]) -> Result<(), SpecErrors> {
    let mut c = Checker::new("");
    let keys = read_items(&mut c, specs, |c, spec, i| {
        let tree = super::value_tree::to_tree(spec).expect("a spec has a tree");
        Some(ListKeys::of(&read_job(c, &tree, i, None)?, i))
    });
    // A tree of the records has no positions: every node is at line 1, column 1.
    let at = super::value_tree::to_tree(&()).expect("null has a tree");
    check_unique(&mut c, keys.iter().map(|k| (k, &at)));
    c.finish("snapshot", ())
}

/// What the list-wide checks read of a job that passed its own: its id (unless it is to
/// get one), its name and its place.
struct ListKeys {
    id: Option<String>,
    name: Option<String>,
    index: usize,
}

impl ListKeys {
    fn of(job: &JobSpec, index: usize) -> ListKeys {
        ListKeys {
            id: (!job.fresh_id).then(|| job.id.clone()),
            name: job.name.clone(),
            index,
        }
    }
}

/// A field of the i-th job (`jobs[i].id`), written only for a problem.
struct JobField(usize, &'static str);

impl std::fmt::Display for JobField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "jobs[{}].{}", self.0, self.1)
    }
}

/// Ids and names are each used once in a list.
fn check_unique<'k, 'n>(
    c: &mut Checker<'_>,
    jobs: impl Iterator<Item = (&'k ListKeys, &'n Node)> + Clone,
) {
    let ids = jobs
        .clone()
        .filter_map(|(k, n)| Some((k.id.as_deref()?, n, JobField(k.index, "id"))));
    c.unique(ids, "job id");
    let names = jobs.filter_map(|(k, n)| Some((k.name.as_deref()?, n, JobField(k.index, "name"))));
    c.unique(names, "job name");
}

fn read_job(
    c: &mut Checker<'_>,
    node: &Node,
    index: usize,
    fleet: Option<&FleetSpec>,
) -> Option<JobSpec> {
    let path = yaml::index("jobs", index);
    let f = c.mapping(node, path, "a job", JOB_FIELDS, STORED_ONLY)?;
    let errors_before = c.error_count();

    let id = match f.get("id") {
        Some(n) => c
            .nonempty_string(n, f.path("id"), "a job id (a string)")
            .and_then(|id| {
                check_job_id(&id)
                    .map_err(|e| c.expected(n, f.path("id"), &e))
                    .ok()?;
                Some((id, false))
            }),
        None => Some((String::new(), true)),
    };
    let name = f.get("name").and_then(|n| {
        let name = c.nonempty_string(n, f.path("name"), "a job name (a string)")?;
        check_job_name(&name)
            .map_err(|e| c.expected(n, f.path("name"), &e))
            .ok()?;
        Some(name)
    });
    let tpu = f
        .required(c, "tpu", "a TPU type, a list of acceptable types, or `any`")
        .and_then(|n| read_tpu_request(c, n, f.path("tpu")));
    let bundle = match f.get_raw("bundle") {
        // `bundle: ~` is not "the folder": a bundle left blank by mistake must not ship the
        // whole manifest folder.
        Some(n) if matches!(n.value, Value::Null) => {
            c.error_hint(
                n,
                f.path("bundle"),
                "expected a directory, a tar archive or a `gs://` URI, found null".to_owned(),
                "remove `bundle` to ship the manifest's folder, or name what to ship",
            );
            None
        }
        Some(n) => c
            .nonempty_string(
                n,
                f.path("bundle"),
                "a directory, a tar archive or a `gs://` URI",
            )
            .and_then(|b| {
                if let Some(rest) = b.strip_prefix("gs://") {
                    let bucket = rest.split('/').next().unwrap_or("");
                    if gcp::check_bucket_name(bucket).is_err()
                        || !rest.contains('/')
                        || rest.ends_with('/')
                    {
                        c.expected(
                            n,
                            f.path("bundle"),
                            "a bundle object URI such as `gs://my-bucket/bundles/code.tar.gz`",
                        );
                        return None;
                    }
                }
                Some(b)
            }),
        None => Some(".".to_owned()),
    };
    let command = f
        .required(c, "command", "the shell command to run on every worker")
        .and_then(|n| {
            let command = c.nonempty_string(n, f.path("command"), "a non-empty shell command")?;
            check_command(&command)
                .map_err(|e| c.expected(n, f.path("command"), &e))
                .ok()?;
            Some(command)
        });
    let tpu_name = f.get("tpu_name").and_then(|n| {
        let name = c.nonempty_string(n, f.path("tpu_name"), "a TPU name")?;
        gcp::check_node_name(&name)
            .map_err(|e| c.expected(n, f.path("tpu_name"), &e))
            .ok()?;
        Some(name)
    });
    let zone = f.get("zone").and_then(|n| {
        let z = c.nonempty_string(n, f.path("zone"), "a zone such as `us-central2-b`")?;
        gcp::zone_region(&z)
            .map_err(|e| c.expected(n, f.path("zone"), &e))
            .ok()?;
        Some(z)
    });
    let buckets = f
        .required(
            c,
            "buckets",
            "a list of regional buckets, e.g. `[gs://my-bucket-us-central2]`",
        )
        .and_then(|n| {
            let items = c.list(
                n,
                f.path("buckets"),
                "a non-empty list of bucket URIs",
                false,
            )?;
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let p = yaml::index(f.path("buckets"), i);
                if let Some(b) = c.string(item, p, "a bucket URI such as `gs://my-bucket`") {
                    match gcp::normalize_bucket_uri(&b) {
                        Ok(uri) => out.push((uri, item, p)),
                        Err(e) => c.expected(item, p, &e),
                    }
                }
            }
            c.unique(out.iter().map(|(u, n, p)| (u.as_str(), *n, *p)), "bucket");
            Some(out.into_iter().map(|(u, _, _)| u).collect::<Vec<_>>())
        });
    let caches = match f.get("caches") {
        Some(n) => read_caches(c, n, f.path("caches")),
        None => Some(Vec::new()),
    };
    let env = match f.get("env") {
        Some(n) => read_env(c, n, f.path("env")),
        None => Some(BTreeMap::new()),
    };
    let priority = match f.get("priority") {
        Some(n) => c
            .string(n, f.path("priority"), "`low`, `normal` or `high`")
            .and_then(|p| {
                Priority::parse(&p).or_else(|| {
                    c.expected(n, f.path("priority"), "`low`, `normal` or `high`");
                    None
                })
            }),
        None => Some(Priority::Normal),
    };
    let retry = match f.get("retry_on_infrastructure_failure") {
        Some(n) => c.boolean(n, f.path("retry_on_infrastructure_failure")),
        None => Some(true),
    };
    let move_checkpoints = match f.get("move_checkpoints") {
        Some(n) => c.boolean(n, f.path("move_checkpoints")),
        None => Some(false),
    };

    if c.error_count() > errors_before {
        return None;
    }
    let (id, fresh_id) = id?;
    // Until `submit` gives it a run id, a job without one goes by its name (or, when it has
    // none, the name its folder gives it: `name_unnamed`).
    let id = if fresh_id {
        name.clone().unwrap_or_default()
    } else {
        id
    };
    let job = JobSpec {
        id,
        name,
        fresh_id,
        tpu: tpu?,
        bundle: bundle?,
        command: command?,
        tpu_name,
        zone,
        buckets: buckets?,
        caches: caches?,
        env: env?,
        priority: priority?,
        retry_on_infrastructure_failure: retry?,
        move_checkpoints: move_checkpoints?,
    };
    if let Some(fleet) = fleet {
        check_against_fleet(c, &f, &job, fleet);
    }
    Some(job)
}

fn read_tpu_request(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<TpuRequest> {
    let parse_one =
        |c: &mut Checker<'_>, n: &Node, p: &dyn std::fmt::Display| -> Option<Result<TpuType, ()>> {
            let t = c.nonempty_string(n, p, "a TPU type such as `v6e-16`")?;
            if t == "any" {
                return Some(Err(()));
            }
            match TpuType::parse(&t) {
                Ok(t) => Some(Ok(t)),
                Err(e) => {
                    c.error(n, p, format!("expected {e}, found {}", yaml::quote(&t)));
                    None
                }
            }
        };
    match &node.value {
        Value::Seq(items) => {
            if items.is_empty() {
                c.expected(node, path, "a TPU type or a non-empty list of TPU types");
                return None;
            }
            let mut types = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let p = yaml::index(path, i);
                match parse_one(c, item, &p) {
                    Some(Ok(t)) => types.push((t, item, p)),
                    Some(Err(())) => c.error_hint(
                        item,
                        p,
                        "`any` cannot be combined with other types",
                        "write `tpu: any` on its own",
                    ),
                    None => {}
                }
            }
            c.unique(
                types.iter().map(|(t, n, p)| (t.to_string(), *n, *p)),
                "TPU type",
            );
            Some(TpuRequest::OneOf(
                types.into_iter().map(|(t, _, _)| t).collect(),
            ))
        }
        _ => match parse_one(c, node, &path)? {
            Ok(t) => Some(TpuRequest::OneOf(vec![t])),
            Err(()) => Some(TpuRequest::Any),
        },
    }
}

fn read_caches(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<Vec<Cache>> {
    let items = c.list(
        node,
        path,
        "a list of caches, each `{key: ..., path: ...}`",
        true,
    )?;
    let mut caches = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = yaml::index(path, i);
        let Some(f) = c.mapping(
            item,
            p,
            "a cache (`{key: ..., path: ...}`)",
            &["key", "path"],
            &[],
        ) else {
            continue;
        };
        let key = f.required(c, "key", "a cache name").and_then(|n| {
            let key = c.nonempty_string(n, f.path("key"), "a non-empty cache name")?;
            check_cache_key(&key)
                .map_err(|e| c.expected(n, f.path("key"), &e))
                .ok()?;
            Some((key, n))
        });
        let cache_path = f
            .required(c, "path", "a relative path in the job directory")
            .and_then(|n| {
                let raw = c.nonempty_string(n, f.path("path"), "a non-empty relative path")?;
                let trimmed = raw.trim_end_matches('/');
                let components: Vec<&str> = trimmed
                    .split('/')
                    .filter(|s| !s.is_empty() && *s != ".")
                    .collect();
                let bad = raw.starts_with('/')
                    || components.is_empty()
                    || components.contains(&"..")
                    || raw.chars().any(|ch| ch.is_control());
                if bad {
                    c.expected(
                        n,
                        f.path("path"),
                        "a relative path inside the job directory (not absolute, not `.`, no `..`)",
                    );
                    return None;
                }
                Some((components.join("/"), n))
            });
        if let (Some(key), Some(cache_path)) = (key, cache_path) {
            caches.push((key, cache_path, p));
        }
    }
    c.unique(
        caches
            .iter()
            .map(|((k, n), _, p)| (k.as_str(), *n, yaml::join(p, "key"))),
        "cache key",
    );
    c.unique(
        caches
            .iter()
            .map(|(_, (q, n), p)| (q.as_str(), *n, yaml::join(p, "path"))),
        "cache path",
    );
    Some(
        caches
            .into_iter()
            .map(|((key, _), (path, _), _)| Cache { key, path })
            .collect(),
    )
}

fn read_env(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
) -> Option<BTreeMap<String, String>> {
    let Value::Map(pairs) = &node.value else {
        c.expected(node, path, "a mapping of variable names to values");
        return None;
    };
    let mut env = BTreeMap::new();
    for (key, value) in pairs {
        let Some(name) = key.as_str() else {
            c.expected(key, path, "a variable name (a string)");
            continue;
        };
        let p = yaml::join(path, name);
        match check_env_name(name) {
            Err(EnvProblem::Reserved(why)) => {
                c.error_hint(key, p, why, "rename the variable");
                continue;
            }
            Err(EnvProblem::Invalid(why)) => {
                c.expected(key, p, &why);
                continue;
            }
            Ok(()) => {}
        }
        let text = match &value.value {
            Value::Str(s) => s.clone(),
            Value::Int(_) | Value::Float(_) | Value::Bool(_) => c.raw_text(value),
            _ => {
                c.expected(value, p, "a string, number or boolean value");
                continue;
            }
        };
        if let Err(why) = check_env_value(name, &text) {
            c.expected(value, p, &why);
            continue;
        }
        env.insert(name.to_owned(), text);
    }
    Some(env)
}

/// Why an environment variable's name is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvProblem {
    /// Not `[A-Za-z_][A-Za-z0-9_]*` (what was expected).
    Invalid(String),
    /// tpu-runner sets it (the message).
    Reserved(String),
}

impl std::fmt::Display for EnvProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvProblem::Invalid(e) => write!(f, "expected {e}"),
            EnvProblem::Reserved(e) => f.write_str(e),
        }
    }
}

/// The longest single argument or environment string the kernel passes to a command
/// (`MAX_ARG_STRLEN`, 32 pages): a longer value or command could never start.
pub const MAX_ARG_BYTES: usize = 128 * 1024;

/// Checks a variable name a job sets (`env:`, `submit --env`): the rule of the manifest and
/// of the worker, in one place.
pub fn check_env_name(name: &str) -> Result<(), EnvProblem> {
    let valid = name.starts_with(|ch: char| ch.is_ascii_alphabetic() || ch == '_')
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
    if !valid {
        return Err(EnvProblem::Invalid(
            "a variable name matching `[A-Za-z_][A-Za-z0-9_]*`".into(),
        ));
    }
    if RESERVED_ENV.contains(&name) || (name.starts_with("TPU_RUNNER_") && name != MIN_ROOT_FREE_KB)
    {
        return Err(EnvProblem::Reserved(format!(
            "`{name}` is set by tpu-runner and cannot be overridden"
        )));
    }
    Ok(())
}

/// Checks the value of variable `name`: no NUL (a process environment cannot hold one),
/// within the kernel's limit for one string, and the root-disk floor an integer ≥ 1 GiB.
pub fn check_env_value(name: &str, value: &str) -> Result<(), String> {
    if value.contains('\0') {
        return Err("a value without NUL characters (an environment cannot hold one)".into());
    }
    if name.len() + 1 + value.len() >= MAX_ARG_BYTES {
        return Err(format!(
            "a value under {} KiB (the kernel's limit for one variable)",
            MAX_ARG_BYTES / 1024
        ));
    }
    if name == MIN_ROOT_FREE_KB && !value.trim().parse::<u64>().is_ok_and(|kb| kb >= 1_048_576) {
        return Err("an integer number of KiB, at least 1048576 (1 GiB)".into());
    }
    Ok(())
}

/// Checks a cache key: 1–128 letters, digits, `.`, `_` or `-`, starting with a letter or
/// digit (a folder name under the cache root: never `.`, `..` or hidden). The manifest's
/// rule and the worker's.
pub fn check_cache_key(key: &str) -> Result<(), String> {
    if is_plain_name(key) {
        Ok(())
    } else {
        Err("a cache name of 1 to 128 letters, digits, `.`, `_` or `-`, starting with a letter or digit".into())
    }
}

/// Checks a job's command: not blank, no NUL, within the kernel's limit for one argument
/// (it is passed to `bash -lc` whole).
pub fn check_command(command: &str) -> Result<(), String> {
    if command.trim().is_empty() {
        return Err("a non-empty shell command".into());
    }
    if command.contains('\0') {
        return Err("a command without NUL characters (a process argument cannot hold one)".into());
    }
    if command.len() >= MAX_ARG_BYTES {
        return Err(format!(
            "a command under {} KiB (the kernel's limit for one argument; ship a script in the bundle instead)",
            MAX_ARG_BYTES / 1024
        ));
    }
    Ok(())
}

/// Which fleet entries could ever run `job` (type, zone and tpu_name rules; regions are
/// checked at submit, when bucket locations are known).
pub fn compatible_entries<'f>(job: &JobSpec, fleet: &'f FleetSpec) -> Vec<&'f TpuEntry> {
    fleet
        .tpus
        .iter()
        .filter(|e| job.tpu.accepts(&e.tpu_type))
        .filter(|e| job.zone.as_ref().is_none_or(|z| *z == e.zone))
        .filter(|e| match (&job.tpu_name, &e.kind) {
            (None, EntryKind::Adopted { .. }) => true,
            (None, EntryKind::Managed { count }) => *count > 0,
            (Some(name), EntryKind::Adopted { existing }) => name == existing,
            (Some(name), EntryKind::Managed { .. }) => {
                e.declared_node_names(&fleet.name).contains(name)
            }
        })
        .collect()
}

fn check_against_fleet(
    c: &mut Checker<'_>,
    f: &yaml::Fields<'_>,
    job: &JobSpec,
    fleet: &FleetSpec,
) {
    if !compatible_entries(job, fleet).is_empty() {
        return;
    }
    let (node, field) = if job.tpu_name.is_some() {
        ("tpu_name", "tpu_name")
    } else if job.zone.is_some() {
        ("zone", "zone")
    } else {
        ("tpu", "tpu")
    };
    let at = f.get(node).unwrap_or(f.node());
    let hint = if job.tpu_name.is_some() {
        // The names a job may pin: adopted TPUs and managed entries' declared nodes.
        let mut names: Vec<String> = fleet
            .tpus
            .iter()
            .filter(|e| job.tpu.accepts(&e.tpu_type))
            .flat_map(|e| match &e.kind {
                EntryKind::Adopted { existing } => vec![existing.clone()],
                EntryKind::Managed { .. } => e.declared_node_names(&fleet.name),
            })
            .collect();
        let more = names.len().saturating_sub(20);
        names.truncate(20);
        if names.is_empty() {
            "no TPU of the fleet has a type this job accepts".to_owned()
        } else {
            format!(
                "the fleet's TPU names of an accepted type: {}{}",
                names.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            )
        }
    } else {
        let types: Vec<String> = fleet
            .tpus
            .iter()
            .map(|e| format!("{} in {}", e.tpu_type, e.zone))
            .collect();
        format!("the fleet offers: {}", types.join(", "))
    };
    c.error_hint(
        at,
        f.path(field),
        format!("no entry of fleet `{}` can run this job", fleet.name),
        hint,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest of `n` jobs; `bad` maps a job's place to a field line replacing its command.
    fn manifest(n: usize, bad: &[(usize, &str)]) -> String {
        let mut s = String::from("jobs:\n");
        for i in 0..n {
            let id = if i == n - 1 { 2 } else { i };
            s.push_str(&format!(
                "  - id: job-{id}\n    tpu: v6e-8\n    buckets: [gs://b-us-east1]\n"
            ));
            match bad.iter().find(|(at, _)| *at == i) {
                Some((_, line)) => s.push_str(&format!("    {line}\n")),
                None => s.push_str("    command: python train.py\n"),
            }
        }
        s
    }

    /// A list long enough to be read in parts reports what a short one does, in list order:
    /// problems from every part, a repeat across parts named with its first place.
    #[test]
    fn a_long_list_read_in_parts_reports_every_problem_in_order() {
        let n = crate::parallel::PARTS_FROM * 3;
        let bad = [
            (3, "command: ''"),
            (n / 2, "comand: x"),
            (n - 2, "command: 7"),
        ];
        let errors = parse_jobs("jobs.yaml", &manifest(n, &bad), None).expect_err("refused");
        let paths: Vec<&str> = errors.diagnostics.iter().map(|d| d.path.as_str()).collect();
        let last = format!("jobs[{}].id", n - 1);
        assert_eq!(
            paths,
            [
                "jobs[3].command".to_owned(),
                format!("jobs[{}].command", n / 2),
                format!("jobs[{}].comand", n / 2),
                format!("jobs[{}].command", n - 2),
                last,
            ],
        );
        let repeat = errors.diagnostics.last().expect("the repeat");
        assert!(
            repeat.message.contains("already used at jobs[2].id"),
            "{}",
            repeat.message
        );
        // The same problems as a short list gives for the same jobs.
        let short = parse_jobs("jobs.yaml", &manifest(8, &[(3, "command: ''")]), None)
            .expect_err("refused");
        assert_eq!(short.diagnostics[0].message, errors.diagnostics[0].message);
    }

    /// Every item repeating one id is reported once each, quickly (one lookup per item).
    #[test]
    fn many_repeats_of_one_id_are_reported_each() {
        let mut s = String::from("jobs:\n");
        for _ in 0..20_000 {
            s.push_str("  - {id: same, tpu: v6e-8, command: x, buckets: [gs://b-us-east1]}\n");
        }
        let errors = parse_jobs("jobs.yaml", &s, None).expect_err("refused");
        assert_eq!(errors.diagnostics.len(), 19_999);
        assert!(
            errors
                .diagnostics
                .iter()
                .all(|d| d.message.contains("jobs[0].id"))
        );
    }
}
