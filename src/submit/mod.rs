//! Submitting jobs (§6.1, §4): each bucket's region read and required to be one exact
//! region; the regions where the job can run (a bucket there and an entry the job accepts);
//! the bundle built once (a folder or tar file; a `gs://` bundle is used as it is), uploaded
//! create-only to the bucket of every candidate region and checked when it is there already;
//! the spec JSON beside it; then every job created in the store at once, or none. The CLI
//! prints; this module never does. It decides nothing the engine decides.

pub mod bundle;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::engine::Timestamp;
use crate::engine::state::{BucketRegion, Job};
use crate::objects::ObjectStore;
use crate::spec::{self, FleetSpec, JobSpec, Priority};
use crate::store::{CreateResult, StateStore};

/// What was submitted for one job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Submitted {
    /// The job id (this run's).
    pub job_id: String,
    /// The job's name (`watch NAME` follows its latest run).
    pub name: String,
    /// Its priority.
    pub priority: Priority,
    /// Regions it may run in (a bucket there and an entry it accepts), sorted.
    pub regions: Vec<String>,
    /// Where its bundle is, per region's bucket.
    pub bundles: Vec<String>,
    /// Its spec JSON, per region's bucket.
    pub specs: Vec<String>,
    /// When.
    pub submitted_at: Timestamp,
}

/// Why nothing was submitted.
#[derive(Debug)]
pub enum SubmitError {
    /// The manifest is invalid (rendered diagnostics).
    Invalid(String),
    /// The manifest (or an env file) could not be read.
    Unreadable(String),
    /// A bucket, bundle or upload failed: what and why.
    Objects(String),
    /// These job ids exist already (active or finished): nothing was created.
    Exist(Vec<String>),
    /// The store failed.
    Store(crate::store::StoreError),
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::Invalid(text)
            | SubmitError::Unreadable(text)
            | SubmitError::Objects(text) => f.write_str(text),
            SubmitError::Exist(ids) => write!(
                f,
                "job ids already used (a job id is never reused, even after it finished): {}",
                ids.join(", ")
            ),
            SubmitError::Store(e) => write!(f, "{e}"),
        }
    }
}

/// The manifest a `submit` argument names: the file, or `DIR/job.yaml` for a folder.
pub fn manifest_path(arg: &Path) -> std::path::PathBuf {
    if arg.is_dir() {
        arg.join("job.yaml")
    } else {
        arg.to_path_buf()
    }
}

