//! `controller` (the production loop on the configured store, TPU API and workers) and
//! `local up` (the whole stack on this machine: the TPU API emulator, a local object store,
//! the SQLite store, worker agents as local processes, and the controller). Wiring only:
//! the loop is `crate::controller`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::exit_codes::ExitStatus;
use super::stack::{Stack, StackFile, StackOpts};
use super::{Failure, print_stdout};
use crate::backend::CloudBackend;
use crate::backend::gcp::{CreateSettings, GcpBackend};
use crate::backend::workers::AgentWorkers;
use crate::controller::{Controller, Exit, Pass, Settings, wall_clock};
use crate::engine::Engine;
use crate::gcp::http::RetryPolicy;
use crate::gcp::tpu::{Client, Quotas};
use crate::objects::{LocalDir, ObjectStore};
use crate::spec::Name;
use crate::worker::transport::{Local, Target, Transport};

/// How the controller runs (the flags beside the stack's).
pub(crate) struct ControllerArgs<'a> {
    /// Where everything is.
    pub stack: &'a StackOpts,
    /// Worker roots of local workers (an emulator started with `--workers DIR`).
    pub local_workers: Option<&'a Path>,
    /// Seconds between passes (default: the fleet's `policy.engine.reconcile_interval`).
    pub interval: Option<f64>,
    /// Lease time-to-live, seconds.
    pub lease_ttl: i64,
    /// Stop when idle.
    pub exit_when_idle: bool,
    /// Wait for a lease another controller holds.
    pub wait_for_lease: bool,
    /// Logs as JSON lines.
    pub log_json: bool,
    /// How TPU VMs are reached.
    pub ssh: SshArgs<'a>,
    /// Lease owner.
    pub owner: Option<&'a str>,
    /// Deployment epoch.
    pub epoch: &'a str,
}

fn fail(status: ExitStatus, message: String) -> Failure {
    Failure { message, status }
}

/// A TPU API client for the stack's endpoint and project.
fn tpu_client(stack: &Stack) -> Result<Client, Failure> {
    Client::new(
        stack.endpoint(),
        &stack.fleet.project,
        Quotas::default(),
        RetryPolicy::default(),
    )
    .map_err(|e| fail(ExitStatus::Io, format!("error: the TPU API: {e}\n")))
}

/// The backend the stack names: the TPU API (or its emulator) and the workers.
fn backend(
    stack: &Stack,
    local_workers: Option<&Path>,
    ssh: &SshArgs<'_>,
) -> Result<Box<dyn CloudBackend>, Failure> {
    let fleet = &stack.fleet;
    let client = tpu_client(stack)?;
    let objects: Arc<dyn ObjectStore> = Arc::from(stack.objects()?);
    let Some(base) = local_workers
        .map(Path::to_path_buf)
        .or(stack.workers.clone())
    else {
        // TPU VMs over SSH: addresses and host keys from the TPU API.
        let workers = ssh_workers(stack, ssh, objects)?;
        return Ok(Box::new(GcpBackend::new(
            client,
            CreateSettings::of_fleet(fleet),
            Box::new(workers),
        )));
    };
    let transport = local_transport(stack, base)?;
    let mut workers = AgentWorkers::new(Arc::new(transport), objects, &fleet.project);
    // Local workers share this machine's disk: keep only a small floor.
    workers.min_free_bytes = 256 << 20;
    workers.heartbeat_secs = 10;
    Ok(Box::new(GcpBackend::new(
        client,
        CreateSettings::of_fleet(fleet),
        Box::new(workers),
    )))
}

/// This binary, for the agent's processes and for sending to adopted TPUs.
fn this_binary() -> Result<std::path::PathBuf, Failure> {
    std::env::current_exe().map_err(|e| {
        fail(
            ExitStatus::Io,
            format!("error: cannot find this binary: {e}\n"),
        )
    })
}

/// The agent as processes on this machine, one root per worker under `base`.
fn local_transport(stack: &Stack, base: std::path::PathBuf) -> Result<Local, Failure> {
    Ok(Local {
        base,
        agent: this_binary()?,
        objects: stack.objects.clone(),
        // Local workers are the emulator's TPUs: their metadata servers are its.
        metadata: Some(format!(
            "{}/emulator/v1/projects/{}",
            stack.endpoint().base.trim_end_matches('/'),
            stack.fleet.project
        )),
    })
}

