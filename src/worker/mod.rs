//! The worker side: the agent that runs on every worker of a TPU VM (`tpu-runner worker …`),
//! the protocol the controller speaks to it (a launch spec as JSON on stdin, one
//! acknowledgement line per call, status and heartbeat objects in the job's bucket) and the
//! transports that reach it (a process on this machine; SSH). Job ids, environment values
//! and commands travel as data (JSON, argv, environment), never through a shell the agent
//! builds. Must not depend on the engine's decisions: it carries out one attempt.

pub mod adopted;
pub mod agent;
pub mod bundle;
pub mod devices;
pub mod notice;
pub mod prepare;
pub mod transport;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::observe::LaunchRequest;

/// What a launch hands every worker (stdin of `tpu-runner worker launch`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// The engine's launch.
    pub request: LaunchRequest,
    /// The runner's project (`RUNNER_PROJECT`).
    pub project: String,
    /// Seconds between heartbeats.
    pub heartbeat_secs: u64,
    /// Seconds a cancelled command has between TERM and KILL.
    pub grace_secs: u64,
    /// Free bytes the worker's disk must keep (caches are evicted, oldest first, to keep it).
    pub min_free_bytes: u64,
    /// The accelerator devices a command needs free before it starts.
    #[serde(default)]
    pub devices: devices::Devices,
    /// Seconds to wait for them; still held after that is an infrastructure failure
    /// (`accelerator_busy`).
    #[serde(default = "default_device_wait")]
    pub device_wait_secs: u64,
}

fn default_device_wait() -> u64 {
    60
}

impl LaunchSpec {
    /// Defaults of the original: a heartbeat every 30 s, 10 s of grace, a 10 GiB floor, a
    /// TPU VM's devices waited for up to 60 s.
    pub fn new(request: LaunchRequest, project: &str) -> LaunchSpec {
        LaunchSpec {
            request,
            project: project.to_owned(),
            heartbeat_secs: 30,
            grace_secs: 10,
            min_free_bytes: 10 << 30,
            devices: devices::Devices::default(),
            device_wait_secs: default_device_wait(),
        }
    }
}

/// The longest a launch's timings may be (a day): longer would overflow the clock's
/// arithmetic (a heartbeat of 2^64−1 s panicked the supervisor, which then published no
/// status) and means nothing for a heartbeat, a grace or a wait.
pub const MAX_TIMING_SECS: u64 = 86_400;

impl LaunchSpec {
    /// Why its timings cannot be used, if they cannot.
    pub fn check_timings(&self) -> Result<(), String> {
        for (name, secs, min) in [
            ("heartbeat_secs", self.heartbeat_secs, 1),
            ("grace_secs", self.grace_secs, 1),
            ("device_wait_secs", self.device_wait_secs, 0),
        ] {
            if !(min..=MAX_TIMING_SECS).contains(&secs) {
                return Err(format!(
                    "{name} is {secs}, expected {min} to {MAX_TIMING_SECS} seconds"
                ));
            }
        }
        Ok(())
    }
}

/// The object prefix of an attempt in its job's bucket: `gs://B/jobs/J/attempts/A/`.
pub fn attempt_prefix(bucket: &str, job: &str, attempt: &str) -> String {
    format!(
        "{}/jobs/{job}/attempts/{attempt}/",
        bucket.trim_end_matches('/')
    )
}

/// A worker's final status object (`status/<host>.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusObject {
    /// Worker host name.
    pub host: String,
    /// The attempt it ran.
    pub attempt_id: String,
    /// `succeeded`, `failed`, `failed_setup` or `failed_artifacts`.
    pub state: String,
    /// The command's exit code (128 + signal when killed); `None` when it never ran.
    pub command_exit_code: Option<i32>,
    /// An infrastructure failure seen on this worker (not something a command can exit
    /// with): `slice_failure_chip_driver_error`, `accelerator_busy`, or the notice the
    /// command was stopped on (`spot-preemption`, `host-maintenance`).
    pub infrastructure_failure: Option<String>,
    /// Why set-up failed, when it did.
    pub setup_error: Option<String>,
    /// Why the command's log could not be uploaded, when it could not.
    pub artifact_upload_error: Option<String>,
    /// RFC 3339.
    pub started_at: Option<String>,
    /// RFC 3339.
    pub finished_at: String,
}

