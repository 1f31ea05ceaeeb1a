//! `validate-fleet` and `validate-jobs`: read a file, validate it, print the normalised
//! result or every problem.

use std::collections::BTreeMap;
use std::path::Path;

use super::exit_codes::ExitStatus;
use super::{Failure, output, print_stdout, read_text};
use crate::engine::state::BucketRegion;
use crate::spec::{self, FleetSpec, SpecErrors};

fn invalid(errors: SpecErrors) -> Failure {
    Failure {
        message: errors.render(),
        status: ExitStatus::Invalid,
    }
}

/// Reads a spec file, or standard input for `-` (named `<stdin>` in messages); bounded
/// either way.
fn read_spec(path: &Path, hint: Option<&str>) -> Result<(String, String), Failure> {
    if path != Path::new("-") {
        let text = read_text(path, crate::files::SPEC_LIMIT, hint)?;
        return Ok((path.display().to_string(), text));
    }
    use std::io::Read;
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(crate::files::SPEC_LIMIT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Failure {
            message: format!("error: cannot read standard input: {e}\n"),
            status: ExitStatus::Io,
        })?;
    if bytes.len() as u64 > crate::files::SPEC_LIMIT {
        return Err(Failure {
            message: format!(
                "error: standard input is larger than {} MiB, the limit for a spec file\n",
                crate::files::SPEC_LIMIT >> 20
            ),
            status: ExitStatus::Invalid,
        });
    }
    let text = String::from_utf8(bytes).map_err(|_| Failure {
        message: "error: standard input is not UTF-8 text\n".into(),
        status: ExitStatus::Invalid,
    })?;
    Ok(("<stdin>".into(), text))
}

/// Reads and validates a fleet file (`-`: standard input).
pub(crate) fn load_fleet(path: &Path) -> Result<FleetSpec, Failure> {
    let (name, text) = read_spec(
        path,
        Some("run `tpu-runner init` to write an example deployment.yaml"),
    )?;
    spec::parse_fleet(&name, &text).map_err(invalid)
}

pub(super) fn fleet(path: &Path, json: bool) -> Result<ExitStatus, Failure> {
    let fleet = load_fleet(path)?;
    if json {
        print_stdout(&output::fleet_json(&fleet));
    } else {
        print_stdout(&output::fleet_summary(&fleet));
    }
    Ok(ExitStatus::Ok)
}

pub(super) fn jobs(
    path: &Path,
    fleet_path: Option<&Path>,
    buckets: bool,
    objects: Option<&Path>,
    json: bool,
) -> Result<ExitStatus, Failure> {
    if path == Path::new("-") && fleet_path == Some(Path::new("-")) {
        return Err(Failure {
            message: "error: the manifest and the fleet cannot both be standard input\n".into(),
            status: ExitStatus::Usage,
        });
    }
    let fleet = fleet_path.map(load_fleet).transpose()?;
    let (name, text) = read_spec(path, Some("see the README for a job.yaml example"))?;
    let jobs = spec::parse_jobs(&name, &text, fleet.as_ref()).map_err(invalid)?;
    // With `--buckets`, each job's bucket regions as `submit` reads them (every job's
    // problem is reported, then the command fails).
    let regions = match &fleet {
        Some(fleet) if buckets => Some(bucket_regions(&jobs, fleet, objects)?),
        _ => None,
    };
    if json {
        print_stdout(&output::jobs_json(&jobs));
    } else {
        print_stdout(&output::jobs_summary(
            &jobs,
            fleet.as_ref(),
            regions.as_ref(),
        ));
    }
    Ok(ExitStatus::Ok)
}

/// Each job's usable bucket regions, read from the object store in `objects` (a local
/// folder per bucket), else the local stack's, else Cloud Storage; every job whose buckets
/// cannot be used is reported.
fn bucket_regions(
    jobs: &[spec::JobSpec],
    fleet: &FleetSpec,
    objects: Option<&Path>,
) -> Result<BTreeMap<String, Vec<BucketRegion>>, Failure> {
    let objects = super::stack::Stack::objects_at(objects)?;
    let mut locations = BTreeMap::new();
    let mut regions = BTreeMap::new();
    let mut problems = String::new();
    for job in jobs {
        match crate::submit::candidate_regions(job, fleet, objects.as_ref(), &mut locations) {
            Ok(usable) => {
                regions.insert(job.id.clone(), usable);
            }
            Err(e) => problems.push_str(&e.to_string()),
        }
    }
    if problems.is_empty() {
        Ok(regions)
    } else {
        Err(Failure {
            message: problems,
            status: ExitStatus::Invalid,
        })
    }
}