/// Where the startup script's `worker prepare` leaves its readiness marker on TPU VMs.
pub(crate) const READY_DIR: &str = "/var/lib/tpu-runner";

/// The agent's shared-memory folder on TPU VMs (what `worker prepare` makes).
const SHM_DIR: &str = "/dev/shm/tpu-runner";

/// Where the agent sent to adopted TPUs lives: in the runner user's home.
const ADOPTED_AGENT_DIR: &str = ".tpu-runner/bin";

/// How the controller reaches TPU VMs.
pub(crate) struct SshArgs<'a> {
    /// The private key file, if given.
    pub key_file: Option<&'a Path>,
    /// The remote user.
    pub user: &'a str,
    /// The agent's path on the workers.
    pub remote_agent: &'a str,
    /// The `gcloud` that opens IAP tunnels (`ssh_transport: iap`).
    pub gcloud: &'a str,
}

/// The agent on TPU VMs over SSH.
fn ssh_workers(
    stack: &Stack,
    args: &SshArgs<'_>,
    objects: Arc<dyn ObjectStore>,
) -> Result<AgentWorkers, Failure> {
    Ok(AgentWorkers::new(
        Arc::new(tpu_ssh(stack, args)?),
        objects,
        &stack.fleet.project,
    ))
}

/// SSH to TPU VMs, each worker found and its host key pinned through the TPU API (through
/// IAP for `ssh_transport: iap`; the agent sent to adopted TPUs). The key comes from
/// `--ssh-key`, else `TPU_RUNNER_SSH_PRIVATE_KEY` (the secret's content, as the Cloud Run
/// job gets it), written to a private file.
fn tpu_ssh(stack: &Stack, args: &SshArgs<'_>) -> Result<crate::backend::ssh::TpuSsh, Failure> {
    let fleet = &stack.fleet;
    let mut key_dir = None;
    let key = match args.key_file {
        Some(path) => path.to_path_buf(),
        None => {
            let text = std::env::var("TPU_RUNNER_SSH_PRIVATE_KEY").map_err(|_| {
                fail(
                    ExitStatus::Usage,
                    "error: no SSH key to reach the TPU VMs: pass --ssh-key FILE or set TPU_RUNNER_SSH_PRIVATE_KEY (deploy puts it in the Cloud Run job)\n  = hint: to run jobs on this machine instead, run `tpu-runner local up`\n".into(),
                )
            })?;
            let (dir, path) = private_key_file(&text, &std::env::temp_dir())?;
            key_dir = Some(dir);
            path
        }
    };
    let client = tpu_client(stack)?;
    let emulator = stack.endpoint().emulator;
    let mut ssh = crate::worker::transport::Ssh::new(args.user, key, args.remote_agent)
        .map_err(|e| fail(ExitStatus::Io, format!("error: the SSH transport: {e}\n")))?;
    // A worker launches only once its startup script prepared it for this boot; the
    // job's shared memory is the VM's /dev/shm.
    let shm = ["--shm".to_owned(), SHM_DIR.to_owned()];
    ssh.extra_args = vec!["--require-ready".into(), READY_DIR.into()];
    ssh.extra_args.extend(shm.clone());
    let iap = fleet.ssh_transport == crate::spec::fleet::SshTransport::Iap;
    let mut transport = crate::backend::ssh::TpuSsh::new(Arc::new(ssh), client, !iap, emulator);
    if let Some(dir) = key_dir {
        transport = transport.keeping(dir);
    }
    if iap {
        transport = transport.with_iap(crate::backend::ssh::Iap {
            gcloud: args.gcloud.to_owned(),
            project: fleet.project.clone(),
        });
    }
    let adopted: std::collections::HashSet<(String, String)> = fleet
        .tpus
        .iter()
        .filter_map(|e| match &e.kind {
            crate::spec::fleet::EntryKind::Adopted { existing } => {
                Some((e.zone.to_string(), existing.clone()))
            }
            crate::spec::fleet::EntryKind::Managed { .. } => None,
        })
        .collect();
    if !adopted.is_empty() {
        // Adopted TPUs never ran the startup script: this binary is sent to them.
        let binary = this_binary()?;
        let sha256 = crate::worker::bundle::sha256_file(&binary).map_err(|e| {
            fail(
                ExitStatus::Io,
                format!("error: {}: {e}\n", binary.display()),
            )
        })?;
        transport = transport.with_adopted(crate::backend::ssh::AdoptedAgent {
            tpus: adopted,
            binary,
            sha256,
            dir: ADOPTED_AGENT_DIR.into(),
            extra_args: shm.to_vec(),
        });
    }
    Ok(transport)
}

