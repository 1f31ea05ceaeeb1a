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
    /// The job id.
    pub job_id: String,
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
            SubmitError::Invalid(text) | SubmitError::Objects(text) => f.write_str(text),
            SubmitError::Exist(ids) => write!(
                f,
                "job ids already used (a job id is never reused, even after it finished): {}",
                ids.join(", ")
            ),
            SubmitError::Store(e) => write!(f, "{e}"),
        }
    }
}

/// Reads and validates the jobs of `manifest` against `fleet` and keeps those `ids` name
/// (exact, unique, present; manifest order), or all of them.
pub fn read_jobs(
    manifest: &Path,
    fleet: &FleetSpec,
    ids: &[String],
) -> Result<Vec<JobSpec>, SubmitError> {
    let text = crate::files::read_text(manifest, crate::files::SPEC_LIMIT).map_err(|e| {
        SubmitError::Invalid(format!(
            "error: cannot read `{}`: {e}\n",
            manifest.display()
        ))
    })?;
    let jobs = spec::parse_jobs(&manifest.display().to_string(), &text, Some(fleet))
        .map_err(|e| SubmitError::Invalid(e.render()))?;
    if ids.is_empty() {
        return Ok(jobs);
    }
    let mut problems = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        if ids[..i].contains(id) {
            problems.push(format!("--job-id {id} is given twice"));
        } else if !jobs.iter().any(|j| &j.id == id) {
            problems.push(format!(
                "--job-id {id}: no such job in {} (it has: {})",
                manifest.display(),
                jobs.iter()
                    .map(|j| j.id.as_str())
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
    Ok(jobs.into_iter().filter(|j| ids.contains(&j.id)).collect())
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

/// Uploads `data` create-only to `uri`; an object already there must hold the same bytes.
fn upload(objects: &dyn ObjectStore, uri: &str, data: &[u8]) -> Result<(), SubmitError> {
    match objects.put(uri, data, true) {
        Ok(()) => Ok(()),
        Err(e) if e.exists => {
            let there = objects
                .get(uri, data.len() as u64 + 1)
                .map_err(|e| SubmitError::Objects(format!("error: {e}\n")))?;
            match there {
                Some(bytes) if Sha256::digest(&bytes) == Sha256::digest(data) => Ok(()),
                _ => Err(SubmitError::Objects(format!(
                    "error: artifact integrity mismatch: {uri} exists with other content than this bundle; it was left as it is\n"
                ))),
            }
        }
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
    // A refused id is refused before anything is uploaded: nothing of a refused job may
    // land in a bucket (its spec beside the existing job's).
    let ids: Vec<crate::spec::Name> = jobs.iter().map(|j| crate::spec::Name::new(&j.id)).collect();
    let exist = store.existing_jobs(&ids).map_err(SubmitError::Store)?;
    if !exist.is_empty() {
        return Err(SubmitError::Exist(
            exist.iter().map(|n| n.to_string()).collect(),
        ));
    }
    let mut locations = BTreeMap::new();
    let mut built: BTreeMap<String, bundle::Bundle> = BTreeMap::new();
    let token = uuid::Uuid::new_v4().simple().to_string();
    let mut created = Vec::new();
    let mut submitted = Vec::new();
    for mut job in jobs {
        let regions = candidate_regions(&job, fleet, objects, &mut locations)?;
        let mut bundles = Vec::new();
        if job.bundle.starts_with("gs://") {
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
                progress(&uri, b.data.len());
                upload(objects, &uri, &b.data)?;
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
