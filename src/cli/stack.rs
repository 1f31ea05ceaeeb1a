//! Where the lifecycle commands (`submit`, `watch`, `controller` …) find everything, in one
//! place: the fleet, the store, the TPU API, the object store and local workers. Each comes
//! from its flag, else its environment variable; with no fleet named, from the local stack
//! when one runs (it registers itself in the user's state folder, so commands find it from
//! any folder), else `deployment.yaml` here (GCP). Reads configuration only; opens nothing
//! it is not asked to.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Failure;
use super::exit_codes::ExitStatus;
use super::state::{StoreArgs, open};
use super::validate::load_fleet;
use crate::objects::{LocalDir, ObjectStore};
use crate::spec::FleetSpec;
use crate::store::StateStore;

/// The file in the state folder where a running `tpu-runner local up` registers its stack.
pub const REGISTRY_FILE: &str = "local-stack.json";

/// The user's state folder: `TPU_RUNNER_HOME`, else `$XDG_STATE_HOME/tpu-runner`, else
/// `~/.local/state/tpu-runner` (the local stack's registration and, by default, its data).
pub fn state_home() -> Result<PathBuf, Failure> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("TPU_RUNNER_HOME")
        .or_else(|| var("XDG_STATE_HOME").map(|d| d.join("tpu-runner")))
        .or_else(|| var("HOME").map(|h| h.join(".local/state/tpu-runner")))
        .filter(|p| p.is_absolute())
        .ok_or_else(|| Failure {
            message: "error: no state folder: set TPU_RUNNER_HOME (or HOME) to an absolute path\n"
                .into(),
            status: ExitStatus::Usage,
        })
}

/// The flags every lifecycle command shares.
#[derive(Debug, Default, clap::Args)]
pub struct StackOpts {
    /// The fleet file (default: the running local stack's, else `deployment.yaml`).
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

/// What `local up` registers for the commands run anywhere while it runs.
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
    /// The process of `local up` (a registration whose process is gone is stale).
    #[serde(default)]
    pub pid: u32,
}

impl StackFile {
    /// Registers this stack as the user's running one: written whole to a fresh file, then
    /// renamed over the registration (a reader never sees half of it).
    pub fn register(&self) -> Result<PathBuf, String> {
        let home = state_home().map_err(|f| f.message.trim().to_owned())?;
        std::fs::create_dir_all(&home)
            .map_err(|e| format!("cannot create {}: {e}", home.display()))?;
        let path = home.join(REGISTRY_FILE);
        let mut tmp = tempfile::NamedTempFile::new_in(&home)
            .map_err(|e| format!("cannot write in {}: {e}", home.display()))?;
        std::io::Write::write_all(
            &mut tmp,
            serde_json::to_string_pretty(self)
                .expect("serialisable")
                .as_bytes(),
        )
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        tmp.persist(&path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(path)
    }

    /// Removes the registration if it is still this stack's.
    pub fn unregister(&self) {
        if let Ok(home) = state_home() {
            let path = home.join(REGISTRY_FILE);
            if read_registry(&path)
                .ok()
                .flatten()
                .is_some_and(|r| r.pid == self.pid)
            {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// True while its process lives.
    pub fn running(&self) -> bool {
        use nix::errno::Errno;
        let Ok(pid) = i32::try_from(self.pid) else {
            return false;
        };
        pid > 0
            && matches!(
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
                Ok(()) | Err(Errno::EPERM)
            )
    }
}

fn read_registry(path: &Path) -> Result<Option<StackFile>, Failure> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(None);
    }
    let text = super::read_text(path, 1 << 20, None)?;
    serde_json::from_str(&text).map(Some).map_err(|e| Failure {
        message: format!(
            "error: `{}` is damaged ({e})\n  = hint: restart `tpu-runner local up`, or remove the file\n",
            path.display()
        ),
        status: ExitStatus::Invalid,
    })
}

/// The local stack that runs now, as it registered itself, if one does.
pub fn local_stack() -> Result<Option<StackFile>, Failure> {
    let path = state_home()?.join(REGISTRY_FILE);
    Ok(read_registry(&path)?.filter(StackFile::running))
}

/// What a command without a fleet says: where a fleet would have come from.
fn no_fleet() -> Failure {
    Failure {
        message: "error: no fleet: the local stack is not running (start it with `tpu-runner local up`), and there is no deployment.yaml here\n  = hint: for a GCP fleet pass --fleet PATH or set TPU_RUNNER_DEPLOYMENT (`tpu-runner init` writes an example)\n".into(),
        status: ExitStatus::Io,
    }
}

/// The fleet file a command uses when none is named: the running local stack's, else
/// `deployment.yaml` here; neither is an error that says so.
pub fn default_fleet() -> Result<(PathBuf, Option<StackFile>), Failure> {
    if let Some(local) = local_stack()? {
        return Ok((local.fleet.clone(), Some(local)));
    }
    let here = PathBuf::from("deployment.yaml");
    if std::fs::symlink_metadata(&here).is_ok() {
        Ok((here, None))
    } else {
        Err(no_fleet())
    }
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

impl Stack {
    /// Resolves `opts`: each part from its flag or environment variable; with no fleet
    /// named, the rest from the running local stack (else GCP with `deployment.yaml` here).
    pub fn resolve(opts: &StackOpts) -> Result<Stack, Failure> {
        let (fleet_path, local) = match &opts.fleet {
            Some(path) => (path.clone(), None),
            None => default_fleet()?,
        };
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
                .map_err(|e| {
                    let e = e.to_string();
                    let e = e.strip_prefix("Cloud Storage: ").unwrap_or(&e);
                    Failure {
                        message: format!(
                            "error: Cloud Storage: {e}\n  = hint: or use the local stack: `tpu-runner local up`, then commands without --fleet\n"
                        ),
                        status: ExitStatus::Io,
                    }
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