/// `probe-adopted-device-owners RESOURCE`: every worker of an idle adopted TPU says which
/// processes hold its accelerator devices (as root through `sudo -n` over SSH; the agent
/// itself on the local stack's workers).
pub(crate) fn probe_adopted_device_owners(
    opts: &StackOpts,
    resource: &str,
    ssh: &SshArgs<'_>,
) -> Result<ExitStatus, Failure> {
    use crate::engine::state::ResourceStatus;
    let stack = Stack::resolve(opts)?;
    let mut store = stack.open_store(false)?;
    let loaded = store
        .load_active()
        .map_err(|e| super::state::store_failure(&e))?;
    let refuse = |why: String| fail(ExitStatus::Invalid, format!("error: {why}\n"));
    let Some(r) = loaded.state.resources.get(&Name::new(resource)).cloned() else {
        return Err(refuse(format!(
            "no TPU record {resource} (`tpu-runner status` lists them)"
        )));
    };
    if !r.adopted {
        return Err(refuse(format!(
            "{resource} is not an adopted TPU (the probe looks at TPUs shared with their owner)"
        )));
    }
    if r.status != ResourceStatus::Idle || r.owner.is_some() {
        return Err(refuse(format!(
            "{resource} is {}{}: the probe runs only on an idle TPU",
            r.status.as_str(),
            r.owner
                .as_ref()
                .map(|o| format!(" (job {})", o.job_id))
                .unwrap_or_default()
        )));
    }
    let timeout = Duration::from_secs(60);
    // The local stack's agent itself; on TPU VMs, the probe as root.
    type Ask = Box<dyn Fn(&Target) -> Result<String, crate::worker::transport::TransportError>>;
    let ask: Ask = match &stack.workers {
        Some(base) => {
            let local = local_transport(&stack, base.clone())?;
            Box::new(move |t| local.run(t, &["devices"], b"", timeout))
        }
        None => {
            let remote = tpu_ssh(&stack, ssh)?;
            Box::new(move |t| remote.run_as_root(t, &["devices"], timeout))
        }
    };
    let mut workers = Vec::new();
    let mut errors = Vec::new();
    for i in 0..r.worker_count.max(1) {
        let target = Target {
            zone: r.zone.to_string(),
            tpu: r.tpu_name.to_string(),
            worker: i,
        };
        match ask(&target).map(|out| parse_probe(out.as_str())) {
            Ok(Some((host, pids))) => workers.push(json!({
                "host": host, "clear": pids.is_empty(), "pids": pids,
            })),
            Ok(None) => errors.push(format!("{}: no probe answer", target.host())),
            Err(e) => errors.push(e.message),
        }
    }
    if !errors.is_empty() {
        return Err(fail(
            ExitStatus::Usage,
            format!("error: the probe failed: {}\n", errors.join("; ")),
        ));
    }
    let clear = workers.iter().all(|w| w["clear"] == json!(true));
    print_stdout(&format!(
        "{}\n",
        json!({
            "resource_id": resource,
            "tpu_name": r.tpu_name.as_str(),
            "zone": r.zone.as_str(),
            "clear": clear,
            "workers": workers,
            "observed_at": wall_clock().to_string(),
        })
    ));
    Ok(if clear {
        ExitStatus::Ok
    } else {
        ExitStatus::Busy
    })
}

/// `TPU_RUNNER_DEVICE_OWNER_PROBE <host> CLEAR -|BUSY <pids>` → (host, pids).
fn parse_probe(out: &str) -> Option<(String, Vec<i64>)> {
    out.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next()? != "TPU_RUNNER_DEVICE_OWNER_PROBE" {
            return None;
        }
        let host = words.next()?.to_owned();
        match (words.next()?, words.next()?) {
            ("CLEAR", _) => Some((host, Vec::new())),
            ("BUSY", pids) => Some((
                host,
                pids.split(',').filter_map(|p| p.parse().ok()).collect(),
            )),
            _ => None,
        }
    })
}

