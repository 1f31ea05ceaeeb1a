//! Where the lifecycle commands (`submit`, `watch`, `controller` …) find everything, in one
//! place: the fleet, the store, the TPU API, the object store and local workers. Each comes
//! from its flag, else its environment variable, else the local stack this folder runs
//! (`.tpu-runner/local/stack.json`, written by `tpu-runner local up`), else the default
//! (GCP). Reads configuration only; opens nothing it is not asked to.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Failure;
use super::exit_codes::ExitStatus;
use super::state::{StoreArgs, open};
use super::validate::load_fleet;
use crate::objects::{LocalDir, ObjectStore};
use crate::spec::FleetSpec;
use crate::store::StateStore;

/// Where `tpu-runner local up` describes the stack it runs, relative to its folder.
pub const STACK_FILE: &str = ".tpu-runner/local/stack.json";

/// The flags every lifecycle command shares.
#[derive(Debug, Default, clap::Args)]
pub struct StackOpts {
    /// The fleet file (default: the local stack's, else `deployment.yaml`).
    #[arg(long, env = "TPU_RUNNER_DEPLOYMENT", value_name = "PATH")]
    pub fleet: Option<PathBuf>,
    /// The state store: `sqlite:PATH`, `firestore` or `firestore:PROJECT/DATABASE`
    /// (default: the local stack's, else `.tpu-runner/state.db` beside the fleet file).
    #[arg(long, env = "TPU_RUNNER_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// The TPU API (default: the local stack's emulator, else tpu.googleapis.com).
    #[arg(long, env = "TPU_RUNNER_TPU_ENDPOINT", value_name = "URL")]
    pub tpu_endpoint: Option<String>,
    /// Keep objects in this local folder, one folder per bucket (default: the local
    /// stack's, else Cloud Storage; `STORAGE_EMULATOR_HOST` names an emulator).
    #[arg(long, env = "TPU_RUNNER_OBJECTS", value_name = "DIR")]
    pub objects: Option<PathBuf>,
}

/// What `local up` records for the commands run beside it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackFile {
    /// The fleet file.
    pub fleet: PathBuf,
    /// The store URL.
    pub store: String,
    /// The emulator's URL.
    pub tpu_endpoint: String,
    /// The local object store.
    pub objects: PathBuf,
    /// The worker roots of the emulator's TPUs.
    pub workers: PathBuf,
}

/// Everything resolved.
pub struct Stack {
    /// The fleet file.
    pub fleet_path: PathBuf,
    /// The fleet.
    pub fleet: FleetSpec,
    /// The store URL, if given (else the default beside the fleet).
    pub store: Option<String>,
    /// The TPU API endpoint, if not production.
    pub tpu_endpoint: Option<String>,
    /// The local object folder, if not Cloud Storage.
    pub objects: Option<PathBuf>,
    /// Local worker roots (the local stack), if any.
    pub workers: Option<PathBuf>,
}

/// Reads the local stack file of the current folder, if there is one.
pub fn local_stack() -> Result<Option<StackFile>, Failure> {
    let path = Path::new(STACK_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = super::read_text(path, 1 << 20, None)?;
    serde_json::from_str(&text).map(Some).map_err(|e| Failure {
        message: format!(
            "error: `{STACK_FILE}` is damaged ({e})\n  = hint: restart `tpu-runner local up`, or remove the file to use GCP\n"
        ),
        status: ExitStatus::Invalid,
    })
}

impl Stack {
    /// Resolves `opts` (flag, environment, local stack, default) and reads the fleet.
    pub fn resolve(opts: &StackOpts) -> Result<Stack, Failure> {
        let local = local_stack()?;
        let fleet_path = opts
            .fleet
            .clone()
            .or_else(|| local.as_ref().map(|l| l.fleet.clone()))
            .unwrap_or_else(|| PathBuf::from("deployment.yaml"));
        let fleet = load_fleet(&fleet_path)?;
        Ok(Stack {
            fleet_path,
            fleet,
            store: opts
                .store
                .clone()
                .or_else(|| local.as_ref().map(|l| l.store.clone())),
            tpu_endpoint: opts
                .tpu_endpoint
                .clone()
                .or_else(|| local.as_ref().map(|l| l.tpu_endpoint.clone())),
            objects: opts
                .objects
                .clone()
                .or_else(|| local.as_ref().map(|l| l.objects.clone())),
            workers: local.map(|l| l.workers),
        })
    }

    /// Opens the store (`create`: a missing SQLite file is made).
    pub fn open_store(&self, create: bool) -> Result<Box<dyn StateStore>, Failure> {
        open(
            &StoreArgs {
                store: self.store.as_deref(),
                fleet: &self.fleet_path,
            },
            create,
        )
    }

    /// Opens the object store.
    pub fn objects(&self) -> Result<Box<dyn ObjectStore>, Failure> {
        Self::open_objects(self.objects.as_deref())
    }

    /// The object store in local folder `dir` if given, else the local stack's, else
    /// Cloud Storage (for commands that need nothing else of the stack).
    pub fn objects_at(dir: Option<&Path>) -> Result<Box<dyn ObjectStore>, Failure> {
        let dir = match dir {
            Some(dir) => Some(dir.to_path_buf()),
            None => local_stack()?.map(|l| l.objects),
        };
        Self::open_objects(dir.as_deref())
    }

    fn open_objects(dir: Option<&Path>) -> Result<Box<dyn ObjectStore>, Failure> {
        match dir {
            Some(dir) => Ok(Box::new(LocalDir::new(dir))),
            None => crate::objects::Gcs::new(crate::gcp::storage::endpoint_from_env())
                .map(|g| Box::new(g) as Box<dyn ObjectStore>)
                .map_err(|e| Failure {
                    message: format!("error: Cloud Storage: {e}\n"),
                    status: ExitStatus::Io,
                }),
        }
    }

    /// The TPU API endpoint.
    pub fn endpoint(&self) -> crate::gcp::http::Endpoint {
        match &self.tpu_endpoint {
            Some(url) => crate::gcp::http::Endpoint::emulator(url),
            None => crate::gcp::tpu::endpoint_from_env(),
        }
    }
}
