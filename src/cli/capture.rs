//! `capture`: the store's jobs and events in a window written as a self-contained scenario
//! folder (`scenario.yaml`, `jobs.jsonl`, `fleet.yaml`) that `simulate` replays. Reads the
//! store; writes only inside the folder it is given, and never over a scenario without
//! `--force`.

use std::path::Path;

use super::events::{self, Window};
use super::exit_codes::ExitStatus;
use super::stack::{Stack, StackOpts};
use super::{Failure, print_stdout, read_text, write_output};
use crate::simulate::capture::capture;

/// The files of a captured scenario.
const FILES: [&str; 3] = ["scenario.yaml", "jobs.jsonl", "fleet.yaml"];

/// `capture --output DIR [--since T] [--until T] [--force]`.
pub(crate) fn run(
    opts: &StackOpts,
    window: Window,
    output: &Path,
    force: bool,
) -> Result<ExitStatus, Failure> {
    let io = |what: String| Failure {
        message: format!("error: `{}` {what}\n", output.display()),
        status: ExitStatus::Io,
    };
    match std::fs::symlink_metadata(output) {
        Ok(m) if !m.is_dir() => return Err(io("is not a folder".into())),
        Ok(_) if !force && FILES.iter().any(|f| output.join(f).exists()) => {
            return Err(io(
                "already holds a scenario\n  = hint: pass --force to replace it, or another folder"
                    .into(),
            ));
        }
        Ok(_) => {}
        Err(_) => std::fs::create_dir(output).map_err(|e| io(format!("cannot be made: {e}")))?,
    }
    let stack = Stack::resolve(opts)?;
    let fleet_text = read_text(&stack.fleet_path, crate::files::SPEC_LIMIT, None)?;
    let mut store = stack.open_store(false)?;
    let (state, log, since, until) = events::recorded(store.as_mut(), window, "to capture")?;
    let c = capture(&stack.fleet, "fleet.yaml", &state, &log, since, until);
    write_output(&output.join("fleet.yaml"), &fleet_text, true)?;
    write_output(&output.join("jobs.jsonl"), &c.jobs, true)?;
    write_output(&output.join("scenario.yaml"), &c.scenario, true)?;
    let mut text = format!(
        "captured {} jobs and the capacity of {} pools from {} ({} to {}, {:.2} h) into {}\n",
        c.job_count,
        c.pools,
        store.describe(),
        since,
        until,
        until.secs_since(since) / 3600.0,
        output.join("scenario.yaml").display()
    );
    for note in &c.notes {
        text.push_str(&format!("  note: {note}\n"));
    }
    text.push_str(&format!(
        "replay: tpu-runner simulate {}\n",
        output.join("scenario.yaml").display()
    ));
    print_stdout(&text);
    Ok(ExitStatus::Ok)
}