/// Writes a private key where no one else can reach it: a folder created fresh under `base`
/// with a random name (mode 0700; an existing path is never reused, so no one can
/// pre-create it or plant a link in it), and in it a new file (0600, `O_EXCL|O_NOFOLLOW`).
/// The folder and the key go when the returned guard is dropped (every exit but SIGKILL).
fn private_key_file(text: &str, base: &Path) -> Result<(tempfile::TempDir, PathBuf), Failure> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io = |e: std::io::Error| {
        fail(
            ExitStatus::Io,
            format!("error: cannot keep the SSH key: {e}\n"),
        )
    };
    let dir = tempfile::Builder::new()
        .prefix("tpu-runner-key-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(base)
        .map_err(io)?;
    let path = dir.path().join("id_ed25519");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&path)
        .map_err(io)?;
    file.write_all(text.trim_end().as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.sync_all())
        .map_err(io)?;
    Ok((dir, path))
}

fn owner(given: Option<&str>) -> String {
    given
        .map(str::to_owned)
        .or_else(|| std::env::var("CLOUD_RUN_EXECUTION").ok())
        .unwrap_or_else(|| {
            format!(
                "local-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            )
        })
}

/// Prints each pass's events as JSON lines (and cloud errors and conflicts as events too).
fn print_pass(pass: &Pass) {
    let mut text = String::new();
    match pass {
        Pass::Done {
            events, load, io, ..
        } => {
            for e in events {
                text.push_str(&serde_json::to_string(e).expect("serialisable"));
                text.push('\n');
            }
            // What the pass cost in the store, after what it did (quiet passes print nothing).
            if !events.is_empty() {
                text.push_str(&format!(
                    "{}\n",
                    json!({"at": events[0].at, "kind": "controller_pass", "detail": format!("load={} reads={} writes={}", load.as_str(), io.reads, io.writes)})
                ));
            }
        }
        Pass::CloudError(e) => {
            text.push_str(&format!(
                "{}\n",
                json!({"at": wall_clock(), "kind": "controller_gcp_error", "detail": e.message})
            ));
        }
        Pass::Conflict(records) => {
            text.push_str(&format!(
                "{}\n",
                json!({"at": wall_clock(), "kind": "controller_pass_conflict", "detail": records.join(", ")})
            ));
        }
    }
    print_stdout(&text);
}

fn run_controller(
    stack: &Stack,
    args: &ControllerArgs<'_>,
    stop: &AtomicBool,
) -> Result<ExitStatus, Failure> {
    if args.interval.is_some_and(|i| !(i.is_finite() && i > 0.0)) || args.lease_ttl < 5 {
        return Err(fail(
            ExitStatus::Usage,
            "error: --interval must be a positive number of seconds and --lease-ttl at least 5\n"
                .into(),
        ));
    }
    // The fleet's `policy:` decides: the very configuration `plan` and `simulate` read.
    let engine = Engine::of_fleet(stack.fleet.clone());
    let interval = args
        .interval
        .unwrap_or(stack.fleet.policy.engine.reconcile_interval_secs as f64);
    let store = stack.open_store(true)?;
    let backend = backend(stack, args.local_workers, &args.ssh)?;
    let settings = Settings {
        owner: owner(args.owner),
        epoch: args.epoch.to_owned(),
        lease_ttl_secs: args.lease_ttl,
        interval: Duration::from_secs_f64(interval),
        exit_when_idle: args.exit_when_idle,
        wait_for_lease: args.wait_for_lease,
    };
    let who = settings.owner.clone();
    let mut controller = Controller::new(engine, store, backend, settings);
    let exit = controller
        .run(&mut wall_clock, stop, &mut print_pass)
        .map_err(|e| fail(ExitStatus::Store, format!("error: {e}\n")))?;
    let status = match exit {
        Exit::Idle => json!({"status": "idle", "owner": who}),
        Exit::Stopped => json!({"status": "stopped", "owner": who}),
        Exit::LeaseHeld { owner } => {
            json!({"status": "skipped", "reason": "lease_held", "owner": owner})
        }
    };
    print_stdout(&format!("{status}\n"));
    Ok(ExitStatus::Ok)
}

/// Sends the controller's logs to stderr: JSON lines (one object per record, as Cloud
/// Logging reads them) with `json`, else text.
fn init_logs(json: bool) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .with_target(false);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.with_ansi(false).try_init()
    };
}

/// `controller`.
pub(crate) fn controller(args: &ControllerArgs<'_>) -> Result<ExitStatus, Failure> {
    init_logs(args.log_json);
    let stack = Stack::resolve(args.stack)?;
    run_controller(&stack, args, &super::interrupt_flag())
}

