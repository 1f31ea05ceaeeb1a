//! `state export` and `state import`: the state JSON (`docs/state-schema.md`) in and out of a
//! store, and how every command finds its store (`--store URL`, `TPU_RUNNER_STORE`, or
//! `.tpu-runner/state.db` beside the fleet file).

use std::path::Path;

use super::exit_codes::ExitStatus;
use super::plan::load_state;
use super::validate::load_fleet;
use super::{Failure, print_stdout};
use crate::store::{self, FleetDefaults, StateStore, StoreError, StoreUrl};

/// Where a command's store is, and the fleet that names a Firestore store's project and
/// collections.
pub(crate) struct StoreArgs<'a> {
    /// `--store` (or `TPU_RUNNER_STORE`, filled by clap).
    pub store: Option<&'a str>,
    /// `--fleet` (or `TPU_RUNNER_DEPLOYMENT`).
    pub fleet: &'a Path,
}

/// [`StoreArgs`] owning what they name.
pub(crate) struct OwnedStoreArgs {
    /// The store URL, if named.
    pub store: Option<String>,
    /// The fleet file.
    pub fleet: std::path::PathBuf,
}

impl OwnedStoreArgs {
    /// Borrowed.
    pub fn args(&self) -> StoreArgs<'_> {
        StoreArgs {
            store: self.store.as_deref(),
            fleet: &self.fleet,
        }
    }
}

pub(crate) fn store_failure(e: &StoreError) -> Failure {
    Failure {
        message: format!("error: {e}\n"),
        status: ExitStatus::Store,
    }
}

/// Opens the store the arguments name.
pub(crate) fn open(args: &StoreArgs<'_>, create: bool) -> Result<Box<dyn StateStore>, Failure> {
    let url = match args.store {
        Some(text) => StoreUrl::parse(text).map_err(|e| Failure {
            message: format!("error: --store: {e}\n"),
            status: ExitStatus::Usage,
        })?,
        None => store::default_store(args.fleet),
    };
    let defaults = match &url {
        StoreUrl::Firestore { .. } => {
            // The fleet names the collections (its runner) and, by default, the project.
            let fleet = load_fleet(args.fleet)?;
            FleetDefaults {
                runner: fleet.name,
                project: fleet.project,
            }
        }
        StoreUrl::Sqlite(_) => FleetDefaults::default(),
    };
    store::open(&url, &defaults, create).map_err(|e| store_failure(&e))
}

/// `state export`: everything in the store as one state JSON document.
pub(crate) fn export(
    args: &StoreArgs<'_>,
    output: Option<&Path>,
    force: bool,
) -> Result<ExitStatus, Failure> {
    // Check the output before reading anything: a bad path fails fast, and an existing
    // file is only replaced once the export succeeded.
    if let Some(path) = output {
        super::check_output(path, force)?;
    }
    let mut store = open(args, false)?;
    let state = store.export().map_err(|e| store_failure(&e))?;
    let mut text = serde_json::to_string_pretty(&state).expect("a state serialises");
    text.push('\n');
    match output {
        Some(path) => {
            super::write_output(path, &text, force)?;
            eprintln!(
                "exported {} jobs ({} finished), {} TPU records from {} to {}",
                state.jobs.len() + state.finished.len(),
                state.finished.len(),
                state.resources.len(),
                store.describe(),
                path.display()
            );
        }
        None => print_stdout(&text),
    }
    Ok(ExitStatus::Ok)
}

/// `state import`: a state JSON document into an empty store.
pub(crate) fn import(args: &StoreArgs<'_>, input: &Path) -> Result<ExitStatus, Failure> {
    let state = load_state(input)?;
    let mut store = open(args, true)?;
    store.import(&state).map_err(|e| store_failure(&e))?;
    print_stdout(&format!(
        "imported {} jobs ({} finished), {} TPU records into {}\n",
        state.jobs.len() + state.finished.len(),
        state.finished.len(),
        state.resources.len(),
        store.describe()
    ));
    Ok(ExitStatus::Ok)
}
