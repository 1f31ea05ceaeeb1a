//! `validate-fleet` and `validate-jobs`: read a file, validate it, print the normalised
//! result or every problem.

use std::path::Path;

use super::exit_codes::ExitStatus;
use super::{Failure, output, print_stdout, read_text};
use crate::spec::{self, FleetSpec, SpecErrors};

fn invalid(errors: SpecErrors) -> Failure {
    Failure {
        message: errors.render(),
        status: ExitStatus::Invalid,
    }
}

/// Reads and validates a fleet file.
pub(crate) fn load_fleet(path: &Path) -> Result<FleetSpec, Failure> {
    let text = read_text(
        path,
        crate::files::SPEC_LIMIT,
        Some("run `tpu-runner init` to write an example deployment.yaml"),
    )?;
    spec::parse_fleet(&path.display().to_string(), &text).map_err(invalid)
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
    json: bool,
) -> Result<ExitStatus, Failure> {
    let fleet = fleet_path.map(load_fleet).transpose()?;
    let text = read_text(
        path,
        crate::files::SPEC_LIMIT,
        Some("see the README for a job.yaml example"),
    )?;
    let jobs =
        spec::parse_jobs(&path.display().to_string(), &text, fleet.as_ref()).map_err(invalid)?;
    if json {
        print_stdout(&output::jobs_json(&jobs));
    } else {
        print_stdout(&output::jobs_summary(&jobs, fleet.as_ref()));
    }
    Ok(ExitStatus::Ok)
}