/// The answer to a launch, one line on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchAck {
    /// Started now.
    Launched,
    /// This attempt already runs here.
    AlreadyRunning,
    /// This attempt already finished here (its status was uploaded again).
    AlreadyComplete,
}

impl LaunchAck {
    /// The line's keyword.
    pub fn word(self) -> &'static str {
        match self {
            LaunchAck::Launched => "TPU_RUNNER_LAUNCHED",
            LaunchAck::AlreadyRunning => "TPU_RUNNER_ALREADY_RUNNING",
            LaunchAck::AlreadyComplete => "TPU_RUNNER_ALREADY_COMPLETE",
        }
    }
}

/// The answer to a cancel, one line on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelAck {
    /// The attempt was running; it was stopped.
    Sent,
    /// Nothing of the attempt runs here.
    NotRunning,
    /// Another attempt runs here.
    Mismatch,
}

impl CancelAck {
    /// The line's keyword.
    pub fn word(self) -> &'static str {
        match self {
            CancelAck::Sent => "TPU_RUNNER_CANCEL_SENT",
            CancelAck::NotRunning => "TPU_RUNNER_CANCEL_NOT_RUNNING",
            CancelAck::Mismatch => "TPU_RUNNER_CANCEL_ATTEMPT_MISMATCH",
        }
    }
}

/// Finds the acknowledgement `<WORD> <host> <attempt>` for `attempt` in an agent's output
/// (acknowledgements naming another attempt do not count).
pub fn find_ack<'a, T: Copy>(
    output: &'a str,
    attempt: &str,
    words: &[(&str, T)],
) -> Option<(T, &'a str)> {
    output.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        let (word, host, named) = (parts.next()?, parts.next()?, parts.next()?);
        let kind = words.iter().find(|(w, _)| *w == word)?.1;
        (named == attempt).then_some((kind, host))
    })
}

/// The environment of the job's command: the job's own, then the runner's variables (which
/// win), as the original (`original-behaviour.md` §5.4).
pub fn command_env(spec: &LaunchSpec, host: &str, dirs: &agent::Dirs) -> BTreeMap<String, String> {
    let r = &spec.request;
    let bucket = r.bucket.trim_end_matches('/');
    let job_gcs = format!("{bucket}/jobs/{}", r.job_id);
    let mut env: BTreeMap<String, String> = r.env.clone();
    let sha = r
        .bundle
        .as_deref()
        .and_then(bundle::sha256_of_uri)
        .unwrap_or_default();
    let runner = [
        ("JOB_ID", r.job_id.to_string()),
        ("ATTEMPT_ID", r.attempt_id.to_string()),
        ("TPU_NAME", r.tpu_name.to_string()),
        ("TPU_ZONE", r.zone.to_string()),
        ("TPU_TYPE", r.tpu_type.to_string()),
        ("TPU_WORKER_COUNT", r.worker_count.to_string()),
        ("TPU_WORKER_HOST", host.to_owned()),
        ("JOB_DIR", dirs.job.display().to_string()),
        ("JOB_BUCKET", bucket.to_owned()),
        ("JOB_SHM_DIR", dirs.shm.display().to_string()),
        ("JOB_GCS_DIR", job_gcs.clone()),
        (
            "ATTEMPT_GCS_DIR",
            format!("{job_gcs}/attempts/{}", r.attempt_id),
        ),
        ("CHECKPOINT_GCS_DIR", r.checkpoint_dir.clone()),
        ("CACHE_ROOT", dirs.cache_root.display().to_string()),
        ("RUNNER_PROJECT", spec.project.clone()),
        ("BUNDLE_SHA256", sha),
        ("ATTEMPT_DIR", dirs.attempt.display().to_string()),
        ("TPU_RUNNER_COMMAND", r.command.clone()),
        (
            notice::FILE_ENV,
            notice::marker(&dirs.attempt).display().to_string(),
        ),
    ];
    for (k, v) in runner {
        env.insert(k.to_owned(), v);
    }
    env
}