/// What `local up` is given.
pub(crate) struct LocalUpArgs<'a> {
    /// The stack's folder (default: `local` in the user's state folder).
    pub dir: Option<&'a Path>,
    /// Virtual seconds per wall second.
    pub speed: f64,
    /// Where the emulator listens.
    pub listen: &'a str,
    /// Seconds between controller passes.
    pub interval: Option<f64>,
}

/// The stack's cloud and fleet (`examples/local/`), built in so the binary needs no clone.
const LOCAL_CLOUD: &str = include_str!("../../examples/local/cloud.yaml");
const LOCAL_FLEET: &str = include_str!("../../examples/local/deployment.yaml");

/// `local up`: the stack, in the foreground, until Ctrl-C.
pub(crate) fn local_up(args: &LocalUpArgs<'_>) -> Result<ExitStatus, Failure> {
    use crate::emulator::{self, Clock, World};
    use crate::simulate::{harness, scenario};
    let io = |what: &str, e: &dyn std::fmt::Display| {
        fail(ExitStatus::Io, format!("error: {what}: {e}\n"))
    };
    if !(args.speed.is_finite() && args.speed > 0.0) {
        return Err(fail(
            ExitStatus::Usage,
            "error: --speed must be a positive number\n".into(),
        ));
    }
    // One local stack per user: the commands find it through its registration.
    if let Some(other) = super::stack::local_stack()? {
        return Err(fail(
            ExitStatus::Usage,
            format!(
                "error: a local stack runs already (process {}, store {})\n  = hint: stop it with Ctrl-C in its terminal; give another one its own TPU_RUNNER_HOME\n",
                other.pid, other.store
            ),
        ));
    }
    let default_dir;
    let dir = match args.dir {
        Some(dir) => dir,
        None => {
            default_dir = super::stack::state_home()?.join("local");
            default_dir.as_path()
        }
    };
    std::fs::create_dir_all(dir).map_err(|e| io(&dir.display().to_string(), &e))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| io(&dir.display().to_string(), &e))?;
    // The built-in cloud and its fleet, written into the stack's folder.
    let fleet_path = dir.join("deployment.yaml");
    let cloud_path = dir.join("cloud.yaml");
    std::fs::write(&fleet_path, LOCAL_FLEET).map_err(|e| io("writing the fleet", &e))?;
    std::fs::write(&cloud_path, LOCAL_CLOUD).map_err(|e| io("writing the cloud", &e))?;
    let scenario =
        scenario::load(&cloud_path).map_err(|e| fail(ExitStatus::Invalid, format!("{e}\n")))?;
    let fleet = &scenario.fleet;
    let objects_dir = dir.join("objects");
    let workers_dir = dir.join("workers");
    let objects = LocalDir::new(&objects_dir);
    let mut buckets = Vec::new();
    let regions: std::collections::BTreeSet<&str> = fleet.tpus.iter().map(|e| e.region()).collect();
    for region in regions {
        let bucket = format!("gs://{}-{region}", fleet.name);
        objects
            .create_bucket(&bucket, region)
            .map_err(|e| io("creating a bucket", &e))?;
        buckets.push(bucket);
    }
    // The emulator, on the wall clock × speed, its TPUs backed by local workers.
    let (sim, _) = harness::world_of(
        &scenario,
        scenario.seeds.first().copied().unwrap_or(1),
        None,
    );
    let mut world = World::new(
        sim,
        &fleet.project,
        Clock::Wall {
            started: Instant::now(),
            from_ms: 0,
            speed: args.speed,
        },
    );
    world.workers = Some(workers_dir.clone());
    let shared = world.shared();
    let running = emulator::start(Arc::clone(&shared), args.listen)
        .map_err(|e| io(&format!("cannot listen on {}", args.listen), &e))?;
    let store = format!("sqlite:{}", dir.join("state.db").display());
    let file = StackFile {
        fleet: fleet_path.clone(),
        store: store.clone(),
        tpu_endpoint: running.url(),
        objects: objects_dir.clone(),
        workers: workers_dir.clone(),
        pid: std::process::id(),
    };
    let registered = file
        .register()
        .map_err(|e| fail(ExitStatus::Io, format!("error: {e}\n")))?;
    eprint!(
        "local stack up in {}:\n  TPU API emulator  {} (wall clock × {})\n  store             {store}\n  objects           {} (buckets {})\n  workers           {}\n  fleet             {}\n  registered in     {}\n\nIn another terminal, from any folder (a job's buckets: {}):\n  tpu-runner submit examples/hello\n  tpu-runner watch hello\n  tpu-runner status\n\nThe emulator's own API (preempt a TPU, stock a zone out) is at TPU_RUNNER_TPU_ENDPOINT={}\nThe controller's events follow as JSON lines. Stop with Ctrl-C.\n\n",
        dir.display(),
        running.url(),
        args.speed,
        objects_dir.display(),
        buckets.join(", "),
        workers_dir.display(),
        fleet_path.display(),
        registered.display(),
        buckets.join(", "),
        running.url(),
    );
    let stack = Stack {
        fleet_path,
        fleet: fleet.clone(),
        store: Some(store),
        tpu_endpoint: Some(running.url()),
        objects: Some(objects_dir),
        workers: Some(workers_dir.clone()),
    };
    let stop = super::interrupt_flag();
    let opts = StackOpts::default();
    let result = run_controller(
        &stack,
        &ControllerArgs {
            stack: &opts,
            local_workers: None,
            interval: args.interval,
            lease_ttl: 30,
            exit_when_idle: false,
            wait_for_lease: true,
            log_json: false,
            ssh: SshArgs {
                key_file: None,
                user: "tpurunner",
                remote_agent: "/usr/local/bin/tpu-runner",
                gcloud: "gcloud",
            },
            owner: None,
            epoch: "local",
        },
        &stop,
    );
    // The emulator's TPUs go with it: so do their workers' processes.
    Local::stop_all(&workers_dir);
    file.unregister();
    drop(running);
    stop.store(true, Ordering::SeqCst);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// A shared folder like `/tmp`: anyone may create in it, only owners remove. Made in
    /// `/tmp` itself (random name), so another user can reach it whatever `TMPDIR` is.
    fn shared_tmp() -> tempfile::TempDir {
        let dir = tempfile::Builder::new()
            .prefix("tpu-runner-shared-")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        dir
    }

    #[test]
    fn the_key_lives_in_a_fresh_private_folder_that_goes_with_its_guard() {
        let base = shared_tmp();
        let (guard, path) = private_key_file("KEY\n\n", base.path()).unwrap();
        let dir = path.parent().unwrap().to_path_buf();
        assert!(dir.starts_with(base.path()));
        assert!(
            dir.file_name().unwrap().to_string_lossy()
                != format!("tpu-runner-key-{}", std::process::id()),
            "a name another user could guess"
        );
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&path), 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "KEY\n");
        // A second key never shares the folder.
        let (other, other_path) = private_key_file("OTHER", base.path()).unwrap();
        assert_ne!(other_path.parent(), path.parent());
        drop((guard, other));
        assert!(!dir.exists(), "the key is left on disk");
    }

    /// The old attack: another user pre-creates the folder the key used to go to (its name
    /// was the controller's pid) with a link to a file of theirs. Run as that second user
    /// when the test runs as root; the key never reaches them, nor can they read it.
    #[test]
    fn another_user_cannot_receive_or_read_the_key() {
        let base = shared_tmp();
        let old = base
            .path()
            .join(format!("tpu-runner-key-{}", std::process::id()));
        let theirs = base.path().join("theirs");
        let as_nobody = nix::unistd::Uid::effective().is_root()
            && std::process::Command::new("setpriv")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
        let shell = |script: &str| {
            let mut c = if as_nobody {
                let mut c = std::process::Command::new("setpriv");
                c.args([
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "sh",
                    "-c",
                ]);
                c
            } else {
                let mut c = std::process::Command::new("sh");
                c.arg("-c");
                c
            };
            c.arg(script).output().unwrap()
        };
        let plant = shell(&format!(
            "mkdir -m 777 '{o}' && touch '{t}' && chmod 666 '{t}' && ln -s '{t}' '{o}/id_ed25519'",
            o = old.display(),
            t = theirs.display()
        ));
        assert!(plant.status.success(), "{plant:?}");
        let (_guard, path) = private_key_file("SECRET-KEY", base.path()).unwrap();
        assert!(!path.starts_with(&old), "the planted folder was used");
        assert_eq!(
            std::fs::read_to_string(&theirs).unwrap(),
            "",
            "the key went to their file"
        );
        if as_nobody {
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!(meta.uid(), 0);
            let read = shell(&format!("cat '{}'", path.display()));
            assert!(
                !read.status.success(),
                "the second user read the key: {read:?}"
            );
            let list = shell(&format!("ls '{}'", path.parent().unwrap().display()));
            assert!(
                !list.status.success(),
                "the second user listed the key's folder"
            );
        }
    }
}