/// Reads and validates the jobs of `manifest` (a file, or a folder's `job.yaml`) against
/// `fleet` and keeps those `names` name (exact, unique, present; manifest order), or all of
/// them. A job without `id` or `name` is named after the manifest's folder.
pub fn read_jobs(
    manifest: &Path,
    fleet: &FleetSpec,
    names: &[String],
) -> Result<Vec<JobSpec>, SubmitError> {
    let manifest = manifest_path(manifest);
    let text = crate::files::read_text(&manifest, crate::files::SPEC_LIMIT).map_err(|e| {
        SubmitError::Unreadable(format!(
            "error: cannot read the job manifest `{}`: {e}\n",
            manifest.display()
        ))
    })?;
    let folder = manifest
        .canonicalize()
        .ok()
        .and_then(|p| {
            p.parent()
                .and_then(|d| d.file_name())
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let jobs =
        spec::job::parse_jobs_in(&manifest.display().to_string(), &text, Some(fleet), &folder)
            .map_err(|e| SubmitError::Invalid(e.render()))?;
    if names.is_empty() {
        return Ok(jobs);
    }
    let mut problems = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            problems.push(format!("--name {name} is given twice"));
        } else if !jobs.iter().any(|j| j.name() == name) {
            problems.push(format!(
                "--name {name}: no such job in {} (it has: {})",
                manifest.display(),
                jobs.iter()
                    .map(JobSpec::name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if !problems.is_empty() {
        return Err(SubmitError::Invalid(format!(
            "error: {}\n",
            problems.join("\nerror: ")
        )));
    }
    Ok(jobs
        .into_iter()
        .filter(|j| names.iter().any(|n| n == j.name()))
        .collect())
}

/// What `submit` changes in every job it submits, for a quick try: variables added (or
/// replaced) and the command replaced. Checked by the manifest's own rules.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--env-file` then `--env` variables, in order (a later one wins).
    pub env: Vec<(String, String)>,
    /// `--command`.
    pub command: Option<String>,
}

impl Overrides {
    /// Adds `K=V` (from `--env`).
    pub fn add_pair(&mut self, pair: &str) -> Result<(), SubmitError> {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(SubmitError::Invalid(format!(
                "error: --env {pair:?}: expected NAME=VALUE\n"
            )));
        };
        self.add(name, value, "--env")
    }

    /// Adds the variables of an env file: `NAME=VALUE` per line (the value verbatim after the
    /// first `=`), blank lines and lines starting with `#` skipped.
    pub fn add_file(&mut self, path: &Path) -> Result<(), SubmitError> {
        let text = crate::files::read_text(path, 1 << 20).map_err(|e| {
            SubmitError::Unreadable(format!("error: cannot read `{}`: {e}\n", path.display()))
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            let at = format!("{}:{}", path.display(), n + 1);
            let Some((name, value)) = line.split_once('=') else {
                return Err(SubmitError::Invalid(format!(
                    "error: {at}: expected NAME=VALUE, found {line:?}\n"
                )));
            };
            self.add(name.trim(), value, &at)?;
        }
        Ok(())
    }

    fn add(&mut self, name: &str, value: &str, at: &str) -> Result<(), SubmitError> {
        let invalid = |why: String| SubmitError::Invalid(format!("error: {at}: {why}\n"));
        spec::job::check_env_name(name).map_err(|e| invalid(format!("{name:?}: {e}")))?;
        spec::job::check_env_value(name, value)
            .map_err(|e| invalid(format!("{name}: expected {e}")))?;
        self.env.push((name.to_owned(), value.to_owned()));
        Ok(())
    }

    /// Sets the command (from `--command`).
    pub fn set_command(&mut self, command: &str) -> Result<(), SubmitError> {
        spec::job::check_command(command)
            .map_err(|e| SubmitError::Invalid(format!("error: --command: expected {e}\n")))?;
        self.command = Some(command.to_owned());
        Ok(())
    }

    /// Applies these to every job.
    pub fn apply(&self, jobs: &mut [JobSpec]) {
        for job in jobs {
            for (name, value) in &self.env {
                job.env.insert(name.clone(), value.clone());
            }
            if let Some(command) = &self.command {
                job.command = command.clone();
            }
        }
    }
}

/// The regions of `job`'s buckets (each one exact region, one bucket per region), keeping
/// only those where an entry the job accepts lies; the zone or TPU it pins must be in one.
pub fn candidate_regions(
    job: &JobSpec,
    fleet: &FleetSpec,
    objects: &dyn ObjectStore,
    locations: &mut BTreeMap<String, String>,
) -> Result<Vec<BucketRegion>, SubmitError> {
    let fail = |m: String| SubmitError::Objects(format!("error: job {}: {m}\n", job.id));
    let mut by_region: BTreeMap<String, String> = BTreeMap::new();
    for bucket in &job.buckets {
        let location = match locations.get(bucket) {
            Some(l) => l.clone(),
            None => {
                let l = objects.location(bucket).map_err(|e| fail(e.message))?;
                locations.insert(bucket.clone(), l.clone());
                l
            }
        };
        if spec::gcp::check_region(&location).is_err() {
            return Err(fail(format!(
                "bucket {bucket} is in `{location}`, not one region: a job's buckets must each be in one exact region (multi- and dual-region buckets would bill cross-region traffic)"
            )));
        }
        if let Some(other) = by_region.insert(location.clone(), bucket.clone()) {
            return Err(fail(format!(
                "buckets {other} and {bucket} are both in {location}: name one bucket per region"
            )));
        }
    }
    let entries = spec::job::compatible_entries(job, fleet);
    let usable: Vec<BucketRegion> = by_region
        .into_iter()
        .filter(|(region, _)| entries.iter().any(|e| e.region() == region))
        .map(|(region, bucket)| BucketRegion { region, bucket })
        .collect();
    if usable.is_empty() {
        let regions: std::collections::BTreeSet<&str> =
            entries.iter().map(|e| e.region()).collect();
        return Err(fail(format!(
            "none of its buckets is in a region where the fleet has a TPU it accepts ({}); add a bucket in one of them",
            regions.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    if job.bundle.starts_with("gs://") && job.buckets.len() > 1 {
        return Err(fail(
            "a gs:// bundle is in one region: a job racing several regions needs a local folder or tar file as its bundle".into(),
        ));
    }
    Ok(usable)
}

/// The entries `job` may run on once its buckets are in `regions`: those whose type, zone
/// and TPU name fit it (`compatible_entries`) in a region the engine accepts for a job not
/// yet placed (`RegionChoice::accepts`, the rule `plan` and the controller apply).
pub fn runs_on<'f>(
    job: &JobSpec,
    fleet: &'f FleetSpec,
    regions: &[BucketRegion],
) -> Vec<&'f spec::fleet::TpuEntry> {
    let allowed = crate::engine::state::RegionChoice::AnyOf(regions);
    spec::job::compatible_entries(job, fleet)
        .into_iter()
        .filter(|e| allowed.accepts(e.region()))
        .collect()
}

/// Gives each job without a manifest id a fresh run id (`NAME-xxxxxx`), drawn again while
/// one is taken, and refuses when a manifest id is taken: all before anything is uploaded,
/// so nothing of a refused job lands in a bucket (its spec beside the existing job's).
fn assign_run_ids(jobs: &mut [JobSpec], store: &mut dyn StateStore) -> Result<(), SubmitError> {
    for job in jobs.iter_mut().filter(|j| j.fresh_id) {
        job.name = Some(job.name().to_owned());
    }
    for _ in 0..8 {
        for job in jobs.iter_mut().filter(|j| j.fresh_id) {
            let random = uuid::Uuid::new_v4().as_u64_pair().0;
            job.id = crate::spec::names::run_id(job.name(), random);
        }
        let ids: Vec<crate::spec::Name> =
            jobs.iter().map(|j| crate::spec::Name::new(&j.id)).collect();
        let exist = store.existing_jobs(&ids).map_err(SubmitError::Store)?;
        let fixed: Vec<String> = jobs
            .iter()
            .filter(|j| !j.fresh_id && exist.iter().any(|e| e.as_str() == j.id))
            .map(|j| j.id.clone())
            .collect();
        if !fixed.is_empty() {
            return Err(SubmitError::Exist(fixed));
        }
        let mut seen = std::collections::BTreeSet::new();
        if exist.is_empty() && ids.iter().all(|id| seen.insert(*id)) {
            return Ok(());
        }
    }
    Err(SubmitError::Objects(
        "error: no free run id after 8 draws (is the store answering the same for every id?)\n"
            .into(),
    ))
}

/// Uploads `bundle` create-only to `uri`, streamed from its file; an object already there
/// must hold the same bytes (read back into a temporary file and hashed, never into memory).
fn upload_bundle(
    objects: &dyn ObjectStore,
    uri: &str,
    bundle: &bundle::Bundle,
) -> Result<(), SubmitError> {
    create_once(uri, objects.upload(uri, &bundle.file, true), || {
        let there = tempfile::NamedTempFile::new().map_err(|e| format!("a temporary file: {e}"))?;
        let found = objects
            .download(uri, there.path(), bundle.size)
            .map_err(|e| e.to_string())?;
        Ok(found
            && crate::worker::bundle::sha256_file(there.path())
                .is_ok_and(|sha| sha == bundle.sha256))
    })
}

/// Uploads `data` create-only to `uri`; an object already there must hold the same bytes.
fn upload(objects: &dyn ObjectStore, uri: &str, data: &[u8]) -> Result<(), SubmitError> {
    create_once(uri, objects.put(uri, data, true), || {
        let there = objects
            .get(uri, data.len() as u64 + 1)
            .map_err(|e| e.to_string())?;
        Ok(there.is_some_and(|bytes| Sha256::digest(&bytes) == Sha256::digest(data)))
    })
}

/// What a create-only write of `uri` that returned `written` means: done, or, where the
/// object was there already, done only if `same()` finds it holds what was to be written.
fn create_once(
    uri: &str,
    written: Result<(), crate::objects::ObjectError>,
    same: impl FnOnce() -> Result<bool, String>,
) -> Result<(), SubmitError> {
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.exists => match same() {
            Ok(true) => Ok(()),
            Ok(false) => Err(SubmitError::Objects(format!(
                "error: artifact integrity mismatch: {uri} exists with other content than this bundle; it was left as it is\n"
            ))),
            Err(e) => Err(SubmitError::Objects(format!(
                "error: {uri} exists; reading it back to compare failed: {e}\n"
            ))),
        },
        Err(e) => Err(SubmitError::Objects(format!("error: upload {uri}: {e}\n"))),
    }
}

/// Submits `jobs` (read from the manifest in `base`): bundles and specs uploaded, then all
/// jobs created in `store` at once. `progress` hears each upload (address, bytes).
pub fn submit(
    jobs: Vec<JobSpec>,
    base: &Path,
    fleet: &FleetSpec,
    objects: &dyn ObjectStore,
    store: &mut dyn StateStore,
    now: Timestamp,
    progress: &mut dyn FnMut(&str, usize),
) -> Result<Vec<Submitted>, SubmitError> {
    let mut jobs = jobs;
    assign_run_ids(&mut jobs, store)?;
    let mut locations = BTreeMap::new();
    let mut built: BTreeMap<String, bundle::Bundle> = BTreeMap::new();
    let token = uuid::Uuid::new_v4().simple().to_string();
    let mut created = Vec::new();
    let mut submitted = Vec::new();
    for mut job in jobs {
        let regions = candidate_regions(&job, fleet, objects, &mut locations)?;
        let mut bundles = Vec::new();
        if job.bundle.starts_with("gs://") {
            // The worker would fail its set-up on a bundle that is not there: say so now.
            let there = objects
                .get_from(&job.bundle, 0, 1)
                .map_err(|e| SubmitError::Objects(format!("error: job {}: {e}\n", job.id)))?;
            if there.is_none() {
                return Err(SubmitError::Objects(format!(
                    "error: job {}: the bundle {} does not exist\n",
                    job.name(),
                    job.bundle
                )));
            }
            bundles.push(job.bundle.clone());
        } else {
            if !built.contains_key(&job.bundle) {
                let b = bundle::build(&job.bundle, base)
                    .map_err(|e| SubmitError::Objects(format!("error: job {}: {e}\n", job.id)))?;
                built.insert(job.bundle.clone(), b);
            }
            let b = &built[&job.bundle];
            for r in &regions {
                let uri = format!("{}/bundles/{}.tar.gz", r.bucket, b.sha256);
                progress(&uri, b.size as usize);
                upload_bundle(objects, &uri, b)?;
                bundles.push(uri);
            }
            job.bundle = format!("sha256:{}", b.sha256);
        }
        let document = serde_json::to_vec_pretty(&serde_json::json!({
            "submitted_at": now,
            "job": &job,
        }))
        .expect("a job serialises");
        let mut specs = Vec::new();
        for r in &regions {
            let uri = format!("{}/jobs/{}/spec-{token}.json", r.bucket, job.id);
            progress(&uri, document.len());
            upload(objects, &uri, &document)?;
            specs.push(uri);
        }
        submitted.push(Submitted {
            job_id: job.id.clone(),
            name: job.name().to_owned(),
            priority: job.priority,
            regions: regions.iter().map(|r| r.region.clone()).collect(),
            bundles,
            specs,
            submitted_at: now,
        });
        created.push(Job::new(job, now, regions));
    }
    match store
        .create_jobs(&created, now)
        .map_err(SubmitError::Store)?
    {
        CreateResult::Created => Ok(submitted),
        CreateResult::Exist(ids) => Err(SubmitError::Exist(
            ids.iter().map(|n| n.to_string()).collect(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bundle goes up once; the same bundle again finds its own bytes there (read back
    /// and hashed); other bytes under its name are refused and left as they are.
    #[test]
    fn a_bundle_is_uploaded_once_and_other_bytes_under_its_name_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let code = dir.path().join("code");
        std::fs::create_dir_all(&code).unwrap();
        std::fs::write(code.join("train.py"), "print(1)\n").unwrap();
        let objects = crate::objects::LocalDir::new(dir.path().join("objects"));
        let b = bundle::of_directory(&code).unwrap();
        let uri = format!("gs://lab/bundles/{}.tar.gz", b.sha256);
        upload_bundle(&objects, &uri, &b).unwrap();
        upload_bundle(&objects, &uri, &b).unwrap();
        let other = "gs://lab/bundles/other.tar.gz";
        objects.put(other, b"not this bundle", true).unwrap();
        let Err(SubmitError::Objects(e)) = upload_bundle(&objects, other, &b) else {
            panic!("other bytes were taken for the bundle");
        };
        assert!(e.contains("artifact integrity mismatch"), "{e}");
        assert_eq!(
            objects.get(other, 100).unwrap().unwrap(),
            b"not this bundle"
        );
    }
}
