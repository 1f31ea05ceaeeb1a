//! `tpu-runner worker …`: the agent's commands on a TPU VM worker (run by the controller
//! through a transport, not by people): `launch` reads a launch spec as JSON on stdin and
//! prints one acknowledgement line; `supervise` is the detached supervisor `launch` starts;
//! `cancel` stops an attempt and prints one acknowledgement line; `recover-disk` and
//! `devices` are the adopted-TPU helpers, one answer line each.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ExitStatus, Failure, print_stdout};
use crate::objects::{self, LocalDir, ObjectStore};
use crate::worker::agent::{self, Root};
use crate::worker::{LaunchSpec, attempt_prefix};

/// Where a worker command works.
pub struct WorkerArgs<'a> {
    /// The worker's root folder.
    pub root: &'a Path,
    /// Shared-memory folder (default: `ROOT/shm`).
    pub shm: Option<&'a Path>,
    /// This worker's host name.
    pub host: &'a str,
    /// A local object folder instead of the environment's store.
    pub objects: Option<&'a Path>,
    /// Launch only when this boot was prepared (the marker's folder).
    pub require_ready: Option<&'a Path>,
    /// The metadata server to watch for notices (`None`: none).
    pub metadata: Option<&'a str>,
}

impl WorkerArgs<'_> {
    fn root(&self) -> Root {
        let mut root = Root::new(self.root);
        if let Some(shm) = self.shm {
            root.shm = shm.to_path_buf();
        }
        root
    }

    fn store(&self) -> Result<Box<dyn ObjectStore>, Failure> {
        match self.objects {
            Some(dir) => Ok(Box::new(LocalDir::new(dir))),
            None => objects::from_env().map_err(|e| setup(format!("object store: {e}"))),
        }
    }
}

/// Exit 2 with a message: the agent could not do its part (set-up), as the original.
fn setup(message: String) -> Failure {
    Failure {
        message: format!("error: {message}\n"),
        status: ExitStatus::Usage,
    }
}

/// `worker launch`.
pub fn launch(args: &WorkerArgs<'_>) -> Result<ExitStatus, Failure> {
    if let Some(dir) = args.require_ready
        && !crate::worker::prepare::ready(dir)
    {
        return Err(setup(format!(
            "this TPU VM is not prepared for this boot yet (no readiness marker in {}): its startup script has not finished",
            dir.display()
        )));
    }
    let mut input = Vec::new();
    std::io::stdin()
        .take(16 << 20)
        .read_to_end(&mut input)
        .map_err(|e| setup(format!("reading the launch spec: {e}")))?;
    let mut spec: LaunchSpec = serde_json::from_slice(&input)
        .map_err(|e| setup(format!("the launch spec is not valid: {e}")))?;
    // This worker's own device files, when it names them.
    if let Some(patterns) = std::env::var("TPU_RUNNER_DEVICES")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        spec.devices.patterns = patterns.split(':').map(str::to_owned).collect();
    }
    let store = args.store()?;
    let exe: PathBuf =
        std::env::current_exe().map_err(|e| setup(format!("cannot find this program: {e}")))?;
    let ack = agent::launch(
        &args.root(),
        args.host,
        &spec,
        store.as_ref(),
        &exe,
        args.objects,
        args.metadata,
    )
    .map_err(setup)?;
    print_stdout(&format!(
        "{} {} {}\n",
        ack.word(),
        args.host,
        spec.request.attempt_id
    ));
    Ok(ExitStatus::Ok)
}

/// `worker supervise` (started detached by `launch`).
pub fn supervise(args: &WorkerArgs<'_>, job: &str, attempt: &str) -> Result<ExitStatus, Failure> {
    let store = args.store()?;
    match agent::supervise(
        &args.root(),
        args.host,
        job,
        attempt,
        store.as_ref(),
        args.metadata,
    ) {
        Ok(_) => Ok(ExitStatus::Ok),
        Err(e) => {
            // Whatever went wrong, the controller must hear of it: a set-up failure.
            let root = args.root();
            let dirs = root.dirs(job, attempt);
            if let Ok(bytes) = crate::files::read_bytes(&dirs.attempt.join("spec.json"), 16 << 20)
                && let Ok(spec) = serde_json::from_slice::<LaunchSpec>(&bytes)
            {
                let r = &spec.request;
                let status = crate::worker::StatusObject {
                    host: args.host.to_owned(),
                    attempt_id: attempt.to_owned(),
                    state: "failed_setup".into(),
                    command_exit_code: None,
                    infrastructure_failure: None,
                    setup_error: Some(e.clone()),
                    artifact_upload_error: None,
                    started_at: None,
                    finished_at: jiff::Timestamp::now().to_string(),
                };
                let uri = format!(
                    "{}status/{}.json",
                    attempt_prefix(&r.bucket, &r.job_id, &r.attempt_id),
                    args.host
                );
                let _ = store.put(
                    &uri,
                    &serde_json::to_vec(&status).unwrap_or_default(),
                    false,
                );
            }
            Err(setup(e))
        }
    }
}

/// `worker cancel`.
pub fn cancel(
    args: &WorkerArgs<'_>,
    attempt: &str,
    grace_secs: u64,
    notice: Option<crate::worker::notice::Notice>,
) -> Result<ExitStatus, Failure> {
    let store = args.store()?;
    let ack = agent::cancel(
        &args.root(),
        args.host,
        attempt,
        Duration::from_secs(grace_secs),
        store.as_ref(),
        notice,
    );
    print_stdout(&format!("{} {} {attempt}\n", ack.word(), args.host));
    Ok(ExitStatus::Ok)
}

/// `worker recover-disk`: one `TPU_RUNNER_DISK_RECOVERY` line.
pub fn recover_disk(args: &WorkerArgs<'_>, floor: u64) -> Result<ExitStatus, Failure> {
    let recovery = crate::worker::adopted::recover_disk(&args.root(), floor).map_err(setup)?;
    print_stdout(&format!("{}\n", recovery.line(args.host)));
    Ok(ExitStatus::Ok)
}

/// `worker devices`: one `TPU_RUNNER_DEVICE_OWNER_PROBE` line.
pub fn devices(args: &WorkerArgs<'_>, patterns: Vec<String>) -> Result<ExitStatus, Failure> {
    let mut devices = crate::worker::devices::Devices::default();
    if !patterns.is_empty() {
        devices.patterns = patterns;
    }
    let line = crate::worker::adopted::probe_devices(&devices, args.host).map_err(setup)?;
    print_stdout(&format!("{line}\n"));
    Ok(ExitStatus::Ok)
}

/// `worker prepare` (root, at boot).
pub fn prepare(
    user: &str,
    key_file: &Path,
    root: &Path,
    shm: &Path,
    state_dir: &Path,
) -> Result<ExitStatus, Failure> {
    let key = crate::files::read_text(key_file, 16 << 10)
        .map_err(|e| setup(format!("{}: {e}", key_file.display())))?;
    crate::worker::prepare::prepare(&crate::worker::prepare::Prepare {
        user: user.to_owned(),
        authorized_key: key,
        root: root.to_path_buf(),
        shm: shm.to_path_buf(),
        state_dir: state_dir.to_path_buf(),
    })
    .map_err(|e| setup(format!("prepare: {e}")))?;
    print_stdout(&format!("TPU_RUNNER_PREPARED {user}\n"));
    Ok(ExitStatus::Ok)
}
