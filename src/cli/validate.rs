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
    if json {
        print_stdout(&output::jobs_json(&jobs));
    } else {
        print_stdout(&output::jobs_summary(&jobs, fleet.as_ref()));
    }
    Ok(ExitStatus::Ok)
}
